-- tests/lua/autograd_edges_spec.lua: gradients and module behaviour at the
-- edges that a break-it review found (each once wrong, lost, or leaking).
local lt = require "lutra"
local H = require "tests.lua.helpers"
local gradcheck = lt.autograd.gradcheck

describe("gradients at the edges", function()
  it("pow at exponent 0 and std of a constant row are 0, as torch", function()
    local x = lt.tensor({ 0, 2 }, "f64"):requires_grad_()
    x:pow(0):sum():backward()
    assert.are.same({ 0, 0 }, x.grad:totable())
    local a = lt.tensor({ 0, 2 }, "f64"):requires_grad_()
    local b = lt.tensor({ 0, 0 }, "f64"):requires_grad_()
    a:pow(b):sum():backward()
    assert.are.same({ 0, 0 }, a.grad:totable())
    local y = lt.tensor({ { 1, 1, 1 } }, "f64"):requires_grad_()
    y:std(2):sum():backward()
    assert.are.same({ { 0, 0, 0 } }, y.grad:totable())
  end)
  it("gelu's gradient at huge |x| is 1 or 0, not NaN (its cubic's derivative overflows there)", function()
    for _, case in ipairs({ { "f32", 1e20 }, { "f32", 3e19 }, { "f64", 1e160 } }) do
      local big = case[2]
      local x = lt.tensor({ big, -big, 30, -30, 0 }, case[1]):requires_grad_()
      lt.F.gelu(x):sum():backward()
      assert.are.same({ 1, 0, 1, 0, 0.5 }, x.grad:totable(), case[1] .. " " .. big)
    end
  end)
  it("max sends the gradient to a NaN it returns, and max(dim) to its position", function()
    local x = lt.tensor({ 1, 0 / 0, 3 }, "f64"):requires_grad_()
    x:max():backward()
    assert.are.same({ 0, 1, 0 }, x.grad:totable())
    local t = lt.tensor({ { 2, 2, 1 } }, "f64"):requires_grad_()
    local v, i = t:max(2)
    v:sum():backward()
    assert.are.same({ { 1, 0, 0 } }, t.grad:totable()) -- all of it to position i, as torch.max(x, dim)
    assert.are.same({ 0 }, i:totable())
    local r = lt.tensor({ -1, 0, 2 }, "f64"):requires_grad_()
    lt.F.relu(r):sum():backward()
    assert.are.same({ 0, 0, 1 }, r.grad:totable())
  end)
  it("cat and stack pass gradients to their inputs", function()
    local a, b = lt.randn(2, 3, { dtype = "f64" }):requires_grad_(), lt.randn(1, 3, { dtype = "f64" }):requires_grad_()
    assert(gradcheck(function(x, y) return lt.cat({ x, y, x }, 1) end, { a, b }))
    assert(gradcheck(function(x, y) return lt.stack({ x:select(1, 1), y:select(1, 1) }, 2) end, { a, b }))
    local parts = {}
    for i = 1, 9 do parts[i] = lt.ones(1, 2, { dtype = "f64" }):requires_grad_() end
    lt.cat(parts, 1):sum():backward()
    for i = 1, 9 do assert.are.same({ { 1, 1 } }, parts[i].grad:totable()) end
  end)
  it("custom functions: outputs that are inputs stay separate, backward returns align with arguments", function()
    local W = lt.ones(2, { dtype = "f64" }):requires_grad_()
    local x = lt.ones(2, { dtype = "f64" }):requires_grad_()
    local Same = lt.autograd.Function { forward = function(_, a) return a end, backward = function(_, g) return g * 3 end }
    local y = Same(x)
    assert.is_true(x.is_leaf) -- x was not taken over
    y:sum():backward()
    assert.are.same({ 3, 3 }, x.grad:totable())
    local Leak = lt.autograd.Function { forward = function() return W end, backward = function() return nil end }
    Leak(x)
    assert.is_true(W.is_leaf)
    local Mixed = lt.autograd.Function {
      forward = function(_, a, scale, c) return a * scale + c end,
      backward = function(_, g, _) return g * 2, nil, g end, -- one value per argument, nil for the number
    }
    local a, c = lt.ones(2, { dtype = "f64" }):requires_grad_(), lt.ones(2, { dtype = "f64" }):requires_grad_()
    Mixed(a, 2, c):sum():backward()
    assert.are.same({ 2, 2 }, a.grad:totable())
    assert.are.same({ 1, 1 }, c.grad:totable())
    local Bad = lt.autograd.Function { forward = function(_, v) return v * 1 end, backward = function(_, g) return g, "x" end }
    H.assert_error(function() Bad(lt.ones(1, { dtype = "f64" }):requires_grad_()):sum():backward() end, "returned 2 values")
  end)
  it("gradcheck explains inputs it cannot check", function()
    local b = lt.ones(3, { dtype = "f64" }):requires_grad_()
    H.assert_error(function() gradcheck(function(v) return v * v end, { b * 1 }) end, "not a leaf")
    H.assert_error(function() gradcheck(function(v) return v * v end, { lt.ones(3, { dtype = "f64" }) }) end,
      "no input requires grad")
  end)
  it("hooks belong to their tensor even when addresses are reused", function()
    local fired = 0
    for _ = 1, 200 do
      local t = lt.ones(1, { dtype = "f64" }):requires_grad_()
      t:register_hook(function() fired = fired + 1 end)
    end
    collectgarbage()
    collectgarbage()
    local fresh = lt.ones(1, { dtype = "f64" }):requires_grad_()
    local mine = 0
    fresh:register_hook(function() mine = mine + 1 end)
    fired = 0
    ;(fresh * 2):sum():backward()
    assert.are.equal(1, mine)
    assert.are.equal(0, fired)
  end)
  it("a failed backward can be run again", function()
    local x = lt.ones(2, { dtype = "f64" }):requires_grad_()
    local fail = true
    x:register_hook(function() if fail then error("not yet") end end)
    local y = (x:exp() * 2):sum()
    H.assert_error(function() y:backward() end, "not yet")
    fail = false
    x.grad = nil -- the failed run had accumulated before its hook raised
    y:backward()
    assert.is_true(math.abs(x.grad:totable()[1] - 2 * math.exp(1)) < 1e-12)
  end)
  it("an assigned expanded .grad is kept as a private copy", function()
    local x = lt.zeros(3, { dtype = "f64" }):requires_grad_()
    x.grad = lt.ones(1, { dtype = "f64" }):expand(3)
    ;(x * 1):sum():backward()
    assert.are.same({ 2, 2, 2 }, x.grad:totable())
  end)
  it("empty tensors can be drawn and made", function()
    assert.are.same({ 2, 0 }, lt.randn(2, 0):shape())
    assert.are.same({ 3, 0 }, lt.nn.Linear(0, 3).weight:shape())
  end)
end)

