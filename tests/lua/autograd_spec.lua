-- tests/lua/autograd_spec.lua: the autograd engine and the gradients of the
-- tensor core's ops. Every differentiable op is checked by gradcheck (f64
-- central differences) on random shapes, including transposed and broadcast
-- inputs; the engine's behaviour (accumulation, shared leaves, retain_graph,
-- hooks, no_grad, custom functions, errors) is checked directly.
local lt = require "lutra"
local H = require "tests.lua.helpers"
local gradcheck = lt.autograd.gradcheck

local function shape(...)
  local s = { ... }
  return type(s[1]) == "table" and s[1] or s
end
local function r64(...)
  return lt.randn(shape(...), { dtype = "f64" }):requires_grad_()
end
local function pos64(...)
  return (lt.rand(shape(...), { dtype = "f64" }) + 0.5):detach():requires_grad_()
end

describe("gradcheck of core ops", function()
  lt.manual_seed(2024)
  it("unary ops, contiguous and transposed", function()
    for _, op in ipairs { "neg", "abs", "exp", "tanh", "sigmoid" } do
      assert(gradcheck(function(x) return x[op](x) end, { r64(3, 4) }), op)
      local base = r64(4, 3)
      assert(gradcheck(function(x) return x:t()[op](x:t()) end, { base }), op .. " transposed")
    end
    for _, op in ipairs { "log", "sqrt", "rsqrt" } do
      assert(gradcheck(function(x) return x[op](x) end, { pos64(3, 4) }), op)
    end
  end)
  it("binary ops with broadcasting", function()
    for _, op in ipairs { "add", "sub", "mul", "div", "maximum", "minimum" } do
      assert(gradcheck(function(a, b) return a[op](a, b) end, { r64(3, 4), r64(3, 4) }), op)
      assert(gradcheck(function(a, b) return a[op](a, b) end, { r64(3, 1), r64(1, 4) }), op .. " (3,1)x(1,4)")
      assert(gradcheck(function(a, b) return a[op](a, b) end, { r64(4), r64(2, 3, 4) }), op .. " (4)x(2,3,4)")
      local bt = r64(4, 3)
      assert(gradcheck(function(a, b) return a[op](a, b:t()) end, { r64(3, 4), bt }), op .. " transposed")
    end
    assert(gradcheck(function(a, b) return a:pow(b) end, { pos64(3, 4), r64(3, 4) }), "pow")
    assert(gradcheck(function(a, b) return a:pow(b) end, { pos64(3, 1), r64(4) }), "pow broadcast")
    -- one operand without gradient
    assert(gradcheck(function(a) return a * lt.full({ 3, 4 }, 2, { dtype = "f64" }) end, { r64(3, 4) }))
  end)
  it("ops with a number", function()
    local cases = {
      function(x) return x + 2 end, function(x) return 2 - x end, function(x) return x * -1.5 end,
      function(x) return x / 3 end, function(x) return 3 / x end, function(x) return x ^ 3 end,
      function(x) return lt.pow(2, x) end, function(x) return lt.maximum(x, 0.1) end,
      function(x) return lt.minimum(x, 0.1) end,
    }
    for i, f in ipairs(cases) do assert(gradcheck(f, { pos64(2, 3) }), "case " .. i) end
  end)
  it("where and clamp", function()
    local c = lt.tensor({ { true }, { false }, { true } }, { dtype = "bool" })
    assert(gradcheck(function(a, b) return lt.where(c, a, b) end, { r64(3, 4), r64(4) }))
    assert(gradcheck(function(a) return lt.where(c, a, 0) end, { r64(3, 4) }))
    assert(gradcheck(function(a) return a:clamp(-0.5, 0.5) end, { r64(4, 5) }))
    assert(gradcheck(function(a) return a:clamp(nil, 0.2) end, { r64(4, 5) }))
    assert(gradcheck(function(a) return a:masked_fill(a:gt(0), 0) end, { r64(4, 5) }))
  end)
  it("reductions over dims, with and without keepdim", function()
    for _, op in ipairs { "sum", "mean", "max", "min", "var", "std" } do
      for _, dims in ipairs { false, 1, 2, -1, { 1, 3 } } do
        for _, keep in ipairs { false, true } do
          local d = dims or nil
          assert(gradcheck(function(x) return x[op](x, d, keep) end, { r64(3, 4, 5) }),
            ("%s %s %s"):format(op, tostring(d), tostring(keep)))
        end
      end
    end
    assert(gradcheck(function(x) return x:var(2, false, 0) end, { r64(3, 5) }), "var correction 0")
    local base = r64(5, 3)
    assert(gradcheck(function(x) return x:t():sum(2) end, { base }), "sum of a transposed view")
  end)
  it("matmul in every shape", function()
    local shapes = { { { 3, 4 }, { 4, 5 } }, { { 4 }, { 4 } }, { { 4 }, { 4, 2 } }, { { 3, 4 }, { 4 } },
      { { 2, 3, 4 }, { 4, 5 } }, { { 2, 1, 3, 4 }, { 3, 4, 2 } }, { { 5, 3, 4 }, { 4 } } }
    for _, sh in ipairs(shapes) do
      assert(gradcheck(function(a, b) return lt.matmul(a, b) end, { r64(sh[1]), r64(sh[2]) }),
        table.concat(sh[1], ",") .. " @ " .. table.concat(sh[2], ","))
    end
    local at, bt = r64(4, 3), r64(5, 4)
    assert(gradcheck(function(a, b) return lt.matmul(a:t(), b:t()) end, { at, bt }), "transposed operands")
  end)
  it("views and copies", function()
    local fs = {
      function(x) return x:view(4, 6) end, function(x) return x:reshape(-1) end,
      function(x) return x:transpose(1, 3):reshape(4, 6) end, function(x) return x:permute(3, 1, 2) end,
      function(x) return x:narrow(3, 2, 2) end, function(x) return x:select(2, 3) end,
      function(x) return x:select(1, -1) end, function(x) return x:unsqueeze(2):squeeze() end,
      function(x) return x:transpose(1, 2):contiguous() end, function(x) return x:clone() end,
      function(x) return x:flatten(2) end, function(x) return x:narrow(1, 1, 1):expand(5, 3, 4) end,
    }
    for i, f in ipairs(fs) do assert(gradcheck(f, { r64(2, 3, 4) }), "view " .. i) end
  end)
  it("index_select and gather", function()
    local idx = lt.tensor({ 2, 0, 2, 1 }, { dtype = "i64" })
    assert(gradcheck(function(w) return w:index_select(1, idx) end, { r64(3, 5) }))
    assert(gradcheck(function(w) return w:index_select(2, idx) end, { r64(5, 3) }))
    local g = lt.tensor({ { 0, 2 }, { 1, 1 }, { 2, 0 } }, { dtype = "i64" })
    assert(gradcheck(function(w) return w:gather(2, g) end, { r64(3, 4) }))
  end)
end)

