--- lutra.plan.measure: runs a layout for real on this machine, so the
-- planner's predictions can be checked against what lutra does: the
-- model of a planner model description (lutra.plan.shapes) built with the
-- layout's tensor- and pipeline-parallel groups, DataParallel, ZeRO or
-- AdamW as recipes/gpt2.lua builds them, and a few lt.train steps on
-- random tokens. It returns the bytes lt.dist.memory_bytes counts after
-- the last step, the peak of live tensors over the steps after the first
-- (the allocator's statistics), the process's resident set, and the step
-- time.
--
--   local m = lt.plan.measure(desc, layout, {steps = 3})
--
-- Under mpirun every rank of the job calls it with the same arguments
-- (ranks = dp x tp x pp); each rank returns its own numbers.
local tensor = require "lutra.tensor"
local runtime = require "lutra.runtime"
local comm = require "lutra.dist.comm"
local models = require "lutra.models"
local random = require "lutra.random"
local train = require "lutra.train"
local dist = require "lutra.dist"
local optim = require "lutra.optim"

local M = {}

--- measure.rss() -> resident bytes now, their high-water mark (Linux
-- /proc/self/status VmRSS and VmHWM); nil where that file is missing.
function M.rss()
  local f = io.open("/proc/self/status", "r")
  if not f then return nil end
  local text = f:read("*a")
  f:close()
  local rss, hwm = text:match("VmRSS:%s*(%d+) kB"), text:match("VmHWM:%s*(%d+) kB")
  return rss and tonumber(rss) * 1024, hwm and tonumber(hwm) * 1024
end

-- the lutra model of a description, with the layout's groups
local function build(desc, L, mesh)
  local cfg = {}
  for k, v in pairs(desc.config) do cfg[k] = v end
  cfg.generator = random.Generator(1)
  cfg.recompute = L.recompute
  if L.tp > 1 then cfg.tp, cfg.sequence_parallel = mesh.tp, L.sp end
  if L.pp > 1 then
    cfg.pp = mesh.pp
    if L.v > 1 then cfg.virtual_stages = L.v end
  end
  return models[desc.family](cfg)
end

--- measure.run(desc, layout[, {steps = 3}]) -> {params =, grads =,
-- optimizer =, buffers = (lt.dist.memory_bytes after the last step),
-- peak = (the most bytes of live CPU tensors in the steps after the
-- first), base = (bytes live before the model was built), rss_base =,
-- rss_peak = (the resident set before building, its high-water mark at
-- the end), step_s = (the mean seconds of the steps after the first)}.
-- desc: lutra.plan.shapes.describe's; layout: lutra.plan.layout's, whose
-- dp x tp x pp must be the job's ranks. CPU and f32 only (the checks this
-- serves run there). Raises when the ranks do not match.
function M.run(desc, L, opts)
  opts = opts or {}
  local steps = opts.steps or 3
  comm.init()
  local world = comm.world_size()
  if L.dp * L.tp * L.pp ~= world then
    error(("plan.measure: the layout needs dp %d x tp %d x pp %d = %d ranks, the job has %d"):format(L.dp, L.tp, L.pp,
      L.dp * L.tp * L.pp, world), 2)
  end
  runtime.collect_garbage()
  local base = runtime.memory_stats().allocated
  local rss_base = M.rss()
  local mesh = world > 1 and dist.mesh { tp = L.tp, pp = L.pp } or nil
  local model = build(desc, L, mesh)
  local ddp = world > 1 and dist.DataParallel(model, { gradients = L.zero >= 2 and "none" or "all_reduce",
    group = mesh.dp }) or nil
  local settings = { lr = 1e-4, betas = { 0.9, 0.95 }, weight_decay = 0.1 }
  local opt
  if L.zero > 0 then
    settings.stage, settings.group = L.zero, mesh and mesh.dp or nil
    opt = dist.Zero(model, settings)
  else
    opt = optim.AdamW(model, settings)
  end
  local V = desc.vocab_size
  local g = random.Generator(7 + (mesh and mesh.coords.dp or 0))
  local data = { next = function()
    local x = random.randint(0, V, { L.micro_batch, L.seq + 1 }, { generator = g, dtype = "i64" })
    return x:narrow(2, 1, L.seq):contiguous(), x:narrow(2, 2, L.seq):contiguous()
  end }
  local out = { base = base, rss_base = rss_base }
  local t1
  runtime.collect_garbage()
  -- the collector runs without pause while measuring, so that tensors already dropped (a step's
  -- temporaries, last step's gradients) are freed about when they are dropped and the peak is that
  -- of the live tensors, what the planner predicts; the usual settings come back at the end
  local pause, stepmul = collectgarbage("setpause", 100), collectgarbage("setstepmul", 400)
  local ok, err = pcall(train.run, { model = model, optimizer = opt, train = data, steps = steps, accum = L.micro_batches, clip = 1.0,
    quiet = true, ddp = ddp, out_dir = os.tmpname() .. "-plan", log_every = steps + 1,
    pp_schedule = L.pp > 1 and L.schedule or nil,
    on_step = function(rec)
      if rec.step == 1 then
        runtime.collect_garbage()
        runtime.reset_peak_memory_stats()
        t1 = runtime.clock()
      end
      if rec.step == steps then
        local mb = dist.memory_bytes(model, opt, ddp)
        out.params, out.grads, out.optimizer, out.buffers = mb.params, mb.grads, mb.optimizer, mb.buffers
        out.peak = runtime.memory_stats().peak - base
        out.step_s = (runtime.clock() - t1) / math.max(steps - 1, 1)
      end
    end })
  collectgarbage("setpause", pause)
  collectgarbage("setstepmul", stepmul)
  if not ok then error(err, 0) end
  local _, hwm = M.rss()
  out.rss_peak = hwm
  return out
end

return M
