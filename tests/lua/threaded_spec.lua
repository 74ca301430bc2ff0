-- tests/lua/threaded_spec.lua: ops on tensors large enough to take the
-- OpenMP paths (over 32768 elements), checked element by element against
-- sums and products computed here in Lua (f64).
local lt = require "lutra"

local function close(a, b, tol) return math.abs(a - b) <= tol * (1 + math.abs(b)) end

describe("threaded kernels", function()
  lt.manual_seed(123)
  local R, C = 257, 301
  local a = lt.randn(R, C, { dtype = "f64" })
  local bt = lt.randn(C, R, { dtype = "f64" }):t() -- non-contiguous (R, C)
  local row = lt.randn(C, { dtype = "f64" })
  local A, B, V = a:totable(), bt:totable(), row:totable()

  it("elementwise with transposed and broadcast operands", function()
    local r = ((a * bt) + row):totable()
    for i = 1, R, 17 do
      for j = 1, C do
        assert(close(r[i][j], A[i][j] * B[i][j] + V[j], 1e-14), ("(%d,%d)"):format(i, j))
      end
    end
    local e = bt:exp():totable()
    for i = 1, R, 31 do
      for j = 1, C, 3 do assert(close(e[i][j], math.exp(B[i][j]), 1e-14)) end
    end
  end)
  it("reductions over rows, columns and everything", function()
    local rs, cs, all = a:sum(2):totable(), a:sum(1):totable(), a:sum():item()
    local total = 0
    for i = 1, R do
      local s = 0
      for j = 1, C do s = s + A[i][j] end
      total = total + s
      assert(close(rs[i], s, 1e-12))
    end
    for j = 1, C, 7 do
      local s = 0
      for i = 1, R do s = s + A[i][j] end
      assert(close(cs[j], s, 1e-12))
    end
    assert(close(all, total, 1e-12))
    local am = bt:argmax(2):totable()
    for i = 1, R, 13 do
      local best, bi = -math.huge, 0
      for j = 1, C do if B[i][j] > best then best, bi = B[i][j], j - 1 end end
      assert.are.equal(bi, am[i])
    end
  end)
  it("copies into bf16 and back", function()
    local h = bt:to("bf16"):to("f64"):totable()
    for i = 1, R, 11 do
      for j = 1, C do assert(close(h[i][j], B[i][j], 2 ^ -8)) end
    end
  end)
  it("gradient norms: every tail length and block edge, any thread count, bit for bit", function()
    -- (f64 sums in 8 lanes per 65536-element block: checked against Lua's own sum of squares)
    local threads = lt.num_threads()
    for _, n in ipairs { 1, 7, 8, 9, 15, 17, 65535, 65536, 65537, 200003 } do
      for _, dt in ipairs { "f32", "bf16", "f64" } do
        local g = lt.randn(n):to(dt)
        local p = lt.zeros(n, { dtype = dt }):requires_grad_()
        p.grad = g
        local v, want = g:to("f64"):totable(), 0
        for i = 1, n do want = want + v[i] * v[i] end
        want = math.sqrt(want)
        local norms = {}
        for k, t in ipairs { 1, threads } do
          lt.set_num_threads(t)
          norms[k] = lt.optim.grad_norm({ p })
        end
        lt.set_num_threads(threads)
        assert(close(norms[1], want, 1e-13), ("%s n=%d: %.17g, Lua %.17g"):format(dt, n, norms[1], want))
        assert.are.equal(norms[1], norms[2], ("%s n=%d: 1 thread and %d differ"):format(dt, n, threads))
      end
    end
  end)
  it("matmul of large operands", function()
    local m = lt.matmul(a, bt:t()):totable() -- (R, R)
    for _, ij in ipairs { { 1, 1 }, { 100, 7 }, { R, R }, { 5, 200 } } do
      local i, j = ij[1], ij[2]
      local s = 0
      for k = 1, C do s = s + A[i][k] * B[j][k] end
      assert(close(m[i][j], s, 1e-12))
    end
  end)
end)
