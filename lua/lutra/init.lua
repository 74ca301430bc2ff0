--- lutra: the library a recipe gets from `local lt = require "lutra"`.
-- This module only assembles the public lt table from the library's
-- modules, each of which requires what it uses and never this one
-- (tests/lua/modules_spec.lua keeps that true): tensor creation and math
-- (lt.tensor, lt.zeros, lt.matmul, ...: lutra.tensor), random numbers
-- (lt.manual_seed, lt.rand: lutra.random), autograd (lt.no_grad,
-- lt.autograd, lt.checkpoint: lutra.recompute), process controls (lt.clock, lt.num_threads,
-- lt.memory_stats: lutra.runtime), lt.cuda, lt.json, lt.F, lt.nn,
-- lt.models, lt.optim, lt.data, lt.train, lt.ckpt, lt.hf, lt.generate,
-- lt.dist, and the dtype names as constants.
local capi = require "lutra.capi"
local tensor = require "lutra.tensor"
local random = require "lutra.random"
local autograd = require "lutra.autograd"
local ffi, C = capi.ffi, capi.C

tensor.check_methods() -- after every module has added its tensor methods

local lt = {}

lt.version = ffi.string(C.lt_version())

for _, name in ipairs { "tensor", "zeros", "ones", "full", "empty", "arange", "zeros_like",
  "ones_like", "empty_like", "full_like", "where", "matmul", "is_tensor", "cat", "stack" } do
  lt[name] = tensor[name]
end
for _, name in ipairs { "rand", "randn", "randint", "manual_seed", "Generator", "default_generator" } do
  lt[name] = random[name]
end

-- tensor math as functions too: lt.add(a, b), lt.exp(x), lt.sum(x, 2), ...
for _, name in ipairs { "add", "sub", "mul", "div", "pow", "maximum", "minimum", "eq", "ne", "lt",
  "le", "gt", "ge", "neg", "abs", "exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "clamp",
  "sum", "mean", "max", "min", "argmax", "argmin", "var", "std", "index_select", "gather",
  "transpose", "permute", "reshape", "view", "narrow", "select", "expand", "squeeze",
  "unsqueeze", "contiguous", "clone", "flatten", "masked_fill", "sign", "detach" } do
  lt[name] = tensor.methods[name]
end

lt.json = require "lutra.json"

lt.autograd = autograd
lt.no_grad = autograd.no_grad
lt.recompute = require "lutra.recompute"
lt.checkpoint = lt.recompute.checkpoint
lt.F = require "lutra.nn.functional"
lt.safetensors = require "lutra.safetensors"
lt.save, lt.load = lt.safetensors.save, lt.safetensors.load
lt.tokenizer = require "lutra.tokenizer"
lt.data = require "lutra.data"
lt.config = require "lutra.config"

-- process controls (lt.clock, lt.num_threads, lt.memory_stats, ...) and lt.cuda
for k, v in pairs(require "lutra.runtime") do lt[k] = v end
lt.cuda = require "lutra.cuda"
lt.nn = require "lutra.nn"
lt.models = require "lutra.models"
lt.optim = require "lutra.optim"
lt.train = require "lutra.train"
lt.ckpt = require "lutra.ckpt"
lt.hf = require "lutra.hf"
lt.generate = require "lutra.generate"
lt.dist = require "lutra.dist"
lt.plan = require "lutra.plan"

--- dtype names as constants: lt.zeros(3, lt.i64) or {dtype = lt.bf16}.
for _, dt in ipairs { "f32", "f64", "bf16", "f16", "i8", "u8", "u16", "i32", "i64", "bool" } do
  lt[dt] = dt
end

-- Reading a field lt does not have is an error naming it (a typo such as
-- lt.int64 would otherwise pass nil along silently).
setmetatable(lt, {
  __index = function(_, k)
    error(("lt.%s does not exist"):format(tostring(k)), 2)
  end,
})

return lt
