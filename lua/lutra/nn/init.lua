--- lutra.nn (lt.nn): modules, as torch.nn.Module.
-- A module class comes from nn.Module:extend(name) and defines init(...) and
-- forward(...); instances are made by calling the class and run by calling
-- the instance. Assigning a tensor that requires grad to a field registers a
-- parameter, assigning a module registers a child, in order; register_buffer
-- keeps other tensors that move with the module. Parameter names are dotted
-- paths ("transformer.h.0.attn.c_attn.weight"); children of a ModuleList are
-- named 0, 1, ... as in PyTorch (and so in Hugging Face checkpoints), while
-- Lua indexes them from 1 (blocks[1] is named "0"). An error inside a
-- module's forward is raised again with the module's path in front.
local autograd = require "lutra.autograd"
local F = require "lutra.nn.functional"
local tensor = require "lutra.tensor"

local nn = {}

-- ---- Module ------------------------------------------------------------------------

local Module = { __name = "Module" }
nn.Module = Module


local function instance_index(self, k)
  local params = rawget(self, "_params")
  local p = params.by_name[k]
  if p ~= nil then return p end
  local m = rawget(self, "_children").by_name[k]
  if m ~= nil then return m end
  local b = rawget(self, "_buffers").by_name[k]
  if b ~= nil then return b end
  return getmetatable(self).class[k]
end

