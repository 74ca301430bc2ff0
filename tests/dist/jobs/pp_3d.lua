-- tests/dist/jobs/pp_3d.lua: 3D parallelism on 8 ranks, dp=2 x tp=2 x pp=2
-- with ZeRO 1 over the data-parallel group, against one process
-- (tests/dist/pp_layouts.lua's P.compare: every step's loss and gradient
-- norm to 1e-5 relative over 10 f32 steps with a clip that fires at every
-- step, every final weight of every stage with the TP shards gathered to
-- 1e-5, the tied embedding's first- and last-stage copies bitwise equal):
-- a GPT-2 under 1F1B, the same with sequence parallelism, and a Llama with
-- grouped-query heads (4 query heads over 2 key/value heads: one a TP rank)
-- under GPipe. Its own job in tests/dist/run.sh (8 ranks; the specs run
-- on 2 and 4): prints "ok N - ..." / "not ok N - ..." and
-- "dist tests/dist/jobs/pp_3d.lua np=8: P passed, F failed".
local lt = require "lutra"
package.path = "tests/dist/?.lua;" .. package.path
local H = require "harness"
local P = require "pp_layouts"

lt.dist.init()
lt.dist.set_timeout(120)
if lt.dist.world_size() ~= 8 then error("tests/dist/jobs/pp_3d.lua runs on 8 ranks (dp=2 x tp=2 x pp=2)") end

local function check_layout(name, L)
  H.test(name .. ": losses, gradient norms (clipped) and weights equal one process's", function()
    local fails = P.compare(L)
    assert(#fails == 0, table.concat(fails, "; "))
  end)
end

check_layout("dp=2 x tp=2 x pp=2 ZeRO 1, GPT-2 (tied head), 1F1B", { pp = 2, tp = 2, zero = 1, schedule = "1f1b" })
check_layout("dp=2 x tp=2 x pp=2 ZeRO 1, GPT-2, sequence parallel, 1F1B",
  { pp = 2, tp = 2, zero = 1, sp = true, schedule = "1f1b" })
check_layout("dp=2 x tp=2 x pp=2 ZeRO 1, Llama with grouped-query heads (4 over 2), GPipe",
  { pp = 2, tp = 2, zero = 1, schedule = "gpipe", family = "llama", config = { n_heads = 4, n_kv_heads = 2 } })

H.run("tests/dist/jobs/pp_3d.lua")
