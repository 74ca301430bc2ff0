--- lutra.dist.comm: processes and collectives (host/comm/comm.c), the part of
-- lt.dist below DataParallel and ZeRO (which use it). lutra.dist adds
-- DataParallel, Zero and tp to this same table and returns it: lt.dist is
-- this table.
--
--   lt.dist.init()                               -- MPI under mpirun, else one process
--   print(lt.dist.rank(), lt.dist.world_size())
--   lt.dist.all_reduce(grad, { op = "avg" })     -- in place; returns the tensor
--   local h = lt.dist.all_reduce(grad, { async = true }); ...; h:wait()
--   local whole = lt.dist.all_gather(shard)      -- ranks' tensors concatenated along dim 1
--   local mine = lt.dist.reduce_scatter(full)    -- this rank's chunk of the sum
--   local mesh = lt.dist.mesh { dp = 2, tp = 2 } -- groups, tensor-parallel ranks adjacent
--
-- Collectives take CPU tensors through MPI (any float dtype; bf16/f16 are
-- reduced in f32; i32, i64, u8) and CUDA tensors through NCCL (all_gather
-- and reduce_scatter with equal chunks there; not yet run on a GPU) and an optional {group = g} (default: every rank).
-- Semantics as torch.distributed. Every rank checks with the others that
-- they call the same collective with the same dtype and size, from the same
-- line of code (the file:line that calls lt.dist.<op>), and raises on all of
-- them when one differs (naming it, and for a call site every rank's, with
-- its callers): a collective that only some ranks call would otherwise pair
-- with the others' next one and hang. (Code that calls one collective from
-- two branches, `if rank == 0 then broadcast(a) else broadcast(b) end`,
-- must call it once after the branch.) An uncaught error on any rank
-- prints "[rank N] ..." and ends the job. A collective that waits past the
-- watchdog timeout (set_timeout, default 600 s) reports the ranks that never
-- arrived and aborts the job.
local cuda = require "lutra.cuda"
local capi = require "lutra.capi"
local C, ffi, fail = capi.C, capi.ffi, capi.fail
local tensor = require "lutra.tensor"

local M = {}

