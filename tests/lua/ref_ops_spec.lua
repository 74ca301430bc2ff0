-- tests/lua/ref_ops_spec.lua: every case of tests/ref/ops.json (written by
-- tests/ref/gen_ops.py with PyTorch): elementwise, scalar, where, clamp,
-- reductions, matmul, indexing, conversions and views, across dtypes and
-- contiguous, transposed, narrowed, broadcast, 0-dim and empty inputs.
local lt = require "lutra"
local H = require "tests.lua.helpers"

local fixture = H.load_json("tests/ref/ops.json")
local runners = require "tests.lua.runners"
local RUN, IN_PLACE = runners.ops, runners.in_place

describe("PyTorch reference (" .. fixture.torch .. ")", function()
  for _, case in ipairs(fixture.cases) do
    it(case.name, function()
      local fn = assert(RUN[case.op], "no runner for " .. case.op)
      local ins = {}
      for i, spec in ipairs(case.inputs) do ins[i] = H.build(spec) end
      local n = #ins
      ins[n + 1] = case.args
      local out = fn(unpack(ins, 1, n + 1))
      H.assert_matches(out, case.expect, case.name)
      -- the in-place form writes the same values into the left operand
      if IN_PLACE[case.op] and out.dtype == ins[1].dtype and #out:shape() == #ins[1]:shape() then
        local same = true
        for d = 1, out:dim() do same = same and out:size(d) == ins[1]:size(d) end
        local expanded = false
        for d = 1, ins[1]:dim() do expanded = expanded or (ins[1]:stride(d) == 0 and ins[1]:size(d) > 1) end
        if same and not expanded then
          local a = ins[1]:clone()
          a[case.op .. "_"](a, ins[2])
          H.assert_matches(a, case.expect, case.name .. " (in place)")
        end
      end
    end)
  end
end)
