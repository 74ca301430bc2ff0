-- tests/lua/attention_library_spec.lua: library attention (lt_attention_library,
-- F.scaled_dot_product_attention{library = true}) through the CPU backend's f64
-- reference (kernels/cpu/sdpa_ref.c), which serves the interface cuDNN serves on
-- a GPU: operands read where they lie (heads cut from one qkv tensor), the output
-- and gradients laid out (B, T, heads, HS), the saved log-sum-exp stats, the
-- gradient of any layout, refusals. Values are checked against the composed path
-- (matmul, scaled_softmax, matmul) in f64 from the same 16-bit inputs.
local lt = require "lutra"
local H = require "tests.lua.helpers"
local F = lt.F

--- max |a - b| relative to max |b| (1 for an all-zero b)
local function rel(a, b)
  a, b = a:to("f64"), b:to("f64")
  local m = b:abs():max():item()
  return (a - b):abs():max():item() / (m > 0 and m or 1)
end

--- q, k, v (16-bit), either cut from one (B, T, 3 C) tensor as GPT-2 does or
-- separate, and their f64 leaves for the reference computation.
local function operands(B, NH, NKV, T, S, HS, dtype, opts)
  opts = opts or {}
  local g = lt.Generator(opts.seed or 7)
  local x = {}
  if opts.qkv then
    local C = NH * HS
    local off = opts.misalign and 1 or 0
    local base = lt.randn({ B, T, 3 * C + off }, { generator = g }):to(dtype):requires_grad_()
    local function heads(i)
      return base:narrow(3, off + i * C + 1, C):view(B, T, NH, HS):transpose(2, 3)
    end
    x.base, x.q, x.k, x.v = base, heads(0), heads(1), heads(2)
    if opts.chunk then -- as the GPT-2 block cuts them: gradients written side by side, passed on uncopied
      local q, k, v = base:chunk(3, 3)
      local function h(t) return t:view(B, T, NH, HS):transpose(2, 3) end
      x.q, x.k, x.v = h(q), h(k), h(v)
    end
  else
    x.q = lt.randn({ B, NH, T, HS }, { generator = g }):to(dtype):requires_grad_()
    x.k = lt.randn({ B, NKV, S, HS }, { generator = g }):to(dtype):requires_grad_()
    x.v = lt.randn({ B, NKV, S, HS }, { generator = g }):to(dtype):requires_grad_()
  end
  x.rq = x.q:detach():to("f64"):requires_grad_()
  x.rk = x.k:detach():to("f64"):requires_grad_()
  x.rv = x.v:detach():to("f64"):requires_grad_()
  return x
end

local function grads(x)
  if not x.base then return x.q.grad, x.k.grad, x.v.grad end
  local B, T, C = x.q:size(1), x.q:size(3), x.q:size(2) * x.q:size(4)
  local function heads(i) return x.base.grad:narrow(3, x.base:size(3) - 3 * C + i * C + 1, C) end
  local NH, HS = x.q:size(2), x.q:size(4)
  local function bhtd(t) return t:view(B, T, NH, HS):transpose(2, 3) end
  return bhtd(heads(0)), bhtd(heads(1)), bhtd(heads(2))
end

