-- tests/lua/bench_spec.lua: bench/interleave.lua (rounds, medians, ratios,
-- peers) and the CPU benchmark scripts run in their quick mode, so that
-- they do not rot: they finish, print their tables, start the PyTorch and
-- tiktoken sides where those are installed, and those agree with lutra (the
-- same step-0 losses, the same ids). Their numbers mean nothing here.
local H = require "tests.lua.helpers"
local I = require "bench.interleave"

local function has(cmd) return select(2, H.sh(cmd .. " >/dev/null 2>&1")) == 0 end
local torch = has("/usr/bin/python3 -c 'import torch'")
local mpi = has("command -v mpirun") and H.sh("./lutra --version"):find("mpi: compiled in", 1, true)

-- the step-0 losses of a table's rows, by runtime name (the column named "step-0 loss")
local function losses(out, pattern)
  local t = {}
  for name, loss in out:gmatch(pattern) do t[name] = tonumber(loss) end
  return t
end

describe("bench/interleave.lua", function()
  it("runs the sides in turn, a warm-up round then the timed ones, and takes medians over the same rounds", function()
    local order = {}
    local ta, tb = { 9, 1, 3, 2 }, { 9, 2, 9, 4 }
    local r = I.rounds(3, {
      { name = "a", run = function(round) order[#order + 1] = "a" .. round; return ta[round + 1] end },
      { name = "b", run = function(round) order[#order + 1] = "b" .. round; return tb[round + 1] end },
    })
    assert.are.same({ "a0", "b0", "a1", "b1", "a2", "b2", "a3", "b3" }, order)
    assert.are.same({ 1, 3, 2 }, r.times.a)
    assert.are.equal(2, r.median.a)
    assert.are.equal(4, r.median.b)
    assert.are.equal(2, r:ratio("b", "a"))
    assert.are.equal(2, r:round_ratio("b", "a")) -- 2, 3, 2
    assert.has_error(function() I.rounds(2, {}) end, "interleave.rounds: 2 rounds; a median needs at least 3")
  end)
  it("drives a peer process a line at a time, under the environment it is given", function()
    local p = assert(I.peer { env = { HOME = false, LT_BENCH_X = "a b" }, cmd = "./lutra -e " ..
      I.shell_quote([[require("bench.interleave").serve(function(c) return { echo = c } end,
        { x = os.getenv("LT_BENCH_X"), home = os.getenv("HOME") or "unset" })]]) })
    assert.are.same({ x = "a b", home = "unset" }, p.info)
    assert.are.same({ echo = "step 1" }, p:call("step 1"))
    assert.are.same({ echo = "two" }, p:call("two"))
    p:close()
    assert.falsy(io.open(p.dir .. "/cmd.0")) -- (its FIFOs removed)
  end)
  it("a peer that fails before its first line gives nil and its error output", function()
    local p, err = I.peer { cmd = "sh -c 'echo no such module >&2; exit 1'" }
    assert.is_nil(p)
    assert.truthy(err:find("no such module", 1, true), err)
  end)
  it("describes the thread environment (what lutra runs with, a peer's default)", function()
    assert.are.equal("OMP_WAIT_POLICY unset OPENBLAS_THREAD_TIMEOUT unset", I.describe_env(I.default_env))
    assert.are.equal("OMP_WAIT_POLICY=PASSIVE OPENBLAS_THREAD_TIMEOUT=4",
      I.describe_env { OMP_WAIT_POLICY = "PASSIVE", OPENBLAS_THREAD_TIMEOUT = "4" })
  end)
end)

describe("the CPU benchmark scripts, quick", function()
  it("bench/model_cpu.lua: lutra and PyTorch under both environments from the same weights", function()
    local out, rc = H.sh("./lutra bench/model_cpu.lua --quick")
    assert.are.equal(0, rc, out)
    local l = losses(out, "\ngpt2%-tiny +(%S+) +%d+ +3 +(%S+)")
    assert.truthy(l.lutra, out)
    if torch then
      assert.near(l.lutra, l.torch, 1e-3, out)
      assert.near(l.lutra, l["torch*"], 1e-3, out)
      assert.truthy(out:find("default env: %d+ threads, %d+ inter%-op %(OMP_WAIT_POLICY unset"), out)
      assert.truthy(out:find("lutra's env: %d+ threads, %d+ inter%-op %(OMP_WAIT_POLICY=PASSIVE"), out)
    end
  end)
  it("bench/train_cpu.lua: lutra, lutra on 2 ranks and PyTorch, the same losses at step 0 and after", function()
    local out, rc = H.sh("./lutra bench/train_cpu.lua --quick")
    assert.are.equal(0, rc, out)
    local rows = {}
    for name, l0, last in out:gmatch("\n(%S+ ?%S*) +%d+ +[%d.]+ +%d+ MiB +(%S+) +(%S+)") do
      rows[name:gsub("%s+$", "")] = { tonumber(l0), tonumber(last) }
    end
    assert.truthy(rows.lutra, out)
    local expect = torch and { "torch", "torch*" } or {}
    if mpi then expect[#expect + 1] = "lutra x2" end
    for _, name in ipairs(expect) do
      assert.truthy(rows[name], name .. " in\n" .. out)
      assert.near(rows.lutra[1], rows[name][1], 1e-3, name .. " in\n" .. out) -- step 0
      assert.near(rows.lutra[2], rows[name][2], 1e-3, name .. " in\n" .. out) -- the last step
    end
  end)
  it("bench/train_cpu.lua --baseline: another lutra binary as one more side, the same losses bit for bit", function()
    local out, rc = H.sh("./lutra bench/train_cpu.lua --quick --torch=false --mpi=false --baseline=./lutra")
    assert.are.equal(0, rc, out)
    local l0, last = out:match("\nlutra +%d+ +[%d.]+ +%d+ MiB +(%S+) +(%S+)")
    local b0, blast = out:match("\nbaseline +%d+ +[%d.]+ +%d+ MiB +(%S+) +(%S+) +%./lutra:")
    assert.truthy(l0 and b0, out)
    assert.are.same({ l0, last }, { b0, blast }, out)
  end)
  it("bench/tokenizer.lua: lutra and tiktoken (where installed), the same ids", function()
    local out, rc = H.sh("./lutra bench/tokenizer.lua --quick")
    assert.are.equal(0, rc, out)
    assert.truthy(out:find("\nlutra +[%d.]+ MB/s"), out)
    if has("PYTHONPATH=data/pylib python3 -c 'import tiktoken'") then
      assert.truthy(out:find("ids, lutra against tiktoken: all %d+ the same"), out)
    end
  end)
end)
