--- recipes/gpt2.lua: the main job. Trains a small GPT-2 on token shards
-- (by default data/pydocs, the Python documentation, from `make data`) with
-- AdamW, warmup and linear decay, gradient clipping and accumulation,
-- evaluating on the validation shards and printing samples as it goes. It
-- prints the unigram baseline first (the validation loss of a model that
-- ignores context, from the training tokens' frequencies) and, at the end,
-- how far below it the validation loss went.
--
--   ./lutra recipes/gpt2.lua                      # the CPU defaults (about 9 minutes on 2 cores)
--   ./lutra recipes/gpt2.lua --device=cuda --dtype=bf16 --n_layer=12 --n_embd=768 --n_head=12 --seq=1024 \
--       --batch=8 --pad_vocab=128                 # GPT-2 124M (a padded vocabulary suits GPU products)
--
-- The CPU defaults are small (4 layers, 128 wide, context 128, 4 sequences
-- a step) because the vocabulary's output layer dominates the cost: many
-- small steps learn more in ten minutes than few large ones. The rate decays
-- linearly to 0 after warmup (--schedule=linear, --min_lr=0; Bergsma et al.
-- 2025, "Straight to Zero"): measured on this job, 5.17 at step 1500 against
-- 5.28 for cosine decay to a tenth (5.12 with today's kernels; the unigram
-- baseline is 6.27).
-- Samples continue "This module provides" (a Python-docs sentence start;
-- "The " ended in a bare space token, which the model continued with more
-- whitespace) at temperature 1 without top-k or top-p: nearly a quarter of
-- the documentation's tokens are spaces and newlines (reST indentation,
-- tables), the likeliest tokens of a small model, so sharpening the
-- distribution draws mostly whitespace. Measured on a 600-step model,
-- letters per character drawn (64 tokens, 12 seeds): 0.69 at temperature
-- 1, 0.60 with top_p 0.95, 0.40 at temperature 0.8, and 0.03 for the old
-- "The " at 0.8 (6 seeds); the validation text itself has 0.66.
--   ./lutra recipes/gpt2.lua --ckpt_every=250 --resume=auto   # checkpoints in runs/<name>/ckpt, resumed
--   mpirun -np 4 ./lutra recipes/gpt2.lua --zero=3             # data parallel, ZeRO stage 1, 2 or 3
--   mpirun -np 4 ./lutra recipes/gpt2.lua --tp=2 --sp          # tensor parallel in pairs (sequence parallel), x2 data parallel
--   mpirun -np 8 ./lutra recipes/gpt2.lua --tp=2 --pp=2 --zero=1 --micro_batches=4   # 3D: dp 2 x tp 2 x pp 2
--   mpirun -np 4 ./lutra recipes/gpt2.lua --pp=4 --micro_batches=8 --schedule_pp=interleaved --virtual_stages=2
--   ./lutra recipes/gpt2.lua --model=llama --n_kv_head=2       # a Llama (RMSNorm, RoPE, SwiGLU, grouped-query attention)
--   ./lutra recipes/gpt2.lua --threads=1                      # one CPU thread (default: every core)
--   ./lutra recipes/gpt2.lua --help
local lt = require "lutra"

