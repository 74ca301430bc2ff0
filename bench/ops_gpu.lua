--- bench/ops_gpu.lua: the CUDA ops a GPT-2 124M training step spends its time
-- in, at that step's sizes (B=8, T=1024, C=768, V=50257, 12 heads), each
-- timed alone: milliseconds per call (median of 10 after a warm-up, the
-- device synchronised around each), and GB/s or TFLOP/s where one number
-- describes the op. Backward rows time forward plus backward.
--
--   ./lutra bench/ops_gpu.lua [--B=8] [--dtype=bf16] [--device=cuda]
local lt = require "lutra"
local F = lt.F

local opts = { B = 8, dtype = "bf16", device = "cuda" }
for _, a in ipairs(arg or {}) do
  local k, v = a:match("^%-%-([%w_]+)=(.*)$")
  if not k or opts[k] == nil then error("usage: lutra bench/ops_gpu.lua [--B=8] [--dtype=bf16] [--device=cuda]") end
  opts[k] = tonumber(v) or v
end
local n, why = lt.cuda.device_count()
if n == 0 and opts.device ~= "cpu" then
  print(("skipped: no CUDA device (%s)"):format(why))
  return
end

local D, DT = opts.device, opts.dtype
local B, T, C, V, NH = opts.B, 1024, 768, 50257, 12
local BT = B * T
local esize = ({ f32 = 4, bf16 = 2, f16 = 2, f64 = 8 })[DT]

local sync = D == "cpu" and function() end or lt.cuda.synchronize
local function time(fn)
  fn()
  sync()
  local ts = {}
  for i = 1, 10 do
    local t0 = lt.clock()
    fn()
    sync()
    ts[i] = lt.clock() - t0
  end
  table.sort(ts)
  return ts[5] * 1e3
end

local function randn(shape, grad)
  local t = lt.randn(shape, { dtype = DT, device = D })
  if grad then t:requires_grad_() end
  return t
end

