--- lutra.tensor: the tensor type seen from Lua.
-- Tensors are ffi.metatype objects over the C core's lt_tensor (host/lutra.h):
-- methods, operators (+ - * / ^, unary minus, tostring), 1-based dims with
-- negative dims counting from the end, and errors raised at the caller's
-- line that name the op, shapes and dtypes. Every function here converts its
-- arguments and forwards to one C call; the work is in C.
local capi = require "lutra.capi"
local ffi, C, fail = capi.ffi, capi.C, capi.fail
local box, dims_a, dims_b = capi.tensor_box, capi.dims_a, capi.dims_b

local M = {}
-- tensor methods: one table for the life of the state (the metatype below is
-- set once and keeps pointing at it if this module is loaded again)
local first_load = capi.state.tensor_methods == nil
capi.state.tensor_methods = capi.state.tensor_methods or {}
local T = capi.state.tensor_methods
M.methods = T
capi.state.checked_methods = capi.state.checked_methods or setmetatable({}, { __mode = "k" })

local gc, release = ffi.gc, C.lt_tensor_release
local type, select, floor = type, select, math.floor

-- LuaJIT's collector sees 8 bytes per tensor, not the C memory behind it.
-- Every 32 new tensors, the bytes C allocated meanwhile are reported as a GC
-- step, so garbage tensors are finalized at the pace they are made (else
-- millions of dead ones pile up between collections).
local taken = 0
local take_pressure, collect = C.lt_take_alloc_pressure, collectgarbage

--- Takes the tensor C wrote into the box (owning its reference).
local function take()
  taken = taken + 1
  if taken >= 32 then
    taken = 0
    local bytes = take_pressure()
    if bytes > 0 then collect("step", tonumber(bytes) / 1024) end
  end
  return gc(box[0], release)
end
M.take = take

--- Raises the last C error with its leading op name replaced by op (creation
-- functions share lt_tensor_empty, whose messages say "empty").
local function fail_as(op, level)
  local msg = ffi.string(C.lt_last_error()):gsub("^[%w_]+: ", op .. ": ", 1)
  error(msg, level + 1)
end
M.fail_as = fail_as


-- ---- dtypes and devices -------------------------------------------------

local dtype_cache, dtype_codes = {}, {}
local dtype_out = ffi.new("lt_dtype[1]")
local device_out = ffi.new("lt_device[1]")

--- dtype code of a name ("f32", "bf16", "float32", ...); raises on unknown names.
local function dtype_code(name, level)
  local code = dtype_codes[name]
  if code then return code end
  if type(name) ~= "string" then
    error(("dtype must be a string such as 'f32', got %s"):format(type(name)), (level or 1) + 1)
  end
  if C.lt_dtype_parse(name, dtype_out) ~= 0 then fail((level or 1) + 1) end
  dtype_codes[name] = tonumber(dtype_out[0])
  return dtype_codes[name]
end
M.dtype_code = dtype_code

local function dtype_name(code)
  code = tonumber(code) -- enums come back from C as boxed cdata: never use those as keys
  local n = dtype_cache[code]
  if not n then
    n = ffi.string(C.lt_dtype_name(code))
    dtype_cache[code] = n
  end
  return n
end
M.dtype_name = dtype_name

local device_codes, device_names = {}, {}
local name_buf = ffi.new("char[16]")
local function device_code(name, level)
  local code = device_codes[name]
  if code then return code end
  if type(name) ~= "string" then
    error(("device must be a string such as 'cpu' or 'cuda:0', got %s"):format(type(name)), (level or 1) + 1)
  end
  if C.lt_device_parse(name, device_out) ~= 0 then fail((level or 1) + 1) end
  device_codes[name] = tonumber(device_out[0])
  return device_codes[name]
end
M.device_code = device_code

local function device_name(code)
  local n = device_names[code]
  if not n then
    n = ffi.string(C.lt_device_name(code, name_buf))
    device_names[code] = n
  end
  return n
