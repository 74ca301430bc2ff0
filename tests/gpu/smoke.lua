-- tests/gpu/smoke.lua: the newest CUDA paths once each, small, printing what
-- ran: cuDNN attention (forward and backward, causal, from one qkv tensor),
-- lutra's tensor-core attention, cuBLASLt's bias/GELU epilogues, bf16 row kernels, the head and its
-- loss in one op, and a deferred index check. tests/gpu/run.sh runs it first, and again with cuDNN's and
-- cuBLASLt's own logs on when it fails. Exits 1 on the first failure.
local lt = require "lutra"
local F = lt.F
local n, why = lt.cuda.device_count()
if n == 0 then
  print(("skipped: no CUDA device (%s)"):format(why))
  return
end

local function step(name, fn)
  local ok, err = pcall(fn)
  print(("%s %s%s"):format(ok and "ok  " or "FAIL", name, ok and "" or (": " .. tostring(err))))
  if not ok then os.exit(1) end
end

step("cuDNN attention forward and backward (2, 4, 128, 64) bf16 causal, q/k/v cut from qkv", function()
  local B, T, NH, HS = 2, 128, 4, 64
  local qkv = lt.randn({ B, T, 3 * NH * HS }, { dtype = "bf16", device = "cuda" }):requires_grad_()
  local q, k, v = qkv:chunk(3, 3)
  local function heads(t) return t:view(B, T, NH, HS):transpose(2, 3) end
  local y = F.scaled_dot_product_attention(heads(q), heads(k), heads(v), { causal = true, library = true })
  assert(y.grad_fn == "LibraryAttentionBackward", tostring(y.grad_fn))
  y:to("f32"):sum():backward()
  lt.cuda.synchronize()
  local g = qkv.grad:to("f32"):abs():sum():item()
  assert(g == g and g > 0, "gradient " .. g)
end)

step("fused attention on tensor cores (2, 4, 128, 64) bf16 causal, against the row kernel in f32", function()
  local q = lt.randn({ 2, 4, 128, 64 }, { dtype = "bf16", device = "cuda" }):requires_grad_()
  local y = F.scaled_dot_product_attention(q, q, q, { causal = true, fused = true, library = false })
  y:to("f32"):sum():backward()
  local q32 = q:detach():to("f32")
  local ref = F.scaled_dot_product_attention(q32, q32, q32, { causal = true, fused = true })
  local err = (y:detach():to("f32") - ref):abs():max():item()
  assert(err < 0.05, "max error " .. err)
  local g = q.grad:to("f32"):abs():sum():item()
  assert(g == g and g > 0, "gradient " .. g)
end)

step("cuBLASLt epilogues: linear + bias + GELU (bf16) forward and backward", function()
  local x = lt.randn({ 256, 128 }, { dtype = "bf16", device = "cuda" }):requires_grad_()
  local w = lt.randn({ 512, 128 }, { dtype = "bf16", device = "cuda" }):requires_grad_()
  local b = lt.randn({ 512 }, { dtype = "bf16", device = "cuda" }):requires_grad_()
  local y = F.linear(x, w, b, { activation = "gelu" })
  y:to("f32"):sum():backward()
  local ref = (lt.matmul(x:detach(), w:detach():t()) + b:detach()):gelu()
  local err = (y:detach():to("f32") - ref:to("f32")):abs():max():item()
  assert(err < 0.1, "max error " .. err)
  assert(b.grad:to("f32"):abs():sum():item() > 0)
end)

step("bf16 layer_norm with the residual, and cross-entropy over padded logits", function()
  local x = lt.randn({ 64, 768 }, { dtype = "bf16", device = "cuda" })
  local h, y = F.add_layer_norm(x, x, lt.ones({ 768 }, { dtype = "bf16", device = "cuda" }))
  assert(h.dtype == "bf16" and y.dtype == "bf16")
  local logits = lt.randn({ 64, 256 }, { dtype = "bf16", device = "cuda" })
  local l = F.cross_entropy(logits, lt.randint(0, 200, { 64 }, { device = "cuda" }), { classes = 200, count = false })
  local v = l:item()
  assert(v == v and v > 0)
end)

step("the head and its loss in one op (bf16, padded head), its gradients against F.linear + F.cross_entropy", function()
  local x = lt.randn({ 2, 64, 128 }, { dtype = "bf16", device = "cuda" })
  local w = (lt.randn({ 320, 128 }, { device = "cuda" }) * 0.05):to("bf16")
  local t = lt.randint(0, 300, { 2, 64 }, { device = "cuda" })
  local grads = {}
  for k, f in ipairs { function(a, b) return F.linear_cross_entropy(a, b, t, { classes = 300, count = false }) end,
    function(a, b) return F.cross_entropy(F.linear(a, b), t, { classes = 300, count = false }) end } do
    local a, b = x:detach():requires_grad_(), w:detach():requires_grad_()
    f(a, b):backward()
    grads[k] = { a.grad:to("f32"), b.grad:to("f32") }
  end
  for i = 1, 2 do
    local err = (grads[1][i] - grads[2][i]):abs():max():item() / grads[2][i]:abs():max():item()
    assert(err < 0.02, ("gradient %d: relative error %g"):format(i, err))
  end
end)

step("a bad index is reported at the next read", function()
  local w = lt.randn({ 10, 4 }, { device = "cuda" })
  local e = F.embedding(lt.tensor({ 1, 12 }, { dtype = "i64", device = "cuda" }), w)
  local ok, err = pcall(function() return e:sum():item() end)
  assert(not ok and tostring(err):find("index 12", 1, true), tostring(err))
end)
