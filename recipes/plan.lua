--- recipes/plan.lua: the planner (lt.plan) on the command line. Given a
-- model, a cluster and a layout it prints each GPU's memory (parameters,
-- gradients, optimizer state, activations, buffers; whether it fits), the
-- step time (compute at an assumed MFU, the bubble, TP/DP/PP
-- communication and what of it overlaps), tokens/s and MFU, the time, cost
-- and energy of training N tokens or of a number of days, and a sanity
-- check of claimed efficiencies. --search ranks every layout that fits.
--
--   ./lutra recipes/plan.lua --model=gpt2 --gpu=h200 --gpus=1 --micro_batch=16 --global_batch=512 --seq=1024
--   ./lutra recipes/plan.lua --model=llama2-70b --gpu=h100 --gpus=64 --tp=8 --pp=4 --dp=2 --zero=1 \
--       --micro_batch=1 --global_batch=1024 --seq=4096 --recompute=selective --search
--   ./lutra recipes/plan.lua --model=path/to/config.json ...     # a Hugging Face config
--   ./lutra recipes/plan.lua --model=flags --n_layer=4 --n_embd=128 --n_head=4 --seq=128 --gpu=cpu --dtype=f32
--   mpirun -np 2 ./lutra recipes/plan.lua --model=flags ... --gpu=cpu --dtype=f32 --measure   # and measured here
local lt = require "lutra"
local plan = lt.plan

local cfg = lt.config {
  model = "gpt2", gpu = "h100", gpus = 1, gpus_per_node = 8,
  dp = 0, tp = 1, pp = 1, virtual_stages = 1, zero = 0, micro_batch = 1, micro_batches = 0, global_batch = 0,
  seq = 1024, recompute = "none", dtype = "bf16", sp = false, schedule_pp = "1f1b",
  mfu = 0.4, tokens = 0, price = 0, kwh_price = 0, pue = 1.4, days = 0, claim_mfu = 0, claim_step_s = 0,
  search = false, top = 10, measure = false, steps = 3, check = 0,
  n_layer = 4, n_head = 4, n_embd = 128, n_kv_head = 0, ffn = 0, pad_vocab = 0, vocab_size = 50257, family = "gpt2",
  _help = {
    model = "a lutra model name (gpt2, gpt2-xl, gpt3-175b, llama2-70b, llama3-8b, ...), a config.json path, or "
      .. "flags (then --family, --n_layer, --n_embd, --n_head, --n_kv_head, --ffn, --seq, --vocab_size, --pad_vocab "
      .. "as recipes/gpt2.lua takes them)",
    gpu = "h100, h200, a100, or cpu (this machine: its measured f32 GEMM rate as the peak)",
    gpus = "GPUs in the job", gpus_per_node = "GPUs a node (NVLink within, the network across)",
    dp = "data-parallel ranks (0: gpus / (tp x pp))", tp = "tensor-parallel ranks", pp = "pipeline stages",
    virtual_stages = "model chunks a pipeline rank (interleaved 1F1B)", zero = "ZeRO stage 0-3",
    micro_batch = "sequences a rank runs at once", micro_batches = "micro-batches per step (0: from --global_batch)",
    global_batch = "sequences per optimizer step (0: micro_batch x micro_batches x dp)", seq = "tokens a sequence",
    recompute = "none, full, every:k or selective", dtype = "bf16, f16 or f32", sp = "sequence parallelism with --tp",
    schedule_pp = "gpipe, 1f1b or interleaved", mfu = "the assumed fraction of the dtype's peak the products reach",
    tokens = "tokens to train (time, GPU-hours, cost and energy; 0: none)", price = "$ per GPU-hour (0: no $)",
    kwh_price = "$ per kWh (0: no $)", pue = "the data centre's power usage effectiveness",
    days = "cost and energy of this many days of the cluster (0: none)",
    claim_mfu = "a claimed efficiency (a fraction) to check against published MFUs",
    claim_step_s = "a claimed step time: the MFU it implies", search = "rank every layout that fits",
    top = "layouts --search prints", measure = "also run the layout here (CPU, under mpirun with dp x tp x pp ranks) "
      .. "and print measured against predicted", steps = "steps --measure runs",
    check = "with --measure: exit 1 unless every rank's state bytes are exact and its peak within this fraction "
      .. "(0.1: 10%) of the measured one (0: no check)",
    family = "with --model=flags: gpt2 or llama",
  },
}
local whole = function(lo, why) return { int = true, min = lo, why = why } end
lt.config.check(cfg, {
  gpus = whole(1), gpus_per_node = whole(1), dp = whole(0, "0: from gpus"), tp = whole(1), pp = whole(1),
  virtual_stages = whole(1), zero = { one_of = { 0, 1, 2, 3 }, why = "a ZeRO stage" }, micro_batch = whole(1),
  micro_batches = whole(0, "0: from global_batch"), global_batch = whole(0, "0: from micro_batches"), seq = whole(1),
  dtype = { one_of = { "bf16", "f16", "f32" } }, schedule_pp = { one_of = { "gpipe", "1f1b", "interleaved" } },
  mfu = { gt = 0, max = 1 }, tokens = { min = 0 }, price = { min = 0 }, kwh_price = { min = 0 }, pue = { min = 1 },
  days = { min = 0 }, claim_mfu = { min = 0 }, claim_step_s = { min = 0 }, top = whole(1), steps = whole(2),
  check = { min = 0, lt = 1 },
  family = { one_of = { "gpt2", "llama" } },
})
lt.config.refuse_args(cfg)
local fail = lt.config.fail

