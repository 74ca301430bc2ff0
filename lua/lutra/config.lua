--- lutra.config (lt.config): a recipe's settings. The recipe gives defaults;
-- the command line overrides them with --key=value (--flag and --no-flag
-- for booleans), each converted to its default's type. --help prints the
-- keys, defaults, types and, where the recipe gives them in _help, what
-- each one does, and exits; an unknown key or a value of the wrong type is
-- an error that lists what is valid.
--
--   local cfg = lt.config { steps = 2000, lr = 6e-4, data = "data/pydocs", resume = true,
--     _help = { steps = "optimizer steps", lr = "peak learning rate" } }
--   -- ./lutra recipe.lua --steps=100 --no-resume
local M = {}

local function sorted_keys(t)
  local keys = {}
  for k in pairs(t) do keys[#keys + 1] = k end
  table.sort(keys)
  return keys
end

local function usage(defaults, help, script)
  local lines = { ("usage: lutra %s [--key=value ...]"):format(script or "<recipe>"), "settings (default, type):" }
  for _, k in ipairs(sorted_keys(defaults)) do
    local v = defaults[k]
    local shown = type(v) == "string" and ("%q"):format(v) or tostring(v) -- (a string's spaces shown)
    local name = "--" .. k
    if #shown > 24 then -- (a long default on a line of its own keeps the columns)
      lines[#lines + 1] = ("  %-22s %s"):format(name, shown)
      name, shown = "", ""
    end
    local line = ("  %-22s %-24s %-8s"):format(name, shown, type(v))
    lines[#lines + 1] = help[k] and (line .. " " .. help[k]) or (line:gsub("%s+$", ""))
  end
  return table.concat(lines, "\n")
end

local function convert(key, raw, default)
  local t = type(default)
  if t == "number" then
    local n = tonumber(raw)
    if not n then error(("config: --%s=%s is not a number (default %s)"):format(key, raw, tostring(default)), 0) end
    return n
  elseif t == "boolean" then
    local v = ({ ["true"] = true, ["1"] = true, yes = true, on = true, ["false"] = false, ["0"] = false, no = false,
      off = false })[raw:lower()]
    if v == nil then error(("config: --%s=%s is not a boolean (true/false)"):format(key, raw), 0) end
    return v
  end
  return raw
end

--- lt.config(defaults[, argv]) -> settings. argv defaults to the script's arg.
-- defaults._help (optional): a description per key, printed by --help.
function M.config(defaults, argv)
  if type(defaults) ~= "table" then error("config: expected a table of defaults", 2) end
  argv = argv or rawget(_G, "arg") or {}
  local help = defaults._help or {}
  if type(help) ~= "table" then error("config: _help must be a table of descriptions", 2) end
  local plain = {}
  for k, v in pairs(defaults) do
    if k ~= "_help" then plain[k] = v end
  end
  for k, v in pairs(help) do
    if plain[k] == nil then error(("config: _help describes %s, which is not a setting"):format(tostring(k)), 2) end
    if type(v) ~= "string" then error(("config: _help's description of %s must be a string"):format(k), 2) end
  end
  defaults = plain
  local cfg, args = {}, {}
  for k, v in pairs(defaults) do cfg[k] = v end
  for i = 1, #argv do
    local a = argv[i]
    if a == "--help" or a == "-h" then
      print(usage(defaults, help, argv[0]))
      os.exit(0)
    end
    local key, val = a:match("^%-%-([%w_%.%-]+)=(.*)$")
    if not key then
      key = a:match("^%-%-([%w_%.%-]+)$")
      if key then
        local neg = key:match("^no%-(.+)$")
        if neg and type(defaults[neg]) == "boolean" then key, val = neg, "false" else val = "true" end
      end
    end
    if key then
      key = key:gsub("%-", "_")
      if defaults[key] == nil then
        error(("config: unknown setting --%s; valid: %s"):format(key, table.concat(sorted_keys(defaults), ", ")), 2)
      end
      if type(defaults[key]) ~= "boolean" and not a:find("=", 1, true) then
        error(("config: --%s needs a value (--%s=...)"):format(key, key), 2)
      end
      cfg[key] = convert(key, val, defaults[key])
    else
      args[#args + 1] = a
    end
  end
  cfg.args = args
  return cfg
end

return setmetatable(M, { __call = function(_, ...) return M.config(...) end })
