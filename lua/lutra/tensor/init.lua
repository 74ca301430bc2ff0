--- lutra.tensor: the tensor type seen from Lua.
-- Tensors are ffi.metatype objects over the C core's lt_tensor (host/lutra.h):
-- methods, operators (+ - * / ^, unary minus, tostring), 1-based dims with
-- negative dims counting from the end, and errors raised at the caller's
-- line that name the op, shapes and dtypes. Every function here converts its
-- arguments and forwards to one C call; the work is in C.
--
-- This module assembles the parts, in their dependency order:
--   lutra.tensor.core    the metatype, methods/props tables, dtypes, shapes, checks, values
--   lutra.tensor.create  lt.tensor, zeros, ones, full, empty, *_like, arange
--   lutra.tensor.ops     views, copies, elementwise, reductions, matmul, indexing
--   lutra.random         t:uniform_, t:normal_ (and lt.rand, ...)
--   lutra.autograd       t.grad, t:backward, ... (and lt.no_grad, ...)
--   lutra.tensor.join    lt.cat, lt.stack (a cat with gradients is an autograd function)
--   lutra.format         tostring(t), installed into the metatype here
-- and checks every method's first argument once they are all in.
local core = require "lutra.tensor.core"
local create = require "lutra.tensor.create"
local ops = require "lutra.tensor.ops"
require "lutra.random"
require "lutra.autograd"
local join = require "lutra.tensor.join"
local format = require "lutra.format"

core.format = format.tensor

local M = {}
for _, part in ipairs { core, create, ops, join } do
  for k, v in pairs(part) do
    if k ~= "format" and k ~= "check_tensor" and k ~= "check_position" and k ~= "release"
      and k ~= "dtype_codes" and k ~= "dtype_out" and k ~= "device_out" then
      M[k] = v
    end
  end
end

core.check_methods() -- (lutra's init calls it again after every module: methods added later are checked too)

return M
