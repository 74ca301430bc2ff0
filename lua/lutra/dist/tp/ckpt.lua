--- lutra.dist.tp.ckpt: the checkpoint files of a tensor-parallel model, for
-- lt.ckpt (lua/lutra/ckpt.lua), which writes the directory and state.json.
--
-- Under tensor parallelism (tp > 1; the mesh's order, rank = tp_rank + tp *
-- dp_rank) each TP rank of DP rank 0 writes
--   model-tp<r 5 digits>.safetensors      its state_dict() as it is: its
--       shards under the whole model's names, and the replicated tensors
--       (Megatron's mp_rank_<r> files hold the same), so that a resume on the
--       same layout reads one file per rank; metadata: format "lutra",
--       config (the model config), tp_rank, tp_size and shards (JSON:
--       {name = {dim =, parts =}}, the records of lutra.dist.tp.records)
--   optimizer-tp<r>.safetensors           a non-ZeRO optimizer's state (it
--       differs on each TP rank; the DP ranks' are equal); ZeRO's state stays
--       one file per rank of the job, optimizer-rank<rank>.safetensors
-- and state.json's layout is {world_size =, dp =, tp =, zero =}. tp = 1 is the
-- layout without this file: model.safetensors and optimizer.safetensors.
--
-- Whole weights are read from either kind one tensor at a time
-- (open_weights: each rank's shard of it, assembled by the records saved),
-- so a checkpoint's weights load into a model of any TP size (load_weights,
-- slicing each whole tensor by that model's records; the vocabulary's rows
-- re-padded where the model pads them to another multiple) or into one
-- process (lt.ckpt.load_model).
local safetensors = require "lutra.safetensors"
local tensor = require "lutra.tensor"
local json = require "lutra.json"
local comm = require "lutra.dist.comm"
local records = require "lutra.dist.tp.records"
local state = require "lutra.dist.tp.state"

local M = {}

--- tp.ckpt.model_file(tp_rank), optimizer_file(tp_rank) -> the file names of a TP rank.
function M.model_file(r) return ("model-tp%05d.safetensors"):format(r) end
function M.optimizer_file(r) return ("optimizer-tp%05d.safetensors"):format(r) end

--- tp.ckpt.layout(model) -> {tp =, tp_rank =, dp =, dp_rank =, group =, ok =,
-- why =}: this rank's place in the job by the model's TP group (tp = 1 and
-- dp = the world's size for a model that is not tensor-parallel). ok is false
-- (why says so) when the group is not laid out as lt.dist.mesh does: its
-- size not dividing the world, or this rank's place in it not rank % tp.
function M.layout(model)
  local world, rank = comm.world_size(), comm.rank()
  local g = records.group(model)
  if not g then return { tp = 1, tp_rank = 0, dp = world, dp_rank = rank, ok = true } end
  local n, r = g:size(), g:rank()
  local l = { tp = n, tp_rank = r, dp = math.floor(world / n), dp_rank = math.floor(rank / n), group = g, ok = true }
  if world % n ~= 0 or rank % n ~= r then
    l.ok = false
    l.why = ("rank %d is rank %d of a tensor-parallel group of %d ranks in a job of %d: checkpoints take the layout of lt.dist.mesh (rank = tp_rank + tp * dp_rank)")
      :format(rank, r, n, world)
  end
  return l
end

--- tp.ckpt.describe(layout) -> "dp 2 x tp 2 (4 ranks), ZeRO 1": a layout of
-- state.json (or of layout() with zero) in words. Missing dp / tp (a
-- checkpoint saved before TP): tp 1, dp the world size.
function M.describe(l)
  local world, tp = l.world_size or 1, l.tp or 1
  return ("dp %d x tp %d (%d rank%s), ZeRO %d"):format(l.dp or math.floor(world / tp), tp, world,
    world == 1 and "" or "s", l.zero or 0)
end

local function whole(v, lo) return type(v) == "number" and v == math.floor(v) and v >= lo and v < 2 ^ 53 end

--- tp.ckpt.check_layout(layout) -> nil, or the field of state.json's layout
-- and what is wrong with it: dp and tp (when present) whole numbers >= 1
-- whose product is world_size.
function M.check_layout(l)
  if type(l) ~= "table" then return nil end
  for _, k in ipairs { "dp", "tp" } do
    if l[k] ~= nil and not whole(l[k], 1) then
      return "layout." .. k, "must be a whole number >= 1, got " .. tostring(l[k])
    end
  end
  if l.pp ~= nil and not whole(l.pp, 1) then return "layout.pp", "must be a whole number >= 1, got " .. tostring(l.pp) end
  if l.tp and (l.dp or 1) * l.tp * (l.pp or 1) ~= (l.world_size or 1) then
    return "layout", ("has dp %s x tp %d%s, not its world_size %s"):format(tostring(l.dp), l.tp,
      l.pp and (" x pp %d"):format(l.pp) or "", tostring(l.world_size))
  end
  return nil
end

--- tp.ckpt.files(layout, {opt =, sharded =, world =}) -> the names of the
-- weights' and optimizer's files a job of this layout writes.
function M.files(l, o)
  local out = {}
  if l.tp > 1 then
    for r = 0, l.tp - 1 do out[#out + 1] = M.model_file(r) end
  else
    out[1] = "model.safetensors"
  end
  if o.opt then
    if o.sharded then
      for r = 0, o.world - 1 do out[#out + 1] = ("optimizer-rank%05d.safetensors"):format(r) end
    elseif l.tp > 1 then
      for r = 0, l.tp - 1 do out[#out + 1] = M.optimizer_file(r) end
    else
      out[#out + 1] = "optimizer.safetensors"
    end
  end
  return out
end

--- tp.ckpt.save_model(path, model, layout, config_json): writes this rank's
-- model-tp<r> file (its state_dict, the metadata above).
function M.save_model(path, model, l, config_json)
  safetensors.save(path, model:state_dict(), { format = "lutra", config = config_json, tp_rank = tostring(l.tp_rank),
    tp_size = tostring(l.tp), shards = json.encode(records.plan(model)) })
end

--- tp.ckpt.model_files(st) -> the weights' files a checkpoint's state.json
-- (st) lists: model.safetensors, or its model-tp<r> files in rank order.
function M.model_files(st)
  local tp = st.layout and st.layout.tp or 1
  if tp <= 1 or st.files["model.safetensors"] then return { "model.safetensors" } end
  local out = {}
  for r = 0, tp - 1 do out[#out + 1] = M.model_file(r) end
  return out
end

--- tp.ckpt.direct_file(path, st, model) -> the file this rank loads as its
-- state dict as it is, when the checkpoint was saved at the model's TP size
-- with the model's records (model.safetensors at tp = 1, model-tp<tp_rank>
-- at tp = n whose metadata's shards are the model's dims and parts); nil
-- when the weights must be assembled and sliced (load_weights).
function M.direct_file(path, st, model)
  local saved = st.layout and st.layout.tp or 1
  local g = records.group(model)
  local n = g and g:size() or 1
  if saved ~= n then return nil end
  if n == 1 then return "model.safetensors" end
  local file = M.model_file(g:rank())
  return M.same_shards(path .. "/" .. file, model) and file or nil
end

--- tp.ckpt.same_shards(file, model) -> true when a TP rank's file (its
-- metadata's shards) records the model's own dims and parts for the same
-- tensors (the file then loads as it is); false when unreadable or other.
function M.same_shards(file, model)
  local ok, shards = pcall(function()
    local rd = safetensors.open(file)
    local meta = rd:metadata()
    rd:close()
    return json.decode(meta.shards)
  end)
  if not ok or type(shards) ~= "table" then return false end -- (load_weights names what is wrong)
  local plan = records.plan(model)
  local function same(x, y)
    for name, a in pairs(x) do
      local b = y[name]
      if not (b and a.dim == b.dim and (a.parts or 1) == (b.parts or 1)) then return false end
    end
    return true
  end
  return same(plan, shards) and same(shards, plan)
end

-- the tensor entries of a safetensors file's header: {name = {dtype =, shape =}}
-- (the reader has validated the file; this reads its header only)
local function header(path)
  local f = io.open(path, "rb")
  if not f then error(path .. " is missing", 0) end
  local b = f:read(8)
  local n = 0
  for i = 8, 1, -1 do n = n * 256 + b:byte(i) end
  local h = json.decode(f:read(n))
  f:close()
  h.__metadata__ = nil
  return h
end

local function is_float(dtype) return dtype:sub(1, 1) == "F" or dtype == "BF16" end

--- tp.ckpt.open_weights(path, st[, files]) -> src: the whole weights of a checkpoint
-- (path, its state.json st; files: the TP ranks' files of one pipeline
-- stage, lutra.dist.pp.ckpt, else model_files(st)) one tensor at a time. src.shape[name] (the
-- whole shape), src.float[name] (a float dtype?), src:get(name) -> the whole
-- CPU tensor (read from each file holding a shard of it and assembled, or
-- from the first file when replicated), src:close(). Raises naming the file
-- when the shard files disagree with each other or with state.json (their
-- tp_rank, tp_size, names or shapes).
function M.open_weights(path, st, files)
  files = files or M.model_files(st)
  local tp = #files
  local src = { shape = {}, float = {}, readers = {}, recs = {}, path = path, files = files }
  local ok, err = pcall(function()
    local first
    for r, file in ipairs(files) do
      local full = path .. "/" .. file
      src.readers[r] = safetensors.open(full, 3)
      local entries = header(full)
      if tp > 1 then
        local meta = src.readers[r]:metadata()
        if tonumber(meta.tp_rank) ~= r - 1 or tonumber(meta.tp_size) ~= tp then
          error(("%s: its metadata says tp_rank %s of tp_size %s, state.json's layout rank %d of %d"):format(full,
            tostring(meta.tp_rank), tostring(meta.tp_size), r - 1, tp), 0)
        end
        if r == 1 then
          local okj, shards = pcall(json.decode, meta.shards or "null")
          if not okj or type(shards) ~= "table" then error(full .. ": the metadata field 'shards' is missing or malformed", 0) end
          src.recs = shards
        end
      end
      if not first then
        first = entries
        for name, e in pairs(entries) do
          local rec = src.recs[name]
          if rec and (type(rec.dim) ~= "number" or not e.shape[rec.dim]) then
            error(("%s: shards.%s has no dim %s of its shape [%s]"):format(full, name, tostring(rec.dim),
              table.concat(e.shape, ", ")), 0)
          end
          src.shape[name] = state.whole_shape(e.shape, rec, tp)
          src.float[name] = is_float(e.dtype)
        end
      else
        for name, e in pairs(entries) do
          local f = first[name]
          if not f or table.concat(f.shape, ",") ~= table.concat(e.shape, ",") or f.dtype ~= e.dtype then
            error(("%s: %s is %s [%s], %s holds %s"):format(full, name, e.dtype, table.concat(e.shape, ", "), files[1],
              f and ("%s [%s]"):format(f.dtype, table.concat(f.shape, ", ")) or "none"), 0)
          end
        end
        for name in pairs(first) do
          if not entries[name] then error(("%s holds no %s (%s does)"):format(full, name, files[1]), 0) end
        end
      end
    end
  end)
  if not ok then
    for _, rd in ipairs(src.readers) do rd:close() end
    error(tostring(err):gsub("^.-safetensors ", "safetensors "), 0)
  end
  function src.get(self, name)
    local rec = self.recs[name]
    if not rec then return self.readers[1]:get(name) end
    local pieces = {}
    for r, rd in ipairs(self.readers) do pieces[r] = rd:get(name) end
    return state.assemble(pieces, rec)
  end
  function src.close(self)
    for _, rd in ipairs(self.readers) do rd:close() end
  end
  return src
end

--- tp.ckpt.vocab_rows(st, model) -> nil, or {saved =, model =, rows =}
-- when the checkpoint (its state.json st) and the model hold the same
-- vocabulary (model_config.vocab_size, rows) padded to other row counts
-- (padded_vocab_size: pad_vocab, or tensor parallelism's multiple of tp):
-- a tp = 2 checkpoint of GPT-2's 50257 ids holds 50258 rows, a tp = 4 model
-- 50260, one process 50257. The padding rows are zero and never used.
function M.vocab_rows(st, model)
  local mc, cfg = st.model_config, model.config
  if type(mc) ~= "table" or type(cfg) ~= "table" or type(cfg.vocab_size) ~= "number" then return nil end
  if mc.vocab_size ~= cfg.vocab_size then return nil end
  local saved, mine = mc.padded_vocab_size or mc.vocab_size, cfg.padded_vocab_size or cfg.vocab_size
  if saved == mine then return nil end
  return { saved = saved, model = mine, rows = cfg.vocab_size }
end

--- tp.ckpt.repad(whole, rows, padded) -> whole's first rows rows, followed
-- by zero rows up to padded (a vocabulary's rows padded to another multiple).
function M.repad(whole, rows, padded)
  local shape = whole:shape()
  local sizes = {}
  for d = 1, #shape do sizes[d] = shape[d] end
  sizes[1] = padded
  local out = tensor.zeros(sizes, { dtype = whole.dtype })
  local k = math.min(rows, whole:size(1))
  out:narrow(1, 1, k):copy_(whole:narrow(1, 1, k))
  return out
end

--- tp.ckpt.load_weights(path, st, model) -> model: every tensor of the
-- model's state dict from the checkpoint's whole weights (open_weights), this
-- rank's slice of it by the model's records (tp.load_full_state_dict's
-- slicing), one tensor at a time: a checkpoint of any TP size into a model of
-- any TP size (one process too). Names and whole shapes are all checked
-- before anything is copied; errors read "<path>/<files>: missing: ...;
-- unexpected: ...; wrong shape or dtype: name (checkpoint [..], model whole [..])".
-- o (lutra.dist.pp.ckpt's): {src = (an opened source: its shape, float,
-- get, close, files), where = (the files in messages), from = function(name)
-- -> the source's name of the model's tensor (a pipeline stage's tied head
-- copy is the embedding's), partial = (the model holds part of the names:
-- the others are not unexpected)}.
function M.load_weights(path, st, model, o)
  o = o or {}
  local src = o.src or M.open_weights(path, st)
  local where = path .. "/" .. (o.where or (#src.files > 1 and ("model-tp*.safetensors (%d files)"):format(#src.files) or src.files[1]))
  local from = o.from or function(name) return name end
  local g = records.group(model)
  local n = g and g:size() or 1
  local plan = g and records.plan(model) or {}
  local own = model:state_dict()
  local missing, unexpected, shaped = {}, {}, {}
  local vocab = M.vocab_rows(st, model)
  local repad = {} -- name -> true: the vocabulary's rows, padded to another multiple in the checkpoint
  local wanted = {} -- the source's names the model takes
  for name, t in pairs(own) do
    wanted[from(name)] = true
    local have, want = src.shape[from(name)], state.whole_shape(t:shape(), plan[name], n)
    if have and vocab and have[1] == vocab.saved and want[1] == vocab.model and #have == #want then
      local rest = true
      for d = 2, #want do rest = rest and have[d] == want[d] end
      if rest then
        repad[name] = true
        local h = {}
        for d = 1, #want do h[d] = have[d] end
        h[1], have = want[1], h
      end
    end
    if not have then
      missing[#missing + 1] = name
    elseif tostring(setmetatable(have, getmetatable(want))) ~= tostring(want) then
      shaped[#shaped + 1] = ("%s (checkpoint %s, model whole %s)"):format(name, tostring(have), tostring(want))
    elseif src.float[from(name)] ~= t:is_floating_point() then
      shaped[#shaped + 1] = ("%s (checkpoint %s, model %s)"):format(name, src.float[from(name)] and "float" or "integer",
        t.dtype)
    end
  end
  -- (o.partial: a pipeline stage takes its part of the whole weights; the model config, checked by
  -- lt.ckpt.load, binds the rest)
  for name in pairs(src.shape) do
    if not wanted[name] and not o.partial then unexpected[#unexpected + 1] = name end
  end
  local bad = state.mismatch(missing, unexpected, shaped)
  if bad then
    src:close()
    error(where .. ": " .. bad, 0)
  end
  local ok, err = pcall(function()
    for _, name in ipairs(model:state_dict_names()) do
      local whole = src:get(from(name))
      if repad[name] then whole = M.repad(whole, vocab.rows, vocab.model) end
      state.copy_whole(own[name], whole, plan[name], g)
    end
  end)
  src:close()
  if not ok then error(where .. ": " .. tostring(err), 0) end
  return model
end

return M
