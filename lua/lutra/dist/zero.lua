--- lutra.dist.zero: ZeRO stages 1 and 2 (stage 3: lutra.dist.zero3) (Rajbhandari et al. 2020, "ZeRO:
-- Memory Optimizations Toward Training Trillion Parameter Models") as an
-- optimizer that lt.train drives like any other.
--
--   local ddp = lt.dist.DataParallel(model, { gradients = stage == 2 and "none" or "all_reduce" })
--   local opt = lt.dist.Zero(model, { stage = 1, optimizer = "AdamW", lr = 6e-4, weight_decay = 0.1 })
--   lt.train { model = model, optimizer = opt, ddp = ddp, ... }
--
-- The parameters of each group (weight decay on dims >= 2, as lt.optim) are
-- laid end to end in one flat vector; rank r owns chunk r of it
-- (lt.dist.chunk) and keeps the optimizer state (moments, f32 master
-- weights for bf16/f16) for that chunk alone: about 1/world of it per rank.
-- Stage 1: gradients arrive all-reduced (DataParallel) and each rank takes
-- its chunk. Stage 2: DataParallel does not reduce them; each rank
-- reduce-scatters the flat gradient and so holds only its chunk's sum.
-- Either way the rank updates its chunk and all_gather puts the updated
-- parameters back everywhere. Clipping uses the norm over all chunks.
--
-- A tensor-parallel model (lt.dist.tp: records.group(model)) is sharded
-- over its data-parallel group (group = lt.dist.mesh{dp =, tp =}.dp; the
-- TP group or the world is refused): each TP rank's ZeRO shards its own
-- slices. Shards and replicated parameters lie in separate flats, and the
-- gradient norm is the DP all_reduce of {shards' squares, replicated
-- squares}, then the shards' over the TP group (lt.dist.tp.norm): each
-- parameter counted once.
--
-- A model split into pipeline stages (model.pp) is sharded over its
-- data-parallel group stage by stage; the norm adds the stages' squares
-- over the pipeline group, the last stage's tied head (a copy of the
-- first's embedding, in a flat of its own) left out. Stage 3 is refused
-- with a pipeline (each micro-batch of the schedule would gather the
-- stage's parameters again; DeepSpeed refuses the pair too).
local tensor = require "lutra.tensor"
local autograd = require "lutra.autograd"
local comm = require "lutra.dist.comm"
local optim = require "lutra.optim"
local flat = require "lutra.dist.flat"
local zero3 = require "lutra.dist.zero3"
local records = require "lutra.dist.tp.records"
local tpnorm = require "lutra.dist.tp.norm"
local pipeline = require "lutra.models.pipeline"

local M = {}
local Zero = {}
Zero.__index = Zero

local flat_groups = flat.flat_groups
M.flat_groups = flat_groups

--- lt.dist.Zero(model, {stage = 1, 2 or 3, optimizer = "AdamW" or "SGD", group =,
-- units = (stage 3: the modules gathered one at a time), <the optimizer's
-- settings>}) -> an optimizer for lt.train (with lt.dist.DataParallel,
-- gradients = "all_reduce" for stage 1, "none" for 2 and 3). Stage 3 is
-- lutra.dist.zero3. Raises on another stage or optimizer, and (on every
-- rank) for a tensor-parallel model whose group is not its DP group.
function M.Zero(model, opts)
  opts = opts or {}
  local stage = opts.stage or 1
  if stage ~= 1 and stage ~= 2 and stage ~= 3 then
    error(("Zero: stage must be 1, 2 or 3, got %s"):format(tostring(stage)), 2)
  end
  local kind = opts.optimizer or "AdamW"
  if kind ~= "AdamW" and kind ~= "SGD" then error("Zero: optimizer must be AdamW or SGD, got " .. tostring(kind), 2) end
  if type(model) ~= "table" or type(model.parameters) ~= "function" then error("Zero: expects a model", 2) end
  comm.init()
  local settings = {}
  for k, v in pairs(opts) do
    if k ~= "stage" and k ~= "optimizer" and k ~= "group" and k ~= "units" then settings[k] = v end
  end
  local tp = records.group(model)
  if tp then tpnorm.check_dp_group(tp, opts.group, "Zero", 2) end
  if stage == 3 and model.pp then
    error("Zero: stage 3 with pipeline parallelism is not supported: each micro-batch of the schedule would gather "
      .. "every parameter of its stage again (DeepSpeed refuses the pair too); use stage 1 or 2", 2)
  end
  local pp = type(model) == "table" and rawget(model, "pp")
  if pp and pp.size > 1 then tpnorm.check_dp_group(pp.group, opts.group, "Zero", 2, "pipeline",
    pp.size * (tp and tp:size() or 1)) end
  if stage == 3 then return zero3.new(Zero, model, opts, settings, kind) end
  local group = opts.group
  local size = group and group:size() or comm.world_size()
  local rank = group and group:rank() or comm.rank()
  local self = setmetatable({ stage = stage, comm = group, params = model:parameters(), size = size, rank = rank,
    sharded = true, tp = tp, pp = model.pp and model.pp.group or nil }, Zero)
  local copy = model.pp and pipeline.copy(model)
  self.flats = flat_groups(self.params, settings.weight_decay or (kind == "AdamW" and 0.01 or 0), nil,
    tp and records.sharded(model) or nil, copy and { [copy] = true } or nil)
  local inner_groups = {}
  autograd.no_grad(function()
    for gi, f in ipairs(self.flats) do
      f.start, f.len = comm.chunk(f.numel, size, rank)
      -- this rank's chunk of the parameters, as one 1-D leaf the inner optimizer updates
      local flat = self:_flatten(f, function(p) return p end)
      f.shard = flat:narrow(1, f.start, math.max(f.len, 0)):clone():requires_grad_()
      inner_groups[gi] = { params = { f.shard }, weight_decay = f.weight_decay }
    end
  end)
  settings.weight_decay = nil
  self.inner = optim[kind](inner_groups, settings)
  self.groups = self.inner.groups
  self.kind = kind
  return self
end

-- one flat vector of f's params (values of get(p), zeros where it gives nil)
function Zero:_flatten(f, get)
  local flat = tensor.zeros({ f.numel }, { dtype = f.dtype, device = f.params[1].device })
  for k, p in ipairs(f.params) do
    local v = get(p)
    if v ~= nil then
      local part = flat:narrow(1, f.offsets[k] + 1, p:numel())
      part:copy_(v:reshape(-1))
      part:free() -- (a view holds the storage until the collector runs: the caller frees flat when done)
    end
  end
  return flat
end

--- opt:parameters() -> the model's parameters (lt.train reads devices from them).
function Zero:parameters() return self.params end

function Zero:zero_grad()
  for _, p in ipairs(self.params) do p.grad = nil end
  for _, f in ipairs(self.flats) do f.shard.grad = nil end
end

function Zero:set_lr(lr) self.inner:set_lr(lr) end

--- opt:reduce_gradients(): each rank's chunk of the summed gradient into
-- its shard (stage 1: a slice of the all-reduced gradient; stage 2: a
-- reduce_scatter of the local one). lt.train calls it before clipping.
function Zero:reduce_gradients()
  autograd.no_grad(function()
    for _, f in ipairs(self.flats) do
      local g = self:_flatten(f, function(p) return p.grad end)
      if self.stage == 2 then
        f.shard.grad = comm.reduce_scatter(g, { group = self.comm })
      else
        local mine = g:narrow(1, f.start, f.len)
        f.shard.grad = mine:clone()
        mine:free()
      end
      g:free() -- (now, not at the next collection: a flat of every gradient per group)
    end
  end)
  -- the full gradients are not needed any more: each rank keeps its chunk's
  for _, p in ipairs(self.params) do p.grad = nil end
  self.reduced = true
end

--- opt:clip_grad_norm(max_norm) -> the global gradient norm (over every
-- rank's chunk; under tensor parallelism every TP rank's slices too, each
-- parameter once: lt.dist.tp.norm.global_norm), scaling the chunks when
-- it is above max_norm (torch's factor, lt.optim.clip_scale).
function Zero:clip_grad_norm(max_norm)
  if not self.reduced then self:reduce_gradients() end
  local shards, counted = {}, {}
  for _, f in ipairs(self.flats) do
    shards[#shards + 1] = f.shard
    if not f.pp_copy then counted[#counted + 1] = f.shard end -- (a pipeline's tied copy: counted on the first stage)
  end
  local norm
  if self.tp then
    local is_shard = {}
    for _, f in ipairs(self.flats) do is_shard[f.shard] = f.tp_sharded or nil end
    local s, r = tpnorm.split_squares(counted, is_shard)
    norm = tpnorm.global_norm(s, r, self.tp, self.comm)
  else
    local mine = optim.grad_norm(counted) -- this rank's part, summed in f64
    local t = tensor.tensor({ mine * mine }, { dtype = "f64" })
    comm.all_reduce(t, { group = self.comm })
    norm = math.sqrt(t:item())
  end
  if self.pp then norm = math.sqrt(tpnorm.sum_over(norm * norm, self.pp)) end -- (every stage's squares)
  if max_norm and max_norm < math.huge and norm > max_norm and norm == norm then
    local scale = max_norm / (norm + 1e-6)
    autograd.no_grad(function()
      for _, s in ipairs(shards) do if s.grad ~= nil then s.grad:mul_(scale) end end
    end)
  end
  return norm
end

--- opt:step(): updates this rank's chunks, then all_gather writes every
-- chunk back into every rank's parameters.
function Zero:step()
  if not self.reduced then self:reduce_gradients() end
  self.inner:step()
  self.step_count = self.inner.step_count
  autograd.no_grad(function()
    for _, f in ipairs(self.flats) do
      local full = comm.all_gather(f.shard:detach(), { group = self.comm })
      for k, p in ipairs(f.params) do
        local part = full:narrow(1, f.offsets[k] + 1, p:numel())
        local shaped = part:view(p:shape())
        p:copy_(shaped)
        shaped:free()
        part:free()
      end
      full:free() -- (the whole flat of parameters goes now, not at the next collection)
    end
  end)
  self.reduced = false
end

--- opt:state_dict() / opt:check_state_dict(sd) / opt:load_state_dict(sd):
-- this rank's chunk of the state (lt.ckpt writes one file per rank).
function Zero:state_dict()
  local sd = self.inner:state_dict()
  sd.zero_stage, sd.zero_rank, sd.zero_world = self.stage, self.rank, self.size
  return sd
end
function Zero:check_state_dict(sd) return self.inner:check_state_dict(sd) end
function Zero:load_state_dict(sd)
  self.inner:load_state_dict(sd)
  self.step_count = self.inner.step_count
end

--- opt:after_load(): the chunks re-read from the parameters (after a checkpoint restored them).
function Zero:after_load()
  autograd.no_grad(function()
    for _, f in ipairs(self.flats) do
      local flat = self:_flatten(f, function(p) return p end)
      f.shard:copy_(flat:narrow(1, f.start, math.max(f.len, 0)))
    end
  end)
end

--- opt:state_bytes() -> bytes of optimizer state this rank holds (moments, masters).
function Zero:state_bytes()
  local n = 0
  for _, s in pairs(self.inner.state) do
    for _, t in pairs(s) do
      if type(t) ~= "boolean" then n = n + t:nbytes() end
    end
  end
  return n
end

--- opt:memory_bytes() -> {params =, grads =, optimizer =}: bytes this rank
-- holds now: the whole parameters; full gradients (until reduce_gradients
-- takes its chunk) and the chunk's; moments, masters and the chunk's copy
-- of the parameters that the inner optimizer updates.
function Zero:memory_bytes()
  local params, grads, optimizer = 0, 0, self:state_bytes()
  for _, p in ipairs(self.params) do
    params = params + p:nbytes()
    if p.grad ~= nil then grads = grads + p:nbytes() end
  end
  for _, f in ipairs(self.flats) do
    optimizer = optimizer + f.shard:nbytes()
    if f.shard.grad ~= nil then grads = grads + f.shard:nbytes() end
  end
  return { params = params, grads = grads, optimizer = optimizer }
end

return M
