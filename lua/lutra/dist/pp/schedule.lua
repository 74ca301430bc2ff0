--- lutra.dist.pp.schedule (lt.dist.pp): pipeline schedules as data. A
-- schedule is, for each of the p ranks of a pipeline, the list of actions
-- it runs in order; an executor (issue 26) runs them, and a new schedule is
-- a new list, not a new code path. Actions:
--   {op = "recv_fwd", mb =, chunk =}  the activation of micro-batch mb (1-based) for chunk chunk
--   {op = "fwd", mb =, chunk =}       the forward of micro-batch mb through chunk chunk
--   {op = "send_fwd", mb =, chunk =}  its output to the next stage
--   {op = "recv_bwd", mb =, chunk =}  the gradient of that output from the next stage
--   {op = "bwd", mb =, chunk =}       the backward of micro-batch mb through chunk chunk
--   {op = "send_bwd", mb =, chunk =}  the input's gradient to the stage before
-- Rank r's chunk c (1-based) is virtual stage r + (c - 1) p (0-based r), as
-- Megatron-LM's interleaved schedule places model chunks (Narayanan et al.
-- 2021, "Efficient Large-Scale Language Model Training on GPU Clusters
-- Using Megatron-LM", section 2.2); with one chunk a rank is one stage. The
-- first virtual stage receives nothing forward (it reads the batch) and the
-- last sends nothing forward (it computes the loss); backward the reverse.
--
--   local s = lt.dist.pp.one_f_one_b(4, 8)     -- 4 stages, 8 micro-batches
--   print(lt.dist.pp.timeline(s))              -- one line a rank
--   local r = lt.dist.pp.simulate(s)           -- makespan, bubble, activations in flight
local M = {}

local function whole(what, v, lo)
  if type(v) ~= "number" or v ~= math.floor(v) or v < lo then
    error(("pipeline schedule: %s must be a whole number >= %d, got %s"):format(what, lo, tostring(v)), 4)
  end
end

