--- lutra.dist.zero3: ZeRO stage 3 (Rajbhandari et al. 2020; PyTorch's
-- FullyShardedDataParallel does the same): parameters, gradients and
-- optimizer state all sharded, so each rank keeps about 1/world of each.
-- lt.dist.Zero(model, {stage = 3, ...}) builds it; lt.train drives it like
-- stages 1 and 2 (with DataParallel{gradients = "none"} for the loss sums).
--
-- Units: each child of the model's outermost ModuleLists (the transformer
-- blocks) is one unit and the model itself is the root unit, holding every
-- other parameter (embeddings, final norm, a tied head, and any parameter
-- shared between units). opts.units = {module, ...} chooses them instead.
-- A unit's parameters (per dtype and weight-decay group) lie end to end in a
-- flat vector padded to a multiple of the world size; rank r keeps chunk r
-- (equal chunks, as NCCL needs) as the leaf the inner optimizer updates,
-- and the parameters' own memory is dropped (t:drop_data_()).
--
-- Around every forward of a unit its chunks are all-gathered into the
-- parameters, and dropped again after it (the root's stay until its
-- backward). The outputs pass through lt.autograd.hook, whose backward
-- gathers the unit again before the unit's own backward runs.
-- When every parameter of a unit has its gradient (gradient-ready hooks),
-- the unit's flat gradient is reduce-scattered (units strictly in reverse
-- forward order, the same on every rank), its parameters and full
-- gradients are dropped, and the chunk's sum adds into the shard's
-- gradient, micro-batch after micro-batch. While unit k runs, the gather of
-- the unit after it (forward) or before it (backward) is already issued,
-- in the order recorded on the first forward (the prefetch; over MPI the
-- collectives complete when issued, over NCCL they overlap compute).
--
-- opt.stats counts gathers, prefetches (gathers issued a unit ahead) and
-- reduce_scatters, and the bytes of whole parameters held now and at most
-- (param_bytes, peak_param_bytes).
--
-- A tensor-parallel model is sharded over its DP group (lutra.dist.zero
-- checks the group): each unit's TP slices are what its flats hold, shards
-- and replicated parameters in flats apart (for the gradient norm).
--
-- opt:unshard() gathers every parameter and keeps them (evaluation,
-- sampling, checkpoints, export); opt:reshard() drops them again. Every
-- rank must take part in each forward, backward, unshard and reshard.
local tensor = require "lutra.tensor"
local autograd = require "lutra.autograd"
local comm = require "lutra.dist.comm"
local nn = require "lutra.nn"
local optim = require "lutra.optim"
local flat = require "lutra.dist.flat"
local records = require "lutra.dist.tp.records"

local M = {}

