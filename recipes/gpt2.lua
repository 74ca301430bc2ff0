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
--   ./lutra recipes/gpt2.lua --ckpt_every=250 --resume=auto   # checkpoints in runs/<name>/ckpt, resumed
--   mpirun -np 4 ./lutra recipes/gpt2.lua --zero=3             # data parallel, ZeRO stage 1, 2 or 3
--   ./lutra recipes/gpt2.lua --threads=1                      # one CPU thread (default: every core)
--   ./lutra recipes/gpt2.lua --help
local lt = require "lutra"

local cfg = lt.config {
  data = "data/pydocs", vocab = "data/gpt2.tiktoken", device = "cpu", dtype = "f32", name = "gpt2-pydocs",
  n_layer = 4, n_head = 4, n_embd = 128, seq = 128, batch = 4, accum = 1, pad_vocab = 0,
  steps = 1500, lr = 6e-3, min_lr = 0, warmup = 30, weight_decay = 0.1, beta2 = 0.95, clip = 1.0,
  eval_every = 250, eval_batches = 0, sample_every = 500, sample_tokens = 64, temperature = 0.8,
  prompt = "The ", seed = 1337, log_every = 25, ckpt_every = 0, keep_last = 2, resume = "none",
  schedule = "linear", zero = 0, log_all_ranks = false,
  threads = 0,
  _help = {
    data = "token shards: a directory with train_*.bin and val_*.bin (make data)",
    vocab = "GPT-2's BPE vocabulary (tiktoken format), for the samples",
    device = "cpu or cuda[:N]", dtype = "f32, bf16 or f16 (16-bit keeps f32 master weights)",
    name = "run name: metrics in runs/<name>/metrics.jsonl, checkpoints in runs/<name>/ckpt",
    n_layer = "transformer blocks", n_head = "attention heads", n_embd = "channels",
    seq = "tokens per sequence (the context)", batch = "sequences per micro-batch",
    accum = "micro-batches per optimizer step (gradient accumulation)",
    pad_vocab = "pad the embedding rows to a multiple of this (128 suits GPU products; 0: none)",
    steps = "optimizer steps", lr = "peak learning rate (AdamW)", min_lr = "learning rate at the last step",
    warmup = "steps of linear warmup (at most a tenth of steps)", weight_decay = "AdamW's decoupled weight decay (matrices only)",
    beta2 = "AdamW's second-moment decay", clip = "global gradient-norm clip (0: none)",
    eval_every = "steps between validation losses", eval_batches = "validation batches per evaluation (0: all)",
    sample_every = "steps between samples", sample_tokens = "tokens per sample",
    temperature = "sampling temperature", prompt = "the samples' prompt", seed = "initialisation and data order",
    log_every = "steps between log lines", ckpt_every = "steps between checkpoints (0: none)",
    keep_last = "checkpoints kept (0: all)", resume = "none, auto (the newest checkpoint) or a checkpoint directory",
    schedule = "after warmup: linear or cosine decay to min_lr, or wsd (warmup-stable-decay)", zero = "ZeRO stage 0-3 under mpirun",
    log_all_ranks = "every rank prints (under mpirun)",
    threads = "CPU threads for kernels and BLAS, per rank (0: the cores it may use, or OMP_NUM_THREADS)",
  },
}

-- checked before anything runs
if cfg.lr <= 0 then error(("--lr must be > 0, got %g"):format(cfg.lr), 0) end
if cfg.accum < 1 or cfg.accum ~= math.floor(cfg.accum) then error("--accum must be a whole number >= 1", 0) end
if cfg.batch < 1 or cfg.seq < 1 then error("--batch and --seq must be >= 1", 0) end
if cfg.zero ~= 0 and cfg.zero ~= 1 and cfg.zero ~= 2 and cfg.zero ~= 3 then
  error(("--zero must be a ZeRO stage 0-3, got %s"):format(tostring(cfg.zero)), 0)
end

if cfg.threads ~= 0 then
  if cfg.threads ~= math.floor(cfg.threads) or cfg.threads < 1 or cfg.threads > 1024 then
    error(("--threads must be a whole number of threads 1..1024 (0: every core), got %s"):format(tostring(cfg.threads)), 0)
  end
  lt.set_num_threads(cfg.threads)
end

if tostring(cfg.device):match("^cuda") then -- say so before loading anything
  local n, why = lt.cuda.device_count()
  if n == 0 then
    io.stderr:write(("gpt2.lua: --device=%s, but this machine has no CUDA device (%s)\n"):format(cfg.device, why))
    os.exit(1)
  end
end

-- under mpirun: data parallel, each rank reading its own part of the data
-- (--batch is per rank; the global batch is batch x ranks); rank 0 prints
local rank, world = lt.dist.init()
local function say(...) if rank == 0 then print(...) end end

