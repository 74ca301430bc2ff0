-- tests/lua/ref_ops_spec.lua: every case of tests/ref/ops.json (written by
-- tests/ref/gen_ops.py with PyTorch): elementwise, scalar, where, clamp,
-- reductions, matmul, indexing, conversions and views, across dtypes and
-- contiguous, transposed, narrowed, broadcast, 0-dim and empty inputs.
local lt = require "lutra"
local H = require "tests.lua.helpers"

local fixture = H.load_json("tests/ref/ops.json")
local null = lt.json.null

local function arg(v)
  if v == null then return nil end
  return v
end

local function dims_arg(v)
  v = arg(v)
  if type(v) == "number" then return v + 1 end
  if type(v) == "table" then
    local d = {}
    for i = 1, #v do d[i] = v[i] + 1 end
    return d
  end
  return nil
end

local RUN = {}
for _, op in ipairs { "neg", "abs", "exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid" } do
  RUN[op] = function(x) return x[op](x) end
end
for _, op in ipairs { "add", "sub", "mul", "div", "pow", "maximum", "minimum", "eq", "ne", "lt", "le", "gt", "ge" } do
  RUN[op] = function(a, b) return a[op](a, b) end
  RUN[op .. "_scalar"] = function(x, args)
    if args[2] then return lt[op](args[1], x) end
    return lt[op](x, args[1])
  end
end
RUN.where = function(c, a, b) return lt.where(c, a, b) end
RUN.clamp = function(x, args) return x:clamp(arg(args[1]), arg(args[2])) end
for _, op in ipairs { "sum", "mean", "max", "min", "argmax", "argmin" } do
  RUN[op] = function(x, args) return x[op](x, dims_arg(args[1]), arg(args[2])) end
end
RUN.var = function(x, args) return x:var(dims_arg(args[1]), args[2], args[3]) end
RUN.matmul = function(a, b) return lt.matmul(a, b) end
RUN.index_select = function(t, idx, args) return t:index_select(args[1] + 1, idx) end
RUN.gather = function(t, idx, args) return t:gather(args[1] + 1, idx) end
RUN.scatter_add = function(t, idx, src, args) return t:clone():scatter_add_(args[1] + 1, idx, src) end
RUN.index_add = function(t, idx, src, args) return t:clone():index_add_(args[1] + 1, idx, src) end
RUN.to = function(x, args) return x:to(args[1]) end
RUN.contiguous = function(x) return x:contiguous() end

local IN_PLACE = { add = true, sub = true, mul = true, div = true, maximum = true, minimum = true }

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
