--- lutra.tensor.ops: the tensor methods that compute: views (view,
-- reshape, transpose, narrow, chunk, ...), copies and conversion (to,
-- copy_, fill_), elementwise math (unary and binary ops, where,
-- masked_fill, clamp), reductions (sum, mean, max, var, ...), matrix
-- products and indexing (matmul, index_select, gather, scatter_add_).
local create = require "lutra.tensor.create"
local capi = require "lutra.capi"
local core = require "lutra.tensor.core"
local ffi, C, fail = capi.ffi, capi.C, capi.fail
local box = capi.tensor_box
local T = core.methods
local floor = math.floor
local dims_a, dims_b = capi.dims_a, capi.dims_b
local take, is_tensor, check_tensor, check_position = core.take, core.is_tensor, core.check_tensor,
  core.check_position
local gc, release = ffi.gc, core.release
local read_shape, cdim, shape_str, binary = core.read_shape, core.cdim, core.shape_str, core.binary
local dtype_code, device_code, dtype_out, device_out = core.dtype_code, core.device_code, core.dtype_out,
  core.device_out

local M = {}

-- ---- views ---------------------------------------------------------------------

--- t:view(2, 3) or t:view{2, 3}: same storage, new shape (one size may be -1).
-- Raises when the strides do not allow it (use reshape).
function T.view(t, ...)
  local n = read_shape("view", dims_a, 2, ...)
  if C.lt_tensor_view(t, n, dims_a, box) ~= 0 then fail(2) end
  return take()
end

--- t:reshape(...): a view when possible, else a contiguous copy.
function T.reshape(t, ...)
  local n = read_shape("reshape", dims_a, 2, ...)
  if C.lt_tensor_reshape(t, n, dims_a, box) ~= 0 then fail(2) end
  return take()
end

