-- tests/gpu/checks/attention.lua: scaled_dot_product_attention on cuda
-- against the cpu: lutra's fused kernel, its tensor-core kernel (bf16/f16,
-- grouped-query, cached keys, masked rows, NaN, odd offsets), the composed
-- path, and cuDNN's attention (library_check; determinism, refusals and
-- their notes, the device description, f16), skipped where the emulator
-- was built without cuDNN's headers.

local lt = require "lutra"
local C = require "tests.gpu.checks.harness"
local F = lt.F
local CUDA, EMULATED = C.CUDA, C.EMULATED
local check, close, grad_check = C.check, C.close, C.grad_check

grad_check("fused attention, grouped-query, 128 queries after 64 cached keys (2, 8 / 2 heads, 64)",
  { { shape = { 2, 8, 128, 64 } }, { shape = { 2, 2, 192, 64 } }, { shape = { 2, 2, 192, 64 } } }, function(q, k, v)
  return F.scaled_dot_product_attention(q, k, v, { causal = true, fused = true })
end, { gtol = 1e-4 })
grad_check("fused causal attention (2, 12, 256, 64)", { { shape = { 2, 12, 256, 64 } }, { shape = { 2, 12, 256, 64 } },
  { shape = { 2, 12, 256, 64 } } }, function(q, k, v)
  return F.scaled_dot_product_attention(q, k, v, { causal = true, fused = true })
end, { gtol = 1e-4 })
-- fused attention on tensor cores (kernels/cuda/attention_mma.cu: bf16/f16, head sizes 32, 64 and 128) against
-- the cpu's fused rows on the same 16-bit values (outputs and gradients rounded to bf16/f16 on both)
grad_check("fused causal attention on tensor cores, bf16 (2, 4, 192, 64)", { { shape = { 2, 4, 192, 64 }, dtype = "bf16" },
  { shape = { 2, 4, 192, 64 }, dtype = "bf16" }, { shape = { 2, 4, 192, 64 }, dtype = "bf16" } }, function(q, k, v)
  return F.scaled_dot_product_attention(q, k, v, { causal = true, fused = true, library = false })
end)
grad_check("fused causal attention on tensor cores, bf16, heads read where they are in one qkv tensor (2, 64, 3 x 4 x 64)",
  { { shape = { 2, 64, 3 * 256 }, dtype = "bf16" } }, function(qkv)
  local function heads(x) return x:view(2, 64, 4, 64):transpose(2, 3) end
  local q, k, v = qkv:chunk(3, 3)
  local y = F.scaled_dot_product_attention(heads(q), heads(k), heads(v), { causal = true, fused = true, library = false })
  return y:transpose(2, 3):reshape(2, 64, 256)
end)
grad_check("fused attention on tensor cores, f16, grouped-query, 96 queries after 64 cached keys (1, 4 / 2 heads, 32)",
  { { shape = { 1, 4, 96, 32 }, dtype = "f16" }, { shape = { 1, 2, 160, 32 }, dtype = "f16" },
    { shape = { 1, 2, 160, 32 }, dtype = "f16" } }, function(q, k, v)
  return F.scaled_dot_product_attention(q, k, v, { causal = true, fused = true, library = false })
end)
grad_check("fused causal attention on tensor cores, bf16, head size 128, grouped-query (1, 4 / 2 heads, 100, 128)",
  { { shape = { 1, 4, 100, 128 }, dtype = "bf16" }, { shape = { 1, 2, 100, 128 }, dtype = "bf16" },
    { shape = { 1, 2, 100, 128 }, dtype = "bf16" } }, function(q, k, v)
  return F.scaled_dot_product_attention(q, k, v, { causal = true, fused = true, library = false })
end)
grad_check("fused attention on tensor cores, bf16, no mask, 100 queries over 130 keys (1, 2, 64)",
  { { shape = { 1, 2, 100, 64 }, dtype = "bf16" }, { shape = { 1, 2, 130, 64 }, dtype = "bf16" },
    { shape = { 1, 2, 130, 64 }, dtype = "bf16" } }, function(q, k, v)
  return F.scaled_dot_product_attention(q, k, v, { fused = true, library = false })
end)
check("fused attention on tensor cores: rows with no visible key give zeros, a NaN gives a NaN row, gradients repeat bit for bit", function()
  -- 100 queries over 40 keys, causal: the first 60 queries see nothing
  local q, k, v = lt.randn({ 1, 2, 100, 64 }):to("bf16"), lt.randn({ 1, 2, 40, 64 }):to("bf16"),
      lt.randn({ 1, 2, 40, 64 }):to("bf16")
  local w = lt.randn({ 1, 2, 100, 64 })
  local function run(dev, qq, grads)
    local a, b, c = qq:to(dev):detach():requires_grad_(grads), k:to(dev):detach():requires_grad_(grads),
        v:to(dev):detach():requires_grad_(grads)
    local y = F.scaled_dot_product_attention(a, b, c, { causal = true, fused = true, library = false })
    if grads then (y:to("f32") * w:to(dev)):sum():backward() end
    return y, a.grad, b.grad, c.grad
  end
  local y, dq, dk, dv = run(CUDA, q, true)
  local cy, cdq, cdk, cdv = run("cpu", q, true)
  close(y, cy, "output")
  assert(y:narrow(3, 1, 60):to("f32"):abs():max():item() == 0, "a query that sees no key should give zeros")
  close(dq, cdq, "dq")
  close(dk, cdk, "dk")
  close(dv, cdv, "dv")
  local _, dq2, dk2, dv2 = run(CUDA, q, true)
  for i, pair in ipairs({ { dq, dq2 }, { dk, dk2 }, { dv, dv2 } }) do
    assert((pair[1]:to("f32") - pair[2]:to("f32")):abs():max():item() == 0, "gradient " .. i .. " differs between two runs")
  end
  local qn = q:clone()
  qn:narrow(2, 1, 1):narrow(3, 70, 1):narrow(4, 5, 1):fill_(0 / 0) -- query 70 of head 1: a NaN row
  close(run(CUDA, qn, false), run("cpu", qn, false), "output with a NaN row")
end, true)
check("fused attention on tensor cores: a contiguous view at an odd offset is read from an aligned copy, a NaN gradient row reaches only the keys its query sees", function()
  local flat = lt.randn({ 3 * 64 * 64 + 1 }):to("bf16")
  local function cut(t, i) return t:narrow(1, 2 + (i - 1) * 64 * 64, 64 * 64):view(1, 1, 64, 64) end -- 2 bytes off
  local g = flat:to(CUDA)
  local y = F.scaled_dot_product_attention(cut(g, 1), cut(g, 2), cut(g, 3), { causal = true, fused = true, library = false })
  local cy = F.scaled_dot_product_attention(cut(flat, 1), cut(flat, 2), cut(flat, 3), { causal = true, fused = true })
  close(y, cy, "output from views 2 bytes off")
  local q, k, v = lt.randn({ 1, 1, 100, 64 }):to("bf16"), lt.randn({ 1, 1, 100, 64 }):to("bf16"),
      lt.randn({ 1, 1, 100, 64 }):to("bf16")
  local w = lt.randn({ 1, 1, 100, 64 })
  w:narrow(3, 50, 1):narrow(4, 3, 1):fill_(0 / 0) -- the gradient of query 50's output: NaN, so its D is NaN
  local function dk(dev)
    local a, b, c = q:to(dev):detach():requires_grad_(), k:to(dev):detach():requires_grad_(),
        v:to(dev):detach():requires_grad_()
    local o = F.scaled_dot_product_attention(a, b, c, { causal = true, fused = true, library = false })
    ;(o:to("f32") * w:to(dev)):sum():backward()
    return b.grad
  end
  -- (dv is NaN also for the keys query 50 does not see but shares a tile with: 0 * NaN in P^T dO, as documented)
  close(dk(CUDA), dk("cpu"), "dk with a NaN gradient row")
end, true)
grad_check("causal attention (2, 12, 256, 64)", { { shape = { 2, 12, 256, 64 } }, { shape = { 2, 12, 256, 64 } },
  { shape = { 2, 12, 256, 64 } } }, function(q, k, v)
  return F.scaled_dot_product_attention(q, k, v, { causal = true })
end, { gtol = 1e-4 })

