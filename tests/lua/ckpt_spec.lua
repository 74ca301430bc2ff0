-- tests/lua/ckpt_spec.lua: lt.ckpt and lt.train's checkpoints: a save and
-- load round trip continues exactly (the Adam update after a load equals
-- the uninterrupted one); a job killed with SIGKILL right after its step-10
-- checkpoint and resumed gives bit-identical losses, rates, gradient norms
-- and final weights to an uninterrupted one; SIGTERM saves and exits 0;
-- partial checkpoints are never picked; bad checkpoints are rejected with
-- the file and field named; bytes altered at the same size are refused by
-- their checksums, and resume = "auto" falls back past them; checkpoints
-- without checksums still load; keep_last, and a kill during its removals.
local lt = require "lutra"
local C = require("lutra.capi").C
local H = require "tests.lua.helpers"

local sh = H.sh

local ROOT = os.tmpname() .. "-ckpt"
os.remove(ROOT:gsub("%-ckpt$", ""))
assert(os.execute("mkdir -p " .. ROOT) == 0)
local DATA = ROOT .. "/data"

-- shards of random tokens for the jobs (a vocabulary of 512, as gpt2-tiny)
do
  os.execute("mkdir -p " .. DATA)
  local ids = lt.randint(0, 512, { 6000 }, { generator = lt.Generator(2) })
  lt.data.write_shard(DATA .. "/train_000000.bin", ids, 512)
end

