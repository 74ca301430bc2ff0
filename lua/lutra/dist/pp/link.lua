--- lutra.dist.pp.link: the messages between pipeline stages, activations
-- forward and their gradients backward, over a pipeline group's
-- asynchronous point to point (lt.dist.isend / irecv: the data alone).
--
-- Shapes are agreed once per run: the first message of each kind (the
-- direction, the virtual stage it goes to, the micro-batch's B x T) is
-- preceded by a small header (the dims and dtype), which the receiver
-- keeps; every later message of that kind is the bare data, received into
-- a buffer of that shape posted ahead of time. Each message has a tag of
-- its own (direction, target virtual stage, micro-batch), so receives
-- posted early match their sends in any order. A send does not wait for
-- its receiver; finish() waits for the sends still in flight (the end of
-- a step). MPI moves a message only inside MPI calls: one within MPI's
-- eager limit lands at once in the receive posted ahead, a larger one
-- while the two ranks are in later calls (progress(), which the executor
-- calls between its computations, their waits, the next sends and
-- receives, collectives), not while a stage computes. A tensor on a
-- device other than the CPU travels through a CPU copy (the NCCL path has
-- no point to point yet).
--
--   local L = link.new(group, chunks, device)
--   L:send(x, "fwd", vs + 1, mb, B, T)          -- to the rank holding virtual stage vs + 1
--   local h = L:recv("fwd", vs, mb, B, T)       -- posted now when the shape is known
--   local x = h:wait_value()                    -- on device
--   L:finish()
local tensor = require "lutra.tensor"
local comm = require "lutra.dist.comm"

local M = {}

local Link = {}
Link.__index = Link

local DTYPES = { "f32", "f64", "bf16", "f16" }
local CODE = { f32 = 1, f64 = 2, bf16 = 3, f16 = 4 }
local MAX_DIMS = 8
local TAG_LIMIT = 2 ^ 20 -- (lt.dist's isend / irecv tags)

--- link.new(group, chunks, device) -> a link for the pipeline group
-- (virtual stage vs lives on rank vs % size), chunks per rank, and the
-- device activations live on.
function M.new(g, chunks, device)
  return setmetatable({ g = g, p = g:size(), rank = g:rank(), S = g:size() * chunks, device = device or "cpu",
    sent = {}, shapes = {}, pending = {} }, Link)
end

local function dir_code(dir) return dir == "fwd" and 0 or 1 end

--- L:tag(kind, dir, vs, mb) -> the message's tag: kind (0 the shape
-- header, 1 the data) + 2 (direction (0 "fwd", 1 "bwd") + 2 (target
-- virtual stage vs + p v mb)). Raises when it reaches lt.dist's limit
-- (2^20), naming the micro-batches and virtual stages.
function Link:tag(kind, dir, vs, mb)
  local t = kind + 2 * (dir_code(dir) + 2 * (vs + self.S * mb))
  if t >= TAG_LIMIT then
    error(("pipeline: %d micro-batches x %d virtual stages is more messages than the tags tell apart (at most %d)")
      :format(mb, self.S, math.floor(TAG_LIMIT / (4 * self.S))), 3)
  end
  return t
end

local function key(dir, vs, B, T) return ("%s %d %dx%d"):format(dir, vs, B, T) end

--- L:send(t, dir, vs, mb, B, T): t (the output of virtual stage vs - 1 for
-- dir "fwd", or the gradient of stage vs + 1's input for "bwd") to the
-- rank holding virtual stage vs, without waiting; the first of its kind
-- after a header with its shape and dtype.
function Link:send(t, dir, vs, mb, B, T)
  local dst = vs % self.p
  local data = t:detach()
  if data.device ~= "cpu" then data = data:to("cpu") end
  data = data:contiguous()
  local k = key(dir, vs, B, T)
  if not self.sent[k] then
    local code = CODE[data.dtype]
    if not code or data:dim() > MAX_DIMS then
      error(("pipeline: a stage's %s message is %s with %d dims (f32, f64, bf16 or f16 with at most %d dims)")
        :format(dir == "fwd" and "activation" or "gradient", data.dtype, data:dim(), MAX_DIMS), 2)
    end
    local head = { data:dim() }
    for d = 1, MAX_DIMS do head[d + 1] = data:dim() >= d and data:size(d) or 0 end
    head[MAX_DIMS + 2] = code
    self.pending[#self.pending + 1] = comm.isend(tensor.tensor(head, { dtype = "i64" }), dst,
      { group = self.g, tag = self:tag(0, dir, vs, mb) })
    self.sent[k] = true
  end
  self.pending[#self.pending + 1] = comm.isend(data, dst, { group = self.g, tag = self:tag(1, dir, vs, mb) })
end

--- L:knows(dir, vs, B, T) -> whether this kind's shape came already (a
-- receive can be posted before it is needed).
function Link:knows(dir, vs, B, T) return self.shapes[key(dir, vs, B, T)] ~= nil end

local Recv = {}
Recv.__index = Recv

-- the receives posted and not yet waited for, held here: one that a failed
-- step leaves behind (its sender may never send, or wait on this rank) is
-- never collected, as the collection of its handle would wait for it
-- (lt_work_free completes a work first) and hang the rank on its way to
-- reporting the error
local posted = {}

--- L:recv(dir, vs, mb, B, T) -> a receive of the message for this rank's
-- virtual stage vs (dir "fwd": its input from stage vs - 1; "bwd": its
-- output's gradient from stage vs + 1), posted now when its shape is
-- known, else at wait_value() after the header. h:wait_value() -> the
-- tensor, on the link's device.
function Link:recv(dir, vs, mb, B, T)
  local src = (dir == "fwd" and vs - 1 or vs + 1) % self.p
  local r = setmetatable({ L = self, dir = dir, vs = vs, mb = mb, src = src, k = key(dir, vs, B, T) }, Recv)
  if self.shapes[r.k] then r:post() end
  return r
end

function Recv:post()
  local L, s = self.L, self.L.shapes[self.k]
  self.buf = tensor.empty(s.shape, { dtype = s.dtype })
  self.h = comm.irecv(self.buf, self.src, { group = L.g, tag = L:tag(1, self.dir, self.vs, self.mb) })
  posted[self] = true
end

function Recv:wait_value()
  local L = self.L
  if not self.h then
    if not L.shapes[self.k] then
      local head = comm.irecv(tensor.zeros({ MAX_DIMS + 2 }, { dtype = "i64" }), self.src,
        { group = L.g, tag = L:tag(0, self.dir, self.vs, self.mb) }):wait():totable()
      local shape = {}
      for d = 1, head[1] do shape[d] = head[d + 1] end
      L.shapes[self.k] = { shape = shape, dtype = DTYPES[head[MAX_DIMS + 2]] }
    end
    self:post()
  end
  local t = self.h:wait()
  self.h, posted[self] = nil, nil
  if L.device ~= "cpu" then t = t:to(L.device) end
  return t
end

--- L:progress(): one poll of every transfer of this link in flight (the
-- sends found complete are let go). MPI
-- moves a message's data only inside its calls (a large one needs the
-- receiver's too), so the executor polls between its actions: a message
-- then moves between one computation and the next, not only at the wait.
function Link:progress()
  -- (a send found complete is waited for and let go: its buffer is free now, not at the step's end)
  local pending, kept = self.pending, 0
  for i = 1, #pending do
    local h = pending[i]
    pending[i] = nil
    if h:test() then h:wait() else kept = kept + 1; pending[kept] = h end
  end
  for r in pairs(posted) do if r.L == self and r.h then r.h:test() end end
end

--- L:finish(): waits for every send still in flight (their buffers are then free).
function Link:finish()
  for i, h in ipairs(self.pending) do
    h:wait()
    self.pending[i] = nil
  end
end

return M
