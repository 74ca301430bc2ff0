-- tests/gpu/checks/device.lua: the device itself: build info, copies between
-- cpu and cuda, pinned uploads, memory statistics, out of memory, mixing
-- devices, the CUDA-event profile, device names; errors found on the device
-- (bad indices at the next read), cross_entropy's count kept on the device,
-- and the generator drawing the CPU's numbers.

local lt = require "lutra"
local H = require "tests.lua.helpers"
local C = require "tests.gpu.checks.harness"
local F = lt.F
local CUDA, on_cuda, ndev = C.CUDA, C.on_cuda, C.ndev
local check, close, pair = C.check, C.close, C.pair

check("build info lists cuda:0 and a tensor lives there", function()
  assert(lt.build_info():find("cuda:0", 1, true))
  local t = lt.zeros({ 2, 3 }, { device = CUDA })
  assert(t.device == "cuda:0", t.device)
  assert(t:sum():item() == 0)
  assert(tostring(t):find("device=cuda:0", 1, true), tostring(t))
end, true)

check("copies between cpu and cuda keep values, strides and dtypes", function()
  local c = lt.arange(24):reshape(2, 3, 4):to("f32")
  local g = c:to(CUDA)
  close(g, c, "round trip")
  close(c:transpose(1, 3):to(CUDA), c:transpose(1, 3), "transposed to cuda")
  close(g:transpose(1, 3):contiguous(), c:transpose(1, 3):contiguous(), "transposed on cuda")
  local gd = lt.zeros({ 4, 3, 2 }, { device = CUDA })
  gd:copy_(c:transpose(1, 3))
  close(gd, c:transpose(1, 3):contiguous(), "copy_ from cpu into cuda")
  for _, dt in ipairs { "f64", "bf16", "f16", "i8", "u8", "i32", "i64", "bool" } do
    close(g:to(dt), c:to(dt), "f32 -> " .. dt)
    close(g:to(dt):to("f32"), c:to(dt):to("f32"), dt .. " -> f32")
  end
end)

check("small uploads go through pinned slots without waiting and keep their values", function()
  local ts = {}
  for i = 1, 100 do ts[i] = lt.tensor({ i, i + 1, i + 2 }, { dtype = "f32", device = CUDA }) end -- more than the 16 slots
  for i = 1, 100 do assert(ts[i]:sum():item() == 3 * i + 3, "upload " .. i) end
  if on_cuda then
    local host = lt.arange(1000):to("f32")
    local d = host:to(CUDA)
    host:fill_(0) -- the host buffer may change as soon as the call returns
    assert(d:sum():item() == 499500)
  end
  local big = lt.ones({ 524288 }):to(CUDA) -- 2 MiB: the waiting path
  assert(big:sum():item() == 524288)
end)

check("memory_stats count live, reserved and peak bytes", function()
  collectgarbage()
  local before = lt.cuda.memory_stats()
  local t = lt.empty({ 1024, 1024 }, { device = CUDA })
  local mid = lt.cuda.memory_stats()
  assert(mid.allocated - before.allocated >= 4 * 1024 * 1024, "allocated did not grow by 4 MiB")
  assert(mid.reserved >= mid.allocated and mid.peak >= mid.allocated)
  t:free()
  local after = lt.cuda.memory_stats()
  assert(after.allocated == before.allocated, ("allocated %d after free, %d before"):format(after.allocated, before.allocated))
  assert(after.reserved >= mid.allocated - before.allocated, "a freed block should stay cached")
  lt.cuda.empty_cache()
  assert(lt.cuda.memory_stats().reserved == lt.cuda.memory_stats().allocated)
end, true)

check("out of memory is an error naming the bytes, and the device keeps working", function()
  local ok, err = pcall(lt.empty, { 1024, 1024, 1024, 1024 }, { device = CUDA }) -- 4 TiB of f32
  assert(not ok, "4 TiB should not fit")
  err = tostring(err)
  assert(err:find("out of memory", 1, true) and err:find("4398046511104 bytes", 1, true), err)
  assert(err:find("reserved", 1, true), err)
  local t = lt.ones({ 1000 }, { device = CUDA })
  assert(t:sum():item() == 1000)
end, true)

