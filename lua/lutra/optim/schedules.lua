--- lutra.optim.schedules (lt.optim.schedules): learning-rate schedules as
-- pure functions of the optimizer step. Step 1 is the first update; with
-- warmup W > 0 the rate rises linearly as lr * step / W, reaching lr exactly
-- at step W (so step 1 is above 0). Past the last step a decaying schedule
-- stays at its final value. Call once per optimizer step (not per
-- micro-batch, not on a skipped step):
--
--   local sched = lt.optim.schedules.cosine { lr = 6e-4, warmup = 100, steps = 2000, final = 6e-5 }
--   opt:set_lr(sched(step))
--
-- cosine: warmup, then half a cosine from lr to final (Loshchilov and Hutter,
-- SGDR 2017, without restarts); linear: warmup, then a straight line to
-- final; wsd: warmup-stable-decay (Hu et al., MiniCPM 2024): warmup, lr
-- until the last `decay` steps (a count, or a fraction of steps when < 1),
-- then linear to final; inverse_sqrt: warmup, then lr * sqrt(W / step)
-- (Vaswani et al. 2017); constant: lr (after an optional warmup).
local M = {}

local function num(kind, opts, key, default, lo)
  local v = opts[key]
  if v == nil then v = default end
  if type(v) ~= "number" or v ~= v or v < (lo or 0) then
    error(("schedules.%s: %s must be a number >= %s, got %s"):format(kind, key, tostring(lo or 0), tostring(v)), 4)
  end
  return v
end

local function common(kind, opts, need_steps)
  if type(opts) ~= "table" then error(("schedules.%s: expects a table of settings"):format(kind), 3) end
  local lr = num(kind, opts, "lr", nil)
  if lr <= 0 then error(("schedules.%s: lr must be > 0, got %s"):format(kind, tostring(lr)), 3) end
  local warmup = num(kind, opts, "warmup", 0)
  local steps = need_steps and num(kind, opts, "steps", nil, 1) or nil
  if steps and warmup > steps then
    error(("schedules.%s: warmup (%d) is longer than steps (%d)"):format(kind, warmup, steps), 3)
  end
  local final = num(kind, opts, "final", 0)
  return lr, warmup, steps, final
end

local function check_step(step)
  if type(step) ~= "number" or step < 1 or step ~= math.floor(step) then
    error("schedule: the step must be a whole number >= 1, got " .. tostring(step), 3)
  end
end

local function warm(lr, warmup, step)
  if step < warmup then return lr * step / warmup end
  return nil
end

--- constant{lr, warmup = 0}
function M.constant(opts)
  local lr, warmup = common("constant", opts, false)
  return function(step)
    check_step(step)
    return warm(lr, warmup, step) or lr
  end
end

--- cosine{lr, warmup = 0, steps, final = 0}
function M.cosine(opts)
  local lr, warmup, steps, final = common("cosine", opts, true)
  return function(step)
    check_step(step)
    local w = warm(lr, warmup, step)
    if w then return w end
    if step >= steps or steps == warmup then return step >= steps and final or lr end
    local progress = (step - warmup) / (steps - warmup)
    return final + 0.5 * (lr - final) * (1 + math.cos(math.pi * progress))
  end
end

--- linear{lr, warmup = 0, steps, final = 0}
function M.linear(opts)
  local lr, warmup, steps, final = common("linear", opts, true)
  return function(step)
    check_step(step)
    local w = warm(lr, warmup, step)
    if w then return w end
    if step >= steps then return final end
    return lr + (final - lr) * (step - warmup) / (steps - warmup)
  end
end

--- wsd{lr, warmup = 0, steps, decay = 0.2, final = 0}: decay is a step count, or a fraction of steps when < 1.
function M.wsd(opts)
  local lr, warmup, steps, final = common("wsd", opts, true)
  local decay = num("wsd", opts, "decay", 0.2)
  if decay < 1 then decay = math.floor(decay * steps + 0.5) end
  if warmup + decay > steps then
    error(("schedules.wsd: warmup (%d) and decay (%d) do not fit in %d steps"):format(warmup, decay, steps), 2)
  end
  local start = steps - decay
  return function(step)
    check_step(step)
    local w = warm(lr, warmup, step)
    if w then return w end
    if step <= start then return lr end
    if step >= steps then return final end
    return lr + (final - lr) * (step - start) / decay
  end
end

--- inverse_sqrt{lr, warmup = 0}
function M.inverse_sqrt(opts)
  local lr, warmup = common("inverse_sqrt", opts, false)
  return function(step)
    check_step(step)
    local w = warm(lr, warmup, step)
    if w then return w end
    if warmup == 0 then return lr / math.sqrt(step) end
    return lr * math.sqrt(warmup / step)
  end
end

return M
