--- lutra.plan (lt.plan): the arithmetic of a training run before it
-- starts. For a model (lutra.plan.shapes), a cluster (lutra.plan.hardware:
-- GPU type, count, GPUs per node) and a layout (lutra.plan.layout), it
-- predicts each rank's memory (lutra.plan.memory: the model state exactly
-- as lt.dist.memory_bytes counts it, activations, transient buffers), the
-- step time (lutra.plan.time), tokens/s and MFU, the time and cost of
-- training N tokens or of a period, the energy; it searches the layouts
-- that fit, and says when a claim is outside what the hardware does.
--
--   local plan = lt.plan
--   local d = plan.model("llama2-70b")
--   local r = plan.estimate(d, plan.layout { dp = 2, tp = 8, pp = 4, micro_batch = 1, global_batch = 512,
--     seq = 4096, recompute = "selective" }, { gpu = "h100", gpus = 64 })
--   print(plan.report(r))
--
-- recipes/plan.lua is its command line. The predictions are checked
-- against lutra's own measurements in tests/lua/plan_spec.lua and
-- tests/dist/plan_spec.lua (memory) and bench/plan.lua (time on the CPU).
local shapes = require "lutra.plan.shapes"
local layout = require "lutra.plan.layout"
local hardware = require "lutra.plan.hardware"
local memory = require "lutra.plan.memory"
local timing = require "lutra.plan.time"
local state = require "lutra.plan.state"
local measure = require "lutra.plan.measure"

local M = {}
M.layout = layout.new
M.layout_text = layout.text
M.hardware = hardware
M.memory, M.state, M.time, M.shapes = memory, state, timing, shapes
M.measure = measure.run

-- the largest MFU reported for dense-transformer training at scale, for the sanity check
M.published_mfu = {
  { 0.552, "MegaScale, 175B on 12288 A100 (Jiang et al. 2024)" },
  { 0.462, "PaLM 540B on 6144 TPU v4 (Chowdhery et al. 2022)" },
  { 0.43, "Llama 3 405B on 16K H100, 38-43% (Dubey et al. 2024)" },
}

--- plan.model(spec) -> a model description: spec a lutra model name
-- (shapes.named), a path to a Hugging Face config.json (or its
-- directory), or a table of recipes/gpt2.lua's flags (shapes.from_flags).
function M.model(spec)
  if type(spec) == "table" then return shapes.from_flags(spec) end
  if type(spec) ~= "string" then error("plan: the model must be a name, a config.json or a table of flags", 2) end
  if spec:match("%.json$") or spec:find("/", 1, true) then return shapes.from_hf(spec) end
  return shapes.named(spec)
end

--- plan.cluster{gpu = "h100", gpus = 8, gpus_per_node = 8} -> {gpu = the
-- spec (hardware.gpu), gpus, gpus_per_node, nodes}.
function M.cluster(c)
  c = c or {}
  local g = type(c.gpu) == "table" and c.gpu or hardware.gpu(c.gpu or "h100")
  local n, per = c.gpus or 1, c.gpus_per_node or 8
  if type(n) ~= "number" or n < 1 or n ~= math.floor(n) then
    error(("plan: gpus must be a whole number >= 1, got %s"):format(tostring(n)), 2)
  end
  return { gpu = g, gpus = n, gpus_per_node = per, nodes = math.ceil(n / per) }
end

--- plan.reserve(cluster) -> bytes a rank needs outside its tensors: on a
-- GPU the CUDA context, cuBLASLt's workspace and NCCL's buffers (1.5 GiB
-- assumed: about 0.5 GiB of context on Hopper and a few hundred MiB of
-- NCCL buffers per communicator); on the CPU nothing (the process's own
-- resident memory is measured apart).
function M.reserve(cluster)
  return cluster.gpu.key == "cpu" and 0 or 1.5 * 2 ^ 30
end

