--- lutra.tensor.join: lt.cat and lt.stack. Above lutra.autograd: a cat
-- whose inputs require gradients is a custom autograd function.
local autograd = require "lutra.autograd"
local create = require "lutra.tensor.create"
local capi = require "lutra.capi"
local core = require "lutra.tensor.core"
local C = capi.C
local T = core.methods
local check_tensor, cdim, dtype_name = core.check_tensor, core.cdim, core.dtype_name

local M = {}

-- ---- joining --------------------------------------------------------------------

local cat_plain

--- cat with gradients: a custom autograd function per group of up to 4
-- tensors (its limit), groups joined the same way.
local function cat_grad(list, d)
  if #list > 4 then
    local parts = {}
    for i = 1, #list, 4 do parts[#parts + 1] = cat_grad({ unpack(list, i, math.min(i + 3, #list)) }, d) end
    return cat_grad(parts, d)
  end
  local sizes = {}
  for i, t in ipairs(list) do sizes[i] = T.size(t, d) end
  local Cat = autograd.Function {
    forward = function(_, ...) return cat_plain({ ... }, d, 4) end,
    backward = function(_, g)
      local outs, at = {}, 1
      for i = 1, #sizes do
        outs[i] = T.narrow(g, d, at, sizes[i])
        at = at + sizes[i]
      end
      return unpack(outs, 1, #sizes)
    end,
  }
  return Cat(unpack(list))
end

--- lt.cat({a, b, ...}, dim): joins tensors along an existing dim (default 1);
-- other dims must match; dtypes promote as in arithmetic (torch.cat).
-- Gradients flow to inputs that require them.
function M.cat(list, dim)
  if type(list) ~= "table" or #list == 0 then error("cat: expected a non-empty table of tensors", 2) end
  for i = 1, #list do check_tensor("cat", list[i], i, 2) end
  local first = list[1]
  local d = cdim("cat", first, dim or 1, 2) + 1
  local shape, dt = T.shape(first), tonumber(C.lt_tensor_dtype(first))
  local total = 0
  for i = 1, #list do
    local s = T.shape(list[i])
    if #s ~= #shape then
      error(("cat: tensor %d has shape %s, tensor 1 has %s (dims differ)"):format(i, tostring(s), tostring(shape)), 2)
    end
    for k = 1, #s do
      if k ~= d and s[k] ~= shape[k] then
        error(("cat: tensor %d has shape %s, tensor 1 has %s (dim %d differs)"):format(i, tostring(s), tostring(shape), k), 2)
      end
    end
    total = total + s[d]
    dt = tonumber(C.lt_dtype_promote(dt, C.lt_tensor_dtype(list[i])))
  end
  if C.lt_grad_enabled() ~= 0 then
    for i = 1, #list do
      if C.lt_tensor_requires_grad(list[i]) ~= 0 then return cat_grad(list, d) end
    end
  end
  return cat_plain(list, d, 2, shape, total, dt)
end

--- The copy that cat does (without gradients); shape/total/dt are worked out when not given.
cat_plain = function(list, d, level, shape, total, dt)
  if not shape then
    shape, total, dt = T.shape(list[1]), 0, tonumber(C.lt_tensor_dtype(list[1]))
    for i = 1, #list do
      total = total + T.size(list[i], d)
      dt = tonumber(C.lt_dtype_promote(dt, C.lt_tensor_dtype(list[i])))
    end
  end
  shape[d] = total
  local first = list[1]
  local out = create.empty(shape, { dtype = dtype_name(dt), device = first.device })
  local at = 1
  for i = 1, #list do
    local n = list[i]:size(d)
    if n > 0 then out:narrow(d, at, n):copy_(list[i]) end
    at = at + n
  end
  return out
end

--- lt.stack({a, b, ...}, dim): joins same-shaped tensors along a new dim (default 1).
function M.stack(list, dim)
  if type(list) ~= "table" or #list == 0 then error("stack: expected a non-empty table of tensors", 2) end
  local parts = {}
  for i = 1, #list do
    check_tensor("stack", list[i], i, 2)
    parts[i] = T.unsqueeze(list[i], dim or 1)
  end
  return M.cat(parts, dim or 1)
end

return M