--- t:flatten([start_dim, end_dim]): merges dims start..end (default all) into one.
function T.flatten(t, s, e)
  local n = C.lt_tensor_ndim(t)
  if n == 0 then return T.reshape(t, 1) end
  s = s and cdim("flatten", t, s, 2) or 0
  e = e and cdim("flatten", t, e, 2) or n - 1
  if s > e then error(("flatten: start dim %d comes after end dim %d"):format(s + 1, e + 1), 2) end
  local shape, out = T.shape(t), {}
  for i = 1, s do out[#out + 1] = shape[i] end
  local m = 1
  for i = s + 1, e + 1 do m = m * shape[i] end
  out[#out + 1] = m
  for i = e + 2, n do out[#out + 1] = shape[i] end
  return T.reshape(t, out)
end

--- t:transpose(d1, d2): swaps two dims (a view).
function T.transpose(t, d0, d1)
  if C.lt_tensor_transpose(t, cdim("transpose", t, d0, 2), cdim("transpose", t, d1, 2), box) ~= 0 then fail(2) end
  return take()
end

--- t:t(): the transpose of a 2-D tensor (a view).
function T.t(t)
  if C.lt_tensor_ndim(t) ~= 2 then
    error(("t: expects a 2-D tensor, got shape %s; use transpose(d1, d2)"):format(shape_str(t)), 2)
  end
  if C.lt_tensor_transpose(t, 0, 1, box) ~= 0 then fail(2) end
  return take()
end

--- t:permute(3, 1, 2) or t:permute{3, 1, 2}: result dim i is input dim dims[i].
function T.permute(t, ...)
  if select("#", ...) == 0 then error("permute: no dims given", 2) end
  local dims = type(...) == "table" and ... or { ... }
  local n = #dims
  if n ~= C.lt_tensor_ndim(t) then
    error(("permute: %d dims given for a %d-dim tensor of shape %s"):format(n, C.lt_tensor_ndim(t), shape_str(t)), 2)
  end
  for i = 1, n do dims_a[i - 1] = cdim("permute", t, dims[i], 2) end
  if C.lt_tensor_permute(t, n, dims_a, box) ~= 0 then fail(2) end
  return take()
end

--- t:narrow(dim, start, length): elements start .. start+length-1 (1-based) of dim.
function T.narrow(t, dim, start, length)
  check_position("narrow", "start", start, 2)
  check_position("narrow", "length", length, 2)
  if C.lt_tensor_narrow(t, cdim("narrow", t, dim, 2), start - 1, length, box) ~= 0 then fail(2) end
  return take()
end

local chunk_box = ffi.new("lt_tensor*[4]")

--- t:chunk(n, dim) -> n views of equal size along dim (torch.chunk when the
-- size divides evenly; a dim that does not divide is an error). Up to 4
-- pieces form one autograd node (lt_tensor_chunk: their gradients meet in
-- one pass, with no copy when they lie side by side); more are narrows.
function T.chunk(t, n, dim)
  local d = cdim("chunk", t, dim, 2)
  if type(n) ~= "number" or n < 1 or n % 1 ~= 0 then
    error(("chunk: the number of pieces must be a positive integer, got %s"):format(tostring(n)), 2)
  end
  if n > 4 then
    local size = t:size(dim)
    if size % n ~= 0 then
      error(("chunk: dim %d of shape %s does not split into %d equal pieces"):format(d + 1, tostring(t:shape()), n), 2)
    end
    local out, piece = {}, size / n
    for j = 1, n do out[j] = t:narrow(dim, (j - 1) * piece + 1, piece) end
    return unpack(out)
  end
  if C.lt_tensor_chunk(t, n, d, chunk_box) ~= 0 then fail(2) end
  local out = {}
  for j = 1, n do out[j] = gc(chunk_box[j - 1], release) end
  return unpack(out)
end

--- t:select(dim, i): element i (1-based, negative from the end) of dim, removing the dim.
function T.select(t, dim, index)
  local d = cdim("select", t, dim, 2)
  check_position("select", "index", index, 2)
  local size = tonumber(C.lt_tensor_size(t, d))
  local i = index < 0 and size + index + 1 or index
  if i < 1 or i > size then
    error(("select: index %d is out of range for dim %d of size %d (shape %s)"):format(index, dim, size, shape_str(t)), 2)
  end
  if C.lt_tensor_select(t, d, i - 1, box) ~= 0 then fail(2) end
  return take()
end

--- t:expand(4, 2, 3) or t:expand{...}: broadcasts size-1 dims (-1 keeps a size). A view.
function T.expand(t, ...)
  local n = read_shape("expand", dims_a, 2, ...)
  if C.lt_tensor_expand(t, n, dims_a, box) ~= 0 then fail(2) end
  return take()
end

function T.expand_as(t, other)
  check_tensor("expand_as", other, 1, 2)
  return T.expand(t, T.shape(other))
end

--- t:squeeze([dim]): removes dim if its size is 1, or every size-1 dim.
function T.squeeze(t, dim)
  local d = dim == nil and -1 or cdim("squeeze", t, dim, 2)
  if C.lt_tensor_squeeze(t, d, box) ~= 0 then fail(2) end
  return take()
end

--- t:unsqueeze(dim): inserts a size-1 dim so that it becomes dim (1..ndim+1, or negative).
function T.unsqueeze(t, dim)
  if C.lt_tensor_unsqueeze(t, cdim("unsqueeze", t, dim, 2, 1), box) ~= 0 then fail(2) end
  return take()
end

--- t:contiguous(): t itself when contiguous, else a contiguous copy.
function T.contiguous(t)
  if C.lt_tensor_contiguous(t, box) ~= 0 then fail(2) end
  return take()
end

--- t:clone(): a contiguous copy.
function T.clone(t)
  if C.lt_tensor_clone(t, box) ~= 0 then fail(2) end
  return take()
end

-- ---- copies and conversion ---------------------------------------------------

--- t:to("bf16"), t:to("cuda"), t:to("cuda", "bf16") or t:to{dtype=, device=}:
-- a copy with that dtype and device; t itself when nothing changes.
function T.to(t, a, b)
  local dt, dev = tonumber(C.lt_tensor_dtype(t)), C.lt_tensor_device(t)
  local function apply(x)
    if x == nil then return end
    if type(x) == "table" then
      if x.dtype then dt = dtype_code(x.dtype, 3) end
      if x.device then dev = device_code(x.device, 3) end
    elseif type(x) == "string" then
      if C.lt_dtype_parse(x, dtype_out) == 0 then
        dt = dtype_out[0]
      elseif C.lt_device_parse(x, device_out) == 0 then
        dev = device_out[0]
      else
        error(("to: '%s' is neither a dtype (f32, bf16, ...) nor a device (cpu, cuda:N)"):format(x), 3)
      end
    else
      error("to: expected a dtype or device name, got " .. type(x), 3)
    end
  end
  apply(a)
  apply(b)
  if C.lt_tensor_to(t, dt, dev, box) ~= 0 then fail(2) end
  return take()
end

--- t:copy_(src): copies src (broadcast, any dtype or device) into t; returns t.
function T.copy_(t, src)
  check_tensor("copy_", src, 1, 2)
  if C.lt_tensor_copy_(t, src) ~= 0 then fail(2) end
  return t
end

--- t:fill_(value): every element set to value; returns t.
function T.fill_(t, value)
  if type(value) == "boolean" then value = value and 1 or 0 end
  if type(value) ~= "number" then error("fill_: value must be a number, got " .. type(value), 2) end
  if C.lt_tensor_fill_(t, value) ~= 0 then fail(2) end
  return t
end

function T.zero_(t)
  if C.lt_tensor_fill_(t, 0) ~= 0 then fail(2) end
  return t
end

-- ---- elementwise ---------------------------------------------------------------

local UNARY = { neg = 0, abs = 1, exp = 2, log = 3, sqrt = 4, rsqrt = 5, tanh = 6, sigmoid = 7, sign = 8,
  gelu = 9, silu = 10 }
local BINARY = { add = 0, sub = 1, mul = 2, div = 3, pow = 4, maximum = 5, minimum = 6,
  eq = 7, ne = 8, lt = 9, le = 10, gt = 11, ge = 12 }
M.UNARY, M.BINARY = UNARY, BINARY

for name, code in pairs(UNARY) do
  T[name] = function(t)
    if C.lt_unary(code, t, nil, box) ~= 0 then fail(2) end
    return take()
  end
  T[name .. "_"] = function(t)
    if C.lt_unary(code, t, t, box) ~= 0 then fail(2) end
    release(box[0])
    return t
  end
end

for name, code in pairs(BINARY) do
  -- these check their operands themselves (a number may come first)
  T[name] = function(a, b) return binary(code, a, b, nil, 2) end
  T[name .. "_"] = function(a, b) return binary(code, a, b, a, 2) end
  capi.state.checked_methods[T[name]] = true
  capi.state.checked_methods[T[name .. "_"]] = true
end

--- lt.where(cond, a, b): elementwise cond ? a : b; cond is bool; a or b may be numbers.
function M.where(cond, a, b)
  check_tensor("where", cond, 1, 2)
  local ref = is_tensor(a) and a or (is_tensor(b) and b or nil)
  -- a number becomes a 0-dim tensor of the other operand's dtype, or f32 when
  -- that is an integer type and the number is not whole (0-dim operands
  -- promote only across categories, as torch's Python scalars do)
  local function scalar(v)
    local dt = ref and ref.dtype or "f32"
    if ref and not ref:is_floating_point() and v ~= floor(v) then dt = "f32" end
    return create.tensor(v, { dtype = dt, device = ref and ref.device or cond.device })
  end
  if type(a) == "number" then a = scalar(a) end
  if type(b) == "number" then b = scalar(b) end
  check_tensor("where", a, 2, 2)
  check_tensor("where", b, 3, 2)
  if C.lt_where(cond, a, b, nil, box) ~= 0 then fail(2) end
  return take()
end

--- t:masked_fill(mask, value): value where mask (bool, broadcast) is true, t elsewhere.
function T.masked_fill(t, mask, value)
  check_tensor("masked_fill", mask, 1, 2)
  if mask.dtype ~= "bool" then
    error(("masked_fill: the mask must be bool, got %s (compare first, e.g. x:eq(0))"):format(mask.dtype), 2)
  end
  if type(value) ~= "number" and type(value) ~= "boolean" then
    error("masked_fill: value must be a number, got " .. type(value), 2)
  end
  local v = create.tensor(value, { dtype = t.dtype, device = t.device })
  if C.lt_where(mask, v, t, nil, box) ~= 0 then fail(2) end
  return take()
end

--- t:clamp(lo, hi): min(max(t, lo), hi); either bound may be nil. NaN stays NaN.
local function check_bounds(lo, hi)
  if (lo ~= nil and type(lo) ~= "number") or (hi ~= nil and type(hi) ~= "number") then
    error(("clamp: bounds must be numbers or nil, got %s and %s"):format(type(lo), type(hi)), 3)
  end
end

function T.clamp(t, lo, hi)
  check_bounds(lo, hi)
  if C.lt_clamp(t, lo or 0, lo and 1 or 0, hi or 0, hi and 1 or 0, nil, box) ~= 0 then fail(2) end
  return take()
end

function T.clamp_(t, lo, hi)
  check_bounds(lo, hi)
  if C.lt_clamp(t, lo or 0, lo and 1 or 0, hi or 0, hi and 1 or 0, t, box) ~= 0 then fail(2) end
  release(box[0])
  return t
end

-- ---- reductions -----------------------------------------------------------------

local REDUCE = { sum = 0, mean = 1, max = 2, min = 3, argmax = 4, argmin = 5, var = 6, std = 7 }

--- Reads dims given as nil (all), a number or a table of numbers.
local function read_dims(op, t, dims, level)
  if dims == nil then return 0 end
  if C.lt_tensor_ndim(t) == 0 and (dims == 1 or dims == -1) then return 0 end -- as torch: a 0-dim tensor has dim 1
  if type(dims) == "number" then
    dims_b[0] = cdim(op, t, dims, level + 1)
    return 1
  end
  if type(dims) ~= "table" then
    error(("%s: dims must be a number or a table of numbers, got %s"):format(op, type(dims)), level + 1)
  end
  if #dims > 8 then error(("%s: %d dims given, at most 8"):format(op, #dims), level + 1) end
  for i = 1, #dims do dims_b[i - 1] = cdim(op, t, dims[i], level + 1) end
  if #dims == 0 then
    error(op .. ": empty table of dims (pass nil to reduce over all dims)", level + 1)
  end
  return #dims
end

-- The methods below call this in tail position, so level 2 is the user's line.
local function reduce(op, t, dims, keepdim, correction, level)
  level = level or 2
  if correction ~= nil and (type(correction) ~= "number" or correction ~= floor(correction) or correction < 0
      or correction > 2 ^ 53) then
    error(("%s: correction must be a whole number >= 0, got %s"):format(op, tostring(correction)), level + 1)
  end
  local n = read_dims(op, t, dims, level)
  if C.lt_reduce(REDUCE[op], t, n, dims_b, keepdim and 1 or 0, correction or 0, box) ~= 0 then fail(level) end
  return take()
end

--- t:sum([dims[, keepdim]]): dims nil (all), a dim or a table of dims. Integers sum to i64.
function T.sum(t, dims, keepdim) return reduce("sum", t, dims, keepdim) end
--- t:mean([dims[, keepdim]]) (float tensors).
function T.mean(t, dims, keepdim) return reduce("mean", t, dims, keepdim) end
--- t:max([dims[, keepdim]]): the largest values (NaN wins, as torch). Over one
-- dim it also returns their 0-based i64 positions, as torch.max(x, dim):
-- `local values, indices = x:max(2)`.
function T.max(t, dims, keepdim)
  local v = reduce("max", t, dims, keepdim, nil, 3)
  if type(dims) ~= "number" then return v end
  return v, reduce("argmax", t, dims, keepdim, nil, 3)
end
--- t:min([dims[, keepdim]]): as max, for the smallest values.
function T.min(t, dims, keepdim)
  local v = reduce("min", t, dims, keepdim, nil, 3)
  if type(dims) ~= "number" then return v end
  return v, reduce("argmin", t, dims, keepdim, nil, 3)
end
--- t:argmax([dim[, keepdim]]): 0-based i64 positions of the first largest value
-- along dim (or in the flattened tensor).
function T.argmax(t, dim, keepdim) return reduce("argmax", t, dim, keepdim) end
function T.argmin(t, dim, keepdim) return reduce("argmin", t, dim, keepdim) end
--- t:var([dims[, keepdim[, correction]]]): sum of squared deviations over
-- (count - correction); correction defaults to 1 (unbiased), as torch.var.
function T.var(t, dims, keepdim, correction)
  return reduce("var", t, dims, keepdim, correction == nil and 1 or correction)
end
function T.std(t, dims, keepdim, correction)
  return reduce("std", t, dims, keepdim, correction == nil and 1 or correction)
end

-- ---- matrix products and indexing -----------------------------------------------

--- lt.matmul(a, b): torch.matmul semantics (see host/lutra.h).
function M.matmul(a, b)
  check_tensor("matmul", a, 1, 2)
  check_tensor("matmul", b, 2, 2)
  if C.lt_matmul(a, b, box) ~= 0 then fail(2) end
  return take()
end
T.matmul = M.matmul

--- t:index_select(dim, index): rows of dim picked by a 1-D i32/i64 tensor of 0-based positions.
function T.index_select(t, dim, index)
  check_tensor("index_select", index, 2, 2)
  if C.lt_index_select(t, cdim("index_select", t, dim, 2), index, box) ~= 0 then fail(2) end
  return take()
end

--- t:gather(dim, index): out[i][j] = t[i][index[i][j]] along dim (0-based positions).
function T.gather(t, dim, index)
  check_tensor("gather", index, 2, 2)
  if C.lt_gather(t, cdim("gather", t, dim, 2), index, box) ~= 0 then fail(2) end
  return take()
end

--- t:scatter_add_(dim, index, src): t[i][index[i][j]] += src[i][j]; returns t.
function T.scatter_add_(t, dim, index, src)
  check_tensor("scatter_add_", index, 2, 2)
  check_tensor("scatter_add_", src, 3, 2)
  if C.lt_scatter_add_(t, cdim("scatter_add_", t, dim, 2), index, src) ~= 0 then fail(2) end
  return t
end

--- t:index_add_(dim, index, src): t.select(dim, index[i]) += src.select(dim, i); returns t.
function T.index_add_(t, dim, index, src)
  check_tensor("index_add_", index, 2, 2)
  check_tensor("index_add_", src, 3, 2)
  if C.lt_index_add_(t, cdim("index_add_", t, dim, 2), index, src) ~= 0 then fail(2) end
  return t
end

return M
