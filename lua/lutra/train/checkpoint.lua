--- lutra.train.checkpoint (lt.train.checkpoint): lt.train's checkpoints on
-- lt.ckpt: resuming a run (resume = "auto", a directory, or "none") and
-- saving one (keep_last, a Ctrl-C during the save finishing it first).
--
--   local r = lt.train.checkpoint.resume { dir = "runs/x/ckpt", mode = "auto", model = m, optimizer = opt,
--     loader = train, rng = { default = lt.default_generator() } }
--   for step = r.start_step + 1, steps do
--     ...
--     local path, stop = lt.train.checkpoint.save { dir = "runs/x/ckpt", model = m, optimizer = opt,
--       loader = train, rng = rng, step = step, optimizer_steps = step, keep_last = 3 }
--     if stop then break end
--   end
local ckpt = require "lutra.ckpt"
local comm = require "lutra.dist.comm"
local records = require "lutra.dist.tp.records"
local config = require "lutra.config"
local C = require("lutra.capi").C

local M = {}

--- lt.train.checkpoint.resume{dir =, mode = "none" | "auto" | "<checkpoint dir>", model =,
-- optimizer =, loader =, rng =, ddp =, steps = (this run's last step), ckpt_every = 0,
-- start_step = 0, optimizer_steps = start_step[, level = 2]} -> r = {start_step =,
-- optimizer_steps =, skipped = (steps the checkpoint's run skipped as not
-- finite), resumed_from = (the checkpoint's path, or nil), resumed_steps =
-- (the steps its run was set for)}.
-- mode "auto" loads the newest checkpoint in dir whose files pass their
-- checksums (lt.ckpt.newest_verified), naming on stderr each newer one it
-- skips and why; none at all starts afresh; some but none passing is a
-- settings error; under ddp every rank checks the files itself and all
-- must find the same one. A directory loads that checkpoint. The loader's,
-- generators' (rng: name -> lt.Generator), model's and optimizer's states
-- are restored (a tensor-parallel or pipeline model: each rank's own files,
-- the same layout required; lt.ckpt.load; under a job a rank's failure is
-- raised on every rank, naming that rank and its message). On the lead rank a checkpoint set for another number of
-- steps is warned about on stderr. With ckpt_every > 0, a dir holding
-- checkpoints past the start is another run's history: a settings error.
-- Errors other than settings errors are raised at level (2: resume's caller).
function M.resume(o)
  local level = o.level or 2
  local dir, ddp = o.dir, o.ddp or nil
  -- (a tensor-parallel or pipeline model is a job's too: lt.ckpt saves and loads it on every rank)
  local job = (ddp or records.group(o.model) or (type(o.model) == "table" and rawget(o.model, "pp")))
    and comm.world_size() > 1
  local lead = not job or comm.rank() == 0
  local r = { start_step = o.start_step or 0, skipped = 0 }
  r.optimizer_steps = o.optimizer_steps or r.start_step
  local mode = o.mode or "none"
  local existing = ckpt.list(dir)
  local newest = existing[#existing]
  if mode ~= "none" then
    local path = mode
    if mode == "auto" then path = nil end
    if mode == "auto" then -- the newest whose files pass their checksums
      local skipped
      newest, skipped = ckpt.newest_verified(dir, function(p, why)
        if lead then io.stderr:write(("lutra: train: resume = \"auto\" skips %s: %s\n"):format(p, why)) end
      end)
      local mine = newest and newest.step or -1 -- (each rank checked the files itself: all must agree)
      local sums = ddp and ddp:reduce_numbers({ 1, mine, mine * mine }) -- (equal means: no spread)
      if sums and (sums[2] ~= sums[1] * mine or sums[3] ~= sums[1] * mine * mine) then
        error(("train: the ranks found different checkpoints in %s to pass their checksums (rank %d: %s)")
          :format(dir, comm.rank(), newest and newest.path or "none"), level)
      end
      if not newest and (skipped or 0) > 0 then -- (none at all: a fresh start)
        config.fail(("train: no checkpoint in %s passes its checks (each is named above); remove them to start afresh")
          :format(dir))
      end
      path = newest and newest.path
    end
    if path then
      local ok, st = pcall(ckpt.load, path, { model = o.model, opt = o.optimizer, loader = o.loader, rng = o.rng,
        dist = ddp ~= nil, verified = mode == "auto" })
      -- each rank reads (and checks) its own files: one that fails (its stage's file corrupt) fails
      -- every rank's resume with its message, instead of the others going on to wait for it
      local bad, why
      if job then bad, why = comm.first_error(ok, st) end
      if not ok and config.is_fail(st) then config.fail(st) end -- (a layout refused: the user's, no traceback)
      if bad then
        error(ok and ("train: rank %d cannot resume from %s: %s"):format(bad, path, why) or st, level)
      elseif not ok then
        error(st, level)
      end
      r.start_step, r.optimizer_steps = st.step, st.optimizer_steps or st.step
      r.skipped = st.extra and st.extra.skipped or 0
      r.resumed_steps = st.extra and st.extra.steps
      r.resumed_from = path
      if lead and r.resumed_steps and r.resumed_steps ~= o.steps then
        -- (a warning, quiet or not, before anything else can return)
        io.stderr:write(("lutra: train: the checkpoint's run was set for %d steps, this one for %d: a schedule "
          .. "over the steps (warmup, decay) continues on the new length\n"):format(r.resumed_steps, o.steps))
      end
    end
  end
  if (o.ckpt_every or 0) > 0 and newest and newest.step > r.start_step then
    -- (a settings error: the message alone, as for the recipe's own settings)
    config.fail(("train: %s already holds checkpoints up to step %d (another run's history); resume = \"auto\" continues it, or choose another name or ckpt_dir")
      :format(dir, newest.step))
  end
  return r
end

--- lt.train.checkpoint.save{dir =, model =, optimizer =, loader =, rng =, step =,
-- optimizer_steps =, config =, keep_last = 0 (all), ddp =, extra =} -> path, stop:
-- saves a checkpoint of step into dir (lt.ckpt.save: model, optimizer,
-- loader and generator states, config and extra; every rank's part under
-- ddp or a tensor-parallel model), keeping the newest keep_last. A Ctrl-C during the save waited for it
-- (lt.ckpt.save defers it); stop is true when one did: it is taken (cleared)
-- here, and the caller stops after this step with the checkpoint whole.
-- Raises lt.ckpt.save's errors.
function M.save(o)
  local path = ckpt.save(o.dir, { model = o.model, opt = o.optimizer, loader = o.loader, step = o.step, rng = o.rng,
    config = o.config or nil, optimizer_steps = o.optimizer_steps, keep_last = o.keep_last, dist = not not o.ddp,
    extra = o.extra })
  -- a Ctrl-C during the save waited for it (lt.ckpt.save defers it): taken
  -- now, the run stops after this step with the checkpoint whole
  local stop = C.lt_is_interrupted() ~= 0
  if stop then C.lt_clear_interrupt() end
  return path, stop
end

return M