local set_call_site = require("lutra.core").set_call_site
local SITE_FRAMES = 4
--- The call site the next collective checks against the other ranks' and
-- reports (lt_comm_set_site): the caller of lt.dist.<op> as "file:line",
-- the same line on every rank (so a collective reached through different
-- callers still pairs, as DataParallel's bucket from a backward hook on one
-- rank and from finish() on another), and SITE_FRAMES - 1 frames beyond it
-- as context for messages.
local function set_site() set_call_site(3, SITE_FRAMES) end
-- (it stops a compiled trace; with the checks off, LUTRA_COMM_CHECK=0 read as C's atoi does, nothing to set)
local check_env = os.getenv("LUTRA_COMM_CHECK")
if check_env and check_env ~= "" and (tonumber(check_env:match("^%s*[-+]?%d+") or "0") or 0) == 0 then
  set_site = function() end
end

local OPS = { sum = 0, avg = 1, max = 2, min = 3 }
local work_box = ffi.new("lt_work*[1]")
local comm_box = ffi.new("lt_comm*[1]")

--- lt.dist.init(): joins the job (MPI_Init under mpirun) or stays a single
-- process; returns rank, world_size. Raises when mpirun started several
-- ranks of a lutra built without MPI. Safe to call more than once.
function M.init()
  if C.lt_dist_init() ~= 0 then fail(2) end
  return M.rank(), M.world_size()
end

local function need_init(op)
  if C.lt_dist_initialised() == 0 then
    if C.lt_dist_init() ~= 0 then fail(3) end
  end
end

--- This process's rank in the job (0-based), the job's size, and the rank among this node's processes.
function M.rank() return C.lt_dist_rank() end
function M.world_size() return C.lt_dist_world_size() end
function M.local_rank() return C.lt_dist_local_rank() end

--- The device this rank should use: cuda:<local_rank> when CUDA devices are present, else cpu.
function M.device()
  local n = cuda and cuda.device_count and cuda.device_count() or 0
  if n > 0 then return ("cuda:%d"):format(M.local_rank() % n) end
  return "cpu"
end

--- lt.dist.set_timeout(seconds): the watchdog's limit for one collective.
function M.set_timeout(seconds)
  if type(seconds) ~= "number" or not (seconds > 0) then error("set_timeout: seconds must be > 0", 2) end
  C.lt_comm_set_timeout(seconds)
end

local Group = {}
Group.__index = Group

local world_group
local function group_of(opts)
  local g = opts and opts.group
  if g == nil then
    if not world_group then world_group = setmetatable({ c = C.lt_comm_world() }, Group) end
    return world_group
  end
  if getmetatable(g) ~= Group then error("dist: group must be a group from lt.dist.new_group or lt.dist.mesh", 3) end
  return g
end

function Group:rank() return C.lt_comm_rank(self.c) end
function Group:size() return C.lt_comm_size(self.c) end
function Group:__tostring() return ("Group(%d of %d)"):format(self:rank(), self:size()) end

--- lt.dist.new_group(color[, key]): ranks passing the same color form a group
-- (MPI_Comm_split), ordered by key (default: the world rank). Every rank calls it.
function M.new_group(color, key)
  need_init()
  set_site()
  if type(color) ~= "number" or color < 0 or color ~= math.floor(color) then
    C.lt_comm_refuse(C.lt_comm_world()) -- the others learn of it in their split's agreement
    error("new_group: color must be a whole number >= 0", 2)
  end
  if C.lt_comm_split(C.lt_comm_world(), color, key or M.rank(), comm_box) ~= 0 then fail(2) end
  return setmetatable({ c = ffi.gc(comm_box[0], C.lt_comm_free) }, Group)
end

local Work = {}
Work.__index = Work
--- handle:wait() -> the collective's result (the tensor), once complete.
function Work:wait()
  if self.w ~= nil then
    local st = C.lt_work_wait(self.w)
    C.lt_work_free(ffi.gc(self.w, nil))
    self.w, self.input = nil, nil
    if st ~= 0 then fail(2) end
  end
  return self.result
end

--- handle:test() -> true when complete (one poll; it also moves the transfer along).
function Work:test()
  if self.w == nil then return true end
  return C.lt_work_test(self.w) ~= 0
end

local function finish(opts, result)
  if opts and opts.async then
    return setmetatable({ w = ffi.gc(work_box[0], C.lt_work_free), result = result }, Work)
  end
  return result
end

-- a bad argument on this rank: the group learns of it (lt_comm_refuse) so
-- that the other ranks fail naming this one instead of waiting, then raises
local function refuse(g, msg, level)
  C.lt_comm_refuse(g.c)
  error(msg, level + 1)
end

local function check_tensor(op, t, g)
  if not tensor.is_tensor(t) then refuse(g, ("%s: expected a tensor, got %s"):format(op, type(t)), 3) end
end

local function op_code(op, opts, g)
  local name = opts and opts.op or "sum"
  local code = OPS[name]
  if not code then refuse(g, ("%s: op must be sum, avg, max or min, got %s"):format(op, tostring(name)), 3) end
  return code
end

--- lt.dist.all_reduce(t[, {op = "sum"|"avg"|"max"|"min", group =, async = false}]) -> t (in place), or a handle.
function M.all_reduce(t, opts)
  need_init()
  set_site()
  local g = group_of(opts)
  check_tensor("all_reduce", t, g)
  if C.lt_comm_all_reduce(g.c, t, op_code("all_reduce", opts, g), opts and opts.async and work_box or nil) ~= 0 then
    fail(2)
  end
  return finish(opts, t)
end

--- lt.dist.broadcast(t[, {src = 0, group =, async =}]) -> t, rank src's values on every rank.
function M.broadcast(t, opts)
  need_init()
  set_site()
  local g = group_of(opts)
  check_tensor("broadcast", t, g)
  local src = opts and opts.src or 0
  if type(src) ~= "number" or src ~= math.floor(src) then refuse(g, "broadcast: src must be a whole rank number", 2) end
  if C.lt_comm_broadcast(g.c, t, src, opts and opts.async and work_box or nil) ~= 0 then fail(2) end
  return finish(opts, t)
end

--- lt.dist.all_gather(t[, {group =, out =, async = false}]) -> every rank's
-- t concatenated along dim 1 in rank order (ranks may pass different
-- lengths along dim 1; the other dims must agree), or a handle whose
-- wait() returns it. out: a contiguous tensor of t's dtype and device with
-- the result's number of elements to write into (as
-- torch.distributed.all_gather_into_tensor). The ranks first agree on the
-- lengths (a small blocking exchange); with async the data then moves in
-- the background on NCCL, while MPI completes it before returning.
function M.all_gather(t, opts)
  need_init()
  set_site()
  local g = group_of(opts)
  check_tensor("all_gather", t, g)
  local out = opts and opts.out
  if out ~= nil and not (tensor.is_tensor(out) and out:is_contiguous() and out.dtype == t.dtype
      and out.device == t.device) then
    refuse(g, ("all_gather: out must be a contiguous %s tensor on %s"):format(t.dtype, t.device), 2)
  end
  t = t:contiguous()
  local n = g:size()
  local counts = ffi.new("int64_t[?]", n)
  if C.lt_comm_all_gather_rows(g.c, t, counts) ~= 0 then fail(2) end
  local rows = 0
  for r = 0, n - 1 do rows = rows + tonumber(counts[r]) end
  local shape = t:dim() > 0 and t:shape() or { 1 }
  shape[1] = rows
  local need = rows
  for d = 2, #shape do need = need * shape[d] end
  local bad_out
  if out ~= nil and out:numel() ~= need then
    -- the ranks have agreed already: take part with a buffer of the right size, then raise
    bad_out = ("all_gather: out holds %d elements, the result needs %d"):format(out:numel(), need)
    out = nil
  end
  if out == nil then out = tensor.empty(shape, { dtype = t.dtype, device = t.device }) end
  if C.lt_comm_all_gather(g.c, out, t, counts, (opts and opts.async and not bad_out) and work_box or nil) ~= 0 then
    fail(2)
  end
  if bad_out then error(bad_out, 2) end
  local res = finish(opts, out)
  if opts and opts.async then res.input = t end -- kept alive until the wait
  return res
