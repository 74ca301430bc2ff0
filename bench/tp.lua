--- bench/tp.lua: tensor parallelism side by side under mpirun: for tp = 1,
-- 2, 4 (those dividing the job) the job's tokens/s, the bytes one rank
-- holds after a step (parameters, gradients, optimizer state, as
-- lt.dist.memory_bytes counts them, and the step's peak of live tensors),
-- and the bytes the tensor-parallel group communicated in one step
-- against Megatron-LM's count for the same shapes (Korthikanti et al.
-- 2022, section 4.2.2: per block 4 all-reduces of b s h elements in a
-- forward and backward, or with sequence parallelism 4 all-gathers and 4
-- reduce-scatters of the same size; plus the embedding's all-reduce (or
-- reduce-scatter and, backward, all-gather), the head input's gradient
-- all-reduce (or all-gather and reduce-scatter), the vocab-parallel loss's
-- three of b s numbers, and under SP the gradients of the norms, row
-- biases and positions that run on the ranks' rows, summed once).
-- GPT-2 (the main job's shape by default), AdamW with clipping through
-- lt.train, random tokens, data parallel over the ranks tp leaves.
--
--   mpirun -np 4 --oversubscribe ./lutra bench/tp.lua [--steps=5] [--n_layer=4] [--n_embd=128] [--seq=128] [--batch=4] [--sp]
local lt = require "lutra"

local cfg = lt.config { steps = 5, n_layer = 4, n_head = 4, n_embd = 128, seq = 128, batch = 4, vocab = 50257,
  sp = false, tps = "1,2,4" }
local rank, world = lt.dist.init()
local tp = lt.dist.tp

local function mib(b) return ("%9.2f"):format(b / 2 ^ 20) end

-- Megatron-LM's count of one step's tensor-parallel messages, in bytes (f32 activations)
local function megatron_bytes(sp, n)
  if n == 1 then return 0 end
  local bsh = cfg.batch * cfg.seq * cfg.n_embd * 4
  local C = cfg.n_embd
  local per_block = 4 * bsh * (sp and 2 or 1) -- 4 all-reduces, or 4 all-gathers + 4 reduce-scatters
  -- the embedding's all-reduce and the head input's gradient all-reduce; under SP the embedding's
  -- reduce-scatter and its gradient's all-gather, the head input's all-gather and its gradient's reduce-scatter
  local edges = sp and 4 * bsh or 2 * bsh
  local loss = 3 * cfg.batch * cfg.seq * 4    -- max, sum of exponentials, target logit
  -- under SP the replicated parameters used on the ranks' token rows have their gradients summed
  -- (Megatron's all-reduce of the sequence-parallel parameters' gradients): per block two
  -- LayerNorms' gains and biases and two row-parallel biases, the final norm, the positions' table
  local sp_params = sp and (cfg.n_layer * 6 * C + 2 * C + cfg.seq * C) * 4 or 0
  return cfg.n_layer * per_block + edges + loss + sp_params
end

local function run(n)
  collectgarbage() -- (the previous run's model and optimizer go first: not in this run's peak)
  collectgarbage()
  local mesh = lt.dist.mesh { tp = n }
  local model = lt.models.gpt2 { n_layer = cfg.n_layer, n_head = cfg.n_head, n_embd = cfg.n_embd,
    block_size = cfg.seq, vocab_size = cfg.vocab, generator = lt.Generator(0),
    tp = n > 1 and mesh.tp or nil, sequence_parallel = cfg.sp and n > 1 }
  local ddp = world > 1 and lt.dist.DataParallel(model, { group = mesh.dp }) or nil
  local opt = lt.optim.AdamW(model, { lr = 1e-3, betas = { 0.9, 0.95 }, weight_decay = 0.1 })
  local g = lt.Generator(1 + mesh.coords.dp) -- each data-parallel rank its own batches, a TP group the same
  local data = { next = function()
    local x = lt.randint(0, cfg.vocab, { cfg.batch, cfg.seq + 1 }, { generator = g })
    return x:narrow(2, 1, cfg.seq):contiguous(), x:narrow(2, 2, cfg.seq):contiguous()
  end }
  local t0, mem, peak, comm_bytes
  lt.train { model = model, optimizer = opt, train = data, steps = cfg.steps + 1, clip = 1.0, quiet = true,
    out_dir = os.tmpname() .. "-bench", ddp = ddp,
    on_step = function(rec)
      if rec.step == 1 then
        t0 = lt.clock() -- the first step warms up
        lt.reset_peak_memory_stats()
        tp.reset_stats()
      end
      if rec.step == 2 then
        local s = tp.stats
        comm_bytes = s.all_reduce.bytes + s.all_gather.bytes + s.reduce_scatter.bytes
      end
      if rec.step == cfg.steps + 1 then
        mem, peak = lt.dist.memory_bytes(model, opt, ddp), lt.memory_stats().peak
      end
    end }
  local dt = lt.clock() - t0
  return { tps = cfg.steps * cfg.batch * cfg.seq * mesh.sizes.dp / dt, mem = mem, peak = peak,
    comm = comm_bytes, megatron = megatron_bytes(cfg.sp, n), dp = mesh.sizes.dp }
end

local rows = {}
for s in cfg.tps:gmatch("%d+") do
  local n = tonumber(s)
  if world % n == 0 then rows[#rows + 1] = { n, run(n) } end
end
if rank == 0 then
  print(("GPT-2 %d layers, %d wide, %d heads, vocab %d, %d x %d tokens per data-parallel rank, %d ranks, f32 AdamW%s")
    :format(cfg.n_layer, cfg.n_embd, cfg.n_head, cfg.vocab, cfg.batch, cfg.seq, world, cfg.sp and ", sequence parallel" or ""))
  print("  tp   dp   tokens/s   params MiB    grads MiB    optim MiB   peak live MiB   TP comm MiB/step   Megatron's count")
  for _, r in ipairs(rows) do
    local n, x = r[1], r[2]
    print(("  %2d   %2d   %8.0f    %s    %s    %s      %s          %s          %s"):format(n, x.dp, x.tps,
      mib(x.mem.params), mib(x.mem.grads), mib(x.mem.optimizer), mib(x.peak), mib(x.comm), mib(x.megatron)))
  end
  print("(bytes per rank; the TP traffic of one step at whole message sizes, as Megatron counts; a ring moves 2(n-1)/n of an all-reduce's, (n-1)/n of the others')")
end