lt.manual_seed(cfg.seed)
local tok = lt.tokenizer.load(cfg.vocab)
local train = lt.data.shards { path = cfg.data .. "/train", batch = cfg.batch, seq = cfg.seq, seed = cfg.seed,
  rank = rank, world = world }
local val = lt.data.shards { path = cfg.data .. "/val", batch = cfg.batch, seq = cfg.seq, shuffle = false }
-- eval_batches = 0: the whole validation set, the same tokens the baseline is computed on
local eval_batches = cfg.eval_batches > 0 and cfg.eval_batches or val:batches_per_epoch()

local baseline, ntrain, nval = lt.data.unigram_entropy(cfg.data .. "/train", cfg.data .. "/val", tok.n_vocab)
say(("data: %d training and %d validation tokens; unigram baseline %.3f nats/token"):format(ntrain, nval, baseline))

local model = lt.models.gpt2 { n_layer = cfg.n_layer, n_head = cfg.n_head, n_embd = cfg.n_embd,
  block_size = cfg.seq, vocab_size = tok.n_vocab, pad_vocab = cfg.pad_vocab > 0 and cfg.pad_vocab or nil,
  generator = lt.Generator(cfg.seed) }
-- under mpirun each rank takes its own GPU (cuda:<local rank>)
local device = (cfg.device == "cuda" and world > 1) and lt.dist.device() or cfg.device
model:to(device, cfg.dtype)
say(("model: GPT-2 with %d layers, %d heads, %d wide, context %d: %.1fM parameters on %s in %s%s"):format(
  cfg.n_layer, cfg.n_head, cfg.n_embd, cfg.seq, model:num_parameters() / 1e6, cfg.device, cfg.dtype,
  world > 1 and (", data parallel over %d ranks%s"):format(world, cfg.zero > 0 and (", ZeRO stage " .. cfg.zero) or "")
    or (cfg.zero > 0 and (", ZeRO stage %d on one process (nothing to shard)"):format(cfg.zero) or "")))
local ddp = world > 1 and lt.dist.DataParallel(model, { gradients = cfg.zero >= 2 and "none" or "all_reduce" }) or nil

local opt_settings = { lr = cfg.lr, betas = { 0.9, cfg.beta2 }, weight_decay = cfg.weight_decay }
local opt
if cfg.zero > 0 then -- ZeRO: each rank keeps 1/ranks of the optimizer state (stage 3: of the parameters too)
  opt_settings.stage = cfg.zero
  opt = lt.dist.Zero(model, opt_settings)
else
  opt = lt.optim.AdamW(model, opt_settings)
end
local schedules = lt.optim.schedules
if not (cfg.schedule == "cosine" or cfg.schedule == "linear" or cfg.schedule == "wsd") then
  error(("--schedule must be cosine, linear or wsd, got %s"):format(cfg.schedule), 0)
end
-- (a short run warms up for at most its first tenth, so it still decays)
local warmup = math.min(cfg.warmup, math.floor(cfg.steps / 10))
local schedule = schedules[cfg.schedule] { lr = cfg.lr, warmup = warmup, steps = cfg.steps,
  final = cfg.min_lr }

local summary = lt.train {
  model = model, optimizer = opt, train = train, steps = cfg.steps, accum = cfg.accum, schedule = schedule,
  clip = cfg.clip, val = val, eval_every = cfg.eval_every, eval_batches = eval_batches,
  sample_every = cfg.sample_every, name = cfg.name, log_every = cfg.log_every,
  ckpt_every = cfg.ckpt_every, keep_last = cfg.keep_last, resume = cfg.resume, config = cfg, ddp = ddp,
  log_all_ranks = cfg.log_all_ranks,
  sample = { tokenizer = tok, prompt = cfg.prompt, tokens = cfg.sample_tokens, temperature = cfg.temperature,
    generator = lt.Generator(cfg.seed) },
}

local mem = lt.dist.memory_bytes(model, opt, ddp)
say(("memory per rank (bytes): parameters %d, gradients %d, optimizer state %d%s"):format(mem.params, mem.grads,
  mem.optimizer, mem.buffers > 0 and (", all-reduce buckets %d"):format(mem.buffers) or ""))
local vl = summary.val_loss
local how = vl and ("validation loss %.3f, unigram baseline %.3f: %.2f nats %s"):format(vl, baseline,
  math.abs(baseline - vl), vl <= baseline and "below" or "above") or "no evaluation ran"
say(("done: %d steps in %.0f s (%.0f tokens/s); %s%s"):format(summary.steps, summary.seconds,
  summary.tokens / summary.seconds, how,
  summary.interrupted and " (interrupted)" or summary.preempted and (" (" .. summary.preempted .. ": saved " ..
    summary.checkpoint .. ")") or ""))