local cfg = lt.config {
  data = "data/pydocs", vocab = "data/gpt2.tiktoken", device = "cpu", dtype = "f32", name = "gpt2-pydocs",
  n_layer = 4, n_head = 4, n_embd = 128, seq = 128, batch = 4, accum = 1, pad_vocab = 0,
  steps = 1500, lr = 6e-3, min_lr = 0, warmup = 30, weight_decay = 0.1, beta2 = 0.95, clip = 1.0,
  eval_every = 250, eval_batches = 0, sample_every = 500, sample_tokens = 64, temperature = 1,
  top_k = 0, top_p = 1, prompt = "This module provides", seed = 1337, log_every = 25, ckpt_every = 0, keep_last = 2, resume = "none",
  schedule = "linear", zero = 0, tp = 1, sp = false, log_all_ranks = false,
  pp = 1, micro_batches = 0, schedule_pp = "1f1b", virtual_stages = 1, pp_stages = "", print_schedule = false,
  model = "gpt2", n_kv_head = 0, ffn = 0, recompute = "none",
  threads = 0,
  _help = {
    data = "token shards: a directory with train_*.bin and val_*.bin (make data)",
    vocab = "GPT-2's BPE vocabulary (tiktoken format), for the samples",
    device = "cpu or cuda[:N]", dtype = "f32, bf16 or f16 (16-bit keeps f32 master weights)",
    name = "run name: metrics in runs/<name>/metrics.jsonl, checkpoints in runs/<name>/ckpt",
    n_layer = "transformer blocks", n_head = "attention heads", n_embd = "channels",
    seq = "tokens per sequence (the context)", batch = "sequences per micro-batch (per data-parallel rank under mpirun)",
    accum = "micro-batches per optimizer step (gradient accumulation; under --pp the pipeline's micro-batches, also --micro_batches)",
    pad_vocab = "pad the embedding rows to a multiple of this (128 suits GPU products; 0: none)",
    steps = "optimizer steps", lr = "peak learning rate (AdamW)", min_lr = "learning rate at the last step",
    warmup = "steps of linear warmup (at most a tenth of steps)", weight_decay = "AdamW's decoupled weight decay (matrices only)",
    beta2 = "AdamW's second-moment decay", clip = "global gradient-norm clip (0: none)",
    eval_every = "steps between validation losses", eval_batches = "validation batches per evaluation (0: all)",
    sample_every = "steps between samples", sample_tokens = "tokens per sample",
    temperature = "sampling temperature (0: greedy)", top_k = "sample from the k likeliest tokens (0: all)",
    top_p = "sample from the likeliest tokens up to this probability (nucleus; 1: all)", prompt = "the samples' prompt (ending in a word: a trailing space is a token of its own)", seed = "initialisation and data order",
    log_every = "steps between log lines", ckpt_every = "steps between checkpoints (0: none)",
    keep_last = "checkpoints kept (0: all)", resume = "none, auto (the newest checkpoint) or a checkpoint directory",
    schedule = "after warmup: linear or cosine decay to min_lr, or wsd (warmup-stable-decay)", zero = "ZeRO stage 0-3 under mpirun",
    log_all_ranks = "every rank prints (under mpirun)",
    tp = "tensor-parallel ranks (under mpirun; adjacent ranks, within a node): each holds 1/tp of every block",
    sp = "sequence parallelism with --tp: norms and dropout on 1/tp of the tokens",
    pp = "pipeline stages (under mpirun): each rank holds the blocks of its stage; the ranks are dp x tp x pp",
    micro_batches = "micro-batches per optimizer step: the pipeline's m under --pp (the bubble is (pp-1)/(m+pp-1)); "
      .. "the same setting as --accum, named for the pipeline: give one of the two (0: --accum)",
    schedule_pp = "with --pp: gpipe (m micro-batches of activations a stage), 1f1b (at most pp) or interleaved (with --virtual_stages)",
    virtual_stages = "with --schedule_pp=interleaved: model chunks per rank (the bubble time is 1/V of 1F1B's: (pp-1)/(V m+pp-1) of a step; --micro_batches a multiple of --pp)",
    print_schedule = "with --pp: print each rank's forwards and backwards in order (lt.dist.pp.timeline) and the schedule's bubble before training",
    pp_stages = "with --pp: blocks per virtual stage, comma-separated (pp x virtual_stages entries summing to --n_layer; empty: even)",
    recompute = "activations recomputed in backward instead of kept: none, full (every block), every:k or selective (the attention core)",
    model = "gpt2, or llama (RMSNorm, rotary positions, SwiGLU MLP, grouped-query attention, untied head)",
    n_kv_head = "llama: key/value heads (0: n_head / 2, or n_head when odd)", ffn = "llama: the MLP's hidden units (0: Llama's 8/3 n_embd rounded up to 64)",
    threads = "CPU threads for kernels and BLAS, per rank (0: the cores it may use, or OMP_NUM_THREADS)",
  },
}