describe("library attention (CPU reference of the cuDNN interface)", function()
  local cases = {
    { "causal, heads cut from one qkv tensor by narrow", 2, 3, 3, 16, 16, 8, "bf16", true, { qkv = true } },
    { "causal, heads cut by qkv:chunk(3, 3) (as GPT-2): the gradients in one buffer", 2, 3, 3, 16, 16, 8, "bf16",
      true, { qkv = true, chunk = true } },
    { "causal, qkv at an address that is not 16-byte aligned (copied)", 1, 2, 2, 8, 8, 8, "bf16", true,
      { qkv = true, misalign = true } },
    { "grouped-query, more keys than queries, no mask", 2, 4, 2, 8, 12, 16, "bf16", false },
    { "f16, causal, grouped-query", 1, 4, 1, 10, 10, 8, "f16", true },
  }
  for _, c in ipairs(cases) do
    local name, B, NH, NKV, T, S, HS, dtype, causal, opts = unpack(c)
    it(name .. ": outputs and gradients match the composed path in f64", function()
      local x = operands(B, NH, NKV, T, S, HS, dtype, opts)
      local y = F.scaled_dot_product_attention(x.q, x.k, x.v, { causal = causal, library = true })
      assert.are.equal("LibraryAttentionBackward", y.grad_fn)
      assert.are.equal(dtype, y.dtype)
      assert.are.same({ B, NH, T, HS }, y:shape())
      -- laid out (B, T, NH, HS): the model's transpose back is free
      assert.is_true(y:transpose(2, 3):is_contiguous())
      local r = F.scaled_dot_product_attention(x.rq, x.rk, x.rv, { causal = causal })
      assert.is_true(rel(y, r) < 1e-2, "output")
      -- the gradient in the layout the model's reshape gives (no copy) ...
      local w = lt.randn({ B, T, NH * HS }, { generator = lt.Generator(3) })
      ;(y:transpose(2, 3):reshape(B, T, NH * HS):to("f64") * w:to("f64")):sum():backward()
      ;(r:transpose(2, 3):reshape(B, T, NH * HS) * w:to("f64")):sum():backward()
      local gq, gk, gv = grads(x)
      assert.is_true(rel(gq, x.rq.grad) < 2e-2, "dq")
      assert.is_true(rel(gk, x.rk.grad) < 2e-2, "dk")
      assert.is_true(rel(gv, x.rv.grad) < 2e-2, "dv")
    end)
  end

  it("a gradient in another layout is copied into the output's", function()
    local x = operands(2, 2, 2, 6, 6, 8, "bf16")
    local y = F.scaled_dot_product_attention(x.q, x.k, x.v, { causal = true, library = true })
    local r = F.scaled_dot_product_attention(x.rq, x.rk, x.rv, { causal = true })
    local w = lt.randn({ 2, 2, 6, 8 }, { generator = lt.Generator(5) }) -- contiguous (B, NH, T, HS)
    ;(y:to("f64") * w:to("f64")):sum():backward()
    ;(r * w:to("f64")):sum():backward()
    assert.is_true(rel(x.q.grad, x.rq.grad) < 2e-2)
    assert.is_true(rel(x.v.grad, x.rv.grad) < 2e-2)
  end)

  it("a second forward and backward agree bit for bit", function()
    local x = operands(1, 2, 2, 5, 5, 8, "bf16")
    local y1 = F.scaled_dot_product_attention(x.q, x.k, x.v, { causal = true, library = true })
    local y2 = F.scaled_dot_product_attention(x.q, x.k, x.v, { causal = true, library = true })
    assert.are.equal(0, (y1:to("f64") - y2:to("f64")):abs():max():item())
    y1:sum():backward()
    local g1 = x.q.grad:clone()
    x.q.grad = nil
    y2:sum():backward()
    assert.are.equal(0, (g1:to("f64") - x.q.grad:to("f64")):abs():max():item())
  end)

  it("a library that refuses its backward after the forward ran: lutra's kernel computes the gradients", function()
    local ffi = require "ffi"
    pcall(ffi.cdef, "int setenv(const char *, const char *, int); int unsetenv(const char *);")
    for _, c in ipairs { { true, false }, { false, true } } do
      local causal, chunked = c[1], c[2]
      local x = operands(2, 4, chunked and 4 or 2, 12, 12, 8, "bf16", { qkv = chunked, chunk = chunked })
      local y = F.scaled_dot_product_attention(x.q, x.k, x.v, { causal = causal, library = true })
      ffi.C.setenv("LUTRA_TEST_LIBRARY_BWD_REFUSES", "1", 1)
      local ok, err = pcall(function() y:to("f64"):sum():backward() end)
      ffi.C.unsetenv("LUTRA_TEST_LIBRARY_BWD_REFUSES")
      assert(ok, err)
      F.scaled_dot_product_attention(x.rq, x.rk, x.rv, { causal = causal }):sum():backward()
      local gq, gk, gv = grads(x)
      assert.is_true(rel(gq, x.rq.grad) < 2e-2, "dq")
      assert.is_true(rel(gk, x.rk.grad) < 2e-2, "dk")
      assert.is_true(rel(gv, x.rv.grad) < 2e-2, "dv")
    end
  end)

  it("records nothing under no_grad, and a changed input fails the backward", function()
    local x = operands(1, 2, 2, 4, 4, 8, "bf16")
    lt.no_grad(function()
      assert.is_nil(F.scaled_dot_product_attention(x.q, x.k, x.v, { library = true }).grad_fn)
    end)
    local y = F.scaled_dot_product_attention(x.q, x.k, x.v, { library = true })
    x.k:detach():add_(1)
    H.assert_error(function() y:sum():backward() end, "modified in place afterwards")
  end)

  it("refusals name what the library does not take", function()
    local q32 = lt.randn({ 1, 2, 4, 8 })
    H.assert_error(function() F.scaled_dot_product_attention(q32, q32, q32, { library = true }) end,
      "takes bf16 or f16, not f32")
    local q = lt.randn({ 1, 2, 4, 8 }):to("bf16")
    local k = lt.randn({ 1, 2, 6, 8 }):to("bf16")
    H.assert_error(function() F.scaled_dot_product_attention(q, k, k, { causal = true, library = true }) end,
      "as many queries as keys (4, 6)")
    local q4 = lt.randn({ 1, 2, 4, 4 }):to("bf16")
    H.assert_error(function() F.scaled_dot_product_attention(q4, q4, q4, { library = true }) end, "multiple of 8")
    H.assert_error(function() F.scaled_dot_product_attention(q, q, q, { library = 1 }) end,
      "library must be true or false")
    local k3 = lt.randn({ 1, 3, 4, 8 }):to("bf16")
    H.assert_error(function() F.scaled_dot_product_attention(q, k3, k3, { library = true }) end,
      "must divide the query heads")
    -- library = false and the CPU default take the composed path
    assert.are_not.equal("LibraryAttentionBackward",
      F.scaled_dot_product_attention(q:requires_grad_(), q, q, { library = false }).grad_fn)
    assert.are_not.equal("LibraryAttentionBackward", F.scaled_dot_product_attention(q, q, q).grad_fn)
  end)
end)
