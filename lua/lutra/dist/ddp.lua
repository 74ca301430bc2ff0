--- lutra.dist.ddp: data parallelism (lt.dist.DataParallel), as PyTorch's
-- DistributedDataParallel does it: the same model on every rank, each rank
-- a different slice of the global batch, gradients summed over ranks.
--
--   local ddp = lt.dist.DataParallel(model, { bucket_mb = 25 })  -- broadcasts rank 0's weights
--   ddp:set_sync(false) ... backward ...   -- micro-batches before the last: no communication
--   ddp:set_sync(true)  ... backward ...   -- buckets all-reduce as their gradients complete
--   ddp:finish()                           -- waits, and leaves the summed gradients in p.grad
--
-- lt.train does all of this when given ddp = ... (with the token counts and
-- the logged loss reduced over ranks, so the loss is the single-process
-- loss of the global batch). Parameters are grouped into buckets of about
-- bucket_mb MiB in reverse order (the order backward completes them); when
-- every gradient of a bucket is complete (a gradient-ready hook), the
-- bucket is copied into one flat buffer and all-reduced asynchronously while
-- backward goes on. The sum is what is reduced: each rank divides its loss
-- by the global token count itself. MPI progresses the transfers when it is
-- called, so each hook also polls the buckets in flight.
--
-- A tensor-parallel model (lt.dist.tp) takes group = its data-parallel
-- group, lt.dist.mesh{dp =, tp =}.dp (a group of one rank when dp = 1):
-- the TP ranks of a DP rank hold the same batch and different slices, so
-- gradients, token counts and loss sums are reduced over DP only; the TP
-- group or the world is refused on every rank.
local tensor = require "lutra.tensor"
local autograd = require "lutra.autograd"
local comm = require "lutra.dist.comm"
local records = require "lutra.dist.tp.records"
local tpnorm = require "lutra.dist.tp.norm"

local M = {}
local DDP = {}
DDP.__index = DDP