-- every setting checked before anything runs: a bad one is a settings error
-- naming it (lutra prints the message alone, without a traceback)
local whole = function(lo, why) return { int = true, min = lo, why = why } end
lt.config.check(cfg, {
  data = { nonempty = true }, vocab = { nonempty = true }, name = { nonempty = true },
  dtype = { one_of = { "f32", "bf16", "f16" } }, schedule = { one_of = { "linear", "cosine", "wsd" } },
  zero = { one_of = { 0, 1, 2, 3 }, why = "a ZeRO stage" }, model = { one_of = { "gpt2", "llama" } },
  tp = whole(1), pp = whole(1), micro_batches = whole(0, "0: --accum"), virtual_stages = whole(1),
  schedule_pp = { one_of = { "gpipe", "1f1b", "interleaved" } }, n_kv_head = whole(0, "0: n_head / 2"), ffn = whole(0, "0: 8/3 n_embd"), device = { device = true }, resume = { nonempty = true },
  n_layer = whole(1), n_head = whole(1), n_embd = whole(1), seq = whole(1), batch = whole(1), accum = whole(1),
  pad_vocab = whole(0, "0: none"), steps = whole(1), warmup = whole(0), eval_every = whole(0, "0: never"),
  eval_batches = whole(0, "0: all"), sample_every = whole(0, "0: never"), sample_tokens = whole(1),
  log_every = whole(1), ckpt_every = whole(0, "0: none"), keep_last = whole(0, "0: all"),
  seed = { int = true, min = 0, max = 2 ^ 53 },
  lr = { gt = 0 }, min_lr = { min = 0 }, weight_decay = { min = 0 }, beta2 = { min = 0, lt = 1 },
  clip = { min = 0, why = "0: none" }, temperature = { min = 0, why = "0: greedy" },
  top_k = whole(0, "0: all"), top_p = { gt = 0, max = 1, why = "1: all" },
  threads = { int = true, min = 0, max = 1024, why = "0: every core" },
})
local fail = lt.config.fail
lt.config.refuse_args(cfg) -- ("steps=3", without --)
if cfg.min_lr > cfg.lr then fail(("--min_lr=%g is above --lr=%g (the rate decays from lr to min_lr)"):format(cfg.min_lr, cfg.lr)) end
if cfg.n_embd % cfg.n_head ~= 0 then
  fail(("--n_embd=%d is not a multiple of --n_head=%d (each head takes n_embd / n_head channels)"):format(cfg.n_embd,
    cfg.n_head))
end
if cfg.name:find("%.%.") or cfg.name:sub(1, 1) == "/" or cfg.name:match("^%s") or cfg.name:match("%s$") then
  fail(("--name=%q is not a run name (runs/<name>/: no leading /, no .., no surrounding spaces)"):format(cfg.name))
end

if cfg.threads ~= 0 then lt.set_num_threads(cfg.threads) end

if tostring(cfg.device):match("^cuda") then -- say so before loading anything
  local n, why = lt.cuda.device_count()
  if n == 0 then
    io.stderr:write(("gpt2.lua: --device=%s, but this machine has no CUDA device (%s)\n"):format(cfg.device, why))
    os.exit(1)
  end
end

do
  local f, why = io.open(cfg.vocab, "rb")
  if not f then fail(("--vocab=%s cannot be read (%s)"):format(cfg.vocab, why)) end
  f:close()
  for _, part in ipairs { "train", "val" } do
    if not pcall(lt.data.files, cfg.data .. "/" .. part) then
      fail(("--data=%s holds no %s_*.bin shards (make data builds data/pydocs; recipes/prepare.lua makes them)")
        :format(cfg.data, part))
    end
  end
  if cfg.resume ~= "none" and cfg.resume ~= "auto" then
    local ok, bad = lt.ckpt.is_complete(cfg.resume)
    if not ok then fail(("--resume=%s is not a complete checkpoint (%s); none, auto, or a step_* directory"):format(cfg.resume, bad)) end
  end
end

-- under mpirun: data parallel, each rank reading its own part of the data
-- (--batch is per rank; the global batch is batch x ranks); rank 0 prints.
-- With --tp the ranks form a mesh, tp adjacent ranks splitting every block
-- and reading the same batches; the data-parallel ranks are world / tp.
local rank, world = lt.dist.init()
local function say(...) if rank == 0 then print(...) end end
if world % cfg.tp ~= 0 then
  fail(world == 1 and ("--tp=%d splits the model across %d ranks: run under mpirun -np <a multiple of %d>")
    :format(cfg.tp, cfg.tp, cfg.tp)
    or ("--tp=%d does not divide the job's %d ranks (mpirun -np): use a tp that divides it"):format(cfg.tp, world))
