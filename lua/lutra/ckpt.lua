--- lutra.ckpt (lt.ckpt): training checkpoints that survive kills, and exact resume.
--
--   local path = lt.ckpt.save("runs/gpt2/ckpt", { model = model, opt = opt, loader = train,
--     step = 500, rng = { default = lt.default_generator() }, config = cfg, keep_last = 3 })
--   local state = lt.ckpt.load(lt.ckpt.latest("runs/gpt2/ckpt"), { model = model, opt = opt, loader = train,
--     rng = { default = lt.default_generator() } })
--
-- Layout (ARCHITECTURE.md, Checkpoints): <dir>/step_00000500/ holds
--   model.safetensors      the weights (state_dict names, tied tensors once)
--   optimizer.safetensors  the optimizer's tensors (f32 master weights, moments)
--                          under "<position>.<name>", its settings in the metadata
--   state.json             step, optimizer steps, loader state, generator states,
--                          config, model config, parallel layout, file list
--                          (sizes) and each file's CRC-32C (checksums)
-- and <dir>/latest names the newest one. (Under tensor parallelism the
-- weights are model-tp<r>.safetensors, each TP rank's own state dict, a
-- non-ZeRO optimizer's optimizer-tp<r>.safetensors, and the layout
-- {world_size, dp, tp, zero} binds a resume: lutra.dist.tp.ckpt. Under pipeline parallelism each
-- stage's model-pp<s>[-tp<r>] and optimizer-pp<s>[-tp<r>], the layout with pp, virtual_stages and
-- pp_stages: lutra.dist.pp.ckpt.) A checkpoint is written into a
-- hidden temporary directory, every file fsynced, then renamed into place
-- (atomic on POSIX) and the directory fsynced; `latest` is replaced the same
-- way after. A job killed at any moment leaves either the previous complete
-- checkpoints or a hidden temporary directory, which latest() never picks
-- and the next save removes. keep_last removes an old checkpoint by renaming
-- it to a hidden name first, so a kill midway leaves no half-removed step_*.
--
-- Integrity: list() and latest() take a checkpoint whose files have the
-- sizes state.json lists (cheap); load() also checks the CRC-32C of each
-- file it reads (host/io/checksum.c, ~11 GB/s with SSE4.2) and verify() that of
-- every file, so bytes altered at the same size are refused, naming the
-- file. Checkpoints saved before checksums (no 'checksums' field) load,
-- checked by size only, with a note on stderr.
local config = require "lutra.config"
local tensor = require "lutra.tensor"
local models = require "lutra.models"
local safetensors = require "lutra.safetensors"
local comm = require "lutra.dist.comm"
local records = require "lutra.dist.tp.records"
local tpck = require "lutra.dist.tp.ckpt"
local ppck = require "lutra.dist.pp.ckpt"
local capi = require "lutra.capi"
local json = require "lutra.json"
local C, ffi = capi.C, capi.ffi
pcall(ffi.cdef, "int getpid(void);")

local M = {}

M.FORMAT = "lutra-checkpoint"
M.VERSION = 1

local function check(st, level)
  if st ~= 0 then error(ffi.string(C.lt_last_error()), (level or 2) + 1) end
end

