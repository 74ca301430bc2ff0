--- bench/gpt2_gpu.lua: GPT-2 124M training steps on one CUDA device: forward,
-- backward and a fused AdamW update (lt.optim.AdamW: one call per parameter
-- group, f32 master weights for bf16), at T=1024 and the micro-batches given. Prints ms per step, tokens/s, MFU and
-- peak memory per dtype and batch, and the bf16 product rate measured in the
-- same run. MFU uses llm.c's FLOP count (as ARCHITECTURE.md, Performance, and bench/model_cpu.lua):
-- 6N + 6 L C T FLOPs per token (N all parameters; L layers, C channels, T
-- sequence length),
-- against 989 TFLOP/s (the H100/H200 dense bf16 figure) and against the
-- measured product rate; "host ms" is the host's time to issue a step (when
-- it nears ms/step, launches and Lua bound the step, not the GPU). When torch is installed, bench/gpt2_gpu_torch.py
-- runs the same model in the same call (tests/gpu/run.sh prints the ratio).
--
-- The embedding rows are padded to a multiple of pad_vocab (128: 50304
-- rows, as llm.c does; 0 turns it off); logits keep 50257 columns.
--
--   ./lutra bench/gpt2_gpu.lua [--steps=10] [--batches=4,8,16|auto] [--dtypes=bf16,f32] [--model=gpt2] [--pad_vocab=128]
--       [--attention=auto|fused|composed] [--rate_size=8192] [--profile=0]
--
-- make test runs it on the CUDA emulator at a tiny size (gpt2-tiny, T=32,
-- --rate_size=64), so the script itself is checked before a GPU runs it.
--
-- --batches=auto doubles the micro-batch from 8 until one does not fit.
-- --attention: auto (the default) is what training uses: cuDNN's flash
-- attention for bf16/f16 (F.library_attention), else the composed path;
-- fused runs lutra's fused kernel (lt_attention); composed runs matmul,
-- scaled_softmax, matmul.
-- --profile=N: after the timed steps, one more step under lt.cuda.profile_start,
-- printed as a table of its N largest pieces of work (kernels, cuBLASLt
-- products by shape, cuDNN attention, copies; each named by its phase:
-- forward, backward, optimizer) with calls, ms and % of the step, and the
-- time of each phase.
local lt = require "lutra"

local opts = { steps = 10, batches = "8,16", dtypes = "bf16", model = "gpt2", T = 1024, pad_vocab = 128,
  attention = "auto", rate_size = 8192, profile = 0 }
for _, a in ipairs(arg or {}) do
  local k, v = a:match("^%-%-([%w_]+)=(.*)$")
  if not k or opts[k] == nil then
    error("usage: lutra bench/gpt2_gpu.lua [--steps=N] [--batches=4,8] [--dtypes=bf16,f32] [--model=gpt2] [--T=1024] "
      .. "[--pad_vocab=128] [--attention=auto|fused|composed] [--rate_size=8192] [--profile=N]")
  end
  opts[k] = tonumber(v) or v
end
if opts.attention ~= "auto" and opts.attention ~= "fused" and opts.attention ~= "composed" then
  error("--attention: auto, fused or composed, got " .. tostring(opts.attention))
end
lt.F.library_attention = opts.attention == "auto"
lt.F.fused_attention = opts.attention == "fused"

local n, why = lt.cuda.device_count()
if n == 0 then
  print(("skipped: no CUDA device (%s)"):format(why))
  return
end
local DEV = "cuda"
local PEAK = 989e12

