--- bench/model_cpu.lua: GPT-2 forward+backward on the CPU, lutra next to
-- PyTorch (Debian's python3-torch, same model, batch and thread count) in
-- the same run. Prints ms per step, tokens/s and GFLOP/s (llm.c's count:
-- 6N + 6 L C T FLOPs per token, N all parameters), median of the steps
-- after a warm-up step.
--   ./lutra bench/model_cpu.lua [--steps=3]
local lt = require "lutra"
local ffi = require "ffi"

ffi.cdef [[
  typedef struct { long tv_sec; long tv_nsec; } lt_bench_timespec;
  int clock_gettime(int clk, lt_bench_timespec *ts);
]]
local ts = ffi.new("lt_bench_timespec")
local function now()
  ffi.C.clock_gettime(1, ts)
  return tonumber(ts.tv_sec) + tonumber(ts.tv_nsec) * 1e-9
end

local steps = tonumber((arg[1] or ""):match("^%-%-steps=(%d+)$")) or 3
local B, T = 4, 64
local threads = lt.num_threads()

local function median(t)
  table.sort(t)
  return t[math.floor((#t + 1) / 2)]
end

local function bench_lutra(name)
  local m = lt.models.gpt2(name)
  local cfg = m.config
  local V = cfg.vocab_size
  local x, y = lt.randint(0, V, { B, T }), lt.randint(0, V, { B, T })
  local times = {}
  for i = 0, steps do
    local t0 = now()
    local loss = m:loss(x, y)
    loss:backward()
    m:zero_grad()
    if i > 0 then times[#times + 1] = now() - t0 end
  end
  return median(times), m:num_parameters(), cfg
end

-- PyTorch runs under both OpenMP wait policies (lutra itself runs with
-- PASSIVE, host/main.c); the faster one is compared, to be fair to it.
local function bench_torch(cfg)
  local best
  for _, policy in ipairs { "ACTIVE", "PASSIVE" } do
    local cmd = ("OMP_WAIT_POLICY=%s /usr/bin/python3 bench/model_cpu_torch.py %d %d %d %d %d %d %d %d %d 2>/dev/null")
      :format(policy, cfg.n_layer, cfg.n_head, cfg.n_embd, cfg.vocab_size, cfg.block_size, B, T, threads, steps)
    local p = io.popen(cmd)
    local out = p and p:read("*a") or ""
    if p then p:close() end
    local ok, res = pcall(lt.json.decode, out:match("{.*}") or "")
    if ok and (not best or res.seconds < best.seconds) then
      best = res
      best.policy = policy
    end
  end
  return best
end

print(("GPT-2 forward+backward, B=%d T=%d, %d threads, median of %d steps"):format(B, T, threads, steps))
print(("%-10s %-8s %12s %10s %10s %10s"):format("model", "runtime", "params", "ms/step", "tokens/s", "GFLOP/s"))
for _, name in ipairs { "gpt2-tiny", "gpt2" } do
  local secs, n, cfg = bench_lutra(name)
  local flops = (6 * n + 6 * cfg.n_layer * cfg.n_embd * T) * B * T
  print(("%-10s %-8s %12d %10.1f %10.0f %10.1f"):format(name, "lutra", n, secs * 1e3, B * T / secs, flops / secs * 1e-9))
  local tr = bench_torch(cfg)
  if tr then
    print(("%-10s %-8s %12d %10.1f %10.0f %10.1f   (%s waiting; lutra / torch tokens/s: %.2f)"):format(name,
      "torch", tr.params, tr.seconds * 1e3, B * T / tr.seconds, flops / tr.seconds * 1e-9, tr.policy:lower(),
      tr.seconds / secs))
  else
    print(("%-10s %-8s  (PyTorch not available at /usr/bin/python3)"):format(name, "torch"))
  end
end
