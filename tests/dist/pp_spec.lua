-- tests/dist/pp_spec.lua: pipeline parallelism (lutra.models.pipeline,
-- lutra.dist.pp.executor) against one process. Every rank trains the whole
-- model alone on the global batches as the reference (the same seed, the
-- same micro-batches: accum = m), then the layout on the job: 10 f32
-- steps of a 4-block GPT-2 (tied head) or Llama (untied), AdamW with
-- clipping that fires at every step; every step's loss and gradient norm
-- to 1e-5 relative and every final weight of every stage (TP shards
-- gathered) to 1e-5. np=2: pp=2 with 1F1B, GPipe and interleaved (v = 2),
-- a Llama; np=4: pp=4 with 1F1B and GPipe, dp=2 x pp=2 with ZeRO 1 and 2,
-- tp=2 x pp=2 with sequence parallelism, interleaved with dp=2; under SP a
-- stage's messages are B T C / tp elements (B T C without). The tied
-- embedding's two copies (first and last stage) are bitwise equal after
-- training. Bad settings raise on every rank: more stages than blocks, a
-- block list that does not sum, an interleaved schedule with micro-batches
-- that are not a multiple of the stages, ZeRO 3, model(x) on a stage,
-- stages fed different batches.
-- (dp=2 x tp=2 x pp=2 on 8 ranks: tests/dist/jobs/pp_3d.lua, in run.sh.)
local lt = require "lutra"
package.path = "tests/dist/?.lua;" .. package.path
local H = require "harness"
local P = require "pp_layouts"

lt.dist.init()
lt.dist.set_timeout(120)

local world = lt.dist.world_size()

