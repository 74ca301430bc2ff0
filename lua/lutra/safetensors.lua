--- lutra.safetensors: safetensors files (the C reader validates every header
-- field; host/io/safetensors.c). lt.save(path, {name = tensor, ...}[, metadata])
-- writes atomically (names in sorted order); lt.load(path) -> tensors,
-- metadata; lt.safetensors.open(path) gives a reader for one tensor at a time.
local capi = require "lutra.capi"
local tensor = require "lutra.tensor"
local ffi, C, fail = capi.ffi, capi.C, capi.fail
local json = require "lutra.json"

local M = {}
local Reader = {}
Reader.__index = Reader

local file_box = ffi.new("lt_safetensors*[1]")

--- lt.safetensors.open(path) -> reader with :names(), :get(name), :metadata(), :close().
function M.open(path, level)
  level = level or 2
  if type(path) ~= "string" then error("safetensors.open: path must be a string", level) end
  if C.lt_safetensors_open(path, file_box) ~= 0 then fail(level) end
  return setmetatable({ f = ffi.gc(file_box[0], C.lt_safetensors_close), path = path }, Reader)
end

function Reader:names()
  local out = {}
  for i = 0, tonumber(C.lt_safetensors_count(self.f)) - 1 do out[#out + 1] = ffi.string(C.lt_safetensors_name(self.f, i)) end
  return out
end

function Reader:get(name, level)
  if type(name) ~= "string" then error("safetensors get: the name must be a string, got " .. type(name), (level or 2)) end
  if self.f == nil then error("safetensors get: the reader is closed", (level or 2)) end
  if C.lt_safetensors_get(self.f, name, capi.tensor_box) ~= 0 then fail(level or 2) end
  return tensor.take()
end

function Reader:metadata() return json.decode(ffi.string(C.lt_safetensors_metadata(self.f))) end

function Reader:close()
  if self.f ~= nil then
    C.lt_safetensors_close(ffi.gc(self.f, nil))
    self.f = nil
  end
end

--- lt.load(path) -> {name = tensor}, metadata (CPU tensors, copies of the file's data).
function M.load(path)
  local r = M.open(path, 3)
  local out = {}
  for _, name in ipairs(r:names()) do out[name] = r:get(name, 3) end
  local meta = r:metadata()
  r:close()
  return out, meta
end

--- lt.save(path, {name = tensor, ...}[, metadata]): metadata is a table of strings.
function M.save(path, tensors, metadata)
  if type(path) ~= "string" then error("save: path must be a string", 2) end
  if type(tensors) ~= "table" then error("save: expected a table of name = tensor", 2) end
  local names = {}
  for k, v in pairs(tensors) do
    if type(k) ~= "string" then error("save: tensor names must be strings, got " .. type(k), 2) end
    if k:find("\0", 1, true) then error(("save: the tensor name %q holds a NUL byte"):format(k), 2) end
    if not tensor.is_tensor(v) then error(("save: '%s' is a %s, not a tensor"):format(k, type(v)), 2) end
    names[#names + 1] = k
  end
  table.sort(names)
  local n = #names
  local cnames = ffi.new("const char*[?]", math.max(n, 1))
  local cts = ffi.new("lt_tensor*[?]", math.max(n, 1))
  for i, k in ipairs(names) do
    cnames[i - 1] = k
    cts[i - 1] = tensors[k]
  end
  local meta = nil
  if metadata ~= nil then
    if type(metadata) ~= "table" then error("save: metadata must be a table of strings", 2) end
    for k, v in pairs(metadata) do
      if type(k) ~= "string" or type(v) ~= "string" then error("save: metadata must map strings to strings", 2) end
    end
    meta = next(metadata) and json.encode(metadata) or nil
  end
  if C.lt_safetensors_save(path, n, cnames, cts, meta) ~= 0 then fail(2) end
end

return M
