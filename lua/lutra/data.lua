--- lutra.data (lt.data): token shards and batches (host/io/loader.c).
--
--   local train = lt.data.shards { path = "data/pydocs/train", batch = 8, seq = 256, seed = 1337 }
--   local x, y = train:next()                 -- (B, T) i32 each
--   local s = train:state()                   -- {epoch =, index =} after the batches taken
--   train:load_state(s)                       -- continue exactly from there
--   local val = lt.data.shards { path = "data/pydocs/val", batch = 8, seq = 256, shuffle = false, epochs = 1 }
--   for x, y in val:batches() do ... end
--
-- path is a directory (its *.bin files), a prefix ("dir/train" takes
-- dir/train*.bin), one file, or a table of files; files are taken in sorted
-- order.
--
-- Under data parallelism (rank, world: lt.dist's by default) every rank
-- reads floor(windows / world) windows per epoch, rank r the positions r,
-- r + world, ... of the epoch's order; the last (windows mod world) windows
-- of each epoch's order are dropped (torch's DistributedSampler with
-- drop_last), so the ranks' batches of a step are disjoint slices of one
-- global batch, each window is read at most once per epoch and all ranks
-- change epoch at the same step (loader:windows_per_epoch() says how many).
local capi = require "lutra.capi"
local tensor = require "lutra.tensor"
local comm = require "lutra.dist.comm"
local ffi, C, fail = capi.ffi, capi.C, capi.fail

local M = {}
local Loader = {}
Loader.__index = Loader

local box = ffi.new("lt_loader*[1]")
local xb, yb = ffi.new("lt_tensor*[1]"), ffi.new("lt_tensor*[1]")
local e_out, i_out = ffi.new("int64_t[1]"), ffi.new("int64_t[1]")

