--- lutra.train.step (lt.train.step): one optimizer step over micro-batches,
-- the piece of lt.train a custom loop or a pipeline schedule reuses.
--
--   local S = lt.train.step.new { model = m, optimizer = opt, accum = 4, clip = 1.0,
--     schedule = lt.optim.schedules.cosine { lr = 6e-4, warmup = 100, steps = 1000 } }
--   for step = 1, 1000 do
--     local r = S:run(step, function() return loader:next() end)
--     print(step, r.loss, r.grad_norm, r.lr)
--   end
--
-- A step takes `accum` micro-batches (x, y) from next_batch, counts the
-- targets that count (not ignore_index) over all of them first (under data
-- parallelism: over every rank's), and hands them to the micro-batch
-- function, which runs their forwards and backwards: each micro-batch's
-- summed token loss divided by that total is backpropagated, so the step's
-- loss is the mean over every counted token and its gradients those of one
-- large batch. Then the gradients are reduced (DataParallel in buckets
-- during the last backward; ZeRO's reduce_gradients), clipped by global
-- norm (lt.optim's optimizers take the clip's factor into their update,
-- opt:step{grad_scale}; a ZeRO optimizer clips its own chunks; others clip
-- the gradients), the schedule's rate is set for this optimizer step and
-- the optimizer steps. A step whose loss or gradient norm is not finite
-- raises (naming the step), or with skip_nonfinite is skipped: the
-- gradients are dropped and the schedule does not advance.
--
-- A tensor-parallel model (lt.dist.tp.records.group(model)) runs with a
-- DataParallel over its DP group (group = mesh.dp): counts and loss sums
-- are reduced over DP (its TP ranks hold the same batch and compute the
-- same loss), the gradient norm counts each parameter once (a shard's
-- squares summed over the TP group, a replicated one's once:
-- lt.dist.tp.norm; ZeRO's clip_grad_norm does the same over its chunks),
-- and the preemption signal is agreed by every rank of the job.
--
-- A model split into pipeline stages (model.pp, lt.models.*{pp = group})
-- runs its micro-batches through a schedule (lutra.dist.pp.executor;
-- pp_schedule = "1f1b", "gpipe" or "interleaved"): the loss sums and
-- token counts come from the last stage and are summed over the pipeline
-- group, the tied embedding's gradient is summed between the first and
-- last stage (model.pp.tied_group) after the data-parallel reduction and
-- before ZeRO's, and the gradient norm adds every stage's squares (the
-- tied weight's once).
--
-- The micro-batch function is the seam a pipeline schedule replaces:
-- micro_batches(S, xs, ys, total) -> loss_sum, tokens, where xs, ys are
-- the step's accum micro-batches (on S.device), total the step's counted
-- targets (the job's, under data parallelism: divide by it), loss_sum this
-- rank's summed token loss over them (a number) and tokens the inputs'
-- elements it ran. It runs the backward passes; it may set entries of xs,
-- ys to nil as it goes (to free them). The default is M.micro_batches.
local F = require "lutra.nn.functional"
local comm = require "lutra.dist.comm"
local tensor = require "lutra.tensor"
local autograd = require "lutra.autograd"
local optim = require "lutra.optim"
local runtime = require "lutra.runtime"
local C = require("lutra.capi").C
local records = require "lutra.dist.tp.records"
local tpnorm = require "lutra.dist.tp.norm"
local executor = require "lutra.dist.pp.executor"
local pipeline = require "lutra.models.pipeline"

local M = {}

local Step = {}
Step.__index = Step

--- The default micro-batch function: for each micro-batch k the model's
-- summed cross-entropy (model:loss(x, y, opts) where the model computes it
-- itself, model.loss_is_cross_entropy == model.loss as for lt.models' GPT-2
-- and Llama; else F.cross_entropy(model(x), y, opts)), divided by total and
-- backpropagated (with total 0, nothing is). Under data parallelism the
-- gradients are communicated during the last micro-batch's backward only
-- (ddp:set_sync). The losses add up where they are (an f64 tensor), read
-- once. Returns loss_sum (a number) and tokens (the inputs' elements).
function M.micro_batches(s, xs, ys, total)
  local model, ddp, accum = s.model, s.ddp, #xs
  local tokens, sums = 0, nil
  for k = 1, accum do
    if ddp then ddp:set_sync(k == accum) end -- no communication before the last micro-batch
    local lo = { reduction = "sum", ignore_index = s.ignore_index, count = false }
    local l = s.own_loss and model:loss(xs[k], ys[k], lo) or F.cross_entropy(model(xs[k]), ys[k], lo)
    if total > 0 then (l / total):backward() end
    -- the micro-batches' losses add up where they are; one read per step (a GPU syncs once)
    local ld = l:detach():to("f64")
    sums = sums and sums + ld or ld
    tokens = tokens + xs[k]:numel()
    xs[k], ys[k] = nil, nil
  end
  return sums:item(), tokens
end

local function whole(o, k, lo)
  local v = o[k]
  if type(v) ~= "number" or v ~= math.floor(v) or v < lo then
    error(("train.step: %s must be a whole number >= %d, got %s"):format(k, lo, tostring(v)), 3)
  end
end

--- lt.train.step.new{model =, optimizer =, accum = 1, clip = 0 (none), ignore_index = -100,
-- ddp = (an lt.dist.DataParallel), device = (the first parameter's), schedule = (a
-- function of the optimizer step -> lr), skip_nonfinite = false, micro_batches =
-- (M.micro_batches), optimizer_steps = 0 (the schedule's clock: optimizer steps taken)}
-- -> a Step. Raises on a missing model or optimizer, a bad accum, clip or
-- optimizer_steps, a tensor-parallel model whose group is not the whole job
-- without ddp. Fields a caller may read or set between steps:
-- optimizer_steps, skipped (steps skipped as not finite).
function M.new(o)
  if type(o) ~= "table" then error("train.step: expects a table of settings", 2) end
  if not o.model or not o.optimizer then error("train.step: model and optimizer are required", 2) end
  local s = setmetatable({}, Step)
  for k, v in pairs(o) do s[k] = v end
  s.accum = o.accum or 1
  s.clip = o.clip or 0
  s.ignore_index = o.ignore_index or -100
  s.optimizer_steps = o.optimizer_steps or 0
  s.skipped = 0
  whole(s, "accum", 1)
  whole(s, "optimizer_steps", 0)
  if type(s.clip) ~= "number" or s.clip < 0 then error("train.step: clip must be a number >= 0 (0: no clipping)", 2) end
  s.ddp = o.ddp or nil
  local model, opt = s.model, s.optimizer
  s.pp = model.pp
  if s.pp then
    if opt.stage == 3 then
      error("train.step: ZeRO stage 3 with pipeline parallelism is not supported (each micro-batch of the schedule "
        .. "would gather every parameter of the stage again); use ZeRO stage 1 or 2 over the data-parallel group", 2)
    end
    s.micro_batches = o.micro_batches or executor.new(model, { schedule = o.pp_schedule or nil, micro_batches = s.accum })
  else
    s.micro_batches = o.micro_batches or M.micro_batches
  end
  s.params = opt:parameters()
  s.device = o.device or (s.params[1] and s.params[1].device) or "cpu"
  -- the model computes its cross-entropy itself (lt.models: the head and the loss as one op)
  s.own_loss = model.loss ~= nil and model.loss_is_cross_entropy == model.loss
  -- a sharded optimizer (lt.dist.Zero) clips its own chunks by the norm over
  -- all ranks; lt.optim's optimizers take the clip's factor into their fused
  -- update (grad_scale: no pass that scales the gradients, no launch per parameter)
  s.grad_scale = 1
  local params = s.params
  -- tensor parallelism: each parameter counted once in the norm (the shards
  -- are those of the model's current tensors: made here, after model:to())
  local tp = records.group(model)
  local model_ranks = (tp and tp:size() or 1) * (s.pp and s.pp.size or 1)
  if model_ranks > 1 and not s.ddp and model_ranks < comm.world_size() then -- (else each data-parallel replica trains alone)
    local how = tp and s.pp and "tensor x pipeline parallel" or (tp and "tensor-parallel" or "pipeline-parallel")
    error(("train.step: the model is %s over %d of the job's %d ranks: its data-parallel replicas need "
      .. "ddp = lt.dist.DataParallel(model, {group = mesh.dp})"):format(how, model_ranks, comm.world_size()), 2)
  end
  local sharded = tp and records.sharded(model)
  -- the norm's parameters: a pipeline's last stage leaves out its copy of the tied weight (counted on the first)
  local norm_params = params
  local copy = s.pp and pipeline.copy(model)
  if copy then
    norm_params = {}
    for _, p in ipairs(params) do if p ~= copy then norm_params[#norm_params + 1] = p end end
  end
  local function grad_norm()
    if s.pp then return tpnorm.pipeline_norm(norm_params, sharded, tp, s.pp.group) end
    if tp then return tpnorm.grad_norm(params, sharded, tp) end
    return optim.grad_norm(params)
  end
  if opt.clip_grad_norm then
    s.clip_by = function(m) return opt:clip_grad_norm(m) end
  elseif optim.takes_grad_scale(opt) then
    s.clip_by = function(m)
      local norm = grad_norm()
      s.grad_scale = optim.clip_scale(norm, m)
      return norm
    end
  elseif tp or s.pp then -- (lt.optim.clip_grad_norm with the norm that counts each parameter once)
    s.clip_by = function(m)
      local norm = grad_norm()
      local scale = optim.clip_scale(norm, m)
      if scale ~= 1 then
        autograd.no_grad(function()
          for _, p in ipairs(params) do if p.grad ~= nil then p.grad:mul_(scale) end end
        end)
      end
      return norm
    end
  else
    s.clip_by = function(m) return optim.clip_grad_norm(params, m) end
  end
  return s
end

--- S:batches(next_batch) -> xs, ys, total: the step's accum micro-batches
-- from next_batch() (which returns x, y or raises), each moved to S.device,
-- and the count of targets other than ignore_index over all of them
-- (counted where the batch arrives: no device sync for it), summed over the
-- ranks under data parallelism.
function Step:batches(next_batch)
  local xs, ys, total = {}, {}, 0
  local device, ignore = self.device, self.ignore_index
  for k = 1, self.accum do
    local x, y = next_batch()
    total = total + y:ne(ignore):to("i64"):sum():item()
    if device ~= "cpu" then x, y = x:to(device), y:to(device) end
    xs[k], ys[k] = x, y
  end
  if not self.tp_batches_checked then self:check_tp_batches(xs[1], ys[1]) end
  if self.pp and not self.pp_batches_checked then
    self.pp_batches_checked = true
    tpnorm.check_same_batch(self.pp.group, xs[1], ys[1], "train", "batches", "micro-batches", "pipeline")
  end
  -- (every step: a shape that differs within the step or between the stages would hang a receive)
  if self.pp then pipeline.check_shapes(self.model, xs, ys, ("train: step %s"):format(self.step_number or "?")) end
  -- data parallel: every rank divides by the global batch's count, and the
  -- summed gradients are those of the global batch
  if self.ddp then total = self.ddp:reduce_number(total) end
  return xs, ys, total
end

--- S:check_tp_batches(x, y): under tensor parallelism (once, on the first
-- step) the ranks of the TP group must hold the same batch
-- (lt.dist.tp.check_same_batch: one all-reduce of a fingerprint). Raises
-- on every rank of the group "train: the tensor-parallel ranks read
-- different batches ..." when they differ (a loader split by the job's
-- ranks instead of the data-parallel ones).
function Step:check_tp_batches(x, y)
  self.tp_batches_checked = true
  local g = records.group(self.model)
  if g then tpnorm.check_same_batch(g, x, y, "train", "batches", "micro-batches") end
end

--- S:run(step, next_batch[, {keep_deferred = false}]) -> r: one optimizer
-- step (step: its number, for messages). r = {loss = (mean token loss of the
-- step, the job's), grad_norm = (before clipping, the whole model's; 0
-- when the loss is not finite), lr = (the rate used; nil for a skipped step), tokens = (input
-- elements, the job's), finite = (false: skipped), started =, finished =
-- (runtime.clock() at the start and after the update), seconds = (the
-- difference), signal = (under data parallelism: the job's preemption
-- signal agreed by every rank, 15, 10 or 0; nil otherwise)}.
-- From the finiteness check to the end of the update a Ctrl-C waits
-- (lt_interrupt_defer); with keep_deferred it keeps waiting after the
-- return, until the caller has recorded the step and calls
-- C.lt_interrupt_defer(0, nil) (lt.train does). Raises "train: step N: the
-- loss (or gradient norm) is not finite ..." unless skip_nonfinite, and
-- whatever next_batch, the micro-batch function or the optimizer raise.
function Step:run(step, next_batch, opts)
  local keep = opts and opts.keep_deferred
  local t0 = runtime.clock()
  local opt, ddp = self.optimizer, self.ddp
  self.step_number = step
  local xs, ys, total = self:batches(next_batch)
  opt:zero_grad()
  local loss_sum, tokens = self.micro_batches(self, xs, ys, total)
  local signal
  if ddp then
    ddp:finish()
    -- one all_reduce for the sums and for whether any rank was signalled
    -- (all ranks then stop after the same step); over a DP group (a
    -- tensor-parallel model's) the sums are the group's and the signal
    -- needs every rank of the job: a second all_reduce
    local sig = C.lt_preempt_signal()
    local f15, f10 = sig == 15 and 1 or 0, sig ~= 0 and sig ~= 15 and 1 or 0
    if ddp.group == nil then
      local sums = ddp:reduce_numbers { loss_sum, tokens, f15, f10 }
      loss_sum, tokens, f15, f10 = sums[1], sums[2], sums[3], sums[4]
    else
      local sums = ddp:reduce_numbers { loss_sum, tokens }
      local flags = ddp:reduce_job_numbers { f15, f10 }
      loss_sum, tokens, f15, f10 = sums[1], sums[2], flags[1], flags[2]
    end
    signal = f15 > 0 and 15 or (f10 > 0 and 10 or 0)
  end
  if self.pp then
    loss_sum, tokens = self:pipeline_sums(loss_sum, tokens)
    if not ddp then signal = self:job_signal() end
  end
  local loss = total > 0 and loss_sum / total or 0
  local norm, finite = 0, loss == loss and loss ~= math.huge and loss ~= -math.huge
  if self.pp and total == 0 then
    -- no target counted in the whole step: one process runs no backward and
    -- its optimizer skips every parameter; the schedule's zero gradients
    -- (its messages need them) are dropped so that the stages do the same
    opt:zero_grad()
  elseif self.pp and self.pp.tied_group then
    self:sum_tied_gradients()
  end
  -- a sharded optimizer (lt.dist.Zero) reduces its own chunks first
  if opt.reduce_gradients then opt:reduce_gradients() end
  if finite then
    norm = self.clip_by(self.clip > 0 and self.clip or math.huge)
    finite = norm == norm and norm ~= math.huge
  end
  -- from here to the step's record a Ctrl-C waits: an update is not left halfway
  C.lt_interrupt_defer(1, "the step's update")
  local ok, lr = pcall(self.update, self, step, finite, loss, norm)
  if not keep or not ok then C.lt_interrupt_defer(0, nil) end
  if not ok then error(lr, 0) end
  local now = runtime.clock()
  return { loss = loss, grad_norm = norm, lr = lr, tokens = tokens, finite = finite, started = t0, finished = now,
    seconds = now - t0, signal = signal }
end

--- S:pipeline_sums(loss_sum, tokens) -> the sums over the pipeline group
-- (the last stage's loss sum and token count: one all_reduce of two f64).
function Step:pipeline_sums(loss_sum, tokens)
  local t = tensor.tensor({ loss_sum, tokens }, { dtype = "f64" })
  comm.all_reduce(t, { group = self.pp.group })
  local v = t:totable()
  return v[1], v[2]
end

--- S:job_signal() -> the preemption signal of the whole job (15, 10 or 0),
-- for a pipeline without data parallelism (DataParallel agrees it otherwise).
function Step:job_signal()
  local sig = C.lt_preempt_signal()
  local t = tensor.tensor({ sig == 15 and 1 or 0, sig ~= 0 and sig ~= 15 and 1 or 0 }, { dtype = "f64" })
  comm.all_reduce(t)
  local v = t:totable()
  return v[1] > 0 and 15 or (v[2] > 0 and 10 or 0)
end

--- S:sum_tied_gradients(): the tied embedding's gradient summed between
-- the pipeline's first stage (the embedding's) and last (the head's), so
-- both copies take the same update (Megatron-LM's embedding group). A copy
-- without a gradient counts as zeros.
function Step:sum_tied_gradients()
  local P = self.pp
  local w = pipeline.tied(self.model)
  if not w then return end
  autograd.no_grad(function()
    if w.grad == nil then w.grad = tensor.zeros_like(w) end
    local g = w.grad:contiguous()
    comm.all_reduce(g, { group = P.tied_group })
    if g ~= w.grad then w.grad:copy_(g) end
  end)
end

--- S:update(step, finite, loss, norm) -> lr: the update after the
-- gradients are complete: for a finite step the schedule's rate for the
-- next optimizer step (S.optimizer_steps + 1), then opt:step (with the
-- clip's grad_scale where the optimizer takes one); for a step that is not
-- finite, raises (naming step, loss and norm) or, with skip_nonfinite,
-- drops the gradients and counts it in S.skipped (returns nil).
function Step:update(step, finite, loss, norm)
  local opt = self.optimizer
  if not finite then
    if not self.skip_nonfinite then
      error(("train: step %d: the %s is not finite (loss %s, gradient norm %s); lower the learning rate or set skip_nonfinite")
        :format(step, loss == loss and loss ~= math.huge and "gradient norm" or "loss", tostring(loss), tostring(norm)), 0)
    end
    self.skipped = self.skipped + 1
    opt:zero_grad()
    return nil
  end
  self.optimizer_steps = self.optimizer_steps + 1
  local lr
  if self.schedule then
    lr = self.schedule(self.optimizer_steps)
    opt:set_lr(lr)
  end
  if self.grad_scale ~= 1 then opt:step { grad_scale = self.grad_scale } else opt:step() end
  self.grad_scale = 1
  return lr or (opt.groups[1] and opt.groups[1].lr) or opt.lr -- (no group: a stage with no parameter to train)
end

M.Step = Step

return M
