--- lutra.dist.tp.regions: the conjugate operators that move activations and
-- their gradients in and out of a tensor-parallel region (Shoeybi et al.
-- 2019, "Megatron-LM", section 3: f and g), their sequence-parallel forms
-- (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
-- Transformer Models", section 4.2.2: g becomes reduce-scatter, f becomes
-- all-gather), and the slicing helper the layers shard weights with.
--
-- A group is a process group of lt.dist (lt.dist.mesh{tp = n}.tp, or
-- lt.dist.new_group); every rank of it calls the same functions in the same
-- order, as for any collective.
--
-- Sequence-parallel tensors are split by rows: the leading dims flattened
-- (B x T tokens for a (B, T, C) activation), rank r holding rows
-- r*N/n .. (r+1)*N/n of the (N, C) matrix. Norms, dropout and the residual
-- adds act per token, so any split of the tokens serves; this one keeps
-- each rank's slice contiguous and all_gather's rank order puts it back
-- whole. N must divide by the group's size.
local tensor = require "lutra.tensor"
local autograd = require "lutra.autograd"
local comm = require "lutra.dist.comm"
local random = require "lutra.random"

local M = {}

--- regions.stats: what lt.dist.tp has communicated since
-- regions.reset_stats(): {[op] = {calls =, bytes =}} for op "all_reduce",
-- "all_gather", "reduce_scatter". bytes counts each message at its whole
-- size, as Megatron-LM's papers count them (Korthikanti et al. 2022, 4.2.2:
-- an all-reduce of a (b, s, h) activation is b s h elements; an all-gather
-- the gathered tensor; a reduce-scatter the tensor reduced), in the
-- tensors' dtype; what a ring moves per rank is 2 (n-1)/n of it for an
-- all-reduce and (n-1)/n for the others.
M.stats = {}

--- regions.reset_stats(): counts from zero.
function M.reset_stats()
  for _, op in ipairs { "all_reduce", "all_gather", "reduce_scatter" } do M.stats[op] = { calls = 0, bytes = 0 } end
end
M.reset_stats()

--- regions.count(op, bytes): one message of op ("all_reduce", ...) of that whole size, into regions.stats.
function M.count(op, bytes)
  local s = M.stats[op]
  s.calls, s.bytes = s.calls + 1, s.bytes + bytes
end
local count = M.count

--- regions.check_group(what, g): raises "<what>: expected a process
-- group ..." at the caller's caller when g is not one.
function M.check_group(what, g)
  if type(g) ~= "table" or type(g.size) ~= "function" then
    error(what .. ": expected a process group (lt.dist.mesh{...}.tp or lt.dist.new_group), got " .. tostring(g), 3)
  end
end
local check_group = M.check_group

