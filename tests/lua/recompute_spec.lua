-- tests/lua/recompute_spec.lua: lt.checkpoint and the models' recompute
-- policies in one process: gradients through a checkpointed function equal
-- the direct ones bitwise and pass a finite-difference check (f64);
-- dropout replays its masks; GPT-2 and Llama with "full", "every:2" and
-- "selective" give the same loss and every gradient bitwise (dropout on),
-- and "full" keeps far less after the forward; bad uses raise naming what
-- is wrong. (Under DataParallel, ZeRO, TP and PP: tests/dist/recompute_spec.lua.)
local lt = require "lutra"
local H = require "tests.lua.helpers"

local function grads_of(model)
  local out = {}
  for _, np in ipairs(model:named_parameters()) do out[np[1]] = np[2].grad end
  return out
end

describe("lt.checkpoint", function()
  it("gives the direct gradients bitwise, and passes a finite-difference check in f64", function()
    local W = lt.randn({ 6, 5 }, { dtype = "f64", generator = lt.Generator(1) }):requires_grad_()
    local function f(x, y) return (x:matmul(W)):tanh() * y, (x * 2):sum(2) end
    local x = lt.randn({ 3, 6 }, { dtype = "f64", generator = lt.Generator(2) }):requires_grad_()
    local y = lt.randn({ 3, 5 }, { dtype = "f64", generator = lt.Generator(3) }):requires_grad_()
    local a, b = f(x, y)
    local direct = a:sum() + b:sum() * 3
    direct:backward()
    local gx, gy, gw = x.grad:clone(), y.grad:clone(), W.grad:clone()
    x.grad, y.grad, W.grad = nil, nil, nil
    local c, d = lt.checkpoint(f, x, y)
    local through = c:sum() + d:sum() * 3
    through:backward()
    for _, p in ipairs { { x.grad, gx, "x" }, { y.grad, gy, "y" }, { W.grad, gw, "W" } } do
      assert((p[1] - p[2]):abs():max():item() == 0, p[3] .. "'s gradient differs")
    end
    assert(lt.autograd.gradcheck(function(u, v) return lt.checkpoint(function(s, t) return (s:matmul(W)):tanh() * t end, u, v) end,
      { x:detach():requires_grad_(), y:detach():requires_grad_() }))
  end)

  it("replays dropout's masks in the recompute", function()
    local x = lt.randn({ 4, 32 }, { generator = lt.Generator(5) }):requires_grad_()
    local function f(t) return lt.F.dropout(t:exp(), 0.5, { training = true }) end
    lt.manual_seed(9)
    f(x):sum():backward()
    local g = x.grad:clone()
    x.grad = nil
    lt.manual_seed(9)
    local y = lt.checkpoint(f, x)
    lt.rand({ 100 }) -- (draws between the forward and the backward do not change the replay)
    y:sum():backward()
    assert((x.grad - g):abs():max():item() == 0, "the recompute drew other masks")
  end)

  it("reaches parameters when no input needs a gradient; passes through under no_grad", function()
    local lin = lt.nn.Linear(4, 3, { generator = lt.Generator(4) })
    local x = lt.randn({ 2, 4 }, { generator = lt.Generator(6) })
    lin(x):sum():backward()
    local g = lin.weight.grad:clone()
    lin.weight.grad = nil
    lt.checkpoint(lin, x):sum():backward()
    assert((lin.weight.grad - g):abs():max():item() == 0)
    local y = lt.no_grad(function() return lt.checkpoint(lin, x) end)
    assert(not y.requires_grad)
  end)

  it("refuses what it cannot do, naming it", function()
    H.assert_error(function() lt.checkpoint(42) end, "checkpoint: expected a function")
    local t = lt.ones({ 2 }):requires_grad_()
    H.assert_error(function() lt.checkpoint(function(...) return t end, t, t, t, t, t) end, "5 tensor arguments (at most 4)")
    H.assert_error(function() lt.checkpoint(function(a) return a, 3 end, t) end, "result 2 is a number")
    -- a weight used inside the function and outside it: its gradient would be lost, so backward refuses
    local w = lt.ones({ 2 }):requires_grad_()
    local z = lt.checkpoint(function(a) return a * w end, t) + w
    H.assert_error(function() z:sum():backward() end, "used both inside and outside an lt.checkpoint function")
    H.assert_error(function() lt.zeros({ 2, nil, 3 }) end, "shape")
    H.assert_error(function() lt.models.gpt2("gpt2-tiny", { recompute = "half" }) end,
      "gpt2: recompute must be none, full, selective or every:k")
  end)
end)