local function check_layout(name, L)
  H.test(name .. ": losses, gradient norms and weights equal one process's", function()
    local fails = P.compare(L)
    assert(#fails == 0, table.concat(fails, "; "))
  end)
end

if world == 2 then
  check_layout("pp=2 1F1B", { pp = 2, schedule = "1f1b" })
  check_layout("pp=2 GPipe", { pp = 2, schedule = "gpipe" })
  check_layout("pp=2 interleaved, 2 virtual stages a rank", { pp = 2, v = 2, schedule = "interleaved", n_layer = 4 })
  check_layout("pp=2 Llama (untied head), uneven stages 1 + 3", { pp = 2, schedule = "1f1b", family = "llama",
    stages = { 1, 3 } })
elseif world == 4 then
  check_layout("pp=4 1F1B", { pp = 4, schedule = "1f1b" })
  check_layout("pp=4 GPipe", { pp = 4, schedule = "gpipe" })
  check_layout("dp=2 x pp=2 ZeRO 1", { pp = 2, zero = 1, schedule = "1f1b" })
  check_layout("dp=2 x pp=2 ZeRO 2", { pp = 2, zero = 2, schedule = "gpipe" })
  check_layout("tp=2 x pp=2 with sequence parallelism", { pp = 2, tp = 2, sp = true, schedule = "1f1b" })
  check_layout("dp=2 x pp=2 interleaved (v = 2)", { pp = 2, v = 2, schedule = "interleaved" })
end

-- under TP with sequence parallelism only this rank's 1/tp of the rows
-- crosses between stages (issue 26, point 3): every activation and
-- gradient message (the data, not the shape headers: i64) is B T C / tp
-- elements; without SP the whole B T C
if world == 4 then
  H.test("tp=2 x pp=2: a stage sends B T C / tp elements a message under sequence parallelism, B T C without", function()
    local mesh = lt.dist.mesh { tp = 2, pp = 2 }
    local Bm, Tm, Cm = 2, 8, 16 -- (P.gpt2's n_embd, block_size)
    for _, sp in ipairs { true, false } do
      local model = P.gpt2 { pp = mesh.pp, tp = mesh.tp, sequence_parallel = sp }
      local opt = lt.optim.AdamW(model:parameters(), { lr = 1e-3 })
      local S = lt.train.step.new { model = model, optimizer = opt, accum = 2,
        ddp = lt.dist.DataParallel(model, { group = mesh.dp }) }
      local sizes, isend = {}, lt.dist.isend
      lt.dist.isend = function(t, ...) -- (lt.dist is lutra.dist.comm's table: the link calls this one)
        if t.dtype ~= "i64" then sizes[#sizes + 1] = t:numel() end
        return isend(t, ...)
      end
      local g = lt.Generator(1)
      local ok, err = pcall(S.run, S, 1, function()
        local x = lt.randint(0, 37, { Bm, Tm }, { generator = g, dtype = "i64" })
        return x, x
      end)
      lt.dist.isend = isend
      if not ok then error(err, 0) end
      local want = Bm * Tm * Cm / (sp and 2 or 1)
      assert(#sizes == 2, ("sp=%s: %d messages sent, 2 expected (2 micro-batches, one way each)"):format(tostring(sp), #sizes))
      for _, n in ipairs(sizes) do
        assert(n == want, ("sp=%s: a message of %d elements, %d expected"):format(tostring(sp), n, want))
      end
    end
  end)
end

H.test("bad settings raise on every rank, naming what is wrong", function()
  local mesh = lt.dist.mesh { pp = world }
  H.raises(function() P.gpt2 { n_layer = 1, pp = mesh.pp } end, world .. " stages for 1 blocks")
  H.raises(function() P.gpt2 { pp = mesh.pp, pp_stages = { 3, 3, 3, 3 } } end, "pp_stages")
  local counts = {}
  for i = 1, world do counts[i] = 1 end
  counts[1] = 6 - world
  H.raises(function() P.gpt2 { pp = mesh.pp, pp_stages = counts } end, "sums to 5 blocks, the model has 4")
  H.raises(function() P.gpt2 { virtual_stages = 2 } end, "virtual_stages", "needs pp")
  local model = P.gpt2 { pp = mesh.pp }
  H.raises(function() model(lt.zeros({ 1, 4 }, { dtype = "i64" })) end, "model(x) is not available")
  H.raises(function() lt.dist.Zero(model, { stage = 3, lr = 1e-3 }) end, "stage 3 with pipeline parallelism")
  local opt = lt.optim.AdamW(model:parameters(), { lr = 1e-3 })
  H.raises(function() lt.train.step.new { model = model, optimizer = opt, accum = 3, pp_schedule = "zb" } end,
    "schedule must be gpipe, 1f1b or interleaved")
  local two = P.gpt2 { pp = mesh.pp, virtual_stages = 2, n_layer = 2 * world }
  local opt2 = lt.optim.AdamW(two:parameters(), { lr = 1e-3 })
  H.raises(function() lt.train.step.new { model = two, optimizer = opt2, accum = world + 1 } end,
    "multiple of the stages")
  H.raises(function() lt.train.step.new { model = two, optimizer = opt2, accum = world, pp_schedule = "1f1b" } end,
    "need the interleaved schedule")
  -- the stages share one batch stream: a rank fed other batches is refused on every rank before the schedule runs
  local S = lt.train.step.new { model = model, optimizer = opt, accum = 2 }
  local g = lt.Generator(20 + lt.dist.rank())
  H.raises(function()
    S:run(1, function()
      local x = lt.randint(0, 37, { 2, 8 }, { generator = g, dtype = "i64" })
      return x, x
    end)
  end, "the pipeline ranks read different batches", "lt.data.shards{rank = mesh.coords.dp")
end)

H.test("evaluation: model:loss on every stage is one process's loss", function()
  local mesh = lt.dist.mesh { pp = world }
  local whole, split = P.gpt2 {}, P.gpt2 { pp = mesh.pp }
  local x = lt.randint(0, 37, { 2, 8 }, { generator = lt.Generator(3), dtype = "i64" })
  local y = lt.randint(0, 37, { 2, 8 }, { generator = lt.Generator(4), dtype = "i64" })
  local a, na = lt.no_grad(function() return whole:loss(x, y) end)
  local b, nb = split:loss(x, y)
  local d = math.abs(a:item() - b:item()) / math.abs(a:item())
  assert(d < 1e-6 and na == nb, ("one process %.8f (%d), the pipeline %.8f (%d)"):format(a:item(), na, b:item(), nb))
end)

H.run("tests/dist/pp_spec.lua")