-- the computing actions of a rank, in order, wrapped with their sends and receives
local function with_comm(compute, rank, p, v)
  local last = p * v - 1
  local out = {}
  for _, a in ipairs(compute) do
    local stage = rank + (a.chunk - 1) * p
    if a.op == "fwd" then
      if stage > 0 then out[#out + 1] = { op = "recv_fwd", mb = a.mb, chunk = a.chunk } end
      out[#out + 1] = a
      if stage < last then out[#out + 1] = { op = "send_fwd", mb = a.mb, chunk = a.chunk } end
    else
      if stage < last then out[#out + 1] = { op = "recv_bwd", mb = a.mb, chunk = a.chunk } end
      out[#out + 1] = a
      if stage > 0 then out[#out + 1] = { op = "send_bwd", mb = a.mb, chunk = a.chunk } end
    end
  end
  return out
end

local function schedule(name, p, m, v, per_rank)
  local ranks = {}
  for r = 0, p - 1 do ranks[r + 1] = with_comm(per_rank(r), r, p, v) end
  return { name = name, stages = p, micro_batches = m, chunks = v, ranks = ranks }
end

--- pp.gpipe(p, m) -> schedule: GPipe (Huang et al. 2019): every rank runs
-- all m forwards, then all m backwards (in reverse). Keeps m micro-batches'
-- activations per stage. p stages >= 1, m micro-batches >= 1.
function M.gpipe(p, m)
  whole("p (stages)", p, 1)
  whole("m (micro-batches)", m, 1)
  return schedule("gpipe", p, m, 1, function()
    local acts = {}
    for mb = 1, m do acts[#acts + 1] = { op = "fwd", mb = mb, chunk = 1 } end
    for mb = m, 1, -1 do acts[#acts + 1] = { op = "bwd", mb = mb, chunk = 1 } end
    return acts
  end)
end

--- pp.one_f_one_b(p, m) -> schedule: 1F1B (PipeDream-Flush, Narayanan et
-- al. 2021): rank r runs min(p - r - 1, m) forwards to fill the pipeline,
-- then alternates one forward and one backward, then drains the remaining
-- backwards; at most p - r micro-batches' activations are kept on rank r.
-- The same bubble as GPipe, (p - 1) / (m + p - 1) of the step.
function M.one_f_one_b(p, m)
  whole("p (stages)", p, 1)
  whole("m (micro-batches)", m, 1)
  return schedule("1f1b", p, m, 1, function(r)
    local acts, f, b = {}, 1, 1
    local warm = math.min(p - r - 1, m)
    for _ = 1, warm do
      acts[#acts + 1] = { op = "fwd", mb = f, chunk = 1 }
      f = f + 1
    end
    while f <= m do
      acts[#acts + 1] = { op = "fwd", mb = f, chunk = 1 }
      f = f + 1
      acts[#acts + 1] = { op = "bwd", mb = b, chunk = 1 }
      b = b + 1
    end
    while b <= m do
      acts[#acts + 1] = { op = "bwd", mb = b, chunk = 1 }
      b = b + 1
    end
    return acts
  end)
end

--- pp.interleaved(p, m, v) -> schedule: interleaved 1F1B with v model
-- chunks per rank (Narayanan et al. 2021, section 2.2, Megatron-LM's
-- order): the forwards go through the chunks p micro-batches at a time
-- (chunk 1 for micro-batches 1..p, chunk 2 for the same, ..., then the
-- next p), the backwards likewise from the last chunk; rank r warms up
-- with 2 (p - r - 1) + (v - 1) p forwards, then alternates. m must be a
-- multiple of p (as Megatron requires). The bubble is 1/v of 1F1B's.
function M.interleaved(p, m, v)
  whole("p (stages)", p, 1)
  whole("m (micro-batches)", m, 1)
  whole("v (chunks per rank)", v, 1)
  if v > 1 and m % p ~= 0 then
    error(("pipeline schedule: interleaved needs micro-batches (%d) to be a multiple of the stages (%d)")
      :format(m, p), 2)
  end
  if v == 1 then
    local s = M.one_f_one_b(p, m)
    s.name = "interleaved"
    return s
  end
  local total = m * v
  -- the k-th (0-based) forward of a rank: its micro-batch and chunk; backwards from the last chunk
  local function nth(k, backward)
    local group = math.floor(k / (p * v))
    local chunk = math.floor(k / p) % v
    if backward then chunk = v - 1 - chunk end
    return group * p + k % p + 1, chunk + 1
  end
  return schedule("interleaved", p, m, v, function(r)
    local acts, f, b = {}, 0, 0
    local warm = math.min((p - r - 1) * 2 + (v - 1) * p, total)
    local function fwd()
      local mb, c = nth(f, false)
      acts[#acts + 1] = { op = "fwd", mb = mb, chunk = c }
      f = f + 1
    end
    local function bwd()
      local mb, c = nth(b, true)
      acts[#acts + 1] = { op = "bwd", mb = mb, chunk = c }
      b = b + 1
    end
    for _ = 1, warm do fwd() end
    while f < total do
      fwd()
      bwd()
    end
    while b < total do bwd() end
    return acts
  end)
end

--- pp.simulate(s[, {fwd = 1, bwd = 2}]) -> {makespan =, ideal =, bubble =,
-- in_flight = {per rank: the most micro-batch chunks whose forward ran and
-- backward has not}, finish = {per rank}}: runs the schedule's ranks in
-- lockstep time, each computing action taking fwd or bwd units once what
-- it needs is done (a forward the previous virtual stage's forward of the
-- micro-batch; a backward the next stage's backward, or on the last stage
-- its own forward), sends and receives free. bubble = (makespan - ideal) /
-- makespan with ideal = m v (fwd + bwd), the busiest rank's compute.
-- Raises "pipeline schedule: deadlock ..." naming each rank's next action
-- when no rank can go on, and on an incomplete schedule (an action
-- missing or twice).
function M.simulate(s, times)
  local tf, tb = times and times.fwd or 1, times and times.bwd or 2
  local p, v, m = s.stages, s.chunks, s.micro_batches
  local last = p * v - 1
  local done = {} -- done["f" / "b" .. stage .. ":" .. mb] = finish time
  local pos, clock, inflight, peak = {}, {}, {}, {}
  local compute = {}
  for r = 1, p do
    compute[r] = {}
    local seen = {}
    for _, a in ipairs(s.ranks[r]) do
      if a.op == "fwd" or a.op == "bwd" then
        local key = a.op .. a.mb .. ":" .. a.chunk
        if seen[key] then error(("pipeline schedule: rank %d runs %s of micro-batch %d, chunk %d twice")
          :format(r - 1, a.op, a.mb, a.chunk), 2) end
        seen[key] = true
        compute[r][#compute[r] + 1] = a
      end
    end
    if #compute[r] ~= 2 * m * v then
      error(("pipeline schedule: rank %d has %d computing actions, %d expected"):format(r - 1, #compute[r], 2 * m * v), 2)
    end
    pos[r], clock[r], inflight[r], peak[r] = 1, 0, 0, 0
  end
  local remaining = p * 2 * m * v
  while remaining > 0 do
    local progressed = false
    for r = 1, p do
      local a = compute[r][pos[r]]
      while a do
        local stage = (r - 1) + (a.chunk - 1) * p
        local need
        if a.op == "fwd" then
          need = stage > 0 and done["f" .. (stage - 1) .. ":" .. a.mb] or (stage == 0 and 0 or nil)
        else
          need = stage < last and done["b" .. (stage + 1) .. ":" .. a.mb] or nil
          if stage == last then need = done["f" .. stage .. ":" .. a.mb] end
        end
        if need == nil then break end
        local start = math.max(clock[r], need)
        clock[r] = start + (a.op == "fwd" and tf or tb)
        done[(a.op == "fwd" and "f" or "b") .. stage .. ":" .. a.mb] = clock[r]
        inflight[r] = inflight[r] + (a.op == "fwd" and 1 or -1)
        peak[r] = math.max(peak[r], inflight[r])
        pos[r], remaining, progressed = pos[r] + 1, remaining - 1, true
        a = compute[r][pos[r]]
      end
    end
    if not progressed then
      local waits = {}
      for r = 1, p do
        local a = compute[r][pos[r]]
        if a then waits[#waits + 1] = ("rank %d at %s of micro-batch %d, chunk %d"):format(r - 1, a.op, a.mb, a.chunk) end
      end
      error("pipeline schedule: deadlock: " .. table.concat(waits, "; "), 2)
    end
  end
  local makespan = 0
  for r = 1, p do makespan = math.max(makespan, clock[r]) end
  local ideal = m * v * (tf + tb)
  return { makespan = makespan, ideal = ideal, bubble = (makespan - ideal) / makespan, in_flight = peak,
    finish = clock }
end

--- pp.bubble_fraction(p, m[, v = 1]) -> the pipeline bubble's share of a
-- step for 1F1B (and GPipe) with p stages and m micro-batches,
-- (p - 1) / (m + p - 1), and for interleaved 1F1B with v chunks its idle
-- time divided by v: (p - 1) / (v m + p - 1) (Narayanan et al. 2021).
function M.bubble_fraction(p, m, v)
  v = v or 1
  return (p - 1) / (v * m + p - 1)
end

--- pp.timeline(s) -> text: one line per rank of its computing actions in
-- order, "F3" a forward and "B3" a backward of micro-batch 3 (with chunks,
-- "F3.2": chunk 2), for reading a schedule, e.g.
--   rank 0: F1 F2 F3 B1 F4 B2 B3 B4
function M.timeline(s)
  local lines = { ("%s: %d stages, %d micro-batch%s%s"):format(s.name, s.stages, s.micro_batches,
    s.micro_batches == 1 and "" or "es",
    s.chunks > 1 and (", %d chunks a rank"):format(s.chunks) or "") }
  for r = 1, s.stages do
    local parts = {}
    for _, a in ipairs(s.ranks[r]) do
      if a.op == "fwd" or a.op == "bwd" then
        parts[#parts + 1] = (a.op == "fwd" and "F" or "B") .. a.mb .. (s.chunks > 1 and ("." .. a.chunk) or "")
      end
    end
    lines[#lines + 1] = ("rank %d: %s"):format(r - 1, table.concat(parts, " "))
  end
  return table.concat(lines, "\n")
end

return M