end

local function is_tensor(x)
  return type(x) == "cdata" and ffi.istype("lt_tensor*", x)
end
M.is_tensor = is_tensor

--- Options {dtype=, device=}, or one dtype or device name -> dtype code, device code.
local F32 = 0
local function options(opts, level)
  if opts == nil then return F32, 0 end
  if type(opts) == "string" then
    if C.lt_dtype_parse(opts, dtype_out) == 0 then return tonumber(dtype_out[0]), 0 end
    if C.lt_device_parse(opts, device_out) == 0 then return F32, tonumber(device_out[0]) end
    error(("options: '%s' is neither a dtype (f32, bf16, i64, ...) nor a device (cpu, cuda:N)"):format(opts), level + 1)
  end
  if type(opts) ~= "table" then
    error("options must be a table such as {dtype='f32', device='cpu'} or a dtype name, got " .. type(opts), level + 1)
  end
  local dt = opts.dtype and dtype_code(opts.dtype, level + 1) or F32
  local dev = opts.device and device_code(opts.device, level + 1) or 0
  return dt, dev
end
M.options = options

-- ---- shapes and dims ----------------------------------------------------

local shape_buf = ffi.new("char[200]")
local function shape_str(t)
  return ffi.string(C.lt_tensor_shape_str(t, shape_buf))
end
M.shape_str = shape_str

--- Reads a shape given as numbers (2, 3) or a table {2, 3} into buf; returns n
-- and the arguments after the shape (options). Sizes are whole numbers >= -1
-- (-1 asks view/reshape to infer one size); nils inside a shape are errors.
local function check_size(op, i, s, level)
  if type(s) ~= "number" or s ~= floor(s) or s < -1 or s > 2 ^ 62 then
    error(("%s: size %d of the shape is %s, expected a whole number >= 0 (or -1 to infer it)")
      :format(op, i, tostring(s)), level + 1)
  end
end

local function read_shape(op, buf, level, ...)
  local first = ...
  local n = 0
  if type(first) == "table" and not is_tensor(first) then
    n = #first
    if n > 8 then error(op .. ": at most 8 dims, got " .. n, level + 1) end
    local keys = 0
    for _ in pairs(first) do keys = keys + 1 end
    if keys ~= n then error(op .. ": the shape table has holes or non-numeric keys", level + 1) end
    for i = 1, n do
      check_size(op, i, first[i], level + 1)
      buf[i - 1] = first[i]
    end
    return n, select(2, ...)
  end
  local args = select("#", ...)
  for i = 1, args do
    local s = select(i, ...)
    if type(s) ~= "number" then
      if s == nil and i < args then
        error(("%s: size %d of the shape is nil"):format(op, i), level + 1)
      end
      return n, select(i, ...)
    end
    check_size(op, i, s, level + 1)
    n = n + 1
    if n > 8 then error(op .. ": at most 8 dims", level + 1) end
    buf[n - 1] = s
  end
  return n
end
M.read_shape = read_shape

--- For creation: the n sizes in buf must be >= 0 (no -1 to infer).
local function check_sizes(op, buf, n, level)
  for i = 0, n - 1 do
    if buf[i] < 0 then
      error(("%s: negative size %d (dim %d) in a shape to create"):format(op, tonumber(buf[i]), i + 1), level + 1)
    end
  end
end
M.check_sizes = check_sizes

--- Lua dim (1-based, negative from the end) -> C dim for a tensor with n dims.
local function cdim(op, t, d, level, extra)
  local n = C.lt_tensor_ndim(t) + (extra or 0)
  if type(d) ~= "number" or d ~= floor(d) then
    error(("%s: dim must be a whole number, got %s"):format(op, tostring(d)), level + 1)
  end
  local c = d < 0 and n + d or d - 1
  if c < 0 or c >= n then
    if n == 0 then
      error(("%s: dim %d is out of range: the tensor has no dims (shape %s)"):format(op, d, shape_str(t)), level + 1)
    end
    error(("%s: dim %d is out of range for a %d-dim tensor of shape %s (valid: 1..%d or -%d..-1)")
      :format(op, d, C.lt_tensor_ndim(t), shape_str(t), n, n), level + 1)
  end
  return c
