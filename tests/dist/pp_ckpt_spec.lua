-- tests/dist/pp_ckpt_spec.lua: checkpoints of models split into pipeline
-- stages (issue 26, point 6; lutra.dist.pp.ckpt). The tiny GPT-2 (tied
-- head) and Llama of tests/dist/pp_layouts.lua, f32, trained by lt.train on
-- each layout the job allows (np=2: pp=2 GPT-2 1F1B; pp=2 Llama interleaved
-- with 2 virtual stages a rank; np=4: dp=2 x pp=2 GPT-2 with ZeRO 1, tp=2 x
-- pp=2 GPT-2, pp=4 Llama; np=8, by hand: dp=2 x tp=2 x pp=2 GPT-2, ZeRO 1):
--   - 3 steps, a checkpoint, a fresh run resuming to step 6 gives the losses
--     and this rank's weights of 6 uninterrupted steps bit for bit; state.json's
--     layout (pp, virtual_stages, pp_stages) and files (model-pp<s>[-tp<r>],
--     the optimizer's per stage or per rank) are the ones written;
--   - the whole weights one process reads (lt.ckpt.load_model, what
--     recipes/sample.lua --ckpt does) hold every tensor of the whole model,
--     each equal bitwise to the stage's (TP shards gathered; the last
--     stage's tied head lm_head.weight is the embedding, stored once); a
--     model of another pipeline layout loads them (load_weights) bitwise;
--   - lt.hf.export of the pipeline model (every rank calls it, rank 0
--     writes) writes the same bytes as the one process's export;
--   - a resume on another layout (pp, blocks per stage, dp) is refused on
--     every rank naming both layouts; a corrupt or missing stage file is
--     named, on every rank of a resume (no rank left waiting), and resume =
--     "auto" passes over that checkpoint to the one before.
local lt = require "lutra"
package.path = "tests/dist/?.lua;" .. package.path
local H = require "harness"
local P = require "pp_layouts"

lt.dist.init()
lt.dist.set_timeout(60)
local world = lt.dist.world_size()
local V, B, T = 37, 2, 8

local ROOT
local function root()
  if ROOT then return ROOT end
  ROOT = H.shared_dir("lutra-dist-ppckpt")
  if lt.dist.rank() == 0 then
    os.execute("mkdir -p " .. ROOT .. "/data")
    lt.data.write_shard(ROOT .. "/data/train_000000.bin", lt.randint(0, V, { 3000 }, { generator = lt.Generator(3) }), V)
  end
  lt.dist.barrier()
  return ROOT
end

-- the layouts of this job: {key, family, pp, tp, v, stages, zero}
local function layouts(w)
  if w == 2 then
    return { { key = "gpt2-pp2", family = "gpt2", pp = 2 },
      { key = "llama-pp2v2", family = "llama", pp = 2, v = 2 } }
  elseif w == 4 then
    return { { key = "gpt2-dp2pp2z1", family = "gpt2", pp = 2, zero = 1 },
      { key = "gpt2-tp2pp2", family = "gpt2", pp = 2, tp = 2 },
      { key = "llama-pp4", family = "llama", pp = 4 } }
  elseif w == 8 then -- (run by hand: run.sh's jobs are of 2 and 4 ranks)
    return { { key = "gpt2-dp2tp2pp2z1", family = "gpt2", pp = 2, tp = 2, zero = 1 } }
  end
  return {}
end

local meshes = {} -- (groups made once per layout: every rank makes the same ones in the same order)
local function mesh(l)
  local k = ("%dx%d"):format(l.tp or 1, l.pp)
  meshes[k] = meshes[k] or lt.dist.mesh { tp = l.tp or 1, pp = l.pp }
  return meshes[k]
end

local function build(l, stages)
  local m = mesh(l)
  local make = l.family == "llama" and P.llama or P.gpt2
  return make { pp = l.pp > 1 and m.pp or nil, tp = (l.tp or 1) > 1 and m.tp or nil, virtual_stages = l.v,
    pp_stages = stages or l.stages }
end

-- lt.train on layout l to step `steps` (a checkpoint every 3) -> model, losses, summary
local function run(l, name, steps, resume, stages)
  local m = mesh(l)
  local model = build(l, stages)
  local zero = l.zero or 0
  local ddp = lt.dist.DataParallel(model, { group = m.dp, gradients = zero >= 2 and "none" or "all_reduce" })
  local opt
  if zero > 0 then
    opt = lt.dist.Zero(model, { stage = zero, optimizer = "AdamW", lr = 1e-2, weight_decay = 0.1, group = m.dp })
  else
    opt = lt.optim.AdamW(model:parameters(), { lr = 1e-2, weight_decay = 0.1 })
  end
  local data = lt.data.shards { path = root() .. "/data/train", batch = B, seq = T, seed = 9,
    rank = m.coords.dp, world = m.sizes.dp }
  local losses = {}
  local summary = lt.train { model = model, optimizer = opt, train = data, steps = steps, accum = 4, clip = 1,
    quiet = true, out_dir = root(), name = name, ddp = ddp, ckpt_every = 3, resume = resume or "none",
    flops_per_token = 1, schedule = lt.optim.schedules.cosine { lr = 1e-2, warmup = 2, steps = 6 },
    on_step = function(rec) losses[rec.step] = rec.loss end }
  return model, losses, summary
end

local function ckpt_of(l, step, name) return ("%s/%s/ckpt/step_%08d"):format(root(), name or ("cut-" .. l.key), step) end

-- a stage's tensors under the whole model's names (TP shards gathered; the
-- tied head copy under the embedding's name)
local function stage_whole(model)
  local sd = model.tp_group and lt.dist.tp.full_state_dict(model) or model:state_dict()
  local out = {}
  local tied = model.pp and model.pp.copy and model.pp.family.whole_tied
  for name, t in pairs(sd) do out[(name == "lm_head.weight" and tied) or name] = t end
  return out
end

local function bitwise(a, b, what)
  assert(a and b, what .. ": missing")
  assert(tostring(a:shape()) == tostring(b:shape()), ("%s: %s vs %s"):format(what, tostring(a:shape()), tostring(b:shape())))
  assert(a.dtype == b.dtype, ("%s: %s vs %s"):format(what, a.dtype, b.dtype))
  H.close(a, b, 0, what) -- (f32 values compared in f64: equal means bit for bit, NaN failing)
end

local resumed_models, uninterrupted = {}, {}
-- the tests below need the layouts of a job of 2 or 4 ranks: registered only there (none passes vacuously)
local test = #layouts(world) > 0 and H.test or function() end

for _, l in ipairs(layouts(world)) do
  H.test(l.key .. ": a run resumed from its step-3 checkpoint repeats the uninterrupted one bit for bit", function(r, w)
    local whole, a = run(l, "whole-" .. l.key, 6)
    run(l, "cut-" .. l.key, 3)
    local resumed, b, summary = run(l, "cut-" .. l.key, 6, "auto")
    assert(summary.resumed_from == ckpt_of(l, 3), "resumed from " .. tostring(summary.resumed_from))
    for s = 1, 6 do assert(a[s] and a[s] == a[s], ("step %d: no loss"):format(s)) end
    for s = 4, 6 do assert(b[s] and a[s] == b[s], ("step %d: %s vs %s"):format(s, tostring(b[s]), tostring(a[s]))) end
    local pa, pb, n = whole:state_dict(), resumed:state_dict(), 0
    for name, t in pairs(pa) do
      bitwise(pb[name], t, "this rank's " .. name)
      n = n + 1
    end
    assert(n > 0, "the stage holds no tensors")
    local st = lt.ckpt.read_state(ckpt_of(l, 6))
    local L, tp, v = st.layout, l.tp or 1, l.v or 1
    assert(L.world_size == w and L.pp == l.pp and L.tp == tp and L.dp == w / (tp * l.pp) and L.zero == (l.zero or 0)
      and L.virtual_stages == v and #L.pp_stages == l.pp * v, "layout " .. lt.json.encode(L))
    assert(table.concat(L.pp_stages, ",") == table.concat(resumed.pp.counts, ","), "pp_stages " .. lt.json.encode(L))
    assert(not st.files["model.safetensors"] and not st.files["optimizer.safetensors"], "a pipeline checkpoint's files")
    for s = 0, l.pp - 1 do
      for t = 0, tp - 1 do
        local suffix = tp > 1 and ("pp%05d-tp%05d"):format(s, t) or ("pp%05d"):format(s)
        assert(st.files["model-" .. suffix .. ".safetensors"], "the weights of stage " .. s .. " TP rank " .. t)
        if not l.zero then assert(st.files["optimizer-" .. suffix .. ".safetensors"], "the optimizer of stage " .. s) end
      end
    end
    if l.zero then assert(st.files[("optimizer-rank%05d.safetensors"):format(w - 1)], "ZeRO: one file per rank") end
    -- the last stage's file names its tied copy
    local last = ckpt_of(l, 6) .. "/" .. (tp > 1 and ("model-pp%05d-tp00000.safetensors") or "model-pp%05d.safetensors")
      :format(l.pp - 1)
    local meta = lt.safetensors.open(last):metadata()
    assert(meta.pp_rank == tostring(l.pp - 1) and meta.pp_size == tostring(l.pp), "metadata " .. lt.json.encode(meta))
    if l.family == "gpt2" then
      assert(lt.json.decode(meta.tied)["lm_head.weight"] == "transformer.wte.weight", "tied " .. tostring(meta.tied))
    else
      assert(meta.tied == nil, "an untied head is no copy")
    end
    resumed_models[l.key], uninterrupted[l.key] = resumed, a
  end)
end

test("one process reads the whole model from each pipeline checkpoint; another split loads it bitwise", function(r, w)
  for _, l in ipairs(layouts(w)) do
    local model = assert(resumed_models[l.key], l.key .. ": no run")
    local one = lt.ckpt.load_model(ckpt_of(l, 6)) -- (recipes/sample.lua --ckpt's reader)
    local ref = (l.family == "llama" and P.llama or P.gpt2) { pad_vocab = one.config.padded_vocab_size }
    local names, want = 0, ref:state_dict()
    for name, t in pairs(want) do
      names = names + 1
      local got = one:state_dict()[name]
      assert(got and tostring(got:shape()) == tostring(t:shape()), l.key .. ": whole " .. name)
    end
    for name in pairs(one:state_dict()) do assert(want[name], l.key .. ": unexpected " .. name) end
    assert((l.family == "gpt2") == (one:state_dict()["lm_head.weight"] == nil), l.key .. ": the tied head stored once")
    local n = 0
    for name, t in pairs(stage_whole(model)) do
      bitwise(one:state_dict()[name], t, l.key .. ": whole " .. name)
      n = n + 1
    end
    assert(n > 0 and names > 0, l.key .. ": nothing compared")
    -- another split (blocks 1 + 3 on two stages) from the same files
    local m2 = build({ key = l.key .. "-other", family = l.family, pp = 2, tp = l.tp }, { 1, 3 })
    lt.ckpt.load_weights(ckpt_of(l, 6), m2)
    for name, t in pairs(stage_whole(m2)) do bitwise(t, one:state_dict()[name], l.key .. " into blocks 1+3: " .. name) end
  end
end)

test("a one-process checkpoint's weights load into each pipeline layout, each stage its part", function(r, w)
  for _, family in ipairs { "gpt2", "llama" } do
    local whole = (family == "llama" and P.llama or P.gpt2) {}
    local dir = root() .. "/one-" .. family
    if r == 0 then lt.ckpt.save(dir, { model = whole, step = 1 }) end -- (one process's files: model.safetensors)
    lt.dist.barrier()
    local n, any = 0, false
    for _, l in ipairs(layouts(w)) do
      if l.family == family then
        any = true
        local m = build(l)
        lt.ckpt.load_weights(dir .. "/step_00000001", m)
        for name, t in pairs(stage_whole(m)) do
          local want = whole:state_dict()[name]
          if want and t:size(1) > want:size(1) then -- (a vocabulary padded for TP: the rows past V zero)
            H.close(t:narrow(1, want:size(1) + 1, t:size(1) - want:size(1)), lt.zeros(t:size(1) - want:size(1),
              t:size(2)), 0, l.key .. ": " .. name .. "'s padding rows")
            t = t:narrow(1, 1, want:size(1)):contiguous()
          end
          bitwise(t, want, ("%s from one process: %s"):format(l.key, name))
          n = n + 1
        end
      end
    end
    assert(n > 0 or not any, family .. ": nothing compared")
  end
end)

test("lt.hf.export of a pipeline model writes the one process's files byte for byte", function(r, w)
  for _, l in ipairs(layouts(w)) do
    local model = assert(resumed_models[l.key], l.key .. ": no run")
    local a, b = root() .. "/hf-pp-" .. l.key, root() .. "/hf-one-" .. l.key
    lt.hf.export(model, a) -- every rank
    local ok, err = true, nil
    if r == 0 then ok, err = pcall(function() -- (rank 0 compares)
      lt.hf.export(lt.ckpt.load_model(ckpt_of(l, 6)), b)
      for _, f in ipairs { "model.safetensors", "config.json" } do
        local x, y = io.open(a .. "/" .. f, "rb"), io.open(b .. "/" .. f, "rb")
        assert(x and y, l.key .. ": " .. f .. " written")
        local sx, sy = x:read("*a"), y:read("*a")
        x:close()
        y:close()
        assert(#sx > 0 and sx == sy, ("%s: %s differs (%d vs %d bytes)"):format(l.key, f, #sx, #sy))
      end
      local hf = lt.hf.load(a)
      assert(hf.config.n_layer == 4 or hf.config.n_layers == 4, l.key .. ": the whole model")
    end) end
    local bad, why = lt.dist.first_error(ok, err) -- (every rank stops at rank 0's failure)
    assert(not bad, why)
  end
  -- a directory rank 0 cannot make: every rank raises its reason (none is left sending)
  local model = resumed_models[layouts(w)[1].key]
  H.raises(function() lt.hf.export(model, root() .. "/data/train_000000.bin/hf") end, "hf.export: ",
    "train_000000.bin")
end)

test("a resume on another pipeline layout is refused on every rank, naming both layouts", function(r, w)
  local l = layouts(w)[1]
  local path = ckpt_of(l, 6)
  local saved = ({ [2] = "dp 1 x tp 1 x pp 2 (blocks 2+2; 2 ranks), ZeRO 0",
    [4] = "dp 2 x tp 1 x pp 2 (blocks 2+2; 4 ranks), ZeRO 1", [8] = "dp 2 x tp 2 x pp 2 (blocks 2+2; 8 ranks), ZeRO 1" })[w]
  -- no pipeline: dp = the world
  local plain = P.gpt2 {}
  local ok, err = pcall(lt.ckpt.load, path, { model = plain, opt = lt.optim.AdamW(plain:parameters(), { lr = 1e-3 }),
    dist = true })
  assert(not ok and tostring(err):find(("the checkpoint's layout is %s, this job's dp %d x tp 1 (%d ranks), ZeRO 0"):format(
    saved, w, w), 1, true) and tostring(err):find(l.tp and "another tensor-parallel size" or "another number of pipeline stages",
    1, true), tostring(err))
  -- the same stages, other blocks per stage, through lt.train's resume
  ok, err = pcall(run, l, "cut-" .. l.key, 6, path, { 1, 3 })
  assert(not ok and tostring(err):find("the checkpoint's layout is " .. saved, 1, true)
    and tostring(err):find("(blocks 1+3;", 1, true) and tostring(err):find("other blocks per stage", 1, true), tostring(err))
  if w == 2 then -- 2 virtual stages a rank into 1 (the same blocks per rank)
    local v2 = layouts(w)[2]
    local m = build({ key = "llama-pp2", family = "llama", pp = 2 }, { 2, 2 })
    ok, err = pcall(lt.ckpt.load, ckpt_of(v2, 6), { model = m, opt = lt.optim.AdamW(m:parameters(), { lr = 1e-3 }) })
    assert(not ok and tostring(err):find("the checkpoint's layout is dp 1 x tp 1 x pp 2, 2 virtual stages a rank "
      .. "(blocks 1+1+1+1; 2 ranks), ZeRO 0, this job's dp 1 x tp 1 x pp 2 (blocks 2+2; 2 ranks), ZeRO 0 (another "
      .. "number of virtual stages", 1, true), tostring(err))
  end
  if w == 4 then -- dp=2 x pp=2 into pp=4
    ok, err = pcall(run, { key = "pp4", family = "gpt2", pp = 4, zero = 1 }, "cut-" .. l.key, 6, path)
    assert(not ok and tostring(err):find("this job's dp 1 x tp 1 x pp 4 (blocks 1+1+1+1; 4 ranks), ZeRO 1", 1, true),
      tostring(err))
  end
end)

test("a corrupt or missing stage file is named on every rank; resume = auto passes over it", function(r, w)
  local l = layouts(w)[1]
  local tp = l.tp or 1
  local file = (tp > 1 and "model-pp%05d-tp00001.safetensors" or "model-pp%05d.safetensors"):format(l.pp - 1)
  local corrupt, missing = "corrupt-" .. l.key, "missing-" .. l.key
  local done, err = true, nil
  if r == 0 then done, err = pcall(function()
    os.execute(("cp -r %s/cut-%s %s/%s && cp -r %s/cut-%s %s/%s"):format(root(), l.key, root(), corrupt, root(), l.key,
      root(), missing))
    local f = assert(io.open(ckpt_of(l, 6, corrupt) .. "/" .. file, "r+b"))
    f:seek("set", f:seek("end") - 8) -- (the data's last bytes: the size stays)
    f:write("\255\0\255\0\255\0\255\0")
    f:close()
    os.remove(ckpt_of(l, 6, missing) .. "/" .. file)
  end) end
  lt.dist.barrier()
  assert(done, err)
  H.raises(function() lt.ckpt.load_model(ckpt_of(l, 6, corrupt)) end, ckpt_of(l, 6, corrupt) .. "/" .. file
    .. ": its checksum is")
  H.raises(function() lt.ckpt.load_weights(ckpt_of(l, 6, missing), P.gpt2 {}) end,
    ckpt_of(l, 6, missing) .. "/" .. file .. " is missing (state.json lists it)")
  -- a resume from the corrupt step: only the last stage reads that file, every rank raises naming it
  local t0 = os.time()
  local ok, e = pcall(run, l, corrupt, 6, ckpt_of(l, 6, corrupt))
  assert(not ok and tostring(e):find(ckpt_of(l, 6, corrupt) .. "/" .. file .. ": its checksum is", 1, true), tostring(e))
  assert(os.time() - t0 < 20, "the refusal took " .. (os.time() - t0) .. " s")
  -- resume = auto: step 6 passed over (every rank checks every file), step 3 resumed as the uninterrupted run
  local _, b, summary = run(l, missing, 6, "auto")
  assert(summary.resumed_from == ckpt_of(l, 3, missing), "resumed from " .. tostring(summary.resumed_from))
  local a = uninterrupted[l.key]
  for s = 4, 6 do assert(b[s] and a[s] == b[s], ("step %d: %s vs %s"):format(s, tostring(b[s]), tostring(a[s]))) end
end)

H.run("tests/dist/pp_ckpt_spec.lua")
if lt.dist.rank() == 0 and ROOT then os.execute("rm -rf " .. ROOT) end