--- The shard files a path names (sorted); raises when there are none.
function M.files(path)
  if type(path) == "table" then return path end
  if type(path) ~= "string" then error("shards: path must be a string or a table of files", 3) end
  local function list(cmd)
    local out = {}
    local p = io.popen(cmd)
    for line in p:lines() do out[#out + 1] = line end
    p:close()
    return out
  end
  local q = "'" .. path:gsub("'", "'\\''") .. "'"
  local files = list("LC_ALL=C find " .. q .. " -maxdepth 1 -type f -name '*.bin' 2>/dev/null | LC_ALL=C sort")
  if #files == 0 then
    local f = io.open(path, "rb")
    if f then
      f:close()
      files = { path }
    else
      local dir, prefix = path:match("^(.-)([^/]*)$")
      if dir == "" then dir = "." end
      local qd = "'" .. dir:gsub("'", "'\\''") .. "'"
      local qp = "'" .. prefix:gsub("'", "'\\''") .. "*.bin'"
      files = list("LC_ALL=C find " .. qd .. " -maxdepth 1 -type f -name " .. qp .. " 2>/dev/null | LC_ALL=C sort")
    end
  end
  if #files == 0 then error(("shards: no shard files at '%s' (a directory, a prefix of *.bin files, or a file)"):format(path), 3) end
  return files
end

--- lt.data.shards{path =, batch =, seq =, seed = 0, shuffle = true, rank = 0,
-- world = 1, epochs = 0 (no end), prefetch = 4}: a loader (see above).
function M.shards(o)
  if type(o) ~= "table" then error("shards: expected a table of options", 2) end
  local files = M.files(o.path)
  local B, T = o.batch, o.seq
  if type(B) ~= "number" or type(T) ~= "number" then error("shards: batch and seq must be numbers", 2) end
  local dist_rank, dist_world = comm.rank(), comm.world_size()
  local rank, world = o.rank or dist_rank, o.world or dist_world
  local paths = ffi.new("const char*[?]", #files)
  for i, f in ipairs(files) do paths[i - 1] = f end
  if C.lt_loader_open(#files, paths, B, T, o.shuffle == false and 0 or 1, o.seed or 0, rank, world, o.epochs or 0,
      o.prefetch or 4, box) ~= 0 then
    fail(2)
  end
  return setmetatable({ l = ffi.gc(box[0], C.lt_loader_close), files = files, batch = B, seq = T, seed = o.seed or 0,
    rank = rank, world = world, keep = paths }, Loader)
end

--- loader:next() -> x, y ((B, T) i32), or nil at the end of a finite loader.
function Loader:next()
  if C.lt_loader_next(self.l, xb, yb) ~= 0 then fail(2) end
  if xb[0] == nil then return nil end
  return ffi.gc(xb[0], C.lt_tensor_release), ffi.gc(yb[0], C.lt_tensor_release)
end

--- for x, y in loader:batches([n]) do ... end: up to n batches (or to the end).
function Loader:batches(n)
  local k = 0
  return function()
    if n and k >= n then return nil end
    k = k + 1
    return self:next()
  end
end

--- loader:state() -> {epoch =, index =, seed =, rank =, world =}: what
-- load_state needs to continue exactly after the batches taken so far.
function Loader:state()
  C.lt_loader_get_state(self.l, e_out, i_out)
  return { epoch = tonumber(e_out[0]), index = tonumber(i_out[0]), seed = self.seed, rank = self.rank,
    world = self.world }
end

--- loader:load_state(s): continue from a state (same files, batch, seq, seed, rank, world).
function Loader:load_state(s)
  if type(s) ~= "table" or type(s.epoch) ~= "number" or type(s.index) ~= "number" then
    error("load_state: expected {epoch =, index =}", 2)
  end
  if (s.seed and s.seed ~= self.seed) or (s.world and s.world ~= self.world) or (s.rank and s.rank ~= self.rank) then
    error(("load_state: the state is for seed %s, rank %s of %s; this loader has seed %d, rank %d of %d")
      :format(tostring(s.seed), tostring(s.rank), tostring(s.world), self.seed, self.rank, self.world), 2)
  end
  if C.lt_loader_set_state(self.l, s.epoch, s.index) ~= 0 then fail(2) end
end

function Loader:num_windows() return tonumber(C.lt_loader_num_windows(self.l)) end
function Loader:num_tokens() return tonumber(C.lt_loader_num_tokens(self.l)) end
--- Full batches in one epoch of this rank's stream.
function Loader:batches_per_epoch() return tonumber(C.lt_loader_batches_per_epoch(self.l)) end
--- Windows this rank reads per epoch: floor(num_windows() / world), the same on every rank.
function Loader:windows_per_epoch() return tonumber(C.lt_loader_windows_per_epoch(self.l)) end

function Loader:close()
  if self.l ~= nil then
    C.lt_loader_close(ffi.gc(self.l, nil))
    self.l = nil
  end
end

--- lt.data.read_shard(path) -> a 1-D i32 tensor of every token of one shard file.
function M.read_shard(path)
  if type(path) ~= "string" then error("read_shard: path must be a string", 2) end
  local out = ffi.new("lt_tensor*[1]")
  if C.lt_shard_read(path, out) ~= 0 then fail(2) end
  return ffi.gc(out[0], C.lt_tensor_release)
end

--- lt.data.unigram_entropy(train_path, val_path[, vocab_size = 50257]) ->
-- nats per token, the tokens read: the cross-entropy of the validation tokens
-- under the training tokens' unigram frequencies (add-one smoothed over the
-- vocabulary, so unseen tokens cost log(N + V) at most). The loss a model
-- that ignores context could reach: a baseline for a training run.
function M.unigram_entropy(train_path, val_path, vocab_size)
  for _, path in ipairs { train_path, val_path } do
    if type(path) == "table" and path.next then
      error("unigram_entropy: takes the shards' paths (\"data/pydocs/train\"), not a loader", 2)
    end
  end
  local V = vocab_size or 50257
  -- calls fn(id) for every token of the shards under path; returns their count
  local function each_token(path, fn)
    local count = 0
    for _, f in ipairs(M.files(path)) do
      local t = M.read_shard(f)
      local n, p = t:numel(), t:data_ptr()
      for i = 0, n - 1 do
        local id = p[i]
        if id < 0 or id >= V then
          error(("unigram_entropy: %s holds token %d, outside the vocabulary of %d"):format(f, id, V), 3)
        end
        fn(id)
      end
      count = count + n
      t:free()
    end
    return count
  end
  local counts = ffi.new("double[?]", V)
  local ntrain = each_token(train_path, function(id) counts[id] = counts[id] + 1 end)
  local total, denom = 0, ntrain + V
  local nval = each_token(val_path, function(id) total = total - math.log((counts[id] + 1) / denom) end)
  if nval == 0 then error("unigram_entropy: the validation shards hold no tokens", 2) end
  return total / nval, ntrain, nval
end

--- lt.data.write_shard(path, ids, vocab_size): ids is an integer tensor
-- (or a table of ids); vocab_size decides uint16 or uint32 tokens.
function M.write_shard(path, ids, vocab_size)
  if not tensor.is_tensor(ids) then ids = tensor.tensor(ids, { dtype = "i32" }) end
  local t = ids:to("cpu", "i32"):contiguous()
  if C.lt_shard_write(path, t:numel() > 0 and t:data_ptr() or nil, t:numel(), vocab_size or 50257) ~= 0 then fail(2) end
end

return M
