-- tests/lua/optim_spec.lua: lt.optim against PyTorch (tests/ref/optim.json,
-- from tests/ref/gen_optim.py): AdamW and SGD step by step in f32, f64 and
-- bf16 with master weights, global-norm clipping; parameter groups, state
-- save and restore, the schedules' shapes, and bad settings.
local lt = require "lutra"
local H = require "tests.lua.helpers"
local runners = require "tests.lua.runners"

local fixture = H.load_json("tests/ref/optim.json")

local function build(spec) return H.from_flat(spec.values, spec.shape, spec.dtype) end

describe("optimizers against PyTorch (" .. fixture.torch .. ")", function()
  for _, case in ipairs(fixture.cases) do
    it(case.name, function()
      local opt = runners.optim(case, "cpu")
      assert.are.equal(#case.grads, opt.step_count)
    end)
  end
end)

describe("steps after a global-norm clip against PyTorch (clip_grad_norm_, then step)", function()
  for _, case in ipairs(fixture.clip_steps) do
    -- folded: the clip's factor taken into the update (the gradients left as
    -- they are); in place: clip_grad_norm scales the gradients, then a step
    for _, way in ipairs { "folded", "in place" } do
      it(case.name .. ", " .. way, function()
        runners.optim(case, "cpu", way, function(step, norm, params)
          local want = case.norms[step]
          assert(math.abs(norm - want) <= 1e-5 * want, ("norm %.9g, torch %.9g"):format(norm, want))
          if way == "folded" then
            H.assert_matches(params[1].grad, case.grads[step][1], "the gradient is left as it was")
          end
        end)
      end)
    end
  end
  it("grad_scale s equals gradients times s; 0 leaves only the decay; bad values named", function()
    for _, kind in ipairs { "AdamW", "SGD" } do
      local function fresh()
        local p = lt.arange(1, 7, { dtype = "f64" }):view(2, 3):requires_grad_()
        local o = { lr = 0.1, weight_decay = 0.1 }
        if kind == "SGD" then o.momentum = 0.9 end
        return p, lt.optim[kind]({ p }, o)
      end
      local g = lt.tensor({ { 0.5, -1, 2 }, { 0.25, 3, -0.75 } }, "f64")
      local a, oa = fresh()
      local b, ob = fresh()
      for _ = 1, 3 do
        a.grad = g:clone()
        oa:step { grad_scale = 0.375 }
        b.grad = g * 0.375
        ob:step()
      end
      assert.are.same(b:detach():totable(), a:detach():totable(), kind .. ": folded and scaled gradients differ")
      local z, oz = fresh()
      local d, od = fresh()
      z.grad = g:clone()
      oz:step { grad_scale = 0 }
      d.grad = lt.zeros_like(g)
      od:step()
      assert.are.same(d:detach():totable(), z:detach():totable(), kind .. ": grad_scale 0")
      for _, bad in ipairs { -1, 0 / 0, math.huge, 1e39, "2" } do
        H.assert_error(function() oz:step { grad_scale = bad } end, "grad_scale must be a number in [0, 3.40282e+38]",
          type(bad) == "string" and "(string)" or "(number)")
      end
      H.assert_error(function() oz:step { scale = 2 } end, "unknown option 'scale'")
      H.assert_error(function() oz:step(2) end, "options must be a table")
      assert.are.equal(1, oz.step_count, "refused steps are not counted")
    end
  end)
  it("clip_scale is torch's factor, 1 at or below max_norm and for NaN or inf", function()
    assert.are.equal(1, lt.optim.clip_scale(0.5, 1))
    assert.are.equal(1, lt.optim.clip_scale(1, 1))
    assert.are.equal(1 / (4 + 1e-6), lt.optim.clip_scale(4, 1))
    assert.are.equal(1, lt.optim.clip_scale(0 / 0, 1))
    assert.are.equal(1, lt.optim.clip_scale(math.huge, 1))
    H.assert_error(function() lt.optim.clip_scale(2, 0) end, "clip_scale: max_norm must be a number > 0")
    H.assert_error(function() lt.optim.clip_scale(nil, 1) end, "norm must be a number")
    H.assert_error(function() lt.optim.grad_norm(nil) end, "grad_norm: expected a module, an optimizer or a list")
    local p = lt.ones(2):requires_grad_()
    local opt = lt.optim.SGD({ p })
    assert.is_true(lt.optim.takes_grad_scale(opt))
    assert.is_false(lt.optim.takes_grad_scale(setmetatable({ step = function() end }, { __index = opt })))
    assert.is_false(lt.optim.takes_grad_scale(nil))
  end)
end)