--- cuDNN's attention (F.library_attention) on bf16 q, k, v against the CPU
-- in f32 from the same bf16 values: outputs and gradients within 2e-2 of
-- the largest value. q, k and v are cut from one (B, T, 3C) tensor as the
-- GPT-2 model does (strided, no copies) unless contiguous is set.
local function library_check(name, B, NH, NKV, T, S, HS, causal, opts)
  opts = opts or {}
  check(name, function()
    -- cuDNN 9.15 and older: no backward over a key count off a multiple of 128 (host/cuda/cudnn-attention.c)
    local refused = opts.refused or (S % 128 ~= 0 and (lt.cuda.cudnn_version() or 0) <= 91500)
    local function heads(x, H, L) return x:view(B, L, H, HS):transpose(2, 3) end
    local cq, ck, cv
    if opts.contiguous or NKV ~= NH or T ~= S then
      cq = lt.randn({ B, NH, T, HS }):to("bf16")
      ck, cv = lt.randn({ B, NKV, S, HS }):to("bf16"), lt.randn({ B, NKV, S, HS }):to("bf16")
    else
      local C = NH * HS
      local qkv = lt.randn({ B, T, 3 * C }):to("bf16")
      cq, ck, cv = heads(qkv:narrow(3, 1, C), NH, T), heads(qkv:narrow(3, C + 1, C), NH, T),
          heads(qkv:narrow(3, 2 * C + 1, C), NH, T)
    end
    local ins = {}
    local from_qkv = not opts.contiguous and NKV == NH and T == S
    for i, c in ipairs({ cq, ck, cv }) do
      ins[i] = { cpu = c:to("f32"):requires_grad_() }
      if not from_qkv then ins[i].gpu = c:detach():to(CUDA):requires_grad_() end
    end
    if from_qkv then -- keep the GPU operands strided as the model's
      local C = NH * HS
      local g = lt.cat({ cq:transpose(2, 3):reshape(B, T, C), ck:transpose(2, 3):reshape(B, T, C),
        cv:transpose(2, 3):reshape(B, T, C) }, 3):to(CUDA):requires_grad_()
      ins.qkv = g
    end
    local function gpu_qkv()
      if not ins.qkv then return ins[1].gpu, ins[2].gpu, ins[3].gpu end
      local C = NH * HS
      return heads(ins.qkv:narrow(3, 1, C), NH, T), heads(ins.qkv:narrow(3, C + 1, C), NH, T),
          heads(ins.qkv:narrow(3, 2 * C + 1, C), NH, T)
    end
    local co = F.scaled_dot_product_attention(ins[1].cpu, ins[2].cpu, ins[3].cpu, { causal = causal })
    local gq, gk, gv = gpu_qkv()
    local go = F.scaled_dot_product_attention(gq, gk, gv, { causal = causal })
    if refused then
      assert(go.grad_fn ~= "LibraryAttentionBackward", name .. ": cuDNN took a shape it should refuse")
    else
      assert(go.grad_fn == "LibraryAttentionBackward", ("%s: ran %s, not cuDNN"):format(name, tostring(go.grad_fn)))
    end
    close(go:to("f32"), co:detach(), name .. " output", 2e-2)
    local w = lt.randn(co:shape())
    ;(co * w):sum():backward()
    ;(go:to("f32") * w:to(CUDA)):sum():backward()
    if ins.qkv then
      local C = NH * HS
      local g = ins.qkv.grad
      for i = 1, 3 do
        local gi = heads(g:narrow(3, (i - 1) * C + 1, C), NH, T)
        close(gi:to("f32"), ins[i].cpu.grad, ("%s grad %d"):format(name, i), 2e-2)
      end
    else
      for i = 1, 3 do close(ins[i].gpu.grad:to("f32"), ins[i].cpu.grad, ("%s grad %d"):format(name, i), 2e-2) end
    end
  end, true, not opts.refused and "cuDNN" or nil)
