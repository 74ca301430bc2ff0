--- lutra.optim (lt.optim): AdamW and SGD over parameter groups (classes on
-- one base, lutra.optim.optimizer; lutra.optim.adamw, .sgd), each group
-- updated by one fused C call per step (host/ops/optim.c, kernels/*/optim), and
-- global-norm gradient clipping. Formulas are torch.optim's (AdamW:
-- Loshchilov and Hutter 2019, decoupled weight decay; SGD with momentum,
-- dampening and Nesterov). bf16/f16 parameters get f32 master weights and
-- f32 state: the step updates the master and rounds it into the parameter.
--
--   local opt = lt.optim.AdamW(model, { lr = 6e-4, betas = { 0.9, 0.95 }, weight_decay = 0.1 })
--   loss:backward(); opt:step(); opt:zero_grad()
--
-- The first argument is a module, a list of parameters, or a list of groups
-- { params = {...}, lr = ..., weight_decay = ... } (group settings override
-- the options). From a module or a list, weight decay goes to parameters of
-- 2 or more dims (matrices, embeddings) and not to biases or norm weights.
-- Also here: global-norm clipping (grad_norm, clip_scale, clip_grad_norm)
-- and lt.optim.schedules.
local autograd = require "lutra.autograd"
local capi = require "lutra.capi"
local base = require "lutra.optim.optimizer"
local AdamW = require "lutra.optim.adamw"
local SGD = require "lutra.optim.sgd"
local schedules = require "lutra.optim.schedules"
local ffi, C = capi.ffi, capi.C
local Optimizer, carray, fail, is_module = base.Optimizer, base.carray, base.fail, base.is_module

local M = {}

--- lt.optim.AdamW(params, {lr = 1e-3, betas = {0.9, 0.999}, eps = 1e-8, weight_decay = 0.01})
-- (torch.optim.AdamW's defaults).
function M.AdamW(what, opts)
  return Optimizer.new(AdamW, what, opts)
end

--- lt.optim.SGD(params, {lr = 1e-3, momentum = 0, dampening = 0, weight_decay = 0, nesterov = false}).
function M.SGD(what, opts)
  return Optimizer.new(SGD, what, opts)
end

-- the gradients of params (a module, a list, or an optimizer's), grouped by device
local function grads_by_device(what, op, level)
  local params = is_module(what) and what:parameters() or what
  if Optimizer.is_optimizer(params) then params = params:parameters() end
  if type(params) ~= "table" then
    error(("%s: expected a module, an optimizer or a list of parameters, got %s"):format(op, type(what)), level + 1)
  end
  local by_dev, order = {}, {}
  for _, p in ipairs(params) do
    local g = p.grad
    if g ~= nil then
      local d = g.device
      if not by_dev[d] then
        by_dev[d] = {}
        order[#order + 1] = d
      end
      by_dev[d][#by_dev[d] + 1] = g
    end
  end
  return by_dev, order
end

-- the norm of the gradients grads_by_device found (errors raised at level)
local function norm_of(by_dev, order, level)
  local total = 0
  local out = ffi.new("double[1]")
  for _, d in ipairs(order) do
    local gs = by_dev[d]
    if C.lt_grad_sum_squares(#gs, carray(gs, #gs), out) ~= 0 then fail(level + 1) end
    total = total + out[0]
  end
  return math.sqrt(total)
end

local function check_max_norm(op, max_norm, level)
  if type(max_norm) ~= "number" or not (max_norm > 0) then
    error(op .. ": max_norm must be a number > 0, got " .. tostring(max_norm), level + 1)
  end
end

--- lt.optim.grad_norm(params or module or optimizer) -> norm: the L2 norm
-- of all gradients together (f64 sums of squares, one call per device,
-- read on the host); parameters without a gradient count as zero.
function M.grad_norm(what)
  local by_dev, order = grads_by_device(what, "grad_norm", 2)
  return norm_of(by_dev, order, 2)
end

--- lt.optim.clip_scale(norm, max_norm) -> scale: what global-norm clipping
-- multiplies the gradients by: max_norm / (norm + 1e-6) when norm is above
-- max_norm, else 1 (torch.nn.utils.clip_grad_norm_'s factor); 1 for a NaN
-- or infinite norm (the caller skips that step).
function M.clip_scale(norm, max_norm)
  check_max_norm("clip_scale", max_norm, 2)
  if type(norm) ~= "number" then error("clip_scale: norm must be a number, got " .. type(norm), 2) end
  if norm ~= norm or norm == math.huge or norm <= max_norm then return 1 end
  return max_norm / (norm + 1e-6)
end

--- lt.optim.clip_grad_norm(params or module, max_norm) -> norm, clipped:
-- the L2 norm of all gradients together (lt.optim.grad_norm); when it is
-- above max_norm every gradient is scaled by max_norm / (norm + 1e-6)
-- (torch.nn.utils.clip_grad_norm_). A NaN or infinite norm scales nothing:
-- the caller skips the step. (lt.optim's optimizers can take the scale into
-- their update instead: opt:step{grad_scale = lt.optim.clip_scale(norm, m)}.)
function M.clip_grad_norm(what, max_norm)
  check_max_norm("clip_grad_norm", max_norm, 2)
  local by_dev, order = grads_by_device(what, "clip_grad_norm", 2)
  local norm = norm_of(by_dev, order, 2)
  local scale = M.clip_scale(norm, max_norm)
  if scale == 1 then return norm, false end
  autograd.no_grad(function()
    for _, d in ipairs(order) do
      for _, g in ipairs(by_dev[d]) do g:mul_(scale) end
    end
  end)
  return norm, true
end

--- lt.optim.takes_grad_scale(opt) -> whether opt:step is lt.optim's own
-- (AdamW's and SGD's), which takes {grad_scale = s}; false for any other
-- optimizer, a wrapper around one of these included (its step may not pass
-- the option on). lt.train clips through grad_scale only where this is true.
function M.takes_grad_scale(opt)
  return type(opt) == "table" and opt.step == Optimizer.step
end

M.schedules = schedules

return M