describe("clip_grad_norm against PyTorch", function()
  for n, case in ipairs(fixture.clip) do
    it(("case %d (max_norm %g)"):format(n, case.max_norm), function()
      local params = {}
      for i, g in ipairs(case.grads) do
        params[i] = lt.zeros(g.shape):requires_grad_()
        params[i].grad = build(g)
      end
      local norm, clipped = lt.optim.clip_grad_norm(params, case.max_norm)
      assert(math.abs(norm - case.norm) <= 1e-5 * case.norm, ("norm %.9g, torch %.9g"):format(norm, case.norm))
      assert.are.equal(case.norm > case.max_norm, clipped)
      for i, want in ipairs(case.clipped) do H.assert_matches(params[i].grad, want, "clipped grad " .. i) end
    end)
  end
  it("a non-finite norm scales nothing", function()
    local p = lt.zeros(3):requires_grad_()
    p.grad = lt.tensor { 1, 0 / 0, 2 }
    local norm, clipped = lt.optim.clip_grad_norm({ p }, 1)
    assert(norm ~= norm and not clipped)
    assert.are.equal(1, p.grad:totable()[1])
    p.grad = lt.tensor { 1, math.huge, 2 }
    norm = lt.optim.clip_grad_norm({ p }, 1)
    assert.are.equal(math.huge, norm)
  end)
end)

