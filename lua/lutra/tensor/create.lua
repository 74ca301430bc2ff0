--- lutra.tensor.create: making tensors: lt.tensor (from numbers and nested
-- tables), zeros, ones, full, empty, the *_like forms and arange.
local capi = require "lutra.capi"
local core = require "lutra.tensor.core"
local ffi, C = capi.ffi, capi.C
local box = capi.tensor_box
local T = core.methods
local floor = math.floor
local dims_a = capi.dims_a
local take, fail_as, check_tensor = core.take, core.fail_as, core.check_tensor
local options, read_shape, check_sizes, dtype_codes = core.options, core.read_shape, core.check_sizes,
  core.dtype_codes

local M = {}

-- ---- creation ----------------------------------------------------------------

--- Walks nested tables: returns the shape and the flat values; raises on ragged
-- tables and non-numbers, naming the element.
local function flatten(data, level)
  local shape = {}
  local probe = data
  while type(probe) == "table" do
    shape[#shape + 1] = #probe
    if #shape > 8 then error("tensor: nested more than 8 deep", level + 1) end
    probe = probe[1]
  end
  local n = 1
  for i = 1, #shape do n = n * shape[i] end
  local vals = ffi.new("double[?]", math.max(n, 1))
  local pos = 0
  local path = {}
  local err
  local function walk(x, d)
    if d > #shape then
      local tx = type(x)
      if tx == "number" then
        vals[pos] = x
      elseif tx == "boolean" then
        vals[pos] = x and 1 or 0
      else
        err = ("tensor: element [%s] is a %s, expected a number"):format(table.concat(path, "]["), tx)
      end
      pos = pos + 1
      return
    end
    if type(x) ~= "table" then
      err = ("tensor: element [%s] is a %s where a table of %d elements was expected (ragged nesting)")
        :format(table.concat(path, "]["), type(x), shape[d])
      return
    end
    if #x ~= shape[d] then
      err = ("tensor: ragged nested table: [%s] has %d elements, expected %d like the first at depth %d")
        :format(table.concat(path, "]["), #x, shape[d], d)
      return
    end
    if next(x, #x > 0 and #x or nil) ~= nil then
      err = ("tensor: the table at [%s] has holes or non-numeric keys"):format(table.concat(path, "]["))
      return
    end
    for i = 1, shape[d] do
      path[d] = i
      walk(x[i], d + 1)
      path[d] = nil
      if err then return end
    end
  end
  walk(data, 1)
  if err then error(err, level + 1) end
  return shape, vals
end

--- lt.tensor(data, {dtype=, device=}): a tensor from a number or nested tables.
-- dtype defaults to f32. Raises on ragged tables and non-numbers.
function M.tensor(data, opts)
  local dt, dev = options(opts, 2)
  if type(data) == "number" or type(data) == "boolean" then
    local v = ffi.new("double[1]", type(data) == "boolean" and (data and 1 or 0) or data)
    if C.lt_tensor_from_f64(v, 0, dims_a, dt, dev, box) ~= 0 then fail_as("tensor", 2) end
    return take()
  end
  if type(data) ~= "table" then
    error(("tensor: expected a number or a nested table, got %s"):format(type(data)), 2)
  end
  local shape, vals = flatten(data, 2)
  for i = 1, #shape do dims_a[i - 1] = shape[i] end
  if C.lt_tensor_from_f64(vals, #shape, dims_a, dt, dev, box) ~= 0 then fail_as("tensor", 2) end
  return take()
end

local function make_full(op, value, level, ...)
  local n, opts = read_shape(op, dims_a, level + 1, ...)
  check_sizes(op, dims_a, n, level + 1)
  local dt, dev = options(opts, level + 1)
  if C.lt_tensor_full(n, dims_a, value, dt, dev, box) ~= 0 then fail_as(op, level + 1) end
  return take()
end

--- lt.zeros(2, 3) or lt.zeros({2, 3}, {dtype=, device=}).
function M.zeros(...) return make_full("zeros", 0, 2, ...) end
--- lt.ones(shape, opts): like zeros, filled with 1.
function M.ones(...) return make_full("ones", 1, 2, ...) end

--- lt.full(shape, value, opts): every element value (rounded to the dtype).
function M.full(shape, value, opts)
  if type(value) ~= "number" and type(value) ~= "boolean" then
    error("full: value must be a number, got " .. type(value), 2)
  end
  if type(value) == "boolean" then value = value and 1 or 0 end
  return make_full("full", value, 2, shape, opts)
end

--- lt.empty(shape, opts): uninitialised memory (fill it before reading).
function M.empty(...)
  local n, opts = read_shape("empty", dims_a, 2, ...)
  check_sizes("empty", dims_a, n, 2)
  local dt, dev = options(opts, 2)
  if C.lt_tensor_empty(n, dims_a, dt, dev, box) ~= 0 then fail_as("empty", 2) end
  return take()
end

local function like_opts(op, t, opts)
  check_tensor(op, t, 1, 3)
  opts = opts or {}
  return { dtype = opts.dtype or t.dtype, device = opts.device or t.device }
end
--- lt.zeros_like(t[, opts]) and friends: t's shape, dtype and device unless opts say otherwise.
function M.zeros_like(t, opts)
  local o = like_opts("zeros_like", t, opts)
  return M.zeros(T.shape(t), o)
end
function M.ones_like(t, opts)
  local o = like_opts("ones_like", t, opts)
  return M.ones(T.shape(t), o)
end
function M.empty_like(t, opts)
  local o = like_opts("empty_like", t, opts)
  return M.empty(T.shape(t), o)
end
function M.full_like(t, value, opts)
  local o = like_opts("full_like", t, opts)
  return M.full(T.shape(t), value, o)
end

--- lt.arange(n) = 0..n-1; lt.arange(start, stop[, step]) = [start, stop) by step
-- (torch.arange); a trailing options table sets dtype/device. As in torch the
-- dtype defaults to i64 when start, stop and step are whole numbers, else f32.
function M.arange(a, b, c, d)
  local opts
  local function is_opts(x) return type(x) == "table" or type(x) == "string" end
  if is_opts(b) then opts, b = b, nil
  elseif is_opts(c) then opts, c = c, nil
  elseif is_opts(d) then opts = d end
  local start, stop, step = 0, a, 1
  if b == nil and c ~= nil then error("arange: stop is nil but a step was given", 2) end
  if b ~= nil then start, stop, step = a, b, c or 1 end
  if type(start) ~= "number" or type(stop) ~= "number" or type(step) ~= "number" then
    error("arange: start, stop and step must be numbers", 2)
  end
  local dt, dev = options(opts, 2)
  if not (type(opts) == "table" and opts.dtype or type(opts) == "string" and dtype_codes[opts])
    and start == floor(start) and stop == floor(stop) and step == floor(step) then
    dt = 8 -- i64
  end
  if C.lt_tensor_arange(start, stop, step, dt, dev, box) ~= 0 then fail_as("arange", 2) end
  return take()
end

return M
