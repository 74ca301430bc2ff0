-- tests/lua/ref_nn_spec.lua: lt.F against PyTorch (tests/ref/nn.json, from
-- tests/ref/gen_nn.py): outputs, and the gradients of sum(output * w) for
-- every input that requires grad, in f32 and f64 (and bf16 forwards).
local lt = require "lutra"
local H = require "tests.lua.helpers"

local fixture = H.load_json("tests/ref/nn.json")
local F = lt.F

local RUN = require("tests.lua.runners").nn

describe("lt.F against PyTorch (" .. fixture.torch .. ")", function()
  for _, case in ipairs(fixture.cases) do
    it(case.name, function()
      local ins = {}
      for i, spec in ipairs(case.inputs) do
        ins[i] = H.from_flat(spec.values, spec.shape, spec.dtype)
        if spec.grad then ins[i]:requires_grad_() end
      end
      local out = RUN[case.op](case.args, unpack(ins, 1, #case.inputs))
      H.assert_matches(out, case.output, case.name .. " output", 4)
      local any = false
      for i, spec in ipairs(case.inputs) do any = any or spec.grad end
      if any then
        local w = H.from_flat(case.w.values, case.w.shape, case.w.dtype)
        ;(out * w):sum():backward()
        for i, spec in ipairs(case.inputs) do
          if spec.grad then
            assert(ins[i].grad, case.name .. ": no gradient for input " .. i)
            H.assert_matches(ins[i].grad, case.grads[i], case.name .. " grad " .. i, 10)
          end
        end
      end
    end)
  end
end)

describe("the fused attention against PyTorch (" .. fixture.torch .. ")", function()
  for _, case in ipairs(fixture.cases) do
    if case.op == "sdpa" then
      it(case.name, function()
        local ins = {}
        for i, spec in ipairs(case.inputs) do ins[i] = H.from_flat(spec.values, spec.shape, spec.dtype):requires_grad_() end
        local out = F.scaled_dot_product_attention(ins[1], ins[2], ins[3], { causal = case.args.causal, fused = true })
        H.assert_matches(out, case.output, case.name .. " output", 4)
        ;(out * H.from_flat(case.w.values, case.w.shape, case.w.dtype)):sum():backward()
        for i = 1, 3 do H.assert_matches(ins[i].grad, case.grads[i], case.name .. " grad " .. i, 10) end
      end)
    end
  end
end)

describe("lt.F edge cases", function()
  it("linear (lt_linear): finite differences with and without GELU and bias; any input layout; errors", function()
    local g = lt.Generator(11)
    local x = lt.randn({ 2, 3, 4 }, { dtype = "f64", generator = g }):requires_grad_()
    local w = lt.randn({ 5, 4 }, { dtype = "f64", generator = g }):requires_grad_()
    local b = lt.randn({ 5 }, { dtype = "f64", generator = g }):requires_grad_()
    for _, act in ipairs { "none", "gelu" } do
      lt.autograd.gradcheck(function(x, w, b) return F.linear(x, w, b, { activation = act }) end, { x, w, b })
      lt.autograd.gradcheck(function(x, w) return F.linear(x, w, nil, { activation = act }) end, { x, w })
    end
    -- a transposed input and a 1-D one give what matmul, add and gelu give
    local xt = lt.randn({ 4, 3 }, { dtype = "f64", generator = g }):t()
    local ref = (lt.matmul(xt, w:t()) + b):gelu()
    assert.are.equal(0, (F.linear(xt, w, b, { activation = "gelu" }) - ref):abs():max():item())
    local x1 = lt.randn({ 4 }, { dtype = "f64", generator = g })
    assert.are.same({ 5 }, F.linear(x1, w, b):shape())
    assert.are.equal("LinearGeluBackward", F.linear(x, w, b, { activation = "gelu" }).grad_fn)
    H.assert_error(function() F.linear(x, w, b, { activation = "relu" }) end, "activation must be 'none' or 'gelu'")
    H.assert_error(function() F.linear(x, w, nil, "gelu") end, "options table expected, got string")
    H.assert_error(function() F.cross_entropy(lt.randn(2, 3), lt.tensor({ 0, 1 }, "i64"), "sum") end,
      "options table expected")
    H.assert_error(function() F.linear(x:to("f32"), w, b) end, "the input is f32 and the weight f64")
    -- no input features: the bias in every row (and nn.Linear(0, n) starts with a zero bias)
    local y0 = F.linear(lt.randn({ 3, 0 }, { dtype = "f64" }), lt.randn({ 5, 0 }, { dtype = "f64" }), b)
    assert.are.same({ 3, 5 }, y0:shape())
    assert.are.equal(0, (y0 - b):abs():max():item())
    assert.are.equal(0, lt.nn.Linear(0, 5).bias:abs():max():item())
    H.assert_error(function() F.linear(x, lt.randn({ 5, 3 }, { dtype = "f64" }), b) end, "does not fit weight")
    H.assert_error(function() F.linear(x, w, lt.randn({ 4 }, { dtype = "f64" })) end, "bias must be a (5) tensor")
  end)

  it("mlp (lt_mlp): finite differences with and without biases; two F.linear calls bit for bit; errors", function()
    local g = lt.Generator(12)
    local function r(shape, dtype) return lt.randn(shape, { dtype = dtype or "f64", generator = g }) end
    local x, w1, b1, w2, b2 = r({ 2, 3, 6 }), r({ 10, 6 }), r({ 10 }), r({ 4, 10 }), r({ 4 })
    for _, t in ipairs { x, w1, b1, w2, b2 } do t:requires_grad_() end
    lt.autograd.gradcheck(function(x, w1, b1, w2, b2) return F.mlp(x, w1, b1, w2, b2) end, { x, w1, b1, w2, b2 })
    lt.autograd.gradcheck(function(x, w1, w2) return F.mlp(x, w1, nil, w2, nil) end, { x, w1, w2 })
    lt.autograd.gradcheck(function(x, b1, w2) return F.mlp(x, w1:detach(), b1, w2, nil) end, { x, b1, w2 })
    lt.autograd.gradcheck(function(w1, b2) return F.mlp(x:detach(), w1, nil, w2:detach(), b2) end, { w1, b2 })
    -- f32, a transposed input: the values and every gradient of gelu-linear then linear, exactly
    local function leaves(...)
      local out = {}
      for i, t in ipairs { ... } do out[i] = t:detach():clone():requires_grad_() end
      return out
    end
    local xt = r({ 6, 5 }, "f32"):t()
    local p = leaves(xt, w1:to("f32"), b1:to("f32"), w2:to("f32"), b2:to("f32"))
    local q = leaves(xt, w1:to("f32"), b1:to("f32"), w2:to("f32"), b2:to("f32"))
    local y1 = F.mlp(unpack(p))
    local y2 = F.linear(F.linear(q[1], q[2], q[3], { activation = "gelu" }), q[4], q[5])
    assert.are.equal("MlpBackward", y1.grad_fn)
    assert.are.equal(0, (y1 - y2):abs():max():item())
    local wy = r({ 5, 4 }, "f32")
    ;(y1 * wy):sum():backward()
    ;(y2 * wy):sum():backward()
    for i = 1, 5 do assert.are.equal(0, (p[i].grad - q[i].grad):abs():max():item(), "gradient " .. i) end
    -- no rows: an empty output, zero weight gradients and the bias's
    local x0 = r({ 0, 6 }):requires_grad_()
    local e = leaves(w1, b1, w2, b2)
    local y0 = F.mlp(x0, unpack(e))
    assert.are.same({ 0, 4 }, y0:shape())
    y0:sum():backward()
    assert.are.same({ 0, 6 }, x0.grad:shape())
    for i = 1, 4 do assert.are.equal(0, e[i].grad:abs():max():item()) end
    -- errors name the shapes, dtypes and which tensor, at the caller's line
    H.assert_error(function() F.mlp(r({ 2, 5 }), w1, b1, w2, b2) end, "mlp: input [2, 5] does not fit weight [10, 6]")
    H.assert_error(function() F.mlp(x, w1, b1, r({ 4, 9 }), b2) end,
      "mlp: first weight [10, 6] does not fit projection weight [4, 9] (out, in): its in must be 10")
    H.assert_error(function() F.mlp(x, w1, r({ 9 }), w2, b2) end, "mlp: bias [9] must be (10)")
    H.assert_error(function() F.mlp(x, w1, b1, w2, r({ 3 })) end, "mlp: projection bias [3] must be (4)")
    H.assert_error(function() F.mlp(x, w1, b1, w2:to("f32"), b2) end,
      "mlp: the input and the weights and biases must share one float dtype; the input is f64, the projection weight f32")
    local e = H.assert_error(function() F.mlp(x, w1, b1:to("f32"), w2, b2) end, "the first bias f32")
    assert(e:find("ref_nn_spec.lua", 1, true), "the error points at the caller: " .. e)
    H.assert_error(function() F.mlp(x, w1, b1, "w2", b2) end, "bad argument #4 to 'mlp' (tensor expected, got string)")
    H.assert_error(function() F.mlp(lt.tensor({ 1, 2 }, "i64"), w1, b1, w2, b2) end,
      "mlp: the input must be a float tensor, got i64")
    H.assert_error(function() F.mlp(x, r({ 2, 10, 6 }), b1, w2, b2) end, "mlp: weight [2, 10, 6] must be 2-D (out, in)")
    H.assert_error(function() F.mlp(r({}), w1, b1, w2, b2) end, "mlp: the input is a scalar")
  end)

  it("fused attention: a NaN score gives NaN, a -inf score weight 0 (as the composed path)", function()
    local q, k, v = lt.randn(1, 1, 2, 4), lt.randn(1, 1, 3, 4), lt.randn(1, 1, 3, 4)
    k:narrow(3, 3, 1):narrow(4, 2, 1):fill_(0 / 0)
    local o = F.scaled_dot_product_attention(q, k, v, { fused = true })
    assert(o:sum():item() ~= o:sum():item(), "NaN expected")
    local q1, k1, v1 = lt.tensor({ { { { 1e20 } } } }), lt.tensor({ { { { -1e20 }, { 1 } } } }), lt.tensor({ { { { 5 }, { 7 } } } })
    assert.are.equal(7, F.scaled_dot_product_attention(q1, k1, v1, { fused = true, scale = 1 }):item())
    assert.are.equal(7, F.scaled_dot_product_attention(q1, k1, v1, { fused = false, scale = 1 }):item())
    H.assert_error(function() F.scaled_dot_product_attention(q, k, v, { fused = true, scale = 1e300 }) end,
      "scale must be finite (in f32)")
    H.assert_error(function() F.scaled_dot_product_attention(q, k, v, { scale = "x" }) end, "scale must be a number")
    -- options: a table of known names (torch's is_causal would silently be non-causal)
    H.assert_error(function() F.scaled_dot_product_attention(q, k, v, { is_causal = true }) end,
      "scaled_dot_product_attention: unknown option 'is_causal' (known: causal, fused, library, scale)")
    H.assert_error(function() F.scaled_dot_product_attention(q, k, v, true) end, "options table expected, got boolean")
    H.assert_error(function() F.scaled_dot_product_attention(q, k, v, "causal") end, "options table expected, got string")
    H.assert_error(function() F.scaled_dot_product_attention(q, k, v, { fused = "yes" }) end, "fused must be true or false")
    H.assert_error(function() F.scaled_dot_product_attention(q, k:to("i32"), v) end,
      "scaled_dot_product_attention: k must be a float tensor, got i32")
    -- a softmax row of NaN is NaN, one of -inf zeros
    assert(F.softmax(lt.tensor { 0 / 0, 0 / 0 }, -1):totable()[1] ~= F.softmax(lt.tensor { 0 / 0, 0 / 0 }, -1):totable()[1])
    assert.are.same({ 0, 0 }, F.softmax(lt.tensor { -math.huge, -math.huge }, -1):totable())
  end)
  it("scaled_dot_product_attention: k and v of batch 1, a value head size of its own, clear shape messages", function()
    local g = lt.Generator(30)
    local q, k, v = lt.randn({ 2, 4, 3, 8 }, { generator = g }), lt.randn({ 1, 2, 5, 8 }, { generator = g }),
      lt.randn({ 1, 2, 5, 6 }, { generator = g })
    local o = F.scaled_dot_product_attention(q, k, v, { causal = true, fused = true })
    assert.are.same({ 2, 4, 3, 6 }, o:shape())
    -- the same as each batch row with its own copy of k and v
    local kk, vv = k:expand(2, 2, 5, 8):contiguous(), v:expand(2, 2, 5, 6):contiguous()
    local ref = F.scaled_dot_product_attention(q, kk, vv, { causal = true })
    assert((o - ref):abs():max():item() < 1e-6)
    H.assert_error(function() F.scaled_dot_product_attention(q, k, lt.randn(1, 2, 4, 6)) end,
      "k and v have different heads or lengths")
    H.assert_error(function() F.scaled_dot_product_attention(q, lt.randn(1, 3, 5, 8), lt.randn(1, 3, 5, 8)) end,
      "K/V heads must divide the query heads")
    H.assert_error(function() F.scaled_dot_product_attention(q, lt.randn(3, 2, 5, 8), lt.randn(3, 2, 5, 8)) end,
      "batch")
    H.assert_error(function() F.scaled_softmax(lt.randn(2, 2), 1, true) end, "options must be a table")
  end)
  it("add_*_norm: h.grad after retain_grad is the whole gradient of h; norm modules take the residual", function()
    local x, res = lt.randn(3, 4, "f64"):requires_grad_(), lt.randn(3, 4, "f64"):requires_grad_()
    local h, y = F.add_rms_norm(x, res)
    h:retain_grad()
    ;(h * 2 + y * y * y):sum():backward()
    local x2, r2 = x:detach():requires_grad_(), res:detach():requires_grad_()
    local h2 = x2 + r2
    h2:retain_grad()
    local y2 = F.rms_norm(h2)
    ;(h2 * 2 + y2 * y2 * y2):sum():backward()
    assert((h.grad - h2.grad):abs():max():item() < 1e-12)
    local ln = lt.nn.LayerNorm(4, { dtype = "f64" })
    local hh, yy = ln(x:detach(), res:detach())
    assert((yy - F.layer_norm(hh, ln.weight, ln.bias)):abs():max():item() < 1e-12)
    -- a block whose norm is swapped for one without the fused form adds the residual itself
    local m = lt.models.gpt2 { n_layer = 1, n_head = 2, n_embd = 8, block_size = 8, vocab_size = 16, generator = lt.Generator(1) }
    local ids = lt.tensor({ { 1, 2, 3 } }, "i64")
    local before = m(ids)
    local Plain = lt.nn.Module:extend("PlainLayerNorm")
    function Plain:init(inner) self.inner = inner end
    function Plain:forward(t) return self.inner(t) end
    m.transformer.h[1].ln_2 = Plain(m.transformer.h[1].ln_2)
    assert((m(ids) - before):abs():max():item() < 1e-6)
  end)
  it("fused attention: finite differences (causal, grouped-query, queries after a cache, more queries than keys)", function()
    local g = lt.Generator(21)
    local function r(shape) return lt.randn(shape, { generator = g, dtype = "f64" }):requires_grad_() end
    for _, c in ipairs { { 2, 4, 2, 5, 5, true }, { 1, 2, 1, 3, 7, true }, { 1, 2, 2, 6, 4, true }, { 2, 2, 2, 4, 6, false } } do
      local B, NH, NKV, T, S, causal = unpack(c)
      local q, k, v = r { B, NH, T, 8 }, r { B, NKV, S, 8 }, r { B, NKV, S, 8 }
      lt.autograd.gradcheck(function(q, k, v)
        return F.scaled_dot_product_attention(q, k, v, { causal = causal, fused = true })
      end, { q, k, v })
    end
  end)
  it("fused attention equals the composed one (matmul, scaled_softmax, matmul) in f32, outputs and gradients", function()
    local g = lt.Generator(22)
    local function r(shape) return lt.randn(shape, { generator = g }) end
    local q0, k0, v0 = r { 2, 6, 33, 16 }, r { 2, 3, 40, 16 }, r { 2, 3, 40, 16 }
    local w = r { 2, 6, 33, 16 }
    local outs, grads = {}, {}
    for _, fused in ipairs { true, false } do
      local q, k, v = q0:clone():requires_grad_(), k0:clone():requires_grad_(), v0:clone():requires_grad_()
      local o = F.scaled_dot_product_attention(q, k, v, { causal = true, fused = fused })
      ;(o * w):sum():backward()
      outs[#outs + 1], grads[#grads + 1] = o, { q.grad, k.grad, v.grad }
    end
    assert((outs[1] - outs[2]):abs():max():item() < 1e-5, "outputs differ")
    for j = 1, 3 do assert((grads[1][j] - grads[2][j]):abs():max():item() < 1e-4, "gradient " .. j .. " differs") end
    -- head sizes over the fused kernel's run composed
    local big = F.scaled_dot_product_attention(r { 1, 1, 3, 300 }, r { 1, 1, 3, 300 }, r { 1, 1, 3, 300 },
      { fused = true })
    assert.are.same({ 1, 1, 3, 300 }, big:shape())
    H.assert_error(function() F.scaled_dot_product_attention(r { 1, 2, 3, 8 }, r { 1, 2, 3, 8 }:to("f64"),
      r { 1, 2, 3, 8 }, { fused = true }) end, "attention", "convert them to one dtype")
  end)
  it("add_layer_norm and add_rms_norm: finite differences through h, y or both; bad arguments named", function()
    local g = lt.Generator(12)
    local function r(shape) return lt.randn(shape, { generator = g, dtype = "f64" }):requires_grad_() end
    local x, res, w, b = r { 2, 3, 6 }, r { 2, 3, 6 }, r { 6 }, r { 6 }
    lt.autograd.gradcheck(function(x, res, w, b) return lt.stack({ F.add_layer_norm(x, res, w, b) }) end, { x, res, w, b })
    lt.autograd.gradcheck(function(x, res, w) return lt.stack({ F.add_rms_norm(x, res, w) }) end, { x, res, w })
    -- only y used, only h used
    lt.autograd.gradcheck(function(x, res, w) return select(2, F.add_layer_norm(x, res, w)) end, { x, res, w })
    lt.autograd.gradcheck(function(x, res) return (F.add_rms_norm(x, res)) end, { x, res })
    -- a residual that needs no gradient
    local c = lt.randn({ 2, 3, 6 }, { generator = g, dtype = "f64" })
    lt.autograd.gradcheck(function(x) return lt.stack({ F.add_layer_norm(x, c) }) end, { x })
    H.assert_error(function() F.add_layer_norm(lt.randn(2, 6), lt.randn(3, 6)) end, "add_layer_norm",
      "residual has shape [3, 6], the input [2, 6]")
    H.assert_error(function() F.add_rms_norm(lt.randn(2, 6), lt.randn(2, 6, "f64")) end, "residual is f64")
    H.assert_error(function() F.add_layer_norm(lt.randn(2, 6), nil) end, "add_layer_norm")
    H.assert_error(function() F.add_layer_norm(lt.randn(2, 6), lt.randn(2, 6), lt.randn(5)) end, "the weight")
    -- 16-bit rows: the norm reads h as stored (x + res rounded), exactly as x + res and then the norm
    for _, dt in ipairs { "bf16", "f16" } do
      local x16 = lt.tensor({ { 10000, 10000, 10000 }, { 1, -2, 3 } }):to(dt)
      local r16 = lt.tensor({ { 1, 2, 3 }, { 0.5, 0.25, -4 } }):to(dt)
      local h, y = F.add_layer_norm(x16, r16)
      assert.are.equal(0, (h:to("f64") - (x16 + r16):to("f64")):abs():max():item())
      assert.are.equal(0, (y:to("f64") - F.layer_norm(x16 + r16):to("f64")):abs():max():item())
      local _, yr = F.add_rms_norm(x16, r16)
      assert.are.equal(0, (yr:to("f64") - F.rms_norm(x16 + r16):to("f64")):abs():max():item())
    end
  end)
  it("scaled_softmax: finite differences in f64, masked entries 0, bad arguments named", function()
    local x = lt.randn({ 2, 4, 6 }, { generator = lt.Generator(8), dtype = "f64" }):requires_grad_()
    for _, causal in ipairs { false, true } do
      lt.autograd.gradcheck(function(t) return F.scaled_softmax(t, 0.7, { causal = causal }) end, { x })
    end
    local y = F.scaled_softmax(x, 0.7, { causal = true })
    -- query 1 of 4 over 6 keys sees keys 1..3
    assert.are.same({ 0, 0, 0 }, y:select(2, 1):select(1, 1):narrow(1, 4, 3):totable())
    -- a query whose visible scores are all NaN: NaN there, its masked keys still 0 (as cuDNN's)
    local z = lt.zeros({ 4, 6 })
    z:select(1, 2):fill_(0 / 0)
    local row = F.scaled_softmax(z, 1, { causal = true }):select(1, 2):totable()
    for c = 1, 4 do assert.is_true(row[c] ~= row[c], "visible NaN") end
    assert.are.same({ 0, 0 }, { row[5], row[6] })
    H.assert_error(function() F.scaled_softmax(lt.randn(5), 1, { causal = true }) end, "scaled_softmax",
      "causal mask needs (..., queries, keys)")
    H.assert_error(function() F.scaled_softmax(lt.randn(2, 2), 0 / 0) end, "scale must be finite")
    H.assert_error(function() F.scaled_softmax(lt.randn(2, 2), "x") end, "scale must be a number")
    H.assert_error(function() F.scaled_softmax(lt.zeros({ 2, 2 }, "i64"), 1) end, "float")
  end)
  it("a fully masked softmax row gives zeros and zero gradients", function()
    local x = lt.tensor({ { -math.huge, -math.huge }, { 0, 1 } }, "f64"):requires_grad_()
    local y = F.softmax(x, -1)
    assert.are.same({ 0, 0 }, y:select(1, 1):totable())
    y:sum():backward()
    assert.are.same({ 0, 0 }, x.grad:select(1, 1):totable())
  end)
  it("cross_entropy with every target ignored is 0 with zero gradients", function()
    local x = lt.randn(3, 5):requires_grad_()
    local loss, n = F.cross_entropy(x, lt.tensor({ -100, -100, -100 }, "i64"))
    assert.are.equal(0, n)
    assert.are.equal(0, loss:item())
    loss:backward()
    assert.are.equal(0, x.grad:abs():sum():item())
  end)
  it("linear_cross_entropy: finite differences; F.cross_entropy of F.linear to rounding; counts, eval, errors", function()
    local g = lt.Generator(21)
    local function r(shape, dtype) return lt.randn(shape, { dtype = dtype or "f64", generator = g }) end
    local t = lt.tensor({ { 3, -100, 0 }, { 10, 5, 7 } }, "i64")
    local x, w = r({ 2, 3, 6 }):requires_grad_(), r({ 13, 6 }):requires_grad_()
    for _, red in ipairs { "mean", "sum" } do
      lt.autograd.gradcheck(function(x, w) return F.linear_cross_entropy(x, w, t, { reduction = red }) * 1.7 end,
        { x, w })
    end
    lt.autograd.gradcheck(function(x, w) return F.linear_cross_entropy(x, w, t, { classes = 11, count = false }) end,
      { x, w })
    lt.autograd.gradcheck(function(w) return F.linear_cross_entropy(x:detach(), w, t) end, { w })
    lt.autograd.gradcheck(function(x) return F.linear_cross_entropy(x, w:detach(), t) end, { x })
    -- against the two ops in f32 and bf16, outputs, counts and gradients (one rounding more in bf16)
    for _, dt in ipairs { "f32", "bf16" } do
      local function leaves() return x:detach():to(dt):requires_grad_(), w:detach():to(dt):requires_grad_() end
      local x1, w1 = leaves()
      local x2, w2 = leaves()
      local l1, n1 = F.linear_cross_entropy(x1, w1, t)
      local l2, n2 = F.cross_entropy(F.linear(x2, w2), t)
      assert.are.equal("LinearCrossEntropyBackward", l1.grad_fn)
      assert.are.equal(n2, n1)
      assert.are.equal(5, n1)
      assert.is_true(math.abs(l1:item() - l2:item()) <= 1e-6 * math.abs(l2:item()))
      ;(l1 * 0.3):backward()
      ;(l2 * 0.3):backward()
      local tol = dt == "f32" and 1e-6 or 1e-2
      for _, p in ipairs { { x1.grad, x2.grad }, { w1.grad, w2.grad } } do
        assert.are.equal(dt, p[1].dtype)
        local scale = p[2]:to("f64"):abs():max():item()
        assert.is_true((p[1]:to("f64") - p[2]:to("f64")):abs():max():item() <= tol * scale)
      end
    end
    -- retain_graph: a second backward gives the same gradients (the saved gradient of the logits is not changed)
    local x3, w3 = x:detach():requires_grad_(), w:detach():requires_grad_()
    local l3 = F.linear_cross_entropy(x3, w3, t)
    l3:backward(nil, { retain_graph = true })
    local gx = x3.grad:clone()
    x3.grad = nil
    l3:backward(nil, { retain_graph = true })
    assert.are.equal(0, (x3.grad - gx):abs():max():item())
    -- no gradient wanted: the loss alone, no node
    local l4 = lt.no_grad(function() return F.linear_cross_entropy(x, w, t) end)
    assert.is_nil(l4.grad_fn)
    assert.are.equal(l3:item(), l4:item())
    -- every target ignored: 0 with zero gradients
    local x5, w5 = x:detach():requires_grad_(), w:detach():requires_grad_()
    local l5, n5 = F.linear_cross_entropy(x5, w5, lt.full({ 2, 3 }, -100, { dtype = "i64" }))
    assert.are.equal(0, n5)
    assert.are.equal(0, l5:item())
    l5:backward()
    assert.are.equal(0, x5.grad:abs():max():item())
    -- errors
    H.assert_error(function() F.linear_cross_entropy(x, w, t, { reduction = "none" }) end,
      "reduction must be 'mean' or 'sum'")
    H.assert_error(function() F.linear_cross_entropy(x, w, lt.tensor({ 1, 2, 3 }, "i64")) end,
      "linear_cross_entropy: targets [3] must have the input's leading dims, or be one row of 6 (input [2, 3, 6])")
    H.assert_error(function() F.linear_cross_entropy(x:to("i64"), w:to("i64"), t) end,
      "linear_cross_entropy: the input must be a float tensor, got i64")
    H.assert_error(function() F.linear_cross_entropy(x, r({ 13, 5 }), t) end,
      "linear_cross_entropy: input [2, 3, 6] does not fit weight [13, 5]")
    H.assert_error(function() F.linear_cross_entropy(x, w:to("f32"), t) end, "the weight f32")
    H.assert_error(function() F.linear_cross_entropy(x, w, lt.tensor({ { 3, 13, 0 }, { 1, 1, 1 } }, "i64")) end,
      "linear_cross_entropy", "target 13", "position 2")
    H.assert_error(function() F.linear_cross_entropy(x, w, t, { classes = 14 }) end,
      "classes 14 is outside [1, 13] (the weight's rows")
    -- targets flat, one per row, as F.cross_entropy takes them
    assert.are.equal(F.linear_cross_entropy(x, w, t):item(), F.linear_cross_entropy(x, w, t:reshape(-1)):item())
    -- f16 with a scaled-up loss (as mixed precision scales it): the logits' gradient is kept unscaled by
    -- the count, so the mean over many rows does not underflow in f16 before the scale applies
    local xs, ws = r({ 8192, 8 }), (r({ 64, 8 }) * 0.5):detach()
    local ts = lt.randint(0, 64, { 8192 }, { generator = g })
    local function xgrad(dt, fused)
      local a, b = xs:to(dt):detach():requires_grad_(), ws:to(dt):detach():requires_grad_()
      local l = fused and F.linear_cross_entropy(a, b, ts) or F.cross_entropy(F.linear(a, b), ts)
      ;(l * 8192):backward()
      return a.grad:to("f64") / 8192
    end
    local ref = xgrad("f64", true)
    local function rel(dt, fused) return ((xgrad(dt, fused) - ref):abs() / ref:abs()):mean():item() end
    assert.is_true(rel("f16", true) < 1.5 * rel("f16", false) + 1e-4, ("f16 %g vs %g"):format(rel("f16", true),
      rel("f16", false)))
    H.assert_error(function() F.linear_cross_entropy(r({ 6 }), w, lt.tensor(1, "i64")) end, "needs rows")
    H.assert_error(function() F.linear_cross_entropy(x, w, t:to("f32")) end, "integer class ids")
  end)

  it("cross_entropy counts targets and rejects bad ones by position", function()
    local x = lt.randn(4, 5)
    local _, n = F.cross_entropy(x, lt.tensor({ 1, 2, -1, 4 }, "i64"), { ignore_index = -1 })
    assert.are.equal(3, n)
    H.assert_error(function() F.cross_entropy(x, lt.tensor({ 1, 5, 0, 0 }, "i64")) end,
      "cross_entropy", "target 5", "position 2")
    H.assert_error(function() F.cross_entropy(x, lt.tensor { 1, 2, 3, 4 }) end, "integer class ids", "f32")
    H.assert_error(function() F.cross_entropy(x, lt.tensor({ 1, 2 }, "i64")) end, "(N, V)")
    -- count = false: the loss alone (same value), and still the bad-target error
    local l1, n1 = F.cross_entropy(x, lt.tensor({ 1, 2, -1, 4 }, "i64"), { ignore_index = -1, count = false })
    assert.is_nil(n1)
    assert.are.equal(F.cross_entropy(x, lt.tensor({ 1, 2, -1, 4 }, "i64"), { ignore_index = -1 }):item(), l1:item())
    H.assert_error(function() F.cross_entropy(x, lt.tensor({ 1, 5, 0, 0 }, "i64"), { count = false }) end,
      "target 5", "position 2")
    H.assert_error(function() F.cross_entropy(x, lt.tensor({ 1, 2, 0, 0 }, "i64"), { count = 1 }) end,
      "count must be true or false")
    local l3, n3 = F.cross_entropy(lt.randn(2, 3, 5), lt.tensor({ { 1, 2, 3 }, { 0, 0, 0 } }, "i64"))
    assert.are.equal(6, n3)
    assert.are.equal(0, l3:dim())
  end)
  it("cross_entropy over padded logits (classes) and strided rows: the narrowed result, zero gradient in the pad", function()
    local g = lt.Generator(5)
    local tg = lt.tensor({ 1, 6, -100, 0, 3 }, "i64")
    local wide = lt.randn({ 5, 10 }, { dtype = "f64", generator = g }):requires_grad_()
    local ref = wide:detach():clone():requires_grad_()
    local lp = F.cross_entropy(wide, tg, { classes = 7 })
    local ln = F.cross_entropy(ref:narrow(2, 1, 7), tg) -- strided rows: read where they lie
    assert.are.equal(ln:item(), lp:item())
    lp:backward()
    ln:backward()
    assert.are.equal(0, (wide.grad - ref.grad):abs():max():item())
    assert.are.equal(0, wide.grad:narrow(2, 8, 3):abs():max():item())
    lt.autograd.gradcheck(function(x) return F.cross_entropy(x, tg, { classes = 7, reduction = "sum" }) end,
      { wide:detach():requires_grad_() })
    lt.autograd.gradcheck(function(x) return F.cross_entropy(x:narrow(2, 2, 7), tg, { reduction = "none" }) end,
      { wide:detach():requires_grad_() })
    H.assert_error(function() F.cross_entropy(wide, lt.tensor({ 1, 7, 0, 0, 0 }, "i64"), { classes = 7 }) end,
      "target 7", "position 2")
    H.assert_error(function() F.cross_entropy(wide, tg, { classes = 11 }) end, "classes 11 is outside [1, 10]")
    H.assert_error(function() F.cross_entropy(wide, tg, { classes = -1 }) end, "classes")
    H.assert_error(function() F.cross_entropy(wide, tg, { classes = 2.5 }) end, "classes")
  end)
  it("cross_entropy with a 3-D batch still counts and reshapes", function()
    local l3, n3 = F.cross_entropy(lt.randn(2, 3, 5), lt.tensor({ { 1, 2, 3 }, { 0, 0, 0 } }, "i64"))
    assert.are.equal(6, n3)
    assert.are.equal(0, l3:dim())
  end)
  it("embedding names the offending id and its position", function()
    local w = lt.randn(10, 4)
    H.assert_error(function() F.embedding(lt.tensor({ { 1, 2 }, { 3, 10 } }, "i64"), w) end,
      "embedding", "index 10", "position 4")
    assert.are.same({ 2, 2, 4 }, F.embedding(lt.tensor({ { 1, 2 }, { 3, 9 } }, "i32"), w):shape())
  end)
  it("dropout is reproducible, scaled, and the identity in eval mode", function()
    local x = lt.ones(1000)
    local a = F.dropout(x, 0.25, { generator = lt.Generator(7) })
    local b = F.dropout(x, 0.25, { generator = lt.Generator(7) })
    assert.are.same(a:totable(), b:totable())
    local kept = a:gt(0):to("f32"):sum():item()
    assert.is_true(kept > 700 and kept < 800)
    assert.is_true(math.abs(a:max():item() - 1 / 0.75) < 1e-6)
    assert.are.equal(x, F.dropout(x, 0.5, { training = false }))
    local xg = lt.randn(20, { dtype = "f64" }):requires_grad_()
    local g = lt.Generator(3)
    local st = g:state()
    assert(lt.autograd.gradcheck(function(v)
      g:set_state(st) -- the same mask on every evaluation
      return F.dropout(v, 0.3, { generator = g })
    end, { xg }))
  end)
  it("attention refuses heads that do not fit", function()
    H.assert_error(function()
      F.scaled_dot_product_attention(lt.randn(1, 3, 2, 4), lt.randn(1, 2, 2, 4), lt.randn(1, 2, 2, 4))
    end, "heads")
  end)
end)
