--- lutra.autograd: gradients from Lua (the engine is C: host/autograd/engine.c).
-- Tensor methods and fields: t:requires_grad_([on]), t.requires_grad,
-- t.grad (read and write), t.grad_fn, t.is_leaf, t:detach(),
-- t:backward([grad][, {retain_graph=true}]), t:retain_grad(),
-- t:register_hook(fn) (fn(grad) runs when a leaf's gradient is complete);
-- lt.no_grad(fn, ...); lt.autograd.Function{forward=, backward=};
-- lt.autograd.gradcheck(fn, inputs[, opts]).
local capi = require "lutra.capi"
local tensor = require "lutra.tensor.core"
local random = require "lutra.random"
local ffi, C, fail = capi.ffi, capi.C, capi.fail
local T = tensor.methods
local box = capi.tensor_box

local M = {}

local function addr(t) return tonumber(ffi.cast("uintptr_t", t)) end

--- An owned tensor cdata for an address handed over by C (0 gives nil).
local function own(a)
  if a == 0 then return nil end
  local t = ffi.cast("lt_tensor*", a)
  C.lt_tensor_retain(t)
  return ffi.gc(t, C.lt_tensor_release)
end

-- ---- tensor fields and methods -------------------------------------------------

tensor.props.requires_grad = function(t) return C.lt_tensor_requires_grad(t) ~= 0 end
tensor.props.is_leaf = function(t) return C.lt_tensor_is_leaf(t) ~= 0 end
tensor.props.grad_fn = function(t)
  local name = C.lt_tensor_grad_fn(t)
  return name ~= nil and ffi.string(name) or nil
end
tensor.props.grad = function(t)
  local g = C.lt_tensor_grad(t)
  if g == nil then return nil end
  return ffi.gc(g, C.lt_tensor_release)
end
tensor.setters.grad = function(t, g)
  if g ~= nil and not tensor.is_tensor(g) then error("t.grad = x: x must be a tensor or nil", 3) end
  if C.lt_tensor_set_grad(t, g) ~= 0 then fail(3) end
end
tensor.setters.requires_grad = function(t, on)
  if C.lt_tensor_requires_grad_(t, on and 1 or 0) ~= 0 then fail(3) end
end

--- t:requires_grad_([on]): marks a leaf float tensor as needing gradients; returns t.
function T.requires_grad_(t, on)
  if C.lt_tensor_requires_grad_(t, on == false and 0 or 1) ~= 0 then fail(2) end
  return t
end

--- t:detach(): the same data, outside the graph.
function T.detach(t)
  if C.lt_tensor_detach(t, box) ~= 0 then fail(2) end
  return tensor.take()
end

--- t:retain_grad(): a non-leaf keeps its gradient in t.grad after backward.
function T.retain_grad(t)
  if C.lt_tensor_retain_grad(t) ~= 0 then fail(2) end
  return t
end

--- t:backward([grad][, {retain_graph = true}]): gradients of t into the
-- .grad of leaves. grad: t's shape, on t's device (its dtype is converted to
-- t's, as torch); it may be omitted for a one-element t. Errors name a shape
-- or device that differs.
local collect_dead -- (below: drops the Lua state of custom functions whose nodes are done)

function T.backward(t, grad, opts)
  if type(grad) == "table" and opts == nil and not tensor.is_tensor(grad) then grad, opts = nil, grad end
  if grad ~= nil and not tensor.is_tensor(grad) then error("backward: grad must be a tensor", 2) end
  local retain = type(opts) == "table" and opts.retain_graph or opts == true
  local ok, err = pcall(capi.core.backward, addr(t), grad and addr(grad) or nil, retain)
  collect_dead() -- (the custom functions it ran keep nothing past it: lt.checkpoint's inputs go here)
  if not ok then error(err, 2) end
end

-- hooks: hook id (kept by the leaf in C) -> list of functions; the ids of
-- freed leaves come back from C and their entries are dropped
capi.state.grad_hooks = capi.state.grad_hooks or {}
capi.state.next_hook = capi.state.next_hook or 1
local hooks = capi.state.grad_hooks
local dead_hooks = ffi.new("int64_t[256]")

local function collect_dead_hooks()
  repeat
    local n = C.lt_autograd_take_dead_hooks(dead_hooks, 256)
    for i = 0, n - 1 do hooks[tonumber(dead_hooks[i])] = nil end
  until n < 256
end

--- t:register_hook(fn): fn(grad) runs each time backward completes t's
-- gradient (leaves that require grad). Returns t.
function T.register_hook(t, fn)
  if type(fn) ~= "function" then error("register_hook: expected a function", 2) end
  collect_dead_hooks()
  local id = tonumber(C.lt_tensor_hook_id(t))
  if id == 0 then
    id = capi.state.next_hook
    capi.state.next_hook = id + 1
    if C.lt_tensor_set_hook_id(t, id) ~= 0 then fail(2) end
  end
  hooks[id] = hooks[id] or {}
  table.insert(hooks[id], fn)
  return t
end

-- ---- grad mode --------------------------------------------------------------------

--- lt.no_grad(fn, ...): calls fn with gradient recording off; returns its results.
function M.no_grad(fn, ...)
  local was = C.lt_grad_enabled()
  C.lt_set_grad_enabled(0)
  local res = { pcall(fn, ...) }
  C.lt_set_grad_enabled(was)
  if not res[1] then error(res[2], 0) end
  return unpack(res, 2, table.maxn(res))
end

function M.set_grad_enabled(on) C.lt_set_grad_enabled(on and 1 or 0) end
function M.is_grad_enabled() return C.lt_grad_enabled() ~= 0 end

-- ---- custom functions ----------------------------------------------------------------

capi.state.custom_ctx = capi.state.custom_ctx or {}
capi.state.custom_next = capi.state.custom_next or 1
local contexts = capi.state.custom_ctx
local dead = ffi.new("int64_t[256]")

function collect_dead()
  repeat
    local n = C.lt_autograd_take_dead_custom(dead, 256)
    for i = 0, n - 1 do contexts[tonumber(dead[i])] = nil end
  until n < 256
end

-- and once per garbage-collection cycle (a finalizer that re-arms itself):
-- a graph dropped without a backward frees its custom nodes when the
-- collector frees its tensors, and their contexts must not wait for the
-- next custom function to be applied (they hold tensors: lt.checkpoint's inputs)
local function arm_collector()
  local sentinel = newproxy(true)
  getmetatable(sentinel).__gc = function()
    collect_dead()
    arm_collector()
  end
end
arm_collector()

local Ctx = {}
Ctx.__index = Ctx
--- ctx:save_for_backward(...): tensors the backward needs (read back as ctx.saved).
function Ctx:save_for_backward(...) self.saved = { ... } end

--- lt.autograd.hook(fn) -> h: h(t1, ...) returns its tensor arguments (up
-- to 4) unchanged, and fn() runs when backward reaches them, before any node
-- that produced them runs; the gradients pass through in C, never held by
-- Lua (an activation's gradient can be large). ZeRO 3 gathers a module's
-- parameters this way before its backward (PyTorch FSDP's pre-backward hook).
function M.hook(fn)
  if type(fn) ~= "function" then error("autograd.hook: expected a function", 2) end
  return M.Function { forward = function(_, ...) return ... end, backward = function() fn() end, passthrough = true }
end

--- lt.autograd.Function{forward = f, backward = b}: a differentiable Lua
-- function. f(ctx, ...) computes outputs (up to 4 tensors) with recording
-- off; b(ctx, grad_1, ...) returns one value per argument of f, as torch's
-- autograd.Function: the gradient for a tensor argument (or nil), nil for
-- others. Outputs are new tensors in the graph (an output that is an input
-- or a tensor already in a graph is handed out as a detached alias, sharing
-- data). At most 4 tensor arguments. Call it as fn:apply(...) or fn(...).
-- Under no_grad, or when no tensor argument requires grad, nothing is
-- recorded and ctx.needs_input_grad is all false (the forward need keep
-- nothing for a backward).
function M.Function(def)
  if type(def) ~= "table" or type(def.forward) ~= "function" or type(def.backward) ~= "function" then
    error("autograd.Function: expected {forward = function, backward = function}", 2)
  end
  local F = {}
  function F.apply(...)
    local args = { ... }
    if args[1] == F then table.remove(args, 1) end -- called as F:apply(...)
    collect_dead()
    local nargs = math.max(table.maxn(args), select("#", ...) - ((...) == F and 1 or 0))
    local inputs, positions = {}, {}
    for i = 1, nargs do
      if tensor.is_tensor(args[i]) then
        inputs[#inputs + 1] = args[i]
        positions[#inputs] = i
      end
    end
    if #inputs > 4 then error("autograd.Function: at most 4 tensor arguments", 2) end
    -- (recorded only where a gradient can flow: grad mode on and an input that requires it;
    -- otherwise no node is made, and no context kept that no node's death would free)
    local recording = false
    local ctx = setmetatable({ needs_input_grad = {} }, Ctx)
    if C.lt_grad_enabled() ~= 0 then
      for i, t in ipairs(inputs) do
        ctx.needs_input_grad[i] = t.requires_grad
        recording = recording or t.requires_grad
      end
    end
    for i = 1, #inputs do ctx.needs_input_grad[i] = recording and ctx.needs_input_grad[i] or false end
    local outs = { M.no_grad(def.forward, ctx, unpack(args, 1, nargs)) }
    local seen = {}
    for i, o in ipairs(outs) do
      if tensor.is_tensor(o) and (o.requires_grad or seen[addr(o)]) then outs[i] = o:detach() end
      seen[addr(outs[i])] = true
    end
    for _, t in ipairs(inputs) do
      for i, o in ipairs(outs) do
        if o == t then outs[i] = o:detach() end
      end
    end
    if not recording then
      for _, o in ipairs(outs) do
        if not tensor.is_tensor(o) then error("autograd.Function: forward must return tensors", 2) end
      end
      return unpack(outs)
    end
    local id = capi.state.custom_next
    capi.state.custom_next = id + 1
    local ins_c = ffi.new("lt_tensor*[4]", inputs)
    local outs_c = ffi.new("lt_tensor*[4]")
    for i, o in ipairs(outs) do
      if not tensor.is_tensor(o) then error("autograd.Function: forward must return tensors", 2) end
      outs_c[i - 1] = o
    end
    if C.lt_autograd_record_custom(#inputs, ins_c, #outs, outs_c, id) ~= 0 then fail(2) end
    ctx.ninputs = #inputs
    contexts[id] = { ctx = ctx, backward = def.backward, positions = positions, nargs = nargs, passthrough = def.passthrough }
    return unpack(outs)
  end
  return setmetatable(F, { __call = function(_, ...) return F.apply(...) end })
end

-- ---- the handlers backward calls (bindings/autograd.c) --------------------------------

local function on_leaf_ready(hook_id, grad_addr)
  local fns = hooks[hook_id]
  if not fns then return end
  local g = own(grad_addr)
  for _, fn in ipairs(fns) do fn(g) end
end

local function on_custom(id, nin, ...)
  local entry = contexts[id]
  if not entry then error("autograd.Function: its context is gone") end
  if entry.passthrough then -- the gradients go through untouched, never boxed in Lua
    entry.backward(entry.ctx)
    local out = {}
    for i = 1, nin do
      local a = select(i, ...) or 0
      if a ~= 0 then C.lt_tensor_retain(ffi.cast("lt_tensor*", a)) end -- the engine takes this reference
      out[i] = a
    end
    return unpack(out, 1, nin)
  end
  local grads = {}
  for i = 1, select("#", ...) do grads[i] = own(select(i, ...)) end
  local res = { entry.backward(entry.ctx, unpack(grads, 1, select("#", ...))) }
  if table.maxn(res) > entry.nargs then
    error(("autograd.Function: backward returned %d values for a forward of %d arguments"):format(table.maxn(res),
      entry.nargs))
  end
  -- check every value before taking any reference, so an error leaks nothing
  for i = 1, nin do
    local g = res[entry.positions[i]]
    if g ~= nil and not tensor.is_tensor(g) then
      error(("autograd.Function: backward returned a %s for argument %d, expected a tensor or nil")
        :format(type(g), entry.positions[i]))
    end
  end
  local out = {}
  for i = 1, nin do
    local g = res[entry.positions[i]]
    if g ~= nil then C.lt_tensor_retain(g) end -- the engine takes this reference
    out[i] = g ~= nil and addr(g) or 0
  end
  return unpack(out, 1, nin)
end

capi.core.set_autograd_handlers(on_leaf_ready, on_custom)

-- ---- gradient checking ----------------------------------------------------------------

--- lt.autograd.gradcheck(fn, inputs[, {eps=1e-6, atol=1e-5, rtol=1e-3}]):
-- compares backward's gradients with central differences. inputs are f64
-- CPU tensors (those that require grad are checked; they may be views);
-- fn(...) returns one tensor. The gradients checked are those of
-- sum(fn(...) * w) for a fixed random w. Returns true, or raises an error
-- naming the input, the element and both values.
function M.gradcheck(fn, inputs, opts)
  opts = opts or {}
  local eps, atol, rtol = opts.eps or 1e-6, opts.atol or 1e-5, opts.rtol or 1e-3
  local any = false
  for i, x in ipairs(inputs) do
    if tensor.is_tensor(x) and x.requires_grad then
      any = true
      if x.dtype ~= "f64" then error(("gradcheck: input %d is %s; use f64 tensors"):format(i, x.dtype), 2) end
      if not x.is_leaf then
        error(("gradcheck: input %d is not a leaf (made by %s); pass x:detach():requires_grad_()"):format(i, x.grad_fn), 2)
      end
      for d = 1, x:dim() do
        if x:stride(d) == 0 and x:size(d) > 1 then
          error(("gradcheck: input %d is expanded (dim %d has stride 0); expand inside fn instead"):format(i, d), 2)
        end
      end
    end
  end
  if not any then error("gradcheck: no input requires grad", 2) end
  local out = fn(unpack(inputs))
  if not tensor.is_tensor(out) then error("gradcheck: fn must return a tensor", 2) end
  local w = random.randn(out:shape(), { dtype = out.dtype, generator = random.Generator(12345) })
  local function objective()
    return M.no_grad(function() return (fn(unpack(inputs)) * w):sum():item() end)
  end
  for _, x in ipairs(inputs) do
    if tensor.is_tensor(x) and x.requires_grad then x.grad = nil end
  end
  ;(out * w):sum():backward()
  for i, x in ipairs(inputs) do
    if tensor.is_tensor(x) and x.requires_grad then
      local analytic = x.grad and x.grad:totable() or nil
      local shape, strides = x:shape(), x:stride()
      local p = x:data_ptr()
      local n = x:numel()
      local flat = analytic and x.grad:reshape(n):totable() or {}
      if n == 1 and type(flat) == "number" then flat = { flat } end
      for k = 0, n - 1 do
        -- storage offset of logical element k
        local off, rem = 0, k
        for d = #shape, 1, -1 do
          off = off + (rem % shape[d]) * strides[d]
          rem = math.floor(rem / shape[d])
        end
        local orig = p[off]
        p[off] = orig + eps
        local fp = objective()
        p[off] = orig - eps
        local fm = objective()
        p[off] = orig
        local numeric = (fp - fm) / (2 * eps)
        local a = flat[k + 1] or 0
        if not (math.abs(a - numeric) <= atol + rtol * math.abs(numeric)) then
          error(("gradcheck: input %d, element %d: backward gives %.10g, central differences %.10g")
            :format(i, k + 1, a, numeric), 2)
        end
      end
    end
  end
  return true
end

return M
