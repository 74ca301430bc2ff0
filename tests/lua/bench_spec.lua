-- tests/lua/bench_spec.lua: bench/interleave.lua (rounds, medians, ratios,
-- peers).
local I = require "bench.interleave"

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
