-- tests/gpu/checks/nn.lua: the nn ops (lt.F) other than attention and
-- linear, forward and gradients, cuda against cpu: the norms (layer_norm,
-- rms_norm, their add_ forms; aligned and unaligned rows, the one-pass
-- backward), cross_entropy and linear_cross_entropy (padded heads, narrowed
-- logits, infinities and NaN), softmax and log_softmax, embedding, rope,
-- the activations and the scaled causal softmax.

local lt = require "lutra"
local C = require "tests.gpu.checks.harness"
local F = lt.F
local CUDA = C.CUDA
local check, close, grad_check = C.check, C.close, C.grad_check

grad_check("layer_norm (4096, 768) with weight and bias", { { shape = { 4096, 768 } }, { shape = { 768 } },
  { shape = { 768 } } }, function(x, w, b) return F.layer_norm(x, w, b) end, { gtol = 1e-4 })
grad_check("add_layer_norm (4096, 768): h and the norm of it", { { shape = { 4096, 768 } }, { shape = { 4096, 768 } },
  { shape = { 768 } }, { shape = { 768 } } }, function(x, r, w, b) return lt.stack({ F.add_layer_norm(x, r, w, b) }) end,
  { gtol = 1e-4 })
grad_check("add_rms_norm (2048, 1024) in bf16", { { shape = { 2048, 1024 }, dtype = "bf16" },
  { shape = { 2048, 1024 }, dtype = "bf16" }, { shape = { 1024 }, dtype = "bf16" } },
  function(x, r, w) return lt.stack({ F.add_rms_norm(x, r, w) }) end)
-- bf16 rows go to the kernels as they are (native_half_rows), statistics in f32
grad_check("add_layer_norm (8192, 768) in bf16, as GPT-2's blocks", { { shape = { 8192, 768 }, dtype = "bf16" },
  { shape = { 8192, 768 }, dtype = "bf16" }, { shape = { 768 }, dtype = "bf16" }, { shape = { 768 }, dtype = "bf16" } },
  function(x, r, w, b) return lt.stack({ F.add_layer_norm(x, r, w, b) }) end, { gtol = 2e-2 })
grad_check("cross_entropy (2048, 50304) on bf16 logits, count kept on the device", { { shape = { 2048, 50304 },
  dtype = "bf16" } }, function(x)
  local ids = {}
  for i = 1, 2048 do ids[i] = i % 7 == 0 and -100 or (i * 131) % 50257 end
  return F.cross_entropy(x, lt.tensor(ids, { dtype = "i64", device = x.device }), { count = false })
end)
grad_check("cross_entropy over GPT-2's padded head (2048, 50304), classes 50257, bf16", { { shape = { 2048, 50304 },
  dtype = "bf16" } }, function(x)
  local ids = {}
  for i = 1, 2048 do ids[i] = (i * 977) % 50257 end
  return F.cross_entropy(x, lt.tensor(ids, { dtype = "i64", device = x.device }), { classes = 50257, count = false })
end)
-- the head and its loss as one op: the loss and the logits' gradient in one kernel, written over the logits
grad_check("linear_cross_entropy over GPT-2's padded head (2, 64, 768) x (50304, 768), classes 50257, bf16",
  { { shape = { 2, 64, 768 }, dtype = "bf16" }, { shape = { 50304, 768 }, dtype = "bf16" } }, function(x, w)
    local ids = {}
    for i = 1, 128 do ids[i] = i % 9 == 0 and -100 or (i * 977) % 50257 end
    local t = lt.tensor(ids, { dtype = "i64", device = x.device }):view(2, 64)
    return F.linear_cross_entropy(x, w, t, { classes = 50257, count = false })
  end)
grad_check("linear_cross_entropy summed, rows off 16-byte boundaries (300, 40) x (1001, 40)",
  { { shape = { 300, 40 } }, { shape = { 1001, 40 } } }, function(x, w)
    local ids = {}
    for i = 1, 300 do ids[i] = i % 7 == 0 and -100 or (i * 31) % 1001 end
    return F.linear_cross_entropy(x, w, lt.tensor(ids, { dtype = "i64", device = x.device }), { reduction = "sum" })
  end, { gtol = 1e-4 })
