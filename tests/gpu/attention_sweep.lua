-- tests/gpu/attention_sweep.lua: lutra's tensor-core attention (lt_attention
-- on a CUDA device, bf16/f16, head sizes 32, 64, 128) against the CPU's on
-- random shapes: batch, query and K/V heads (grouped-query), query and key
-- lengths that are not multiples of the kernels' tiles, causal or not (keys
-- after a cache: S > T), forward and the three gradients. Complements the
-- fixed shapes of tests/gpu/checks.lua; tests/gpu/run.sh runs it on the GPU.
--
--   lutra tests/gpu/attention_sweep.lua [SEED [CASES]]
--
-- Prints a line per case (the worst error of the output and gradients,
-- relative to the largest CPU value of each) and "N of M cases bad"; exits
-- with status 1 when a case is over 1e-2, the bf16 tolerance of the GPU
-- checks (0.0073 at most over 50 cases on the CUDA emulator), or prints
-- "skipped: no CUDA device".
local lt = require "lutra"
local F = lt.F

local seed, cases = tonumber(arg and arg[1] or "1"), tonumber(arg and arg[2] or "30")
if not seed or not cases then error("usage: lutra tests/gpu/attention_sweep.lua [SEED [CASES]]") end
local n, why = lt.cuda.device_count()
if n == 0 then
  print(("skipped: no CUDA device (%s)"):format(why))
  return
end
local TOL = 1e-2

lt.manual_seed(seed)
math.randomseed(seed)
local function pick(t) return t[math.random(#t)] end

-- the output and the gradients of q, k, v (as f32 on the cpu) for the sum of y * w
local function run(dev, q, k, v, w, causal)
  local qq, kk, vv = q:to(dev):detach():requires_grad_(), k:to(dev):detach():requires_grad_(),
    v:to(dev):detach():requires_grad_()
  local y = F.scaled_dot_product_attention(qq, kk, vv, { causal = causal, fused = true, library = false })
  ;(y:to("f32") * w:to(dev):to("f32")):sum():backward()
  local out = {}
  for i, t in ipairs { y, qq.grad, kk.grad, vv.grad } do out[i] = t:to("cpu"):to("f32") end
  return out
end

local bad = 0
for case = 1, cases do
  local HS, NKV, rep, B = pick { 32, 64, 128 }, pick { 1, 2 }, pick { 1, 2, 3 }, pick { 1, 2 }
  local NH, T = NKV * rep, math.random(1, 150)
  local causal = math.random() < 0.7
  local S = causal and T + pick { 0, 0, 0, math.random(0, 70) } or math.random(1, 150)
  local dt = pick { "bf16", "f16" }
  local q, k, v = lt.randn({ B, NH, T, HS }):to(dt), lt.randn({ B, NKV, S, HS }):to(dt), lt.randn({ B, NKV, S, HS }):to(dt)
  local w = lt.randn({ B, NH, T, HS }):to(dt)
  local c, g = run("cpu", q, k, v, w, causal), run("cuda", q, k, v, w, causal)
  local worst = 0
  for i = 1, 4 do
    local err = (c[i] - g[i]):abs():max():item() / math.max(c[i]:abs():max():item(), 1e-6)
    worst = math.max(worst, err == err and err or math.huge) -- (a NaN counts as the worst)
  end
  local ok = worst <= TOL
  if not ok then bad = bad + 1 end
  print(("%s case %d: B=%d NH=%d NKV=%d T=%d S=%d HS=%d causal=%s %s: worst relative error %.3g"):format(
    ok and "ok" or "BAD", case, B, NH, NKV, T, S, HS, tostring(causal), dt, worst))
end
print(("%d of %d cases bad"):format(bad, cases))
if bad > 0 then os.exit(1) end