--- plan.estimate(desc, layout, cluster[, opts]) -> {desc, layout, cluster,
-- memory = (memory.estimate of the stage with the highest peak), stages
-- = (each stage's), need = (peak + fragmentation + reserve), fits,
-- time = (time.estimate), problems = {why it cannot run: ranks, memory,
-- divisibility}}. opts: mfu (assumed, default 0.4), reserve (bytes).
function M.estimate(d, L, cluster, opts)
  opts = opts or {}
  cluster = cluster.nodes and cluster or M.cluster(cluster) -- (a plan.cluster's, or its settings)
  local problems = {}
  if L.ranks ~= cluster.gpus then
    problems[#problems + 1] = ("dp %d x tp %d x pp %d = %d ranks, the cluster has %d GPUs"):format(L.dp, L.tp, L.pp,
      L.ranks, cluster.gpus)
  end
  local ok, err = pcall(function()
    if d.n_head % L.tp ~= 0 then error(("%d heads do not divide by tp %d"):format(d.n_head, L.tp), 0) end
    if d.ffn % L.tp ~= 0 then error(("the MLP's %d units do not divide by tp %d"):format(d.ffn, L.tp), 0) end
    if L.pp * L.v > d.n_layer then
      error(("pp %d x v %d stages for %d blocks"):format(L.pp, L.v, d.n_layer), 0)
    end
    if L.v > 1 and L.micro_batches % L.pp ~= 0 then
      error(("interleaved: %d micro-batches are not a multiple of pp %d"):format(L.micro_batches, L.pp), 0)
    end
    if L.sp and (L.micro_batch * L.seq) % L.tp ~= 0 then
      error(("sequence parallelism: %d tokens a micro-batch do not divide by tp %d"):format(L.micro_batch * L.seq,
        L.tp), 0)
    end
    if L.seq > d.max_seq and d.family == "gpt2" then
      error(("seq %d is longer than the model's %d positions"):format(L.seq, d.max_seq), 0)
    end
  end)
  if not ok then problems[#problems + 1] = tostring(err):gsub("^plan: ", "") end
  local r = { desc = d, layout = L, cluster = cluster, problems = problems, stages = {}, ok = false }
  if not ok then return r end
  -- (the first stage keeps the most micro-batches and the most blocks of an uneven split; the last the
  -- logits: those two bound the others)
  for _, s in ipairs(L.pp > 1 and { 0, L.pp - 1 } or { 0 }) do
    local e = memory.estimate(d, L, { pp = s })
    e.stage = s
    r.stages[#r.stages + 1] = e
    if not r.memory or e.peak > r.memory.peak then r.memory = e end
  end
  r.reserve = opts.reserve or M.reserve(cluster)
  r.need = r.memory.peak + r.memory.fragmentation + r.reserve
  r.fits = r.need <= cluster.gpu.memory
  if not r.fits then
    problems[#problems + 1] = ("memory: %s needed a GPU (stage %d), %s there"):format(M.gib(r.need),
      r.memory.stage, M.gib(cluster.gpu.memory))
  end
  r.time = timing.estimate(d, L, cluster.gpu, { gpus_per_node = cluster.gpus_per_node, mfu = opts.mfu })
  r.ok = #problems == 0
  return r
end

--- plan.cost(seconds, ranks, cluster[, {price = $ per GPU-hour, kwh_price
-- = $ per kWh, pue = 1.4}]) -> {gpu_hours, dollars, gpu_kw (the GPUs at
-- TDP), server_kw (whole servers at their maximum, GPUs included),
-- facility_kw (servers x PUE), kwh (facility), power_dollars}.
function M.cost(seconds, ranks, cluster, o)
  o = o or {}
  local hours = seconds / 3600
  local g = cluster.gpu
  local pue = o.pue or 1.4
  local gpu_kw = ranks * g.tdp / 1e3
  local server_kw = ranks * (g.server / 8) / 1e3
  local r = { hours = hours, gpu_hours = ranks * hours, gpu_kw = gpu_kw, server_kw = server_kw, pue = pue,
    facility_kw = server_kw * pue }
  r.dollars = o.price and r.gpu_hours * o.price or nil
  r.kwh = r.facility_kw * hours
  r.power_dollars = o.kwh_price and r.kwh * o.kwh_price or nil
  return r
end

--- plan.gib(bytes) -> "12.34 GiB" (or MiB below 1 GiB).
function M.gib(b)
  if b < 2 ^ 30 then return ("%.1f MiB"):format(b / 2 ^ 20) end
  return ("%.2f GiB"):format(b / 2 ^ 30)
end

local function human_time(s)
  if s < 1 then return ("%.0f ms"):format(s * 1e3) end
  if s < 120 then return ("%.1f s"):format(s) end
  if s < 7200 then return ("%.1f min"):format(s / 60) end
  if s < 3 * 86400 then return ("%.1f h"):format(s / 3600) end
  return ("%.1f days"):format(s / 86400)
end
M.human_time = human_time

--- plan.sanity(r, {claim_mfu =, claim_step_s =}) -> lines: a claimed MFU
-- above the published ones at scale (plan.published_mfu), the MFU a
-- claimed step time implies, and the planner's own MFU above them.
function M.sanity(r, o)
  o = o or {}
  local lines = {}
  local best = M.published_mfu[1]
  local function judge(what, mfu)
    if mfu > best[1] then
      lines[#lines + 1] = ("%s: MFU %.1f%% is above any published MFU at scale (the highest: %.1f%%, %s; "
        .. "others: %.1f%% %s, %.0f%% %s)"):format(what, mfu * 100, best[1] * 100, best[2], M.published_mfu[2][1] * 100,
        M.published_mfu[2][2], M.published_mfu[3][1] * 100, M.published_mfu[3][2])
    else
      lines[#lines + 1] = ("%s: MFU %.1f%%, within what is published at scale (up to %.1f%%, %s)"):format(what,
        mfu * 100, best[1] * 100, best[2])
    end
  end
  if o.claim_mfu then judge(("the claimed efficiency %.0f%%"):format(o.claim_mfu * 100), o.claim_mfu) end
  if o.claim_step_s and r.time then
    local m = timing.implied_mfu(r.desc, r.layout, r.cluster.gpu, o.claim_step_s)
    judge(("a claimed step of %.2f s (%d sequences of %d tokens)"):format(o.claim_step_s, r.layout.global_batch,
      r.layout.seq), m)
  end
  if r.time and r.time.mfu > best[1] then judge("this plan's own prediction (lower --mfu)", r.time.mfu) end
  return lines
end

--- plan.report(r[, {tokens =, price =, kwh_price =, pue =, days =,
-- claim_mfu =, claim_step_s =}]) -> the planner's text for one estimate:
-- model, layout, memory per GPU, step time, throughput, cost and energy,
-- sanity.
function M.report(r, o)
  o = o or {}
  local d, L, c = r.desc, r.layout, r.cluster
  local out = {}
  local function say(fmt, ...) out[#out + 1] = select("#", ...) > 0 and fmt:format(...) or fmt end
  local N = shapes.num_parameters(d)
  say("model      %s: %s, %d layers, width %d, %d heads%s, MLP %d, vocabulary %d: %.2fB parameters", d.name or d.family,
    d.family == "gpt2" and "GPT-2" or "Llama", d.n_layer, d.n_embd, d.n_head,
    d.n_kv_head ~= d.n_head and (" (%d key/value)"):format(d.n_kv_head) or "", d.ffn, d.vocab_size, N / 1e9)
  local pk = hardware.peak(c.gpu, L.dtype) or 0
  if c.gpu.key == "cpu" then
    say("cluster    %d x %s (%s)", c.gpus, c.gpu.name, M.gib(c.gpu.memory))
  else
    say("cluster    %d x %s (%s, %s peak %.0f TFLOP/s), %d GPUs a node, %d node%s", c.gpus, c.gpu.name,
      M.gib(c.gpu.memory), L.dtype, pk / 1e12, c.gpus_per_node, c.nodes, c.nodes == 1 and "" or "s")
  end
  say("layout     %s; global batch %d sequences = %s tokens", layout.text(L), L.global_batch,
    M.count(L.global_batch * L.seq))
  for _, p in ipairs(r.problems) do say("PROBLEM    %s", p) end
  if not r.memory then return table.concat(out, "\n") end
  local m, st = r.memory, r.memory.state
  say("")
  say("memory per GPU (stage %d of %d, the most; %d block%s there)", m.stage, L.pp, m.blocks, m.blocks == 1 and "" or "s")
  say("  parameters          %12s   (%s, this rank's %s)", M.gib(st.params), L.dtype,
    L.zero == 3 and "ZeRO-3 chunk" or (L.tp > 1 and "TP shard" or "copy"))
  say("  gradients           %12s   (after the step; during backward every gradient: %s)", M.gib(st.grads),
    M.gib(st.rounded.whole_grads))
  say("  optimizer state     %12s   (AdamW moments in f32%s%s)", M.gib(st.optimizer),
    L.dtype ~= "f32" and ", f32 master weights" or "", L.zero >= 1 and (", 1/%d each (ZeRO %d)"):format(L.dp, L.zero) or "")
  say("  activations         %12s   (%s a micro-batch x %.2f in flight, recompute %s, %s attention)",
    M.gib(m.activations), M.gib(m.per_micro_batch), m.in_flight, L.recompute, L.attention)
  say("  transient           %12s   (vocabulary-sized weight gradients in the making, or a recomputed block)",
    M.gib(m.transient))
  say("  comm buffers        %12s   (DataParallel's buckets, pipeline messages)", M.gib(m.comm_buffers))
  say("  peak (%s)%s%12s", m.peak_phase, (" "):rep(math.max(1, 13 - #m.peak_phase)), M.gib(m.peak))
  say("  fragmentation       %12s   (%.0f%% margin)", M.gib(m.fragmentation), 100 * (L.fragmentation or 0.05))
  say("  runtime reserve     %12s   (CUDA context, cuBLASLt workspace, NCCL buffers)", M.gib(r.reserve))
  say("  needed              %12s   of %s: %s", M.gib(r.need), M.gib(c.gpu.memory), r.fits and "fits" or "DOES NOT FIT")
  local t = r.time
  say("")
  say("step time  %s: compute %s at %.0f%% of peak%s, bubble %.1f%%, TP %s, DP %s (%s exposed), PP %s exposed",
    human_time(t.step_s), human_time(t.compute_s), 100 * (o.mfu or 0.4),
    t.recompute_share > 0 and (" (+%.1f%% recomputed)"):format(100 * t.recompute_share) or "",
    100 * t.bubble, human_time(t.tp_s), human_time(t.dp_s), human_time(t.dp_exposed_s), human_time(t.pp_exposed_s))
  local links = {}
  for _, k in ipairs { "tp", "dp", "pp" } do if t.links[k] then links[#links + 1] = k .. " over " .. t.links[k] end end
  if #links > 0 then say("           (%s)", table.concat(links, ", ")) end
  say("throughput %.0f tokens/s, MFU %.1f%%%s", t.tokens_per_s, 100 * t.mfu,
    t.recompute_share > 0 and (" (HFU %.1f%%)"):format(100 * t.hfu) or "")
  local ranks = L.ranks
  if o.tokens then
    local secs = o.tokens / t.tokens_per_s
    local k = M.cost(secs, ranks, c, o)
    say("train      %s tokens in %s: %.0f GPU-hours%s", M.count(o.tokens), human_time(secs), k.gpu_hours,
      k.dollars and (", $%s at $%.2f/GPU-h"):format(M.money(k.dollars), o.price) or "")
    say("energy     %.0f kWh at %.3g kW (servers %.3g kW x PUE %.2f; the GPUs alone at TDP %.3g kW)%s", k.kwh,
      k.facility_kw, k.server_kw, k.pue, k.gpu_kw,
      k.power_dollars and (": $%s at $%.3f/kWh"):format(M.money(k.power_dollars), o.kwh_price) or "")
  end
  if o.days then
    local secs = o.days * 86400
    local k = M.cost(secs, ranks, c, o)
    say("%-10s %.0f GPU-hours%s; %s tokens at this rate", ("%g days"):format(o.days), k.gpu_hours,
      k.dollars and (" x $%.2f = $%s"):format(o.price, M.money(k.dollars)) or "", M.count(t.tokens_per_s * secs))
    say("power      %.1f kW GPUs at TDP, %.1f kW servers, %.1f kW with PUE %.2f: %.0f kWh%s", k.gpu_kw, k.server_kw,
      k.facility_kw, k.pue, k.kwh, k.power_dollars and (", $%s at $%.3f/kWh"):format(M.money(k.power_dollars),
        o.kwh_price) or "")
  end
  for _, line in ipairs(M.sanity(r, o)) do say("sanity     %s", line) end
  return table.concat(out, "\n")
end

--- plan.count(n) -> "2T", "315B", "4.19M": a count of tokens in the largest unit at least 1.
function M.count(n)
  for _, u in ipairs { { 1e12, "T" }, { 1e9, "B" }, { 1e6, "M" }, { 1e3, "K" } } do
    if n >= u[1] then return ("%.3g%s"):format(n / u[1], u[2]) end
  end
  return ("%.0f"):format(n)
end

--- plan.money(x) -> "2,280,960" (whole dollars with thousands separators).
function M.money(x)
  local s = ("%.0f"):format(x)
  local out = s:reverse():gsub("(%d%d%d)", "%1,"):reverse()
  return (out:gsub("^,", ""))
end

-- the candidates of a search: every {dp, tp, pp, v, zero, micro_batch, recompute} over n GPUs, tp a
-- power of two within a node, pp dividing what tp leaves and at most the blocks
local function candidates(d, cluster, o)
  local n, out = cluster.gpus, {}
  local splits = {}
  for tp = 1, math.min(cluster.gpus_per_node, n) do
    for pp = 1, math.min(d.n_layer, n / tp) do
      if n % tp == 0 and bit.band(tp, tp - 1) == 0 and (n / tp) % pp == 0 then
        splits[#splits + 1] = { tp = tp, pp = pp, dp = n / tp / pp }
      end
    end
  end
  for _, sp in ipairs(splits) do
    for _, mb in ipairs(o.micro_batch_sizes or { 1, 2, 4, 8, 16 }) do
      for _, rc in ipairs(o.recompute or { "none", "selective", "full" }) do
        for _, z in ipairs(o.zero or { 0, 1, 2, 3 }) do
          for _, v in ipairs(sp.pp > 1 and (o.v or { 1, 2 }) or { 1 }) do
            out[#out + 1] = { dp = sp.dp, tp = sp.tp, pp = sp.pp, v = v, zero = z, micro_batch = mb, recompute = rc }
          end
        end
      end
    end
  end
  return out
end

--- plan.search(desc, cluster, {global_batch =, seq =, dtype = "bf16",
-- mfu = 0.4, micro_batch_sizes = {1, 2, 4, 8, 16}, recompute = {"none",
-- "selective", "full"}, zero = {0, 1, 2, 3}, v = {1, 2}, sp = true}) ->
-- fits (estimates that fit, fastest first), reasons ({why, n, example}
-- for those that do not, most first): every dp x tp x pp of the cluster's
-- GPUs with tp a power of two within a node and pp at most the blocks.
function M.search(d, cluster, o)
  cluster = cluster.nodes and cluster or M.cluster(cluster) -- (a plan.cluster's, or its settings)
  o = o or {}
  local fits, fails, order = {}, {}, {}
  local function fail(key, example)
    if not fails[key] then fails[key] = { n = 0, example = example }; order[#order + 1] = key end
    fails[key].n = fails[key].n + 1
  end
  for _, c in ipairs(candidates(d, cluster, o)) do
    if c.zero == 3 and c.pp > 1 then
      fail("ZeRO 3 with a pipeline (lutra refuses the pair)", ("tp %d pp %d zero 3"):format(c.tp, c.pp))
    else
      c.global_batch, c.seq, c.dtype = o.global_batch, o.seq, o.dtype or "bf16"
      c.sp, c.device = c.tp > 1 and (o.sp ~= false), cluster.gpu.key == "cpu" and "cpu" or "cuda"
      local ok, L = pcall(layout.new, c)
      if not ok then
        fail((tostring(L):gsub("^plan: ", ""):gsub("%d+", "N")), ("tp %d pp %d dp %d micro-batch %d zero %d"):format(
          c.tp, c.pp, c.dp, c.micro_batch, c.zero))
      elseif c.zero > 0 and c.dp == 1 then
        fail("ZeRO with one data-parallel rank (nothing to shard)", layout.text(L))
      else
        local r = M.estimate(d, L, cluster, o)
        if r.ok then
          fits[#fits + 1] = r
        else
          local why = r.problems[1]:gsub("%d+%.?%d*", "N")
          fail(why:match("^memory") and "memory: does not fit the GPU" or why, layout.text(L))
        end
      end
    end
  end
  table.sort(fits, function(a, b) return a.time.tokens_per_s > b.time.tokens_per_s end)
  local reasons = {}
  for _, k in ipairs(order) do reasons[#reasons + 1] = { why = k, n = fails[k].n, example = fails[k].example } end
  table.sort(reasons, function(a, b) return a.n > b.n end)
  return fits, reasons
end

--- plan.search_report(fits, reasons[, top = 10]) -> the table of the
-- fastest layouts that fit and the counts of those that do not, by reason.
function M.search_report(fits, reasons, top)
  top = top or 10
  local out = {}
  out[#out + 1] = ("%-4s %-92s %10s %7s %9s %10s"):format("rank", "layout", "tokens/s", "MFU", "step", "memory")
  for i = 1, math.min(top, #fits) do
    local r = fits[i]
    out[#out + 1] = ("%-4d %-92s %10.0f %6.1f%% %9s %10s"):format(i, layout.text(r.layout), r.time.tokens_per_s,
      100 * r.time.mfu, human_time(r.time.step_s), M.gib(r.need))
  end
  out[#out + 1] = ("%d layouts fit; %d do not:"):format(#fits, (function()
    local n = 0
    for _, x in ipairs(reasons) do n = n + x.n end
    return n
  end)())
  for _, x in ipairs(reasons) do out[#out + 1] = ("  %5d  %s (e.g. %s)"):format(x.n, x.why, x.example) end
  return table.concat(out, "\n")
end

return M
