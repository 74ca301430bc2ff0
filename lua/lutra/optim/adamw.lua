--- lutra.optim.adamw: the AdamW optimizer class (torch.optim.AdamW's
-- formulas; Loshchilov and Hutter 2019, decoupled weight decay), one fused
-- C call per group and device (lt_adamw_step). lt.optim.AdamW builds one.
local capi = require "lutra.capi"
local tensor = require "lutra.tensor"
local base = require "lutra.optim.optimizer"
local C = capi.C
local Optimizer, number_opt, carray = base.Optimizer, base.number_opt, base.carray

local AdamW = Optimizer.class("AdamW", { slots = { "exp_avg", "exp_avg_sq" } })

--- AdamW.defaults() -> {lr = 1e-3, betas = {0.9, 0.999}, eps = 1e-8,
-- weight_decay = 0.01} (torch.optim.AdamW's), a fresh table each call.
function AdamW.defaults()
  return { lr = 1e-3, betas = { 0.9, 0.999 }, eps = 1e-8, weight_decay = 0.01 }
end

--- Raises unless betas is {b1, b2} with each in [0, 1) and eps >= 0.
function AdamW:check_settings(g, level)
  if type(g.betas) ~= "table" then error("AdamW: betas must be a table {beta1, beta2}", level) end
  number_opt("betas[1]", g.betas[1], 0, 1, nil, level + 1)
  number_opt("betas[2]", g.betas[2], 0, 1, nil, level + 1)
  number_opt("eps", g.eps, 0, nil, nil, level + 1)
end

--- The first and second moments, zeros of p's shape in dtype sdt.
function AdamW:init_state(s, p, _, sdt)
  s.exp_avg = tensor.zeros(p:shape(), { dtype = sdt, device = p.device })
  s.exp_avg_sq = tensor.zeros(p:shape(), { dtype = sdt, device = p.device })
end

--- One fused update of e's n parameters (lt_adamw_step) -> lt_status.
function AdamW:update(g, e, n, grad_scale)
  local keep = { carray(e.params, n), carray(e.grads, n), carray(e.masters, n), carray(e.a, n), carray(e.b, n) }
  return C.lt_adamw_step(n, keep[1], keep[2], keep[3], keep[4], keep[5], g.lr, g.betas[1], g.betas[2], g.eps,
    g.weight_decay, self.step_count, grad_scale)
end

--- A saved state holds both moments of a parameter or neither.
function AdamW:check_param_state(sd, i, n, level)
  if n > 0 and (sd.tensors[i .. ".exp_avg"] == nil or sd.tensors[i .. ".exp_avg_sq"] == nil) then
    error(("load_state_dict: parameter %d has only part of its AdamW state (exp_avg and exp_avg_sq go together)")
      :format(i), level)
  end
end

return AdamW