describe("the autograd engine", function()
  it("sums gradients of a tensor used several times", function()
    local x = lt.tensor({ 1, 2, 3 }, "f64"):requires_grad_()
    local y = (x * x + x * 3 + x):sum() -- d/dx = 2x + 4
    y:backward()
    assert.are.same({ 6, 8, 10 }, x.grad:totable())
    -- and accumulates across backward calls
    ;(x * 2):sum():backward()
    assert.are.same({ 8, 10, 12 }, x.grad:totable())
    x.grad = nil
    assert.is_nil(x.grad)
  end)
  it("reduces broadcast gradients to the input's shape", function()
    local b = lt.zeros(4, { dtype = "f64" }):requires_grad_()
    local x = lt.ones(3, 4, { dtype = "f64" })
    ;(x + b):sum():backward()
    assert.are.same({ 3, 3, 3, 3 }, b.grad:totable())
  end)
  it("refuses a second backward unless retain_graph", function()
    local x = lt.tensor({ 1, 2 }, "f64"):requires_grad_()
    local y = (x:exp()):sum()
    y:backward { retain_graph = true }
    y:backward()
    H.assert_error(function() y:backward() end, "second time", "retain_graph")
  end)
  it("needs a gradient for non-scalar roots", function()
    local x = lt.tensor({ 1, 2 }, "f64"):requires_grad_()
    local y = x * 2
    H.assert_error(function() y:backward() end, "backward", "[2]")
    y:backward(lt.tensor({ 1, 10 }, "f64"))
    assert.are.same({ 2, 20 }, x.grad:totable())
    H.assert_error(function() y:backward(lt.ones(3, { dtype = "f64" })) end, "shape")
  end)
  it("records nothing under no_grad and for detached tensors", function()
    local x = lt.ones(2, { dtype = "f64" }):requires_grad_()
    local y = lt.no_grad(function() return x * 2 end)
    assert.is_false(y.requires_grad)
    assert.is_false(x:detach().requires_grad)
    assert.is_true(x:detach():shares_storage(x))
    H.assert_error(function() (x:detach() * 2):sum():backward() end, "does not require grad")
    assert.is_true(lt.autograd.is_grad_enabled())
  end)
  it("guards leaves and saved tensors against in-place changes", function()
    local x = lt.ones(2, { dtype = "f64" }):requires_grad_()
    H.assert_error(function() x:add_(1) end, "in place", "no_grad")
    lt.no_grad(function() x:add_(1) end)
    assert.are.same({ 2, 2 }, x:totable())
    local w = lt.ones(2, { dtype = "f64" })
    local y = (x * w):sum()
    w:mul_(3) -- w was saved by the product
    H.assert_error(function() y:backward() end, "modified in place")
    H.assert_error(function() (x * 2):add_(1) end, "in place")
    H.assert_error(function() lt.zeros({ 2 }, { dtype = "i64" }):requires_grad_() end, "float")
    H.assert_error(function() (x * 2):requires_grad_(false) end, "leaf")
  end)
  it("reports the op names of the graph", function()
    local x = lt.ones(2, { dtype = "f64" }):requires_grad_()
    assert.are.equal("MulBackward", (x * 2).grad_fn)
    assert.are.equal("MatmulBackward", lt.matmul(x, x).grad_fn)
    assert.is_nil(x.grad_fn)
    assert.is_true(x.is_leaf)
    assert.is_false((x + 1).is_leaf)
  end)
  it("keeps non-leaf gradients on request", function()
    local x = lt.tensor({ 1, 2 }, "f64"):requires_grad_()
    local h = (x * 3):retain_grad()
    ;(h * h):sum():backward()
    assert.are.same({ 6, 12 }, h.grad:totable())
    assert.are.same({ 18, 36 }, x.grad:totable())
  end)
  it("calls gradient-ready hooks once per leaf with the complete gradient", function()
    local w = lt.tensor({ 1, 2 }, "f64"):requires_grad_() -- used twice, as tied weights are
    local seen = {}
    w:register_hook(function(g) seen[#seen + 1] = g:totable() end)
    ;(w * 2 + w * 5):sum():backward()
    assert.are.same({ { 7, 7 } }, seen)
    local bad = lt.ones(1, { dtype = "f64" }):requires_grad_()
    bad:register_hook(function() error("hook failed on purpose") end)
    H.assert_error(function() (bad * 2):sum():backward() end, "hook failed on purpose")
  end)
  it("runs custom Lua functions", function()
    local Square = lt.autograd.Function {
      forward = function(ctx, x)
        ctx:save_for_backward(x)
        return x * x
      end,
      backward = function(ctx, g)
        local x = ctx.saved[1]
        return g * x * 2
      end,
    }
    local x = lt.tensor({ 1, 2, 3 }, "f64"):requires_grad_()
    local y = Square(x)
    assert.are.equal("CustomFunctionBackward", y.grad_fn)
    ;(y * 2):sum():backward()
    assert.are.same({ 4, 8, 12 }, x.grad:totable())
    assert(gradcheck(function(a) return Square(a) end, { lt.randn(3, { dtype = "f64" }):requires_grad_() }))
  end)
  it("keeps nothing of a custom function called under no_grad or on inputs without grad", function()
    local Keep = lt.autograd.Function {
      forward = function(ctx, x)
        ctx.big = lt.zeros(1024, 1024) -- 4 MiB a call, for a backward that never comes
        ctx.wanted = ctx.needs_input_grad[1]
        return x * 2
      end,
      backward = function(_, g) return g * 2 end,
    }
    local x = lt.ones(3):requires_grad_()
    local wanted = {}
    collectgarbage()
    collectgarbage()
    local before = lt.memory_stats().allocated
    for _ = 1, 10 do
      lt.no_grad(function() Keep(x) end)
      Keep(lt.ones(3))
    end
    collectgarbage()
    collectgarbage()
    assert.is_true(lt.memory_stats().allocated < before + 4 * 1024 * 1024,
      "the contexts of unrecorded calls were kept: " .. (lt.memory_stats().allocated - before) .. " bytes")
    local Probe = lt.autograd.Function {
      forward = function(ctx, a) wanted[#wanted + 1] = ctx.needs_input_grad[1]; return a * 1 end,
      backward = function(_, g) return g end,
    }
    lt.no_grad(function() Probe(x) end)
    Probe(x)
    assert.are.same({ false, true }, wanted)
  end)
  it("releases a long chain without exhausting the stack", function()
    local x = lt.ones(1, { dtype = "f64" }):requires_grad_()
    local y = x
    for _ = 1, 20000 do y = y * 1 end
    y:sum():backward()
    assert.are.same({ 1 }, x.grad:totable())
    y = nil
    collectgarbage()
  end)
end)

describe("gradient-ready hooks during backward", function()
  it("a leaf's gradient is ready as soon as its last contribution arrives, before earlier layers run", function()
    -- three layers; each layer's weight hook must fire before the layer below starts its backward
    local g = lt.Generator(3)
    local ws, events = {}, {}
    local function tap(i)
      return lt.autograd.Function {
        forward = function(_, x) return x end,
        backward = function(_, gx)
          events[#events + 1] = "backward into layer " .. i
          return gx
        end,
      }
    end
    local x = lt.randn({ 2, 4 }, { generator = g }):requires_grad_()
    for i = 1, 3 do
      ws[i] = lt.randn({ 4, 4 }, { generator = g }):requires_grad_()
      ws[i]:register_hook(function() events[#events + 1] = "weight " .. i .. " ready" end)
      x = tap(i)(x):matmul(ws[i]):tanh()
    end
    x:sum():backward()
    assert.are.same({ "weight 3 ready", "backward into layer 3", "weight 2 ready", "backward into layer 2",
      "weight 1 ready", "backward into layer 1" }, events)
  end)
end)


describe("lt.autograd.hook", function()
  it("passes tensors and their gradients through unchanged and runs before what produced them", function()
    local events = {}
    local x = lt.randn({ 3, 4 }, { generator = lt.Generator(1), dtype = "f64" }):requires_grad_()
    local y = lt.randn({ 3, 4 }, { generator = lt.Generator(2), dtype = "f64" }):requires_grad_()
    local h = lt.autograd.hook(function() events[#events + 1] = "hook" end)
    local tap = lt.autograd.Function {
      forward = function(_, a) return a end,
      backward = function(_, g) events[#events + 1] = "producer"; return g end,
    }
    local a, b = h(tap(x:tanh()), y * 2)
    local loss = (a * b):sum()
    loss:backward()
    assert.are.same({ "hook", "producer" }, events)
    local x2, y2 = x:detach():requires_grad_(), y:detach():requires_grad_()
    local ref = (x2:tanh() * (y2 * 2)):sum()
    ref:backward()
    assert.are.same(x2.grad:totable(), x.grad:totable())
    assert.are.same(y2.grad:totable(), y.grad:totable())
    H.assert_error(function() lt.autograd.hook(5) end, "expected a function")
  end)
end)
