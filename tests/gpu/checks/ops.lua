-- tests/gpu/checks/ops.lua: the core ops on fresh random inputs at training
-- sizes, cuda against cpu (f32 within 1e-5 relative to the largest value,
-- bf16/f16 within 1e-2): unary and binary ops with broadcasting and strides,
-- GELU far out, reductions, matmul (GPT-2's shapes, f64, TF32 when asked).
-- It seeds the generator (7) that the files after it draw from in turn.

local lt = require "lutra"
local C = require "tests.gpu.checks.harness"
local F = lt.F
local CUDA = C.CUDA
local check, close, pair = C.check, C.close, C.pair

lt.manual_seed(7)
for _, dt in ipairs { "f32", "bf16", "f16" } do
  check("unary ops on (1000, 1003) " .. dt, function()
    local c, g = pair({ 1000, 1003 }, dt)
    local cp, gp = pair({ 1000, 1003 }, dt, { positive = true })
    for _, op in ipairs { "neg", "abs", "exp", "tanh", "sigmoid", "sign" } do close(g[op](g), c[op](c), op) end
    for _, op in ipairs { "log", "sqrt", "rsqrt" } do close(gp[op](gp), cp[op](cp), op) end
    close(F.gelu(g), F.gelu(c), "gelu")
    close(F.silu(g), F.silu(c), "silu")
    close(F.relu(g), F.relu(c), "relu")
  end)
  check("gelu's gradient at huge |x| is 1 or 0, not NaN " .. dt, function()
    local x = lt.tensor({ 1e20, -1e20, 3e19, -3e19, 30, -30, 0 }):to(dt):to(CUDA):requires_grad_()
    F.gelu(x):sum():backward()
    local got = x.grad:to("cpu"):totable()
    for i, want in ipairs { 1, 0, 1, 0, 1, 0, 0.5 } do
      assert(got[i] == want, ("%s: gradient %d is %s, not %s"):format(dt, i, tostring(got[i]), want))
    end
  end)
  check("gelu and its gradient far out on the negative side keep their relative precision " .. dt, function()
    -- 1 + tanh u cancels there; both devices compute sigmoid(2u) from exp(-|2u|)
    local lo = dt == "f16" and -4.5 or -9 -- (f16's gelu underflows below about -4.5)
    local xs = lt.arange(0, 61, { dtype = "f64" }) * ((-3 - lo) / 60) + lo
    local x = xs:to(dt):to(CUDA):requires_grad_()
    local y = F.gelu(x)
    y:sum():backward()
    local x64 = x:detach():to("cpu"):to("f64"):requires_grad_()
    local y64 = F.gelu(x64)
    y64:sum():backward()
    local tol = dt == "f32" and 1e-5 or 2e-2
    for _, pair in ipairs { { y:detach(), y64:detach(), "gelu" }, { x.grad, x64.grad, "gradient" } } do
      local got, want = pair[1]:to("cpu"):to("f64"), pair[2]
      local rel = ((got - want):abs() / want:abs()):max():item()
      assert(rel <= tol, ("%s %s: relative error %.3g on [%g, -3]"):format(dt, pair[3], rel, lo))
    end
  end)
  check("binary ops with broadcasting and strides " .. dt, function()
    local ca, ga = pair({ 257, 1, 300 }, dt)
    local cb, gb = pair({ 1, 64, 300 }, dt)
    for _, op in ipairs { "add", "sub", "mul", "maximum", "minimum", "gt", "le", "eq" } do
      close(ga[op](ga, gb), ca[op](ca, cb), op)
    end
    local cp, gp = pair({ 300, 64 }, dt, { positive = true })
    close(ga / gp:t(), ca / cp:t(), "div by a transposed operand")
    close(gp ^ 1.7, cp ^ 1.7, "pow by a number")
    close(2 - ga, 2 - ca, "reversed scalar")
    close(ga:clamp(-0.5, 0.25), ca:clamp(-0.5, 0.25), "clamp")
    close(lt.where(ga:gt(0), ga, gb), lt.where(ca:gt(0), ca, cb), "where")
    close(ga:to("f32") + gb, ca:to("f32") + cb, "mixed dtypes promote")
  end)
end

check("reductions over rows, columns, several dims and everything (f32, bf16, i64)", function()
  for _, dt in ipairs { "f32", "bf16" } do
    local c, g = pair({ 300, 5000 }, dt)
    for _, d in ipairs { 1, 2 } do
      for _, op in ipairs { "sum", "mean", "max", "min", "argmax", "argmin" } do
        local cr, gr = c[op](c, d), g[op](g, d)
        close(gr, cr, ("%s %s dim %d"):format(dt, op, d), dt == "bf16" and 1e-2 or 1e-6)
      end
      close(g:var(d), c:var(d), dt .. " var dim " .. d, dt == "bf16" and 1e-2 or 1e-6)
      close(g:std(d, false, 0), c:std(d, false, 0), dt .. " std dim " .. d, dt == "bf16" and 1e-2 or 1e-6)
    end
    close(g:sum(), c:sum(), dt .. " sum of all", dt == "bf16" and 1e-2 or 1e-6)
    close(g:max(), c:max(), dt .. " max of all")
  end
  local c, g = pair({ 2, 1048576 }, "f32")
  close(g:sum(2), c:sum(2), "wide rows sum", 1e-6)
  close(g:argmax(2), c:argmax(2), "wide rows argmax")
  local c3, g3 = pair({ 16, 33, 129 }, "f32")
  close(g3:sum({ 1, 3 }), c3:sum({ 1, 3 }), "sum over dims 1 and 3", 1e-6)
  close(g3:transpose(1, 3):mean(2), c3:transpose(1, 3):mean(2), "mean of a transposed view", 1e-6)
  local ci = lt.randint(-1000, 1000, { 1000, 77 })
  close(ci:to(CUDA):sum(1), ci:sum(1), "i64 sum")
  close(ci:to(CUDA):max(2), ci:max(2), "i64 max")
end)

for _, dt in ipairs { "f32", "bf16", "f16" } do
  check("matmul shapes of GPT-2 training " .. dt, function()
    local tol = dt == "f32" and 1e-5 or 1e-2
    local ca, ga = pair({ 1024, 768 }, dt)
    local cw, gw = pair({ 3072, 768 }, dt)
    close(lt.matmul(ga, gw:t()), lt.matmul(ca, cw:t()), "x @ W^T", tol)
    close(lt.matmul(ga:t(), lt.matmul(ga, gw:t())), lt.matmul(ca:t(), lt.matmul(ca, cw:t())), "x^T @ dy", tol)
    local cq, gq = pair({ 4, 12, 256, 64 }, dt)
    local ck, gk = pair({ 4, 12, 256, 64 }, dt)
    close(lt.matmul(gq, gk:transpose(3, 4)), lt.matmul(cq, ck:transpose(3, 4)), "batched q @ k^T", tol)
    local cm, gm = pair({ 64, 64 }, dt)
    close(lt.matmul(gq, gm), lt.matmul(cq, cm), "batched @ shared matrix", tol)
    local cb, gb = pair({ 12, 64, 48 }, dt)
    close(lt.matmul(gq, cb:to(CUDA)), lt.matmul(cq, cb), "batch broadcast along the outer dim", tol)
    local cv, gv = pair({ 768 }, dt)
    close(lt.matmul(ga, gv), lt.matmul(ca, cv), "matrix @ vector", tol)
    close(lt.matmul(gv, gw:t()), lt.matmul(cv, cw:t()), "vector @ matrix", tol)
    local co, go = pair({ 7, 13 }, dt)
    local cn, gn = pair({ 13, 5 }, dt)
    close(lt.matmul(go:narrow(2, 2, 11), gn:narrow(1, 3, 11)), lt.matmul(co:narrow(2, 2, 11), cn:narrow(1, 3, 11)),
      "odd sizes and offsets", tol)
  end)
end

check("f64 matmul, and TF32 only when asked", function()
  local ca, ga = pair({ 300, 200 }, "f64")
  local cb, gb = pair({ 200, 100 }, "f64")
  close(lt.matmul(ga, gb), lt.matmul(ca, cb), "f64", 1e-12)
  local c32, g32 = pair({ 512, 512 }, "f32")
  local exact = lt.matmul(g32, g32)
  lt.cuda.allow_tf32(true)
  local fast = lt.matmul(g32, g32)
  lt.cuda.allow_tf32(false)
  close(exact, lt.matmul(c32, c32), "f32 without TF32", 1e-5)
  close(fast, lt.matmul(c32, c32), "f32 with TF32", 5e-3)
  -- TF32 keeps 10 mantissa bits of each input: the flag must reach the product
  assert((fast - exact):abs():max():item() > 0, "allow_tf32(true) changed no product")
end)