end

library_check("cuDNN causal attention, GPT-2 124M's heads cut from qkv (2, 12, 1024, 64)", 2, 12, 12, 1024, 1024, 64,
  true)
library_check("cuDNN attention without a mask, contiguous (2, 8, 256, 128)", 2, 8, 8, 256, 256, 128, false,
  { contiguous = true })
library_check("cuDNN causal attention, grouped-query (2, 8 / 2 heads, 512, 64)", 2, 8, 2, 512, 512, 64, true)
library_check("cuDNN attention, 64 queries over 320 keys, no mask", 2, 4, 4, 64, 320, 64, false)
library_check("an odd head size (20) stays with lutra's attention", 2, 4, 4, 128, 128, 20, true,
  { refused = true })
check("cuDNN attention with lt.cuda.deterministic(true): gradients repeat bit for bit", function()
  lt.cuda.deterministic(true)
  local ok, err = pcall(function()
    local q = lt.randn({ 2, 8, 512, 64 }):to("bf16"):to(CUDA):requires_grad_()
    local grads = {}
    for r = 1, 2 do
      q.grad = nil
      local y = F.scaled_dot_product_attention(q, q, q, { causal = true })
      assert(y.grad_fn == "LibraryAttentionBackward", tostring(y.grad_fn))
      y:to("f32"):sum():backward()
      grads[r] = q.grad:to("f32")
    end
    assert((grads[1] - grads[2]):abs():max():item() == 0, "the two backwards differ")
    local qc = q:detach():to("cpu"):to("f32"):requires_grad_()
    F.scaled_dot_product_attention(qc, qc, qc, { causal = true }):sum():backward()
    -- (q.grad sums three bf16 gradients in bf16: 3e-2, where one gradient is held to 2e-2)
    close(grads[1]:to("cpu"), qc.grad, "deterministic dq+dk+dv", 3e-2)
  end)
  lt.cuda.deterministic(false)
  assert(ok, err)
end, true, "cuDNN")