end
M.cdim = cdim

--- A 1-based position argument: a whole number (negative ones count from the end where allowed).
local function check_position(op, what, v, level)
  if type(v) ~= "number" or v ~= floor(v) or v ~= v or math.abs(v) > 2 ^ 62 then
    error(("%s: %s must be a whole number, got %s"):format(op, what, tostring(v)), level + 1)
  end
end

local function check_tensor(op, x, pos, level)
  if not is_tensor(x) then
    error(("bad argument #%d to '%s' (tensor expected, got %s)"):format(pos, op, type(x)), level + 1)
  end
end

-- ---- properties ----------------------------------------------------------

-- shape and stride tables print as [2, 3] (they stay plain sequences)
local shape_mt = { __tostring = function(s) return "[" .. table.concat(s, ", ") .. "]" end }

--- t:shape() -> {size1, size2, ...} (prints as [size1, size2, ...])
function T.shape(t)
  local n = C.lt_tensor_ndim(t)
  local s = {}
  for i = 0, n - 1 do s[i + 1] = tonumber(C.lt_tensor_size(t, i)) end
  return setmetatable(s, shape_mt)
end

--- t:size() -> shape table; t:size(d) -> size of dim d (1-based, negative from the end).
function T.size(t, d)
  if d == nil then return T.shape(t) end
  return tonumber(C.lt_tensor_size(t, cdim("size", t, d, 2)))
end

--- t:stride(d) -> stride of dim d in elements; t:stride() -> table of strides.
function T.stride(t, d)
  if d == nil then
    local s = {}
    for i = 0, C.lt_tensor_ndim(t) - 1 do s[i + 1] = tonumber(C.lt_tensor_stride(t, i)) end
    return setmetatable(s, shape_mt)
  end
  return tonumber(C.lt_tensor_stride(t, cdim("stride", t, d, 2)))
end

function T.dim(t) return C.lt_tensor_ndim(t) end
function T.numel(t) return tonumber(C.lt_tensor_numel(t)) end
--- t:element_size() -> bytes per element of t's dtype (as torch's).
function T.element_size(t) return tonumber(C.lt_dtype_size(C.lt_tensor_dtype(t))) end
--- t:nbytes() -> t:numel() * t:element_size().
function T.nbytes(t) return tonumber(C.lt_tensor_numel(t)) * tonumber(C.lt_dtype_size(C.lt_tensor_dtype(t))) end
function T.is_contiguous(t) return C.lt_tensor_is_contiguous(t) ~= 0 end
function T.storage_offset(t) return tonumber(C.lt_tensor_offset(t)) end
--- Whether two tensors view the same storage.
function T.shares_storage(t, other) return C.lt_tensor_same_storage(t, other) ~= 0 end
function T.is_floating_point(t) return C.lt_dtype_is_float(C.lt_tensor_dtype(t)) ~= 0 end
--- Address of element 1 of a CPU tensor, as a typed pointer for FFI code.
-- Reading a float NaN through it hands LuaJIT the NaN's bits unchanged, and
-- LuaJIT keeps its other values inside NaN bit patterns: a NaN with the sign
-- and high payload bits set reads as nil or a bogus object. Read values
-- with t:item() or t:totable() (which return every NaN as a plain NaN), or
-- test the bits as integers.
local ptr_types = { f32 = "float*", f64 = "double*", bf16 = "uint16_t*", f16 = "uint16_t*",
  i8 = "int8_t*", u8 = "uint8_t*", u16 = "uint16_t*", i32 = "int32_t*", i64 = "int64_t*", bool = "uint8_t*" }