describe("modules at the edges", function()
  local nn = lt.nn
  it("moving a module to a device that is not there fails at the caller's line, naming to", function()
    local n, why = lt.cuda.device_count()
    if n > 0 then return end -- (a machine with a GPU moves it)
    -- (a build without CUDA, CUDA=0, has no CUDA backend to ask: the tensor layer says the device is not there)
    local built_without = why:find("not compiled in", 1, true)
    local names = built_without and "to: device cuda:0" or "to: cuda:0"
    local says = built_without and "to: device cuda:0 is not available (lutra was built without CUDA"
      or "to: cuda:0: no CUDA device"
    local m = lt.nn.Linear(2, 3)
    H.assert_error(function() m:to("cuda", "bf16") end, "autograd_edges_spec.lua:", says)
    H.assert_error(function() lt.ones(2):to("cuda") end, "autograd_edges_spec.lua:", names)
    assert.are.equal("cpu", m.weight.device)
    H.assert_error(function() m:to("tpu") end, "autograd_edges_spec.lua:", "to: 'tpu' is neither a dtype")
    H.assert_error(function() lt.ones(2):to("f17") end, "autograd_edges_spec.lua:", "to: 'f17' is neither")
  end)
  it("ModuleList assignment and Sequential arguments", function()
    local a, b = nn.Linear(2, 2), nn.Linear(2, 3)
    local ml = nn.ModuleList { a, b }
    local c = nn.Linear(2, 4)
    ml[1] = c
    assert.are.equal(c, ml[1])
    assert.are.equal(b, ml[2])
    H.assert_error(function() ml[5] = c end, "outside")
    H.assert_error(function() nn.Sequential(nn.Linear(2, 3), function(x) return x end) end, "argument 2", "function")
    H.assert_error(function() nn.Sequential(nil, nn.Linear(2, 3)) end, "argument 1")
  end)
  it("to(dtype) leaves integer and bool buffers alone", function()
    local M = nn.Module:extend("WithBuffers")
    function M:init()
      self.w = nn.Parameter(lt.ones(2))
      self:register_buffer("ids", lt.arange(300))
      self:register_buffer("mask", lt.tensor({ true, false }, "bool"))
    end
    local m = M():to("bf16")
    assert.are.equal("bf16", m.w.dtype)
    assert.are.equal("i64", m.ids.dtype)
    assert.are.equal(259, m.ids:totable()[260])
    assert.are.equal("bool", m.mask.dtype)
    H.assert_error(function() M():to("i64") end, "float dtypes")
  end)
  it("state_dict is one table that lt.save takes", function()
    local p = os.tmpname()
    local m = lt.models.gpt2("gpt2-tiny")
    lt.save(p, m:state_dict())
    local back = lt.load(p)
    assert.truthy(back["transformer.wte.weight"])
    assert.are.equal("transformer.wte.weight", m:state_dict_names()[1])
    os.remove(p)
    H.assert_error(function() m:load_state_dict(nil) end, "expected a table")
  end)
  it("model configs reject unknown and impossible settings", function()
    H.assert_error(function() lt.models.gpt2("gpt2-tiny", { n_layers = 3 }) end, "unknown setting 'n_layers'")
    H.assert_error(function() lt.models.gpt2("gpt2-tiny", { pad_vocab = 0 }) end, "pad_vocab")
    H.assert_error(function() lt.models.gpt2("gpt2-tiny", { n_embd = math.huge }) end, "n_embd")
    H.assert_error(function() lt.models.llama("llama-tiny", { rope_theta = -1 }) end, "rope_theta")
  end)
  it("functional ops check their arguments", function()
    H.assert_error(function() lt.F.layer_norm(lt.ones(2, 3), 3) end, "layer_norm", "tensor or nil")
    H.assert_error(function() lt.F.cross_entropy(lt.ones(2, 3), lt.tensor({ 0, 1 }, "i64"), { ignore_index = 1.5 }) end,
      "ignore_index")
    H.assert_error(function() lt.F.rope(lt.ones(1, 2, 4), { start = 0.5 }) end, "start")
    H.assert_error(function() lt.F.dropout(lt.ones(2), 0 / 0) end, "dropout")
    H.assert_error(function() lt.F.linear(lt.ones(2, 3), lt.ones(4, 5)) end, "linear", "[2, 3]", "[4, 5]")
  end)
end)