local function read(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local s = f:read("*a")
  f:close()
  return s
end

-- step -> {loss, lr, grad_norm} from a metrics file (the last line of each step wins)
local function metrics(path)
  local out = {}
  for line in (read(path) or ""):gmatch("[^\n]+") do
    local r = lt.json.decode(line)
    if r.loss and r.step then out[r.step] = { r.loss, r.lr, r.grad_norm } end
  end
  return out
end

-- records a file rewritten on purpose in its checkpoint's state.json: its
-- size and its checksum (so that what the test altered is what gets checked)
local function reseal(path, name)
  local st = lt.json.decode(read(path .. "/state.json"))
  local crc, bytes = require("ffi").new("uint32_t[1]"), require("ffi").new("int64_t[1]")
  assert.are.equal(0, C.lt_file_crc32c(path .. "/" .. name, crc, bytes))
  st.files[name], st.checksums[name] = tonumber(bytes[0]), ("crc32c:%08x"):format(crc[0])
  local text = lt.json.encode(st)
  assert.are.equal(0, C.lt_write_file_atomic(path .. "/state.json", text, #text))
end

-- writes 4 bytes into a file at its middle (its size stays)
local function corrupt(file)
  local f = assert(io.open(file, "r+b"))
  f:seek("set", math.floor(f:seek("end") / 2))
  f:write("\255\0\255\0")
  f:close()
end

local function job(args)
  return sh("./lutra tests/lua/jobs/resume_job.lua --data=" .. DATA .. " --out=" .. ROOT .. " " .. args)
end

local function tiny(seed)
  return lt.models.gpt2("gpt2-tiny", { generator = lt.Generator(seed) })
end

describe("lt.ckpt", function()
  it("saves and loads so that the next Adam update equals the uninterrupted one", function()
    local g = lt.Generator(4)
    local x = lt.randint(0, 512, { 2, 16 }, { generator = g })
    local y = lt.randint(0, 512, { 2, 16 }, { generator = g })
    local function step(m, o)
      o:zero_grad()
      m:loss(x, y):backward()
      o:step()
    end
    local a = tiny(1)
    local oa = lt.optim.AdamW(a, { lr = 1e-2 })
    for _ = 1, 3 do step(a, oa) end
    local path = lt.ckpt.save(ROOT .. "/roundtrip", { model = a, opt = oa, step = 3 })
    assert.are.equal(ROOT .. "/roundtrip/step_00000003", path)
    assert.are.equal("step_00000003\n", read(ROOT .. "/roundtrip/latest"))
    step(a, oa)

    local b = tiny(99)
    local ob = lt.optim.AdamW(b, { lr = 1e-2 })
    local st = lt.ckpt.load(lt.ckpt.latest(ROOT .. "/roundtrip"), { model = b, opt = ob })
    assert.are.equal(3, st.step)
    assert.are.equal(3, ob.step_count)
    step(b, ob)
    local pa, pb = a:parameters(), b:parameters()
    for i = 1, #pa do assert.are.equal(0, (pa[i] - pb[i]):abs():max():item()) end
  end)

  it("saves and loads a ZeRO optimizer in a single process (stages 1 and 3), the next update as uninterrupted", function()
    local g = lt.Generator(4)
    local x = lt.randint(0, 512, { 2, 16 }, { generator = g })
    local y = lt.randint(0, 512, { 2, 16 }, { generator = g })
    local function step(m, o)
      o:zero_grad()
      m:loss(x, y):backward()
      o:reduce_gradients()
      o:step()
    end
    for _, stage in ipairs { 1, 3 } do
      local a = tiny(1)
      local oa = lt.dist.Zero(a, { stage = stage, lr = 1e-2 })
      for _ = 1, 3 do step(a, oa) end
      local dir = ROOT .. "/zero" .. stage
      lt.ckpt.save(dir, { model = a, opt = oa, step = 3 })
      assert.are.equal(stage, lt.ckpt.read_state(lt.ckpt.latest(dir)).layout.zero)
      step(a, oa)
      local b = tiny(99)
      local ob = lt.dist.Zero(b, { stage = stage, lr = 1e-2 })
      lt.ckpt.load(lt.ckpt.latest(dir), { model = b, opt = ob })
      step(b, ob)
      if stage == 3 then oa:unshard(); ob:unshard() end
      local pa, pb = a:parameters(), b:parameters()
      for i = 1, #pa do assert.are.equal(0, (pa[i] - pb[i]):abs():max():item()) end
    end
  end)

  it("restores generator states exactly", function()
    local g = lt.Generator(5)
    lt.rand({ 10 }, { generator = g })
    local m = tiny(1)
    lt.ckpt.save(ROOT .. "/rng", { model = m, step = 1, rng = { g = g } })
    local want = lt.rand({ 4 }, { generator = g }):totable()
    local h = lt.Generator(0)
    lt.ckpt.load(ROOT .. "/rng/step_00000001", { rng = { g = h } })
    assert.are.same(want, lt.rand({ 4 }, { generator = h }):totable())
  end)

  it("resumes after SIGKILL bit-identically: losses, rates, norms and final weights", function()
    local out, rc = job("--name=whole --steps=20 --ckpt_every=5")
    assert.are.equal(0, rc, out)
    out, rc = job("--name=killed --steps=20 --ckpt_every=5 --kill_after=10")
    assert.are_not.equal(0, rc, "the job should have died by SIGKILL: " .. out)
    assert.is_nil(lt.ckpt.list(ROOT .. "/killed/ckpt")[3], "no checkpoint after step 10")
    out, rc = job("--name=killed --steps=20 --ckpt_every=5 --resume=auto")
    assert.are.equal(0, rc, out)
    assert.truthy(out:find("resumed from " .. ROOT .. "/killed/ckpt/step_00000010", 1, true), out)
    local a = metrics(ROOT .. "/whole/metrics.jsonl")
    local b = metrics(ROOT .. "/killed/metrics.jsonl")
    for step = 1, 20 do
      assert(a[step] and b[step], "missing step " .. step)
      for k = 1, 3 do
        assert(a[step][k] == b[step][k], ("step %d, field %d: %.17g vs %.17g"):format(step, k, a[step][k], b[step][k]))
      end
    end
    assert.are.equal(read(ROOT .. "/whole/ckpt/step_00000020/model.safetensors"),
      read(ROOT .. "/killed/ckpt/step_00000020/model.safetensors"))
    assert.are.equal(read(ROOT .. "/whole/ckpt/step_00000020/optimizer.safetensors"),
      read(ROOT .. "/killed/ckpt/step_00000020/optimizer.safetensors"))
  end)

  it("saves and exits 0 on SIGTERM, and the resumed run matches", function()
    local out, rc = job("--name=term --steps=20 --ckpt_every=0 --term_at=7")
    assert.are.equal(0, rc, out)
    assert.truthy(out:find("preempted SIGTERM", 1, true), out)
    assert.are.equal(ROOT .. "/term/ckpt/step_00000007", lt.ckpt.latest(ROOT .. "/term/ckpt"))
    out, rc = job("--name=term --steps=20 --ckpt_every=0 --resume=auto")
    assert.are.equal(0, rc, out)
    local a = metrics(ROOT .. "/whole/metrics.jsonl")
    local b = metrics(ROOT .. "/term/metrics.jsonl")
    for step = 1, 20 do assert(a[step][1] == b[step][1], "loss differs at step " .. step) end
  end)

  it("saves and exits 0 on SIGUSR1 as well", function()
    local out, rc = job("--name=usr1 --steps=20 --ckpt_every=0 --term_at=3 --signal=10")
    assert.are.equal(0, rc, out)
    assert.truthy(out:find("preempted SIGUSR1", 1, true), out)
    assert.are.equal(ROOT .. "/usr1/ckpt/step_00000003", lt.ckpt.latest(ROOT .. "/usr1/ckpt"))
  end)

  it("never picks a partial checkpoint, and a later save cleans up", function()
    local dir = ROOT .. "/partial"
    local m = tiny(1)
    lt.ckpt.save(dir, { model = m, step = 2 })
    -- a kill during a save leaves a hidden temporary directory
    os.execute(("mkdir -p %s/.tmp-step_00000004-999999999 && echo junk > %s/.tmp-step_00000004-999999999/model.safetensors"):format(dir,
      dir))
    -- a copied-in directory without state.json, and one with a truncated file
    os.execute(("mkdir -p %s/step_00000005"):format(dir))
    lt.ckpt.save(dir, { model = m, step = 6 })
    local f = assert(io.open(dir .. "/step_00000006/model.safetensors", "r+b"))
    local size = f:seek("end")
    f:close()
    os.execute(("truncate -s %d %s/step_00000006/model.safetensors"):format(size - 10, dir))
    assert.are.equal(dir .. "/step_00000002", lt.ckpt.latest(dir))
    local ok, why = lt.ckpt.is_complete(dir .. "/step_00000006")
    assert.is_false(ok)
    assert.truthy(why:find("model.safetensors has", 1, true), why)
    local ok2, err = pcall(lt.ckpt.load, dir .. "/step_00000005", { model = m })
    assert.is_false(ok2)
    assert.truthy(tostring(err):find("step_00000005/state.json is missing", 1, true), err)
    -- a run that saved nothing (the main job by default): say how to save, not a missing file inside
    local ok3, err3 = pcall(lt.ckpt.load_model, dir .. "/never-saved")
    assert.is_false(ok3)
    assert.truthy(tostring(err3):find("never-saved does not exist (lt.train saves checkpoints there with " ..
      "ckpt_every > 0: --ckpt_every=N)", 1, true), err3)
    lt.ckpt.save(dir, { model = m, step = 8 })
    assert.are.equal(0, C.lt_path_kind(dir .. "/.tmp-step_00000004-999999999"))
  end)

  it("a tied Llama comes back tied (load_model); an untied model refuses its checkpoint", function()
    local dir = ROOT .. "/tied"
    local m = lt.models.llama("llama-tiny", { tie_embeddings = true, generator = lt.Generator(5) })
    lt.ckpt.save(dir, { model = m, step = 1 })
    local back = lt.ckpt.load_model(dir)
    assert.are.equal(back.model.embed_tokens.weight, back.lm_head.weight)
    assert.are.equal(m:num_parameters(), back:num_parameters())
    assert.are.equal(0, (back.lm_head.weight - m.lm_head.weight):abs():max():item())
    H.assert_error(function() lt.ckpt.load(dir .. "/step_00000001", { model = lt.models.llama("llama-tiny") }) end,
      "model_config.tie_embeddings is true, the model's is false")
  end)

  it("load_model builds the model model.safetensors was saved for: an altered state.json's model_config is refused", function()
    local dir = ROOT .. "/altered-config"
    local m = tiny(1)
    local path = lt.ckpt.save(dir, { model = m, step = 1 })
    local text = read(path .. "/state.json")
    local function put(t)
      local f = assert(io.open(path .. "/state.json", "wb"))
      f:write(t)
      f:close()
    end
    -- (a billion layers: before, load_model set out to build that model)
    put((text:gsub('"n_layer":2', '"n_layer":1000000000')))
    H.assert_error(function() lt.ckpt.load_model(dir) end,
      "state.json: model_config.n_layer is 1000000000, model.safetensors was saved with 2 (an altered state.json)")
    put((text:gsub('"n_layer":2', '"n_layer":"2"')))
    H.assert_error(function() lt.ckpt.load_model(path) end, 'model_config.n_layer is "2", model.safetensors was saved with 2')
    -- a layout field that is no ZeRO stage: a malformed checkpoint, named (was: a Lua comparison error in load)
    put((text:gsub('"zero":0', '"zero":"x"')))
    H.assert_error(function() lt.ckpt.load(path, { model = m, opt = lt.optim.AdamW(m, { lr = 1e-3 }) }) end,
      "the field 'layout.zero' must be a ZeRO stage 0-3, got x")
    put(text)
    assert.are.equal(m:num_parameters(), lt.ckpt.load_model(dir):num_parameters())
  end)

  it("keeps the newest keep_last checkpoints", function()
    local dir = ROOT .. "/keep"
    local m = tiny(1)
    for s = 1, 5 do lt.ckpt.save(dir, { model = m, step = s, keep_last = 2 }) end
    local all = lt.ckpt.list(dir)
    assert.are.equal(2, #all)
    assert.are.equal(4, all[1].step)
    assert.are.equal(5, all[2].step)
  end)

  it("keep_last: a kill while it removes a checkpoint leaves no half-removed step_*; the next save cleans up", function()
    local dir = ROOT .. "/prunekill"
    local out, rc = sh("./lutra tests/lua/jobs/prune_kill_job.lua --dir=" .. dir)
    assert.are.equal(137, rc, out) -- SIGKILL, in the removal of step 1
    -- a save killed while it replaced `latest` leaves latest.tmp.<pid>
    local f = assert(io.open(dir .. "/latest.tmp.999999999", "wb"))
    f:write("step_0000")
    f:close()
    local function entries()
      local names = {}
      for name in io.popen("ls -A " .. dir):lines() do names[#names + 1] = name end
      return names
    end
    for _, name in ipairs(entries()) do
      if name:match("^step_") then
        local ok, why = lt.ckpt.is_complete(dir .. "/" .. name)
        assert(ok, ("%s is left half-removed: %s"):format(name, tostring(why)))
      end
    end
    assert.are.equal(dir .. "/step_00000002", lt.ckpt.latest(dir))
    -- what a removal in place (lutra before this fix) could leave: no state.json
    os.execute(("mkdir -p %s/step_00000000 && echo x > %s/step_00000000/model.safetensors"):format(dir, dir))
    lt.ckpt.save(dir, { model = tiny(1), step = 3, keep_last = 1 })
    assert.are.same({ "latest", "step_00000003" }, entries())
  end)

  it("refuses a file whose bytes changed at the same size, naming it; resume = auto falls back, saying why", function()
    local out, rc = job("--name=crc --steps=10 --ckpt_every=5")
    assert.are.equal(0, rc, out)
    out, rc = job("--name=crcwhole --steps=10 --ckpt_every=5")
    assert.are.equal(0, rc, out)
    local dir = ROOT .. "/crc/ckpt"
    local ten = dir .. "/step_00000010"
    local good = read(ten .. "/model.safetensors")
    corrupt(ten .. "/model.safetensors")
    assert.are.equal(#good, #read(ten .. "/model.safetensors"))
    local ok, why = lt.ckpt.verify(ten)
    assert.is_false(ok)
    assert.truthy(why:find(ten .. "/model.safetensors: its checksum is crc32c:", 1, true), why)
    local m = tiny(1)
    H.assert_error(function() lt.ckpt.load(ten, { model = m }) end, ten .. "/model.safetensors: its checksum is",
      "state.json says crc32c:")
    -- the optimizer's file is checked as well
    local five = dir .. "/step_00000005"
    local opt_good = read(five .. "/optimizer.safetensors")
    corrupt(five .. "/optimizer.safetensors")
    H.assert_error(function() lt.ckpt.load(five, { model = m, opt = lt.optim.AdamW(m) }) end,
      five .. "/optimizer.safetensors: its checksum is")
    -- the weights alone (sample.lua on the run's directory): step 10's are bad, step 5's good
    local _, st5 = lt.ckpt.load_model(dir)
    assert.are.equal(5, st5.step)
    local f = assert(io.open(five .. "/optimizer.safetensors", "wb"))
    f:write(opt_good)
    f:close()
    -- resume = "auto" takes step 5, names step 10 and why, and saves a good step 10
    out, rc = job("--name=crc --steps=10 --ckpt_every=5 --resume=auto")
    assert.are.equal(0, rc, out)
    assert.truthy(out:find('resume = "auto" skips ' .. ten .. ": " .. ten .. "/model.safetensors: its checksum is", 1,
      true), out)
    assert.truthy(out:find("resumed from " .. five, 1, true), out)
    assert.is_true((lt.ckpt.verify(ten)))
    assert.are.equal(read(ROOT .. "/crcwhole/ckpt/step_00000010/model.safetensors"), read(ten .. "/model.safetensors"))
    -- with no checkpoint at all, resume = "auto" starts afresh
    out, rc = job("--name=crcfresh --steps=5 --ckpt_every=0 --resume=auto")
    assert.are.equal(0, rc, out)
    assert.truthy(out:find("job: ran 5 steps, preempted nil, resumed from nil", 1, true), out)
    -- with none that passes, resume = "auto" stops rather than start afresh over them
    corrupt(five .. "/model.safetensors")
    corrupt(ten .. "/model.safetensors")
    out, rc = job("--name=crc --steps=10 --ckpt_every=5 --resume=auto")
    assert.are_not.equal(0, rc, out)
    assert.truthy(out:find("no checkpoint in " .. dir .. " passes its checks", 1, true), out)
    assert.falsy(out:find("traceback", 1, true), out) -- (the user's files to fix: the message alone)
    -- a newer step whose state.json is broken is named, not passed over in silence; alone, it is
    -- not taken for no checkpoint at all (was: "no checkpoint ...: starting afresh")
    local fifteen = dir .. "/step_00000015"
    os.execute("mkdir -p " .. fifteen .. " && echo '{\"format\":' > " .. fifteen .. "/state.json")
    local skipped = {}
    lt.ckpt.newest_verified(dir, function(p, why) skipped[#skipped + 1] = p .. ": " .. why end)
    assert.are.equal(fifteen .. ": " .. fifteen .. "/state.json is not valid JSON", skipped[1])
    os.execute("rm -rf " .. five .. " " .. ten)
    out, rc = job("--name=crc --steps=20 --ckpt_every=5 --resume=auto")
    assert.are_not.equal(0, rc, out)
    assert.truthy(out:find('skips ' .. fifteen .. ": " .. fifteen .. "/state.json is not valid JSON", 1, true), out)
    assert.truthy(out:find("no checkpoint in " .. dir .. " passes its checks", 1, true), out)
  end)

  it("loads a checkpoint saved without checksums (by an older lutra), checked by size, with a note", function()
    local dir = ROOT .. "/nocrc"
    local m = tiny(1)
    local path = lt.ckpt.save(dir, { model = m, step = 1 })
    local st = lt.json.decode(read(path .. "/state.json"))
    st.checksums = nil
    local text = lt.json.encode(st)
    assert.are.equal(0, C.lt_write_file_atomic(path .. "/state.json", text, #text))
    local ok, note = lt.ckpt.verify(path)
    assert.is_true(ok)
    assert.truthy(note:find("has no checksums", 1, true), note)
    local b = tiny(2)
    lt.ckpt.load(path, { model = b })
    assert.are.equal(0, (b:parameters()[1] - m:parameters()[1]):abs():max():item())
    local _, saved = lt.ckpt.load_model(dir)
    assert.are.equal(1, saved.step)
  end)

  it("keep_last never removes the checkpoint just written, nor later steps", function()
    local dir = ROOT .. "/keep2"
    local m = tiny(1)
    for _, st in ipairs { 40, 50 } do lt.ckpt.save(dir, { model = m, step = st }) end
    local path = lt.ckpt.save(dir, { model = m, step = 5, keep_last = 1 })
    assert.is_true((lt.ckpt.is_complete(path)))
    assert.are.equal(3, #lt.ckpt.list(dir))
    H.assert_error(function() lt.ckpt.save(dir, { model = m, step = 6, keep_last = 1.5 }) end, "keep_last must be")
    H.assert_error(function() lt.ckpt.save(dir, { model = m, step = 1e20 }) end, "step must be a whole number")
  end)

  it("lists directories whose names start with a dash", function()
    local dir = ROOT .. "/-dash"
    lt.ckpt.save(dir, { model = tiny(1), step = 3 })
    assert.are.equal(dir .. "/step_00000003", lt.ckpt.latest(dir))
  end)

  it("skips checkpoints whose state.json has fields of the wrong type, naming the field", function()
    local dir = ROOT .. "/types"
    local m = tiny(1)
    local path = lt.ckpt.save(dir, { model = m, step = 2 })
    local function rewrite(edit)
      local st = lt.json.decode(read(path .. "/state.json"))
      edit(st)
      local text = lt.json.encode(st)
      assert.are.equal(0, C.lt_write_file_atomic(path .. "/state.json", text, #text))
    end
    local good = read(path .. "/state.json")
    for _, case in ipairs {
      { function(st) st.files["model.safetensors"] = "abc" end, "files.model.safetensors' must be a byte count" },
      { function(st) st.step = -3 end, "'step' must be a whole number >= 0" },
      { function(st) st.step = 6.5 end, "'step' must be a whole number >= 0" },
      { function(st) st.optimizer_steps = "x" end, "'optimizer_steps' must be" },
      { function(st) st.layout = 5 end, "'layout' must be" },
      { function(st) st.layout.tp = 0 end, "'layout.tp' must be a whole number >= 1, got 0" },
      { function(st) st.layout.dp, st.layout.tp = 1, 2 end, "'layout' has dp 1 x tp 2, not its world_size 1" },
      { function(st) st.rng = { default = { seed = -1, offset = 0 } } end, "'rng.default' must be" },
      { function(st) st.files["../x"] = 1 end, "names a file outside the checkpoint" },
      { function(st) st.checksums["model.safetensors"] = "md5:0" end, "'checksums.model.safetensors' must be \"crc32c:" },
      { function(st) st.checksums["model.safetensors"] = nil end, "'checksums' has none for model.safetensors" },
      { function(st) st.checksums["other.bin"] = "crc32c:00000000" end, "'checksums' names a file that 'files' does not list" },
    } do
      rewrite(case[1])
      assert.is_nil(lt.ckpt.latest(dir))
      H.assert_error(function() lt.ckpt.load(path, { model = m }) end, path .. "/state.json", case[2])
      assert.are.equal(0, C.lt_write_file_atomic(path .. "/state.json", good, #good))
    end
  end)

  it("refuses bad optimizer state before changing the model or the optimizer", function()
    local dir = ROOT .. "/badopt"
    local a = tiny(1)
    local oa = lt.optim.AdamW(a, { lr = 1e-2 })
    local x = lt.randint(0, 512, { 2, 8 }, { generator = lt.Generator(1) })
    oa:zero_grad()
    a:loss(x, x):backward()
    oa:step()
    local path = lt.ckpt.save(dir, { model = a, opt = oa, step = 1 })
    local t, meta = lt.load(path .. "/optimizer.safetensors")
    t["1.exp_avg_sq"] = t["1.exp_avg_sq"] - 1
    lt.save(path .. "/optimizer.safetensors", t, meta)
    reseal(path, "optimizer.safetensors")
    local b = tiny(2)
    local before = b:parameters()[1]:clone()
    local ob = lt.optim.AdamW(b, { lr = 1e-2 })
    H.assert_error(function() lt.ckpt.load(path, { model = b, opt = ob }) end, "optimizer.safetensors",
      "exp_avg_sq of parameter 1 holds negative values")
    assert.are.equal(0, (b:parameters()[1] - before):abs():max():item())
    assert.are.equal(0, ob.step_count)
  end)

  it("lt.train refuses a checkpoint directory holding another history, and configs JSON cannot hold", function()
    local out, rc = job("--name=history --steps=6 --ckpt_every=3")
    assert.are.equal(0, rc, out)
    out, rc = job("--name=history --steps=4 --ckpt_every=2")
    assert.are_not.equal(0, rc)
    assert.truthy(out:find("already holds checkpoints up to step 6", 1, true), out)
    -- resumed for more steps than the checkpoint's run was set for: said, then it goes on
    out, rc = job("--name=history --steps=8 --ckpt_every=0 --resume=auto")
    assert.are.equal(0, rc, out)
    assert.truthy(out:find("the checkpoint's run was set for 6 steps, this one for 8", 1, true), out)
    out, rc = job("--name=history --steps=5 --ckpt_every=0 --resume=auto") -- (past its end: nothing to run, said)
    assert.are.equal(0, rc, out)
    assert.truthy(out:find("the checkpoint's run was set for 6 steps, this one for 5", 1, true), out)
    local m = tiny(1)
    local loader = lt.data.shards { path = DATA .. "/train", batch = 2, seq = 16 }
    H.assert_error(function()
      lt.train { model = m, optimizer = lt.optim.AdamW(m), train = loader, steps = 2, ckpt_every = 1, quiet = true,
        out_dir = ROOT, name = "cfg", config = { warmup = 0 / 0 } }
    end, "config.warmup cannot be saved in a checkpoint (NaN or infinite)")
    H.assert_error(function()
      lt.train { model = m, optimizer = lt.optim.AdamW(m), steps = 2, ckpt_every = 1, quiet = true, out_dir = ROOT,
        name = "noload", train = { next = function() return loader:next() end } }
    end, "checkpoints need a training loader with state() and load_state()")
  end)

  it("replaces a checkpoint of the same step only once the new one is complete", function()
    local dir = ROOT .. "/same"
    local a, b = tiny(1), tiny(2)
    lt.ckpt.save(dir, { model = a, step = 3 })
    lt.ckpt.save(dir, { model = b, step = 3 })
    local c = tiny(3)
    lt.ckpt.load(dir .. "/step_00000003", { model = c })
    assert.are.equal(0, (c:parameters()[1] - b:parameters()[1]):abs():max():item())
    -- a save that fails (a tensor safetensors cannot hold) leaves the old one
    local ok = pcall(lt.ckpt.save, dir, { model = { state_dict = function() return { x = 1 } end }, step = 3 })
    assert.is_false(ok)
    assert.is_true((lt.ckpt.is_complete(dir .. "/step_00000003")))
    lt.ckpt.load(dir .. "/step_00000003", { model = c })
    assert.are.equal(0, (c:parameters()[1] - b:parameters()[1]):abs():max():item())
  end)

  it("rejects another model config, another world size and missing state, naming file and field", function()
    local dir = ROOT .. "/bad"
    local m = tiny(1)
    local o = lt.optim.AdamW(m, { lr = 1e-3 })
    local path = lt.ckpt.save(dir, { model = m, opt = o, step = 1 })
    local other = lt.models.gpt2("gpt2-tiny", { n_layer = 3, generator = lt.Generator(1) })
    local ok, err = pcall(lt.ckpt.load, path, { model = other })
    assert.is_false(ok)
    assert.truthy(tostring(err):find("state.json: model_config.n_layer is 2, the model's is 3", 1, true), err)
    ok, err = pcall(lt.ckpt.load, path, { model = lt.models.llama("llama-tiny", { generator = lt.Generator(1) }) })
    assert.is_false(ok)
    assert.truthy(tostring(err):find("state.json: a GPT-2 checkpoint, the model is a Llama", 1, true), err)
    ok, err = pcall(lt.ckpt.load, path, { model = m, opt = o, world_size = 4 })
    assert.is_false(ok)
    assert.truthy(tostring(err):find("layout.world_size is 1, this job has 4 ranks", 1, true), err)
    -- the weights alone are whole: they load on any world size
    local w4 = tiny(7)
    lt.ckpt.load(path, { model = w4, world_size = 4 })
    assert.are.equal(0, (w4:parameters()[1] - m:parameters()[1]):abs():max():item())
    local no_opt = lt.ckpt.save(dir, { model = m, step = 2 })
    ok, err = pcall(lt.ckpt.load, no_opt, { model = m, opt = o })
    assert.is_false(ok)
    assert.truthy(tostring(err):find("holds no optimizer state", 1, true), err)
    ok, err = pcall(lt.ckpt.load, no_opt, { rng = { default = lt.Generator(1) } })
    assert.is_false(ok)
    assert.truthy(tostring(err):find("rng.default is missing", 1, true), err)
    ok, err = pcall(lt.ckpt.load, ROOT .. "/nowhere", { model = m })
    assert.is_false(ok)
    assert.truthy(tostring(err):find("is not a checkpoint directory", 1, true), err)
  end)

  it("names the tensor when the weights do not fit the model", function()
    local dir = ROOT .. "/shape"
    local m = tiny(1)
    local path = lt.ckpt.save(dir, { model = m, step = 1 })
    -- the same config, but a tensor of another shape written into the file
    local sd = m:state_dict()
    sd["transformer.ln_f.weight"] = lt.zeros({ 3 })
    lt.save(path .. "/model.safetensors", sd)
    reseal(path, "model.safetensors")
    local ok, err = pcall(lt.ckpt.load, path, { model = m })
    assert.is_false(ok)
    assert.truthy(tostring(err):find("model.safetensors: wrong shape or dtype: transformer.ln_f.weight", 1, true), err)
  end)
end)
