-- tests/lua/pp_schedule_spec.lua: lt.dist.pp's pipeline schedules as data:
-- each rank runs every micro-batch's forward and backward once per chunk,
-- its sends and receives around them; the schedules run without deadlock;
-- the simulated bubble is the published formula's ((p-1)/(m+p-1) for GPipe
-- and 1F1B, (p-1)/(v m + p-1) interleaved) and 1F1B keeps at most p - r
-- micro-batches in flight on rank r where GPipe keeps m; a broken schedule
-- is named (a deadlock, a missing action) and bad arguments refused.
local lt = require "lutra"
local H = require "tests.lua.helpers"
local pp = lt.dist.pp

local function cases()
  local out = {}
  for _, p in ipairs { 1, 2, 3, 4 } do
    for _, m in ipairs { 1, 2, 4, 8 } do
      out[#out + 1] = { "gpipe", p, m, 1 }
      out[#out + 1] = { "one_f_one_b", p, m, 1 }
      for _, v in ipairs { 2, 3 } do
        if m % p == 0 then out[#out + 1] = { "interleaved", p, m, v } end
      end
    end
  end
  return out
end

describe("lt.dist.pp schedules", function()
  it("give each rank every forward and backward once per chunk, each with its sends and receives", function()
    for _, c in ipairs(cases()) do
      local name, p, m, v = c[1], c[2], c[3], c[4]
      local s = pp[name](p, m, v)
      assert.are.equal(p, #s.ranks)
      for r = 1, p do
        local count = {}
        for _, a in ipairs(s.ranks[r]) do count[a.op] = (count[a.op] or 0) + 1 end
        local what = ("%s p=%d m=%d v=%d rank %d"):format(name, p, m, v, r - 1)
        assert.are.equal(m * v, count.fwd, what .. ": forwards")
        assert.are.equal(m * v, count.bwd, what .. ": backwards")
        -- virtual stages r + (c-1) p: the first receives nothing forward, the last sends nothing
        local stages_after = 0
        for chunk = 1, v do if (r - 1) + (chunk - 1) * p < p * v - 1 then stages_after = stages_after + 1 end end
        assert.are.equal(m * stages_after, count.send_fwd or 0, what .. ": forward sends")
        assert.are.equal(m * stages_after, count.recv_bwd or 0, what .. ": backward receives")
      end
    end
  end)
  it("run without deadlock, with the published bubble and bounded activations", function()
    for _, c in ipairs(cases()) do
      local name, p, m, v = c[1], c[2], c[3], c[4]
      local what = ("%s p=%d m=%d v=%d"):format(name, p, m, v)
      local r = pp.simulate(pp[name](p, m, v))
      assert(math.abs(r.bubble - pp.bubble_fraction(p, m, v)) < 1e-12,
        ("%s: simulated bubble %.6f, formula %.6f"):format(what, r.bubble, pp.bubble_fraction(p, m, v)))
      for rank = 1, p do
        if name == "gpipe" then assert.are.equal(m, r.in_flight[rank], what .. ": GPipe keeps m")
        elseif name == "one_f_one_b" then
          assert(r.in_flight[rank] <= math.min(p - rank + 1, m), what .. ": 1F1B keeps at most p - r")
        end
      end
    end
    -- equal forward and backward times give the same fractions
    local r = pp.simulate(pp.one_f_one_b(4, 8), { fwd = 1, bwd = 1 })
    assert(math.abs(r.bubble - 3 / 11) < 1e-12)
  end)
  it("print a timeline a line per rank", function()
    local t = pp.timeline(pp.one_f_one_b(2, 3))
    assert.are.equal("1f1b: 2 stages, 3 micro-batches\nrank 0: F1 F2 B1 F3 B2 B3\nrank 1: F1 B1 F2 B2 F3 B3", t)
    assert.truthy(pp.timeline(pp.interleaved(2, 2, 2)):find("rank 0: F1.1 F2.1 F1.2", 1, true))
    -- interleaved with one chunk a rank is 1F1B's order (README, the recipe's note)
    for _, pm in ipairs { { 2, 4 }, { 3, 6 }, { 4, 8 } } do
      local rows = function(t) return (t:gsub("^[^\n]*\n", "")) end
      assert.are.equal(rows(pp.timeline(pp.one_f_one_b(pm[1], pm[2]))), rows(pp.timeline(pp.interleaved(pm[1], pm[2], 1))))
    end
    -- one micro-batch is "1 micro-batch" (was "1 micro-batches")
    assert.are.equal("gpipe: 2 stages, 1 micro-batch\nrank 0: F1 B1\nrank 1: F1 B1", pp.timeline(pp.gpipe(2, 1)))
  end)
  it("name a schedule that cannot run, and refuse bad arguments", function()
    local s = pp.one_f_one_b(2, 2)
    -- rank 1 backward before its forward of the same micro-batch: the last stage waits on itself
    s.ranks[2] = { { op = "bwd", mb = 1, chunk = 1 }, { op = "fwd", mb = 1, chunk = 1 }, { op = "fwd", mb = 2, chunk = 1 },
      { op = "bwd", mb = 2, chunk = 1 } }
    H.assert_error(function() pp.simulate(s) end, "deadlock", "rank 1 at bwd of micro-batch 1")
    local t = pp.gpipe(2, 2)
    table.remove(t.ranks[1], #t.ranks[1])
    H.assert_error(function() pp.simulate(t) end, "rank 0 has 3 computing actions, 4 expected")
    H.assert_error(function() pp.gpipe(0, 2) end, "p (stages) must be a whole number >= 1")
    H.assert_error(function() pp.one_f_one_b(2, 1.5) end, "m (micro-batches) must be")
    H.assert_error(function() pp.interleaved(4, 6, 2) end, "micro-batches (6) to be a multiple of the stages (4)")
  end)
end)