function T.data_ptr(t)
  local p = C.lt_tensor_data(t)
  if p == nil then
    error(C.lt_tensor_has_data(t) == 0 and "data_ptr: the tensor has no data: it was dropped (a sharded parameter)"
      or "data_ptr: the tensor is not on the CPU", 2)
  end
  return ffi.cast(ptr_types[dtype_name(C.lt_tensor_dtype(t))], p)
end

--- Releases the tensor's memory now instead of at garbage collection (when
-- nothing else holds it). Using t afterwards is an error that says so.
function T.free(t)
  C.lt_tensor_free_data(t)
end

--- t:drop_data_(): frees the memory of t's storage while t and every view
-- of it (those autograd saved included) stay alive; using one of them is
-- then an error that says so. t must span its whole storage (a parameter).
-- For sharded parameters (lt.dist.Zero stage 3); returns t.
function T.drop_data_(t)
  if C.lt_tensor_drop_data(t) ~= 0 then fail(2) end
  return t
end

--- t:restore_data_(src): t's storage allocated again (after drop_data_) and
-- src's values (same number of elements, converted to t's dtype) copied
-- in without counting as an in-place write, so a graph that saved t reads
-- them in backward: src must hold the values t had. Returns t.
function T.restore_data_(t, src)
  if not is_tensor(src) then error("restore_data_: expected a source tensor", 2) end
  if C.lt_tensor_restore_data(t, src) ~= 0 then fail(2) end
  return t
end

-- properties read as t.name and written as t.name = v; other modules (autograd)
-- add theirs. Kept in the registry state so a reloaded module extends the
-- same tables the metatype uses.
capi.state.tensor_props = capi.state.tensor_props or {}
capi.state.tensor_setters = capi.state.tensor_setters or {}
local props, setters = capi.state.tensor_props, capi.state.tensor_setters
M.props, M.setters = props, setters
props.dtype = function(t) return dtype_name(C.lt_tensor_dtype(t)) end
props.device = function(t) return device_name(C.lt_tensor_device(t)) end
--- t.has_data: false after t:drop_data_() (until restore_data_), else true.
props.has_data = function(t) return C.lt_tensor_has_data(t) ~= 0 end

-- ---- values ----------------------------------------------------------------

--- t:item() -> the value of a one-element tensor as a Lua number (bool: true/false).
local item_out = ffi.new("double[1]")
function T.item(t)
  if C.lt_tensor_item(t, item_out) ~= 0 then fail(2) end
  if C.lt_tensor_dtype(t) == 9 then return item_out[0] ~= 0 end
  return item_out[0]
end

--- t:totable() -> nested Lua tables of numbers (booleans for bool); a number for 0-dim.
-- i64 values beyond 2^53 lose precision (Lua numbers are doubles).
function T.totable(t)
  local n = tonumber(C.lt_tensor_numel(t))
  local buf = ffi.new("double[?]", math.max(n, 1))
  if C.lt_tensor_to_f64(t, buf, n) ~= 0 then fail(2) end
  local is_bool = C.lt_tensor_dtype(t) == 9
  local shape = T.shape(t)
  local pos = 0
  local function build(d)
    local out = {}
    if d > #shape then return end
    for i = 1, shape[d] do
      if d == #shape then
        local v = buf[pos]
        pos = pos + 1
        if is_bool then v = v ~= 0 end
        out[i] = v
      else
        out[i] = build(d + 1)
      end
    end
    return out
  end
  if #shape == 0 then
    local v = buf[0]
    if is_bool then v = v ~= 0 end
    return v
  end
  return build(1)
end

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

