--- lutra.dist.tp.linear: the column- and row-parallel linear layers of
-- Megatron-LM (Shoeybi et al. 2019, section 3), as shards of a whole
-- nn.Linear so that every layout starts from the weights one process has.
--
--   local up = tp.ColumnParallelLinear.from(full_fc, g)     -- W (out/n, in) on each rank
--   local down = tp.RowParallelLinear.from(full_proj, g)    -- W (out, in/n); bias added once
--   local y = down(up(x):gelu())                            -- = full_proj(full_fc(x):gelu())
--
-- With sequence_parallel (Korthikanti et al. 2022) the column layer takes
-- this rank's rows of the tokens (N/n, in) and all-gathers them (backward:
-- reduce-scatter), and the row layer reduce-scatters its partial outputs to
-- this rank's rows (N/n, out) (backward: all-gather): the same
-- communicated bytes as the all-reduces, and what lies between the layers
-- (norms, dropout, residual adds) runs on 1/n of the tokens.
local nn = require "lutra.nn"
local F = require "lutra.nn.functional"
local regions = require "lutra.dist.tp.regions"
local records = require "lutra.dist.tp.records"
local check_group, shard = regions.check_group, regions.shard

local M = {}

--- tp.ColumnParallelLinear: y = x W_r^T + b_r, W split by output features
-- (each rank holds W's rows r*out/n .. (r+1)*out/n, and that part of b).
-- The input enters through f (its gradient all-reduced), or under sequence
-- parallelism is gathered from the ranks' rows; the output is this rank's
-- slice of the features, or all of them with gather_output.
M.ColumnParallelLinear = nn.Module:extend("ColumnParallelLinear")

--- ColumnParallelLinear.from(linear, group[, {gather_output = false, parts = 1,
-- sequence_parallel = false}]) -> the module: the slice of a whole nn.Linear (weight
-- (out, in), bias). parts: the output features are parts stacked segments,
-- each split (GPT-2's c_attn: q, k, v; parts = 3). Errors when out (a
-- segment of it) does not divide by the group's size. Under
-- sequence_parallel the forward takes (N/n, in) rows (any leading dims,
-- flattened) and returns (N, out/n).
function M.ColumnParallelLinear.from(lin, g, o)
  check_group("ColumnParallelLinear", g)
  o = o or {}
  local parts = o.parts or 1
  local m = M.ColumnParallelLinear({ group = g })
  m.in_features, m.out_features = lin.weight:size(2), lin.weight:size(1)
  local what = "ColumnParallelLinear"
  local noun = parts > 1 and "%d output features a part do" or "%d output features do"
  m.weight = nn.Parameter(shard(lin.weight:detach(), 1, g, what, noun, parts))
  records.mark(m, "weight", 1, parts)
  local b = lin._params.by_name.bias
  if b then
    m.bias = nn.Parameter(shard(b:detach(), 1, g, what, noun, parts))
    records.mark(m, "bias", 1, parts)
  end
  m.gather_output = o.gather_output or false
  m.sequence_parallel = o.sequence_parallel or false
  return m
end
function M.ColumnParallelLinear:init(o) self.group = o.group end
--- col(x[, activation]): activation "gelu" inside the product (F.linear).
function M.ColumnParallelLinear:forward(x, activation)
  x = self.sequence_parallel and regions.gather_rows(x, self.group) or regions.copy_to_region(x, self.group)
  local y = F.linear(x, self.weight, self._params.by_name.bias, activation and { activation = activation } or nil)
  if self.gather_output then y = regions.gather_from_region(y, self.group) end
  return y
end
M.ColumnParallelLinear.fuses_activation = M.ColumnParallelLinear.forward

--- tp.RowParallelLinear: y = sum over ranks of x_r W_r^T, plus b once. W
-- split by input features (each rank holds W's columns r*in/n ..
-- (r+1)*in/n); the input is this rank's slice of the features (a
-- column-parallel layer's output), or the whole input with
-- input_is_parallel = false (then sliced here). The bias is replicated and
-- added after the reduction, as Megatron does, so it counts once.
M.RowParallelLinear = nn.Module:extend("RowParallelLinear")

--- RowParallelLinear.from(linear, group[, {input_is_parallel = true,
-- sequence_parallel = false}]) -> the module: the slice of a whole nn.Linear. Errors when
-- in does not divide by the group's size. Under sequence_parallel the
-- forward returns this rank's (N/n, out) rows of the sum (x's leading dims
-- flattened to N tokens), the bias added to them through f (its gradient
-- the sum of the ranks' rows').
function M.RowParallelLinear.from(lin, g, o)
  check_group("RowParallelLinear", g)
  o = o or {}
  local m = M.RowParallelLinear({ group = g })
  m.in_features, m.out_features = lin.weight:size(2), lin.weight:size(1)
  m.weight = nn.Parameter(shard(lin.weight:detach(), 2, g, "RowParallelLinear", "%d input features do"))
  records.mark(m, "weight", 2)
  local b = lin._params.by_name.bias
  if b then m.bias = nn.Parameter(b:detach():clone()) end
  m.input_is_parallel = o.input_is_parallel ~= false
  m.sequence_parallel = o.sequence_parallel or false
  return m
end
function M.RowParallelLinear:init(o) self.group = o.group end
--- row(x) -> (..., out): the sum over the group of x_r W_r^T, plus the bias
-- once (x this rank's in/n features, or the whole input with
-- input_is_parallel = false); under sequence_parallel this rank's (N/n, out)
-- rows of it.
function M.RowParallelLinear:forward(x)
  if not self.input_is_parallel then x = regions.scatter_to_region(x, self.group) end
  local b = self._params.by_name.bias
  if self.sequence_parallel then
    local y = regions.reduce_scatter_rows(F.linear(x, self.weight), self.group)
    if b then y = y + regions.copy_to_region(b, self.group) end
    return y
  end
  local y = regions.reduce_from_region(F.linear(x, self.weight), self.group)
  if b then y = y + b end
  return y
end

return M
