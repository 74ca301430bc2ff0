--- bench/pp.lua: pipeline parallelism's schedules side by side under
-- mpirun (issue 26's measurements). For each layout (pp = 2 with the data
-- parallelism the job leaves, pp = 4), micro-batch count m and schedule
-- (1F1B, GPipe, interleaved 1F1B with v = 2 chunks a rank) it trains a
-- GPT-2 with lt.train.step (AdamW, clipping) on random tokens and prints:
--
--   tokens/s      the job's tokens per second over the timed steps
--   bubble        the formula, (p-1)/(m+p-1), (p-1)/(v m+p-1) interleaved
--                 (lt.dist.pp.bubble_fraction), and the measured one: per
--                 rank, 1 - busy / wall over the step's pipeline (the
--                 micro-batch function: the schedule's forwards,
--                 backwards, sends and receives, not the optimizer or the
--                 data-parallel all-reduce), busy the time inside the
--                 stage's forwards (lutra.models.pipeline.stage_forward)
--                 and backwards (t:backward); "mean" averages the ranks,
--                 "busiest" is 1 - the busiest rank's busy time over the
--                 longest pipeline wall time
--   in flight     the schedule's most micro-batch chunks whose activations
--                 a rank keeps (lt.dist.pp.simulate), per stage
--   act MiB       the peak of live CPU tensors during the pipeline above
--                 what was live when it started, less the stage's
--                 gradients (lt.reset_peak_memory_stats, lt.memory_stats),
--                 per stage (the largest of its data-parallel ranks)
--   p2p MiB/step  the activation and gradient bytes the stages sent each
--                 other in one step (the link's sends; every rank's summed),
--                 against 2 (p v - 1) m B T C 4 bytes per pipeline
--
-- and the same model on one process (rank 0 alone, the others sleeping)
-- with m micro-batches of accumulation as the reference: its tokens/s and
-- its activation peak (one micro-batch of the whole model's). The
-- vocabulary is small by default (2048) so that the head does not
-- outweigh the blocks and the stages are about even, as the formula
-- assumes. Every rank runs --threads kernel threads (default 1).
--
--   mpirun -np 4 --oversubscribe ./lutra bench/pp.lua [--steps=3] [--n_layer=8] [--n_embd=128] [--seq=64] [--batch=4] [--vocab=2048]
local lt = require "lutra"
local pipeline = require "lutra.models.pipeline"
local executor = require "lutra.dist.pp.executor"
local link = require "lutra.dist.pp.link"
local pp = lt.dist.pp

local cfg = lt.config { steps = 3, n_layer = 8, n_head = 4, n_embd = 128, seq = 64, batch = 4, vocab = 2048,
  threads = 1, pps = "2,4", ms = "4,8", schedules = "1f1b,gpipe,interleaved" }
local rank, world = lt.dist.init()
lt.dist.set_timeout(600)
lt.set_num_threads(cfg.threads)

local function list(s, num)
  local out = {}
  for part in s:gmatch("[^,]+") do out[#out + 1] = num and tonumber(part) or part end
  return out
end

-- the instruments: forward and backward time inside the pipeline, the bytes sent between stages
local clock = lt.clock
local meter = { on = false, busy = 0, bytes = 0 }
local stage_forward = pipeline.stage_forward
pipeline.stage_forward = function(...)
  local t0 = clock()
  local out = stage_forward(...)
  meter.busy = meter.busy + clock() - t0
  return out
end
local methods = require("lutra.tensor").methods
local backward = methods.backward
methods.backward = function(...)
  if not meter.on then return backward(...) end
  local t0 = clock()
  backward(...)
  meter.busy = meter.busy + clock() - t0
end
local Link = getmetatable(link.new({ size = function() return 1 end, rank = function() return 0 end }, 1))
local send = Link.send
Link.send = function(self, t, ...)
  meter.bytes = meter.bytes + t:nbytes()
  return send(self, t, ...)
end

local function model_of(o)
  return lt.models.gpt2 { n_layer = cfg.n_layer, n_head = cfg.n_head, n_embd = cfg.n_embd, block_size = cfg.seq,
    vocab_size = cfg.vocab, generator = lt.Generator(0), pp = o.pp, virtual_stages = o.v }
end

-- trains steps + 1 steps (the first warms up) of m micro-batches; -> this rank's numbers
local function train(model, m, o)
  collectgarbage()
  collectgarbage()
  local ddp = o.dp_group and lt.dist.DataParallel(model, { group = o.dp_group }) or nil
  local opt = lt.optim.AdamW(model, { lr = 1e-3, betas = { 0.9, 0.95 }, weight_decay = 0.1 })
  local inner = o.schedule and executor.new(model, { schedule = o.schedule, micro_batches = m })
    or lt.train.step.micro_batches
  local r = { wall = 0, busy = 0, bytes = 0, act = 0 }
  local timed = false
  local function micro_batches(S, xs, ys, total)
    lt.reset_peak_memory_stats()
    local live = lt.memory_stats().allocated
    meter.busy, meter.bytes, meter.on = 0, 0, true
    local t0 = clock()
    local a, b = inner(S, xs, ys, total)
    local dt = clock() - t0
    meter.on = false
    if timed then
      local grads = 0
      for _, p in ipairs(model:parameters()) do if p.grad ~= nil then grads = grads + p.grad:nbytes() end end
      r.wall, r.busy, r.bytes = r.wall + dt, r.busy + meter.busy, r.bytes + meter.bytes
      r.act = math.max(r.act, lt.memory_stats().peak - live - grads)
    end
    return a, b
  end
  local S = lt.train.step.new { model = model, optimizer = opt, accum = m, clip = 1.0, ddp = ddp,
    micro_batches = micro_batches }
  local g = lt.Generator(1 + (o.dp_rank or 0)) -- each data-parallel rank its own batches, a pipeline the same
  local function batch()
    local x = lt.randint(0, cfg.vocab, { cfg.batch, cfg.seq + 1 }, { generator = g })
    return x:narrow(2, 1, cfg.seq):contiguous(), x:narrow(2, 2, cfg.seq):contiguous()
  end
  S:run(1, batch)
  timed = true
  local t0 = clock()
  for s = 2, cfg.steps + 1 do S:run(s, batch) end
  r.step = (clock() - t0) / cfg.steps
  r.wall, r.busy, r.bytes = r.wall / cfg.steps, r.busy / cfg.steps, r.bytes / cfg.steps
  return r
end

-- one row: every rank's numbers gathered (all_reduce of a rank-indexed table)
local function gather(r)
  local flat = {}
  for i = 1, 5 * world do flat[i] = 0 end
  for i, v in ipairs { r.wall, r.busy, r.bytes, r.act, r.step } do flat[(i - 1) * world + rank + 1] = v end
  local t = lt.tensor(flat, { dtype = "f64" })
  lt.dist.all_reduce(t)
  local v = t:totable()
  local out = {}
  for i, k in ipairs { "wall", "busy", "bytes", "act", "step" } do
    out[k] = {}
    for j = 1, world do out[k][j] = v[(i - 1) * world + j] end
  end
  return out
end

local rows = {}
for _, p in ipairs(list(cfg.pps, true)) do
  if world % p == 0 then
    local mesh = lt.dist.mesh { pp = p }
    local dp = mesh.sizes.dp
    for _, m in ipairs(list(cfg.ms, true)) do
      for _, kind in ipairs(list(cfg.schedules)) do
        local v = kind == "interleaved" and 2 or 1
        if p * v <= cfg.n_layer and (v == 1 or m % p == 0) then
          local model = model_of { pp = mesh.pp, v = v }
          local r = train(model, m, { schedule = kind, dp_group = mesh.dp, dp_rank = mesh.coords.dp })
          local all = gather(r)
          local sim = pp.simulate(executor.make_schedule(kind, p, m, v))
          rows[#rows + 1] = { p = p, dp = dp, m = m, kind = kind, v = v, all = all, in_flight = sim.in_flight,
            formula = pp.bubble_fraction(p, m, v) }
        end
      end
    end
  end
end

-- the reference: one process, the whole model, m micro-batches accumulated (rank 0; the others sleep, not spin)
local ref = {}
local flag = os.tmpname()
local name = lt.tensor({ rank == 0 and tonumber(flag:match("(%w+)$"), 36) or 0 }, { dtype = "i64" })
lt.dist.broadcast(name)
local done_file = ("/tmp/lutra-bench-pp-%d.done"):format(name:item())
if rank == 0 then
  for _, m in ipairs(list(cfg.ms, true)) do ref[m] = train(model_of {}, m, {}) end
  local f = io.open(done_file, "w")
  f:write("done\n")
  f:close()
else
  while not io.open(done_file, "r") do os.execute("sleep 0.2") end
end
os.remove(flag)
lt.dist.barrier()
if rank == 0 then os.remove(done_file) end

if rank == 0 then
  local mib = function(b) return b / 2 ^ 20 end
  local tokens = cfg.batch * cfg.seq
  print(("GPT-2 %d layers, %d wide, %d heads, vocab %d, micro-batches of %d x %d tokens, %d ranks (%d kernel thread%s "
    .. "each), f32 AdamW, %d timed steps"):format(cfg.n_layer, cfg.n_embd, cfg.n_head, cfg.vocab, cfg.batch, cfg.seq,
    world, cfg.threads, cfg.threads == 1 and "" or "s", cfg.steps))
  print(" layout        schedule         m   tokens/s   bubble: formula   mean  busiest   in flight   act MiB per stage"
    .. "          p2p MiB/step (expected)")
  for _, row in ipairs(rows) do
    local a, p = row.all, row.p
    local bub, maxbusy, maxwall, step = 0, 0, 0, 0
    for j = 1, world do
      bub = bub + (1 - a.busy[j] / a.wall[j]) / world
      maxbusy, maxwall, step = math.max(maxbusy, a.busy[j]), math.max(maxwall, a.wall[j]), math.max(step, a.step[j])
    end
    local acts, flights, bytes = {}, {}, 0
    for s = 0, p - 1 do
      local peak = 0
      for d = 0, row.dp - 1 do peak = math.max(peak, a.act[d + row.dp * s + 1]) end
      acts[#acts + 1] = ("%.1f"):format(mib(peak))
      flights[#flights + 1] = tostring(row.in_flight[s + 1])
    end
    for j = 1, world do bytes = bytes + a.bytes[j] end
    local expected = row.dp * 2 * (p * row.v - 1) * row.m * tokens * cfg.n_embd * 4
    print((" dp %d x pp %d   %-15s %2d   %8.0f          %5.3f   %5.3f    %5.3f   %-10s  %-26s %6.2f (%.2f)"):format(
      row.dp, p, row.kind .. (row.v > 1 and (" v=%d"):format(row.v) or ""), row.m,
      row.dp * row.m * tokens / step, row.formula, bub, 1 - maxbusy / maxwall, table.concat(flights, "/"),
      table.concat(acts, " / "), mib(bytes), mib(expected)))
  end
  for _, m in ipairs(list(cfg.ms, true)) do
    local r = ref[m]
    print((" one process   accumulation    %2d   %8.0f          %5.3f       -        -   %-10s  %-26s %6.2f"):format(m,
      m * tokens / r.step, 0, "1", ("%.1f"):format(mib(r.act)), 0))
  end
  print("(bubble: 1 - busy / wall of each rank's pipeline part of the step (forwards, backwards, sends, receives);"
    .. " act: the peak of live tensors in it above its start, less the gradients; the ranks share "
    .. "the machine's cores, so a rank's busy time includes the time other ranks held its core)")
end
