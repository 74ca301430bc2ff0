--- lutra.optim.sgd: the SGD optimizer class (torch.optim.SGD's formulas:
-- momentum, dampening, Nesterov, weight decay), fused C calls per group and
-- device (lt_sgd_step). lt.optim.SGD builds one.
local capi = require "lutra.capi"
local tensor = require "lutra.tensor"
local base = require "lutra.optim.optimizer"
local C = capi.C
local Optimizer, number_opt, carray = base.Optimizer, base.number_opt, base.carray

local SGD = Optimizer.class("SGD", { slots = { "momentum_buffer" } })

--- SGD.defaults() -> {lr = 1e-3, momentum = 0, dampening = 0, weight_decay = 0,
-- nesterov = false}, a fresh table each call.
function SGD.defaults()
  return { lr = 1e-3, momentum = 0, dampening = 0, weight_decay = 0, nesterov = false }
end

--- Raises unless momentum, dampening >= 0, and Nesterov has momentum > 0 and dampening 0.
function SGD:check_settings(g, level)
  number_opt("momentum", g.momentum, 0, nil, nil, level + 1)
  number_opt("dampening", g.dampening, 0, nil, nil, level + 1)
  if g.nesterov and (g.momentum <= 0 or g.dampening ~= 0) then
    error("SGD: Nesterov momentum needs momentum > 0 and dampening 0", level)
  end
end

--- The momentum buffer (zeros of p's shape in dtype sdt) when the group has momentum.
function SGD:init_state(s, p, g, sdt)
  if g.momentum > 0 then
    s.momentum_buffer = tensor.zeros(p:shape(), { dtype = sdt, device = p.device })
  end
end

--- The update of e's n parameters (lt_sgd_step) -> lt_status. With momentum
-- each buffer starts as the gradient at its parameter's first update: two
-- calls when some buffers are new and some are not.
function SGD:update(g, e, n, grad_scale)
  if g.momentum == 0 then
    return C.lt_sgd_step(n, carray(e.params, n), carray(e.grads, n), carray(e.masters, n), nil, g.lr, 0, g.dampening,
      g.weight_decay, 0, 0, grad_scale)
  end
  local st = 0
  local parts = { [true] = {}, [false] = {} } -- split before any call marks a buffer started
  for i = 1, n do
    local list = parts[not self.state[e.params[i]].started]
    list[#list + 1] = i
  end
  for _, first in ipairs { true, false } do
    local idx = parts[first]
    if #idx > 0 and st == 0 then
      local function sub(list)
        local out = {}
        for j, i in ipairs(idx) do out[j] = list[i] end
        return carray(out, #idx)
      end
      local sp, sg, sm, sb = sub(e.params), sub(e.grads), sub(e.masters), sub(e.a)
      st = C.lt_sgd_step(#idx, sp, sg, sm, sb, g.lr, g.momentum, g.dampening, g.weight_decay,
        g.nesterov and 1 or 0, first and 1 or 0, grad_scale)
      if st == 0 then
        for _, i in ipairs(idx) do self.state[e.params[i]].started = true end
      end
    end
  end
  return st
end

return SGD