check("mixing devices in one op names both", function()
  local a, b = lt.ones(3), lt.ones({ 3 }, { device = CUDA })
  H.assert_error(function() return a + b end, "argument 1 on cpu, argument 2 on cuda:0", "different devices")
  H.assert_error(function() return lt.matmul(a:view(1, 3), b:view(3, 1)) end, "different devices")
  H.assert_error(function() return lt.where(a:gt(0), a, b) end, "where", "condition on cpu, other on cuda:0")
  -- where the C op's tensors are not the caller's arguments in order, they are named
  H.assert_error(function() return F.embedding(lt.tensor({ 1 }, "i64"), lt.ones({ 4, 2 }, { device = CUDA })) end,
    "embedding", "weight on cuda:0, ids on cpu")
  H.assert_error(function() return F.mlp(b:view(1, 3), lt.ones({ 4, 3 }, { device = CUDA }), nil, lt.ones(3, 4)) end,
    "mlp", "input on cuda:0, projection weight on cpu")
  -- backward's gradient on the other device: an error naming both (torch's rule), not a silent copy
  local w = lt.ones({ 3 }, { device = CUDA }):requires_grad_()
  H.assert_error(function() (w * 2):backward(lt.ones(3)) end, "backward", "gradient is on cpu", "cuda:0")
  ;(w * 2):backward(lt.ones({ 3 }, { device = CUDA, dtype = "f64" })) -- another dtype is converted
  assert(w.grad.device == "cuda:0" and w.grad:sum():item() == 6, "backward with an f64 gradient")
  -- a custom function's backward giving a gradient on the wrong device, and .grad set across devices
  local bad = lt.autograd.Function { forward = function(_, a) return a * 2 end,
    backward = function(_, g) return g:to("cpu") end }
  H.assert_error(function() bad(w):sum():backward() end, "gave input 1 a gradient on cpu for a tensor on cuda:0")
  H.assert_error(function() w.grad = lt.ones(3) end, "set_grad", "on cpu", "on cuda:0")
  -- moving between devices inside the graph still carries gradients back to where the leaf is
  local c = lt.ones({ 3 }):requires_grad_()
  ;(c:to(CUDA) * 3):sum():backward()
  assert(c.grad.device == "cpu" and c.grad:sum():item() == 9, "gradient through to()")
end, true)