check("lt.cuda.deterministic is read at the forward: the backward follows it (no f32 dQ accumulator)", function()
  local q = lt.randn({ 1, 4, 256, 64 }):to("bf16"):to(CUDA)
  -- the backward's peak over what is live before it: the non-deterministic
  -- graph adds an f32 (1, 4, 256, 64) dQ accumulator (256 KiB)
  local function backward_peak(forward_det, backward_det)
    local x = q:detach():requires_grad_()
    lt.cuda.deterministic(forward_det)
    local y = F.scaled_dot_product_attention(x, x, x, { causal = true })
    lt.cuda.deterministic(backward_det)
    assert(y.grad_fn == "LibraryAttentionBackward", tostring(y.grad_fn))
    local g = lt.ones(y:shape(), { dtype = "bf16", device = CUDA })
    lt.cuda.synchronize()
    local live = lt.cuda.memory_stats().allocated
    lt.cuda.reset_peak_memory_stats()
    y:backward(g)
    lt.cuda.synchronize()
    return lt.cuda.memory_stats().peak - live
  end
  local ok, err = pcall(function()
    local det, nondet = backward_peak(true, true), backward_peak(false, false)
    assert(nondet - det >= 4 * 256 * 256, ("the non-deterministic backward's peak %d is not above the deterministic's %d")
      :format(nondet, det))
    assert(backward_peak(true, false) == det, "deterministic forward, setting off at the backward: not deterministic")
    assert(backward_peak(false, true) == nondet, "setting on only at the backward changed the backward")
  end)
  lt.cuda.deterministic(false)
  assert(ok, err)
end, true, "cuDNN")

check("a cuDNN refusal is noted once per reason on stderr, not once per shape, and the fallback is right", function()
  local notes, stderr = {}, io.stderr
  io.stderr = { write = function(_, ...) notes[#notes + 1] = table.concat({ ... }) end }
  local ok, err = pcall(function()
    -- refused on any cuDNN: one query over one key (its backward); on 9.15 and older also keys off 128s
    local shapes = { { 2, 1, 1 }, { 3, 1, 1 } }
    if (lt.cuda.cudnn_version() or 0) <= 91500 then shapes = { { 1, 32, 32 }, { 1, 40, 40 }, { 2, 48, 48 } } end
    for _, sh in ipairs(shapes) do
      local q = lt.randn({ sh[1], 2, sh[2], 16 }):to("bf16")
      local g = q:to(CUDA):requires_grad_()
      local y = F.scaled_dot_product_attention(g, g, g, { causal = true })
      assert(y.grad_fn ~= "LibraryAttentionBackward", "cuDNN took it")
      local c = q:to("f32"):requires_grad_()
      close(y:to("f32"), F.scaled_dot_product_attention(c, c, c, { causal = true }):detach(), "fallback output", 2e-2)
    end
  end)
  io.stderr = stderr
  assert(ok, err)
  -- (none when an earlier check met the reason first)
  assert(#notes <= 1, ("%d notes: %s"):format(#notes, table.concat(notes, " | ")))
end, true, "cuDNN")

check("lt.cuda.cudnn_device_properties: cuDNN's description of the GPU (JSON), or a clear error where it has none", function()
  local ok, json = pcall(lt.cuda.cudnn_device_properties)
  if EMULATED then -- (the stand-in describes no device)
    assert(not ok and tostring(json):find("cuDNN did not describe the device", 1, true), tostring(json))
    return
  end
  assert(ok, json)
  local d = lt.json.decode(json)
  assert(type(d) == "table" and (d.multiProcessorCount or 0) > 0 and (d.deviceVer or 0) >= 900,
    "unexpected description: " .. json:sub(1, 300))
end, true, "cuDNN")

check("cuDNN attention in f16, and f32 stays with lutra's kernels", function()
  local q = lt.randn({ 1, 4, 128, 64 }):to("f16"):to(CUDA):requires_grad_()
  local y = F.scaled_dot_product_attention(q, q, q, { causal = true })
  assert(y.grad_fn == "LibraryAttentionBackward" and y.dtype == "f16", tostring(y.grad_fn))
  q = q:detach()
  local r = F.scaled_dot_product_attention(q:to("f32"):to("cpu"), q:to("f32"):to("cpu"), q:to("f32"):to("cpu"),
    { causal = true })
  close(y:to("f32"), r, "f16 output", 2e-2)
  local q32 = q:to("f32"):requires_grad_()
  assert(F.scaled_dot_product_attention(q32, q32, q32, { causal = true }).grad_fn ~= "LibraryAttentionBackward")
end, true, "cuDNN")