local rows = {}
local function row(name, ms, what)
  rows[#rows + 1] = { name, ms, what or "" }
  print(("%-44s %9.3f ms  %s"):format(name, ms, what or ""))
end

local function bw(bytes, ms) return ("%.0f GB/s"):format(bytes / (ms * 1e-3) / 1e9) end
local function fl(flops, ms)
  local rate = flops / (ms * 1e-3)
  return rate >= 1e12 and ("%.1f TFLOP/s"):format(rate / 1e12) or ("%.1f GFLOP/s"):format(rate / 1e9)
end

print(("GPT-2 124M step sizes: B=%d T=%d C=%d V=%d, dtype %s"):format(B, T, C, V, DT))

-- matrix products (forward shapes of one layer and the head)
local x = randn({ BT, C })
for _, s in ipairs { { "qkv", 3 * C }, { "attn proj", C }, { "mlp fc", 4 * C } } do
  local w = randn({ s[2], C })
  local ms = time(function() return lt.matmul(x, w:t()) end)
  row(("matmul %s (%d x %d) @ (%d x %d)^T"):format(s[1], BT, C, s[2], C), ms, fl(2 * BT * C * s[2], ms))
end
do -- the MLP's first layer: one lt_linear with the bias and GELU in cuBLASLt's epilogue, or three ops
  local w, b = randn({ 4 * C, C }), randn({ 4 * C })
  local ms = time(function() return F.linear(x, w, b, { activation = "gelu" }) end)
  row("linear + bias + GELU -> 4C (lt_linear)", ms, fl(2 * BT * C * 4 * C, ms))
  ms = time(function() return (lt.matmul(x, w:t()) + b):gelu() end)
  row("matmul, add, gelu -> 4C (composed)", ms, fl(2 * BT * C * 4 * C, ms))
end
for _, vv in ipairs { V, 50304 } do
  local w = randn({ vv, C })
  local ms = time(function() return lt.matmul(x, w:t()) end)
  row(("matmul head to V=%d"):format(vv), ms, fl(2 * BT * C * vv, ms))
end

-- elementwise and reductions
local y = randn({ BT, C })
local ms = time(function() return x + y end)
row("add (BT, C)", ms, bw(3 * BT * C * esize, ms))
local h = randn({ BT, 4 * C })
ms = time(function() return F.gelu(h) end)
row("gelu (BT, 4C)", ms, bw(2 * BT * 4 * C * esize, ms))
ms = time(function() return h:sum(1) end)
row("bias gradient: sum over BT of (BT, 4C)", ms, bw(BT * 4 * C * esize, ms))
ms = time(function() return x:to("f32") end)
row(DT .. " -> f32 (BT, C)", ms, bw(BT * C * (esize + 4), ms))

-- norms, softmax, loss, embedding, attention: forward + backward
-- make() returns {params, f[, flops = {forward, forward+backward}]}: rows say
-- GB/s from bytes (the forward's) or TFLOP/s from flops
local function fwd_bwd(name, make, bytes)
  local ins = make()
  local f = ins.f
  local msf = time(function() return f() end)
  row(name .. " forward", msf, ins.flops and fl(ins.flops[1], msf) or bytes and bw(bytes, msf))
  local msb = time(function()
    for _, t in ipairs(ins.params) do t.grad = nil end
    f():sum():backward()
  end)
  row(name .. " forward+backward", msb, ins.flops and fl(ins.flops[2], msb))
end

fwd_bwd("layer_norm (BT, C)", function()
  local xx, w, b = randn({ BT, C }, true), randn({ C }, true), randn({ C }, true)
  return { params = { xx, w, b }, f = function() return F.layer_norm(xx, w, b) end }
end, 2 * BT * C * esize)
do -- the backward alone (dx with the weight and bias gradients: one pass over dy and x for C <= 768)
  local xx, w, b = randn({ BT, C }, true), randn({ C }, true), randn({ C }, true)
  local y, dy = F.layer_norm(xx, w, b), randn({ BT, C })
  local ms = time(function()
    xx.grad, w.grad, b.grad = nil, nil, nil
    y:backward(dy, { retain_graph = true })
  end)
  row("layer_norm (BT, C) backward", ms, bw(3 * BT * C * esize, ms))
end
fwd_bwd("softmax (B*NH*T, T)", function()
  local s = randn({ B * NH * T, T }, true)
  return { params = { s }, f = function() return F.softmax(s, -1) end }
end, 2 * B * NH * T * T * esize)
fwd_bwd("cross_entropy (BT, V)", function()
  local logits = randn({ BT, V }, true)
  local tgt = lt.randint(0, V, { BT }, { device = D })
  return { params = { logits }, f = function() return (F.cross_entropy(logits, tgt)) end }
end, BT * V * esize)
-- GPT-2's padded head and its loss: one op (the logits' gradient written over them in the forward) or two
local head_flops = 2 * BT * C * 50304
for _, way in ipairs {
  { "one op (F.linear_cross_entropy)", function(x, w, t) return F.linear_cross_entropy(x, w, t, { classes = V, count = false }) end },
  { "F.linear, F.cross_entropy", function(x, w, t) return F.cross_entropy(F.linear(x, w), t, { classes = V, count = false }) end },
} do
  fwd_bwd("head + loss (BT, C) x (50304, C), " .. way[1], function()
    -- (GPT-2's scales: a normalised x and N(0, 0.02) weights; unit weights would give logits of
    -- std 28 and denormal probabilities, which CPUs multiply slowly)
    local xx, w = randn({ BT, C }, true), (randn({ 50304, C }) * 0.02):detach():requires_grad_()
    local tgt = lt.randint(0, V, { BT }, { device = D })
    return { params = { xx, w }, f = function() return way[2](xx, w, tgt) end,
      flops = { head_flops, 3 * head_flops } }
  end)
end
fwd_bwd("embedding (V, C) with BT ids", function()
  local wte = randn({ V, C }, true)
  local ids = lt.randint(0, V, { BT }, { device = D })
  return { params = { wte }, f = function() return F.embedding(ids, wte) end }
end, 2 * BT * C * esize)
-- GPT-2's MLP, C -> 4C -> C: one F.mlp (the GELU's gradient and the first bias's inside the product,
-- DGELU_BGRAD) against two F.linear calls (a separate gelu_grad pass over (BT, 4C))
local mlp_flops = 2 * BT * C * 4 * C * 2
local function two_linears(x, w1, b1, w2, b2) return F.linear(F.linear(x, w1, b1, { activation = "gelu" }), w2, b2) end
for _, way in ipairs { { "one op (F.mlp)", F.mlp }, { "two F.linear", two_linears } } do
  fwd_bwd("MLP C -> 4C -> C, " .. way[1], function()
    local p = { randn({ BT, C }, true), randn({ 4 * C, C }, true), randn({ 4 * C }, true), randn({ C, 4 * C }, true),
      randn({ C }, true) }
    return { params = p, f = function() return way[2](unpack(p)) end, flops = { mlp_flops, 3 * mlp_flops } }
  end)
end
local attention_paths = {
  { "composed", { fused = false, library = false } },
  { "fused (lt_attention)", { fused = true, library = false } },
  { "library: cuDNN (lt_attention_library)", { library = true } },
}
for _, path in ipairs(attention_paths) do
  local name, o = path[1], path[2]
  local ok, err = pcall(fwd_bwd, ("causal attention (B, NH, T, 64), %s"):format(name), function()
    local q, k, v = randn({ B, NH, T, 64 }, true), randn({ B, NH, T, 64 }, true), randn({ B, NH, T, 64 }, true)
    -- FlashAttention-2's count: 4 B NH T^2 HS for the forward's two products, half of it under the
    -- causal mask; the backward 2.5 times the forward
    local fwd = 2 * B * NH * T * T * 64
    return { params = { q, k, v }, flops = { fwd, 3.5 * fwd },
      f = function() return F.scaled_dot_product_attention(q, k, v, { causal = true, fused = o.fused, library = o.library }) end }
  end)
  if not ok then print(("causal attention, %s: failed: %s"):format(name, tostring(err):gsub("\n.*", ""))) end
end
