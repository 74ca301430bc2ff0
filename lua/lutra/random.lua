--- lutra.random: Philox generators and random tensors.
-- A generator is (seed, offset); draws consume counters so that CPU and CUDA
-- give the same numbers for the same seed (host/lutra.h). lt.manual_seed(s)
-- resets the default generator; functions take {generator=g} to use another.
local capi = require "lutra.capi"
local tensor = require "lutra.tensor.core"
local ffi, C, fail = capi.ffi, capi.C, capi.fail

local M = {}
capi.state.Generator = capi.state.Generator or {}
local Generator = capi.state.Generator -- one metatable for the life of the state
Generator.__index = Generator

local gen_box = ffi.new("lt_generator*[1]")
local u64a, u64b = ffi.new("uint64_t[1]"), ffi.new("uint64_t[1]")

--- A seed or offset: a whole number in [0, 2^64).
local function check_u64(op, what, v, level)
  if type(v) ~= "number" or v < 0 or v ~= math.floor(v) or v >= 2 ^ 64 then
    error(("%s: %s must be a whole number in [0, 2^64), got %s"):format(op, what, tostring(v)), level + 1)
  end
end

--- lt.Generator(seed): a new generator at offset 0. seed is a whole number in [0, 2^64).
function M.Generator(seed)
  seed = seed or 0
  check_u64("Generator", "seed", seed, 2)
  if C.lt_generator_new(seed, gen_box) ~= 0 then fail(2) end
  return setmetatable({ ptr = ffi.gc(gen_box[0], C.lt_generator_release) }, Generator)
end

--- g:state() -> {seed=, offset=}: everything needed to continue the stream.
function Generator:state()
  C.lt_generator_get_state(self.ptr, u64a, u64b)
  return { seed = tonumber(u64a[0]), offset = tonumber(u64b[0]) }
end

--- g:set_state{seed=, offset=}
function Generator:set_state(s)
  if type(s) ~= "table" then error("set_state: expected a table {seed=, offset=}", 2) end
  check_u64("set_state", "seed", s.seed, 2)
  check_u64("set_state", "offset", s.offset, 2)
  C.lt_generator_set_state(self.ptr, s.seed, s.offset)
  return self
end

function Generator:__tostring()
  local s = self:state()
  return ("Generator(seed=%d, offset=%d)"):format(s.seed, s.offset)
end

capi.state.default_generator = capi.state.default_generator or M.Generator(0)
local default = capi.state.default_generator

--- lt.manual_seed(seed): restarts the default generator at (seed, 0).
function M.manual_seed(seed)
  check_u64("manual_seed", "seed", seed, 2)
  default:set_state { seed = seed, offset = 0 }
end

--- The default generator.
function M.default_generator() return default end

local function gen_of(opts)
  local g = opts and opts.generator or default
  if getmetatable(g) ~= Generator then error("generator must come from lt.Generator", 3) end
  return g.ptr
end

--- lt.rand(shape, {dtype=, device=, generator=}): uniform in [0, 1).
function M.rand(...)
  local n, opts = tensor.read_shape("rand", capi.dims_a, 2, ...)
  tensor.check_sizes("rand", capi.dims_a, n, 2)
  local dt, dev = tensor.options(opts, 2)
  if C.lt_tensor_empty(n, capi.dims_a, dt, dev, capi.tensor_box) ~= 0 then tensor.fail_as("rand", 2) end
  local r = tensor.take()
  if C.lt_tensor_uniform_(r, gen_of(opts), 0, 1) ~= 0 then tensor.fail_as("rand", 2) end
  return r
end

--- lt.randn(shape, {dtype=, device=, generator=}): standard normal.
function M.randn(...)
  local n, opts = tensor.read_shape("randn", capi.dims_a, 2, ...)
  tensor.check_sizes("randn", capi.dims_a, n, 2)
  local dt, dev = tensor.options(opts, 2)
  if C.lt_tensor_empty(n, capi.dims_a, dt, dev, capi.tensor_box) ~= 0 then tensor.fail_as("randn", 2) end
  local r = tensor.take()
  if C.lt_tensor_normal_(r, gen_of(opts), 0, 1) ~= 0 then tensor.fail_as("randn", 2) end
  return r
end

--- lt.randint(low, high, shape, {dtype=, device=, generator=}): whole numbers
-- uniform in [low, high) (default dtype i64), as torch.randint.
function M.randint(low, high, shape, opts)
  if type(low) ~= "number" or type(high) ~= "number" or high <= low then
    error("randint: needs numbers low < high, got " .. tostring(low) .. " and " .. tostring(high), 2)
  end
  local n = tensor.read_shape("randint", capi.dims_a, 2, shape)
  tensor.check_sizes("randint", capi.dims_a, n, 2)
  local dt, dev = tensor.options(opts, 2)
  if not (type(opts) == "table" and opts.dtype or type(opts) == "string") then dt = 8 end -- i64
  if C.lt_tensor_empty(n, capi.dims_a, 1, dev, capi.tensor_box) ~= 0 then tensor.fail_as("randint", 2) end
  local u = tensor.take() -- f64 in [0, 1)
  if C.lt_tensor_uniform_(u, gen_of(opts), 0, 1) ~= 0 then fail(2) end
  -- u * range >= 0, so the truncation of the f64 -> i64 conversion is a floor
  local r = u:mul_(math.ceil(high) - math.ceil(low)):to("i64"):add_(math.ceil(low))
  return r:to(tensor.dtype_name(dt))
end

--- t:uniform_(lo, hi[, generator]) fills t in place; returns t.
function tensor.methods.uniform_(t, lo, hi, g)
  if (lo ~= nil and type(lo) ~= "number") or (hi ~= nil and type(hi) ~= "number") then
    error("uniform_: lo and hi must be numbers", 2)
  end
  if C.lt_tensor_uniform_(t, gen_of(g and { generator = g }), lo or 0, hi or 1) ~= 0 then fail(2) end
  return t
end

--- t:normal_(mean, std[, generator]) fills t in place; returns t.
function tensor.methods.normal_(t, mean, std, g)
  if (mean ~= nil and type(mean) ~= "number") or (std ~= nil and type(std) ~= "number") then
    error("normal_: mean and std must be numbers", 2)
  end
  if C.lt_tensor_normal_(t, gen_of(g and { generator = g }), mean or 0, std or 1) ~= 0 then fail(2) end
  return t
end

return M
