--- lutra.config (lt.config): a recipe's settings. The recipe gives defaults;
-- the command line overrides them with --key=value (--flag and --no-flag
-- for booleans), each converted to its default's type. --help prints the
-- keys, defaults, types and, where the recipe gives them in _help, what
-- each one does, and exits; an unknown key (with the nearest valid one
-- suggested) or a value of the wrong type is an error that lists what is
-- valid. lt.config.check range-checks the values, and lt.config.fail
-- raises a settings error of the recipe's own.
--
-- Settings errors (lt.config's, lt.config.check's, lt.config.fail's) are
-- the user's to fix, not the code's: uncaught, lutra prints "lutra:
-- <message>" alone, without a Lua traceback, and exits 1; other errors
-- keep their traceback. Caught (pcall), they are ordinary string errors.
--
--   local cfg = lt.config { steps = 2000, lr = 6e-4, data = "data/pydocs", resume = true,
--     _help = { steps = "optimizer steps", lr = "peak learning rate" } }
--   -- ./lutra recipe.lua --steps=100 --no-resume
--   lt.config.check(cfg, { steps = { int = true, min = 1 }, lr = { gt = 0 } })
local M = {}

-- the messages of settings errors, which lutra's error handler (host/app/main.c)
-- prints without a traceback: a set in the registry, keyed by the message
local PLAIN = "lutra.settings_errors"
local registry = debug.getregistry()
registry[PLAIN] = registry[PLAIN] or {}

--- lt.config.fail(message): raises message (a string) as a settings error:
-- no position is added, and uncaught it prints without a traceback.
function M.fail(message)
  message = tostring(message)
  registry[PLAIN][message] = true
  error(message, 0)
end

--- lt.config.is_fail(message) -> whether message was raised by
-- lt.config.fail (a settings error: code that catches and raises it again
-- keeps it one with lt.config.fail(message)).
function M.is_fail(message) return type(message) == "string" and registry[PLAIN][message] == true end

-- edit distance with adjacent transpositions (optimal string alignment)
local function distance(a, b)
  local d = {}
  for i = 0, #a do d[i] = { [0] = i } end
  for j = 0, #b do d[0][j] = j end
  for i = 1, #a do
    for j = 1, #b do
      local cost = a:byte(i) == b:byte(j) and 0 or 1
      local v = math.min(d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost)
      if i > 1 and j > 1 and a:byte(i) == b:byte(j - 1) and a:byte(i - 1) == b:byte(j) then
        v = math.min(v, d[i - 2][j - 2] + 1)
      end
      d[i][j] = v
    end
  end
  return d[#a][#b]
end

--- lt.config.nearest(name, names) -> the name among names (a list of
-- strings) that name is most likely a typo of, or nil when none is close:
-- the only one that starts with name, else the only one that has name as a
-- whole "_"-separated part (tokens: max_tokens), else the nearest by edit distance
-- (transpositions count one) within about 40% of name's length.
function M.nearest(name, names)
  name = tostring(name)
  local starts = {}
  for _, n in ipairs(names) do
    if #name >= 2 and n:sub(1, #name) == name then starts[#starts + 1] = n end
  end
  if #starts == 1 then return starts[1] end
  -- the only one of which name is a whole "_"-separated part (tokens: max_tokens)
  local parts = {}
  for _, n in ipairs(names) do
    if #name >= 3 and ("_" .. n .. "_"):find("_" .. name .. "_", 1, true) then parts[#parts + 1] = n end
  end
  if #parts == 1 then return parts[1] end
  local sorted = {}
  for i, n in ipairs(names) do sorted[i] = n end
  table.sort(sorted) -- (ties go to the first in sorted order)
  local best, best_d = nil, math.max(1, math.floor(#name * 0.4)) + 1
  for _, n in ipairs(sorted) do
    local d = distance(name:lower(), n:lower())
    if d < best_d then best, best_d = n, d end
  end
  return best
end

--- lt.config.sorted_keys(t) -> t's keys (strings), sorted: the order
-- settings are listed, checked and suggested in.
function M.sorted_keys(t)
  local keys = {}
  for k in pairs(t) do keys[#keys + 1] = k end
  table.sort(keys)
  return keys
end
local sorted_keys = M.sorted_keys

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
    if not n then M.fail(("config: --%s=%s is not a number (default %s)"):format(key, raw, tostring(default))) end
    return n
  elseif t == "boolean" then
    local v = ({ ["true"] = true, ["1"] = true, yes = true, on = true, ["false"] = false, ["0"] = false, no = false,
      off = false })[raw:lower()]
    if v == nil then M.fail(("config: --%s=%s is not a boolean (true/false)"):format(key, raw)) end
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
        local valid = sorted_keys(defaults)
        local near = M.nearest(key, valid)
        M.fail(("config: unknown setting --%s%s; valid: %s"):format(key,
          near and (" (did you mean --%s?)"):format(near) or "", table.concat(valid, ", ")))
      end
      if type(defaults[key]) ~= "boolean" and not a:find("=", 1, true) then
        M.fail(("config: --%s needs a value (--%s=...)"):format(key, key))
      end
      cfg[key] = convert(key, val, defaults[key])
    else
      args[#args + 1] = a
    end
  end
  cfg.args = args
  return cfg
end

local function describe(r)
  local what = r.int and "a whole number" or "a number"
  local lo = r.gt ~= nil and ("> %s"):format(tostring(r.gt)) or r.min ~= nil and (">= %s"):format(tostring(r.min))
  local hi = r.lt ~= nil and ("< %s"):format(tostring(r.lt)) or r.max ~= nil and ("<= %s"):format(tostring(r.max))
  if lo and hi then return ("%s %s and %s"):format(what, lo, hi) end
  return ("%s%s"):format(what, (lo or hi) and (" " .. (lo or hi)) or "")
end

--- lt.config.check(cfg, rules): range-checks settings; the first one out of
-- range is a settings error (lt.config.fail) naming it, what it must be and
-- what it was ("--steps must be a whole number >= 1, got -5"). rules maps a
-- setting's name to a table of:
--   int = true       a whole number; numbers must be finite in any case
--   min/max = v      inclusive bounds;  gt/lt = v  exclusive bounds
--   one_of = {...}   one of these values (strings or numbers)
--   nonempty = true  a string that is not empty
--   device = true    a device name: cpu, cuda or cuda:N
--   why = "..."      said after the rule ("... (the context)")
-- Keys are checked in sorted order. A rule for a key that cfg lacks is an
-- error in the recipe (with a traceback).
function M.check(cfg, rules)
  for _, key in ipairs(sorted_keys(rules)) do
    local r, v = rules[key], cfg[key]
    if v == nil then error(("config.check: a rule for %s, which is not a setting"):format(tostring(key)), 2) end
    local why = r.why and (" (" .. r.why .. ")") or ""
    local function bad(must)
      local shown = type(v) == "string" and ("%q"):format(v) or tostring(v)
      M.fail(("--%s must be %s%s, got %s"):format(key, must, why, shown))
    end
    if r.one_of then
      local ok = false
      for _, c in ipairs(r.one_of) do ok = ok or v == c end
      if not ok then
        local names = {}
        for i, c in ipairs(r.one_of) do names[i] = tostring(c) end
        bad("one of " .. table.concat(names, ", "))
      end
    end
    if r.nonempty and (type(v) ~= "string" or v == "") then bad("a non-empty string") end
    if r.device and not (v == "cpu" or v == "cuda" or (type(v) == "string" and v:match("^cuda:%d+$"))) then
      bad("cpu, cuda or cuda:N")
    end
    if r.int or r.min ~= nil or r.max ~= nil or r.gt ~= nil or r.lt ~= nil then
      if type(v) ~= "number" or v ~= v or v == math.huge or v == -math.huge
          or (r.int and v ~= math.floor(v)) or (r.min ~= nil and v < r.min) or (r.max ~= nil and v > r.max)
          or (r.gt ~= nil and v <= r.gt) or (r.lt ~= nil and v >= r.lt) then
        bad(describe(r))
      end
    end
  end
end

--- lt.config.refuse_args(cfg): a settings error for the first word of the
-- command line that is not a --key=value setting (cfg.args): "steps=3"
-- would otherwise be dropped and the recipe run on its defaults.
function M.refuse_args(cfg)
  if #cfg.args > 0 then
    M.fail(("unexpected argument %q: settings are --key=value (--help lists them)"):format(cfg.args[1]))
  end
end

return setmetatable(M, { __call = function(_, ...) return M.config(...) end })
