--- lutra.json: JSON through cJSON (bindings/json.c), as lt.json.
-- decode(text) -> value (objects are tables, arrays 1-based, null is json.null);
-- encode(value[, pretty]) -> text (sorted object keys, so output is stable).
-- Both raise errors that say what and where (byte offset).
-- find_unencodable(value) -> nil, or {path =, why =} for the first value
-- encode would refuse (NaN and infinities, functions, userdata, cycles),
-- with its dotted path, so callers can name the field.
local core = require "lutra.core"

local function find_unencodable(v, path, seen)
  local t = type(v)
  if t == "number" then
    if v ~= v or v == math.huge or v == -math.huge then return { path = path, why = "NaN or infinite" } end
    return nil
  end
  if t == "string" or t == "boolean" or t == "nil" or v == core.json_null then return nil end
  if t ~= "table" then return { path = path, why = "a " .. t } end
  seen = seen or {}
  if seen[v] then return { path = path, why = "a cycle" } end
  seen[v] = true
  for k, x in pairs(v) do
    if type(k) ~= "string" and type(k) ~= "number" then return { path = path, why = "a " .. type(k) .. " key" } end
    local sub = path and (path .. "." .. tostring(k)) or tostring(k)
    local bad = find_unencodable(x, sub, seen)
    if bad then return bad end
  end
  seen[v] = nil
  return nil
end

return {
  decode = core.json_decode,
  encode = core.json_encode,
  null = core.json_null,
  find_unencodable = function(v) return find_unencodable(v, nil, nil) end,
}
