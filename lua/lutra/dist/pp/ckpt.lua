--- lutra.dist.pp.ckpt: the checkpoint files of a model split into pipeline
-- stages (model.pp, lutra.models.pipeline), and of any other layout, for
-- lt.ckpt (lua/lutra/ckpt.lua), which writes the directory and state.json.
-- A model that is not split over a pipeline takes lutra.dist.tp.ckpt's files
-- as they are (model.safetensors, or model-tp<r>.safetensors per TP rank).
--
-- Under pipeline parallelism (pp > 1; lt.dist.mesh's order, rank = tp_rank
-- + tp * (dp_rank + dp * pp_rank)) each stage's ranks of DP rank 0 write
--   model-pp<s 5 digits>.safetensors           (tp = 1), or
--   model-pp<s>-tp<r 5 digits>.safetensors     (tp > 1)
--       the stage's state_dict() as it is (its blocks under the whole
--       model's names; the last stage's copy of a tied head as
--       lm_head.weight), so that a resume on the same layout reads one file
--       per rank; metadata: format "lutra", config, pp_rank, pp_size,
--       virtual_stages, pp_stages (JSON: blocks per virtual stage), tied
--       (JSON: {["lm_head.weight"] = "transformer.wte.weight"} on the stage
--       holding such a copy: the name it has in the whole model, whose
--       tensor the first stage's file holds), and under TP lutra.dist.tp.ckpt's
--       tp_rank, tp_size and shards
--   optimizer-pp<s>[-tp<r>].safetensors        a non-ZeRO optimizer's state
--       (each stage's differs); ZeRO 1-2 keeps one file per rank of the
--       job, optimizer-rank<rank>.safetensors (its chunk of its stage)
-- and state.json's layout is {world_size, dp, tp, pp, virtual_stages,
-- pp_stages, zero}: a resume needs all of them the same (other_layout).
--
-- The whole weights are read one tensor at a time from every stage's files
-- (open_weights: each tensor from the stage that holds it, TP shards
-- assembled; a tied copy left out, the first stage holding it), so a
-- pipeline checkpoint loads into one process (lt.ckpt.load_model) or into a
-- model of any other pipeline or TP layout (load_weights, each stage taking
-- its names), and full_state_dict gathers a live stage's tensors to rank 0
-- (lt.hf.export of a pipeline model).
local tensor = require "lutra.tensor"
local safetensors = require "lutra.safetensors"
local json = require "lutra.json"
local comm = require "lutra.dist.comm"
local records = require "lutra.dist.tp.records"
local tpck = require "lutra.dist.tp.ckpt"
local tp_state = require "lutra.dist.tp.state"

local M = {}

--- pp.ckpt.model_file(pp_rank, tp_rank, pp, tp), optimizer_file(...) ->
-- the file names of a stage's TP rank: model-pp<s>[-tp<r>].safetensors
-- (pp = 1: lutra.dist.tp.ckpt's, model-tp<r> or model.safetensors).
local function part_file(kind, s, r, pp, tp)
  if pp <= 1 then
    if tp > 1 then return ("%s-tp%05d.safetensors"):format(kind, r) end
    return kind .. ".safetensors"
  end
  if tp <= 1 then return ("%s-pp%05d.safetensors"):format(kind, s) end
  return ("%s-pp%05d-tp%05d.safetensors"):format(kind, s, r)
end
function M.model_file(s, r, pp, tp) return part_file("model", s, r, pp, tp) end
function M.optimizer_file(s, r, pp, tp) return part_file("optimizer", s, r, pp, tp) end

--- pp.ckpt.layout(model) -> lutra.dist.tp.ckpt.layout's {tp, tp_rank, dp,
-- dp_rank, group, ok, why} with pp, pp_rank, virtual_stages, pp_stages
-- (the model's blocks per virtual stage), split (tp > 1 or pp > 1: a file
-- per part), model_file and optimizer_file (this rank's part's names). ok
-- is false (why says so) when the pipeline is not laid out as lt.dist.mesh
-- lays it out.
function M.layout(model)
  local l = tpck.layout(model)
  local P = type(model) == "table" and rawget(model, "pp") or nil
  l.pp, l.pp_rank, l.virtual_stages = 1, 0, 1
  if P then
    local world, rank = comm.world_size(), comm.rank()
    local mp = l.tp * P.size
    l.pp, l.pp_rank, l.virtual_stages, l.pp_stages = P.size, P.rank, P.chunks, P.counts
    l.dp = math.floor(world / mp)
    l.dp_rank = math.floor(rank / l.tp) % math.max(l.dp, 1)
    if l.ok and (world % mp ~= 0 or math.floor(rank / (l.tp * l.dp)) ~= P.rank) then
      l.ok = false
      l.why = ("rank %d is stage %d of a pipeline of %d stages (tp %d) in a job of %d ranks: checkpoints take the "
        .. "layout of lt.dist.mesh (rank = tp_rank + tp * (dp_rank + dp * pp_rank))"):format(rank, P.rank, P.size,
        l.tp, world)
    end
  end
  l.split = l.tp > 1 or l.pp > 1
  l.model_file = M.model_file(l.pp_rank, l.tp_rank, l.pp, l.tp)
  l.optimizer_file = M.optimizer_file(l.pp_rank, l.tp_rank, l.pp, l.tp)
  return l
end

--- pp.ckpt.state_layout(layout, world_size, zero) -> state.json's layout:
-- {world_size, zero, dp, tp} and, for a pipeline, pp, virtual_stages and
-- pp_stages (dp: what the world leaves).
function M.state_layout(l, world, zero)
  local out = { world_size = world, zero = zero, tp = l.tp, dp = math.floor(world / (l.tp * l.pp)) }
  if l.pp > 1 then
    out.pp, out.virtual_stages, out.pp_stages = l.pp, l.virtual_stages, l.pp_stages
  end
  return out
end

local function stages_text(s) return type(s) == "table" and table.concat(s, "+") or "?" end

--- pp.ckpt.describe(layout) -> "dp 1 x tp 1 x pp 2 (blocks 2+2; 2 ranks),
-- ZeRO 0" (virtual stages: "x pp 2, 2 virtual stages a rank"): a layout of
-- state.json in words; without a pipeline lutra.dist.tp.ckpt.describe's.
function M.describe(l)
  if (l.pp or 1) <= 1 then return tpck.describe(l) end
  local world, tp, pp, v = l.world_size or 1, l.tp or 1, l.pp, l.virtual_stages or 1
  return ("dp %d x tp %d x pp %d%s (blocks %s; %d ranks), ZeRO %d"):format(l.dp or math.floor(world / (tp * pp)), tp,
    pp, v > 1 and (", %d virtual stages a rank"):format(v) or "", stages_text(l.pp_stages), world, l.zero or 0)
end

local function whole(v, lo) return type(v) == "number" and v == math.floor(v) and v >= lo and v < 2 ^ 53 end

--- pp.ckpt.check_layout(layout) -> nil, or the field of state.json's layout
-- and what is wrong with it: lutra.dist.tp.ckpt.check_layout's (dp x tp x
-- pp = world_size), virtual_stages a whole number >= 1 and pp_stages a
-- list of pp x virtual_stages whole numbers >= 1.
function M.check_layout(l)
  local field, why = tpck.check_layout(l)
  if field or type(l) ~= "table" or (l.pp or 1) <= 1 then return field, why end
  local v = l.virtual_stages or 1
  if not whole(v, 1) then return "layout.virtual_stages", "must be a whole number >= 1, got " .. tostring(v) end
  local s = l.pp_stages
  if type(s) ~= "table" or #s ~= l.pp * v then
    return "layout.pp_stages", ("must list the blocks of each of the %d virtual stages"):format(l.pp * v)
  end
  for i, c in ipairs(s) do
    if not whole(c, 1) then return "layout.pp_stages", ("[%d] must be a whole number >= 1, got %s"):format(i, tostring(c)) end
  end
  return nil
