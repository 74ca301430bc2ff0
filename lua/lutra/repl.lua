--- lutra.repl: what the REPL (host/app/repl.c) asks of Lua: printing the values
-- of an entry and completing names on TAB.
local ffi = require "ffi"
local tensor = require "lutra.tensor"

local M = {}

local function is_tensor(x)
  return type(x) == "cdata" and ffi.istype("lt_tensor*", x)
end

--- A short one-line rendering of a table (keys sorted, nested tables elided).
local function short_table(t)
  local parts, n = {}, 0
  for i = 1, #t do
    n = n + 1
    if n > 10 then parts[#parts + 1] = "..." break end
    local v = t[i]
    parts[#parts + 1] = type(v) == "string" and string.format("%q", v)
      or type(v) == "table" and "{...}" or tostring(v)
  end
  local keys = {}
  for k in pairs(t) do
    if not (type(k) == "number" and k >= 1 and k <= #t and k == math.floor(k)) then keys[#keys + 1] = k end
  end
  table.sort(keys, function(a, b) return tostring(a) < tostring(b) end)
  for _, k in ipairs(keys) do
    n = n + 1
    if n > 10 then parts[#parts + 1] = "..." break end
    local v = t[k]
    local ks = type(k) == "string" and k:match("^[%a_][%w_]*$") and k or "[" .. tostring(k) .. "]"
    parts[#parts + 1] = ks .. " = " .. (type(v) == "string" and string.format("%q", v)
      or type(v) == "table" and "{...}" or tostring(v))
  end
  return "{" .. table.concat(parts, ", ") .. "}"
end

--- Prints the n results of an entry, tab-separated (tensors as summaries).
function M.show(n, ...)
  local out = {}
  for i = 1, n do
    local v = select(i, ...)
    if type(v) == "table" and not getmetatable(v) then
      out[i] = short_table(v)
    else
      out[i] = tostring(v)
    end
  end
  io.write(table.concat(out, "\t"), "\n")
end

--- Keys worth offering for a value: table fields, __index tables, tensor methods.
local function keys_of(v, methods_only)
  local keys = {}
  local function add_table(t)
    if type(t) ~= "table" then return end
    for k in pairs(t) do
      if type(k) == "string" and k:match("^[%a_][%w_]*$") then keys[k] = true end
    end
  end
  if is_tensor(v) then
    add_table(tensor.methods)
    if not methods_only then keys.dtype, keys.device = true, true end
  elseif type(v) == "table" then
    if not methods_only then add_table(v) end
    local mt = getmetatable(v)
    if type(mt) == "table" then
      add_table(mt.__index)
      if methods_only then add_table(v) end
    end
  elseif type(v) == "string" then
    add_table(string)
  end
  local list = {}
  for k in pairs(keys) do list[#list + 1] = k end
  table.sort(list)
  return list
end

--- Completions for the word before the cursor, e.g. "lt.ze" -> {"lt.zeros", "lt.zeros_like"}.
function M.complete(word)
  local path, sep, partial = word:match("^(.*)([%.:])([%w_]*)$")
  local candidates = {}
  if not path then
    for _, k in ipairs(keys_of(_G)) do
      if k:sub(1, #word) == word then candidates[#candidates + 1] = k end
    end
    for _, kw in ipairs { "and", "break", "do", "else", "elseif", "end", "false", "for",
      "function", "if", "in", "local", "nil", "not", "or", "repeat", "return", "then", "true",
      "until", "while" } do
      if kw:sub(1, #word) == word and #word > 0 then candidates[#candidates + 1] = kw end
    end
    return candidates
  end
  -- resolve the prefix through plain field reads, never calling functions
  local v = _G
  for name in path:gmatch("[^%.:]+") do
    if not name:match("^[%a_][%w_]*$") then return candidates end
    local ok, nv = pcall(function() return v[name] end)
    if not ok or nv == nil then return candidates end
    v = nv
  end
  for _, k in ipairs(keys_of(v, sep == ":")) do
    if k:sub(1, #partial) == partial then candidates[#candidates + 1] = path .. sep .. k end
  end
  return candidates
end

return M