describe("recompute policies", function()
  local function run(make, name, policy)
    local gpt = make == lt.models.gpt2
    local m = make(name, { [gpt and "n_layer" or "n_layers"] = 4, generator = lt.Generator(3), recompute = policy,
      dropout = gpt and 0.1 or nil })
    local g = lt.Generator(9)
    local x = lt.randint(0, 512, { 2, 32 }, { generator = g, dtype = "i64" })
    local y = lt.randint(0, 512, { 2, 32 }, { generator = g, dtype = "i64" })
    lt.manual_seed(5)
    collectgarbage()
    local base = lt.memory_stats().allocated
    local l = m:loss(x, y)
    local kept = lt.memory_stats().allocated - base
    l:backward()
    return l:item(), grads_of(m), kept, m
  end

  for _, fam in ipairs { { lt.models.gpt2, "gpt2-tiny" }, { lt.models.llama, "llama-tiny" } } do
    it(fam[2] .. ": full, every:2 and selective give none's loss and gradients bitwise (dropout on)", function()
      local make, name = fam[1], fam[2]
      local l0, g0 = run(make, name, "none")
      for _, policy in ipairs { "full", "every:2", "selective" } do
        local l1, g1, _, m = run(make, name, policy)
        assert(l1 == l0, ("%s: loss %.9g vs %.9g"):format(policy, l1, l0))
        for k, g in pairs(g0) do assert((g - g1[k]):abs():max():item() == 0, policy .. ": " .. k .. " differs") end
        assert.are.equal(policy, m.recompute)
      end
    end)
  end

  it("full keeps no block's activations: what the forward leaves does not grow with the blocks (none's does)", function()
    local function kept(n_layer, policy)
      local m = lt.models.gpt2("gpt2-tiny", { n_layer = n_layer, generator = lt.Generator(3), recompute = policy })
      local g = lt.Generator(9)
      local x = lt.randint(0, 512, { 2, 64 }, { generator = g, dtype = "i64" })
      local y = lt.randint(0, 512, { 2, 64 }, { generator = g, dtype = "i64" })
      local base = lt.collect_garbage()
      local l = m:loss(x, y)
      -- (the forward's temporaries are garbage until the collector runs: count only what the graph holds)
      return lt.collect_garbage() - base, l
    end
    -- after backward (the loss still held) the checkpoints' inputs are gone too: what is left is the
    -- parameters' gradients (as many bytes as the parameters)
    local m = lt.models.gpt2("gpt2-tiny", { n_layer = 8, generator = lt.Generator(3), recompute = "full" })
    local x = lt.randint(0, 512, { 2, 64 }, { generator = lt.Generator(9), dtype = "i64" })
    local base = lt.collect_garbage()
    local l = m:loss(x, x)
    l:backward()
    local left = lt.collect_garbage() - base
    assert(left >= 4 * m:num_parameters() and left <= 4 * m:num_parameters() + 256,
      ("after backward %d bytes are left, the gradients are %d"):format(left,
      4 * m:num_parameters()))
    assert(l:item() > 0)
    local none = kept(8, "none") - kept(4, "none")
    local full = kept(8, "full") - kept(4, "full")
    assert(none > 1e6, ("4 blocks more keep %d bytes without recomputation"):format(none))
    assert(full < 0.15 * none, ("4 blocks more keep %d bytes under full recomputation, %d without"):format(full, none))
  end)
end)