-- the default units: children of the outermost ModuleLists
local function default_units(model)
  local out = {}
  local function walk(m)
    for _, c in ipairs(m:children()) do
      if c.__name == "ModuleList" then
        for _, u in ipairs(c:children()) do out[#out + 1] = u end
      else
        walk(c)
      end
    end
  end
  walk(model)
  return out
end

--- Builds the stage-3 optimizer (called by lt.dist.Zero); base is Zero's
-- class, whose set_lr, clip_grad_norm, state_dict, load_state_dict and
-- state_bytes work on the shards unchanged.
function M.new(base, model, opts, settings, kind)
  if rawget(model, "_zero3") then
    error("Zero: this model is already sharded by another ZeRO-3 optimizer (make one per model)", 3)
  end
  local group = opts.group
  local size = group and group:size() or comm.world_size()
  local rank = group and group:rank() or comm.rank()
  local class = setmetatable({}, { __index = base })
  class.__index = class
  for k, v in pairs(M.methods) do class[k] = v end
  local self = setmetatable({ stage = 3, comm = group, params = model:parameters(), size = size, rank = rank,
    sharded = true, tp = records.group(model), model = model, full = false, order = {}, recording = true, pending = {},
    stats = { gathers = 0, prefetches = 0, reduce_scatters = 0, param_bytes = 0, peak_param_bytes = 0 } }, class)

  -- units and the parameters each owns
  local modules = opts.units or default_units(model)
  if nn.is_module(modules) then -- a ModuleList: its children
    if modules.__name ~= "ModuleList" then
      error("Zero: units must be a list of modules (or a ModuleList), got the module " .. modules:path(), 3)
    end
    modules = modules:children()
  end
  if type(modules) ~= "table" then error("Zero: units must be a list of modules", 3) end
  local in_model, seen = {}, {}
  for _, p in ipairs(self.params) do in_model[p] = true end
  local owner = {} -- param -> unit index (0: the root)
  for i, m in ipairs(modules) do
    if not nn.is_module(m) then error(("Zero: units[%d] is not a module"):format(i), 3) end
    if seen[m] then error(("Zero: units[%d] (%s) is listed twice"):format(i, m:path()), 3) end
    seen[m] = true
    for _, p in ipairs(m:parameters()) do
      if not in_model[p] then
        error(("Zero: units[%d] (%s) holds a parameter the model does not"):format(i, m:path()), 3)
      end
      if owner[p] ~= nil and owner[p] ~= i then owner[p] = 0 else owner[p] = i end -- shared: the root's
    end
  end
  local lists = { [0] = {} }
  for i = 1, #modules do lists[i] = {} end
  for _, p in ipairs(self.params) do table.insert(lists[owner[p] or 0], p) end
  self.units = {}
  local wd = settings.weight_decay or (kind == "AdamW" and 0.01 or 0)
  -- a tensor-parallel model: its shards and replicated parameters in flats apart (the norm counts them apart)
  local tp_sharded = self.tp and records.sharded(model) or nil
  for i = 0, #modules do
    if #lists[i] > 0 or i == 0 then
      local u = { module = i == 0 and model or modules[i], params = lists[i], root = i == 0,
        name = i == 0 and "model" or modules[i]:path(), gathered = true, ready = 0, nready = 0 }
      u.flats = flat.flat_groups(u.params, wd, size, tp_sharded)
      u.bytes = 0
      for _, p in ipairs(u.params) do u.bytes = u.bytes + p:nbytes() end
      self.stats.param_bytes = self.stats.param_bytes + u.bytes
      self.units[#self.units + 1] = u
    end
  end

  -- rank 0's values everywhere, then each rank keeps its chunks and drops the rest
  self.flats = {}
  local inner_groups = {}
  autograd.no_grad(function()
    for _, p in ipairs(self.params) do
      local buf = p:contiguous()
      comm.broadcast(buf, { src = 0, group = group })
      if buf ~= p then p:copy_(buf) end
    end
    for _, u in ipairs(self.units) do
      for _, f in ipairs(u.flats) do
        local flat = tensor.zeros({ f.padded }, { dtype = f.dtype, device = f.device })
        -- (each view holds the storage too: all are freed now, or a model's
        -- worth of device memory would wait for Lua's collector)
        for k, p in ipairs(f.params) do
          local part = flat:narrow(1, f.offsets[k] + 1, p:numel())
          part:copy_(p:reshape(-1))
          part:free()
        end
        local mine = flat:narrow(1, rank * f.chunk + 1, f.chunk)
        f.shard = mine:clone()
        mine:free()
        flat:free()
        if not f.frozen then
          f.shard:requires_grad_()
          self.flats[#self.flats + 1] = f
          inner_groups[#inner_groups + 1] = { params = { f.shard }, weight_decay = f.weight_decay }
        end
      end
      self:_drop(u)
    end
  end)
  self.stats.peak_param_bytes = self.stats.param_bytes
  settings.weight_decay = nil
  self.inner = optim[kind](inner_groups, settings)
  self.groups = self.inner.groups
  self.kind = kind

  self.identity = {} -- per unit: passes its outputs through and gathers it before its backward
  for _, u in ipairs(self.units) do
    self:_wrap(u)
    for _, p in ipairs(u.params) do
      if p.requires_grad then
        -- (weakly: autograd's registry keeps a hook while its tensor lives, and
        -- a strong self or u kept the parameters and this optimizer alive for good)
        local ref = setmetatable({ self, u }, { __mode = "v" })
        p:register_hook(function()
          local z, v = ref[1], ref[2]
          if z and v then z:_param_ready(v) end
        end)
        u.nready = u.nready + 1
      end
    end
    self.identity[u] = autograd.hook(function() self:_pre_backward(u) end)
  end
  self.root = self.units[1]
  return self
end

M.methods = {}
local Z = M.methods

-- ---- gathering and dropping ----------------------------------------------------------------

-- issues the all_gather of u's chunks (async; NCCL overlaps it)
function Z:_launch_gather(u)
  if u.gathered or u.gathering then return end
  u.gathering = {}
  for _, f in ipairs(u.flats) do
    local full = tensor.empty({ f.padded }, { dtype = f.dtype, device = f.device })
    u.gathering[#u.gathering + 1] = comm.all_gather(f.shard:detach(), { group = self.comm, out = full, async = true })
  end
end

-- waits for u's gather and puts the values into its parameters
function Z:_gather(u)
  if u.gathered then return end
  self:_launch_gather(u)
  autograd.no_grad(function()
    for i, f in ipairs(u.flats) do
      local full = u.gathering[i]:wait()
      for k, p in ipairs(f.params) do
        local part = full:narrow(1, f.offsets[k] + 1, p:numel())
        p:restore_data_(part)
        part:free()
      end
      full:free() -- now, not at Lua's next garbage collection
    end
  end)
  u.gathering, u.gathered = nil, true
  local st = self.stats
  st.gathers = st.gathers + 1
  st.param_bytes = st.param_bytes + u.bytes
  st.peak_param_bytes = math.max(st.peak_param_bytes, st.param_bytes)
end

function Z:_drop(u)
  if not u.gathered or self.full then return end
  for _, p in ipairs(u.params) do p:drop_data_() end
  u.gathered = false
  self.stats.param_bytes = self.stats.param_bytes - u.bytes
end

-- issues u's gather ahead of its use
function Z:_prefetch(u)
  if not u or u.gathered or u.gathering then return end
  self.stats.prefetches = self.stats.prefetches + 1
  self:_launch_gather(u)
end

-- the unit recorded after (step 1) or before (step -1) u, if any
function Z:_neighbour(u, step)
  if not u.pos then return nil end
  local v = self.order[u.pos + step]
  if v and not v.root then return v end
end

-- ---- forward and backward hooks ------------------------------------------------------------------

function Z:_wrap(u)
  local m = u.module
  if rawget(m, "_zero3") then
    error(("Zero: %s is already sharded by another ZeRO-3 optimizer (make one per model)"):format(m:path()), 4)
  end
  rawset(m, "_zero3", self)
  local forward = m.forward
  -- fn(mod, ...) run as the unit's forward: gathered around it, its
  -- outputs through the unit's identity (so their backward gathers it again)
  local function around(fn, mod, ...)
    self:_pre_forward(u)
    local outs = { fn(mod, ...) }
    local n = table.maxn(outs)
    -- outputs that need gradients pass through the unit's identity
    if autograd.is_grad_enabled() then
      local idx, ins = {}, {}
      for i = 1, n do
        local o = outs[i]
        if tensor.is_tensor(o) and o.requires_grad and #ins < 4 then
          idx[#idx + 1], ins[#ins + 1] = i, o
        end
      end
      if #ins > 0 then
        local wrapped = { self.identity[u](unpack(ins)) }
        for j, i in ipairs(idx) do outs[i] = wrapped[j] end
      end
    end
    self:_post_forward(u)
    return unpack(outs, 1, n)
  end
  -- (it passes arguments and results through: nn.fuses looks through it to
  -- the forward it wraps, and a model's loss runs its fused head inside it)
  rawset(m, "_wrapped_forward", forward)
  rawset(m, "_zero3_around", around)
  rawset(m, "forward", function(mod, ...) return around(forward, mod, ...) end)
end

function Z:_pre_forward(u)
  if u.root then
    self:_flush() -- a backward before this forward: complete its reductions
    self.backward_started = false
  end
  if self.recording then
    if u.root and #self.order > 0 then self.recording = false
    else
      u.pos = #self.order + 1
      self.order[u.pos] = u
    end
  end
  self:_gather(u)
  self:_prefetch(u.root and self.order[2] or self:_neighbour(u, 1))
end

function Z:_post_forward(u)
  if u.root then
    if #self.order > 1 then self.recording = false end
    if not autograd.is_grad_enabled() then self:_drop(u) end -- else kept until its backward
  else
    self:_drop(u)
  end
end

function Z:_pre_backward(u)
  self.backward_started = true
  self:_gather(u)
  self:_prefetch(self:_neighbour(u, -1))
end

function Z:_param_ready(u)
  u.ready = u.ready + 1
  if u.ready == u.nready then
    u.complete = true
    self:_launch_ready()
  end
end

-- reduce-scatters launch in reverse forward order on every rank, whatever
-- order the units complete in (as DataParallel's buckets)
function Z:_reverse_order()
  if self.reverse and #self.reverse == #self.units then return self.reverse end
  local r, seen = {}, {}
  for i = #self.order, 1, -1 do
    local u = self.order[i]
    if not u.root then r[#r + 1], seen[u] = u, true end
  end
  for i = #self.units, 1, -1 do -- units not run in the recorded forward, then the root
    local u = self.units[i]
    if not u.root and not seen[u] then r[#r + 1] = u end
  end
  r[#r + 1] = self.root
  self.reverse = r
  return r
end

function Z:_launch_ready()
  local order = self:_reverse_order()
  local k = self.next_rs or 1
  while order[k] and order[k].complete do
    self:_reduce_scatter(order[k])
    k = k + 1
  end
  if k > #order then -- every unit of this backward went out: the next backward starts again
    k = 1
    self.backward_started = false
  end
  self.next_rs = k
end

-- u's gradients (zeros where none) reduce-scattered into the pending list;
-- then u's parameters and their full gradients are dropped
function Z:_reduce_scatter(u)
  local grads = {}
  autograd.no_grad(function()
    for _, f in ipairs(u.flats) do
      if f.frozen then goto next_flat end
      local g = tensor.zeros({ f.padded }, { dtype = f.dtype, device = f.device })
      for k, p in ipairs(f.params) do
        local gr = p.grad
        if gr ~= nil then
          local dst, src = g:narrow(1, f.offsets[k] + 1, p:numel()), gr:reshape(-1)
          dst:copy_(src)
          dst:free()
          src:free()
          grads[#grads + 1] = gr
        end
      end
      self.pending[#self.pending + 1] = { f = f, input = g,
        handle = comm.reduce_scatter(g, { group = self.comm, async = true }) }
      self.stats.reduce_scatters = self.stats.reduce_scatters + 1
      ::next_flat::
    end
  end)
  for _, p in ipairs(u.params) do p.grad = nil end
  -- the full gradients' memory goes now, not at Lua's next garbage collection
  for _, gr in ipairs(grads) do gr:free() end
  u.ready, u.complete = 0, false
  self:_drop(u)
end

-- after a backward: the units that did not complete (unused parameters)
-- reduce-scatter too, in order, and every chunk's sum adds into its shard
function Z:_flush()
  if self.backward_started then
    local order = self:_reverse_order()
    for k = self.next_rs or 1, #order do self:_reduce_scatter(order[k]) end
    self.next_rs = 1
    self.backward_started = false
  end
  self:_collect()
end

-- every pending reduce_scatter's chunk added into its shard's gradient
function Z:_collect()
  autograd.no_grad(function()
    for _, e in ipairs(self.pending) do
      local part = e.handle:wait()
      e.handle.input = nil
      e.input:free()
      if e.f.shard.grad == nil then e.f.shard.grad = part else
        e.f.shard.grad:add_(part)
        part:free()
      end
    end
  end)
  self.pending = {}
end

-- ---- the optimizer's interface --------------------------------------------------------------------

--- opt:reduce_gradients(): completes the reductions of the last backward
-- (lt.train calls it before clipping).
function Z:reduce_gradients()
  self:_flush()
  if not self.root.gathered or self.full then return end
  self:_drop(self.root)
end

--- opt:zero_grad(): clears every gradient, those of a backward still being
-- reduced included (its collectives complete; their sums are discarded).
function Z:zero_grad()
  for _, e in ipairs(self.pending) do
    e.handle:wait():free()
    e.handle.input = nil
    e.input:free()
  end
  self.pending = {}
  for _, p in ipairs(self.params) do p.grad = nil end
  for _, f in ipairs(self.flats) do f.shard.grad = nil end
  for _, u in ipairs(self.units) do u.ready, u.complete = 0, false end
  self.next_rs, self.backward_started = 1, false
end

-- no unit gathered and no gather in flight (their values predate an update)
function Z:_drop_all()
  for _, u in ipairs(self.units) do
    if u.gathering then
      for _, h in ipairs(u.gathering) do h:wait() end
      u.gathering = nil
    end
    self:_drop(u)
  end
end

--- opt:step(): updates this rank's chunks; the parameters are gathered
-- from them at the next forward.
function Z:step()
  self:_flush()
  self.inner:step()
  self.step_count = self.inner.step_count
  -- whatever is gathered now (a forward without backward, one that raised,
  -- a prefetch) holds the old values
  local full = self.full
  self.full = false
  self:_drop_all()
  if full then self:unshard() end -- parameters kept whole: refreshed
end

--- opt:unshard(): every parameter gathered and kept whole until
-- opt:reshard() (evaluation, sampling, saving, export). Every rank calls it.
function Z:unshard()
  for _, u in ipairs(self.units) do self:_gather(u) end
  self.full = true
end

--- opt:reshard(): the parameters' memory dropped again (each rank keeps its chunks).
function Z:reshard()
  self.full = false
  self:_drop_all()
end

--- opt:after_load(): the chunks re-read from the parameters (whole, after
-- unshard) that a checkpoint restored.
function Z:after_load()
  autograd.no_grad(function()
    for _, f in ipairs(self.flats) do
      local flat = tensor.zeros({ f.padded }, { dtype = f.dtype, device = f.device })
      for k, p in ipairs(f.params) do flat:narrow(1, f.offsets[k] + 1, p:numel()):copy_(p:reshape(-1)) end
      f.shard:copy_(flat:narrow(1, self.rank * f.chunk + 1, f.chunk))
    end
  end)
end

--- opt:memory_bytes() -> {params =, grads =, optimizer =}: bytes this rank
-- holds now: parameters whole or as chunks, gradients (full and chunks),
-- optimizer state (moments, f32 masters).
function Z:memory_bytes()
  local params, grads = 0, 0
  for _, p in ipairs(self.params) do
    if p.has_data then params = params + p:nbytes() end
    local g = p.grad
    if g ~= nil then grads = grads + g:nbytes() end
  end
  for _, f in ipairs(self.flats) do
    params = params + f.shard:nbytes()
    local g = f.shard.grad
    if g ~= nil then grads = grads + g:nbytes() end
  end
  return { params = params, grads = grads, optimizer = self:state_bytes() }
end

return M