--- a op b for tensors or numbers on either side; out (a tensor) receives the
-- result when given. Errors blame `level` frames up.
local function binary(code, a, b, out, level)
  local st
  if type(b) == "number" then
    if not is_tensor(a) then
      error(("bad operands: %s and number (expected a tensor)"):format(type(a)), level + 1)
    end
    st = C.lt_binary_scalar(code, a, b, 0, out, box)
  elseif type(a) == "number" then
    if not is_tensor(b) then error(("bad operands: number and %s"):format(type(b)), level + 1) end
    st = C.lt_binary_scalar(code, b, a, 1, out, box)
  else
    if not is_tensor(a) or not is_tensor(b) then
      error(("bad operands: %s and %s (expected tensors or numbers)"):format(type(a), type(b)), level + 1)
    end
    st = C.lt_binary(code, a, b, out, box)
  end
  if st ~= 0 then fail(level) end
  if out ~= nil then
    release(box[0])
    return out
  end
  return take()
end
M.binary = binary

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
    return M.tensor(v, { dtype = dt, device = ref and ref.device or cond.device })
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
  local v = M.tensor(value, { dtype = t.dtype, device = t.device })
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
  local Cat = require("lutra.autograd").Function {
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
  local out = M.empty(shape, { dtype = dtype_name(dt), device = first.device })
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

-- ---- argument checks ------------------------------------------------------------------

-- Every method checks its tensor first, so `x.sum()` (a dot for a colon) or
-- a nil reports "bad argument" instead of reaching C with NULL. The wrapper
-- tail-calls the method, so error levels inside it still name the caller.
-- lutra's init calls this once every module has added its methods.
function M.check_methods()
 for name, f in pairs(T) do
  if type(f) == "function" and not capi.state.checked_methods[f] then
    local checked = function(t, ...)
      if not is_tensor(t) then
        error(("bad argument #1 to '%s' (tensor expected, got %s)%s"):format(name, type(t),
          t == nil and "; call methods with a colon: x:" .. name .. "(...)" or ""), 2)
      end
      return f(t, ...)
    end
    capi.state.checked_methods[checked] = true
    T[name] = checked
  end
 end
end

-- ---- metatable ----------------------------------------------------------------------

local mt = {
  __index = function(t, k)
    local m = T[k]
    if m ~= nil then return m end
    local p = props[k]
    if p then return p(t) end
    return nil
  end,
  __newindex = function(t, k, v)
    local set = setters[k]
    if not set then error(("cannot set field '%s' of a tensor"):format(tostring(k)), 2) end
    set(t, v)
  end,
  __add = function(a, b) return binary(0, a, b, nil, 2) end,
  __sub = function(a, b) return binary(1, a, b, nil, 2) end,
  __mul = function(a, b) return binary(2, a, b, nil, 2) end,
  __div = function(a, b) return binary(3, a, b, nil, 2) end,
  __pow = function(a, b) return binary(4, a, b, nil, 2) end,
  __unm = function(a)
    if C.lt_unary(0, a, nil, box) ~= 0 then fail(2) end
    return take()
  end,
  __lt = function() error("use a:lt(b) or a:gt(b): Lua's < must give a boolean, not a tensor", 2) end,
  __le = function() error("use a:le(b) or a:ge(b): Lua's <= must give a boolean, not a tensor", 2) end,
  __len = function(t)
    if C.lt_tensor_ndim(t) == 0 then error("len: a 0-dim tensor has no length", 2) end
    return tonumber(C.lt_tensor_size(t, 0))
  end,
  __tostring = function(t) return require("lutra.format").tensor(t) end,
}
-- LuaJIT 2.1.0-beta3 (Debian 12's) can corrupt its stack when a trace
-- records a cdata arithmetic metamethod called under pcall (lt.no_grad's,
-- gradcheck's objective): `x + 2` in such a hot loop segfaulted in about one
-- run in three. Kept out of traces, these run interpreted (each is a C call
-- anyway); tests/lua/tensor_spec.lua has the loop that crashed.
for _, k in ipairs { "__add", "__sub", "__mul", "__div", "__pow", "__unm" } do jit.off(mt[k]) end
if first_load then ffi.metatype("lt_tensor", mt) end

return M