describe("optimizer behaviour", function()
  it("keeps f32 master weights for bf16: 1.0 stepped 100 times by -6e-4 ends near 0.94", function()
    local p = lt.ones(1, "bf16"):requires_grad_()
    local opt = lt.optim.SGD({ p }, { lr = 6e-4 })
    for _ = 1, 100 do
      p.grad = lt.ones(1, "bf16")
      opt:step()
    end
    local v = p:to("f32"):item()
    assert(math.abs(v - 0.94) < 0.004, "ended at " .. v)
    assert.are.equal("bf16", p.dtype)
  end)
  it("decays matrices and embeddings by default, not biases or norm weights", function()
    local m = lt.nn.Sequential(lt.nn.Linear(4, 3), lt.nn.LayerNorm(3))
    local opt = lt.optim.AdamW(m, { weight_decay = 0.1 })
    assert.are.equal(2, #opt.groups)
    assert.are.equal(0.1, opt.groups[1].weight_decay)
    assert.are.equal(1, #opt.groups[1].params)
    assert.are.equal(2, opt.groups[1].params[1]:dim())
    assert.are.equal(0, opt.groups[2].weight_decay)
    assert.are.equal(3, #opt.groups[2].params)
  end)
  it("skips parameters without gradients and updates the rest in one call per group", function()
    local a, b = lt.ones(2):requires_grad_(), lt.ones(2):requires_grad_()
    local opt = lt.optim.SGD({ a, b }, { lr = 0.5 })
    a.grad = lt.ones(2)
    opt:step()
    assert.are.same({ 0.5, 0.5 }, a:totable())
    assert.are.same({ 1, 1 }, b:totable())
  end)
  it("state_dict and load_state_dict resume the same trajectory", function()
    local function make()
      lt.manual_seed(3)
      local w = lt.randn(5, 4):requires_grad_()
      return w, lt.optim.AdamW({ w }, { lr = 0.05 })
    end
    local grads = {}
    for i = 1, 6 do grads[i] = lt.randn(5, 4) end
    local w1, o1 = make()
    for i = 1, 6 do
      w1.grad = grads[i]
      o1:step()
    end
    local w2, o2 = make()
    for i = 1, 3 do
      w2.grad = grads[i]
      o2:step()
    end
    local sd = o2:state_dict()
    local saved_w = w2:detach():clone()
    local w3, o3 = make()
    lt.no_grad(function() w3:copy_(saved_w) end)
    o3:load_state_dict(sd)
    assert.are.equal(3, o3.step_count)
    for i = 4, 6 do
      w3.grad = grads[i]
      o3:step()
    end
    assert.are.equal(0, (w3 - w1):abs():max():item())
  end)
  it("set_lr changes every group's rate", function()
    local opt = lt.optim.AdamW({ lt.ones(2):requires_grad_(), lt.ones(2, 2):requires_grad_() })
    opt:set_lr(0.25)
    for _, g in ipairs(opt.groups) do assert.are.equal(0.25, g.lr) end
    H.assert_error(function() opt:set_lr(-1) end, "set_lr", ">= 0")
  end)
  it("rejects bad settings, parameters and state clearly", function()
    local p = lt.ones(2):requires_grad_()
    H.assert_error(function() lt.optim.AdamW({ p }, { lr = -1 }) end, "lr", ">= 0")
    H.assert_error(function() lt.optim.AdamW({ p }, { betas = { 1, 0.9 } }) end, "betas[1]")
    H.assert_error(function() lt.optim.AdamW({ p }, { learning_rate = 1 }) end, "unknown option", "learning_rate", "lr")
    H.assert_error(function() lt.optim.SGD({ p }, { nesterov = true }) end, "Nesterov")
    H.assert_error(function() lt.optim.SGD({ p, p }) end, "twice")
    H.assert_error(function() lt.optim.SGD({ lt.ones(2, "i64") }) end, "float")
    H.assert_error(function() lt.optim.SGD({ p * 2 }) end, "not a leaf")
    H.assert_error(function() lt.optim.SGD(42) end, "module", "list")
    local opt = lt.optim.AdamW({ p })
    H.assert_error(function() p.grad = lt.ones(3) end, "[3]", "[2]")
    p.grad = lt.ones(2)
    opt:step()
    opt.state[p].exp_avg = lt.zeros(5) -- a corrupted state is caught in C, naming the parameter
    H.assert_error(function() opt:step() end, "adamw", "first moment of parameter 1", "[5]", "[2]")
    assert.are.equal(1, opt.step_count)
    H.assert_error(function() lt.optim.clip_grad_norm({ p }, 0) end, "max_norm")
    H.assert_error(function() opt:load_state_dict({ groups = {}, tensors = {} }) end, "groups")
  end)
end)

describe("schedules", function()
  local S = lt.optim.schedules
  it("warm up linearly to the peak exactly at the last warmup step", function()
    for _, name in ipairs { "cosine", "linear", "wsd", "constant", "inverse_sqrt" } do
      local f = S[name] { lr = 1, warmup = 10, steps = 100, final = 0.1 }
      assert(f(1) > 0 and math.abs(f(1) - 0.1) < 1e-12, name .. " step 1: " .. f(1))
      assert.are.equal(1, f(10), name)
    end
  end)
  it("cosine decays to final by the last step and stays there", function()
    local f = S.cosine { lr = 1, warmup = 10, steps = 110, final = 0.1 }
    assert(math.abs(f(60) - 0.55) < 1e-12, f(60))
    assert.are.equal(0.1, f(110))
    assert.are.equal(0.1, f(500))
    local prev = f(10)
    for s = 11, 110 do
      assert(f(s) <= prev)
      prev = f(s)
    end
  end)
  it("linear, wsd and inverse_sqrt have their shapes", function()
    local l = S.linear { lr = 1, warmup = 1, steps = 11, final = 0 }
    assert.are.equal(1, l(1))
    assert(math.abs(l(6) - 0.5) < 1e-12)
    assert.are.equal(0, l(11))
    local w = S.wsd { lr = 1, warmup = 0, steps = 100, decay = 0.2, final = 0 }
    assert.are.equal(1, w(80))
    assert(math.abs(w(90) - 0.5) < 1e-12)
    assert.are.equal(0, w(100))
    local r = S.inverse_sqrt { lr = 1, warmup = 4 }
    assert.are.equal(0.5, r(16))
    assert.are.equal(1, S.constant { lr = 1 } (1000))
  end)
  it("rejects bad settings and steps", function()
    H.assert_error(function() S.cosine { lr = 0, steps = 10 } end, "lr must be > 0")
    H.assert_error(function() S.cosine { lr = 1 } end, "steps")
    H.assert_error(function() S.cosine { lr = 1, steps = 5, warmup = 10 } end, "warmup", "longer")
    H.assert_error(function() S.wsd { lr = 1, steps = 10, warmup = 5, decay = 8 } end, "do not fit")
    H.assert_error(function() S.constant { lr = 1 } (0) end, "step", ">= 1")
  end)
end)