end
-- pipeline parallelism: the flags that go together, checked before anything runs
if cfg.micro_batches > 0 and cfg.accum > 1 and cfg.micro_batches ~= cfg.accum then
  fail(("--micro_batches=%d and --accum=%d are the same setting (micro-batches per optimizer step): give one")
    :format(cfg.micro_batches, cfg.accum))
end
local micro = cfg.micro_batches > 0 and cfg.micro_batches or cfg.accum
local pp_stages
if cfg.pp_stages ~= "" then
  pp_stages = {}
  for part in (cfg.pp_stages .. ","):gmatch("([^,]*),") do
    local n = tonumber(part)
    if not n or n < 1 or n ~= math.floor(n) then
      fail(("--pp_stages=%s: %q is not a whole number of blocks >= 1 (a comma-separated list, one entry a virtual stage)")
        :format(cfg.pp_stages, part))
    end
    pp_stages[#pp_stages + 1] = n
  end
end
if cfg.pp == 1 then
  for _, k in ipairs { "virtual_stages", "schedule_pp", "pp_stages", "print_schedule" } do
    local default = ({ virtual_stages = 1, schedule_pp = "1f1b", pp_stages = "", print_schedule = false })[k]
    if cfg[k] ~= default then fail(("--%s=%s is a pipeline setting: it needs --pp > 1"):format(k, tostring(cfg[k]))) end
  end
else
  if world == 1 then
    fail(("--pp=%d splits the model into %d stages across ranks: run under mpirun -np <a multiple of %d>")
      :format(cfg.pp, cfg.pp, cfg.pp * cfg.tp))
  end
  if world % (cfg.tp * cfg.pp) ~= 0 then
    fail(("--tp=%d x --pp=%d = %d ranks does not divide the job's %d ranks (mpirun -np): the data-parallel ranks are "
      .. "what they leave"):format(cfg.tp, cfg.pp, cfg.tp * cfg.pp, world))
  end
  if cfg.virtual_stages > 1 and cfg.schedule_pp ~= "interleaved" then
    fail(("--virtual_stages=%d needs --schedule_pp=interleaved (gpipe and 1f1b run one stage a rank), got %s")
      :format(cfg.virtual_stages, cfg.schedule_pp))
  end
  local S = cfg.pp * cfg.virtual_stages
  if pp_stages and #pp_stages ~= S then
    fail(("--pp_stages=%s lists %d stages: --pp=%d x --virtual_stages=%d needs %d"):format(cfg.pp_stages, #pp_stages,
      cfg.pp, cfg.virtual_stages, S))
  end
  local sum = 0
  for _, n in ipairs(pp_stages or {}) do sum = sum + n end
  if pp_stages and sum ~= cfg.n_layer then
    fail(("--pp_stages=%s sums to %d blocks, --n_layer=%d"):format(cfg.pp_stages, sum, cfg.n_layer))
  end
  if not pp_stages and S > cfg.n_layer then
    fail(("--pp=%d x --virtual_stages=%d = %d stages for --n_layer=%d blocks: each stage needs a block"):format(cfg.pp,
      cfg.virtual_stages, S, cfg.n_layer))
  end
  if cfg.zero == 3 then
    fail("--zero=3 with --pp is not supported: each micro-batch of the schedule would gather the stage's parameters "
      .. "again (DeepSpeed's pipeline engine refuses it too); use --zero=1 or 2")
  end
  -- the schedule itself (micro-batches it cannot run: interleaved needs a multiple of --pp)
  local ok, why = pcall(require("lutra.dist.pp.executor").make_schedule, cfg.schedule_pp, cfg.pp, micro,
    cfg.virtual_stages)
  if not ok then
    fail(("--schedule_pp=%s with --pp=%d, --micro_batches=%d%s: %s"):format(cfg.schedule_pp, cfg.pp, micro,
      cfg.virtual_stages > 1 and (", --virtual_stages=%d"):format(cfg.virtual_stages) or "",
      (tostring(why):gsub("^.-pipeline schedule: ", ""):gsub("^.-pipeline: ", ""))))
  end
end
if cfg.sp and cfg.tp == 1 then fail("--sp (sequence parallelism) splits the tokens across --tp ranks: it needs --tp > 1") end
if cfg.sp and (cfg.batch * cfg.seq) % cfg.tp ~= 0 then -- (the model would run every step without it)
  fail(("--sp splits each batch's --batch x --seq = %d tokens across --tp=%d ranks: they do not divide (change --batch or --seq)")
    :format(cfg.batch * cfg.seq, cfg.tp))
end
local mesh = world > 1 and lt.dist.mesh { tp = cfg.tp, pp = cfg.pp } or nil
local dp_rank, dp_world = mesh and mesh.coords.dp or 0, mesh and mesh.sizes.dp or 1

lt.manual_seed(cfg.seed)
local tok = lt.tokenizer.load(cfg.vocab)
-- a loader the shards cannot give (windows longer than a shard, a malformed
-- shard) is a settings error naming --seq or --data
local function shards(part, o)
  o.path, o.batch, o.seq = cfg.data .. "/" .. part, cfg.batch, cfg.seq
  local ok, loader = pcall(lt.data.shards, o)
  if ok then return loader end
  local why = tostring(loader):gsub("^.-loader: ", "")
  if why:find("window", 1, true) then
    fail(("--seq=%d does not fit the %s shards in --data=%s: %s"):format(cfg.seq, part, cfg.data, why))
  end
  fail(("--data=%s: %s"):format(cfg.data, why))
end
local train = shards("train", { seed = cfg.seed, rank = dp_rank, world = dp_world })
-- (a tensor-parallel group and a pipeline's stages read the same batches: the loaders split by data-parallel rank)
local val = shards("val", { shuffle = false, rank = dp_rank, world = dp_world })
-- eval_batches = 0: the whole validation set, the same tokens the baseline is computed on
local eval_batches = cfg.eval_batches > 0 and cfg.eval_batches or val:batches_per_epoch()
if eval_batches == 0 then -- (the validation set holds less than one batch)
  if cfg.eval_every > 0 then
    fail(("--batch=%d is more sequences than the validation shards in %s/val hold (%d windows of --seq=%d + 1 tokens): lower --batch or --seq, or --eval_every=0")
      :format(cfg.batch, cfg.data, val:num_windows(), cfg.seq))
  end
  eval_batches = 1 -- (no evaluation runs)
end

local baseline, ntrain, nval = lt.data.unigram_entropy(cfg.data .. "/train", cfg.data .. "/val", tok.n_vocab)
say(("data: %d training and %d validation tokens; unigram baseline %.3f nats/token"):format(ntrain, nval, baseline))

-- (a shape that does not split across --tp ranks is a settings error naming it)
local tp_group = cfg.tp > 1 and mesh.tp or nil
local pp_group = cfg.pp > 1 and mesh.pp or nil
local pad = cfg.pad_vocab > 0 and cfg.pad_vocab or nil
local ok, model = pcall(function()
  if cfg.model == "llama" then
    local kv = cfg.n_kv_head > 0 and cfg.n_kv_head or (cfg.n_head % 2 == 0 and cfg.n_head / 2 or cfg.n_head)
    local ffn = cfg.ffn > 0 and cfg.ffn or math.ceil(8 * cfg.n_embd / 3 / 64) * 64
    return lt.models.llama { dim = cfg.n_embd, n_layers = cfg.n_layer, n_heads = cfg.n_head, n_kv_heads = kv,
      ffn_dim = ffn, vocab_size = tok.n_vocab, max_seq_len = cfg.seq, pad_vocab = pad,
      generator = lt.Generator(cfg.seed), tp = tp_group, sequence_parallel = cfg.sp,
      pp = pp_group, pp_stages = pp_stages, virtual_stages = pp_group and cfg.virtual_stages or nil,
    recompute = cfg.recompute }
  end
  return lt.models.gpt2 { n_layer = cfg.n_layer, n_head = cfg.n_head, n_embd = cfg.n_embd,
    block_size = cfg.seq, vocab_size = tok.n_vocab, pad_vocab = pad,
    generator = lt.Generator(cfg.seed), tp = tp_group, sequence_parallel = cfg.sp,
    pp = pp_group, pp_stages = pp_stages, virtual_stages = pp_group and cfg.virtual_stages or nil,
    recompute = cfg.recompute }
end)
if not ok then
  local why = tostring(model):gsub("^.-: (%w+: )", "%1") -- (from "recipes/gpt2.lua:175: gpt2: n_head ...")
  local with = {}
  if cfg.tp > 1 then with[#with + 1] = ("--tp=%d"):format(cfg.tp) end
  if cfg.pp > 1 then with[#with + 1] = ("--pp=%d"):format(cfg.pp) end
  fail(#with > 0 and ("%s: %s"):format(table.concat(with, " "), why) or why)
end
-- under mpirun each rank takes its own GPU (cuda:<local rank>)
local device = (cfg.device == "cuda" and world > 1) and lt.dist.device() or cfg.device
model:to(device, cfg.dtype)
local layout = {}
if cfg.tp > 1 then layout[#layout + 1] = ("tensor parallel over %d ranks%s"):format(cfg.tp, cfg.sp and " (sequence parallel)" or "") end
if cfg.pp > 1 then
  -- (the blocks each stage holds, as the checkpoints' layout names them: "blocks 1+3 per stage")
  layout[#layout + 1] = ("pipeline parallel over %d stages (%s, %d micro-batch%s%s), blocks %s per %sstage"):format(
    cfg.pp, cfg.schedule_pp, micro, micro == 1 and "" or "es",
    cfg.virtual_stages > 1 and (", %d virtual stages a rank"):format(cfg.virtual_stages) or "",
    table.concat(model.pp.counts, "+"), cfg.virtual_stages > 1 and "virtual " or "")
end
if dp_world > 1 then layout[#layout + 1] = ("data parallel over %d ranks"):format(dp_world) end
if cfg.recompute ~= "none" then layout[#layout + 1] = ("activations recomputed (%s)"):format(cfg.recompute) end
if cfg.zero > 0 then
  layout[#layout + 1] = dp_world > 1 and ("ZeRO stage %d"):format(cfg.zero)
    or ("ZeRO stage %d on one data-parallel rank (nothing to shard)"):format(cfg.zero)
end
if cfg.print_schedule and cfg.pp > 1 then
  local pp = lt.dist.pp
  local s = cfg.schedule_pp == "gpipe" and pp.gpipe(cfg.pp, micro)
    or cfg.schedule_pp == "1f1b" and pp.one_f_one_b(cfg.pp, micro) or pp.interleaved(cfg.pp, micro, cfg.virtual_stages)
  local sim = pp.simulate(s)
  say(pp.timeline(s))
  say(("schedule: bubble %.3f of a step (simulated with a backward twice a forward; (p-1)/(v m+p-1) = %.3f), "
    .. "at most %s micro-batch chunks in flight on stages 0..%d"):format(sim.bubble,
    pp.bubble_fraction(cfg.pp, micro, cfg.virtual_stages), table.concat(sim.in_flight, "/"), cfg.pp - 1))
end
if cfg.pp > 1 and cfg.schedule_pp == "interleaved" and cfg.virtual_stages == 1 then
  say("note: --schedule_pp=interleaved with --virtual_stages=1 (one chunk a rank) runs 1F1B's order; "
    .. "--virtual_stages=V > 1 interleaves V chunks a rank")
end
if cfg.pp > 1 and micro < cfg.pp then
  -- (fewer micro-batches than stages: the pipeline never fills, the stages mostly take turns)
  say(("note: --pp=%d with %d micro-batch%s a step: each stage idles %.2f of a step ((p-1)/(m+p-1)); "
    .. "--micro_batches=M (a few times --pp) fills the pipeline"):format(cfg.pp, micro, micro == 1 and "" or "es",
    lt.dist.pp.bubble_fraction(cfg.pp, micro, cfg.virtual_stages)))
end
local n_params = lt.train.log.num_parameters(model) -- (the whole model's; every rank calls it: a pipeline's stages sum theirs)
say(("model: %s with %d layers, %d heads, %d wide, context %d: %.1fM parameters on %s in %s%s"):format(
  cfg.model == "llama" and "Llama" or "GPT-2", cfg.n_layer, cfg.n_head, cfg.n_embd, cfg.seq,
  n_params / 1e6, cfg.device, cfg.dtype, #layout > 0 and ", " .. table.concat(layout, ", ") or ""))
local ddp = world > 1 and lt.dist.DataParallel(model, { gradients = cfg.zero >= 2 and "none" or "all_reduce",
  group = mesh.dp }) or nil

local opt_settings = { lr = cfg.lr, betas = { 0.9, cfg.beta2 }, weight_decay = cfg.weight_decay }
local opt
if cfg.zero > 0 then -- ZeRO: each rank keeps 1/ranks of the optimizer state (stage 3: of the parameters too)
  opt_settings.stage = cfg.zero
  opt_settings.group = mesh and mesh.dp or nil
  opt = lt.dist.Zero(model, opt_settings)
else
  opt = lt.optim.AdamW(model, opt_settings)
end
local schedules = lt.optim.schedules
-- (a short run warms up for at most its first tenth, so it still decays)
local warmup = math.min(cfg.warmup, math.floor(cfg.steps / 10))
local schedule = schedules[cfg.schedule] { lr = cfg.lr, warmup = warmup, steps = cfg.steps,
  final = cfg.min_lr }

-- a pipeline stage holds part of the model: no samples during training (lt.train refuses them)
local sample_every = cfg.sample_every
if cfg.pp > 1 and sample_every > 0 then
  say(("note: --pp=%d: no samples during training (a stage holds part of the model); sample a checkpoint's weights "
    .. "with recipes/sample.lua"):format(cfg.pp))
  sample_every = 0
end
local summary = lt.train {
  model = model, optimizer = opt, train = train, steps = cfg.steps, accum = micro, schedule = schedule,
  clip = cfg.clip, val = val, eval_every = cfg.eval_every, eval_batches = eval_batches,
  sample_every = sample_every, pp_schedule = cfg.pp > 1 and cfg.schedule_pp or nil, name = cfg.name, log_every = cfg.log_every,
  ckpt_every = cfg.ckpt_every, keep_last = cfg.keep_last, resume = cfg.resume, config = cfg, ddp = ddp,
  log_all_ranks = cfg.log_all_ranks,
  sample = { tokenizer = tok, prompt = cfg.prompt, tokens = cfg.sample_tokens, temperature = cfg.temperature,
    top_k = cfg.top_k, top_p = cfg.top_p,
    generator = lt.Generator(cfg.seed) },
}

local mem = lt.dist.memory_bytes(model, opt, ddp)
local mib = lt.train.format_bytes
local function bytes(key) return mib(mem[key]) end
local per = "per rank"
if cfg.pp > 1 and not summary.interrupted then
  -- the stages hold different parts (the first the embedding, the last the head): each stage's numbers, in
  -- stage order, from this rank's pipeline group (every rank calls it; rank 0 prints its group's)
  local keys = { "params", "grads", "optimizer", "buffers" }
  local mine = lt.tensor({ mem.params, mem.grads, mem.optimizer, mem.buffers }, { dtype = "f64" }):view(1, 4)
  local stages = lt.dist.all_gather(mine, { group = mesh.pp }):totable()
  bytes = function(key)
    local j, parts = 0, {}
    for i, k in ipairs(keys) do if k == key then j = i end end
    for s = 1, #stages do parts[s] = mib(stages[s][j]) end
    return table.concat(parts, " / ")
  end
  for s = 1, #stages do mem.buffers = math.max(mem.buffers, stages[s][4]) end -- (any stage's buckets: the column)
  per = ("per rank, stages 0..%d"):format(cfg.pp - 1)
end
say(("memory %s: parameters %s, gradients %s, optimizer state %s%s"):format(per, bytes("params"), bytes("grads"),
  bytes("optimizer"), mem.buffers > 0 and (", all-reduce buckets %s"):format(bytes("buffers")) or ""))
local vl = summary.val_loss
-- (an interrupted run's last evaluation may be an earlier step's, even step 0's: say which)
local at = vl and summary.val_step and (summary.interrupted or summary.preempted)
  and (" (at step %d)"):format(summary.val_step) or ""
local how = vl and ("validation loss %.3f%s, unigram baseline %.3f: %.2f nats %s"):format(vl, at, baseline,
  math.abs(baseline - vl), vl <= baseline and "below" or "above") or "no evaluation ran"
-- (a run resumed at its last step has nothing to do: no rate to print)
local rate = summary.steps > 0 and summary.seconds > 0 and (" (%.0f tokens/s)"):format(summary.tokens / summary.seconds) or ""
say(("done: %d steps in %.0f s%s; %s%s"):format(summary.steps, summary.seconds, rate, how,
  summary.interrupted and " (interrupted)" or summary.preempted and (" (" .. summary.preempted .. ": saved " ..
    summary.checkpoint .. ")") or ""))