grad_check("cross_entropy over narrowed logits, rows read where they lie (512, 1000 of 1024)", { { shape = { 512, 1024 } } },
  function(x)
    local ids = {}
    for i = 1, 512 do ids[i] = (i * 37) % 1000 end
    return F.cross_entropy(x:narrow(2, 1, 1000), lt.tensor(ids, { dtype = "i64", device = x.device }), { reduction = "none" })
  end)
grad_check("softmax (4096, 1024) in bf16", { { shape = { 4096, 1024 }, dtype = "bf16" } },
  function(x) return F.softmax(x, -1) end)
-- the norms read rows in 16-byte pieces where every row starts on a 16-byte boundary, else element by element
grad_check("layer_norm (257, 771): rows off 16-byte boundaries, element by element", { { shape = { 257, 771 } },
  { shape = { 771 } }, { shape = { 771 } } }, function(x, w, b) return F.layer_norm(x, w, b) end, { gtol = 1e-4 })
grad_check("add_rms_norm (130, 772) in bf16: rows of 1544 bytes, element by element", { { shape = { 130, 772 },
  dtype = "bf16" }, { shape = { 130, 772 }, dtype = "bf16" }, { shape = { 772 }, dtype = "bf16" } },
  function(x, r, w) return lt.stack({ F.add_rms_norm(x, r, w) }) end)
grad_check("layer_norm (64, 768) in bf16 without weight or bias, 16-byte pieces", { { shape = { 64, 768 },
  dtype = "bf16" } }, function(x) return F.layer_norm(x, nil, nil) end)
grad_check("add_layer_norm (40, 24) in f64: twelve pieces a row, most lanes idle", { { shape = { 40, 24 }, dtype = "f64" },
  { shape = { 40, 24 }, dtype = "f64" }, { shape = { 24 }, dtype = "f64" }, { shape = { 24 }, dtype = "f64" } },
  function(x, r, w, b) return lt.stack({ F.add_layer_norm(x, r, w, b) }) end)
grad_check("layer_norm of no rows: zero weight and bias gradients", { { shape = { 0, 64 } }, { shape = { 64 } },
  { shape = { 64 } } }, function(x, w, b) return F.layer_norm(x, w, b) end)
grad_check("rms_norm (2048, 1024)", { { shape = { 2048, 1024 } }, { shape = { 1024 } } },
  function(x, w) return F.rms_norm(x, w) end, { gtol = 1e-4 })
-- a norm's backward on aligned rows of at most 768 elements is one pass (dx and the blocks' weight
-- gradient sums, P pieces a lane, the block count from N alone), else dx then a pass for the weights
grad_check("layer_norm (9000, 64) in f16, one pass: a piece in 8 lanes, 256 blocks, the last ones without rows",
  { { shape = { 9000, 64 }, dtype = "f16" }, { shape = { 64 }, dtype = "f16" }, { shape = { 64 }, dtype = "f16" } },
  function(x, w, b) return F.layer_norm(x, w, b) end)
grad_check("add_rms_norm (1000, 512) in bf16, one pass: two pieces a lane", { { shape = { 1000, 512 }, dtype = "bf16" },
  { shape = { 1000, 512 }, dtype = "bf16" }, { shape = { 512 }, dtype = "bf16" } },
  function(x, r, w) return lt.stack({ F.add_rms_norm(x, r, w) }) end)
grad_check("layer_norm (3000, 512), one pass: four pieces a lane", { { shape = { 3000, 512 } }, { shape = { 512 } },
  { shape = { 512 } } }, function(x, w, b) return F.layer_norm(x, w, b) end, { gtol = 1e-4 })
