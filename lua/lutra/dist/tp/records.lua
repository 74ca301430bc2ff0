--- lutra.dist.tp.records: which parameters of a tensor-parallel model are
-- shards of a whole tensor, and how to put them back together. Everything
-- that treats sharded and replicated parameters differently reads them
-- here: the gradient norm (a shard's squares summed over the group, a
-- replicated parameter's counted once), checkpoints (whole weights from the
-- shards), the check that replicated parameters stayed identical.
--
-- A module records its own shards in its field tp_shards, keyed by the
-- parameter's name in that module: {weight = {dim = 1, parts = 1}}. dim:
-- the dim split across the group's ranks; parts: that dim is parts stacked
-- segments each split (GPT-2's c_attn rows q | k | v: parts = 3; rank r
-- holds its 1/n of each, in order). A model made tensor-parallel records
-- its group in model.tp_group (and whether sequence parallelism is on in
-- model.tp_sequence_parallel). Records hold names, not tensors: they
-- survive model:to(), which replaces the parameters.
local M = {}

--- records.mark(module, name, dim[, parts = 1]): module's parameter `name`
-- is this rank's shard of a whole tensor along dim (1-based).
function M.mark(module, name, dim, parts)
  local shards = rawget(module, "tp_shards")
  if not shards then
    shards = {}
    rawset(module, "tp_shards", shards)
  end
  shards[name] = { dim = dim, parts = parts or 1 }
end

--- records.plan(model) -> {[name] = {dim =, parts =}}: every sharded
-- parameter of model under its named_parameters() name (a tied weight
-- under its first name, as state_dict).
function M.plan(model)
  local by_tensor = {}
  for _, nm in ipairs(model:named_modules()) do
    local shards = rawget(nm[2], "tp_shards")
    for pname, rec in pairs(shards or {}) do
      local p = nm[2]._params.by_name[pname]
      if p ~= nil then by_tensor[p] = rec end
    end
  end
  local out = {}
  for _, np in ipairs(model:named_parameters()) do
    local rec = by_tensor[np[2]]
    if rec then out[np[1]] = rec end
  end
  return out
end

--- records.sharded(model) -> {[tensor] = {dim =, parts =}} for the model's
-- current parameter tensors (rebuild it after model:to()).
function M.sharded(model)
  local out = {}
  for _, nm in ipairs(model:named_modules()) do
    local shards = rawget(nm[2], "tp_shards")
    for pname, rec in pairs(shards or {}) do
      local p = nm[2]._params.by_name[pname]
      if p ~= nil then out[p] = rec end
    end
  end
  return out
end

--- records.num_parameters(model) -> the whole model's parameter elements
-- (a shard counts for the group's size of it; tied weights once; a padded
-- vocabulary's rows included), as model:num_parameters() of one process.
function M.num_parameters(model)
  local g, by = rawget(model, "tp_group"), M.sharded(model)
  local n = 0
  for _, p in ipairs(model:parameters()) do n = n + p:numel() * ((by[p] and g) and g:size() or 1) end
  return n
end

--- records.group(model) -> the model's tensor-parallel group, or nil for a
-- model that is not tensor-parallel (or a group of one rank).
function M.group(model)
  local g = type(model) == "table" and rawget(model, "tp_group") or nil
  if g and g:size() > 1 then return g end
  return nil
end

return M
