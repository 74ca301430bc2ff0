--- bench/plan.lua: the planner's predictions against lutra's own steps on
-- this CPU, one process: for GPT-2 shapes (the main job's, and a wider
-- one) under each recompute policy, the predicted and measured peak of
-- live tensors (lutra's allocator), the predicted and measured resident
-- set, and the step time predicted from this machine's f32 GEMM rate
-- against the measured one: their ratio is the fraction of the GEMM rate
-- lutra's whole step reaches (the MFU to give recipes/plan.lua --mfu on
-- this machine).
--
--   ./lutra bench/plan.lua [--steps=4] [--quick]
local lt = require "lutra"
local plan = lt.plan

local cfg = lt.config { steps = 4, quick = false, row = 0, rate = 0,
  _help = { row = "(internal: run that row alone and print it)", rate = "(internal: the GEMM rate the parent measured)" } }

local cases = {
  { "main job (4 x 128, T=128, batch 4)", { n_layer = 4, n_head = 4, n_embd = 128, seq = 128 }, 4 },
  { "wider (4 x 384, T=256, batch 4)", { n_layer = 4, n_head = 6, n_embd = 384, seq = 256 }, 4 },
}
if cfg.quick then cases = { { "tiny (2 x 64, T=32, batch 2)", { n_layer = 2, n_head = 4, n_embd = 64, seq = 32 }, 2 } } end

local rows = {}
for _, c in ipairs(cases) do
  for _, rc in ipairs { "none", "selective", "full" } do rows[#rows + 1] = { c, rc } end
end

-- every row in a process of its own (a resident set only grows: the rows before would count)
if cfg.row == 0 then
  local rate = plan.hardware.gemm_rate()
  print(("this CPU: f32 GEMM %.1f GFLOP/s (512^3, %d threads, the best of 5); %d steps a row, the first not counted; "
    .. "each row a process of its own"):format(rate / 1e9, lt.get_num_threads(), cfg.steps))
  print(("%-36s %-10s %10s %10s %6s %10s %10s %6s %9s %9s %7s"):format("model", "recompute", "peak pred", "measured",
    "ratio", "RSS pred", "measured", "ratio", "step pred", "measured", "of GEMM"))
  for i = 1, #rows do
    local p = io.popen(("./lutra bench/plan.lua --row=%d --steps=%d --rate=%.17g%s 2>&1"):format(i, cfg.steps, rate,
      cfg.quick and " --quick" or ""))
    io.write(p:read("*a"))
    p:close()
  end
  print("(peak: the allocator's high-water mark of live tensors over the steps after the first; RSS: the process's, "
    .. "predicted as its size before the model plus the bytes the peak writes and the 5% fragmentation margin; "
    .. "step pred: the step's FLOPs, recomputation included, at this CPU's measured f32 GEMM rate)")
  return
end

local rate = cfg.rate > 0 and cfg.rate or plan.hardware.gemm_rate()
local cpu = plan.hardware.cpu(rate)
local cluster = plan.cluster { gpu = cpu, gpus = 1 }
do
  local c, rc = rows[cfg.row][1], rows[cfg.row][2]
  local f = c[2]
  local d = plan.model { model = "gpt2", n_layer = f.n_layer, n_head = f.n_head, n_embd = f.n_embd, seq = f.seq }
  do
    local L = plan.layout { micro_batch = c[3], seq = f.seq, recompute = rc, dtype = "f32", device = "cpu" }
    local r = plan.estimate(d, L, cluster, { mfu = 1 })
    local m = plan.measure(d, L, { steps = cfg.steps })
    local e = r.memory
    local rss = m.rss_base + e.touched + e.fragmentation
    print(("%-36s %-10s %10s %10s %6.3f %10s %10s %6.3f %8.3fs %8.3fs %6.0f%%"):format(c[1], rc, plan.gib(e.peak),
      plan.gib(m.peak), e.peak / m.peak, plan.gib(rss), plan.gib(m.rss_peak), rss / m.rss_peak, r.time.step_s, m.step_s,
      100 * r.time.step_s / m.step_s))
  end
end
