--- lutra.dist.tp.norm: the global quantities of a tensor-parallel model
-- that depend on which parameters are shards (lutra.dist.tp.records):
--   the gradient norm for clipping, each parameter counted once: a
--     shard's squares summed over the TP group, a replicated parameter's
--     (identical on every TP rank) counted once, not tp times; with ZeRO's
--     chunks over the DP group as well (global_norm);
--   check_replicated: replicated parameters bitwise identical on the TP
--     ranks, sharded ones of one shape;
--   check_dp_group: a DataParallel's or ZeRO's group is the data-parallel
--     group of a TP model (not the TP group, not the world);
--   check_same_batch: a TP group's ranks hold the same batch.
-- All of them are collectives: every rank of the job calls them in the
-- same order. Sums of squares are f64 (lt_grad_sum_squares, as
-- lt.optim.grad_norm's), one call per device, read on the host. (Below
-- lt.optim and DataParallel in the library's layers: it needs only the
-- optimizer base's argument arrays.)
local tensor = require "lutra.tensor"
local comm = require "lutra.dist.comm"
local capi = require "lutra.capi"
local base = require "lutra.optim.optimizer"
local records = require "lutra.dist.tp.records"
local autograd = require "lutra.autograd"
local ffi, C = capi.ffi, capi.C

local M = {}

-- the f64 sum of the squared entries of params' gradients (none: 0), one call per device
local function sum_squares(params)
  local by_dev, order = {}, {}
  for _, p in ipairs(params) do
    local g = p.grad
    if g ~= nil then
      local d = g.device
      if not by_dev[d] then by_dev[d] = {}; order[#order + 1] = d end
      by_dev[d][#by_dev[d] + 1] = g
    end
  end
  local total, out = 0, ffi.new("double[1]")
  for _, d in ipairs(order) do
    local gs = by_dev[d]
    if C.lt_grad_sum_squares(#gs, base.carray(gs, #gs), out) ~= 0 then base.fail(3) end
    total = total + out[0]
  end
  return total
end

--- norm.split_squares(params, sharded) -> s, r: this rank's sums of the
-- squared gradient entries (f64) of the params that are shards (keys of
-- sharded, records.sharded's table; or those with a true field
-- tp_sharded in the table sharded = {[param] = true}) and of the rest.
-- A parameter without a gradient counts as zero.
function M.split_squares(params, sharded)
  local a, b = {}, {}
  for _, p in ipairs(params) do
    if sharded[p] then a[#a + 1] = p else b[#b + 1] = p end
  end
  return sum_squares(a), sum_squares(b)
end

--- norm.global_norm(s, r, tp_group[, dp_group]) -> the L2 norm of the
-- whole model's gradient, from this rank's sums of squares of shards (s)
-- and of replicated parameters (r). Without dp_group the gradients are
-- whole over DP (DataParallel all-reduced them): s is summed over the TP
-- group (one all_reduce of one f64), r counted once. With dp_group (ZeRO:
-- each DP rank holds a chunk): {s, r} summed over the DP group first (one
-- all_reduce), then s over the TP group. Every rank gets the same norm.
function M.global_norm(s, r, tp, dp)
  if dp then
    local t = tensor.tensor({ s, r }, { dtype = "f64" })
    comm.all_reduce(t, { group = dp })
    local v = t:totable()
    s, r = v[1], v[2]
  end
  local t = tensor.tensor({ s }, { dtype = "f64" })
  comm.all_reduce(t, { group = tp })
  return math.sqrt(t:item() + r)
end

--- norm.grad_norm(params, sharded, tp_group) -> the global gradient norm
-- of params (lt.optim.grad_norm's, each parameter once) for gradients
-- whole over DP: split_squares, then global_norm without a DP group.
function M.grad_norm(params, sharded, tp)
  local s, r = M.split_squares(params, sharded)
  return M.global_norm(s, r, tp)
end

--- norm.pipeline_norm(params, sharded, tp_group, pp_group) -> the L2 norm
-- of the whole model's gradient for a model split into pipeline stages:
-- this stage's squares (each parameter once: under tensor parallelism the
-- shards' summed over tp_group, which may be nil, the replicated ones
-- once), summed over the pipeline's stages (one all_reduce of one f64).
-- params must leave out a copy counted on another stage (the last stage's
-- tied head). Gradients whole over DP (DataParallel reduced them).
function M.pipeline_norm(params, sharded, tp, pp)
  local sq
  if tp then
    local s, r = M.split_squares(params, sharded)
    local t = tensor.tensor({ s }, { dtype = "f64" })
    comm.all_reduce(t, { group = tp })
    sq = t:item() + r
  else
    sq = sum_squares(params)
  end
  return math.sqrt(M.sum_over(sq, pp))
end

--- norm.sum_over(x, g) -> the sum of the number x over the ranks of g (one
-- f64 all_reduce; x itself when g is nil).
function M.sum_over(x, g)
  if not g then return x end
  local t = tensor.tensor({ x }, { dtype = "f64" })
  comm.all_reduce(t, { group = g })
  return t:item()
end

-- the same numbers on every rank of g? all_reduce of {x..., -x...} with max
local function spread(xs, g)
  local n = #xs
  local v = {}
  for i = 1, n do v[i], v[n + i] = xs[i], -xs[i] end
  local t = tensor.tensor(v, { dtype = "f64" })
  comm.all_reduce(t, { op = "max", group = g })
  local out = t:totable()
  local hi, lo = {}, {}
  for i = 1, n do hi[i], lo[i] = out[i], -out[n + i] end
  return hi, lo
end

--- norm.check_dp_group(tp_group, group, who[, level = 2]): raises (on every
-- rank, naming who: "DataParallel", "Zero") unless group is a
-- data-parallel group of the tensor-parallel model whose group is
-- tp_group: every rank of group holds the same TP rank, and every rank of
-- tp_group the same rank in its group (lt.dist.mesh{dp =, tp =}.dp; when
-- dp = 1 a group of one rank). group nil stands for the world, which a
-- TP model's data parallelism never is. Three small all_reduces, the last
-- over the world so that every rank learns of a group wrong anywhere.
-- kind "pipeline": tp is a pipeline group (model.pp.group), the same check
-- for a pipeline's data parallelism (every rank of group at one stage), and
-- model_ranks (the ranks one replica spans, tp x pp) given: the group must
-- also hold world / model_ranks ranks (a smaller group, as mesh.tp of a
-- pipeline without TP, would leave the replicas unsynchronised).
function M.check_dp_group(tp, group, who, level, kind, model_ranks)
  local g = group
  if g == nil then g = comm.new_group(0) end -- (the world, as a group every rank makes)
  local hi1, lo1 = spread({ tp:rank() }, g)
  local hi2, lo2 = spread({ g:rank() }, tp)
  local bad = (hi1[1] ~= lo1[1] or hi2[1] ~= lo2[1]) and 1 or 0
  local world = comm.world_size()
  local short = model_ranks and g:size() * model_ranks ~= world and 1 or 0
  local t = tensor.tensor({ bad, short }, { dtype = "f64" })
  comm.all_reduce(t, { op = "max" })
  local v = t:totable()
  if v[1] == 0 and v[2] > 0 then
    error(("%s: the model's replicas span %d ranks (tp x pp) of the job's %d, so its data-parallel group holds %d ranks; "
      .. "the %s holds %d here: group = lt.dist.mesh{dp =, tp =, pp =}.dp"):format(who, model_ranks, world,
      world / model_ranks, group == nil and "group (the world)" or "group", g:size()), (level or 2) + 1)
  end
  if v[1] > 0 and kind == "pipeline" then
    error(("%s: the model is split into %d pipeline stages, and the %s (%d ranks) holds ranks of one pipeline "
      .. "group: data parallelism of a pipeline runs over the data-parallel group, group = "
      .. "lt.dist.mesh{dp =, pp = %d}.dp"):format(who, tp:size(), group == nil and "group (the world)" or "group",
      g:size(), tp:size()), (level or 2) + 1)
  end
  if v[1] > 0 then
    error(("%s: the model is tensor-parallel over %d ranks, and the %s (%d ranks) holds ranks of one tensor-parallel "
      .. "group: data parallelism of a TP model runs over the data-parallel group, "
      .. "group = lt.dist.mesh{dp =, tp = %d}.dp (a group of one rank when dp = 1)"):format(who, tp:size(), group == nil and "group (the world)" or "group",
      g:size(), tp:size()), (level or 2) + 1)
  end
end

--- tp.check_same_batch(group, x, y[, who = "train", what = "batches", same = what,
-- kind = "tensor-parallel"]): raises on every rank of the group "<who>: the
-- <kind> ranks read different <what>: each rank of a TP (or pipeline)
-- group must get the same <same> ..." unless every rank holds the same x and y (a
-- fingerprint: sums of the ids and of the ids weighted by position, f64,
-- and the sizes, compared by one all-reduce of max and -min). Under tensor
-- parallelism a TP group's ranks must compute on the same batch: the
-- forward's collectives pair up whatever the ranks hold, so a loader split
-- by the job's ranks instead of the data-parallel ones trains, or
-- evaluates, on nonsense without this check; so must a pipeline's stages
-- (kind "pipeline"), which share one batch stream.
function M.check_same_batch(g, x, y, who, what, same, kind)
  local function print_of(t)
    local f = t:reshape(-1):to { dtype = "f64", device = "cpu" }
    local pos = tensor.arange(f:numel(), { dtype = "f64" }) + 1
    return { f:sum():item(), (f * pos):sum():item() }
  end
  local a, b = print_of(x), print_of(y)
  local mine = { a[1], a[2], b[1], b[2], x:numel() }
  local hi = tensor.tensor(mine, { dtype = "f64" })
  local lo = tensor.tensor(mine, { dtype = "f64" }):neg()
  local both = tensor.cat({ hi, lo })
  comm.all_reduce(both, { op = "max", group = g })
  local v = both:totable()
  for i = 1, 5 do
    if v[i] ~= -v[i + 5] then
      error(("%s: the %s ranks read different %s: each rank of a %s group must get the same "
        .. "%s (split the data by data-parallel rank: lt.data.shards{rank = mesh.coords.dp, world = "
        .. "mesh.sizes.dp})"):format(who or "train", kind or "tensor-parallel", what or "batches",
        kind == "pipeline" and "pipeline" or "TP", same or what or "batches"), 0)
    end
  end
end

--- tp.check_replicated(model) -> true, or raises naming the first
-- replicated parameter (records: not a shard) whose values are not
-- bitwise the same on every rank of the model's TP group (all_reduce max
-- and min of each dtype's flat copy compared with this rank's, NaNs by
-- their count), or the first sharded one whose shape differs between the
-- ranks. True at once for a model that is not tensor-parallel. Every TP
-- rank calls it; every rank raises the same message. Parameters must hold
-- their data (ZeRO 3: opt:unshard() first). One all_reduce for the shapes
-- and three per dtype of replicated parameters.
function M.check_replicated(model)
  local tp = records.group(model)
  if not tp then return true end
  local sharded = records.sharded(model)
  local named = model:named_parameters()
  for _, np in ipairs(named) do
    if not np[2].has_data then
      error(("check_replicated: %s holds no data (ZeRO 3: call opt:unshard() first)"):format(np[1]), 2)
    end
  end
  -- the shards' shapes, in order
  local dims, which = {}, {}
  for _, np in ipairs(named) do
    if sharded[np[2]] then
      for _, s in ipairs(np[2]:shape()) do dims[#dims + 1], which[#which + 1] = s, np[1] end
    end
  end
  if #dims > 0 then
    local hi, lo = spread(dims, tp)
    for i = 1, #dims do
      if hi[i] ~= lo[i] then
        local shape = {}
        for j = 1, #dims do if which[j] == which[i] then shape[#shape + 1] = dims[j] end end
        error(("check_replicated: the shard %s differs in shape between the tensor-parallel ranks (here %s, a dim "
          .. "from %d to %d across them)"):format(which[i], table.concat(shape, "x"), lo[i], hi[i]), 2)
      end
    end
  end
  -- replicated values, one flat vector per dtype
  local by, order = {}, {}
  for _, np in ipairs(named) do
    local p = np[2]
    if not sharded[p] then
      local d = p.dtype
      if not by[d] then by[d] = {}; order[#order + 1] = d end
      by[d][#by[d] + 1] = np
    end
  end
  for _, d in ipairs(order) do
    local list, n = by[d], 0
    for _, np in ipairs(list) do n = n + np[2]:numel() end
    local mine = tensor.zeros({ n }, { dtype = d, device = list[1][2].device })
    autograd.no_grad(function()
      local off = 0
      for _, np in ipairs(list) do
        mine:narrow(1, off + 1, np[2]:numel()):copy_(np[2]:detach():reshape(-1))
        off = off + np[2]:numel()
      end
    end)
    local hi, lo = mine:clone(), mine:clone()
    comm.all_reduce(hi, { op = "max", group = tp })
    comm.all_reduce(lo, { op = "min", group = tp })
    local nan = mine:ne(mine):to("i32")
    comm.all_reduce(nan, { op = "sum", group = tp })
    -- an element differs: not NaN anywhere and max ~= min, or NaN on some ranks only (1 where it does)
    local differ = hi:ne(lo):to("f64") * nan:eq(0):to("f64") + nan:gt(0):to("f64") * nan:lt(tp:size()):to("f64")
    if differ:sum():item() > 0 then
      local off = 0
      for _, np in ipairs(list) do
        local k = np[2]:numel()
        local part = differ:narrow(1, off + 1, k)
        if part:sum():item() > 0 then
          local mask = part:to("cpu"):totable()
          for i = 1, k do
            if mask[i] ~= 0 then
              local a, b = hi:narrow(1, off + i, 1):to("f64"):item(), lo:narrow(1, off + i, 1):to("f64"):item()
              error(("check_replicated: the replicated parameter %s differs between the tensor-parallel ranks "
                .. "(element %d of %d: from %.17g to %.17g across them)"):format(np[1], i, k, b, a), 2)
            end
          end
        end
        off = off + k
      end
    end
  end
  return true
end

return M