-- a planner error (a model, GPU or layout it cannot take) is a settings error naming it
local function settle(f, ...)
  local ok, r, r2 = pcall(f, ...)
  if not ok then fail((tostring(r):gsub("^.-plan: ", ""))) end
  return r, r2
end

local desc = settle(function()
  if cfg.model == "flags" then
    return plan.model { model = cfg.family, n_layer = cfg.n_layer, n_head = cfg.n_head, n_embd = cfg.n_embd,
      seq = cfg.seq, n_kv_head = cfg.n_kv_head, ffn = cfg.ffn, pad_vocab = cfg.pad_vocab, vocab_size = cfg.vocab_size }
  end
  return plan.model(cfg.model)
end)
local cluster = settle(plan.cluster, { gpu = cfg.gpu, gpus = cfg.gpus, gpus_per_node = cfg.gpus_per_node })
local device = cluster.gpu.key == "cpu" and "cpu" or "cuda"
local opts = { mfu = cfg.mfu, tokens = cfg.tokens > 0 and cfg.tokens or nil, price = cfg.price > 0 and cfg.price or nil,
  kwh_price = cfg.kwh_price > 0 and cfg.kwh_price or nil, pue = cfg.pue, days = cfg.days > 0 and cfg.days or nil,
  claim_mfu = cfg.claim_mfu > 0 and cfg.claim_mfu or nil, claim_step_s = cfg.claim_step_s > 0 and cfg.claim_step_s or nil }

if cfg.search then
  if cfg.global_batch == 0 then fail("--search needs --global_batch (sequences per optimizer step)") end
  print(("search: %s on %d x %s, global batch %d x %d tokens, %s, assumed MFU %.0f%%"):format(desc.name or desc.family,
    cfg.gpus, cluster.gpu.name, cfg.global_batch, cfg.seq, cfg.dtype, 100 * cfg.mfu))
  local fits, reasons = plan.search(desc, cluster, { global_batch = cfg.global_batch, seq = cfg.seq, dtype = cfg.dtype,
    mfu = cfg.mfu })
  print(plan.search_report(fits, reasons, cfg.top))
  if #fits > 0 then
    print("")
    print("the fastest in full:")
    print(plan.report(fits[1], opts))
  end
  return
end

