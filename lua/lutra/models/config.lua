--- lutra.models.config: how a model constructor reads its arguments
-- (lt.models.gpt2(name or config[, overrides]) and llama's alike).
local M = {}

-- the settings that say how to build the model, not what it is
local OPTS = { dtype = true, device = true, generator = true, tp = true, sequence_parallel = true, pp = true,
  pp_stages = true, virtual_stages = true, recompute = true }

--- M.resolve(family, configs, name_or_table, overrides) -> cfg, opts: the
-- named base config (configs[name]) or the given table, with overrides on
-- top; dtype, device, generator, tp (a tensor-parallel group),
-- sequence_parallel, pp (a pipeline group), pp_stages, virtual_stages and
-- recompute go to opts (with init = false: the constructors set
-- every weight), the rest to cfg (what a checkpoint records of the model),
-- but padded_vocab_size, which the constructors derive (so a model's own
-- config, model.config, builds the model again). Neither argument is
-- changed. Raises "<family>: unknown config '<name>' (known: ...)" at the
-- constructor's caller.
function M.resolve(family, configs, name, overrides)
  local merged = {}
  if type(name) == "table" then
    for k, v in pairs(name) do merged[k] = v end
  elseif name ~= nil then
    local base = configs[name]
    if not base then
      local known = {}
      for k in pairs(configs) do known[#known + 1] = k end
      table.sort(known)
      error(("%s: unknown config '%s' (known: %s)"):format(family, tostring(name), table.concat(known, ", ")), 3)
    end
    for k, v in pairs(base) do merged[k] = v end
  end
  for k, v in pairs(overrides or {}) do merged[k] = v end
  local cfg, opts = {}, { init = false }
  for k, v in pairs(merged) do
    if OPTS[k] then opts[k] = v elseif k ~= "padded_vocab_size" then cfg[k] = v end
  end
  return cfg, opts
end

return M