end

local HINT = "resuming on another layout is not supported yet; the weights alone load anywhere: "
  .. "lt.ckpt.load(path, {model = m}), lt.ckpt.load_weights or lt.ckpt.load_model"

--- pp.ckpt.other_layout(saved, mine) -> nil when a checkpoint's layout
-- (state.json's) is this job's for a resume (world size, TP size, pipeline
-- stages, virtual stages, blocks per stage; the ZeRO stage lt.ckpt.load
-- checks against the optimizer), else the refusal naming both layouts:
-- "the checkpoint's layout is dp 1 x tp 1 x pp 2 (blocks 2+2; 2 ranks),
-- ZeRO 0, this job's dp 2 x tp 1 (2 ranks), ZeRO 0 (another number of
-- pipeline stages: ...)".
function M.other_layout(saved, mine)
  local sw = saved.world_size or 1
  if sw ~= mine.world_size then
    return ("layout.world_size is %d, this job has %d ranks (the checkpoint's layout is %s, this job's %s; %s)"):format(
      sw, mine.world_size, M.describe(saved), M.describe(mine), HINT)
  end
  local what
  if (saved.tp or 1) ~= (mine.tp or 1) then what = "another tensor-parallel size"
  elseif (saved.pp or 1) ~= (mine.pp or 1) then what = "another number of pipeline stages"
  elseif (mine.pp or 1) > 1 and (saved.virtual_stages or 1) ~= (mine.virtual_stages or 1) then
    what = "another number of virtual stages"
  elseif (mine.pp or 1) > 1 and stages_text(saved.pp_stages) ~= stages_text(mine.pp_stages) then
    what = "other blocks per stage"
  end
  if not what then return nil end
  return ("the checkpoint's layout is %s, this job's %s (%s: %s)"):format(M.describe(saved), M.describe(mine), what,
    HINT)
