--- lutra.json: JSON through cJSON (bindings/json.c), as lt.json.
-- decode(text) -> value (objects are tables, arrays 1-based, null is json.null);
-- encode(value[, pretty]) -> text (sorted object keys, so output is stable).
-- Both raise errors that say what and where (byte offset).
local core = require "lutra.core"

return {
  decode = core.json_decode,
  encode = core.json_encode,
  null = core.json_null,
}
