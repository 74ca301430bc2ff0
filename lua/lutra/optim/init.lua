--- lutra.optim (lt.optim): AdamW and SGD over parameter groups, each group
-- updated by one fused C call per step (host/optim.c, kernels/*/optim), and
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
local autograd = require "lutra.autograd"
local capi = require "lutra.capi"
local tensor = require "lutra.tensor"
local ffi, C = capi.ffi, capi.C

local M = {}

local function fail(level)
  error(ffi.string(C.lt_last_error()), level + 1)
end

local function is_module(x) return type(x) == "table" and type(x.named_parameters) == "function" end

local function number_opt(name, v, lo, hi, lo_open)
  if type(v) ~= "number" or v ~= v or (lo_open and v <= lo) or v < lo or (hi and v >= hi) then
    error(("optimizer: %s must be a number %s %s%s, got %s"):format(name, lo_open and ">" or ">=", lo,
      hi and (" and < " .. hi) or "", tostring(v)), 4)
  end
  return v
end

--- Splits parameters into a decayed group (dim >= 2) and one without decay.
local function default_groups(params, wd)
  local decay, none = {}, {}
  for _, p in ipairs(params) do
    if p:dim() >= 2 then decay[#decay + 1] = p else none[#none + 1] = p end
  end
  local groups = {}
  if #decay > 0 then groups[#groups + 1] = { params = decay, weight_decay = wd } end
  if #none > 0 then groups[#groups + 1] = { params = none, weight_decay = 0 } end
  return groups
end

local function check_param(p, where)
  if not tensor.is_tensor(p) then error(("optimizer: %s is not a tensor"):format(where), 4) end
  if not p:is_floating_point() then error(("optimizer: %s is %s; only float tensors are optimized"):format(where, p.dtype), 4) end
  if not p.is_leaf then error(("optimizer: %s is not a leaf (it was computed); optimize the tensors it came from"):format(where), 4) end
end

local function build_groups(what, opts, defaults)
  local groups
  if is_module(what) then
    groups = default_groups(what:parameters(), opts.weight_decay)
  elseif type(what) == "table" and what[1] ~= nil and type(what[1]) == "table" and what[1].params then
    groups = {}
    for i, g in ipairs(what) do
      local copy = {}
      for k, v in pairs(g) do copy[k] = v end
      if type(copy.params) ~= "table" then error(("optimizer: group %d has no params list"):format(i), 3) end
      groups[i] = copy
    end
  elseif type(what) == "table" then
    groups = default_groups(what, opts.weight_decay)
  else
    error("optimizer: expected a module, a list of parameters or a list of groups, got " .. type(what), 3)
  end
  local seen = {}
  for gi, g in ipairs(groups) do
    for k, v in pairs(defaults) do
      if g[k] == nil then g[k] = opts[k] == nil and v or opts[k] end
    end
    for k in pairs(g) do
      if k ~= "params" and defaults[k] == nil then
        local known = {}
        for name in pairs(defaults) do known[#known + 1] = name end
        table.sort(known)
        error(("optimizer: group %d has an unknown setting '%s' (known: %s)"):format(gi, k, table.concat(known, ", ")), 3)
      end
    end
    for pi, p in ipairs(g.params) do
      check_param(p, ("parameter %d of group %d"):format(pi, gi))
      if seen[p] then error(("optimizer: parameter %d of group %d appears twice"):format(pi, gi), 3) end
      seen[p] = true
    end
  end
  return groups
end

local Optimizer = {}
Optimizer.__index = Optimizer

local function new(kind, what, opts, defaults)
  opts = opts or {}
  if type(opts) ~= "table" then error(kind .. ": options must be a table", 3) end
  for k in pairs(opts) do
    if defaults[k] == nil then
      local known = {}
      for name in pairs(defaults) do known[#known + 1] = name end
      table.sort(known)
      error(("%s: unknown option '%s' (known: %s)"):format(kind, k, table.concat(known, ", ")), 3)
    end
  end
  local self = setmetatable({ kind = kind, step_count = 0, state = {} }, Optimizer)
  self.groups = build_groups(what, opts, defaults)
  for _, g in ipairs(self.groups) do self:check_group(g) end
  return self
end

function Optimizer:check_group(g)
  number_opt("lr", g.lr, 0)
  number_opt("weight_decay", g.weight_decay, 0)
  if self.kind == "AdamW" then
    if type(g.betas) ~= "table" then error("AdamW: betas must be a table {beta1, beta2}", 3) end
    number_opt("betas[1]", g.betas[1], 0, 1)
    number_opt("betas[2]", g.betas[2], 0, 1)
    number_opt("eps", g.eps, 0)
  else
    number_opt("momentum", g.momentum, 0)
    number_opt("dampening", g.dampening, 0)
    if g.nesterov and (g.momentum <= 0 or g.dampening ~= 0) then
      error("SGD: Nesterov momentum needs momentum > 0 and dampening 0", 3)
    end
  end
end

--- The optimizer state of parameter p (in group g), created at its first update.
function Optimizer:state_of(p, g)
  local s = self.state[p]
  if s then return s end
  s = {}
  local sdt = p.dtype == "f64" and "f64" or "f32"
  autograd.no_grad(function()
    if p.dtype == "bf16" or p.dtype == "f16" then s.master = p:to("f32"):contiguous() end
    if self.kind == "AdamW" then
      s.exp_avg = tensor.zeros(p:shape(), { dtype = sdt, device = p.device })
      s.exp_avg_sq = tensor.zeros(p:shape(), { dtype = sdt, device = p.device })
    elseif g.momentum > 0 then
      s.momentum_buffer = tensor.zeros(p:shape(), { dtype = sdt, device = p.device })
    end
  end)
  self.state[p] = s
  return s
end

-- the parameters of a group that have gradients, split by device, as C arrays
local function gather(self, g)
  local by_dev, order = {}, {}
  for _, p in ipairs(g.params) do
    local grad = p.grad
    if grad ~= nil then
      local d = p.device
      if not by_dev[d] then
        by_dev[d] = { params = {}, grads = {}, masters = {}, a = {}, b = {} }
        order[#order + 1] = d
      end
      local e = by_dev[d]
      local s = self:state_of(p, g)
      local n = #e.params + 1
      e.params[n], e.grads[n] = p, grad
      e.masters[n] = s.master
      e.a[n] = s.exp_avg or s.momentum_buffer
      e.b[n] = s.exp_avg_sq
    end
  end
  return by_dev, order
end

local function carray(list, n)
  local arr = ffi.new("lt_tensor*[?]", math.max(n, 1))
  for i = 1, n do arr[i - 1] = list[i] end
  return arr
end

local FLT_MAX = 3.4028234663852886e38

--- opt:step([{grad_scale = 1}]): one update of every parameter that has a
-- gradient; returns the step count. grad_scale (a number in [0, FLT_MAX]:
-- the update applies it in f32 except to f64 parameters) multiplies each
-- gradient as the fused update reads it, the .grad tensors left as they
-- are: a global-norm clip taken into the step (llm.c's AdamW grad_scale)
-- instead of a pass that scales every gradient, as lt.train clips.
function Optimizer:step(opts)
  local grad_scale = 1
  if opts ~= nil then
    if type(opts) ~= "table" then error("step: options must be a table {grad_scale = s}, got " .. type(opts), 2) end
    for k in pairs(opts) do
      if k ~= "grad_scale" then error(("step: unknown option '%s' (known: grad_scale)"):format(tostring(k)), 2) end
    end
    grad_scale = opts.grad_scale == nil and 1 or opts.grad_scale
    if type(grad_scale) ~= "number" or not (grad_scale >= 0 and grad_scale <= FLT_MAX) then
      error(("step: grad_scale must be a number in [0, %g], got %s (%s)"):format(FLT_MAX, tostring(opts.grad_scale),
        type(opts.grad_scale)), 2)
    end
  end
  self.step_count = self.step_count + 1
  for _, g in ipairs(self.groups) do
    self:check_group(g)
    local by_dev, order = gather(self, g)
    for _, d in ipairs(order) do
      local e = by_dev[d]
      local n = #e.params
      local keep = { carray(e.params, n), carray(e.grads, n), carray(e.masters, n), carray(e.a, n), carray(e.b, n) }
      local st
      if self.kind == "AdamW" then
        st = C.lt_adamw_step(n, keep[1], keep[2], keep[3], keep[4], keep[5], g.lr, g.betas[1], g.betas[2], g.eps,
          g.weight_decay, self.step_count, grad_scale)
      elseif g.momentum == 0 then
        st = C.lt_sgd_step(n, keep[1], keep[2], keep[3], nil, g.lr, 0, g.dampening, g.weight_decay, 0, 0, grad_scale)
      else
        -- buffers start as the gradient at each parameter's first update: two calls when some are new
        st = 0
        local parts = { [true] = {}, [false] = {} } -- split before any call marks a buffer started
        for i = 1, n do
          local list = parts[not self.state[e.params[i]].started]
          list[#list + 1] = i
        end
        for _, first in ipairs { true, false } do
          local idx = parts[first]
          if #idx > 0 and st == 0 then
            local function sub(list)
              local out = {}
              for j, i in ipairs(idx) do out[j] = list[i] end
              return carray(out, #idx)
            end
            local sp, sg, sm, sb = sub(e.params), sub(e.grads), sub(e.masters), sub(e.a)
            st = C.lt_sgd_step(#idx, sp, sg, sm, sb, g.lr, g.momentum, g.dampening, g.weight_decay,
              g.nesterov and 1 or 0, first and 1 or 0, grad_scale)
            if st == 0 then
              for _, i in ipairs(idx) do self.state[e.params[i]].started = true end
            end
          end
        end
      end
      if st ~= 0 then
        self.step_count = self.step_count - 1
        fail(2)
      end
    end
  end
  return self.step_count
end

--- opt:zero_grad(): clears every parameter's gradient (as set_to_none).
function Optimizer:zero_grad()
  for _, g in ipairs(self.groups) do
    for _, p in ipairs(g.params) do p.grad = nil end
  end
end

--- opt:set_lr(lr): the learning rate of every group (schedules call it each step).
function Optimizer:set_lr(lr)
  if type(lr) ~= "number" or lr ~= lr or lr < 0 then
    error("set_lr: the learning rate must be a number >= 0, got " .. tostring(lr), 2)
  end
  for _, g in ipairs(self.groups) do g.lr = lr end
end

--- opt:parameters() -> every parameter, in group order.
function Optimizer:parameters()
  local out = {}
  for _, g in ipairs(self.groups) do
    for _, p in ipairs(g.params) do out[#out + 1] = p end
  end
  return out
end

local STATE_KEYS = { "master", "exp_avg", "exp_avg_sq", "momentum_buffer" }

--- opt:state_dict() -> { step = n, groups = { {lr=, ...}, ... }, tensors = { ["3.exp_avg"] = t, ... } }:
-- settings per group and the state of the parameter at position i (in group
-- order) under "i.<name>"; tensors are the live ones (save copies them).
function Optimizer:state_dict()
  local groups, tensors = {}, {}
  for gi, g in ipairs(self.groups) do
    local settings = {}
    for k, v in pairs(g) do
      if k ~= "params" then settings[k] = type(v) == "table" and { unpack(v) } or v end
    end
    settings.num_params = #g.params
    groups[gi] = settings
  end
  for i, p in ipairs(self:parameters()) do
    local s = self.state[p]
    if s then
      for _, k in ipairs(STATE_KEYS) do
        if s[k] ~= nil then tensors[i .. "." .. k] = s[k] end
      end
      if s.started then tensors[i .. ".started"] = tensor.ones(1, { dtype = "u8" }) end
    end
  end
  return { kind = self.kind, step = self.step_count, groups = groups, tensors = tensors }
end

--- opt:check_state_dict(sd): raises (naming the group, parameter and
-- tensor) unless sd is state this optimizer can load: its kind, group and
-- parameter counts, a whole step count, tensors of each parameter's shape
-- in the state dtype (f32; f64 for f64 parameters), a complete AdamW state
-- per parameter, and no negative second moments. Changes nothing.
function Optimizer:check_state_dict(sd)
  if type(sd) ~= "table" or type(sd.groups) ~= "table" or type(sd.tensors) ~= "table" then
    error("load_state_dict: expected the table opt:state_dict() returns", 2)
  end
  if sd.kind and sd.kind ~= self.kind then
    error(("load_state_dict: the state is %s's, this optimizer is %s"):format(tostring(sd.kind), self.kind), 2)
  end
  local step = sd.step or 0
  if type(step) ~= "number" or step ~= math.floor(step) or step < 0 or step >= 2 ^ 53 then
    error(("load_state_dict: the step count must be a whole number >= 0, got %s"):format(tostring(sd.step)), 2)
  end
  if #sd.groups ~= #self.groups then
    error(("load_state_dict: %d groups saved, this optimizer has %d"):format(#sd.groups, #self.groups), 2)
  end
  for gi, g in ipairs(self.groups) do
    local sg = sd.groups[gi]
    if type(sg) ~= "table" then error(("load_state_dict: group %d is not a table"):format(gi), 2) end
    if sg.num_params ~= #g.params then
      error(("load_state_dict: group %d had %s parameters, now %d"):format(gi, tostring(sg.num_params), #g.params), 2)
    end
    local trial = {}
    for k, v in pairs(g) do trial[k] = v end
    for k, v in pairs(sg) do
      if k ~= "num_params" and k ~= "params" then trial[k] = type(v) == "table" and { unpack(v) } or v end
    end
    local ok, err = pcall(self.check_group, self, trial)
    if not ok then error(("load_state_dict: group %d: %s"):format(gi, tostring(err):gsub("^.-: ", "", 1)), 2) end
  end
  for i, p in ipairs(self:parameters()) do
    local sdt = p.dtype == "f64" and "f64" or "f32"
    local n = 0
    for _, k in ipairs(STATE_KEYS) do
      local t = sd.tensors[i .. "." .. k]
      if t ~= nil then
        n = n + 1
        if table.concat(t:shape(), "x") ~= table.concat(p:shape(), "x") then
          error(("load_state_dict: %s of parameter %d has shape [%s], the parameter [%s]"):format(k, i,
            table.concat(t:shape(), ", "), table.concat(p:shape(), ", ")), 2)
        end
        if t.dtype ~= sdt then
          error(("load_state_dict: %s of parameter %d is %s, expected %s"):format(k, i, t.dtype, sdt), 2)
        end
        if k == "exp_avg_sq" and t:numel() > 0 and t:min():item() < 0 then
          error(("load_state_dict: exp_avg_sq of parameter %d holds negative values"):format(i), 2)
        end
      end
    end
    if self.kind == "AdamW" and n > 0 and (sd.tensors[i .. ".exp_avg"] == nil or sd.tensors[i .. ".exp_avg_sq"] == nil) then
      error(("load_state_dict: parameter %d has only part of its AdamW state (exp_avg and exp_avg_sq go together)")
        :format(i), 2)
    end
    if (p.dtype == "bf16" or p.dtype == "f16") and n > 0 and sd.tensors[i .. ".master"] == nil then
      error(("load_state_dict: parameter %d is %s but its f32 master weights are missing"):format(i, p.dtype), 2)
    end
  end
end

--- opt:load_state_dict(sd): restores what state_dict returned, copying the
-- tensors onto each parameter's device, after check_state_dict (so a
-- refused state changes nothing).
function Optimizer:load_state_dict(sd)
  local ok, err = pcall(self.check_state_dict, self, sd)
  if not ok then error(err, 2) end
  local params = self:parameters()
  local new_state = {}
  for i, p in ipairs(params) do
    local s
    for _, k in ipairs(STATE_KEYS) do
      local t = sd.tensors[i .. "." .. k]
      if t ~= nil then
        s = s or {}
        s[k] = autograd.no_grad(function() return t:to { device = p.device }:clone() end)
      end
    end
    if s and sd.tensors[i .. ".started"] ~= nil then s.started = true end
    new_state[p] = s
  end
  for gi, g in ipairs(self.groups) do
    for k, v in pairs(sd.groups[gi]) do
      if k ~= "num_params" and k ~= "params" then g[k] = type(v) == "table" and { unpack(v) } or v end
    end
  end
  self.state = new_state
  self.step_count = sd.step or 0
end

--- lt.optim.AdamW(params, {lr = 1e-3, betas = {0.9, 0.999}, eps = 1e-8, weight_decay = 0.01})
-- (torch.optim.AdamW's defaults).
function M.AdamW(what, opts)
  return new("AdamW", what, opts, { lr = 1e-3, betas = { 0.9, 0.999 }, eps = 1e-8, weight_decay = 0.01 })
end

--- lt.optim.SGD(params, {lr = 1e-3, momentum = 0, dampening = 0, weight_decay = 0, nesterov = false}).
function M.SGD(what, opts)
  return new("SGD", what, opts, { lr = 1e-3, momentum = 0, dampening = 0, weight_decay = 0, nesterov = false })
end

-- the gradients of params (a module, a list, or an optimizer's), grouped by device
local function grads_by_device(what, op, level)
  local params = is_module(what) and what:parameters() or what
  if getmetatable(params) == Optimizer then params = params:parameters() end
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

M.schedules = require "lutra.optim.schedules"

return M
