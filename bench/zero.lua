--- bench/zero.lua: data parallelism and ZeRO stages 1-3 side by side under
-- mpirun: tokens/s of the job and the bytes each rank holds after a step
-- (parameters, gradients, optimizer state, as lt.dist.memory_bytes counts
-- them; DataParallel's bucket buffers apart), plus the most whole
-- parameters stage 3 held at once. The main job's GPT-2 config, AdamW with
-- clipping through lt.train, random tokens, the same per-rank batch.
--
--   mpirun -np 4 --oversubscribe ./lutra bench/zero.lua [--steps=10] [--n_layer=4] [--n_embd=128] [--batch=2]
local lt = require "lutra"

local cfg = lt.config { steps = 10, n_layer = 4, n_head = 4, n_embd = 128, seq = 128, batch = 2, vocab = 50257 }
local rank, world = lt.dist.init()

local function mib(b) return ("%8.2f"):format(b / 2 ^ 20) end

local function run(stage)
  local model = lt.models.gpt2 { n_layer = cfg.n_layer, n_head = cfg.n_head, n_embd = cfg.n_embd,
    block_size = cfg.seq, vocab_size = cfg.vocab, generator = lt.Generator(0) }
  local ddp = lt.dist.DataParallel(model, { gradients = stage >= 2 and "none" or "all_reduce" })
  local settings = { lr = 1e-3, betas = { 0.9, 0.95 }, weight_decay = 0.1 }
  local opt
  if stage == 0 then opt = lt.optim.AdamW(model, settings) else
    settings.stage = stage
    opt = lt.dist.Zero(model, settings)
  end
  local g = lt.Generator(1 + rank)
  local data = { next = function()
    local x = lt.randint(0, cfg.vocab, { cfg.batch, cfg.seq + 1 }, { generator = g })
    return x:narrow(2, 1, cfg.seq):contiguous(), x:narrow(2, 2, cfg.seq):contiguous()
  end }
  local t0, mem, loss
  lt.train { model = model, optimizer = opt, train = data, steps = cfg.steps + 1, clip = 1.0, quiet = true,
    out_dir = os.tmpname() .. "-bench", ddp = ddp,
    on_step = function(rec)
      if rec.step == 1 then t0 = lt.clock() end -- the first step warms up
      if rec.step == cfg.steps + 1 then mem, loss = lt.dist.memory_bytes(model, opt, ddp), rec.loss end
    end }
  local dt = lt.clock() - t0
  return { tps = cfg.steps * cfg.batch * cfg.seq * world / dt, mem = mem, loss = loss,
    peak = opt.stats and opt.stats.peak_param_bytes, params = model:num_parameters() }
end

local rows = {}
for stage = 0, 3 do rows[stage] = run(stage) end
if rank == 0 then
  print(("GPT-2 %d layers, %d wide, %.1fM parameters, T=%d, batch %d per rank, %d ranks, AdamW, %d steps after one")
    :format(cfg.n_layer, cfg.n_embd, rows[0].params / 1e6, cfg.seq, cfg.batch, world, cfg.steps))
  print(("%-6s %10s %10s %10s %10s %10s %10s %10s"):format("ZeRO", "tokens/s", "params", "grads", "optimizer",
    "total", "buckets", "last loss"))
  print(("%-6s %10s %10s %10s %10s %10s %10s %10s"):format("", "", "MiB/rank", "MiB/rank", "MiB/rank", "MiB/rank",
    "MiB/rank", ""))
  for stage = 0, 3 do
    local r = rows[stage]
    print(("%-6d %10.0f %10s %10s %10s %10s %10s %10.4f"):format(stage, r.tps, mib(r.mem.params), mib(r.mem.grads),
      mib(r.mem.optimizer), mib(r.mem.total), mib(r.mem.buffers), r.loss))
  end
  print(("stage 3 held at most %s MiB of whole parameters at once (all of them: %s MiB); total vs stage 0: %.3f")
    :format(mib(rows[3].peak), mib(rows[0].mem.params), rows[3].mem.total / rows[0].mem.total))
end