local tp, pp = cfg.tp, cfg.pp
local dp = cfg.dp > 0 and cfg.dp or math.floor(cfg.gpus / (tp * pp))
if dp < 1 then fail(("--tp=%d x --pp=%d is more than --gpus=%d"):format(tp, pp, cfg.gpus)) end
local L = settle(plan.layout, { dp = dp, tp = tp, pp = pp, v = cfg.virtual_stages, zero = cfg.zero,
  micro_batch = cfg.micro_batch, micro_batches = cfg.micro_batches > 0 and cfg.micro_batches or nil,
  global_batch = cfg.global_batch > 0 and cfg.global_batch or nil, seq = cfg.seq, recompute = cfg.recompute,
  dtype = cfg.dtype, sp = cfg.sp, device = device,
  schedule = (cfg.virtual_stages > 1 and cfg.schedule_pp == "1f1b") and "interleaved" or cfg.schedule_pp })
local r = plan.estimate(desc, L, cluster, opts)
if not cfg.measure or lt.dist.rank() == 0 then print(plan.report(r, opts)) end

if cfg.measure then
  if device ~= "cpu" or L.dtype ~= "f32" then fail("--measure runs the layout on this machine: --gpu=cpu --dtype=f32") end
  local rank, world = lt.dist.init()
  if world ~= L.ranks then
    fail(("--measure: the layout has %d ranks, the job %d (mpirun -np %d)"):format(L.ranks, world, L.ranks))
  end
  local m = plan.measure(desc, L, { steps = cfg.steps })
  local mesh = world > 1 and lt.dist.mesh { tp = L.tp, pp = L.pp } or nil
  local e = plan.memory.estimate(desc, L, mesh and mesh.coords or {})
  local row = lt.tensor({ m.params, m.grads, m.optimizer, m.peak, e.state.params, e.state.grads, e.state.optimizer,
    e.peak, m.step_s, m.rss_peak or 0, m.rss_base or 0 }, { dtype = "f64" }):view(1, 11)
  local rows = world > 1 and lt.dist.all_gather(row):totable() or row:totable()
  local bad = 0 -- (every rank counts the same rows)
  for _, v in ipairs(rows) do
    if not (v[1] == v[5] and v[2] == v[6] and v[3] == v[7]) or math.abs(v[8] / v[4] - 1) > cfg.check then
      bad = bad + 1
    end
  end
  if rank == 0 then
    print("")
    print(("measured here (%d steps, the peak over those after the first; lt.dist.memory_bytes after the last):"):format(cfg.steps))
    print(("%-5s %12s %12s %12s %12s %12s %8s %10s"):format("rank", "params", "grads", "optimizer", "peak", "pred. peak",
      "ratio", "step"))
    for i, v in ipairs(rows) do
      local same = v[1] == v[5] and v[2] == v[6] and v[3] == v[7]
      print(("%-5d %12d %12d %12d %12s %12s %8.3f %9.3fs%s"):format(i - 1, v[1], v[2], v[3], plan.gib(v[4]),
        plan.gib(v[8]), v[8] / v[4], v[9], same and "" or "  (state differs from the prediction)"))
    end
    if cfg.check > 0 then
      print(bad == 0 and ("plan check: ok (state exact, peaks within %.0f%%)"):format(100 * cfg.check)
        or ("plan check: FAILED on %d rank%s"):format(bad, bad == 1 and "" or "s"))
    end
    print(("predicted step %s (compute at --mfu=%.2f of the measured GEMM rate)"):format(plan.human_time(r.time.step_s),
      cfg.mfu))
    print(("rank 0's resident set: %s at most; predicted %s (%s before the model, the predicted peak's %s written, "
      .. "%s of fragmentation)"):format(plan.gib(rows[1][10]), plan.gib(rows[1][11] + e.touched + e.fragmentation),
      plan.gib(rows[1][11]), plan.gib(e.touched), plan.gib(e.fragmentation)))
  end
  if cfg.check > 0 and bad > 0 then os.exit(1) end
  if cfg.check > 0 and world == 1 and rows[1][10] > 0 then -- (one process: its resident set too)
    local want = rows[1][11] + e.touched + e.fragmentation
    local off = math.abs(want / rows[1][10] - 1)
    print(("plan check: resident set %s, predicted %s (ratio %.3f): %s"):format(plan.gib(rows[1][10]), plan.gib(want),
      want / rows[1][10], off <= cfg.check and "ok" or "FAILED"))
    if off > cfg.check then os.exit(1) end
  end
end
