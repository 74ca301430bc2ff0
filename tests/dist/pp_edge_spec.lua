-- tests/dist/pp_edge_spec.lua: what tests/dist/pp_spec.lua's layouts do not
-- cover, every result against one process (the whole model trained by
-- lt.train.step on the same micro-batches in this rank; pp = the job's
-- ranks, f32, losses and norms to 1e-5 relative, weights to 1e-5):
--   - a step whose every target is ignore_index, and a step with one such
--     micro-batch: no NaN, the loss reported as one process reports it (0
--     for the empty step), zeros flow back between the stages (each stage
--     after the first sends exactly zero gradients), the norm 0 and no
--     gradient left for the optimizer (one process runs no backward: its
--     AdamW skips the step, weight decay included), the weights one
--     process's after
--   - a step's ignore_index other than -100: one process's losses (the
--     last stage leaves those targets out as one process does)
--   - fewer micro-batches than stages under 1F1B (m = 1 with pp = 2; m = 1
--     and 2 with pp = 4)
--   - the executor runs the schedule it was given: each rank's forwards and
--     backwards, observed while lt.train.step runs 1F1B, GPipe and
--     interleaved, in the order of lt.dist.pp.timeline's line for that rank
--     (the timelines printed as "# " lines)
--   - receives posted ahead: each stage after the first has posted the
--     receive of micro-batch k + 1's activation before its forward of k
--   - lt.dist.pp.simulate's activations in flight per rank equal the
--     executor's real peak of live stage outputs (held weakly, a full
--     collection before each count: outputs the executor still holds)
-- Tests that need 4 ranks are registered only on 4.
local lt = require "lutra"
local pipeline = require "lutra.models.pipeline"
local executor = require "lutra.dist.pp.executor"
package.path = "tests/dist/?.lua;" .. package.path
local H = require "harness"
local P = require "pp_layouts"

lt.dist.init()
lt.dist.set_timeout(120)
local world, rank = lt.dist.world_size(), lt.dist.rank()
local V, B, T, LR, WD, CLIP = 37, 2, 8, 1e-3, 0.1, 0.05

