--- lutra.optim.optimizer: the base class of lt.optim's optimizers (AdamW:
-- lutra.optim.adamw, SGD: lutra.optim.sgd): parameter groups and their
-- checks, per-parameter state with f32 master weights for bf16/f16
-- parameters, opt:step's loop over groups and devices, zero_grad, set_lr,
-- parameters, and state_dict / check_state_dict / load_state_dict.
--
-- A subclass (Optimizer.class(kind, {...})) supplies what differs:
--   defaults()                  -> a fresh table of its options and their defaults
--   check_settings(g, level)    raises on a bad group setting (level as error()'s,
--                               counted from check_settings)
--   init_state(s, p, g, sdt)    creates its state tensors in s (dtype sdt) at p's first update
--   slots                       the state names handed to the fused update, in order (up to 2)
--   update(g, e, n, grad_scale) -> lt_status: one fused update of the n parameters of
--                               group g on one device (e: params, grads, masters, a, b lists)
--   check_param_state(sd, i, n, level)  (optional) raises on an incomplete saved state
-- The state_dict format ({kind =, step =, groups =, tensors =}) is the
-- same for every kind; `kind` names the subclass.
local autograd = require "lutra.autograd"
local capi = require "lutra.capi"
local tensor = require "lutra.tensor"
local ffi, C = capi.ffi, capi.C

local M = {}

local function fail(level)
  error(ffi.string(C.lt_last_error()), level + 1)
end

local function is_module(x) return type(x) == "table" and type(x.named_parameters) == "function" end

--- number_opt(name, v, lo[, hi[, lo_open[, level = 4]]]) -> v: raises "optimizer: <name>
-- must be a number >= lo (and < hi), got v" at level (counted from number_opt) unless v is.
local function number_opt(name, v, lo, hi, lo_open, level)
  if type(v) ~= "number" or v ~= v or (lo_open and v <= lo) or v < lo or (hi and v >= hi) then
    error(("optimizer: %s must be a number %s %s%s, got %s"):format(name, lo_open and ">" or ">=", lo,
      hi and (" and < " .. hi) or "", tostring(v)), level or 4)
  end
  return v
end
M.number_opt = number_opt

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

--- carray(list, n) -> an lt_tensor*[n] of the list's first n tensors (at least one slot).
local function carray(list, n)
  local arr = ffi.new("lt_tensor*[?]", math.max(n, 1))
  for i = 1, n do arr[i - 1] = list[i] end
  return arr
end

local Optimizer = {}
Optimizer.__index = Optimizer
M.Optimizer = Optimizer

--- Optimizer.class(kind, fields) -> a subclass named kind (its instances'
-- and state_dict's `kind`) with fields as its methods (see above).
function Optimizer.class(kind, fields)
  local cls = fields or {}
  cls.kind = kind
  cls.__index = cls
  return setmetatable(cls, Optimizer)
end

--- Optimizer.is_optimizer(x) -> whether x is an instance of an lt.optim optimizer.
function Optimizer.is_optimizer(x)
  local mt = type(x) == "table" and getmetatable(x)
  while mt do
    if mt == Optimizer then return true end
    mt = getmetatable(mt)
  end
  return false
end

--- Optimizer.new(cls, what, opts) -> an optimizer of class cls over what (a
-- module, a list of parameters or a list of groups) with options opts
-- (cls.defaults() names those allowed). Raises at the caller of the
-- function that tail-calls it (lt.optim.AdamW / SGD) on an unknown option,
-- a bad group or setting.
function Optimizer.new(cls, what, opts)
  local kind, defaults = cls.kind, cls.defaults()
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
  local self = setmetatable({ kind = kind, step_count = 0, state = {} }, cls)
  self.groups = build_groups(what, opts, defaults)
  for _, g in ipairs(self.groups) do self:check_group(g) end
  self.lr = opts.lr or defaults.lr -- (the rate reported where no group is left: a pipeline stage with nothing to train)
  return self
end

--- opt:check_group(g): raises unless group g's settings are valid (lr and
-- weight_decay >= 0, then the subclass's own: check_settings).
function Optimizer:check_group(g)
  number_opt("lr", g.lr, 0)
  number_opt("weight_decay", g.weight_decay, 0)
  self:check_settings(g, 4)
end

--- The optimizer state of parameter p (in group g), created at its first update.
function Optimizer:state_of(p, g)
  local s = self.state[p]
  if s then return s end
  s = {}
  local sdt = p.dtype == "f64" and "f64" or "f32"
  autograd.no_grad(function()
    if p.dtype == "bf16" or p.dtype == "f16" then s.master = p:to("f32"):contiguous() end
    self:init_state(s, p, g, sdt)
  end)
  self.state[p] = s
  return s
end

-- the parameters of a group that have gradients, split by device, as lists
-- (a, b: the state the subclass names in slots)
local function gather(self, g)
  local by_dev, order = {}, {}
  local slot_a, slot_b = self.slots[1], self.slots[2]
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
      e.a[n] = slot_a and s[slot_a]
      e.b[n] = slot_b and s[slot_b]
    end
  end
  return by_dev, order
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
      local st = self:update(g, e, #e.params, grad_scale)
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
  self.lr = lr
end

--- opt:parameters() -> every parameter, in group order.
function Optimizer:parameters()
  local out = {}
  for _, g in ipairs(self.groups) do
    for _, p in ipairs(g.params) do out[#out + 1] = p end
  end
  return out
end

-- the state tensors' names, every kind's (master weights, AdamW's moments,
-- SGD's buffer): a state saved without its kind is checked against them all
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
-- in the state dtype (f32; f64 for f64 parameters), a complete state per
-- parameter (check_param_state: AdamW's two moments together), and no
-- negative second moments. Changes nothing.
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
    if self.check_param_state then self:check_param_state(sd, i, n, 3) end
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

M.carray, M.fail, M.is_module = carray, fail, is_module

return M