--- Adds name -> value to an ordered registry {names = {...}, by_name = {...}}.
local function put(reg, name, value)
  if reg.by_name[name] == nil then reg.names[#reg.names + 1] = name end
  reg.by_name[name] = value
end

local function remove(reg, name)
  if reg.by_name[name] == nil then return end
  reg.by_name[name] = nil
  for i, n in ipairs(reg.names) do
    if n == name then
      table.remove(reg.names, i)
      break
    end
  end
end

local function is_module(v) return type(v) == "table" and rawget(v, "_children") ~= nil end
nn.is_module = is_module

local function instance_newindex(self, k, v)
  local params, children, buffers = rawget(self, "_params"), rawget(self, "_children"), rawget(self, "_buffers")
  remove(params, k)
  remove(children, k)
  if tensor.is_tensor(v) and v.requires_grad then
    put(params, k, v)
  elseif is_module(v) then
    put(children, k, v)
    v:_set_path(rawget(self, "_path") .. "." .. tostring(k))
  elseif buffers.by_name[k] ~= nil and (v == nil or tensor.is_tensor(v)) then
    buffers.by_name[k] = v
  else
    rawset(self, k, v)
  end
end

--- nn.Module:extend(name): a new module class; define init and forward on it.
function Module:extend(name)
  local class = setmetatable({ __name = name }, { __index = self })
  class.__index = class
  local meta = {
    class = class,
    __index = instance_index,
    __newindex = instance_newindex,
    __call = function(inst, ...) return inst:_call(...) end,
    __tostring = function(inst) return inst:__repr() end,
  }
  class._meta = meta
  setmetatable(class, {
    __index = self,
    __call = function(cls, ...)
      local inst = setmetatable({
        _params = { names = {}, by_name = {} },
        _children = { names = {}, by_name = {} },
        _buffers = { names = {}, by_name = {} },
        _path = "model",
        training = true,
      }, meta)
      if cls.init then cls.init(inst, ...) end
      return inst
    end,
  })
  return class
end

function Module:_set_path(path)
  rawset(self, "_path", path)
  for _, name in ipairs(self._children.names) do
    self._children.by_name[name]:_set_path(path .. "." .. tostring(name))
  end
end

--- The module's path for messages ("model.transformer.h.2.attn").
function Module:path() return rawget(self, "_path") end

function Module:_call(...)
  local forward = self.forward
  if not forward then error(("%s (%s) has no forward"):format(self:path(), self.__name), 2) end
  local res = { pcall(forward, self, ...) }
  if not res[1] then
    local msg = res[2]
    -- the innermost module adds its path; outer ones (whose paths begin it) pass it on
    if type(msg) == "string" and msg:sub(1, #self:path()) ~= self:path() then
      msg = self:path() .. ": " .. msg
    end
    error(msg, 0)
  end
  return unpack(res, 2, table.maxn(res))
end

--- self:register_buffer(name, tensor): a tensor that moves with the module
-- and appears in state_dict (persistent ~= false) but is not a parameter.
function Module:register_buffer(name, t, persistent)
  put(self._buffers, name, t)
  self._buffers.persistent = self._buffers.persistent or {}
  self._buffers.persistent[name] = persistent ~= false
end

--- A registry entry per parameter: {name, tensor}, depth-first in order of
-- registration, each tensor once (tied weights under their first name).
local function walk_params(m, prefix, out, seen)
  for _, name in ipairs(m._params.names) do
    local p = m._params.by_name[name]
    if not seen[p] then
      seen[p] = true
      out[#out + 1] = { prefix .. name, p }
    end
  end
  for _, name in ipairs(m._children.names) do
    walk_params(m._children.by_name[name], prefix .. tostring(name) .. ".", out, seen)
  end
  return out
end

--- self:named_parameters() -> { {name, tensor}, ... } in a fixed order, each
-- tensor once (a tied weight appears under its first name).
function Module:named_parameters() return walk_params(self, "", {}, {}) end

--- self:parameters() -> { tensor, ... }
function Module:parameters()
  local out = {}
  for i, np in ipairs(self:named_parameters()) do out[i] = np[2] end
  return out
end

--- self:num_parameters() -> the number of parameter elements (tied weights once).
function Module:num_parameters()
  local n = 0
  for _, p in ipairs(self:parameters()) do n = n + p:numel() end
  return n
end

--- self:named_modules() -> { {name, module}, ... } with this module first as "".
function Module:named_modules(prefix, out)
  out = out or {}
  prefix = prefix or ""
  out[#out + 1] = { prefix, self }
  for _, name in ipairs(self._children.names) do
    self._children.by_name[name]:named_modules(prefix == "" and tostring(name) or prefix .. "." .. tostring(name), out)
  end
  return out
end

--- self:children() -> the direct children, in order.
function Module:children()
  local out = {}
  for i, name in ipairs(self._children.names) do out[i] = self._children.by_name[name] end
  return out
end

--- self:apply(fn): fn(module) on every child (depth first), then on self; returns self.
function Module:apply(fn)
  for _, c in ipairs(self:children()) do c:apply(fn) end
  fn(self)
  return self
end

--- self:train([on]) / self:eval(): sets .training here and below.
function Module:train(on)
  on = on ~= false
  return self:apply(function(m) rawset(m, "training", on) end)
end
function Module:eval() return self:train(false) end

--- self:zero_grad(): clears every parameter's gradient.
function Module:zero_grad()
  for _, p in ipairs(self:parameters()) do p.grad = nil end
end

--- self:to(device, dtype) (either may be nil, in any order): converts
-- parameters and buffers in place, keeping tied weights tied; returns self.
function Module:to(a, b)
  local dtype, device
  for _, x in ipairs { a, b } do
    if x ~= nil then
      if type(x) ~= "string" then error("to: expected a device or dtype name", 2) end
      if pcall(tensor.dtype_code, x) then
        dtype = x
      elseif pcall(tensor.device_code, x) then
        device = x
      else
        error(("to: '%s' is neither a dtype (f32, bf16, ...) nor a device (cpu, cuda:N)"):format(x), 2)
      end
    end
  end
  if dtype and not tensor.zeros(1, dtype):is_floating_point() then
    error(("to: modules move to float dtypes only, got %s"):format(dtype), 2)
  end
  local moved = {}
  local function convert(t)
    if moved[t] then return moved[t] end
    local want = t:is_floating_point() and dtype or nil -- integer and bool buffers keep their dtype
    local c = autograd.no_grad(function() return t:to { dtype = want, device = device } end)
    if c ~= t then
      c = c:detach()
      if t.requires_grad then c:requires_grad_() end
    end
    moved[t] = c
    return c
  end
  -- (an error, e.g. a device that is not there, raised at the caller's line)
  local ok, err = pcall(self.apply, self, function(m)
    for _, name in ipairs(m._params.names) do m._params.by_name[name] = convert(m._params.by_name[name]) end
    for _, name in ipairs(m._buffers.names) do
      local t = m._buffers.by_name[name]
      if t ~= nil then m._buffers.by_name[name] = convert(t) end
    end
  end)
  if not ok then error((tostring(err):gsub("^[^:\n]+:%d+: ", "")), 2) end
  return self
end

--- self:state_dict() -> {name = tensor} of parameters (tied ones once) and
-- persistent buffers (self:state_dict_names() gives them in order).
function Module:state_dict()
  return (self:_state_dict())
end

--- self:state_dict_names() -> the state dict's names in a fixed order.
function Module:state_dict_names()
  local _, order = self:_state_dict()
  return order
end

function Module:_state_dict()
  local sd, order = {}, {}
  for _, np in ipairs(self:named_parameters()) do
    sd[np[1]] = np[2]
    order[#order + 1] = np[1]
  end
  for _, nm in ipairs(self:named_modules()) do
    local prefix, m = nm[1], nm[2]
    for _, name in ipairs(m._buffers.names) do
      local t = m._buffers.by_name[name]
      if t ~= nil and (m._buffers.persistent or {})[name] ~= false then
        local full = prefix == "" and name or prefix .. "." .. name
        sd[full] = t
        order[#order + 1] = full
      end
    end
  end
  return sd, order
end

--- self:load_state_dict(sd[, {strict = true}]): copies the values into the
-- module's tensors (converting among float dtypes). Missing, unexpected,
-- mis-shaped and integer-for-float (or float-for-integer) entries are
-- reported together by name (strict); returns self.
function Module:load_state_dict(sd, opts)
  if type(sd) ~= "table" then error("load_state_dict: expected a table of name = tensor, got " .. type(sd), 2) end
  local strict = not (opts and opts.strict == false)
  local own = self:state_dict()
  local missing, unexpected, shaped = {}, {}, {}
  for name, t in pairs(own) do
    local v = sd[name]
    if v == nil then
      missing[#missing + 1] = name
    elseif not tensor.is_tensor(v) then
      shaped[#shaped + 1] = name .. " (not a tensor)"
    elseif tostring(v:shape()) ~= tostring(t:shape()) then
      shaped[#shaped + 1] = ("%s (checkpoint %s, model %s)"):format(name, tostring(v:shape()), tostring(t:shape()))
    elseif v:is_floating_point() ~= t:is_floating_point() then
      shaped[#shaped + 1] = ("%s (checkpoint dtype %s, model %s)"):format(name, v.dtype, t.dtype)
    end
  end
  for name in pairs(sd) do
    if own[name] == nil then unexpected[#unexpected + 1] = name end
  end
  table.sort(missing)
  table.sort(unexpected)
  table.sort(shaped)
  if #shaped > 0 or (strict and (#missing > 0 or #unexpected > 0)) then
    local parts = {}
    if #missing > 0 then parts[#parts + 1] = "missing: " .. table.concat(missing, ", ") end
    if #unexpected > 0 then parts[#parts + 1] = "unexpected: " .. table.concat(unexpected, ", ") end
    if #shaped > 0 then parts[#parts + 1] = "wrong shape or dtype: " .. table.concat(shaped, ", ") end
    error("load_state_dict: " .. table.concat(parts, "; "), 2)
  end
  autograd.no_grad(function()
    for name, t in pairs(own) do
      if sd[name] ~= nil then t:copy_(sd[name]) end
    end
  end)
  return self
end

function Module:__repr(indent)
  indent = indent or ""
  local lines = { (self.extra_repr and (self.__name .. "(" .. self:extra_repr() .. ")") or self.__name) }
  for _, name in ipairs(self._children.names) do
    lines[#lines + 1] = indent .. "  (" .. tostring(name) .. "): " .. self._children.by_name[name]:__repr(indent .. "  ")
  end
  return table.concat(lines, "\n")
end

-- ---- parameters and initialisation ------------------------------------------------------

--- nn.Parameter(t): t as a leaf that requires grad.
function nn.Parameter(t)
  if t.requires_grad and t.is_leaf then return t end
  return t:detach():requires_grad_()
end

local function opts_of(o)
  o = o or {}
  return { dtype = o.dtype or "f32", device = o.device or "cpu" }
end

-- o.init == false leaves the memory uninitialised for a model that sets
-- every weight itself (GPT-2 and Llama do: it saves a pass over them)
local function uniform(shape, bound, o)
  local t = tensor.empty(shape, opts_of(o))
  if not (o and o.init == false) then t:uniform_(-bound, bound, o and o.generator) end
  return nn.Parameter(t)
end

-- ---- layers ---------------------------------------------------------------------------------

--- nn.Linear(in, out[, {bias = true, dtype =, device =, generator =, init = true}]):
-- y = x W^T + b, W (out, in); initialised as torch.nn.Linear:
-- U(-1/sqrt(in), 1/sqrt(in)), or not at all with init = false.
nn.Linear = Module:extend("Linear")
function nn.Linear:init(inf, outf, o)
  self.in_features, self.out_features = inf, outf
  local bound = inf > 0 and 1 / math.sqrt(inf) or 0 -- (torch's: no inputs, a zero bound)
  self.weight = uniform({ outf, inf }, bound, o)
  if not (o and o.bias == false) then self.bias = uniform({ outf }, bound, o) end
end
--- linear(x[, activation]): activation "gelu" applies GELU in the same op
-- (F.linear); fuses_activation says a Linear takes it, so a block can ask
-- for it and fall back to F.gelu when a swapped-in module does not.
function nn.Linear:forward(x, activation)
  return F.linear(x, self.weight, self._params.by_name.bias, activation and { activation = activation } or nil)
end
nn.Linear.fuses_activation = nn.Linear.forward

--- nn.fuses(m, what): whether module m takes the fused form `what`
-- ("fuses_activation": Linear's m(x, "gelu"); "fuses_residual": a norm's
-- m(x, residual) -> h, y). A class says so by setting the field to the
-- forward that takes it, so a subclass that overrides forward does not
-- inherit the claim (it falls back to the unfused ops). A wrapper that
-- passes a module's arguments and results through (lt.dist.Zero's stage 3)
-- records the forward it wraps as m._wrapped_forward, and is seen through.
function nn.fuses(m, what)
  local f = m[what]
  return f ~= nil and f ~= false and (f == true or f == (rawget(m, "_wrapped_forward") or m.forward))
end
function nn.Linear:extra_repr()
  return ("%d, %d, bias=%s"):format(self.in_features, self.out_features, tostring(self._params.by_name.bias ~= nil))
end

--- nn.Embedding(num, dim[, opts]): rows looked up by 0-based ids; N(0, 1) init.
nn.Embedding = Module:extend("Embedding")
function nn.Embedding:init(num, dim, o)
  self.num_embeddings, self.embedding_dim = num, dim
  local w = tensor.empty({ num, dim }, opts_of(o))
  if not (o and o.init == false) then w:normal_(0, 1, o and o.generator) end
  self.weight = nn.Parameter(w)
end
function nn.Embedding:forward(ids) return F.embedding(ids, self.weight) end
function nn.Embedding:extra_repr() return ("%d, %d"):format(self.num_embeddings, self.embedding_dim) end

--- nn.LayerNorm(dim[, {eps = 1e-5, bias = true}]): weight 1, bias 0.
nn.LayerNorm = Module:extend("LayerNorm")
function nn.LayerNorm:init(dim, o)
  self.eps = o and o.eps or 1e-5
  self.weight = nn.Parameter(tensor.ones({ dim }, opts_of(o)))
  if not (o and o.bias == false) then self.bias = nn.Parameter(tensor.zeros({ dim }, opts_of(o))) end
end
--- ln(x) -> layer_norm(x); ln(x, residual) -> h, y with h = x + residual and
-- y = layer_norm(h) in one pass (F.add_layer_norm: a pre-norm block's
-- residual add and its next norm; fuses_residual says a norm takes it).
function nn.LayerNorm:forward(x, residual)
  if residual ~= nil then return F.add_layer_norm(x, residual, self.weight, self._params.by_name.bias, self.eps) end
  return F.layer_norm(x, self.weight, self._params.by_name.bias, self.eps)
end
nn.LayerNorm.fuses_residual = nn.LayerNorm.forward

--- nn.RMSNorm(dim[, {eps = 1e-6}]): weight 1.
nn.RMSNorm = Module:extend("RMSNorm")
function nn.RMSNorm:init(dim, o)
  self.eps = o and o.eps or 1e-6
  self.weight = nn.Parameter(tensor.ones({ dim }, opts_of(o)))
end
--- norm(x) -> rms_norm(x); norm(x, residual) -> h, y (F.add_rms_norm), as LayerNorm.
function nn.RMSNorm:forward(x, residual)
  if residual ~= nil then return F.add_rms_norm(x, residual, self.weight, self.eps) end
  return F.rms_norm(x, self.weight, self.eps)
end
nn.RMSNorm.fuses_residual = nn.RMSNorm.forward

--- nn.Dropout(p): dropout while training, the identity in eval mode.
nn.Dropout = Module:extend("Dropout")
function nn.Dropout:init(p, o)
  self.p = p or 0.5
  self.generator = o and o.generator
end
function nn.Dropout:forward(x) return F.dropout(x, self.p, { training = self.training, generator = self.generator }) end

--- nn.Sequential(m1, m2, ...): calls each in turn; children named 0, 1, ...
nn.Sequential = Module:extend("Sequential")
function nn.Sequential:init(...)
  for i = 1, select("#", ...) do
    local m = select(i, ...)
    if not is_module(m) then
      error(("Sequential: argument %d is a %s, not a module"):format(i, type(m)), 3)
    end
    self[i - 1] = m
  end
end
function nn.Sequential:forward(x)
  for _, name in ipairs(self._children.names) do x = self._children.by_name[name](x) end
  return x
end

--- nn.ModuleList({m1, m2, ...}): holds modules; list[i] is the i-th (1-based),
-- named i-1 in parameter names; list:len() counts them and
-- ipairs(list:list()) walks them (LuaJIT tables ignore __len).
nn.ModuleList = Module:extend("ModuleList")
function nn.ModuleList:init(mods)
  for i, m in ipairs(mods or {}) do self:append(m) end
end
function nn.ModuleList:append(m)
  if not is_module(m) then error("ModuleList: only modules can be stored, got " .. type(m), 2) end
  local n = #self._children.names
  instance_newindex(self, n, m)
  return self
end
function nn.ModuleList:list() return self:children() end
function nn.ModuleList:len() return #self._children.names end
nn.ModuleList._meta.__index = function(self, k)
  if type(k) == "number" then return self._children.by_name[k - 1] end
  return instance_index(self, k)
end
nn.ModuleList._meta.__newindex = function(self, k, v)
  if type(k) == "number" then
    if k ~= math.floor(k) or k < 1 or k > #self._children.names + 1 then
      error(("ModuleList: index %s is outside 1..%d"):format(tostring(k), #self._children.names + 1), 2)
    end
    if not is_module(v) then error("ModuleList: only modules can be stored, got " .. type(v), 2) end
    return instance_newindex(self, k - 1, v)
  end
  return instance_newindex(self, k, v)
end

return nn