check("the CUDA-event profile names each piece of work and times it", function()
  local x = lt.randn({ 256, 256 }, { device = CUDA })
  lt.cuda.synchronize()
  lt.cuda.profile_start()
  H.assert_error(function() lt.cuda.profile_start() end, "profiled already")
  local y = x
  for _ = 1, 3 do y = lt.matmul(y, x):tanh() end
  lt.cuda.profile_phase("reading")
  local s = y:sum():item() -- a copy to the host inside the profile
  local prof = lt.cuda.profile_stop()
  local rows, total = prof.rows, prof.total_ms
  assert(s == s, "the profiled work computed")
  local by = {}
  for _, r in ipairs(rows) do by[r.name] = r end
  local mm = by["cuBLASLt f32 256x256x256"]
  assert(mm and mm.calls == 3, "three products named by shape: " .. lt.cuda.profile_table(prof))
  assert(by["reading: copy to the host"] and by["reading: copy to the host"].calls == 1, "the read named, in its phase")
  local sum, calls = 0, 0
  for i, r in ipairs(rows) do
    assert(r.ms >= 0 and r.calls > 0, r.name)
    assert(i == 1 or rows[i - 1].ms >= r.ms, "largest first")
    sum, calls = sum + r.ms, calls + r.calls
  end
  assert(calls >= 3 + 3 + 1 + 1, "products, tanhs, the sum and the read: " .. calls)
  assert(math.abs(sum - total) <= 1e-3 * math.max(total, 1), ("pieces sum to the span: %g vs %g"):format(sum, total))
  assert(prof.dropped == 0)
  local text = lt.cuda.profile_table(prof, 2)
  assert(text:find(rows[1].name, 1, true) and text:find(rows[2].name, 1, true)
    and text:find(("(%d more)"):format(#rows - 2), 1, true), text)
  assert(text:find("total", 1, true) and text:find("phase reading", 1, true), text)
  lt.cuda.profile_start() -- a new profile starts without a phase
  local z = x + 1
  local again = lt.cuda.profile_stop()
  assert(#again.rows >= 1 and z:numel() == x:numel(), "the add timed")
  for _, r in ipairs(again.rows) do assert(not r.name:find("reading", 1, true), r.name) end
  H.assert_error(function() lt.cuda.profile_stop() end, "no profile is running")
end, true)

check("a device that does not exist is named with what was found", function()
  H.assert_error(function() return lt.zeros({ 2 }, { device = "cuda:" .. ndev }) end, "cuda:" .. ndev, "no such device")
end, true)

-- On CUDA the index checks of index_select, index_add_ and cross_entropy do
-- not wait for the device: the error comes at the next read from it.
local function fails_by_next_read(f, ...)
  H.assert_error(function()
    local r = f()
    if on_cuda then lt.cuda.synchronize() end
    return r
  end, ...)
end

check("bad indices are errors naming the index (on cuda at the next read), and nothing is written", function()
  local t = lt.arange(12):reshape(4, 3):to("f32"):to(CUDA)
  fails_by_next_read(function() return t:index_select(1, lt.tensor({ 0, 4 }, { dtype = "i64", device = CUDA })) end,
    "index_select", "index 4 (element 2")
  local before = t:clone()
  fails_by_next_read(function()
    t:index_add_(1, lt.tensor({ 1, -1 }, { dtype = "i64", device = CUDA }), lt.ones({ 2, 3 }, { device = CUDA }))
  end, "index_add_", "index -1")
  close(t, before:to("cpu"), "index_add_ left the target alone")
  fails_by_next_read(function() return F.embedding(lt.tensor({ 0, 9 }, { dtype = "i64", device = CUDA }), t) end,
    "embedding: index 9 (position 2 of the ids")
  fails_by_next_read(function()
    return F.cross_entropy(lt.randn(2, 5):to(CUDA), lt.tensor({ 1, 5 }, { dtype = "i64", device = CUDA }),
      { count = false })
  end, "target 5", "position 2")
  -- counted on the host, the targets are read at once
  H.assert_error(function()
    return F.cross_entropy(lt.randn(2, 5):to(CUDA), lt.tensor({ 1, 5 }, { dtype = "i64", device = CUDA }))
  end, "target 5", "position 2")
  -- an error is reported once; the device keeps working, and a bad index
  -- found by a later check surfaces there too
  if on_cuda then lt.cuda.synchronize() end
  assert(t:sum():item() == 66)
  if on_cuda then
    t:index_select(1, lt.tensor({ 7 }, { dtype = "i64", device = CUDA }))
    H.assert_error(function() return t:sum():item() end, "index 7", "found later")
    assert(t:sum():item() == 66)
    -- more checks in flight than the ring holds: the oldest are read as new ones start
    local ids = lt.tensor({ 0, 1 }, { dtype = "i64", device = CUDA })
    for _ = 1, 100 do t:index_select(1, ids) end
    lt.cuda.synchronize()
  end
end)

check("cross_entropy without the count: the mean divides on the device, gradients as with it", function()
  local x, y = pair({ 64, 50 })
  local tgt = {}
  for i = 1, 64 do tgt[i] = i % 5 == 0 and -100 or (i * 7) % 50 end
  local ct = lt.tensor(tgt, { dtype = "i64" })
  local gt = ct:to(CUDA)
  x:requires_grad_()
  y:requires_grad_()
  local lc, n = F.cross_entropy(x, ct)
  local lg = F.cross_entropy(y, gt, { count = false })
  assert(n == 52)
  close(lg, lc:detach(), "mean loss")
  lc:backward()
  lg:backward()
  close(y.grad, x.grad, "gradient")
  local all = lt.full({ 64 }, -100, { dtype = "i64", device = CUDA })
  assert(F.cross_entropy(y:detach(), all, { count = false }):item() == 0)
end)

check("the generator draws the same numbers on cuda as on the cpu", function()
  for _, dt in ipairs { "f32", "f64", "bf16" } do
    lt.manual_seed(1234)
    local c = lt.randn({ 1001 }, { dtype = dt })
    local cu = lt.rand({ 77 }, { dtype = dt })
    lt.manual_seed(1234)
    local g = lt.randn({ 1001 }, { dtype = dt, device = CUDA })
    local gu = lt.rand({ 77 }, { dtype = dt, device = CUDA })
    close(g, c, "randn " .. dt, dt == "f64" and 1e-14 or 1e-7)
    close(gu, cu, "rand " .. dt, 0)
  end
end)
