-- tests/lua/matmul_spec.lua: the CPU's matrix-vector path (kernels/cpu/matmul.c:
-- one row or one column goes to gemv instead of gemm) against a product
-- summed elementwise in f64, in f32, f64 and bf16, at odd sizes, with
-- transposed, strided and padded operands, batched, 1-D, inside a Linear
-- layer and a one-token decoding step, and its backward by gradcheck.
local lt = require "lutra"
local F = lt.F

-- a (m, k) x b (k, n) without BLAS: sum over k of a[i, k] b[k, j], in f64
local function ref(a, b)
  a, b = a:to("f64"), b:to("f64")
  return (a:unsqueeze(3) * b:unsqueeze(1)):sum(2)
end

local function randn(shape, seed, dtype)
  return lt.randn(shape, { generator = lt.Generator(seed) }):to(dtype or "f32")
end

local TOL = { f32 = 1e-5, f64 = 1e-12, bf16 = 2e-2 }

-- the largest difference relative to the reference's largest magnitude
local function rel(got, want)
  return (got:to("f64") - want):abs():max():item() / math.max(want:abs():max():item(), 1e-30)
end

describe("matmul with one row or one column (gemv)", function()
  for _, dt in ipairs { "f32", "f64", "bf16" } do
    it(dt .. ": one row against a weight as it lies, transposed (a Linear's) or not", function()
      local k, n = 37, 53
      local x = randn({ 1, k }, 1, dt)
      local w = randn({ n, k }, 2, dt) -- (out, in): x w^T reads w transposed
      local b = randn({ k, n }, 3, dt)
      local cases = {
        { "x w^T", x, w:t() },
        { "x b", x, b },
        -- a weight with padded rows (leading dimension > its width)
        { "x w^T, padded", x, randn({ n, k + 7 }, 4, dt):narrow(2, 3, k):t() },
        { "x b, padded", x, randn({ k, n + 5 }, 5, dt):narrow(2, 2, n) },
        -- a strided row: a column of a matrix
        { "strided x", randn({ k, 3 }, 6, dt):select(2, 2):unsqueeze(1), w:t() },
        { "transposed x", randn({ k, 1 }, 7, dt):t(), b },
        -- k = 1 and n = 1
        { "k 1", randn({ 1, 1 }, 8, dt), randn({ 1, n }, 9, dt) },
        { "n 1", x, randn({ k, 1 }, 10, dt) },
      }
      for _, c in ipairs(cases) do
        local got = lt.matmul(c[2], c[3])
        assert.are.equal(dt, got.dtype)
        assert.are.same({ c[2]:size(1), c[3]:size(2) }, got:shape())
        local d = rel(got, ref(c[2], c[3]))
        assert(d < TOL[dt], ("%s: relative difference %g"):format(c[1], d))
      end
    end)

    it(dt .. ": one column, with the matrix as it lies or transposed", function()
      local m, k = 41, 29
      local a = randn({ m, k }, 11, dt)
      local cases = {
        { "a v", a, randn({ k, 1 }, 12, dt) },
        { "a^T v", randn({ k, m }, 13, dt):t(), randn({ k, 1 }, 14, dt) },
        { "a v, strided v", a, randn({ k, 2 }, 15, dt):narrow(2, 2, 1) }, -- row stride 2
        { "a padded", randn({ m, k + 3 }, 16, dt):narrow(2, 1, k), randn({ k, 1 }, 17, dt) },
      }
      for _, c in ipairs(cases) do
        local got = lt.matmul(c[2], c[3])
        assert.are.same({ m, 1 }, got:shape())
        local d = rel(got, ref(c[2], c[3]))
        assert(d < TOL[dt], ("%s: relative difference %g"):format(c[1], d))
      end
    end)

    it(dt .. ": 1-D operands and batches of single rows (attention's decoding step)", function()
      local k, n = 19, 23
      local v, mat = randn({ k }, 21, dt), randn({ k, n }, 22, dt)
      local got = lt.matmul(v, mat)
      assert.are.same({ n }, got:shape())
      assert(rel(got, ref(v:unsqueeze(1), mat):squeeze(1)) < TOL[dt], "vector @ matrix")
      local mv = lt.matmul(mat:t(), v)
      assert.are.same({ n }, mv:shape())
      assert(rel(mv, ref(mat:t(), v:unsqueeze(2)):squeeze(2)) < TOL[dt], "matrix @ vector")
      -- q (2, 3, 1, hs) against keys (2, 3, T, hs) transposed, then weights against values
      local q, K = randn({ 2, 3, 1, k }, 23, dt), randn({ 2, 3, n, k }, 24, dt)
      local s = lt.matmul(q, K:transpose(3, 4))
      assert.are.same({ 2, 3, 1, n }, s:shape())
      for i = 1, 2 do
        for j = 1, 3 do
          local d = rel(s:select(1, i):select(1, j), ref(q:select(1, i):select(1, j), K:select(1, i):select(1, j):t()))
          assert(d < TOL[dt], ("batch %d, %d: relative difference %g"):format(i, j, d))
        end
      end
    end)
  end

  it("a Linear layer on one token equals it on many (the gemm path)", function()
    local lin = lt.nn.Linear(65, 131, { generator = lt.Generator(31) })
    local xs = randn({ 1, 5, 65 }, 32)
    local all = lt.no_grad(function() return lin(xs) end) -- 5 rows: gemm
    for t = 1, 5 do
      local one = lt.no_grad(function() return lin(xs:narrow(2, t, 1)) end) -- 1 row: gemv
      local d = rel(one:select(2, 1), all:select(2, t):to("f64"))
      assert(d < 1e-5, ("token %d: relative difference %g"):format(t, d))
    end
  end)

  it("a GPT-2 decoding step through the cache equals the full forward", function()
    local model = lt.models.gpt2 { n_layer = 2, n_head = 3, n_embd = 48, block_size = 32, vocab_size = 101,
      generator = lt.Generator(33) }
    model:eval()
    local ids = lt.randint(0, 101, { 1, 9 }, { generator = lt.Generator(34) })
    local full = lt.no_grad(function() return model(ids) end)
    local kv = lt.models.KVCache(32)
    lt.no_grad(function() model(ids:narrow(2, 1, 8), kv) end)
    local last = lt.no_grad(function() return model(ids:narrow(2, 9, 1), kv) end)
    local d = rel(last:select(2, 1), full:select(2, 9):to("f64"))
    assert(d < 1e-5, ("relative difference %g"):format(d))
  end)

  it("backward of one-row and one-column products (gradcheck, f64)", function()
    local gc = lt.autograd.gradcheck
    local function r64(shape, seed) return randn(shape, seed, "f64"):requires_grad_() end
    assert(gc(function(x, w) return lt.matmul(x, w:t()) end, { r64({ 1, 7 }, 41), r64({ 5, 7 }, 42) }), "x w^T")
    assert(gc(function(x, b) return lt.matmul(x, b) end, { r64({ 1, 7 }, 43), r64({ 7, 5 }, 44) }), "x b")
    assert(gc(function(a, v) return lt.matmul(a, v) end, { r64({ 6, 7 }, 45), r64({ 7, 1 }, 46) }), "a v")
    assert(gc(function(x, w, b) return F.linear(x, w, b) end, { r64({ 1, 1, 7 }, 47), r64({ 5, 7 }, 48),
      r64({ 5 }, 49) }), "linear on one token")
  end)
end)
