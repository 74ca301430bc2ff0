--- lutra.safetensors_sharded: a model's weights as Hugging Face splits them
-- (transformers' save_pretrained with max_shard_size, and from_pretrained):
-- model-00001-of-0000N.safetensors ... and model.safetensors.index.json,
-- {"metadata": {"total_size": bytes}, "weight_map": {tensor name: file}};
-- or one model.safetensors when the weights fit one shard.
--
--   local tensors = sharded.read(dir)                  -- either layout
--   sharded.write(dir, tensors, { max_shard_bytes = 5e9 })
--
-- Reading checks the index against the shards: a shard it names that is
-- missing, a tensor it maps to a shard that does not hold it, a tensor two
-- shards hold, a file name that leaves the directory: errors naming the
-- tensor and the file. Writing puts the tensors in natural name order
-- (layer 2 before layer 10), a shard filled up to max_shard_bytes (a tensor
-- larger than that alone in its shard, as transformers does), each file
-- written atomically, the index last; files of this naming left from an
-- earlier export of another layout are removed after, so a directory holds
-- one layout.
local json = require "lutra.json"
local safetensors = require "lutra.safetensors"
local capi = require "lutra.capi"
local C = capi.C

local M = {}

M.INDEX = "model.safetensors.index.json"
M.SINGLE = "model.safetensors"

local function exists(path)
  local f = io.open(path, "rb")
  if f then f:close() end
  return f ~= nil
end

local function read_text(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local text = f:read("*a")
  f:close()
  return text
end

-- names in natural order: runs of digits compare as numbers
local function natural_less(a, b)
  local function parts(s)
    local out = {}
    for text, num in s:gmatch("(%D*)(%d*)") do
      if text ~= "" then out[#out + 1] = text end
      if num ~= "" then out[#out + 1] = tonumber(num) end
    end
    return out
  end
  local pa, pb = parts(a), parts(b)
  for i = 1, math.max(#pa, #pb) do
    local x, y = pa[i], pb[i]
    if x == nil then return true end
    if y == nil then return false end
    if type(x) ~= type(y) then return type(x) == "number" end
    if x ~= y then return x < y end
  end
  return false
end
M.natural_less = natural_less

--- sharded.layout(dir) -> "index", "single" or nil: which the directory
-- holds (the index first, as from_pretrained looks for it when both are there).
function M.layout(dir)
  if exists(dir .. "/" .. M.INDEX) then return "index" end
  if exists(dir .. "/" .. M.SINGLE) then return "single" end
  return nil
end

--- sharded.read(dir[, who = "hf.load"]) -> {name = tensor}, files (the
-- paths read): dir's model.safetensors.index.json and its shards, or its
-- model.safetensors. Raises "<who>: ..." naming the index, the shard or
-- the tensor that is wrong, or the directory that holds neither.
function M.read(dir, who)
  who = who or "hf.load"
  local kind = M.layout(dir)
  if kind == "single" then
    local path = dir .. "/" .. M.SINGLE
    local ok, t = pcall(safetensors.load, path)
    if not ok then error(("%s: %s"):format(who, tostring(t):gsub("^.-safetensors ", "safetensors ")), 0) end
    return t, { path }
  end
  if kind == nil then
    error(("%s: %s holds neither %s nor %s"):format(who, dir, M.SINGLE, M.INDEX), 0)
  end
  local ipath = dir .. "/" .. M.INDEX
  local ok, index = pcall(json.decode, read_text(ipath) or "")
  if not ok or type(index) ~= "table" or type(index.weight_map) ~= "table" then
    error(("%s: %s is not a safetensors index (a JSON object with a weight_map)"):format(who, ipath), 0)
  end
  local by_file, files = {}, {}
  for name, file in pairs(index.weight_map) do
    if type(name) ~= "string" or type(file) ~= "string" then
      error(("%s: %s: the weight_map must map tensor names to file names"):format(who, ipath), 0)
    end
    if file:find("/", 1, true) or file:find("\\", 1, true) or file == ".." or file == "." then
      error(("%s: %s: %s maps to %s, a path outside the directory"):format(who, ipath, name, file), 0)
    end
    if not by_file[file] then
      by_file[file] = {}
      files[#files + 1] = file
    end
    table.insert(by_file[file], name)
  end
  table.sort(files, natural_less)
  local out, paths, owner = {}, {}, {}
  for _, file in ipairs(files) do
    local path = dir .. "/" .. file
    if not exists(path) then
      error(("%s: %s names the shard %s (for %s and %d more), which is missing"):format(who, ipath, path,
        by_file[file][1], #by_file[file] - 1), 0)
    end
    local ok2, t = pcall(safetensors.load, path)
    if not ok2 then error(("%s: %s"):format(who, tostring(t):gsub("^.-safetensors ", "safetensors ")), 0) end
    for _, name in ipairs(by_file[file]) do
      if t[name] == nil then
        error(("%s: %s maps %s to %s, which does not hold it"):format(who, ipath, name, path), 0)
      end
    end
    for name, v in pairs(t) do
      if owner[name] then
        error(("%s: %s is in both %s and %s"):format(who, name, owner[name], path), 0)
      end
      owner[name] = path
      -- (a tensor the index does not map is left out, as from_pretrained reads through the map)
      if index.weight_map[name] == file then out[name] = v end
    end
    paths[#paths + 1] = path
  end
  return out, paths
end

-- the files of this naming in dir (to remove what another layout left)
local function ours(dir)
  local out = {}
  for _, name in ipairs(capi.list_dir(dir)) do
    if name == M.SINGLE or name == M.INDEX or name:match("^model%-%d+%-of%-%d+%.safetensors$") then
      out[#out + 1] = name
    end
  end
  return out
end

--- sharded.write(dir, tensors[, {max_shard_bytes = 5e9, metadata =
-- {format = "pt"}}]) -> the file names written: one model.safetensors when
-- every tensor fits one shard, else model-0000i-of-0000N.safetensors and
-- the index (transformers' names and format; 5 GB is save_pretrained's
-- default max_shard_size). The directory must exist. Raises naming the
-- file it could not write.
function M.write(dir, tensors, o)
  o = o or {}
  local limit = o.max_shard_bytes or 5e9
  if type(limit) ~= "number" or not (limit > 0) then
    error(("hf.export: max_shard_bytes must be a number > 0, got %s"):format(tostring(limit)), 2)
  end
  local names = {}
  for name in pairs(tensors) do names[#names + 1] = name end
  table.sort(names, natural_less)
  local shards, cur, size, total = {}, nil, 0, 0
  for _, name in ipairs(names) do
    local b = tensors[name]:nbytes()
    if not cur or (size > 0 and size + b > limit) then
      cur, size = {}, 0
      shards[#shards + 1] = cur
    end
    cur[name], size, total = tensors[name], size + b, total + b
  end
  local meta = o.metadata or { format = "pt" }
  local written = {}
  if #shards <= 1 then
    safetensors.save(dir .. "/" .. M.SINGLE, shards[1] or {}, meta)
    written[1] = M.SINGLE
  else
    local map = {}
    for i, shard in ipairs(shards) do
      local file = ("model-%05d-of-%05d.safetensors"):format(i, #shards)
      safetensors.save(dir .. "/" .. file, shard, meta)
      for name in pairs(shard) do map[name] = file end
      written[#written + 1] = file
    end
    local text = json.encode { metadata = { total_size = total }, weight_map = map } .. "\n"
    if C.lt_write_file_atomic(dir .. "/" .. M.INDEX, text, #text) ~= 0 then
      error("hf.export: " .. capi.ffi.string(C.lt_last_error()), 2)
    end
    written[#written + 1] = M.INDEX
  end
  local keep = {}
  for _, f in ipairs(written) do keep[f] = true end
  for _, f in ipairs(ours(dir)) do
    if not keep[f] then os.remove(dir .. "/" .. f) end
  end
  return written
end

return M
