--- lutra.tensor.core: the tensor type's foundation, below everything else
-- in lutra.tensor: the methods, properties and setters tables the metatype
-- reads (kept in the registry state), dtype and device codes, shape and dim
-- conversion, argument checks, properties (t.dtype, t.device, t:shape(),
-- ...), values (t:item(), t:totable()), the binary-op dispatch the
-- operators use, and the metatype itself (ffi.metatype on lt_tensor).
-- Printing (tostring) is lutra.format's, which lutra.tensor installs as
-- M.format (this module cannot require it: format prints with lt.cat).
-- Other modules add methods (lutra.tensor.ops, .create, lutra.random,
-- lutra.autograd); lutra.tensor assembles the public table.
local capi = require "lutra.capi"
local ffi, C, fail = capi.ffi, capi.C, capi.fail
local box = capi.tensor_box

local M = {}
-- tensor methods: one table for the life of the state (the metatype below is
-- set once and keeps pointing at it if this module is loaded again)
local first_load = capi.state.tensor_methods == nil
capi.state.tensor_methods = capi.state.tensor_methods or {}
local T = capi.state.tensor_methods
M.methods = T
capi.state.checked_methods = capi.state.checked_methods or setmetatable({}, { __mode = "k" })

local gc, release = ffi.gc, C.lt_tensor_release
M.release = release
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
M.dtype_codes, M.dtype_out, M.device_out = dtype_codes, dtype_out, device_out -- (for lutra.tensor.create/.ops)

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
    -- (table.maxn, in C: a pairs loop here was miscompiled by the JIT when the
    -- VM ran inside a backward inside another: lt.checkpoint's recompute)
    if table.maxn(first) ~= n then error(op .. ": the shape table has holes", level + 1) end
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

M.check_position = check_position

--- Raises "bad argument #pos to 'op' (tensor expected, got ...)" unless x is a tensor.
local function check_tensor(op, x, pos, level)
  if not is_tensor(x) then
    error(("bad argument #%d to '%s' (tensor expected, got %s)"):format(pos, op, type(x)), level + 1)
  end
end
M.check_tensor = check_tensor

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

-- ---- binary ops (the operators use them) ---------------------------------------

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

-- ---- printing ------------------------------------------------------------------------

--- M.format(t) -> the text tostring(t) gives. lutra.format's tensor printer
-- lives above this module (it prints with lt.cat, which is above autograd):
-- lutra.tensor installs it here when it loads; until then a tensor prints
-- as its header alone.
function M.format(t)
  return ("tensor(shape=%s, dtype=%s, device=%s)"):format(shape_str(t), t.dtype, t.device)
end

-- ---- argument checks ------------------------------------------------------------------

-- Every method checks its tensor first, so `x.sum()` (a dot for a colon) or
-- a nil reports "bad argument" instead of reaching C with NULL. The wrapper
-- tail-calls the method, so error levels inside it still name the caller.
-- lutra.tensor (and lutra's init) call this once every module has added its methods.
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
  __tostring = function(t) return M.format(t) end,
}
-- LuaJIT 2.1.0-beta3 (Debian 12's) can corrupt its stack when a trace
-- records a cdata arithmetic metamethod called under pcall (lt.no_grad's,
-- gradcheck's objective): `x + 2` in such a hot loop segfaulted in about one
-- run in three. Kept out of traces, these run interpreted (each is a C call
-- anyway); tests/lua/tensor_spec.lua has the loop that crashed.
for _, k in ipairs { "__add", "__sub", "__mul", "__div", "__pow", "__unm" } do jit.off(mt[k]) end
if first_load then ffi.metatype("lt_tensor", mt) end

return M