-- steps x m micro-batches; ignored[s] = "all" (every target ignored in step s)
-- or a micro-batch number (that micro-batch's targets all ignored)
local function batches(steps, m, ignored, seed)
  local g = lt.Generator(seed or 11)
  local out = {}
  for s = 1, steps do
    for k = 1, m do
      local x = lt.randint(0, V, { B, T + 1 }, { generator = g, dtype = "i64" })
      local y = x:narrow(2, 2, T):contiguous()
      if ignored and (ignored[s] == "all" or ignored[s] == k) then y = lt.full({ B, T }, -100, { dtype = "i64" }) end
      out[#out + 1] = { x:narrow(2, 1, T):contiguous(), y }
    end
  end
  return out
end

-- trains model for steps steps of m micro-batches; returns the results of S:run and, per step,
-- whether any gradient was non-zero (nil: none present), any weight not finite
local function train(model, data, steps, m, schedule, ignore_index)
  local opt = lt.optim.AdamW(model:parameters(), { lr = LR, weight_decay = WD })
  local S = lt.train.step.new { model = model, optimizer = opt, accum = m, clip = CLIP, pp_schedule = schedule,
    ignore_index = ignore_index }
  local i, rs = 0, {}
  for s = 1, steps do
    rs[s] = S:run(s, function()
      i = i + 1
      return data[i][1], data[i][2]
    end)
    local gmax, bad = nil, false
    for _, p in ipairs(model:parameters()) do
      if p.grad ~= nil then gmax = math.max(gmax or 0, p.grad:abs():max():item()) end
      local w = p:detach():sum():item()
      if w ~= w or w == math.huge or w == -math.huge then bad = true end
    end
    rs[s].grad_max, rs[s].nonfinite = gmax, bad
  end
  return rs
end

-- the whole model's and the stage's runs compared: loss, norm per step and this stage's weights
-- (ignore_index: the step's setting, for both; data: the micro-batches, else batches(steps, m, ignored))
local function compare(steps, m, ignored, schedule, ignore_index, data)
  data = data or batches(steps, m, ignored)
  local ref = P.gpt2 {}
  local want = train(ref, data, steps, m, nil, ignore_index)
  local model = P.gpt2 { pp = lt.dist.mesh { pp = world }.pp }
  local got = train(model, data, steps, m, schedule, ignore_index)
  local fails = {}
  for s = 1, steps do
    local a, b = got[s], want[s]
    local dl = b.loss == 0 and math.abs(a.loss) or math.abs(a.loss - b.loss) / math.abs(b.loss)
    local dn = b.grad_norm == 0 and math.abs(a.grad_norm) or math.abs(a.grad_norm - b.grad_norm) / b.grad_norm
    if not (dl <= 1e-5 and dn <= 1e-5) or a.nonfinite then
      fails[#fails + 1] = ("step %d: loss %.8f vs %.8f, norm %.6f vs %.6f%s"):format(s, a.loss, b.loss, a.grad_norm,
        b.grad_norm, a.nonfinite and ", a weight not finite" or "")
    end
    if a.tokens ~= b.tokens then fails[#fails + 1] = ("step %d: %d tokens vs %d"):format(s, a.tokens, b.tokens) end
  end
  local whole = {}
  for _, np in ipairs(ref:named_parameters()) do whole[np[1]] = np[2] end
  for _, np in ipairs(model:named_parameters()) do
    local name = np[1] == "lm_head.weight" and model.pp.copy and "transformer.wte.weight" or np[1]
    local d = (np[2]:to("f64") - whole[name]:to("f64")):abs():max():item()
    if not (d <= 1e-5) then fails[#fails + 1] = ("%s differs by %g"):format(name, d) end
  end
  return fails, got, want
end

H.test("a step whose every target is ignored, and a step with one such micro-batch: one process's losses, "
  .. "no gradient, no NaN", function()
  -- step 2: every target ignored; step 3: micro-batch 2 of 4 ignored. The
  -- gradient each stage after the first sends back (its input's), per step
  local sent, calls = {}, 0
  local forward = pipeline.stage_forward
  pipeline.stage_forward = function(mdl, c, input, ...)
    calls = calls + 1
    local s = math.floor((calls - 1) / 4) + 1
    if input.requires_grad then
      input:register_hook(function(g)
        local a = g:abs():max():item()
        sent[s] = math.max(sent[s] or 0, a ~= a and math.huge or a)
      end)
    end
    return forward(mdl, c, input, ...)
  end
  local ok, fails, got, want = pcall(compare, 4, 4, { [2] = "all", [3] = 2 }, "1f1b")
  pipeline.stage_forward = forward
  if not ok then error(fails, 0) end
  if rank > 0 then
    assert(sent[2] == 0, ("rank %d sent back a gradient of %s in the empty step"):format(rank, tostring(sent[2])))
    assert(sent[3] and sent[3] > 0 and sent[3] < math.huge, ("rank %d sent back %s in step 3"):format(rank,
      tostring(sent[3])))
  end
  assert(want[2].loss == 0 and want[2].grad_norm == 0, "the reference's empty step: loss " .. want[2].loss)
  assert(got[2].loss == 0, ("the empty step's loss is %s, one process reports 0"):format(tostring(got[2].loss)))
  assert(got[2].grad_norm == 0, ("the empty step's gradient norm is %g"):format(got[2].grad_norm))
  assert(got[2].grad_max == nil or got[2].grad_max == 0,
    ("rank %d: a gradient of %g in the empty step"):format(rank, got[2].grad_max or 0))
  assert(got[3].grad_norm > 0 and got[3].loss > 0, "step 3 (one micro-batch ignored) had no loss or gradient")
  assert(#fails == 0, table.concat(fails, "; "))
end)

-- a step's own ignore_index (not -100) reaches the last stage's loss: the
-- first 3 of each row's 8 targets are that id (5), which one process leaves
-- out of the loss and its count
H.test("ignore_index = 5 (lt.train.step's setting) on the last stage: one process's losses and weights", function()
  local data = batches(3, 4)
  for _, d in ipairs(data) do d[2]:narrow(2, 1, 3):fill_(5) end
  local fails = compare(3, 4, nil, "1f1b", 5, data)
  assert(#fails == 0, table.concat(fails, "; "))
end)

H.test("1F1B with fewer micro-batches than stages (m = 1) equals one process", function()
  local fails = compare(3, 1, nil, "1f1b")
  assert(#fails == 0, table.concat(fails, "; "))
end)

if world == 4 then
  H.test("pp=4 1F1B with 2 micro-batches equals one process", function()
    local fails = compare(3, 2, nil, "1f1b")
    assert(#fails == 0, table.concat(fails, "; "))
  end)
end

-- receives posted ahead (lutra.dist.pp.executor's prefetch): in the second
-- 1F1B step of 4 micro-batches (the shapes known from the first), each rank
-- after the first has posted the receive of micro-batch k + 1's activation
-- before its forward of micro-batch k starts (k < 4), so that message can
-- land while the stage computes; without the prefetch it is posted only
-- when the schedule reaches its recv action, after that forward
H.test("1F1B: each stage posts the next micro-batch's activation receive before its forward of this one", function()
  local m = 4
  local model = P.gpt2 { pp = lt.dist.mesh { pp = world }.pp }
  local opt = lt.optim.AdamW(model:parameters(), { lr = LR })
  local S = lt.train.step.new { model = model, optimizer = opt, accum = m, pp_schedule = "1f1b" }
  local data = batches(2, m)
  for i, d in ipairs(data) do d[2]:narrow(1, 1, 1):narrow(2, 1, 1):fill_((i - 1) % m + 1) end
  local step, posted, late = 0, {}, {}
  local irecv, forward = lt.dist.irecv, pipeline.stage_forward
  lt.dist.irecv = function(t, src, o) -- (lt.dist is lutra.dist.comm's table: the link calls this one)
    -- the link's tags: kind + 2 (direction + 2 (virtual stage + stages * micro-batch)); data: kind 1, forward: 0
    local tag = o and o.tag or 0
    if step == 2 and tag % 2 == 1 and math.floor(tag / 2) % 2 == 0 then
      posted[math.floor(tag / (4 * world))] = true
    end
    return irecv(t, src, o)
  end
  pipeline.stage_forward = function(mdl, c, input, targets, ...)
    local k = targets:narrow(1, 1, 1):narrow(2, 1, 1):item()
    if step == 2 and rank > 0 and k < m and not posted[k + 1] then late[#late + 1] = k + 1 end
    return forward(mdl, c, input, targets, ...)
  end
  local ok, err = pcall(function()
    for s = 1, 2 do
      step = s
      S:run(s, function()
        local d = table.remove(data, 1)
        return d[1], d[2]
      end)
    end
  end)
  lt.dist.irecv, pipeline.stage_forward = irecv, forward
  if not ok then error(err, 0) end
  assert(#late == 0, ("rank %d: the activation of micro-batch(es) %s received only after the forward before it began")
    :format(rank, table.concat(late, ",")))
end)

-- one real step of schedule kind with m micro-batches: the order this rank ran its forwards and
-- backwards in (timeline notation) and its peak of live stage outputs
local function observe(kind, m, v)
  local model = P.gpt2 { pp = lt.dist.mesh { pp = world }.pp, virtual_stages = v, n_layer = 4 * (v or 1) }
  local opt = lt.optim.AdamW(model:parameters(), { lr = LR })
  local S = lt.train.step.new { model = model, optimizer = opt, accum = m, pp_schedule = kind }
  local data = batches(1, m)
  for k = 1, m do data[k][2]:narrow(1, 1, 1):narrow(2, 1, 1):fill_(k) end -- (the first target names the micro-batch)
  local order, live, peak = {}, setmetatable({}, { __mode = "k" }), 0
  local forward = pipeline.stage_forward
  pipeline.stage_forward = function(mdl, c, input, targets, ...)
    local name = targets:narrow(1, 1, 1):narrow(2, 1, 1):item() .. ((v or 1) > 1 and ("." .. c) or "")
    order[#order + 1] = "F" .. name
    local out = lt.autograd.hook(function() order[#order + 1] = "B" .. name end)(forward(mdl, c, input, targets, ...))
    live[out] = true
    collectgarbage()
    collectgarbage()
    local n = 0
    for _ in pairs(live) do n = n + 1 end
    peak = math.max(peak, n)
    return out
  end
  local ok, err = pcall(S.run, S, 1, function()
    local d = table.remove(data, 1)
    return d[1], d[2]
  end)
  pipeline.stage_forward = forward
  if not ok then error(err, 0) end
  return table.concat(order, " "), peak
end

local KINDS = { { "1f1b", 4 }, { "gpipe", 4 }, { "1f1b", 1 } }
if world == 2 then KINDS[#KINDS + 1] = { "interleaved", 4, 2 } end
if world == 4 then KINDS[#KINDS + 1] = { "interleaved", 4, 2 } end

for _, k in ipairs(KINDS) do
  local kind, m, v = k[1], k[2], k[3]
  H.test(("%s, %d micro-batches%s: the executor runs each rank's timeline, its live activations peak at "
    .. "simulate's in-flight count"):format(kind, m, v and (", " .. v .. " chunks a rank") or ""), function()
    local sched = executor.make_schedule(kind, world, m, v or 1)
    local lines = {}
    for line in lt.dist.pp.timeline(sched):gmatch("[^\n]+") do lines[#lines + 1] = line end
    if rank == 0 then for _, line in ipairs(lines) do print("# " .. line) end end
    local want = lines[rank + 2]:match("^rank %d+: (.*)$")
    local got, peak = observe(kind, m, v)
    assert(got == want, ("rank %d ran %s; its timeline: %s"):format(rank, got, want))
    local sim = lt.dist.pp.simulate(sched).in_flight[rank + 1]
    assert(peak == sim, ("rank %d: %d stage outputs alive at most, simulate counts %d in flight"):format(rank, peak, sim))
  end)
end

H.run("tests/dist/pp_edge_spec.lua")
