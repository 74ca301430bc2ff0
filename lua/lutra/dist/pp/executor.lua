--- lutra.dist.pp.executor: runs a pipeline schedule (lutra.dist.pp.schedule:
-- each rank's list of forwards, backwards, sends and receives) for one
-- optimizer step of a model split into stages (lutra.models.pipeline), as
-- lt.train.step's micro-batch function.
--
-- Every rank of a pipeline reads the same micro-batches (the stages share
-- one batch stream): the first stage embeds the ids, the last computes the
-- summed token loss against the targets, divided by the step's counted
-- targets before its backward (so the gradients are those of one large
-- batch, as lt.train.step's own loop). A stage's input from the stage
-- before is a leaf that requires grad; its backward (output:backward with
-- the gradient the next stage sent) leaves the gradient to send back in
-- that leaf. The sends go out without waiting and the receives of the
-- next actions are posted ahead (prefetch), so a message that comes while
-- the stage computes finds its buffer (MPI delivers a small one at once; a
-- larger one moves inside the ranks' later MPI calls, among them the poll
-- of every transfer in flight before each forward and backward:
-- lutra.dist.pp.link's progress).
-- Activations are kept from a
-- forward to its backward only: at most the schedule's in-flight count
-- (1F1B: p - r on rank r; GPipe: m).
--
-- Dropout (a GPT-2 with dropout > 0, in training mode): every rank starts
-- from the same default generator, so stages drawing from it would draw
-- the same masks (stage 1's first blocks those of stage 0's embedding and
-- first block). Each virtual stage vs draws instead from its own Philox key,
-- seed + vs 2^32 (mod 2^53), at the step's offset, its forwards in schedule
-- order; after the step the default generator is the step's (seed, offset)
-- advanced by every stage's draws (one all_reduce over the pipeline group),
-- the same on every rank, so a checkpoint's generator (rank 0's) resumes
-- every stage. The masks are not one process's (whose stream runs through
-- the stages micro-batch by micro-batch); TP ranks of a stage draw alike.
--
--   local run = executor.new(model, { schedule = "1f1b" })
--   local S = lt.train.step.new { model = model, ..., micro_batches = run }
local schedule = require "lutra.dist.pp.schedule"
local pipeline = require "lutra.models.pipeline"
local random = require "lutra.random"
local tensor = require "lutra.tensor"
local comm = require "lutra.dist.comm"

local M = {}

local KINDS = { gpipe = true, ["1f1b"] = true, interleaved = true }

--- executor.make_schedule(kind, p, m, v) -> the schedule (lutra.dist.pp.schedule)
-- kind "gpipe", "1f1b" or "interleaved" builds for p stages, m
-- micro-batches, v chunks a rank. Raises naming the kind, or (from the
-- schedule) micro-batches that do not fit it; GPipe and 1F1B with v > 1
-- are refused (only the interleaved schedule runs several chunks a rank).
function M.make_schedule(kind, p, m, v)
  if not KINDS[kind] then
    error(("pipeline: schedule must be gpipe, 1f1b or interleaved, got %s"):format(tostring(kind)), 3)
  end
  if v > 1 and kind ~= "interleaved" then
    error(("pipeline: %d virtual stages a rank need the interleaved schedule (got %s)"):format(v, kind), 3)
  end
  if kind == "gpipe" then return schedule.gpipe(p, m) end
  if kind == "1f1b" then return schedule.one_f_one_b(p, m) end
  return schedule.interleaved(p, m, v)
end

--- executor.new(model, {schedule = "1f1b", prefetch = 2, micro_batches =}) -> run(S, xs, ys,
-- total) -> loss_sum, tokens: lt.train.step's micro-batch function for a
-- stage model (model.pp). loss_sum is this rank's share of the step's
-- summed token loss (the last stage's; 0 elsewhere) and tokens the inputs'
-- elements counted on the last stage (0 elsewhere): lt.train.step sums
-- both over the pipeline group. The schedule for #xs micro-batches is built
-- on the first step of that count and kept (micro_batches: built now, so
-- a count the schedule refuses raises here). prefetch: how many receives
-- ahead are posted. Under data parallelism no backward communicates
-- (ddp:set_sync(false)): the buckets all go at the step's end (ddp:finish).
function M.new(model, o)
  o = o or {}
  local P = model.pp
  if not P then error("pipeline executor: the model is not split into stages (lt.models.*{pp = group})", 2) end
  local kind = o.schedule or (P.chunks > 1 and "interleaved" or "1f1b")
  local cache = {}
  local m0 = o.micro_batches or (kind == "interleaved" and P.size or 1)
  cache[m0] = M.make_schedule(kind, P.size, m0, P.chunks) -- (the kind and count checked now)
  local prefetch = o.prefetch or 2
  return function(S, xs, ys, total)
    local m = #xs
    local sched = cache[m]
    if not sched then
      sched = M.make_schedule(kind, P.size, m, P.chunks)
      cache[m] = sched
    end
    if S.ddp then S.ddp:set_sync(false) end
    return M.run(model, sched.ranks[P.rank + 1], xs, ys, total,
      { ignore_index = S.ignore_index, prefetch = prefetch, device = S.device })
  end
end

--- executor.run(model, actions, xs, ys, total, {ignore_index, prefetch, device})
-- -> loss_sum, tokens: runs one rank's actions (see executor.new).
function M.run(model, actions, xs, ys, total, o)
  local P = model.pp
  local B, T = xs[1]:size(1), xs[1]:size(2)
  local L = pipeline.link(model, o.device)
  local last_vs = P.virtual - 1
  local chunk_of = {} -- virtual stage of each chunk
  for c = 1, P.chunks do chunk_of[c] = P.vstage[c] end
  local lo = { reduction = "sum", ignore_index = o.ignore_index, count = false }
  local saved, recvs, sums = {}, {}, nil
  local tokens = 0
  local function rkey(a) return a.op .. " " .. a.mb .. " " .. a.chunk end
  -- dropout: a stream per virtual stage (see the top of this file)
  local gen, base, streams = nil, nil, nil
  if model.training ~= false and ((model.config or {}).dropout or 0) > 0 then
    gen = random.default_generator()
    base, streams = gen:state(), {}
    for c = 1, P.chunks do streams[c] = { seed = (base.seed + P.vstage[c] * 2 ^ 32) % 2 ^ 53, offset = base.offset } end
  end
  -- receives posted ahead: for the next `prefetch` receive actions whose shapes are known
  local posted_to = 0
  local function post_ahead(i)
    local seen = 0
    for j = math.max(i, posted_to + 1), #actions do
      local a = actions[j]
      if a.op == "recv_fwd" or a.op == "recv_bwd" then
        seen = seen + 1
        if seen > o.prefetch then break end
        local dir, vs = a.op == "recv_fwd" and "fwd" or "bwd", chunk_of[a.chunk]
        if not recvs[rkey(a)] and L:knows(dir, vs, B, T) then recvs[rkey(a)] = L:recv(dir, vs, a.mb, B, T) end
        if recvs[rkey(a)] then posted_to = j end
      end
    end
  end
  local function received(a)
    local k = rkey(a)
    local r = recvs[k] or L:recv(a.op == "recv_fwd" and "fwd" or "bwd", chunk_of[a.chunk], a.mb, B, T)
    recvs[k] = nil
    return r:wait_value()
  end
  for i, a in ipairs(actions) do
    post_ahead(i)
    if a.op == "fwd" or a.op == "bwd" then L:progress() end -- (MPI moves data inside its calls only)
    local vs = chunk_of[a.chunk]
    local k = a.mb .. ":" .. a.chunk
    if a.op == "recv_fwd" then
      saved[k] = { input = received(a):requires_grad_() }
    elseif a.op == "fwd" then
      local s = saved[k] or {}
      saved[k] = s
      local input = vs == 0 and xs[a.mb] or s.input
      if gen then gen:set_state(streams[a.chunk]) end
      s.out = pipeline.stage_forward(model, a.chunk, input, ys[a.mb], lo, B, T)
      if gen then streams[a.chunk] = gen:state() end
      if vs == last_vs then
        local ld = s.out:detach():to("f64")
        sums = sums and sums + ld or ld
        tokens = tokens + xs[a.mb]:numel()
      end
    elseif a.op == "send_fwd" then
      L:send(saved[k].out, "fwd", vs + 1, a.mb, B, T)
    elseif a.op == "recv_bwd" then
      saved[k].grad = received(a)
    elseif a.op == "bwd" then
      local s = saved[k]
      if not s.out.requires_grad then
        -- (only the first stage's output can be without a graph: no parameter of it requires grad, and
        -- it has no input from a stage before; one process's backward stops there too)
      elseif vs == last_vs then
        -- (divided as lt.train.step's own loop divides; with no target counted, zero gradients still flow back)
        if total > 0 then (s.out / total):backward() else (s.out * 0):backward() end
      else
        s.out:backward(s.grad)
      end
      s.out, s.grad = nil, nil
      if vs == 0 then saved[k] = nil end
    elseif a.op == "send_bwd" then
      local s = saved[k]
      L:send(s.input.grad, "bwd", vs - 1, a.mb, B, T)
      saved[k] = nil
    end
  end
  L:finish()
  if gen then
    local drawn = 0
    for c = 1, P.chunks do drawn = drawn + (streams[c].offset - base.offset) end
    local t = tensor.tensor({ drawn }, { dtype = "f64" })
    comm.all_reduce(t, { group = P.group })
    gen:set_state { seed = base.seed, offset = base.offset + t:item() }
  end
  for j = 1, #xs do xs[j], ys[j] = nil, nil end
  return sums and sums:item() or 0, tokens
end

return M