local function read_file(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local s = f:read("*a")
  f:close()
  return s
end

--- The directory name of a step: step_00000500.
function M.step_name(step) return ("step_%08d"):format(step) end

local function step_of(name)
  local digits = name:match("^step_(%d+)$")
  return digits and tonumber(digits) or nil
end

local list_dir = capi.list_dir

-- a value in a message: strings quoted (1 and "1" differ)
local function show(v) return type(v) == "string" and ("%q"):format(v) or tostring(v) end

-- the keys of the tables given, sorted
local function sorted_keys(...)
  local seen, out = {}, {}
  for _, t in ipairs { ... } do
    for k in pairs(t) do
      if not seen[k] then seen[k], out[#out + 1] = true, k end
    end
  end
  table.sort(out, function(a, b) return tostring(a) < tostring(b) end)
  return out
end

local function whole(v, lo)
  return type(v) == "number" and v == math.floor(v) and v >= (lo or 0) and v < 2 ^ 53
end

-- Parsed state.json of a checkpoint directory, or nil and why it is not complete.
local function read_state(path)
  local text = read_file(path .. "/state.json")
  if not text and C.lt_path_kind(path) == 0 then
    return nil, path .. " does not exist (lt.train saves checkpoints there with ckpt_every > 0: --ckpt_every=N)"
  end
  if not text then return nil, path .. "/state.json is missing" end
  local ok, st = pcall(json.decode, text)
  if not ok or type(st) ~= "table" then return nil, path .. "/state.json is not valid JSON" end
  if st.format ~= M.FORMAT then
    return nil, ("%s/state.json: format is %s, expected %s"):format(path, tostring(st.format), M.FORMAT)
  end
  local function bad(field, what) return nil, ("%s/state.json: the field '%s' %s"):format(path, field, what) end
  if st.step == nil then return bad("step", "is missing") end
  if not whole(st.step) then return bad("step", "must be a whole number >= 0, got " .. tostring(st.step)) end
  if st.optimizer_steps ~= nil and not whole(st.optimizer_steps) then
    return bad("optimizer_steps", "must be a whole number >= 0, got " .. tostring(st.optimizer_steps))
  end
  if type(st.files) ~= "table" then return bad("files", "is missing") end
  if st.layout ~= nil and (type(st.layout) ~= "table" or not whole(st.layout.world_size or 1, 1)) then
    return bad("layout", "must be {world_size = n >= 1, ...}")
  end
  if st.layout and st.layout.zero ~= nil and not (whole(st.layout.zero) and st.layout.zero <= 3) then
    return bad("layout.zero", "must be a ZeRO stage 0-3, got " .. tostring(st.layout.zero))
  end
  local lfield, lwhy = ppck.check_layout(st.layout) -- (dp, tp and pp)
  if lfield then return bad(lfield, lwhy) end
  if st.model_config ~= nil and type(st.model_config) ~= "table" then return bad("model_config", "must be an object") end
  if st.extra ~= nil and type(st.extra) ~= "table" then return bad("extra", "must be an object") end
  if st.extra and st.extra.skipped ~= nil and not whole(st.extra.skipped) then
    return bad("extra.skipped", "must be a whole number >= 0")
  end
  if st.rng ~= nil and type(st.rng) ~= "table" then return bad("rng", "must be an object") end
  for name, g in pairs(st.rng or {}) do
    if type(g) ~= "table" or not whole(g.seed) or not whole(g.offset) then
      return bad("rng." .. tostring(name), "must be {seed =, offset =} with whole numbers >= 0")
    end
  end
  if st.checksums ~= nil and type(st.checksums) ~= "table" then return bad("checksums", "must be an object") end
  for name, sum in pairs(st.checksums or {}) do
    if st.files[name] == nil then return bad("checksums", "names a file that 'files' does not list: " .. tostring(name)) end
    if type(sum) ~= "string" or not sum:match("^crc32c:%x%x%x%x%x%x%x%x$") then
      return bad("checksums." .. name, "must be \"crc32c:<8 hex digits>\", got " .. tostring(sum))
    end
  end
  for name, size in pairs(st.files) do
    if type(name) ~= "string" or name:find("/", 1, true) or name:sub(1, 1) == "." then
      return bad("files", "names a file outside the checkpoint: " .. tostring(name))
    end
    if st.checksums and not st.checksums[name] then return bad("checksums", "has none for " .. name) end
    if not whole(size) then return bad("files." .. name, "must be a byte count, got " .. tostring(size)) end
    if C.lt_path_kind(path .. "/" .. name) ~= 1 then return nil, ("%s/%s is missing (state.json lists it)"):format(path, name) end
    local f = io.open(path .. "/" .. name, "rb")
    if not f then return nil, ("%s/%s is missing (state.json lists it)"):format(path, name) end
    local actual = f:seek("end")
    f:close()
    if actual ~= size then
      return nil, ("%s/%s has %d bytes, state.json says %d (a partial or altered checkpoint)"):format(path, name, actual,
        size)
    end
  end
  return st
end

local crc_box, bytes_box = ffi.new("uint32_t[1]"), ffi.new("int64_t[1]")

-- the size and the checksum ("crc32c:<8 hex digits>") of a file; raises naming it
local function digest(path)
  check(C.lt_file_crc32c(path, crc_box, bytes_box), 2)
  return tonumber(bytes_box[0]), ("crc32c:%08x"):format(crc_box[0])
end

-- nil when the files of a checkpoint (names: a list) have the checksums
-- state.json records, else why not; a checkpoint without checksums passes
local function verify_files(path, st, names)
  if not st.checksums then return nil end
  local all = {}
  for _, name in ipairs(names) do
    -- "model.safetensors": the weights' files (one per TP rank and pipeline stage)
    if name == "model.safetensors" then
      for _, f in ipairs(ppck.model_files(st)) do all[#all + 1] = f end
    else
      all[#all + 1] = name
    end
  end
  for _, name in ipairs(all) do
    if not st.checksums[name] then return ("%s/state.json lists no %s"):format(path, name) end
    if C.lt_file_crc32c(path .. "/" .. name, crc_box, bytes_box) ~= 0 then return ffi.string(C.lt_last_error()) end
    local sum = ("crc32c:%08x"):format(crc_box[0])
    if sum ~= st.checksums[name] then
      return ("%s/%s: its checksum is %s, state.json says %s (bytes changed after the save: a corrupted or altered checkpoint)")
        :format(path, name, sum, st.checksums[name])
    end
  end
  return nil
end

local function no_checksums_note(path)
  return ("%s has no checksums (saved by a lutra before they were recorded): its files are checked by size only")
    :format(path)
end

--- lt.ckpt.is_complete(path) -> true, or false and the reason: state.json
-- is well formed and every file it lists has its size (verify() also
-- checks their checksums).
function M.is_complete(path)
  local st, why = read_state(path)
  if st then return true end
  return false, why
end

--- lt.ckpt.list(dir) -> the complete checkpoints under dir as
-- { {step =, path =}, ... }, oldest first.
function M.list(dir)
  local out = {}
  for _, name in ipairs(list_dir(dir)) do
    local step = step_of(name)
    if step and read_state(dir .. "/" .. name) then out[#out + 1] = { step = step, path = dir .. "/" .. name } end
  end
  table.sort(out, function(a, b) return a.step < b.step end)
  return out
end

--- lt.ckpt.latest(dir) -> the path of the newest complete checkpoint under
-- dir, or nil when there is none. `latest` is a hint: a checkpoint is taken
-- only when its state.json and every file it lists are present in full
-- (sizes; newest_verified() also checks the checksums).
function M.latest(dir)
  local all = M.list(dir)
  return all[#all] and all[#all].path or nil
end

--- lt.ckpt.verify(path[, names]) -> true, or false and the reason: path is
-- complete (as latest() checks) and every file it lists (or those of the
-- list names, e.g. {"model.safetensors"}: the weights, their model-tp<r>
-- files under tensor parallelism) has the CRC-32C state.json records. A
-- checkpoint saved without checksums gives true and a note saying so as
-- the second value. Reads each file checked once.
function M.verify(path, names)
  local st, why = read_state(path)
  if not st then return false, why end
  if not st.checksums then return true, no_checksums_note(path) end
  if not names then
    names = {}
    for name in pairs(st.files) do names[#names + 1] = name end
    table.sort(names)
  end
  why = verify_files(path, st, names)
  if why then return false, why end
  return true
end

--- lt.ckpt.newest_verified(dir[, on_skip[, names]]) -> {step =, path =} of
-- the newest checkpoint under dir that verify(path, names) passes, or nil
-- when none does (or there is none). For each newer one it passes over,
-- on_skip(path, why) is called (why names the file and what is wrong),
-- a newer step_* directory that is not a complete checkpoint too (a
-- broken state.json; lutra never leaves one under a step_* name); the
-- second result is how many were passed over. lt.train's resume = "auto"
-- (every file) and load_model (the weights' file) take their checkpoint so.
function M.newest_verified(dir, on_skip, names)
  local all = {}
  for _, name in ipairs(list_dir(dir)) do
    local step = step_of(name)
    if step and C.lt_path_kind(dir .. "/" .. name) == 2 then all[#all + 1] = { step = step, path = dir .. "/" .. name } end
  end
  table.sort(all, function(a, b) return a.step < b.step end)
  local skipped = 0
  for i = #all, 1, -1 do
    local ok, why = M.verify(all[i].path, names)
    if ok then return all[i], skipped end
    skipped = skipped + 1
    if on_skip then on_skip(all[i].path, why) end
  end
  return nil, skipped
end

local function tensor_meta(opt_sd)
  local groups = {}
  for gi, g in ipairs(opt_sd.groups) do groups[gi] = g end
  return json.encode { kind = opt_sd.kind, step = opt_sd.step, groups = groups }
end

local function generator_states(rng)
  local out = {}
  for name, g in pairs(rng or {}) do out[name] = g:state() end
  return out
end

-- the model's config as state.json records it: scalars, and a table (a Llama's rope_scaling) as its JSON
-- text with sorted keys, so the fields compare as values
local function model_config(model)
  local cfg = model.config
  if type(cfg) ~= "table" then return nil end
  local out = {}
  for k, v in pairs(cfg) do
    if type(v) == "number" or type(v) == "string" or type(v) == "boolean" then out[k] = v end
    if type(v) == "table" then
      local parts = {}
      for _, key in ipairs(sorted_keys(v)) do parts[#parts + 1] = json.encode(key) .. ":" .. json.encode(v[key]) end
      out[k] = "{" .. table.concat(parts, ",") .. "}"
    end
  end
  return out
end

--- lt.ckpt.save(dir, {model =, opt =, loader =, step =, rng = {name = generator}, config =,
--   optimizer_steps =, extra =, keep_last = 0, layout =}) -> the checkpoint's path.
-- Writes <dir>/step_<step>/ as the file header describes; the weights keep
-- their dtype, optimizer tensors theirs (f32 moments and masters). config
-- (the recipe's settings) and extra (any JSON-able table) go to state.json.
-- keep_last = N > 0 then removes all but the newest N complete checkpoints.
-- Saving a step that exists replaces it only once the new one is complete.
-- Errors: I/O failures name the file; nothing half-written is left visible.
-- A Ctrl-C during the save is taken after it (the checkpoint is whole).
local function save_local(dir, o)
  if type(dir) ~= "string" or dir == "" then error("ckpt.save: dir must be a non-empty string", 2) end
  if type(o) ~= "table" or not o.model then error("ckpt.save: expects {model =, opt =, step =, ...}", 2) end
  local step = o.step
  if not whole(step) or step > 99999999 then
    error("ckpt.save: step must be a whole number in [0, 99999999], got " .. tostring(step), 2)
  end
  if o.keep_last ~= nil and not whole(o.keep_last) then
    error("ckpt.save: keep_last must be a whole number >= 0 (0 keeps all), got " .. tostring(o.keep_last), 2)
  end
  check(C.lt_mkdir_p(dir), 2)
  local name = M.step_name(step)
  local final = dir .. "/" .. name
  local tmp = o._tmp or ("%s/.tmp-%s-%d"):format(dir, name, C.getpid())
  if not o._tmp then
    check(C.lt_remove_tree(tmp), 2)
    check(C.lt_mkdir_p(tmp), 2)
  end
  local ok, err = pcall(function()
    local files, sums = {}, {}
    local function add(name) files[name], sums[name] = digest(tmp .. "/" .. name) end
    local mcfg = model_config(o.model)
    local opt_sd
    if o._write_shared then
      opt_sd = o._write_shared(tmp, add) -- the ranks of a job wrote their files; add() each
    else
      safetensors.save(tmp .. "/model.safetensors", o.model:state_dict(), { format = "lutra", config = json.encode(mcfg or {}) })
      add("model.safetensors")
      if o.opt then
        opt_sd = o.opt:state_dict()
        safetensors.save(tmp .. "/optimizer.safetensors", opt_sd.tensors, { format = "lutra-optimizer", state = tensor_meta(opt_sd) })
        add("optimizer.safetensors")
      end
    end
    local state = {
      format = M.FORMAT, version = M.VERSION, step = step,
      optimizer_steps = o.optimizer_steps or (opt_sd and opt_sd.step) or step,
      loader = o.loader and o.loader:state() or nil, loaders = o._loaders,
      rng = generator_states(o.rng),
      config = o.config, model_config = mcfg, extra = o.extra,
      layout = o.layout or { world_size = 1, zero = o.opt and o.opt.sharded and o.opt.stage or 0 },
      files = files, checksums = sums,
    }
    local text = json.encode(state)
    check(C.lt_write_file_atomic(tmp .. "/state.json", text, #text), 1)
    check(C.lt_fsync_dir(tmp), 1)
  end)
  if not ok then
    C.lt_remove_tree(tmp)
    error(err, 2)
  end
  -- into place: an existing checkpoint of this step is moved aside first and
  -- removed only after the new one is in place
  local aside
  if C.lt_path_kind(final) ~= 0 then
    aside = ("%s/.old-%s-%d"):format(dir, name, C.getpid())
    C.lt_remove_tree(aside)
    check(C.lt_rename(final, aside), 2)
  end
  if C.lt_rename(tmp, final) ~= 0 then
    local msg = ffi.string(C.lt_last_error())
    if aside then C.lt_rename(aside, final) end
    C.lt_remove_tree(tmp)
    error("ckpt.save: " .. msg, 2)
  end
  check(C.lt_fsync_dir(dir), 2)
  if aside then C.lt_remove_tree(aside) end
  local pointer = name .. "\n"
  check(C.lt_write_file_atomic(dir .. "/latest", pointer, #pointer), 2)
  -- leftovers of killed saves and removals, and a `latest` being replaced
  -- (not those of a live process saving here)
  for _, entry in ipairs(list_dir(dir)) do
    local pid = entry:match("^%.tmp%-step_%d+%-(%d+)$") or entry:match("^%.old%-step_%d+%-(%d+)$")
      or entry:match("^%.del%-step_%d+%-(%d+)$") or entry:match("^latest%.tmp%.(%d+)$")
    if pid and (tonumber(pid) == C.getpid() or C.lt_process_alive(tonumber(pid)) == 0) then
      C.lt_remove_tree(dir .. "/" .. entry)
    end
  end
  -- keep_last: the one just written and the newest keep_last - 1 before it;
  -- checkpoints of later steps (another history) are never touched here.
  -- Each is renamed to a hidden .del-<name>-<pid> first (atomic), so a kill
  -- during the removal leaves no half-removed step_* that looks like a
  -- checkpoint; the next save removes the hidden rest. step_* directories
  -- of earlier steps that are not complete checkpoints (as a lutra that
  -- removed in place could leave) go too.
  if o.keep_last and o.keep_last > 0 then
    local older, complete, drop = {}, {}, {}
    for _, c in ipairs(M.list(dir)) do
      complete[c.path] = true
      if c.step < step then older[#older + 1] = c.path end
    end
    for i = 1, #older - (o.keep_last - 1) do drop[#drop + 1] = older[i] end
    for _, entry in ipairs(list_dir(dir)) do
      local s, path = step_of(entry), dir .. "/" .. entry
      if s and s < step and not complete[path] and C.lt_path_kind(path) == 2 then drop[#drop + 1] = path end
    end
    for _, path in ipairs(drop) do
      local gone = ("%s/.del-%s-%d"):format(dir, path:match("[^/]+$"), C.getpid())
      C.lt_remove_tree(gone)
      if C.lt_rename(path, gone) == 0 then
        C.lt_fsync_dir(dir)
        C.lt_remove_tree(gone)
      end
    end
  end
  return final
end

local function shard_file(rank) return ("optimizer-rank%05d.safetensors"):format(rank) end

-- Under a job of several ranks: rank 0 makes the temporary directory; rank 0
-- writes the weights (the same on every rank), the optimizer state is
-- written by rank 0 or, for a sharded optimizer (lt.dist.Zero), by every
-- rank into its own file; every rank's loader state goes to state.json; then
-- rank 0 completes the checkpoint as alone. Every rank learns whether any
-- failed, so all raise together.
-- Under tensor parallelism (the model's tp_group) each TP rank of DP rank 0
-- writes its model-tp<r> file and a non-ZeRO optimizer's optimizer-tp<r>
-- (lutra.dist.tp.ckpt); a pipeline stage's model-pp<s>[-tp<r>] (lutra.dist.pp.ckpt).
local function save_job(dir, o)
  local rank, world = comm.rank(), comm.world_size()
  local sharded = o.opt and o.opt.sharded
  local lay = ppck.layout(o.model)
  local pid = tensor.tensor({ C.getpid() }, { dtype = "i64" })
  comm.broadcast(pid, { src = 0 })
  local name = M.step_name(o.step or 0)
  local tmp = ("%s/.tmp-%s-%d"):format(dir, name, pid:item())
  local function agree(ok, err) -- (a rank that did its part raises the failing rank's message, naming it)
    local bad, why = comm.first_error(ok, err)
    if bad then
      if rank == 0 then C.lt_remove_tree(tmp) end
      error(ok and ("ckpt.save: rank %d failed to write its part of the checkpoint: %s"):format(bad,
        (why:gsub("^ckpt%.save: ", ""))) or err, 3)
    end
  end
  local ok, err = lay.ok, lay.why and ("ckpt.save: " .. lay.why)
  if rank == 0 and ok then
    ok, err = pcall(function()
      check(C.lt_mkdir_p(dir), 1)
      check(C.lt_remove_tree(tmp), 1)
      check(C.lt_mkdir_p(tmp), 1)
    end)
  end
  agree(ok, err)
  local opt_sd
  ok, err = pcall(function()
    local cfg = json.encode(model_config(o.model) or {})
    if lay.split then
      if lay.dp_rank == 0 then ppck.save_model(tmp .. "/" .. lay.model_file, o.model, lay, cfg) end
    elseif rank == 0 then
      safetensors.save(tmp .. "/model.safetensors", o.model:state_dict(), { format = "lutra", config = cfg })
    end
    if o.opt then
      opt_sd = o.opt:state_dict()
      local meta = { format = "lutra-optimizer", state = tensor_meta(opt_sd) }
      if sharded then safetensors.save(tmp .. "/" .. shard_file(rank), opt_sd.tensors, meta)
      elseif lay.split then
        if lay.dp_rank == 0 then safetensors.save(tmp .. "/" .. lay.optimizer_file, opt_sd.tensors, meta) end
      elseif rank == 0 then safetensors.save(tmp .. "/optimizer.safetensors", opt_sd.tensors, meta) end
    end
  end)
  agree(ok, err)
  -- every rank's loader position, in rank order
  local loaders
  if o.loader then
    local s = o.loader:state()
    local all = comm.all_gather(tensor.tensor({ { s.epoch, s.index, s.rank or rank, s.world or world } },
      { dtype = "i64" })):totable()
    loaders = {} -- (under TP the loader's rank and world are the DP group's)
    for r = 1, world do
      loaders[r] = { epoch = all[r][1], index = all[r][2], seed = s.seed, rank = all[r][3], world = all[r][4] }
    end
  end
  ok, err = true, nil
  if rank == 0 then
    local o2 = {}
    for k, v in pairs(o) do o2[k] = v end
    o2._tmp, o2._loaders, o2.loader = tmp, loaders, nil
    o2.layout = ppck.state_layout(lay, world, sharded and o.opt.stage or 0)
    o2._write_shared = function(_, add)
      for _, f in ipairs(ppck.files(lay, { opt = o.opt, sharded = sharded, world = world })) do add(f) end
      return opt_sd
    end
    ok, err = pcall(save_local, dir, o2)
  end
  agree(ok, err)
  return dir .. "/" .. name
end

--- lt.ckpt.save(dir, {...}): as save_local above; under a job of several
-- ranks (lt.dist) with dist = true every rank calls it and each writes its part
-- (a tensor-parallel model, model.tp_group, or a pipeline's, model.pp, implies dist = true:
-- every rank calls it; its layout must be lt.dist.mesh's).
-- (ZeRO 3: every rank gathers the whole parameters for the save and drops them after.)
-- A Ctrl-C during the save waits for it (lt_interrupt_defer): the
-- checkpoint is written whole, then the interrupt is taken by the next op
-- (lt.train checks for it and stops there).
function M.save(dir, o)
  local dist = type(o) == "table" and (o.dist or records.group(o.model) or (type(o.model) == "table" and rawget(o.model, "pp")))
  local save = (dist and comm.world_size() > 1) and save_job or save_local
  local sharded = type(o) == "table" and o.model and o.opt and o.opt.unshard and not o.opt.full
  local outer = C.lt_interrupt_deferred() ~= nil -- (inside work that defers already: its end takes it)
  if not outer then C.lt_interrupt_defer(1, "the checkpoint save") end
  local ok, res = pcall(function()
    if not sharded then return save(dir, o) end
    o.opt:unshard()
    local ok2, res2 = pcall(save, dir, o)
    o.opt:reshard()
    if not ok2 then error(res2, 0) end
    return res2
  end)
  if not outer then C.lt_interrupt_defer(0, nil) end
  if not ok then error(res, 2) end
  return res
end

local function set_generators(rng, saved, path)
  for name, g in pairs(rng or {}) do
    local s = saved and saved[name]
    if type(s) ~= "table" or type(s.seed) ~= "number" or type(s.offset) ~= "number" then
      error(("ckpt.load: %s/state.json: rng.%s is missing or malformed"):format(path, name), 3)
    end
    g:set_state(s)
  end
end

--- lt.ckpt.load_model(path[, {dtype =, device =}]) -> model, state: the
-- GPT-2 or Llama a checkpoint's state.json describes (model_config), with
-- its weights. path is a checkpoint or a directory of them: the newest whose
-- model.safetensors passes its checksum (newest_verified; a skipped one is
-- named on stderr).
function M.load_model(path, opts)
  opts = opts or {}
  if type(path) ~= "string" then error("ckpt.load_model: path must be a string", 2) end
  local verified
  if C.lt_path_kind(path .. "/state.json") == 0 and C.lt_path_kind(path) == 2 then
    local any = M.latest(path)
    local newest = M.newest_verified(path, function(p, why)
      io.stderr:write(("lutra: ckpt.load_model: skipping %s: %s\n"):format(p, why))
    end, { "model.safetensors" })
    if not any then error(("ckpt.load_model: %s holds no complete checkpoint"):format(path), 2) end
    if not newest then
      error(("ckpt.load_model: no checkpoint in %s has a model.safetensors that passes its checksum (each is named above)")
        :format(path), 2)
    end
    path, verified = newest.path, true
  end
  local st, why = read_state(path)
  if not st then error("ckpt.load_model: " .. why, 2) end
  local mc = st.model_config
  if type(mc) ~= "table" then error(("ckpt.load_model: %s/state.json: the field 'model_config' is missing"):format(path), 2) end
  -- state.json has no checksum of its own: its model_config must be the one
  -- model.safetensors carries (checked first), so that an altered number
  -- cannot build another (or a huge) model
  if not verified then
    local bad = verify_files(path, st, { "model.safetensors" })
    if bad then error("ckpt.load_model: " .. bad, 2) end
    verified = true
  end
  local wfile = ppck.model_files(st)[1] -- (model-tp00000, model-pp00000...: every part's file holds the config)
  local rd_ok, reader = pcall(safetensors.open, path .. "/" .. wfile)
  if rd_ok then
    local meta_ok, meta = pcall(reader.metadata, reader)
    reader:close()
    local cfg_ok, fcfg = pcall(json.decode, meta_ok and type(meta) == "table" and meta.config or "null")
    if cfg_ok and type(fcfg) == "table" and next(fcfg) ~= nil then
      for _, k in ipairs(sorted_keys(fcfg, mc)) do
        if fcfg[k] ~= mc[k] then
          error(("ckpt.load_model: %s/state.json: model_config.%s is %s, %s was saved with %s (an altered state.json)")
            :format(path, k, show(mc[k]), wfile, show(fcfg[k])), 2)
        end
      end
    end
  end
  local cfg = {}
  for k, v in pairs(mc) do if k ~= "padded_vocab_size" then cfg[k] = v end end
  if type(cfg.rope_scaling) == "string" then -- (recorded as its JSON text: model_config above)
    local rok, t = pcall(json.decode, cfg.rope_scaling)
    if not rok or type(t) ~= "table" then
      error(("ckpt.load_model: %s/state.json: model_config.rope_scaling is not a JSON object"):format(path), 2)
    end
    cfg.rope_scaling = t
  end
  local model
  -- (a vocabulary padded by pad_vocab, or for tensor parallelism: one multiple that gives the same rows)
  if mc.padded_vocab_size and mc.padded_vocab_size ~= mc.vocab_size then cfg.pad_vocab = mc.padded_vocab_size end
  if mc.n_layer and mc.n_embd then
    model = models.gpt2(cfg)
  elseif mc.n_layers and mc.dim then
    model = models.llama(cfg)
  else
    error(("ckpt.load_model: %s/state.json: model_config is neither a GPT-2 (n_layer, n_embd) nor a Llama (n_layers, dim)")
      :format(path), 2)
  end
  local ok, err = pcall(M.load, path, { model = model, verified = verified })
  if not ok then error(tostring(err):gsub("^.-ckpt%.load: ", "ckpt.load_model: "), 2) end
  if opts.dtype or opts.device then model:to(opts.device or "cpu", opts.dtype or "f32") end
  return model, st
end

--- lt.ckpt.load_weights(path, model[, {verified = false}]) -> state: a
-- checkpoint's weights into a model of any tensor-parallel size (or none),
-- whatever the TP size of the job that saved them: each whole tensor read
-- (assembled from the model-tp<r> files, one tensor at a time) and this
-- rank's slice of it taken by the model's records (lutra.dist.tp.ckpt).
-- Every rank of the model's TP group may call it alone (no communication).
-- Raises as load does: checksums, names, whole shapes (checked before any
-- copy), naming the files.
function M.load_weights(path, model, o)
  if type(model) ~= "table" or not model.state_dict then error("ckpt.load_weights: expects a model", 2) end
  local ok, st = pcall(M.load, path, { model = model, verified = o and o.verified, dist = true })
  if not ok then error((tostring(st):gsub("^.-ckpt%.load: ", "ckpt.load_weights: ")), 2) end
  return st
end

--- lt.ckpt.read_state(path) -> the parsed state.json of a complete
-- checkpoint; raises naming the file and field when it is not complete.
function M.read_state(path)
  local st, why = read_state(path)
  if not st then error("ckpt: " .. why, 2) end
  return st
end

--- lt.ckpt.load(path, {model =, opt =, loader =, rng = {name = generator}, world_size = 1, verified = false}) -> state
-- Restores what save wrote into the given objects (each optional) and
-- returns state.json's table (step, optimizer_steps, config, extra, ...).
-- The weights alone (no opt, no loader) load in any number of processes,
-- whatever the world size and ZeRO stage of the job that saved them.
-- Everything is read and checked before anything is changed, so a refused
-- checkpoint leaves the objects as they were. Raises, naming the file and
-- field, on a partial checkpoint, a model of another config, missing or
-- mis-shaped tensors, optimizer state of another kind, another layout
-- (world size, dp x tp, ZeRO stage; with opt or loader), a file whose CRC-32C
-- is not the one recorded (each file read is checked, unless verified = true:
-- the caller has just run verify(path)). A checkpoint without checksums
-- loads with a note on stderr. Under tensor parallelism (a model with
-- model.tp_group: dist implied) each rank reads its own model-tp<r> and
-- optimizer files; the weights alone also load into a model of another TP
-- size, or none, assembled and sliced one tensor at a time (load_weights).
function M.load(path, o)
  o = o or {}
  if type(path) ~= "string" then error("ckpt.load: path must be a string", 2) end
  if C.lt_path_kind(path) ~= 2 then error(("ckpt.load: %s is not a checkpoint directory"):format(path), 2) end
  local st, why = read_state(path)
  if not st then error("ckpt.load: " .. why, 2) end
  local dist = o.dist or records.group(o.model) ~= nil or (type(o.model) == "table" and rawget(o.model, "pp") ~= nil)
  local lead = not (dist and comm.world_size() > 1) or comm.rank() == 0
  if not st.checksums and lead then io.stderr:write("lutra: ckpt.load: " .. no_checksums_note(path) .. "\n") end
  local world = o.world_size or (dist and comm.world_size()) or 1
  local saved = st.layout or { world_size = 1 }
  local lay = ppck.layout(o.model)
  if not lay.ok then error("ckpt.load: " .. lay.why, 2) end
  local mine = ppck.state_layout(lay, world, o.opt and o.opt.sharded and o.opt.stage or 0)
  -- the training layout binds the optimizer state and the loaders' positions
  -- (one per rank); the weights load anywhere (assembled from any TP size)
  local other = (o.opt or o.loader) and ppck.other_layout(saved, mine)
  if other then config.fail(("ckpt.load: %s/state.json: %s"):format(path, other)) end -- (the user's: no traceback)
  for name in pairs(o.rng or {}) do
    if not (st.rng and st.rng[name]) then
      error(("ckpt.load: %s/state.json: rng.%s is missing"):format(path, name), 2)
    end
  end
  local rank = world > 1 and comm.rank() or 0
  if type(st.loaders) == "table" then
    if o.loader and type(st.loaders[rank + 1]) ~= "table" then
      error(("ckpt.load: %s/state.json: loaders holds no state for rank %d"):format(path, rank), 2)
    end
    st.loader = st.loaders[rank + 1]
  end
  if o.loader and type(st.loader) ~= "table" then
    error(("ckpt.load: %s/state.json: the field 'loader' is missing"):format(path), 2)
  end
  if o.loader then
    for _, k in ipairs { "seed", "rank", "world" } do
      local want, have = st.loader[k], o.loader[k]
      if want ~= nil and have ~= nil and want ~= have then
        error(("ckpt.load: %s/state.json: loader.%s is %s, this loader's is %s"):format(path, k, tostring(want),
          tostring(have)), 2)
      end
    end
    if not whole(st.loader.epoch) or not whole(st.loader.index) then
      error(("ckpt.load: %s/state.json: loader must hold whole numbers epoch and index"):format(path), 2)
    end
  end
  local model_tensors, opt_sd, direct
  if o.model then
    local mine = model_config(o.model)
    if mine and st.model_config then
      local function family(c) return c.n_layer and "GPT-2" or c.n_layers and "Llama" or nil end
      local fs, fm = family(st.model_config), family(mine)
      if fs and fm and fs ~= fm then
        error(("ckpt.load: %s/state.json: a %s checkpoint, the model is a %s"):format(path, fs, fm), 2)
      end
      for _, k in ipairs(sorted_keys(mine)) do -- (in order: the same field named every time)
        local v, s = mine[k], st.model_config[k]
        -- (the vocabulary padded to another multiple, of pad_vocab or tp, is the same model's:
        -- its weights re-padded at the load, tp.ckpt.vocab_rows; the optimizer's state is not)
        if s ~= nil and s ~= v and k == "padded_vocab_size" and o.opt then
          error(("ckpt.load: %s/state.json: model_config.padded_vocab_size is %s, the model's is %s (the vocabulary padded to another multiple of pad_vocab x tp: the weights load with lt.ckpt.load_weights, a resume needs the same padding)")
            :format(path, show(s), show(v)), 2)
        end
        if s ~= nil and s ~= v and k ~= "dropout" and k ~= "pad_vocab" and k ~= "padded_vocab_size" then
          error(("ckpt.load: %s/state.json: model_config.%s is %s, the model's is %s (a checkpoint of another model)")
            :format(path, k, show(s), show(v)), 2)
        end
      end
    end
    -- this rank's file as it is (the model's TP size), else assembled at the load (load_weights)
    direct = not tpck.vocab_rows(st, o.model) and ppck.direct_file(path, st, o.model) or nil
    local bad = not o.verified and verify_files(path, st, { direct or "model.safetensors" })
    if bad then error("ckpt.load: " .. bad, 2) end
    if direct then
      local ok, t = pcall(safetensors.load, path .. "/" .. direct)
      if not ok then error(("ckpt.load: %s"):format(tostring(t):gsub("^.-safetensors ", "safetensors ")), 2) end
      model_tensors = t
    end
  end
  if o.opt then
    local zero = st.layout and st.layout.zero or 0
    -- a job writes one file per rank; a single process (ZeRO on one rank too) one file
    local opt_file = (zero > 0 and st.files[shard_file(rank)]) and shard_file(rank) or "optimizer.safetensors"
    if zero == 0 and lay.split then opt_file = lay.optimizer_file end
    if (zero > 0) ~= (o.opt.sharded and true or false) then
      error(("ckpt.load: %s/state.json: layout.zero is %d, this job's optimizer is %s"):format(path, zero,
        o.opt.sharded and ("ZeRO stage " .. o.opt.stage) or "not sharded"), 2)
    end
    if zero > 0 and (zero == 3) ~= (o.opt.stage == 3) then -- stages 1 and 2 shard alike; 3 per unit
      error(("ckpt.load: %s/state.json: layout.zero is %d, this job's optimizer is ZeRO stage %d (stage 3 shards its state another way)")
        :format(path, zero, o.opt.stage), 2)
    end
    if not st.files[opt_file] then
      error(("ckpt.load: %s holds no optimizer state (state.json lists no %s)"):format(path, opt_file), 2)
    end
    local bad = not o.verified and verify_files(path, st, { opt_file })
    if bad then error("ckpt.load: " .. bad, 2) end
    local ok, err = pcall(function()
      local tensors, meta = safetensors.load(path .. "/" .. opt_file)
      local ok2, s = pcall(json.decode, meta.state or "null")
      if not ok2 or type(s) ~= "table" or type(s.groups) ~= "table" then
        error("the metadata field 'state' is missing or malformed", 0)
      end
      opt_sd = { kind = s.kind, step = s.step, groups = s.groups, tensors = tensors }
      o.opt:check_state_dict(opt_sd)
    end)
    if not ok then
      error(("ckpt.load: %s/%s: %s"):format(path, opt_file, tostring(err):gsub("^.-load_state_dict: ", "")), 2)
    end
  end
  -- ZeRO 3: the parameters whole while the weights go in and the chunks are re-read
  local unsharded = o.model and o.opt and o.opt.unshard and not o.opt.full
  if unsharded then o.opt:unshard() end
  if o.model then
    local ok, err
    if model_tensors then
      ok, err = pcall(o.model.load_state_dict, o.model, model_tensors)
      if not ok then
        err = ("%s/%s: %s"):format(path, direct, tostring(err):gsub("^.-load_state_dict: ", ""))
      end
    else
      ok, err = pcall(ppck.load_weights, path, st, o.model)
    end
    if not ok then
      if unsharded then o.opt:reshard() end
      error("ckpt.load: " .. err, 2)
    end
  end
  if opt_sd then o.opt:load_state_dict(opt_sd) end
  if o.opt and o.opt.after_load then o.opt:after_load() end -- a sharded optimizer re-reads its chunks
  if unsharded then o.opt:reshard() end
  if o.loader then
    local ok, err = pcall(o.loader.load_state, o.loader, st.loader)
    if not ok then error(("ckpt.load: %s/state.json: loader: %s"):format(path, tostring(err):gsub("^.-load_state: ", "")), 2) end
  end
  set_generators(o.rng, st.rng, path)
  return st
end

return M