describe("safetensors at the edges", function()
  local function put(bytes)
    local p = os.tmpname()
    local f = assert(io.open(p, "wb"))
    f:write(bytes)
    f:close()
    return p
  end
  local function image(header, data)
    local n, len = #header, ""
    for _ = 1, 8 do
      len = len .. string.char(n % 256)
      n = math.floor(n / 256)
    end
    return len .. header .. (data or "")
  end
  it("rejects trailing text, duplicate names, NUL escapes and bad booleans", function()
    local d8 = string.rep("\0", 8)
    H.assert_error(function() lt.load(put(image('{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}} x', d8))) end,
      "text after")
    H.assert_error(function()
      lt.load(put(image('{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}', d8)))
    end, "appears twice")
    H.assert_error(function() lt.load(put(image('{"a\\u0000x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}', d8))) end,
      "u0000")
    H.assert_error(function() lt.load(put(image('{"m":{"dtype":"BOOL","shape":[2],"data_offsets":[0,2]}}', "\1\2"))) end,
      "BOOL", "0x02")
    H.assert_error(function() lt.save(os.tmpname(), { ["a\0b"] = lt.ones(1) }) end, "NUL")
    assert.are.same({ 0, 4611686018427387904 },
      lt.load(put(image('{"e":{"dtype":"F32","shape":[0,4611686018427387904],"data_offsets":[0,0]}}'))).e:shape())
  end)
  it("notices a file that shrank after it was opened", function()
    local p = os.tmpname()
    lt.save(p, { a = lt.ones(1000) })
    local r = lt.safetensors.open(p)
    io.open(p, "w"):close()
    H.assert_error(function() r:get("a") end, "changed size")
    r:close()
  end)
  it("loads many tensors quickly", function()
    local many = {}
    for i = 1, 5000 do many["t" .. i] = lt.zeros(0) end
    local p = os.tmpname()
    lt.save(p, many)
    local t0 = lt.clock()
    local back = lt.load(p)
    assert.is_true(lt.clock() - t0 < 2, "loading 5000 tensors took too long")
    assert.truthy(back.t5000)
    os.remove(p)
  end)
end)

describe("chunk", function()
  it("chunk: equal views, one backward node that assembles the pieces' gradients; errors named", function()
    local x = lt.randn({ 2, 6, 3 }, { dtype = "f64" }):requires_grad_()
    local a, b, c = x:chunk(3, 2)
    assert.are.same({ 2, 2, 3 }, b:shape())
    assert.are.equal(0, (b - x:narrow(2, 3, 2)):abs():max():item())
    assert.are.equal("ChunkBackward", a.grad_fn)
    lt.autograd.gradcheck(function(t)
      local p, q, r = t:chunk(3, 2)
      return p * 2 + q:tanh() + r * r
    end, { x })
    -- pieces without a gradient count as zeros
    local _, q2 = x:chunk(2, 2)
    x.grad = nil
    q2:sum():backward()
    assert.are.equal(0, x.grad:narrow(2, 1, 3):abs():max():item())
    assert.are.equal(18, x.grad:sum():item())
    -- more than 4 pieces are narrows; uneven sizes and bad dims are errors
    local p6 = { x:chunk(6, 2) }
    assert.are.equal(6, #p6)
    H.assert_error(function() x:chunk(4, 2) end, "does not split into 4 equal pieces")
    H.assert_error(function() x:chunk(5, 2) end, "does not split into 5")
    H.assert_error(function() x:chunk(0, 2) end, "positive integer")
    H.assert_error(function() x:chunk(2, 4) end, "chunk")
    -- integer tensors chunk too (no gradient)
    local i1, i2 = lt.tensor({ 1, 2, 3, 4 }, "i64"):chunk(2, 1)
    assert.are.equal(7, i2:sum():item())
  end)
end)
