-- tests/dist/tp_ckpt_spec.lua: checkpoints of tensor-parallel models (issue
-- 25, point 6). A tiny model of lt.dist.tp's layers (an embedding, a
-- LayerNorm, a column-parallel q|k|v layer with parts = 3 whose pieces
-- combine per feature into a row-parallel layer, a column-GELU-row MLP, all
-- with biases, and a replicated head) is trained by lt.train on each layout
-- the job allows (np=2: tp=2; np=4: dp=2 x tp=2 with ZeRO 0 and 1, and tp=4):
--   - 4 steps, a checkpoint, a fresh run resuming to step 8 gives the losses
--     and weights of 8 uninterrupted steps, bit for bit (f32 on the CPU);
--     state.json's layout and file list are the ones written;
--   - the whole weights one process reads equal the gathered ones
--     (tp.full_state_dict), and a model of another TP size (1, 2 or 4)
--     loaded from them holds the same whole tensors and gives the same loss
--     (1e-5 relative: another split of the sums);
--   - a resume on another layout (tp, world size, ZeRO) is refused on every
--     rank with both layouts named; a corrupt or missing shard file is
--     named; resume = "auto" passes over a checkpoint with a corrupt shard;
--   - GPT-2 with its blocks' linears replaced by their TP shards: its
--     checkpoint rebuilt whole by lt.ckpt.load_model (what recipes/sample.lua
--     does) and its Hugging Face export (written by rank 0 alone) equal the
--     one-process model; load_full_state_dict's errors name the tensor;
--   - GPT-2 and Llama of a padded vocabulary (97 ids: 98 rows at tp=2): a
--     tp=2 checkpoint's weights load at tp=4, in one process (97 rows) and
--     with another pad_vocab (the rows re-padded), the same loss; a resume
--     into another padding is refused naming it; a TP group that is not
--     the mesh's (np=4) makes every rank's save raise the failing rank's reason.
local lt = require "lutra"
package.path = "tests/dist/?.lua;" .. package.path
local H = require "harness"
local tp = lt.dist.tp
local F = require "lutra.nn.functional"
lt.dist.init() -- (the layouts tested depend on the world's size)

local V, C, HQ, HM, B, T = 16, 8, 8, 16, 2, 8

local Tiny = lt.nn.Module:extend("TinyTP")
-- the whole layers from one seed on every rank, then (with a group) their shards
function Tiny:init(seed, g, hm, parts)
  local HM = hm or HM
  local gen = lt.Generator(seed)
  self.wte = lt.nn.Embedding(V, C, { generator = gen })
  self.ln = lt.nn.LayerNorm(C)
  local qkv, proj = lt.nn.Linear(C, 3 * HQ, { generator = gen }), lt.nn.Linear(HQ, C, { generator = gen })
  local fc, down = lt.nn.Linear(C, HM, { generator = gen }), lt.nn.Linear(HM, C, { generator = gen })
  self.head = lt.nn.Linear(C, V, { generator = gen })
  if g then
    qkv = tp.ColumnParallelLinear.from(qkv, g, { parts = parts or 3 })
    proj = tp.RowParallelLinear.from(proj, g)
    fc, down = tp.ColumnParallelLinear.from(fc, g), tp.RowParallelLinear.from(down, g)
    rawset(self, "tp_group", g)
  end
  self.qkv, self.proj, self.fc, self.down = qkv, proj, fc, down
end
function Tiny:forward(idx)
  local x = self.wte(idx)
  local h = self.qkv(self.ln(x)) -- (B, T, 3 HQ / n): this rank's q | k | v features
  local k = h:size(3) / 3
  x = x + self.proj(h:narrow(3, 1, k) * h:narrow(3, k + 1, k) + h:narrow(3, 2 * k + 1, k))
  x = x + self.down(self.fc(x):gelu())
  return self.head(x)
end

local ROOT
local function root()
  if ROOT then return ROOT end
  ROOT = H.shared_dir("lutra-dist-tpckpt")
  if lt.dist.rank() == 0 then
    os.execute("mkdir -p " .. ROOT .. "/data")
    lt.data.write_shard(ROOT .. "/data/train_000000.bin", lt.randint(0, V, { 4000 }, { generator = lt.Generator(3) }), V)
  end
  lt.dist.barrier()
  return ROOT
end

local function layouts(w)
  if w == 2 then return { { tp = 2, zero = 0 } } end
  if w == 4 then
    return { { dp = 2, tp = 2, zero = 0 }, { dp = 2, tp = 2, zero = 1 }, { dp = 2, tp = 2, zero = 2 }, { dp = 2, tp = 2, zero = 3 },
      { tp = 4, zero = 0 } }
  end
  return {}
end
local function key(l) return ("dp%dtp%dz%d"):format(l.dp or 1, l.tp, l.zero) end

local meshes = {} -- (groups made once per layout: every rank makes the same ones in the same order)
local function mesh(l)
  local k = ("%dx%d"):format(l.dp or 1, l.tp)
  meshes[k] = meshes[k] or lt.dist.mesh { dp = l.dp or 1, tp = l.tp }
  return meshes[k]
end

-- lt.train on layout l: steps, ckpt_every = 4, resume; -> model, losses, summary, optimizer, loader
local function run(l, name, steps, resume)
  local m = mesh(l)
  local model = Tiny(5, m.tp)
  local ddp = lt.dist.DataParallel(model, { group = m.dp, gradients = l.zero >= 2 and "none" or "all_reduce" })
  local settings = { lr = 1e-2, betas = { 0.9, 0.95 }, weight_decay = 0.1 }
  local opt
  if l.zero == 0 then opt = lt.optim.AdamW(model, settings) else
    settings.stage, settings.group = l.zero, m.dp
    opt = lt.dist.Zero(model, settings)
  end
  local data = lt.data.shards { path = root() .. "/data/train", batch = B, seq = T, seed = 9,
    rank = m.coords.dp, world = m.sizes.dp }
  local losses = {}
  local summary = lt.train { model = model, optimizer = opt, train = data, steps = steps, quiet = true,
    out_dir = root(), name = name, ddp = ddp, ckpt_every = 4, resume = resume or "none", flops_per_token = 1,
    schedule = lt.optim.schedules.cosine { lr = 1e-2, warmup = 2, steps = 8 },
    on_step = function(rec) losses[rec.step] = rec.loss end }
  if opt.unshard then opt:unshard() end -- ZeRO 3: the (TP-sharded) parameters whole over the DP group, to compare
  return model, losses, summary, opt, data
end

local function ckpt_of(l, step) return ("%s/cut-%s/ckpt/step_%08d"):format(root(), key(l), step) end

-- a fixed batch and the model's loss on it (f64)
local batch_x = lt.randint(0, V, { B, T }, { generator = lt.Generator(11) })
local batch_y = lt.randint(0, V, { B, T }, { generator = lt.Generator(12) })
local function loss_of(model)
  return lt.autograd.no_grad(function() return F.cross_entropy(model(batch_x), batch_y):item() end)
end

local function same_whole(a, b, what)
  for name, t in pairs(b) do
    assert(a[name], what .. ": no " .. name)
    assert(tostring(a[name]:shape()) == tostring(t:shape()),
      ("%s: %s is %s, expected %s"):format(what, name, tostring(a[name]:shape()), tostring(t:shape())))
    H.close(a[name], t, 0, what .. ": " .. name)
  end
  for name in pairs(a) do assert(b[name], what .. ": unexpected " .. name) end
end

-- key -> the resumed run's whole weights (gathered), its loss on the batch, the uninterrupted run's losses
local gathered, losses_whole, uninterrupted = {}, {}, {}

for _, l in ipairs(layouts(lt.dist.world_size())) do
  H.test(("%s: a run resumed from its step-4 checkpoint repeats the uninterrupted one bit for bit"):format(key(l)), function(r, w)
    local whole, a = run(l, "whole-" .. key(l), 8)
    run(l, "cut-" .. key(l), 4)
    local resumed, b, summary = run(l, "cut-" .. key(l), 8, "auto")
    assert(summary.resumed_from == ckpt_of(l, 4), "resumed from " .. tostring(summary.resumed_from))
    for s = 5, 8 do assert(b[s] and a[s] == b[s], ("step %d: %s vs %s"):format(s, tostring(b[s]), tostring(a[s]))) end
    local pa, pb = whole:state_dict(), resumed:state_dict()
    for name, t in pairs(pa) do H.close(pb[name], t, 0, "this rank's " .. name) end
    -- the layout and the files state.json records
    local st = lt.ckpt.read_state(ckpt_of(l, 8))
    assert(st.layout.world_size == w and st.layout.tp == l.tp and st.layout.dp == w / l.tp and st.layout.zero == l.zero,
      "layout " .. lt.json.encode(st.layout))
    assert(not st.files["model.safetensors"], "a TP checkpoint has no model.safetensors")
    for t = 0, l.tp - 1 do
      assert(st.files[("model-tp%05d.safetensors"):format(t)], "model-tp file of TP rank " .. t)
      if l.zero == 0 then assert(st.files[("optimizer-tp%05d.safetensors"):format(t)], "optimizer file of TP rank " .. t) end
    end
    if l.zero > 0 then assert(st.files[("optimizer-rank%05d.safetensors"):format(w - 1)], "ZeRO: one file per rank") end
    assert(#st.loaders == w and st.loaders[w].world == w / l.tp and st.loaders[w].rank == (w / l.tp) - 1,
      "the loaders' DP rank and world")
    gathered[key(l)] = tp.full_state_dict(resumed)
    losses_whole[key(l)] = loss_of(resumed)
    uninterrupted[key(l)] = a
  end)
end

H.test("the whole weights one process reads from each TP checkpoint are the gathered ones, and give its loss", function(r, w)
  for _, l in ipairs(layouts(w)) do
    local want = assert(gathered[key(l)], key(l) .. ": no run to compare")
    local one = Tiny(77) -- (other weights: each must be replaced)
    lt.ckpt.load(ckpt_of(l, 8), { model = one }) -- one process: world size 1, no group
    same_whole(one:state_dict(), want, key(l) .. " read whole")
    local d = math.abs(loss_of(one) - losses_whole[key(l)])
    assert(d <= 1e-5 * math.abs(losses_whole[key(l)]), ("%s: loss %g vs %g"):format(key(l), loss_of(one), losses_whole[key(l)]))
    -- load_weights too, and the manifest's TP rank in each shard file's metadata
    local two = Tiny(78)
    lt.ckpt.load_weights(ckpt_of(l, 8), two)
    same_whole(two:state_dict(), want, key(l) .. " load_weights")
    local meta = lt.safetensors.open(ckpt_of(l, 8) .. "/model-tp00001.safetensors"):metadata()
    assert(meta.tp_rank == "1" and meta.tp_size == tostring(l.tp) and lt.json.decode(meta.shards)["qkv.weight"].parts == 3,
      "shard metadata " .. lt.json.encode(meta))
  end
end)

H.test("a checkpoint's weights load into a model of another TP size: the same whole tensors and loss", function(r, w)
  local cases = {} -- {saved layout, the layout loading}
  if w == 2 then cases = { { { tp = 2, zero = 0 }, { tp = 2, zero = 0 } } } end
  if w == 4 then
    cases = { { { dp = 2, tp = 2, zero = 0 }, { tp = 4, zero = 0 } }, { { tp = 4, zero = 0 }, { dp = 2, tp = 2, zero = 0 } },
      { { dp = 2, tp = 2, zero = 1 }, { tp = 4, zero = 0 } }, { { dp = 2, tp = 2, zero = 3 }, { tp = 4, zero = 0 } } }
  end
  for _, c in ipairs(cases) do
    local saved, into = c[1], c[2]
    local m = Tiny(99, mesh(into).tp)
    lt.ckpt.load_weights(ckpt_of(saved, 8), m)
    local what = key(saved) .. " into " .. key(into)
    same_whole(tp.full_state_dict(m), gathered[key(saved)], what)
    local want = losses_whole[key(saved)]
    assert(math.abs(loss_of(m) - want) <= 1e-5 * math.abs(want), ("%s: loss %g vs %g"):format(what, loss_of(m), want))
  end
  -- the same TP size with other records (qkv split whole, parts = 1): not its own file as it is, but sliced
  local l0 = layouts(w)[1]
  local flat = Tiny(99, mesh(l0).tp, nil, 1)
  lt.ckpt.load_weights(ckpt_of(l0, 8), flat)
  same_whole(tp.full_state_dict(flat), gathered[key(l0)], key(l0) .. " into qkv with parts = 1")
  -- a model of another size: the tensors named with their whole shapes (another TP size: one process's
  -- model), or this rank's file and shard shapes (the same TP size: its own file), nothing copied
  local l = layouts(w)[1]
  local other = Tiny(99, nil, HM * 2)
  local before = other.fc.weight:clone()
  H.raises(function() lt.ckpt.load_weights(ckpt_of(l, 8), other) end, "ckpt.load_weights: " .. ckpt_of(l, 8)
    .. ("/model-tp*.safetensors (%d files): wrong shape or dtype: down.weight (checkpoint [%d, %d], model whole [%d, %d]), fc.bias"):format(
      l.tp, C, HM, C, 2 * HM))
  local same = Tiny(99, mesh(l).tp, HM * 2)
  H.raises(function() lt.ckpt.load_weights(ckpt_of(l, 8), same) end, "ckpt.load_weights: " .. ckpt_of(l, 8)
    .. ("/model-tp%05d.safetensors: wrong shape or dtype: down.weight (checkpoint [%d, %d], model [%d, %d])"):format(
      mesh(l).tp:rank(), C, HM / l.tp, C, 2 * HM / l.tp))
  H.close(other.fc.weight, before, 0, "nothing copied")
end)

H.test("a resume on another layout is refused on every rank, naming both layouts", function(r, w)
  local l = layouts(w)[1]
  local path = ckpt_of(l, 8)
  -- another TP size: a model without a group on the same ranks
  local plain = Tiny(5)
  H.raises(function() lt.ckpt.load(path, { model = plain, opt = lt.optim.AdamW(plain, { lr = 1e-3 }), dist = true }) end,
    ("the checkpoint's layout is dp %d x tp %d (%d ranks), ZeRO 0, this job's dp %d x tp 1 (%d ranks), ZeRO 0"):format(w / l.tp, l.tp, w, w, w),
    "resuming on another layout is not supported yet")
  -- another world size
  local m = Tiny(5, mesh(l).tp)
  H.raises(function() lt.ckpt.load(path, { model = m, opt = lt.optim.AdamW(m, { lr = 1e-3 }), world_size = w * 2 }) end,
    "layout.world_size is " .. w .. ", this job has " .. 2 * w .. " ranks",
    ("the checkpoint's layout is dp %d x tp %d (%d ranks)"):format(w / l.tp, l.tp, w))
  if w == 4 then
    -- dp=2 x tp=2 into tp=4, through lt.train's resume (optimizer and loader)
    local ok, err = pcall(run, { tp = 4, zero = 0 }, "cut-" .. key(l), 8, path)
    assert(not ok and tostring(err):find("the checkpoint's layout is dp 2 x tp 2 (4 ranks), ZeRO 0, this job's dp 1 x tp 4 (4 ranks), ZeRO 0", 1, true),
      tostring(err))
    -- another ZeRO stage on the same dp x tp
    local z = Tiny(5, mesh(l).tp)
    H.raises(function() lt.ckpt.load(path, { model = z, opt = lt.dist.Zero(z, { stage = 1, lr = 1e-3, group = mesh(l).dp }) }) end,
      "layout.zero is 0, this job's optimizer is ZeRO stage 1")
  end
end)

H.test("a corrupt or missing shard file is named; resume = auto passes over a checkpoint with one", function(r, w)
  local l = layouts(w)[1]
  local corrupt, missing = root() .. "/corrupt-" .. key(l), root() .. "/missing-" .. key(l)
  local step8 = "/ckpt/step_00000008"
  local done, err = true, nil
  if r == 0 then done, err = pcall(function()
    os.execute(("cp -r %s/cut-%s %s && cp -r %s/cut-%s %s"):format(root(), key(l), corrupt, root(), key(l), missing))
    local f = assert(io.open(corrupt .. step8 .. "/model-tp00001.safetensors", "r+b"))
    f:seek("set", f:seek("end") - 8) -- (the data's last bytes: the size stays)
    f:write("\255\0\255\0\255\0\255\0")
    f:close()
    os.remove(missing .. step8 .. "/model-tp00001.safetensors")
  end) end
  lt.dist.barrier()
  assert(done, err)
  local one = Tiny(5)
  H.raises(function() lt.ckpt.load(corrupt .. step8, { model = one }) end,
    corrupt .. step8 .. "/model-tp00001.safetensors: its checksum is")
  H.raises(function() lt.ckpt.load_weights(missing .. step8, one) end,
    missing .. step8 .. "/model-tp00001.safetensors is missing (state.json lists it)")
  local ok, why = lt.ckpt.verify(corrupt .. step8, { "model.safetensors" })
  assert(not ok and why:find("model-tp00001.safetensors: its checksum is", 1, true), tostring(why))
  -- every rank checks every file: all pass over step 8 and resume from step 4, as the uninterrupted run
  local _, b, summary = run(l, "corrupt-" .. key(l), 8, "auto")
  assert(summary.resumed_from == corrupt .. "/ckpt/step_00000004", "resumed from " .. tostring(summary.resumed_from))
  local a = uninterrupted[key(l)]
  for s = 5, 8 do assert(b[s] and a[s] == b[s], ("step %d: %s vs %s"):format(s, tostring(b[s]), tostring(a[s]))) end
end)

-- GPT-2 with its blocks' linears replaced by their shards (the records a TP
-- GPT-2 carries; its forward is the lead's): the weights' way out
local function gpt2_tp(g)
  local m = lt.models.gpt2("gpt2-tiny", { generator = lt.Generator(5) })
  for _, b in ipairs(m.transformer.h:list()) do
    b.attn.c_attn = tp.ColumnParallelLinear.from(b.attn.c_attn, g, { parts = 3 })
    b.attn.c_proj = tp.RowParallelLinear.from(b.attn.c_proj, g)
    b.mlp.c_fc = tp.ColumnParallelLinear.from(b.mlp.c_fc, g)
    b.mlp.c_proj = tp.RowParallelLinear.from(b.mlp.c_proj, g)
  end
  rawset(m, "tp_group", g)
  return m
end

H.test("GPT-2's TP shards: lt.ckpt.load_model (recipes/sample.lua's reader) and lt.hf.export give the whole model", function(r, w)
  local groups = { { "tp" .. w, lt.dist.new_group(0, r) } }
  if w == 4 then groups[2] = { "dp2tp2", mesh { dp = 2, tp = 2, zero = 0 }.tp } end
  local want = lt.models.gpt2("gpt2-tiny", { generator = lt.Generator(5) }):state_dict()
  for _, case in ipairs(groups) do
    local name, g = case[1], case[2]
    local m = gpt2_tp(g)
    assert(m.transformer.h[1].attn.c_attn.weight:size(1) == 3 * 64 / g:size(), name .. ": c_attn is sharded")
    local dir = root() .. "/gpt2tp-" .. name
    local path = lt.ckpt.save(dir, { model = m, step = 3 }) -- (dist implied by model.tp_group)
    local files = {}
    for f in pairs(lt.ckpt.read_state(path).files) do files[#files + 1] = f end
    assert(#files == g:size(), name .. ": files " .. table.concat(files, " "))
    local got = lt.ckpt.load_model(dir)
    same_whole(got:state_dict(), want, name .. ": load_model")
    same_whole(tp.full_state_dict(m), want, name .. ": full_state_dict")
    -- into the TP model again, another seed first
    local m2 = gpt2_tp(g)
    tp.load_full_state_dict(m2, lt.models.gpt2("gpt2-tiny", { generator = lt.Generator(6) }):state_dict())
    lt.ckpt.load(path, { model = m2 })
    same_whole(tp.full_state_dict(m2), want, name .. ": ckpt.load into the TP model")
    -- the Hugging Face export: whole, written by rank 0 alone (every TP group calls it here)
    local out = root() .. "/gpt2tp-hf-" .. name
    lt.hf.export(m, out)
    lt.dist.barrier()
    same_whole(lt.hf.load(out):state_dict(), want, name .. ": hf.export")
  end
end)

H.test("a padded vocabulary: a tp=2 checkpoint's weights load at tp=" .. "world and in one process (other paddings)", function(r, w)
  local VP = 97 -- (tp=2 pads it to 98 rows, tp=4 to 100, one process keeps 97)
  local x = lt.randint(0, VP, { 2, 8 }, { generator = lt.Generator(1) }):to("i64")
  local m2 = mesh { dp = w / 2, tp = 2, zero = 0 }
  for _, family in ipairs { "gpt2", "llama" } do
    local function build(seed, g, over)
      local o = { generator = lt.Generator(seed), vocab_size = VP, tp = g }
      for k, v in pairs(over or {}) do o[k] = v end
      if family == "gpt2" then return lt.models.gpt2("gpt2-tiny", o) end
      return lt.models.llama("llama-tiny", o)
    end
    local saved = build(5, m2.tp)
    local want = saved:loss(x, x):item()
    local path = lt.ckpt.save(root() .. "/padded-" .. family, { model = saved, step = 1 })
    local into = { { "tp=" .. w, lt.dist.new_group(0, r) }, { "one process", nil },
      { "tp=2, pad_vocab 8", m2.tp, { pad_vocab = 8 } } }
    for _, c in ipairs(into) do
      local what = ("%s: tp=2 (98 rows) into %s"):format(family, c[1])
      local m = build(9, c[2], c[3])
      lt.ckpt.load_weights(path, m)
      local got = m:loss(x, x):item()
      assert(math.abs(got - want) <= 1e-5 * math.abs(want), ("%s: loss %.9g, saved %.9g"):format(what, got, want))
      local full = c[2] and tp.full_state_dict(m) or m:state_dict()
      local emb = full[family == "gpt2" and "transformer.wte.weight" or "model.embed_tokens.weight"]
      assert(emb:size(1) == m.config.padded_vocab_size, what .. ": the model's rows")
      if emb:size(1) > VP then
        H.close(emb:narrow(1, VP + 1, emb:size(1) - VP), lt.zeros(emb:size(1) - VP, emb:size(2)), 0, what .. ": padding rows")
      end
    end
    -- a resume (the optimizer's state too) into another padding is refused, naming it
    local m = build(9, m2.tp, { pad_vocab = 8 })
    local opt = lt.optim.AdamW(m, { lr = 1e-3 })
    H.raises(function() lt.ckpt.load(path, { model = m, opt = opt }) end,
      "model_config.padded_vocab_size is 98, the model's is 112", "a resume needs the same padding")
  end
end)

-- (a layout of 4 ranks: registered only in a job of 4, so no other job counts it as passed)
if select(2, lt.dist.init()) == 4 then
H.test("a TP group not laid out as lt.dist.mesh's: the save refused on every rank, naming the rank and the layout", function(r, w)
  local m4 = mesh { dp = 2, tp = 2, zero = 0 }
  local m = lt.models.gpt2("gpt2-tiny", { generator = lt.Generator(5), vocab_size = 96, tp = m4.dp }) -- (ranks 0, 2 and 1, 3)
  H.raises(function() lt.ckpt.save(root() .. "/not-a-mesh", { model = m, step = 1 }) end,
    "of a tensor-parallel group of 2 ranks in a job of 4", "checkpoints take the layout of lt.dist.mesh")
  assert(not lt.ckpt.is_complete(root() .. "/not-a-mesh/step_00000001"), "no checkpoint left")
end)
end

H.test("load_full_state_dict names missing, unexpected and mis-shaped (whole) tensors, before copying any", function(r, w)
  local g = lt.dist.new_group(0, r)
  local m = Tiny(5, g)
  local sd = Tiny(6):state_dict()
  local before = m.qkv.weight:clone()
  sd["qkv.bias"] = nil
  sd["extra.weight"] = lt.zeros(2)
  sd["fc.weight"] = lt.zeros(HM + w, C)
  H.raises(function() tp.load_full_state_dict(m, sd) end, "load_full_state_dict: missing: qkv.bias",
    "unexpected: extra.weight", ("fc.weight (checkpoint [%d, %d], model whole [%d, %d])"):format(HM + w, C, HM, C))
  H.close(m.qkv.weight, before, 0, "nothing copied")
  -- and whole slices: rank r holds its 1/w of each of q, k, v
  local whole = Tiny(6):state_dict()
  tp.load_full_state_dict(m, whole)
  local seg = HQ / w
  H.close(m.qkv.weight:narrow(1, seg + 1, seg), whole["qkv.weight"]:narrow(1, HQ + r * seg + 1, seg), 0, "k rows")
  H.close(m.down.weight, whole["down.weight"]:narrow(2, r * HM / w + 1, HM / w), 0, "row shard")
end)

H.run("tests/dist/tp_ckpt_spec.lua")
if lt.dist.rank() == 0 and ROOT then os.execute("rm -rf " .. ROOT) end