end

--- lt.dist.chunk(rows, size, rank) -> start (1-based), length: the rows of
-- chunk `rank` (0-based) when rows are split into size chunks, the first
-- rows % size one longer (torch.tensor_split).
function M.chunk(rows, size, rank)
  local function whole(v, lo, hi) return type(v) == "number" and v == math.floor(v) and v >= lo and v <= hi end
  if not whole(rows, 0, 2 ^ 62) or not whole(size, 1, 2 ^ 31) or not whole(rank, 0, size - 1) then
    error(("chunk: needs whole rows >= 0, size >= 1 and 0 <= rank < size, got %s, %s, %s"):format(tostring(rows),
      tostring(size), tostring(rank)), 2)
  end
  local s, l = ffi.new("int64_t[1]"), ffi.new("int64_t[1]")
  C.lt_comm_chunk(rows, size, rank, s, l)
  return tonumber(s[0]) + 1, tonumber(l[0])
end

--- lt.dist.reduce_scatter(t[, {op = "sum", group =, async = false}]) -> this
-- rank's chunk (lt.dist.chunk of t's dim-1 rows) of the reduction of every
-- rank's t, or a handle whose wait() returns it (t must then stay unchanged
-- until the wait; MPI completes it before returning, NCCL in the background).
function M.reduce_scatter(t, opts)
  need_init()
  set_site()
  local g = group_of(opts)
  check_tensor("reduce_scatter", t, g)
  local code = op_code("reduce_scatter", opts, g)
  t = t:contiguous()
  local rows = t:dim() > 0 and t:size(1) or 1
  local _, len = M.chunk(rows, g:size(), g:rank())
  local shape = t:dim() > 0 and t:shape() or { 1 }
  shape[1] = len
  local out = tensor.empty(shape, { dtype = t.dtype, device = t.device })
  if C.lt_comm_reduce_scatter(g.c, out, t, code, opts and opts.async and work_box or nil) ~= 0 then
    fail(2)
  end
  if opts and opts.async then
    local h = finish(opts, out)
    h.input = t -- kept alive until the wait
    return h
  end
  return out
