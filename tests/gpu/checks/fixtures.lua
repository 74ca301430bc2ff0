-- tests/gpu/checks/fixtures.lua: every case of the PyTorch fixtures
-- (tests/ref/ops.json, nn.json, optim.json) run on CUDA tensors built with
-- the same strides, gradients included; AdamW on cuda against the cpu at
-- GPT-2 sizes, and its four-at-a-time update against the element-wise one.

local lt = require "lutra"
local H = require "tests.lua.helpers"
local runners = require "tests.lua.runners"
local C = require "tests.gpu.checks.harness"
local CUDA = C.CUDA
local check, close = C.check, C.close

local ops_fixture = H.load_json("tests/ref/ops.json")
local op_failures, op_count = {}, 0
check("every ops.json case on cuda matches PyTorch", function()
  for _, case in ipairs(ops_fixture.cases) do
    op_count = op_count + 1
    local ok, err = pcall(function()
      local ins = {}
      for i, spec in ipairs(case.inputs) do ins[i] = H.build(spec, CUDA) end
      local n = #ins
      ins[n + 1] = case.args
      local out = runners.ops[case.op](unpack(ins, 1, n + 1))
      assert(out.device == lt.zeros(1, { device = CUDA }).device, "result on " .. out.device)
      H.assert_matches(out, case.expect, case.name)
    end)
    if not ok then op_failures[#op_failures + 1] = case.name .. ": " .. tostring(err) end
  end
  assert(#op_failures == 0, ("%d of %d cases failed; first: %s"):format(#op_failures, op_count,
    table.concat(op_failures, " || ", 1, math.min(5, #op_failures))))
end)

local nn_fixture = H.load_json("tests/ref/nn.json")
check("every nn.json case on cuda matches PyTorch, gradients included", function()
  local failures = {}
  for _, case in ipairs(nn_fixture.cases) do
    local ok, err = pcall(function()
      local ins = {}
      for i, spec in ipairs(case.inputs) do
        ins[i] = H.from_flat(spec.values, spec.shape, spec.dtype, CUDA)
        if spec.grad then ins[i]:requires_grad_() end
      end
      local out = runners.nn[case.op](case.args, unpack(ins, 1, #case.inputs))
      H.assert_matches(out, case.output, case.name .. " output", 4)
      local any = false
      for _, spec in ipairs(case.inputs) do any = any or spec.grad end
      if any then
        local w = H.from_flat(case.w.values, case.w.shape, case.w.dtype, CUDA)
        ;(out * w):sum():backward()
        for i, spec in ipairs(case.inputs) do
          if spec.grad then
            assert(ins[i].grad, case.name .. ": no gradient for input " .. i)
            assert(ins[i].grad.device == ins[i].device, "gradient on " .. ins[i].grad.device)
            H.assert_matches(ins[i].grad, case.grads[i], case.name .. " grad " .. i, 10)
          end
        end
      end
    end)
    if not ok then failures[#failures + 1] = case.name .. ": " .. tostring(err) end
  end
  assert(#failures == 0, ("%d of %d cases failed; first: %s"):format(#failures, #nn_fixture.cases,
    table.concat(failures, " || ", 1, math.min(5, #failures))))
end)

local optim_fixture = H.load_json("tests/ref/optim.json")
check("every optim.json case (AdamW, SGD, bf16 master weights, clipping, steps after a clip) on cuda matches PyTorch", function()
  local failures = {}
  for _, case in ipairs(optim_fixture.cases) do
    local ok, err = pcall(runners.optim, case, CUDA)
    if not ok then failures[#failures + 1] = case.name .. ": " .. tostring(err) end
  end
  for n, case in ipairs(optim_fixture.clip) do
    local ok, err = pcall(function()
      local params = {}
      for i, g in ipairs(case.grads) do
        params[i] = lt.zeros(g.shape, { device = CUDA }):requires_grad_()
        params[i].grad = H.build(g, CUDA)
      end
      local norm = lt.optim.clip_grad_norm(params, case.max_norm)
      assert(math.abs(norm - case.norm) <= 1e-5 * case.norm, ("norm %.9g, torch %.9g"):format(norm, case.norm))
      for i, want in ipairs(case.clipped) do H.assert_matches(params[i].grad, want, "clipped grad " .. i) end
    end)
    if not ok then failures[#failures + 1] = "clip case " .. n .. ": " .. tostring(err) end
  end
  -- torch clips then steps; lutra takes the clip's factor into the step (grad_scale)
  for _, case in ipairs(optim_fixture.clip_steps) do
    local ok, err = pcall(runners.optim, case, CUDA, "folded")
    if not ok then failures[#failures + 1] = case.name .. ": " .. tostring(err) end
  end
  assert(#failures == 0, table.concat(failures, " || "))
end)

-- (the update runs four elements at a time where the arrays allow: 1003 and 3 elements leave a tail)
check("AdamW at GPT-2 sizes: cuda and cpu parameters agree after 3 steps (f32 and bf16; the second with a grad_scale)", function()
  for _, dt in ipairs { "f32", "bf16" } do
    lt.manual_seed(11)
    local shapes = { { 3072, 768 }, { 768 }, { 50304, 64 }, { 1003 }, { 3 } }
    local cps, gps, grads = {}, {}, {}
    for i, sh in ipairs(shapes) do
      cps[i] = lt.randn(sh):to(dt):requires_grad_()
      gps[i] = cps[i]:detach():to(CUDA):requires_grad_()
      grads[i] = {}
      for s = 1, 3 do grads[i][s] = lt.randn(sh):to(dt) end
    end
    local co = lt.optim.AdamW(cps, { lr = 1e-3, weight_decay = 0.1 })
    local go = lt.optim.AdamW(gps, { lr = 1e-3, weight_decay = 0.1 })
    for s = 1, 3 do
      for i = 1, #shapes do
        cps[i].grad = grads[i][s]
        gps[i].grad = grads[i][s]:to(CUDA)
      end
      local o = s == 2 and { grad_scale = 0.3 } or nil
      co:step(o)
      go:step(o)
    end
    for i = 1, #shapes do close(gps[i]:detach(), cps[i]:detach(), dt .. " parameter " .. i, dt == "f32" and 1e-5 or 1e-2) end
    local cn = lt.optim.clip_grad_norm(cps, 1e9)
    local gn = lt.optim.clip_grad_norm(gps, 1e9)
    assert(math.abs(cn - gn) <= 1e-6 * cn, ("grad norms: cpu %.9g, cuda %.9g"):format(cn, gn))
  end
end)

check("AdamW four elements at a time gives the element-wise update bit for bit (an aligned and an offset parameter)", function()
  for _, dt in ipairs { "f32", "bf16", "f16" } do
    lt.manual_seed(12)
    local init = lt.randn({ 1001 }):to(dt)
    local a = init:to(CUDA):requires_grad_()                         -- 16-byte aligned: four at a time
    local b = lt.empty({ 1002 }, { dtype = dt, device = CUDA }):narrow(1, 2, 1001):detach()
    b:copy_(init:to(CUDA))
    b:requires_grad_()                                               -- one element in: element by element
    local oa = lt.optim.AdamW({ a }, { lr = 1e-2, weight_decay = 0.1 })
    local ob = lt.optim.AdamW({ b }, { lr = 1e-2, weight_decay = 0.1 })
    for step = 1, 3 do
      local g = lt.randn({ 1001 }):to(dt):to(CUDA)
      a.grad, b.grad = g, g:clone()
      local o = step == 2 and { grad_scale = 0.7 } or nil
      oa:step(o)
      ob:step(o)
    end
    assert((a:detach():to("f64") - b:detach():to("f64")):abs():max():item() == 0, dt .. ": the two paths differ")
  end
end, true)