--- lt.dist.DataParallel(model or params, {bucket_mb = 25, group = world, broadcast = true,
-- gradients = "all_reduce" or "none"}) -> ddp ("none": the optimizer reduces
-- them, as lt.dist.Zero's stage 2 does with reduce_scatter). For a
-- tensor-parallel model, group must be its DP group (else an error on
-- every rank, lt.dist.tp.check_dp_group).
function M.DataParallel(what, opts)
  opts = opts or {}
  local params = type(what) == "table" and what.parameters and what:parameters() or what
  if type(params) ~= "table" or #params == 0 then
    error("DataParallel: expects a model or a list of parameters", 2)
  end
  local tp = type(what) == "table" and what.parameters and records.group(what) or nil
  if tp then tpnorm.check_dp_group(tp, opts.group, "DataParallel", 2) end
  local pp = type(what) == "table" and rawget(what, "pp")
  if pp and pp.size > 1 then tpnorm.check_dp_group(pp.group, opts.group, "DataParallel", 2, "pipeline",
    pp.size * (tp and tp:size() or 1)) end
  local bucket_mb = opts.bucket_mb or 25
  if type(bucket_mb) ~= "number" or not (bucket_mb > 0) then error("DataParallel: bucket_mb must be > 0", 2) end
  local mode = opts.gradients or "all_reduce"
  if mode ~= "all_reduce" and mode ~= "none" then
    error("DataParallel: gradients must be \"all_reduce\" or \"none\" (a ZeRO-2 optimizer reduces them)", 2)
  end
  local self = setmetatable({ params = params, group = opts.group, tp = tp, sync = true, buckets = {}, marked = {},
    stats = { launched = 0, bytes = 0 }, reduce = mode == "all_reduce" }, DDP)
  comm.init()
  -- the same starting weights everywhere: rank 0's
  if opts.broadcast ~= false then
    autograd.no_grad(function()
      for _, p in ipairs(params) do
        -- (a ZeRO-3 parameter has no data of its own: Zero broadcast it already)
        if p.has_data then
          local buf = p:contiguous()
          comm.broadcast(buf, { src = 0, group = opts.group })
          if buf ~= p then p:copy_(buf) end
        end
      end
    end)
  end
  -- buckets in reverse order, one dtype each; frozen parameters (no
  -- gradient) are broadcast above but take no part in the reduction
  local limit = bucket_mb * 2 ^ 20
  local cur
  local trainable = {}
  for _, p in ipairs(params) do if p.requires_grad then trainable[#trainable + 1] = p end end
  -- (a group of one rank, as the data-parallel group of a tensor-parallel job with dp = 1: the
  -- gradients are the sums already; no buckets, no buffers, no all-reduce)
  local alone = (opts.group and opts.group:size() or comm.world_size()) == 1
  for i = alone and 0 or #trainable, 1, -1 do
    local p = trainable[i]
    local bytes = p:nbytes()
    if not cur or cur.dtype ~= p.dtype or cur.device ~= p.device or (cur.bytes > 0 and cur.bytes + bytes > limit) then
      cur = { params = {}, offsets = {}, numel = 0, bytes = 0, dtype = p.dtype, device = p.device, ready = 0 }
      self.buckets[#self.buckets + 1] = cur
    end
    cur.params[#cur.params + 1] = p
    cur.offsets[#cur.offsets + 1] = cur.numel
    cur.numel = cur.numel + p:numel()
    cur.bytes = cur.bytes + bytes
  end
  self.bucket_of = {}
  for _, b in ipairs(self.buckets) do
    -- the flat buffer a bucket is reduced in (none when the optimizer reduces: ZeRO 2 and 3)
    if self.reduce then b.flat = tensor.zeros({ b.numel }, { dtype = b.dtype, device = b.params[1].device }) end
    for _, p in ipairs(b.params) do self.bucket_of[p] = b end
  end
  -- (the hooks reach this DataParallel and their parameter through a weak
  -- table: autograd's registry keeps a hook as long as its tensor lives, so
  -- a hook holding either strongly kept the parameters, their buckets and
  -- this object alive for good, each through the other, after the last
  -- reference to the model and the DataParallel went)
  local ref = setmetatable({ self }, { __mode = "v" })
  for _, p in ipairs(alone and {} or trainable) do
    local mine = setmetatable({ p }, { __mode = "v" })
    p:register_hook(function()
      local d, q = ref[1], mine[1]
      if d and q then d:_ready(q) end
    end)
  end
  return self
end

function DDP:_launch(b)
  autograd.no_grad(function()
    for k, p in ipairs(b.params) do
      local view = b.flat:narrow(1, b.offsets[k] + 1, p:numel())
      if p.grad ~= nil then view:copy_(p.grad:reshape(-1)) else view:zero_() end
    end
  end)
  b.handle = comm.all_reduce(b.flat, { async = true, group = self.group })
  self.stats.launched = self.stats.launched + 1
  self.stats.bytes = self.stats.bytes + b.bytes
end

-- buckets go out strictly in order (as PyTorch's DDP does), so every rank
-- launches the same sequence even when its gradients complete in another
-- order (a parameter unused on one rank): bucket k waits for k - 1
function DDP:_launch_ready()
  local k = self.next_launch or 1
  while self.buckets[k] and self.buckets[k].ready == #self.buckets[k].params do
    self:_launch(self.buckets[k])
    k = k + 1
  end
  self.next_launch = k
end

function DDP:_ready(p)
  if not self.sync or not self.reduce then return end
  -- a second backward before finish (retain_graph, or two losses): its
  -- gradients add to the first's, so finish reduces every bucket again
  if self.marked[p] then
    self.again = true
    return
  end
  self.marked[p] = true
  local b = self.bucket_of[p]
  b.ready = b.ready + 1
  self:_launch_ready()
  for _, other in ipairs(self.buckets) do
    if other.handle then other.handle:test() end
  end
end

--- ddp:set_sync(on): whether the coming backward communicates (off for the
-- micro-batches before the last of an optimizer step).
function DDP:set_sync(on) self.sync = on and true or false end

--- ddp:finish(): after the synchronising backward: launches buckets whose
-- gradients did not all arrive (unused parameters count as zeros, so every
-- rank joins every bucket), waits for all, and writes the summed gradients
-- into each parameter's grad.
function DDP:finish()
  if not self.reduce then return end
  if self.again then -- the buckets launched so far hold the first backward's part: discard, launch all anew
    for k = 1, (self.next_launch or 1) - 1 do self.buckets[k].handle:wait() end
    self.next_launch, self.again = 1, false
  end
  for k = self.next_launch or 1, #self.buckets do self:_launch(self.buckets[k]) end -- in order, gradients or not
  self.next_launch, self.marked = 1, {}
  autograd.no_grad(function()
    for _, b in ipairs(self.buckets) do
      b.handle:wait()
      b.handle, b.ready = nil, 0
      for k, p in ipairs(b.params) do
        local view = b.flat:narrow(1, b.offsets[k] + 1, p:numel()):view(p:shape())
        if p.grad ~= nil then p.grad:copy_(view) else p.grad = view:clone() end
      end
    end
  end)
end

--- ddp:buffer_bytes() -> bytes of the buckets' flat buffers (0 with gradients = "none").
function DDP:buffer_bytes()
  local n = 0
  for _, b in ipairs(self.buckets) do if b.flat then n = n + b.bytes end end
  return n
end

--- ddp:reduce_number(x) -> the sum of x over the ranks (token counts, loss sums).
function DDP:reduce_number(x) return self:reduce_numbers({ x })[1] end

--- ddp:reduce_numbers({x1, x2, ...}) -> {sums}: several sums in one all_reduce (f64).
function DDP:reduce_numbers(xs)
  local t = tensor.tensor(xs, { dtype = "f64" })
  comm.all_reduce(t, { group = self.group })
  return t:totable()
end

--- ddp:reduce_job_numbers({x1, ...}[, op = "sum"]) -> {sums}: the same over
-- every rank of the job, not only the DP group (what all ranks must agree
-- on: a preemption signal, whether rank 0 could open the metrics). Over a
-- DataParallel of the world it is reduce_numbers' all_reduce.
function DDP:reduce_job_numbers(xs, op)
  local t = tensor.tensor(xs, { dtype = "f64" })
  comm.all_reduce(t, { op = op or "sum" })
  return t:totable()
end

return M