end

--- lt.dist.barrier([{group =}]): waits until every rank of the group arrives.
function M.barrier(opts)
  need_init()
  set_site()
  if C.lt_comm_barrier(group_of(opts).c) ~= 0 then fail(2) end
end

--- lt.dist.first_error(ok, err) -> nil when ok on every rank of the job,
-- else the lowest failing rank's number and its message err (a string), on
-- every rank: so each rank can raise what went wrong and where, not "another
-- rank failed". Collective (every rank calls it, from the same line).
function M.first_error(ok, err)
  local world, rank = M.world_size(), M.rank()
  local who = tensor.tensor({ ok and world or rank }, { dtype = "i32" })
  M.all_reduce(who, { op = "min" })
  local bad = who:item()
  if bad >= world then return nil end
  local msg = bad == rank and tostring(err) or ""
  local len = tensor.tensor({ #msg }, { dtype = "i64" })
  M.broadcast(len, { src = bad })
  local bytes = {}
  for i = 1, len:item() do bytes[i] = rank == bad and msg:byte(i) or 0 end
  if #bytes == 0 then return bad, "" end
  local t = tensor.tensor(bytes, { dtype = "i32" })
  M.broadcast(t, { src = bad })
  local chars = {}
  for i, b in ipairs(t:totable()) do chars[i] = string.char(b) end
  return bad, table.concat(chars)
end

--- lt.dist.send(t, dst[, {group =}]) and lt.dist.recv(t, src[, {group =}]):
-- point to point; recv fills t, which must match what was sent (else an error naming both).
function M.send(t, dst, opts)
  if not tensor.is_tensor(t) then error(("send: expected a tensor, got %s"):format(type(t)), 2) end
  need_init()
  set_site()
  if C.lt_comm_send(group_of(opts).c, t:contiguous(), dst) ~= 0 then fail(2) end
end

function M.recv(t, src, opts)
  if not tensor.is_tensor(t) then error(("recv: expected a tensor, got %s"):format(type(t)), 2) end
  need_init()
  if not t:is_contiguous() then error("recv: the tensor must be contiguous", 2) end
  set_site()
  if C.lt_comm_recv(group_of(opts).c, t, src) ~= 0 then fail(2) end
  return t
end

--- lt.dist.isend(t, dst[, {group =, tag = 0}]) -> handle, and
-- lt.dist.irecv(t, src[, {group =, tag = 0}]) -> handle whose wait()
-- returns t filled: asynchronous point to point, the data alone (no
-- header, so no size exchange per message: the two ranks agree on t's
-- shape and dtype beforehand, and a message of another size fails the
-- irecv's wait naming both). Messages between two ranks match by tag
-- (0 <= tag < 2^20), so several may be in flight in any order. t must stay
-- unchanged (isend) or unread (irecv) until wait(); the handle keeps it
-- alive (a handle dropped without wait() completes when it is collected:
-- the collection waits for its peer). handle:test() polls. The watchdog covers the wait (a peer that
-- never comes is named). CPU tensors through MPI; a tensor on another
-- device raises unless its implementation has point to point.
function M.isend(t, dst, opts)
  if not tensor.is_tensor(t) then error(("isend: expected a tensor, got %s"):format(type(t)), 2) end
  need_init()
  set_site()
  t = t:contiguous()
  if C.lt_comm_isend(group_of(opts).c, t, dst, opts and opts.tag or 0, work_box) ~= 0 then fail(2) end
  local h = finish({ async = true }, t)
  h.input = t
  return h
end

function M.irecv(t, src, opts)
  if not tensor.is_tensor(t) then error(("irecv: expected a tensor, got %s"):format(type(t)), 2) end
  need_init()
  if not t:is_contiguous() then error("irecv: the tensor must be contiguous", 2) end
  set_site()
  if C.lt_comm_irecv(group_of(opts).c, t, src, opts and opts.tag or 0, work_box) ~= 0 then fail(2) end
  return finish({ async = true }, t)
end

--- lt.dist.mesh{dp =, tp = 1, pp = 1} -> {dp = group, tp = group, pp = group, coords = {dp =, tp =, pp =}}:
-- the world's ranks laid out as Megatron-LM orders them, tensor-parallel
-- ranks adjacent, then data parallel, then pipeline stages:
-- rank = tp_rank + tp * (dp_rank + dp * pp_rank). dp defaults to what the
-- others leave; the product must equal the world size.
function M.mesh(o)
  need_init()
  o = o or {}
  local world = M.world_size()
  local tp, pp = o.tp or 1, o.pp or 1
  for _, k in ipairs { "dp", "tp", "pp" } do
    local v = o[k]
    if v ~= nil and (type(v) ~= "number" or v < 1 or v ~= math.floor(v)) then
      error(("mesh: %s must be a whole number >= 1, got %s"):format(k, tostring(v)), 2)
    end
  end
  local dp = o.dp or world / (tp * pp)
  if not o.dp and dp ~= math.floor(dp) then -- (dp left to the others: say what does not divide, not a fraction)
    error(("mesh: tp %d x pp %d = %d ranks does not divide the job's %d ranks (dp is what they leave)"):format(tp, pp,
      tp * pp, world), 2)
  end
  if dp ~= math.floor(dp) or dp * tp * pp ~= world then
    error(("mesh: dp %s x tp %d x pp %d = %s, but the job has %d ranks"):format(tostring(o.dp or dp), tp, pp,
      tostring((o.dp or dp) * tp * pp), world), 2)
  end
  local r = M.rank()
  local t_rank, d_rank, p_rank = r % tp, math.floor(r / tp) % dp, math.floor(r / (tp * dp))
  -- every rank takes part in every split, in the same order
  local groups = {
    tp = M.new_group(d_rank + dp * p_rank, t_rank),
    dp = M.new_group(t_rank + tp * p_rank, d_rank),
    pp = M.new_group(t_rank + tp * d_rank, p_rank),
  }
  groups.coords = { dp = d_rank, tp = t_rank, pp = p_rank }
  groups.sizes = { dp = dp, tp = tp, pp = pp }
  return groups
end

--- lt.dist.memory_bytes(model, opt[, ddp]) -> {params =, grads =, optimizer =, buffers =, total =}:
-- bytes this rank holds now for the model's parameters (whole, or ZeRO-3
-- chunks), gradients (full and ZeRO chunks), the optimizer's state
-- (moments, f32 masters, ZeRO 1-2's chunk copies) and DataParallel's bucket
-- buffers; total is the sum of the first three. Counts tensors by their
-- elements (a tied weight once), not the allocator's caches.
function M.memory_bytes(model, opt, ddp)
  local r
  if opt and opt.memory_bytes then
    r = opt:memory_bytes()
  else
    r = { params = 0, grads = 0, optimizer = 0 }
    for _, p in ipairs(model:parameters()) do
      if p.has_data then r.params = r.params + p:nbytes() end
      if p.grad ~= nil then r.grads = r.grads + p.grad:nbytes() end
    end
    for _, s in pairs(opt and opt.state or {}) do
      for _, t in pairs(s) do if tensor.is_tensor(t) then r.optimizer = r.optimizer + t:nbytes() end end
    end
  end
  r.buffers = ddp and ddp:buffer_bytes() or 0
  r.total = r.params + r.grads + r.optimizer
  return r
end


return M
