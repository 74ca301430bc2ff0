--- lutra.dist.tp (lt.dist.tp): tensor parallelism's first pieces, as
-- Megatron-LM splits a layer (Shoeybi et al. 2019, "Megatron-LM", section 3):
-- the conjugate operators f and g that move activations and gradients in
-- and out of a tensor-parallel region, and the column- and row-parallel
-- linear layers built on them. A group is a process group of lt.dist
-- (lt.dist.mesh{tp = n}.tp, or lt.dist.new_group); every rank of it calls
-- the same functions in the same order, as for any collective.
--
--   local tp = lt.dist.tp
--   local up = tp.ColumnParallelLinear.from(full_fc, g)     -- W (out/n, in) on each rank
--   local down = tp.RowParallelLinear.from(full_proj, g)    -- W (out, in/n); bias added once
--   local y = down(up(x):gelu())                            -- = full_proj(full_fc(x):gelu())
--
-- Not yet here (issue 25): vocab-parallel embedding and cross-entropy,
-- sequence parallelism, the models' tp setting.
local tensor = require "lutra.tensor"
local autograd = require "lutra.autograd"
local comm = require "lutra.dist.comm"
local nn = require "lutra.nn"
local F = require "lutra.nn.functional"

local M = {}

local function check_group(what, g)
  if type(g) ~= "table" or type(g.size) ~= "function" then
    error(what .. ": expected a process group (lt.dist.mesh{...}.tp or lt.dist.new_group), got " .. tostring(g), 3)
  end
end

--- f: identity forward, all-reduce (sum over the group) of the gradient
-- backward. Megatron's copy_to_tensor_model_parallel_region: the input of a
-- column-parallel layer, which every rank reads whole.
local copy_fn = autograd.Function {
  forward = function(ctx, x, g)
    ctx.group = g
    return x -- (handed out as an alias in the graph: no copy)
  end,
  backward = function(ctx, dy)
    return comm.all_reduce(dy:contiguous(), { group = ctx.group })
  end,
}
--- tp.copy_to_region(x, group) -> x (f above); x of any shape.
function M.copy_to_region(x, g)
  check_group("copy_to_region", g)
  return copy_fn(x, g)
end

--- g: all-reduce (sum) forward, identity backward. Megatron's
-- reduce_from_tensor_model_parallel_region: the partial outputs of a
-- row-parallel layer summed.
local reduce_fn = autograd.Function {
  forward = function(_, x, g)
    return comm.all_reduce(x:contiguous(), { group = g })
  end,
  backward = function(_, dy) return dy end,
}
--- tp.reduce_from_region(x, group) -> the sum of x over the group's ranks.
function M.reduce_from_region(x, g)
  check_group("reduce_from_region", g)
  return reduce_fn(x, g)
end

--- This rank's 1/n of t along dim (n the group's size), contiguous. Errors
-- when the dim's size does not divide, naming it as "%d <noun>" (noun
-- phrased by the caller) at the caller's caller.
local function shard(t, dim, g, what, noun)
  local n, c = g:size(), t:size(dim)
  if c % n ~= 0 then
    error(("%s: " .. noun .. " not divide by the tensor-parallel group's %d ranks"):format(what, c, n), 3)
  end
  local k = math.floor(c / n)
  return t:narrow(dim, g:rank() * k + 1, k):contiguous()
end
local LAST = "the last dim (%d) does"

--- all-gather along the last dim forward, this rank's slice backward
-- (Megatron's gather_from_tensor_model_parallel_region).
local gather_fn = autograd.Function {
  forward = function(ctx, x, g)
    ctx.group = g
    -- all_gather concatenates along dim 1, rank after rank: cut and put side by side
    local all = comm.all_gather(x:contiguous(), { group = g })
    local rows, parts = x:size(1), {}
    for r = 0, g:size() - 1 do parts[#parts + 1] = all:narrow(1, r * rows + 1, rows) end
    return tensor.cat(parts, -1)
  end,
  backward = function(ctx, dy) return shard(dy, -1, ctx.group, "gather_from_region", LAST) end,
}
--- tp.gather_from_region(x, group) -> (..., C * n): the ranks' x side by side
-- along the last dim, rank order.
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
--- tp.scatter_to_region(x, group) -> (..., C / n): this rank's slice.
function M.scatter_to_region(x, g)
  check_group("scatter_to_region", g)
  return scatter_fn(x, g)
end


--- tp.ColumnParallelLinear: y = x W_r^T + b_r, W split by output features
-- (each rank holds W's rows r*out/n .. (r+1)*out/n, and that part of b).
-- The input enters through f (its gradient all-reduced); the output is this
-- rank's slice of the features, or all of them with gather_output.
M.ColumnParallelLinear = nn.Module:extend("ColumnParallelLinear")

--- ColumnParallelLinear.from(linear, group[, {gather_output = false}]): the
-- slice of a whole nn.Linear (its weight (out, in) and bias), so that every
-- layout starts from the weights one process would have. Errors when out
-- does not divide by the group's size.
function M.ColumnParallelLinear.from(lin, g, o)
  check_group("ColumnParallelLinear", g)
  local m = M.ColumnParallelLinear({ group = g })
  m.in_features, m.out_features = lin.weight:size(2), lin.weight:size(1)
  m.weight = nn.Parameter(shard(lin.weight:detach(), 1, g, "ColumnParallelLinear", "%d output features do"))
  local b = lin._params.by_name.bias
  if b then m.bias = nn.Parameter(shard(b:detach(), 1, g, "ColumnParallelLinear", "%d output features do")) end
  m.gather_output = o and o.gather_output or false
  return m
end
function M.ColumnParallelLinear:init(o) self.group = o.group end
function M.ColumnParallelLinear:forward(x)
  local y = F.linear(M.copy_to_region(x, self.group), self.weight, self._params.by_name.bias)
  if self.gather_output then y = M.gather_from_region(y, self.group) end
  return y
end

--- tp.RowParallelLinear: y = sum over ranks of x_r W_r^T, plus b once. W
-- split by input features (each rank holds W's columns r*in/n ..
-- (r+1)*in/n); the input is this rank's slice of the features (a
-- column-parallel layer's output), or the whole input with
-- input_is_parallel = false (then sliced here). The bias is replicated and
-- added after the all-reduce, as Megatron does, so it counts once.
M.RowParallelLinear = nn.Module:extend("RowParallelLinear")

--- RowParallelLinear.from(linear, group[, {input_is_parallel = true}]): the
-- slice of a whole nn.Linear. Errors when in does not divide by the group's size.
function M.RowParallelLinear.from(lin, g, o)
  check_group("RowParallelLinear", g)
  local m = M.RowParallelLinear({ group = g })
  m.in_features, m.out_features = lin.weight:size(2), lin.weight:size(1)
  m.weight = nn.Parameter(shard(lin.weight:detach(), 2, g, "RowParallelLinear", "%d input features do"))
  local b = lin._params.by_name.bias
  if b then m.bias = nn.Parameter(b:detach():clone()) end
  m.input_is_parallel = not (o and o.input_is_parallel == false)
  return m
end
function M.RowParallelLinear:init(o) self.group = o.group end
function M.RowParallelLinear:forward(x)
  if not self.input_is_parallel then x = M.scatter_to_region(x, self.group) end
  local y = M.reduce_from_region(F.linear(x, self.weight), self.group)
  local b = self._params.by_name.bias
  if b then y = y + b end
  return y
end

return M