--- regions.shard(t, dim, g, what, noun[, parts = 1]) -> this rank's 1/n of
-- t along dim (n the group's size), a contiguous copy (its own storage). With parts > 1 the dim is
-- parts stacked segments (GPT-2's c_attn rows: q, k, v) and the rank takes
-- its 1/n of each, in order (so rank r's q, k and v heads match). Errors
-- when the dim's size (of a segment) does not divide, as "<what>: " ..
-- noun:format(size) .. " not divide by the tensor-parallel group's n ranks"
-- at the caller's caller (noun e.g. "%d output features do").
function M.shard(t, dim, g, what, noun, parts)
  parts = parts or 1
  local n, c = g:size(), t:size(dim)
  if c % (n * parts) ~= 0 then
    local seg = c % parts == 0 and c / parts or c
    error(("%s: " .. noun .. " not divide by the tensor-parallel group's %d ranks"):format(what, seg, n), 3)
  end
  local seg = c / parts
  local k = seg / n
  -- (a copy: a narrow along dim 1 is contiguous already, and contiguous() would
  -- keep the whole tensor's storage alive under the shard, which ZeRO 3 refuses)
  if parts == 1 then return t:narrow(dim, g:rank() * k + 1, k):clone() end
  local pieces = {}
  for s = 0, parts - 1 do pieces[#pieces + 1] = t:narrow(dim, s * seg + g:rank() * k + 1, k) end
  return tensor.cat(pieces, dim):contiguous()
end
local shard = M.shard
local LAST = "the last dim (%d) does"

--- f: identity forward, all-reduce (sum over the group) of the gradient
-- backward. Megatron's copy_to_tensor_model_parallel_region: the input of a
-- column-parallel layer, which every rank reads whole.
local copy_fn = autograd.Function {
  forward = function(ctx, x, g)
    ctx.group = g
    return x -- (handed out as an alias in the graph: no copy)
  end,
  backward = function(ctx, dy)
    count("all_reduce", dy:nbytes())
    return comm.all_reduce(dy:contiguous(), { group = ctx.group })
  end,
}
--- regions.copy_to_region(x, group) -> x (f above); x of any shape. Also
-- what a replicated parameter used on a slice of the data (a norm's gain
-- under sequence parallelism) passes through, so its gradient is the sum
-- over the group's slices.
function M.copy_to_region(x, g)
  check_group("copy_to_region", g)
  return copy_fn(x, g)
end

--- g: all-reduce (sum) forward, identity backward. Megatron's
-- reduce_from_tensor_model_parallel_region: the partial outputs of a
-- row-parallel layer summed.
local reduce_fn = autograd.Function {
  forward = function(_, x, g)
    count("all_reduce", x:nbytes())
    return comm.all_reduce(x:contiguous(), { group = g })
  end,
  backward = function(_, dy) return dy end,
}
--- regions.reduce_from_region(x, group) -> the sum of x over the group's ranks.
function M.reduce_from_region(x, g)
  check_group("reduce_from_region", g)
  return reduce_fn(x, g)
end

--- all-gather along the last dim forward, this rank's slice backward
-- (Megatron's gather_from_tensor_model_parallel_region).
local gather_fn = autograd.Function {
  forward = function(ctx, x, g)
    ctx.group = g
    -- all_gather concatenates along dim 1, rank after rank: cut and put side by side
    count("all_gather", x:nbytes() * g:size())
    local all = comm.all_gather(x:contiguous(), { group = g })
    local rows, parts = x:size(1), {}
    for r = 0, g:size() - 1 do parts[#parts + 1] = all:narrow(1, r * rows + 1, rows) end
    return tensor.cat(parts, -1)
  end,
  backward = function(ctx, dy) return shard(dy, -1, ctx.group, "gather_from_region", LAST) end,
}
--- regions.gather_from_region(x, group) -> (..., C * n): the ranks' x side by
-- side along the last dim, rank order.
function M.gather_from_region(x, g)
  check_group("gather_from_region", g)
  if x:dim() < 1 then error("gather_from_region: x has no dims", 2) end
  return gather_fn(x, g)
end

--- this rank's slice along the last dim forward, all-gather backward
-- (Megatron's scatter_to_tensor_model_parallel_region).
local scatter_fn = autograd.Function {
  forward = function(ctx, x, g)
    ctx.group = g
    return shard(x, -1, g, "scatter_to_region", LAST)
  end,
  backward = function(ctx, dy) return M.gather_from_region(dy, ctx.group):detach() end,
}
--- regions.scatter_to_region(x, group) -> (..., C / n): this rank's slice.
function M.scatter_to_region(x, g)
  check_group("scatter_to_region", g)
  return scatter_fn(x, g)
end

-- ---- sequence parallelism: rows (the leading dims flattened) ----------------

-- (N, C) rows of x (leading dims flattened), checked to divide by the group
local function rows_of(x, g, what)
  if x:dim() < 1 then error(what .. ": x has no dims", 3) end
  local C = x:size(x:dim())
  local N = x:numel() / math.max(C, 1)
  if N % g:size() ~= 0 then
    error(("%s: %d tokens (the leading dims of %s) do not divide by the tensor-parallel group's %d ranks")
      :format(what, N, tostring(x:shape()), g:size()), 3)
  end
  return x:contiguous():view(N, C)
end

local gather_rows_fn = autograd.Function {
  forward = function(ctx, x, g)
    ctx.group = g
    count("all_gather", x:nbytes() * g:size())
    return comm.all_gather(x, { group = g })
  end,
  backward = function(ctx, dy)
    count("reduce_scatter", dy:nbytes())
    return comm.reduce_scatter(dy:contiguous(), { group = ctx.group })
  end,
}
--- regions.gather_rows(x, group) -> (N * n, C): the ranks' row slices (N, C)
-- whole, rank order; backward reduce-scatters the gradient (the partial
-- gradients of the column-parallel layers that read it summed, each rank
-- keeping its rows). Sequence parallelism's f (Korthikanti et al. 2022).
-- x: (N, C) or any (..., C), flattened to rows.
function M.gather_rows(x, g)
  check_group("gather_rows", g)
  if x:dim() < 1 then error("gather_rows: x has no dims", 2) end
  local C = x:size(x:dim())
  return gather_rows_fn(x:contiguous():view(-1, C), g)
end

local reduce_scatter_rows_fn = autograd.Function {
  forward = function(ctx, x, g)
    ctx.group = g
    count("reduce_scatter", x:nbytes())
    return comm.reduce_scatter(x, { group = g })
  end,
  backward = function(ctx, dy)
    count("all_gather", dy:nbytes() * ctx.group:size())
    return comm.all_gather(dy:contiguous(), { group = ctx.group })
  end,
}
--- regions.reduce_scatter_rows(x, group) -> (N / n, C): this rank's rows of
-- the sum of x over the group (x (..., C), N rows when flattened, N
-- dividing by n); backward all-gathers the gradient. Sequence
-- parallelism's g: a row-parallel layer's partial outputs summed and split.
function M.reduce_scatter_rows(x, g)
  check_group("reduce_scatter_rows", g)
  return reduce_scatter_rows_fn(rows_of(x, g, "reduce_scatter_rows"), g)
end

local scatter_rows_fn = autograd.Function {
  forward = function(ctx, x, g)
    ctx.group = g
    local k = x:size(1) / g:size()
    return x:narrow(1, g:rank() * k + 1, k):contiguous()
  end,
  backward = function(ctx, dy)
    count("all_gather", dy:nbytes() * ctx.group:size())
    return comm.all_gather(dy:contiguous(), { group = ctx.group })
  end,
}
--- regions.scatter_rows(x, group) -> (N / n, C): this rank's rows of a
-- tensor every rank holds whole (x (..., C), N rows flattened, dividing by
-- n); backward all-gathers the gradient. Where a replicated activation
-- enters a sequence-parallel region.
function M.scatter_rows(x, g)
  check_group("scatter_rows", g)
  return scatter_rows_fn(rows_of(x, g, "scatter_rows"), g)
end

--- regions.dropout_rows(x, p, group[, {training = true, generator =}]) ->
-- F.dropout of this rank's rows x (N/n, ...) of a sequence-parallel
-- activation, with this rank's part of the mask one process draws for the
-- whole (N, ...) tensor: every rank draws from the same generator state
-- (the default one, or opts.generator, equal on the group's ranks as
-- lt.manual_seed leaves them) at its rows' counters, and every rank's
-- generator then advances past the whole mask. So the ranks' rows get
-- independent masks (not the same one n times), the generator stays in
-- step on the group as outside the region, and a model's dropout under
-- sequence parallelism is one process's. (Philox counters: element i of a
-- draw takes word i % 4 of counter offset + i / 4, host/lutra.h; a rank
-- whose first element is not on a counter boundary draws the whole mask
-- and keeps its rows.)
function M.dropout_rows(x, p, g, opts)
  check_group("dropout_rows", g)
  opts = opts or {}
  if type(p) ~= "number" or not (p >= 0 and p <= 1) then error("dropout_rows: p must be in [0, 1], got " .. tostring(p), 2) end
  if opts.training == false or p == 0 then return x end
  if p == 1 then return x * 0 end
  local gen = opts.generator or random.default_generator()
  local per, n, r = x:numel(), g:size(), g:rank()
  local s = gen:state()
  local keep
  if (r * per) % 4 == 0 then
    gen:set_state { seed = s.seed, offset = s.offset + r * per / 4 }
    keep = random.rand(x:shape(), { device = x.device, generator = gen })
  else
    gen:set_state(s)
    keep = random.rand({ per * n }, { device = x.device, generator = gen }):narrow(1, r * per + 1, per):view(x:shape())
  end
  gen:set_state { seed = s.seed, offset = s.offset + math.ceil(per * n / 4) }
  return x * keep:ge(p):to(x.dtype) * (1 / (1 - p))
end

return M