grad_check("layer_norm (700, 768) in bf16, x without a gradient: the weights' pass alone",
  { { shape = { 700, 768 }, dtype = "bf16", grad = false }, { shape = { 768 }, dtype = "bf16" },
    { shape = { 768 }, dtype = "bf16" } }, function(x, w, b) return F.layer_norm(x, w, b) end)
check("a norm's one-pass backward repeats bit for bit", function()
  local x = lt.randn({ 5000, 768 }, { device = CUDA }):to("bf16"):requires_grad_()
  local w = lt.randn({ 768 }, { device = CUDA }):to("bf16"):requires_grad_()
  local b = lt.randn({ 768 }, { device = CUDA }):to("bf16"):requires_grad_()
  local dy = lt.randn({ 5000, 768 }, { device = CUDA }):to("bf16")
  local grads = {}
  for k = 1, 2 do
    x.grad, w.grad, b.grad = nil, nil, nil
    F.layer_norm(x, w, b):backward(dy)
    grads[k] = { x.grad:to("f32"), w.grad:to("f32"), b.grad:to("f32") }
  end
  for i, what in ipairs { "dx", "dw", "db" } do
    assert(grads[1][i]:ne(grads[2][i]):to("i64"):sum():item() == 0, what .. " differs between two runs")
  end
end, true)
grad_check("softmax (4096, 1024)", { { shape = { 4096, 1024 } } }, function(x) return F.softmax(x, -1) end)
grad_check("log_softmax (512, 50257)", { { shape = { 512, 50257 } } }, function(x) return F.log_softmax(x, -1) end)
grad_check("cross_entropy (1024, 50257) with ignored targets", { { shape = { 1024, 50257 } } }, function(x)
  local ids = {}
  for i = 1, 1024 do ids[i] = i % 3 == 0 and -100 or (i * 37) % 50257 end
  return (F.cross_entropy(x, lt.tensor(ids, { dtype = "i64", device = x.device })))
end, { gtol = 1e-4 })
-- the cross-entropy kernels read (and write) rows in 16-byte pieces where the rows are aligned, element by
-- element where not, and the piece holding the last class partly
grad_check("cross_entropy in bf16 on rows off 16-byte boundaries (256, 1000 from column 2 of 1024)",
  { { shape = { 256, 1024 }, dtype = "bf16" } }, function(x)
    local ids = {}
    for i = 1, 256 do ids[i] = (i * 41) % 1000 end
    return F.cross_entropy(x:narrow(2, 2, 1000), lt.tensor(ids, { dtype = "i64", device = x.device }), { reduction = "none" })
  end)
grad_check("cross_entropy, f32, classes 1003 of 1024: the last piece partly classes, partly padding",
  { { shape = { 256, 1024 } } }, function(x)
    local ids = {}
    for i = 1, 256 do ids[i] = i % 2 == 0 and 1002 or (i * 7) % 1003 end
    return F.cross_entropy(x, lt.tensor(ids, { dtype = "i64", device = x.device }), { classes = 1003, reduction = "none" })
  end, { gtol = 1e-4 })
check("cross_entropy with -inf, +inf and NaN logits: losses and gradients as the CPU's, NaN where it has NaN", function()
  for _, dt in ipairs { "f32", "bf16" } do
    local x = lt.randn({ 6, 1024 }):mul(4)
    x:narrow(1, 1, 1):narrow(2, 1, 300):fill_(-math.huge) -- some -inf, the row's maximum finite
    x:narrow(1, 2, 1):fill_(-math.huge)                    -- all -inf
    x:narrow(1, 3, 1):narrow(2, 700, 1):fill_(math.huge)   -- one +inf
    x:narrow(1, 4, 1):narrow(2, 5, 1):fill_(0 / 0)         -- one NaN
    x:narrow(1, 5, 1):narrow(2, 1020, 5):fill_(50)         -- the maximum in the last piece
    x:narrow(1, 6, 1):narrow(2, 1, 1):fill_(50)            -- the maximum first
    local c = x:to(dt):clone():requires_grad_()
    local g = x:to(dt):to(CUDA):detach():requires_grad_()
    local tgt = lt.tensor({ 350, 9, 700, 5, 1021, 1 }, "i64")
    local lc = F.cross_entropy(c, tgt, { reduction = "none" })
    local lg = F.cross_entropy(g, tgt:to(CUDA), { reduction = "none" })
    close(lg, lc, dt .. " losses")
    lc:sum():backward()
    lg:sum():backward()
    close(g.grad, c.grad, dt .. " gradients")
  end
end, true)
grad_check("embedding (50257, 768) with 8192 ids", { { shape = { 8192 }, ids = 50257 }, { shape = { 50257, 768 } } },
  function(ids, w) return F.embedding(ids, w) end)
