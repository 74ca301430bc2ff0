-- tests/lua/runners.lua: how each case of the PyTorch fixtures runs
-- (tests/ref/ops.json, nn.json and optim.json), shared by the CPU specs and
-- the GPU checks (tests/gpu/checks.lua), which run the same cases on CUDA
-- tensors.
local lt = require "lutra"
local H = require "tests.lua.helpers"
local F = lt.F

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


local NN = {
  layer_norm = function(a, x, w, b) return F.layer_norm(x, w, b, a.eps) end,
  rms_norm = function(a, x, w) return F.rms_norm(x, w, a.eps) end,
  softmax = function(a, x) return F.softmax(x, a.dim) end,
  scaled_softmax = function(a, x) return F.scaled_softmax(x, a.scale, { causal = a.causal }) end,
  add_layer_norm = function(a, x, r, w, b) return lt.stack({ F.add_layer_norm(x, r, w, b, a.eps) }) end,
  add_rms_norm = function(a, x, r, w) return lt.stack({ F.add_rms_norm(x, r, w, a.eps) }) end,
  log_softmax = function(a, x) return F.log_softmax(x, a.dim) end,
  cross_entropy = function(a, x, t) return (F.cross_entropy(x, t, { reduction = a.reduction })) end,
  linear_cross_entropy = function(a, x, w, t)
    return (F.linear_cross_entropy(x, w, t, { reduction = a.reduction, classes = a.classes }))
  end,
  gelu = function(_, x) return F.gelu(x) end,
  silu = function(_, x) return F.silu(x) end,
  swiglu = function(_, a, b) return F.swiglu(a, b) end,
  linear = function(a, x, w, b) return F.linear(x, w, b, { activation = a.activation }) end,
  linear_nobias = function(a, x, w) return F.linear(x, w, nil, { activation = a.activation }) end,
  mlp = function(_, x, w1, b1, w2, b2) return F.mlp(x, w1, b1, w2, b2) end,
  mlp_nofcbias = function(_, x, w1, w2, b2) return F.mlp(x, w1, nil, w2, b2) end,
  embedding = function(_, i, e) return F.embedding(i, e) end,
  rope = function(a, x) return F.rope(x, { base = a.base, start = a.start, scaling = a.scaling }) end,
  sdpa = function(a, q, k, v) return F.scaled_dot_product_attention(q, k, v, { causal = a.causal }) end,
}

--- Runs one optimizer case of tests/ref/optim.json on device: its two
-- parameters in one group, each step's gradients, the step, and the
-- parameters checked against torch's after each step (bf16: the rounding of
-- the f32 master may differ by one bf16 unit at a tie). A case with a
-- max_norm (clip_steps: torch clipped before each step) clips by way:
-- "folded" takes the factor into the step (opt:step{grad_scale}), "in
-- place" scales the gradients (lt.optim.clip_grad_norm); each(step, norm,
-- params) then checks more. Returns the optimizer.
local function optim_case(case, device, way, each)
  local params = {}
  for i, spec in ipairs(case.start) do params[i] = H.build(spec, device):requires_grad_() end
  local opt = lt.optim[case.kind]({ { params = params } }, case.settings)
  for step, grads in ipairs(case.grads) do
    for i, g in ipairs(grads) do params[i].grad = H.build(g, device) end
    local norm
    if not case.max_norm then
      opt:step()
    elseif way == "folded" then
      norm = lt.optim.grad_norm(params)
      opt:step { grad_scale = lt.optim.clip_scale(norm, case.max_norm) }
    else
      norm = lt.optim.clip_grad_norm(params, case.max_norm)
      opt:step()
    end
    if each then each(step, norm, params) end
    for i, want in ipairs(case.after[step]) do
      H.assert_matches(params[i]:detach(), want, ("%s step %d parameter %d"):format(case.name, step, i),
        case.dtype == "f32" and 2 or 1)
    end
  end
  return opt
end

return { ops = RUN, in_place = IN_PLACE, nn = NN, optim = optim_case }
