--- lutra.capi: the C core through the LuaJIT FFI.
-- Loads the declarations generated from host/lutra.h (lutra.core.cdef) once
-- and gives the library C (the symbols in the lutra binary), ffi, and the
-- error helpers that turn a failed lt_status into a Lua error at the
-- caller's line.
local ffi = require "ffi"
local core = require "lutra.core"

-- The FFI keeps declarations and metatypes for the life of the state, so
-- anything the library sets up once lives in the registry: a module that is
-- loaded again (busted's insulation, reloading in the REPL) reuses it.
local registry = debug.getregistry()
local state = registry.lutra_state
if not state then
  ffi.cdef(core.cdef)
  state = {}
  registry.lutra_state = state
end
local C = ffi.C

local M = { C = C, ffi = ffi, core = core, state = state }

--- Raises the last C error. `level` counts as for error(): 2 blames the
-- caller of the function that calls fail.
function M.fail(level)
  error(ffi.string(C.lt_last_error()), (level or 2) + 1)
end

--- One reusable out-parameter box for functions returning a tensor.
M.tensor_box = ffi.new("lt_tensor*[1]")

--- Scratch int64 arrays for shapes and dims (the Lua state is single-threaded).
M.dims_a = ffi.new("int64_t[8]")
M.dims_b = ffi.new("int64_t[8]")

local names_box, len_box = ffi.new("char*[1]"), ffi.new("int64_t[1]")

--- capi.list_dir(dir) -> the names in the directory (not . and ..; C's
-- lt_dir_entries), or {} when dir is not a directory or cannot be read.
function M.list_dir(dir)
  local out = {}
  if M.C.lt_path_kind(dir) ~= 2 then return out end
  if M.C.lt_dir_entries(dir, names_box, len_box) ~= 0 then return out end
  local raw = ffi.string(names_box[0], len_box[0])
  M.C.lt_free(names_box[0])
  for name in raw:gmatch("([^%z]+)%z") do out[#out + 1] = name end
  return out
end

return M