grad_check("embedding with repeated ids adds deterministically", { { shape = { 4096 }, ids = 7 },
  { shape = { 7, 64 } } }, function(ids, w) return F.embedding(ids, w) end, { gtol = 1e-5 })
grad_check("rope (4, 12, 1024, 64)", { { shape = { 4, 12, 1024, 64 } } }, function(x) return F.rope(x) end)
for _, dt in ipairs { "bf16", "f16" } do
  grad_check(("rope (2, 4, 100, 64) on %s rows read as they are, from position 7, base 500"):format(dt),
    { { shape = { 2, 4, 100, 64 }, dtype = dt } }, function(x) return F.rope(x, { start = 7, base = 500 }) end)
end
grad_check("gelu, silu and swiglu (1024, 3072)", { { shape = { 1024, 3072 } }, { shape = { 1024, 3072 } } },
  function(a, b) return F.gelu(a) + F.silu(b) + F.swiglu(a, b) end)
grad_check("scaled causal softmax (2, 12, 256, 300): keys after a cache", { { shape = { 2, 12, 256, 300 } } },
  function(x) return F.scaled_softmax(x, 0.125, { causal = true }) end)
check("softmax, log_softmax and the scaled causal softmax with -inf, NaN and fully masked rows, as the CPU's", function()
  for _, dt in ipairs { "f32", "bf16" } do
    local x = lt.randn({ 24, 40 }):mul(3)
    x:narrow(1, 1, 1):narrow(2, 1, 30):fill_(-math.huge) -- some -inf
    x:narrow(1, 2, 1):fill_(-math.huge)                   -- all -inf
    x:narrow(1, 3, 1):narrow(2, 17, 1):fill_(0 / 0)       -- a NaN
    x:narrow(1, 4, 1):fill_(0 / 0)                        -- all NaN
    x:narrow(1, 5, 1):narrow(2, 39, 2):fill_(40)          -- the maximum in the last piece
    local function run(f, name)
      local c = x:to(dt):clone():requires_grad_()
      local g = x:to(dt):to(CUDA):detach():requires_grad_()
      local yc, yg = f(c), f(g)
      local function finite(t) return t:detach():masked_fill(t:eq(-math.huge), -1e4) end -- (-inf where both have it)
      close(finite(yg), finite(yc), ("%s %s"):format(dt, name))
      local w = lt.randn(yc:shape()):to(dt)
      ;(yc:masked_fill(yc:ne(yc), 0) * w):sum():backward()
      ;(yg:masked_fill(yg:ne(yg), 0) * w:to(CUDA)):sum():backward()
      close(g.grad, c.grad, ("%s %s gradient"):format(dt, name))
    end
    run(function(t) return F.softmax(t, -1) end, "softmax")
    run(function(t) return F.log_softmax(t, -1) end, "log_softmax")
    -- 24 queries over 40 keys, and over 16 (the first 8 rows see nothing)
    run(function(t) return F.scaled_softmax(t:view(1, 1, 24, 40), 0.5, { causal = true }) end, "scaled causal softmax")
    run(function(t) return F.scaled_softmax(t:narrow(2, 1, 16):contiguous():view(1, 1, 24, 16), 0.5, { causal = true }) end,
      "scaled causal softmax, 8 rows fully masked")
  end
end, true)
