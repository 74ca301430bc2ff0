--- lutra.dist.tp.state: whole state dicts of a tensor-parallel model, by
-- its shard records (records.plan: each sharded parameter's dim and parts).
--
--   local sd = tp.full_state_dict(model)         -- every TP rank: the whole tensors
--   tp.load_full_state_dict(model, sd)           -- every rank takes its slice
--
-- A whole tensor is what one process's model holds: for a shard along dim
-- with parts segments, for each segment s in order, the ranks' s-th pieces
-- side by side in rank order (regions.shard is the inverse). Replicated
-- parameters (not in the records) and buffers are the same on every rank and
-- pass as they are. Checkpoints (lutra.dist.tp.ckpt) and lt.hf.export read
-- and write whole weights through these and through whole_shape / assemble.
local tensor = require "lutra.tensor"
local autograd = require "lutra.autograd"
local comm = require "lutra.dist.comm"
local records = require "lutra.dist.tp.records"
local regions = require "lutra.dist.tp.regions"

local M = {}

--- state.whole_shape(shape, rec, n) -> the whole tensor's shape (a new
-- list) of a shard of `shape` split by rec = {dim =, parts =} over n ranks:
-- its dim n times longer (a replicated tensor: rec nil, the shape itself).
function M.whole_shape(shape, rec, n)
  local out = {}
  for i, v in ipairs(shape) do out[i] = v end
  if rec then out[rec.dim] = out[rec.dim] * n end
  return setmetatable(out, getmetatable(shape))
end

--- state.assemble(pieces, rec) -> the whole tensor (contiguous) from the
-- ranks' shards (pieces: a list in rank order, equal shapes) split by rec =
-- {dim =, parts = 1}: for each of the parts segments, every rank's piece of
-- it along dim. The inverse of regions.shard.
function M.assemble(pieces, rec)
  local parts, dim = rec.parts or 1, rec.dim
  if parts == 1 then return tensor.cat(pieces, dim):contiguous() end
  local k = pieces[1]:size(dim) / parts
  local list = {}
  for s = 0, parts - 1 do
    for _, p in ipairs(pieces) do list[#list + 1] = p:narrow(dim, s * k + 1, k) end
  end
  return tensor.cat(list, dim):contiguous()
end

--- state.gather_whole(t, rec, group) -> the whole tensor of this rank's shard t
-- (rec = {dim =, parts =}), on t's device and dtype: one all_gather over the
-- group (every rank calls it, the shards of equal shapes).
function M.gather_whole(t, rec, g)
  return autograd.no_grad(function()
    local n, numel, shape = g:size(), t:numel(), t:shape()
    local all = comm.all_gather(t:detach():contiguous():reshape(numel), { group = g })
    local pieces = {}
    for r = 0, n - 1 do pieces[r + 1] = all:narrow(1, r * numel + 1, numel):reshape(shape) end
    return M.assemble(pieces, rec)
  end)
end

--- tp.full_state_dict(model[, {keep = true}]) -> {name = tensor}: the whole
-- model's state dict (state_dict's names, tied tensors once), sharded
-- parameters gathered from the TP group one tensor at a time (each an
-- all_gather: every rank of model.tp_group calls it, in the same order),
-- replicated ones as they are (this rank's tensors, not copies). keep =
-- false: the gathered tensors are dropped after their collective (a rank
-- that only takes part, as lt.hf.export's non-writing ranks). A model that
-- is not tensor-parallel gives its state_dict(). Also returns the names in
-- state_dict_names()' order.
function M.full_state_dict(model, opts)
  local keep = not (opts and opts.keep == false)
  local sd, order = model:_state_dict()
  local g = records.group(model)
  if not g then return sd, order end
  local plan = records.plan(model)
  local out = {}
  for _, name in ipairs(order) do
    local rec = plan[name]
    if rec then
      local whole = M.gather_whole(sd[name], rec, g)
      if keep then out[name] = whole end
    else
      out[name] = sd[name]
    end
  end
  return out, order
end

--- state.mismatch(missing, unexpected, shaped) -> nil when the three
-- lists of names are empty, else load_state_dict's message for them
-- ("missing: a, b; unexpected: c; wrong shape or dtype: d (...)", each list
-- sorted in place).
function M.mismatch(missing, unexpected, shaped)
  if #missing + #unexpected + #shaped == 0 then return nil end
  table.sort(missing)
  table.sort(unexpected)
  table.sort(shaped)
  local parts = {}
  if #missing > 0 then parts[#parts + 1] = "missing: " .. table.concat(missing, ", ") end
  if #unexpected > 0 then parts[#parts + 1] = "unexpected: " .. table.concat(unexpected, ", ") end
  if #shaped > 0 then parts[#parts + 1] = "wrong shape or dtype: " .. table.concat(shaped, ", ") end
  return table.concat(parts, "; ")
end

--- tp.load_full_state_dict(model, sd[, {what = "load_full_state_dict"}]):
-- copies a whole state dict (whole tensors, as full_state_dict or one
-- process gives) into a TP model, each rank taking its slice of a sharded
-- tensor (regions.shard by the record's dim and parts), a replicated one
-- whole. No communication: every rank may call it alone. Missing,
-- unexpected, mis-shaped (against the whole shape) and integer-for-float
-- entries are reported together by name, as load_state_dict does, before
-- anything is copied: "<what>: missing: a, b; unexpected: c; wrong shape or
-- dtype: w (checkpoint [8, 4], model whole [12, 4])". Returns model.
function M.load_full_state_dict(model, sd, opts)
  local what = opts and opts.what or "load_full_state_dict"
  if type(sd) ~= "table" then error(what .. ": expected a table of name = tensor, got " .. type(sd), 2) end
  local g = records.group(model)
  local n = g and g:size() or 1
  local plan = g and records.plan(model) or {}
  local own = model:state_dict()
  local missing, unexpected, shaped = {}, {}, {}
  for name, t in pairs(own) do
    local v = sd[name]
    local want = M.whole_shape(t:shape(), plan[name], n)
    if v == nil then
      missing[#missing + 1] = name
    elseif not tensor.is_tensor(v) then
      shaped[#shaped + 1] = name .. " (not a tensor)"
    elseif tostring(v:shape()) ~= tostring(want) then
      shaped[#shaped + 1] = ("%s (checkpoint %s, model whole %s)"):format(name, tostring(v:shape()), tostring(want))
    elseif v:is_floating_point() ~= t:is_floating_point() then
      shaped[#shaped + 1] = ("%s (checkpoint dtype %s, model %s)"):format(name, v.dtype, t.dtype)
    end
  end
  for name in pairs(sd) do if own[name] == nil then unexpected[#unexpected + 1] = name end end
  local bad = M.mismatch(missing, unexpected, shaped)
  if bad then error(what .. ": " .. bad, 2) end
  autograd.no_grad(function()
    for name, t in pairs(own) do M.copy_whole(t, sd[name], plan[name], g) end
  end)
  return model
end

--- state.copy_whole(t, whole, rec, group): copies this rank's slice of the
-- whole tensor (rec = {dim =, parts =}, or nil: replicated, the whole) into
-- t (converting among float dtypes; to t's device). Shapes are the caller's
-- to check (load_full_state_dict does).
function M.copy_whole(t, whole, rec, g)
  autograd.no_grad(function()
    if rec and g then
      t:copy_(regions.shard(whole, rec.dim, g, "load_full_state_dict", "%d elements do", rec.parts))
    else
      t:copy_(whole)
    end
  end)
end

return M