end

--- pp.ckpt.files(layout, {opt =, sharded =, world =}) -> the names of the
-- weights' and optimizer's files a job of this layout writes (stage by
-- stage, TP rank by TP rank).
function M.files(l, o)
  local out = {}
  for s = 0, l.pp - 1 do
    for r = 0, l.tp - 1 do out[#out + 1] = M.model_file(s, r, l.pp, l.tp) end
  end
  if o.opt then
    if o.sharded then
      for r = 0, o.world - 1 do out[#out + 1] = ("optimizer-rank%05d.safetensors"):format(r) end
    else
      for s = 0, l.pp - 1 do
        for r = 0, l.tp - 1 do out[#out + 1] = M.optimizer_file(s, r, l.pp, l.tp) end
      end
    end
  end
  return out
end

local function stage_files(s, pp, tp)
  local out = {}
  for r = 0, tp - 1 do out[#out + 1] = M.model_file(s, r, pp, tp) end
  return out
end

--- pp.ckpt.model_files(st) -> the weights' files a checkpoint's state.json
-- (st) lists, stage by stage (without a pipeline lutra.dist.tp.ckpt's).
function M.model_files(st)
  local l = st.layout or {}
  if (l.pp or 1) <= 1 then return tpck.model_files(st) end
  local out = {}
  for s = 0, l.pp - 1 do
    for _, f in ipairs(stage_files(s, l.pp, l.tp or 1)) do out[#out + 1] = f end
  end
  return out
end

--- pp.ckpt.copies(model) -> {[name] = whole name}: the tensors of a
-- pipeline stage that are copies of another stage's (the last stage's tied
-- head, lm_head.weight, is the whole model's embedding); {} otherwise.
function M.copies(model)
  local P = type(model) == "table" and rawget(model, "pp") or nil
  if P and P.copy and not P.first and model:state_dict()["lm_head.weight"] then
    return { ["lm_head.weight"] = P.family.whole_tied }
  end
  return {}
end

--- pp.ckpt.save_model(path, model, layout, config_json): writes this
-- rank's part's file (its state_dict as it is, the metadata above).
function M.save_model(path, model, l, config_json)
  local meta = { format = "lutra", config = config_json }
  if l.tp > 1 then
    meta.tp_rank, meta.tp_size, meta.shards = tostring(l.tp_rank), tostring(l.tp), json.encode(records.plan(model))
  end
  if l.pp > 1 then
    meta.pp_rank, meta.pp_size, meta.virtual_stages = tostring(l.pp_rank), tostring(l.pp), tostring(l.virtual_stages)
    meta.pp_stages = json.encode(l.pp_stages)
    local c = M.copies(model)
    if next(c) then meta.tied = json.encode(c) end
  end
  safetensors.save(path, model:state_dict(), meta)
end

local function same_list(a, b) return type(a) == "table" and type(b) == "table" and stages_text(a) == stages_text(b) end

--- pp.ckpt.direct_file(path, st, model) -> the file this rank loads as its
-- state dict as it is, when the checkpoint was saved in the model's layout
-- (pipeline stages, virtual stages, blocks per stage, TP size and records);
-- nil when the weights must be assembled and sliced (load_weights).
function M.direct_file(path, st, model)
  local saved = st.layout or {}
  local l = M.layout(model)
  if (saved.pp or 1) ~= l.pp then return nil end
  if l.pp <= 1 then return tpck.direct_file(path, st, model) end
  if (saved.tp or 1) ~= l.tp or (saved.virtual_stages or 1) ~= l.virtual_stages
      or not same_list(saved.pp_stages, l.pp_stages) then
    return nil
  end
  if l.tp > 1 and not tpck.same_shards(path .. "/" .. l.model_file, model) then return nil end
  return l.model_file
end

local function shape_text(s) return "[" .. table.concat(s, ", ") .. "]" end

--- pp.ckpt.open_weights(path, st) -> src: the whole weights of a
-- checkpoint one tensor at a time, as lutra.dist.tp.ckpt.open_weights
-- (src.shape, src.float, src:get(name), src:close(), src.files), over
-- every stage's files: each name from the stage holding it, a stage's
-- tied copy (its metadata's tied) left out. Raises naming the file when a
-- stage's file is missing, its metadata disagrees with state.json (pp_rank,
-- pp_size), two stages hold one name, or a copy's tensor is held by none
-- or has another shape.
function M.open_weights(path, st)
  local l = st.layout or {}
  local pp, tp = l.pp or 1, l.tp or 1
  if pp <= 1 then return tpck.open_weights(path, st) end
  local src = { shape = {}, float = {}, parts = {}, where = {}, from = {}, files = M.model_files(st), path = path }
  local ok, err = pcall(function()
    local copies = {}
    for s = 0, pp - 1 do
      local files = stage_files(s, pp, tp)
      local part = tpck.open_weights(path, st, files)
      src.parts[s + 1] = part
      local file = path .. "/" .. files[1]
      local meta = part.readers[1]:metadata()
      if tonumber(meta.pp_rank) ~= s or tonumber(meta.pp_size) ~= pp then
        error(("%s: its metadata says pp_rank %s of pp_size %s, state.json's layout stage %d of %d"):format(file,
          tostring(meta.pp_rank), tostring(meta.pp_size), s, pp), 0)
      end
      local okj, tied = pcall(json.decode, meta.tied or "{}")
      if not okj or type(tied) ~= "table" then error(file .. ": the metadata field 'tied' is malformed", 0) end
      for name, shape in pairs(part.shape) do
        if tied[name] then
          copies[#copies + 1] = { name = name, whole = tied[name], shape = shape, file = file }
        elseif src.where[name] then
          error(("%s and %s both hold %s (each name is one stage's)"):format(src.where[name], file, name), 0)
        else
          src.shape[name], src.float[name], src.where[name], src.from[name] = shape, part.float[name], file, part
        end
      end
    end
    for _, c in ipairs(copies) do
      local w = src.shape[c.whole]
      if not w then error(("%s: %s is a copy of %s, which no stage's file holds"):format(c.file, c.name, c.whole), 0) end
      if shape_text(w) ~= shape_text(c.shape) then
        error(("%s: %s is %s, the %s it is a copy of %s (%s)"):format(c.file, c.name, shape_text(c.shape), c.whole,
          shape_text(w), src.where[c.whole]), 0)
      end
    end
  end)
  if not ok then
    for _, part in ipairs(src.parts) do part:close() end
    error(err, 0)
  end
  function src.get(self, name) return self.from[name]:get(name) end
  function src.close(self)
    for _, part in ipairs(self.parts) do part:close() end
  end
  return src
end

--- pp.ckpt.load_weights(path, st, model) -> model: every tensor of the
-- model's state dict from the checkpoint's whole weights (open_weights),
-- this rank's slice of it (lutra.dist.tp.ckpt.load_weights): a checkpoint
-- of any pipeline and TP layout into a model of any (one process too; a
-- stage's tied copy from the embedding's tensor). Raises as
-- lutra.dist.tp.ckpt.load_weights, naming the files.
function M.load_weights(path, st, model)
  local P = rawget(model, "pp")
  local saved_pp = st.layout and st.layout.pp or 1
  if not P and saved_pp <= 1 then return tpck.load_weights(path, st, model) end
  local src = M.open_weights(path, st)
  local copies = M.copies(model)
  local where = saved_pp > 1 and ("model-pp*.safetensors (%d files)"):format(#src.files) or nil
  return tpck.load_weights(path, st, model, { src = src, where = where, partial = P ~= nil,
    from = function(name) return copies[name] or name end })
end

-- a JSON text from rank src to rank dst of group g (its length, then its bytes as i32)
local function send_json(v, dst, g)
  local text = json.encode(v)
  local bytes = {}
  for i = 1, #text do bytes[i] = text:byte(i) end
  comm.send(tensor.tensor({ #text }, { dtype = "i64" }), dst, { group = g })
  comm.send(tensor.tensor(bytes, { dtype = "i32" }), dst, { group = g })
end

local function recv_json(src, g)
  local n = tensor.zeros({ 1 }, { dtype = "i64" })
  comm.recv(n, src, { group = g })
  local t = tensor.zeros({ n:item() }, { dtype = "i32" })
  comm.recv(t, src, { group = g })
  local chars = {}
  for i, b in ipairs(t:totable()) do chars[i] = string.char(b) end
  return json.decode(table.concat(chars))
end

--- pp.ckpt.full_state_dict(model[, {keep = true}]) -> {whole name = tensor}
-- on the job's rank 0: the whole model's state dict (one process's names,
-- a tied tensor once) of a pipeline model, each stage's tensors (TP shards
-- gathered over the stage's TP group, tp.full_state_dict's order) sent to
-- rank 0 one at a time over its pipeline group (lt.dist.send / recv, CPU
-- copies; stage 1's, then 2's, ...); {} on the other ranks. Every rank of
-- the job's pipeline and TP groups calls it (the other DP replicas gather
-- their TP shards too and send nothing). A rank other than 0 holds its
-- stage's tensors and one whole tensor at a time; rank 0 keeps them all
-- (keep = false: drops them). A model without a pipeline:
-- tp.full_state_dict's.
function M.full_state_dict(model, o)
  local keep = not (o and o.keep == false)
  local P = rawget(model, "pp")
  if not P then return (tp_state.full_state_dict(model, o)) end
  local l = M.layout(model)
  local tpg = records.group(model)
  local plan = tpg and records.plan(model) or {}
  local carries = l.tp_rank == 0 and l.dp_rank == 0 -- (rank 0's pipeline group)
  local copies = M.copies(model)
  local sd, order = model:_state_dict()
  local names = {}
  for _, name in ipairs(order) do if not copies[name] then names[#names + 1] = name end end
  local function whole_of(name)
    local t = sd[name]
    if plan[name] then t = tp_state.gather_whole(t, plan[name], tpg) end
    return t
  end
  local out = {}
  if P.rank == 0 then
    for _, name in ipairs(names) do
      local t = whole_of(name)
      if keep and carries then out[name] = t end
    end
    if carries then
      for s = 1, P.size - 1 do
        for _, e in ipairs(recv_json(s, P.group)) do
          local t = tensor.empty(e.shape, { dtype = e.dtype })
          comm.recv(t, s, { group = P.group })
          if keep then out[e.name] = t end
        end
      end
    end
  else
    if carries then
      local list = {}
      for i, name in ipairs(names) do
        local t = sd[name]
        local shape = tp_state.whole_shape(t:shape(), plan[name], tpg and tpg:size() or 1)
        local dims = {}
        for d = 1, #shape do dims[d] = shape[d] end
        list[i] = { name = name, dtype = t.dtype, shape = dims }
      end
      send_json(list, 0, P.group)
    end
    for _, name in ipairs(names) do
      local t = whole_of(name)
      if carries then comm.send(t:detach():to { device = "cpu" }:contiguous(), 0, { group = P.group }) end
    end
  end
  return out
end

return M