local function list(s)
  local out = {}
  for x in tostring(s):gmatch("[^,]+") do out[#out + 1] = tonumber(x) or x end
  return out
end

local function median(t)
  local c = {}
  for i, v in ipairs(t) do c[i] = v end
  table.sort(c)
  return c[math.floor((#c + 1) / 2)]
end

-- the product rate this device reaches on a large bf16 matmul (n x n, n = --rate_size)
local function matmul_rate()
  local n = opts.rate_size
  local a = lt.randn({ n, n }, { dtype = "bf16", device = DEV })
  local b = lt.randn({ n, n }, { dtype = "bf16", device = DEV })
  local c = lt.matmul(a, b)
  lt.cuda.synchronize()
  local reps, t0 = 20, lt.clock()
  for _ = 1, reps do c = lt.matmul(a, b) end
  lt.cuda.synchronize()
  local dt = lt.clock() - t0
  c:free()
  return 2 * n ^ 3 * reps / dt
end

local rate = matmul_rate()
print(("bf16 matmul %d^3: %.1f TFLOP/s (%.0f%% of %.0f)"):format(opts.rate_size, rate / 1e12, 100 * rate / PEAK,
  PEAK / 1e12))

local function bench(dtype, B)
  collectgarbage()
  lt.cuda.empty_cache()
  lt.cuda.reset_peak_memory_stats()
  local model = lt.models.gpt2(opts.model,
    { generator = lt.Generator(1), pad_vocab = opts.pad_vocab > 0 and opts.pad_vocab or nil })
  model:to(DEV, dtype)
  local cfg, T = model.config, opts.T
  local N = model:num_parameters()
  local flops_per_token = 6 * N + 6 * cfg.n_layer * cfg.n_embd * T
  local V = cfg.vocab_size
  local x = lt.randint(0, V, { B, T }, { device = DEV })
  local y = lt.randint(0, V, { B, T }, { device = DEV })
  local opt = lt.optim.AdamW(model, { lr = 1e-4, weight_decay = 0.1 })
  local times, host, last_loss = {}, {}, 0
  for step = 0, opts.steps do
    lt.cuda.synchronize()
    local t0 = lt.clock()
    local loss = model:loss(x, y, { count = false }) -- (counting targets on the host would wait for the GPU)
    loss:backward()
    opt:step()
    opt:zero_grad()
    local enqueued = lt.clock() -- the host's time for the step: when it nears the total, launches bound the step
    last_loss = loss:item() -- the one read per step, as a training loop logs it
    if step > 0 then
      times[#times + 1] = lt.clock() - t0
      host[#host + 1] = enqueued - t0
    end
    if step % 4 == 0 then collectgarbage() end
  end
  local profile
  if opts.profile > 0 then -- one more step, each piece of its work timed by CUDA events
    lt.cuda.synchronize()
    lt.cuda.profile_start()
    lt.cuda.profile_phase("forward")
    local loss = model:loss(x, y, { count = false })
    lt.cuda.profile_phase("backward")
    loss:backward()
    lt.cuda.profile_phase("optimizer")
    opt:step()
    opt:zero_grad()
    profile = lt.cuda.profile_table(lt.cuda.profile_stop(), opts.profile)
  end
  local dt = median(times)
  local tps = B * T / dt
  local mem = lt.cuda.memory_stats()
  return { ms = dt * 1e3, host_ms = median(host) * 1e3, tps = tps, mfu = tps * flops_per_token / PEAK, mfu_meas = tps * flops_per_token / rate,
    peak = mem.peak / 2 ^ 30, loss = last_loss, profile = profile }
end

print(("attention: %s"):format(opts.attention))
print(("%-6s %4s %6s %10s %12s %8s %12s %10s %8s %8s"):format("dtype", "B", "T", "ms/step", "tokens/s", "MFU",
  "MFU(meas.)", "peak GiB", "loss", "host ms"))
for _, dtype in ipairs(list(opts.dtypes)) do
  -- "auto": 8, 16, 32, ... until a batch does not fit (running out of memory is an error the process survives)
  local auto = opts.batches == "auto"
  local batches = auto and { 8, 16, 32, 64, 128, 256 } or list(opts.batches)
  local largest
  for _, B in ipairs(batches) do
    local ok, r = pcall(bench, dtype, B)
    if ok then
      largest = B
      print(("%-6s %4d %6d %10.1f %12.0f %7.1f%% %11.1f%% %10.2f %8.4f %8.1f"):format(dtype, B, opts.T, r.ms, r.tps,
        100 * r.mfu, 100 * r.mfu_meas, r.peak, r.loss, r.host_ms))
      if r.profile then print(r.profile) end
    else
      print(("%-6s %4d %6d  failed: %s"):format(dtype, B, opts.T, tostring(r):gsub("\n.*", "")))
      if auto then break end
    end
  end
  if auto and largest then print(("%s: the largest micro-batch that fits is %d (of those tried)"):format(dtype, largest)) end
end
