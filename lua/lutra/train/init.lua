--- lutra.train (lt.train): the training loop recipes share.
--
--   local summary = lt.train {
--     model = model, optimizer = opt, train = train_loader, steps = 1000,
--     accum = 4, schedule = lt.optim.schedules.cosine { lr = 6e-4, warmup = 100, steps = 1000 },
--     clip = 1.0, val = val_loader, eval_every = 100, eval_batches = 20,
--     sample_every = 200, sample = { tokenizer = tok, prompt = "The", tokens = 64, temperature = 0.8, top_p = 0.95 },
--     name = "gpt2-pydocs",
--   }
--
-- Each optimizer step takes `accum` micro-batches from train:next() (x, y),
-- counts the targets that count (not ignore_index) over all of them first,
-- and backpropagates each micro-batch's summed token loss divided by that
-- total: the step's loss is the mean over every counted token of the step
-- and its gradients those of one large batch (a model whose class says its
-- loss method is F.cross_entropy(model(x), y, opts) computed its own way,
-- model.loss_is_cross_entropy == model.loss as for lt.models' GPT-2 and
-- Llama, computes it with model:loss: the head and the loss as one op;
-- otherwise F.cross_entropy(model(x), y)). Then it clips by global norm
-- (lt.optim's optimizers take the clip's factor into the update:
-- opt:step{grad_scale}; others clip the gradients), sets the schedule's
-- rate for this optimizer step, and steps. A step whose
-- loss or gradient norm is not finite stops training with a message naming
-- the step, or, with skip_nonfinite, is skipped and counted (the schedule
-- does not advance). Ctrl-C stops after a message naming the last complete
-- step (the summary's steps, loss and seconds are up to it): the step in
-- progress is dropped with its partial gradients, except that an update
-- once begun is finished and recorded first (lt_interrupt_defer), and so
-- is a checkpoint being saved (the loop then stops after that step). lutra then
-- exits with status 130 when the script ends. Under a job (ddp, several
-- ranks) a Ctrl-C taken on one rank raises instead, "train: interrupted
-- (SIGINT) on rank R ...", ending the job (the other ranks would wait for
-- it until the watchdog); SIGTERM is the signal that stops a job cleanly. Each evaluation
-- reads the same eval_batches batches of val (a loader with state and
-- load_state is restarted), so evaluations compare; a run that starts
-- afresh evaluates once before its first step too (step 0; eval_at_start =
-- false: not). Sampling (sample_every > 0) takes sample = {tokenizer =,
-- prompt = "\n", tokens = 64, temperature = 1 (0: greedy), top_k = 0 (all),
-- top_p = 1 (all), generator =} (see lt.generate).
--
-- Every setting that could only fail later is checked before the first
-- step: the sample settings and prompt (through lt.generate's own checks,
-- drawing nothing), the validation batches' length against the model's
-- context, the checkpoint directory (created) and config.
--
-- Checkpoints (lt.ckpt): with ckpt_every = N the loop saves the model,
-- optimizer, loader, generators (rng; by default the default generator and
-- the sample generator) and config every N steps and at the last step into
-- ckpt_dir (default runs/<name>/ckpt), keeping the newest keep_last. resume
-- = "auto" continues from the newest complete checkpoint there (or starts
-- afresh when there is none), resume = "<dir>" from that one, "none" (the
-- default) starts afresh; `steps` is the last step's number either way. On
-- SIGTERM or SIGUSR1 the loop finishes the current step, saves, and returns
-- with summary.preempted set (recipes then end, exiting 0); under a job,
-- a signal to any rank stops every rank after the same step (the ranks
-- learn of it with the step's loss sums). resume = "auto" takes the newest
-- checkpoint whose files pass their checksums, naming on stderr each newer
-- one it skips and why (none passing is an error).
--
-- Data parallel (ddp = lt.dist.DataParallel(model)): each rank's loader
-- gives its slice of the global batch; token counts and loss sums are
-- reduced over ranks, gradients all-reduced in buckets during the last
-- micro-batch's backward, so the logged loss is the single-process loss of
-- the global batch; rank 0 alone logs and samples (log_all_ranks = true: every
-- rank prints its lines too, prefixed "[rank N]"; metrics stay rank 0's).
--
-- Tensor parallel (a model with lt.dist.tp records, records.group(model)):
-- ddp is required, a DataParallel over the mesh's DP group (group =
-- mesh.dp; a group of one rank when dp = 1); the TP ranks of a DP rank
-- read the same batches. Token counts and loss sums are reduced over DP,
-- the gradient norm counts each parameter once (lt.train.step), and a
-- preemption signal stops every rank of the job after the same step.
-- Every rank evaluates (the forward's collectives need the whole TP
-- group; val must give the TP ranks the same batches; with the model's
-- own loss, model:loss, as a vocabulary-parallel head needs) and every rank
-- samples (rank 0 records): lt.generate must then run the model's TP
-- forward with identical draws on the TP ranks (see lutra.generate).
--
-- Pipeline parallel (a model split into stages, model.pp: lt.models.gpt2
-- or llama with pp = mesh.pp): ddp is required as under TP (its DP group;
-- a group of one rank when dp = 1), the stages read the same batches
-- (one batch stream; the loaders split by the DP rank only) and accum is
-- the micro-batches each step's schedule runs (pp_schedule = "1f1b",
-- "gpipe" or "interleaved", lt.train.step's). The loss sums come from the
-- last stage, summed over the pipeline, so rank 0 (stage 0) logs the
-- job's loss. Every rank evaluates (model:loss runs the forward-only
-- pipeline: val must give the stages the same batches). Sampling is
-- refused (sample_every > 0 raises before the first step): a stage holds
-- part of the model, and lt.generate's cached forward is one process's.
-- MFU counts the whole model's parameters (lt.train.log.num_parameters:
-- every stage's, summed over the pipeline), not this stage's.
--
-- Every step appends a JSON line to runs/<name>/metrics.jsonl; the first
-- step, every log_every-th and the last print one line: step, the step's
-- loss, the mean loss over the steps since the previous line ("mean(25)"),
-- lr, grad norm, ms, tokens/s, MFU (llm.c's FLOP count 6N + 6 L C T against
-- the assumed peak), memory now and its peak, the time since training
-- started and an estimate of the time left (from the mean time per step so
-- far, evaluations and samples included). Evaluations and samples go to
-- both as well. A line that cannot be written (a full disk) raises
-- "train: cannot write <file>: <reason>": a run does not go on unrecorded.
--
-- lt.train is built from parts a recipe can call on its own (a custom loop,
-- a pipeline schedule replacing the micro-batch loop):
--   lt.train.step        one optimizer step over micro-batches (accumulation,
--                        data-parallel reduction, clipping, schedule, update)
--   lt.train.evaluate    the validation loss over a loader's batches
--   lt.train.checkpoint  resume (none / auto / a directory) and save
--   lt.train.log         metrics.jsonl, the printed lines and their numbers
local random = require "lutra.random"
local comm = require "lutra.dist.comm"
local json = require "lutra.json"
local runtime = require "lutra.runtime"
local config = require "lutra.config"
local generate = require "lutra.generate"
local step_part = require "lutra.train.step"
local evaluate = require "lutra.train.evaluate"
local checkpoint = require "lutra.train.checkpoint"
local log = require "lutra.train.log"
local C = require("lutra.capi").C
local records = require "lutra.dist.tp.records"

local M = {}

local DEFAULTS = {
  model = false, optimizer = false, train = false, steps = false,
  accum = 1, schedule = false, clip = 0, val = false, eval_every = 0, eval_batches = 20,
  sample_every = 0, sample = false, name = "run", log_every = 1, ignore_index = -100,
  skip_nonfinite = false, peak_flops = false, flops_per_token = false, out_dir = "runs", quiet = false,
  on_step = false, start_step = 0, ckpt_every = 0, ckpt_dir = false, keep_last = 0, resume = "none", ddp = false,
  config = false, rng = false, on_checkpoint = false, log_all_ranks = false, eval_at_start = true,
  pp_schedule = false,
}
-- (pp_schedule: a stage model's schedule, "1f1b" (default; "interleaved" with virtual stages), "gpipe" or
-- "interleaved": lt.train.step's, lutra.dist.pp.executor)
local SAMPLE_KEYS = { tokenizer = true, prompt = true, tokens = true, temperature = true, top_k = true, top_p = true,
  generator = true }

local sorted_names = config.sorted_keys

--- lt.train.format_bytes(b) -> "12.3 MiB" (under 1 GiB) or "1.25 GiB" (lt.train.log.format_bytes).
M.format_bytes = log.format_bytes

--- lt.train.generate(model, ids, {tokens = 64, temperature = 1, top_k = 0, top_p = 1, generator = g, device =})
-- -> ids: the prompt ids (a Lua table) followed by the sampled ones
-- (lt.generate with the KV cache; temperature 0 is greedy; a prompt longer
-- than the context keeps its end). Bad settings raise lt.generate's errors.
function M.generate(model, ids, opts)
  opts = opts or {}
  if type(ids) ~= "table" or #ids == 0 then error("generate: needs at least one prompt token", 2) end
  local new = generate(model, ids, { max_tokens = opts.tokens or 64, temperature = opts.temperature or 1,
    top_k = opts.top_k or 0, top_p = opts.top_p or 1, generator = opts.generator, device = opts.device,
    truncate = "left" })
  local out = {}
  for i, v in ipairs(ids) do out[i] = v end
  for _, v in ipairs(new) do out[#out + 1] = v end
  return out
end

local function check_opts(raw)
  if type(raw) ~= "table" then error("train: expects a table of settings", 3) end
  for k in pairs(raw) do
    if DEFAULTS[k] == nil then
      local known = sorted_names(DEFAULTS)
      local near = config.nearest(tostring(k), known)
      error(("train: unknown setting '%s'%s (known: %s)"):format(tostring(k),
        near and (" (did you mean '%s'?)"):format(near) or "", table.concat(known, ", ")), 3)
    end
  end
  local o = {}
  for k, v in pairs(DEFAULTS) do o[k] = v end
  for k, v in pairs(raw) do o[k] = v end
  for _, k in ipairs { "model", "optimizer", "train", "steps" } do
    if not o[k] then error(("train: '%s' is required"):format(k), 3) end
  end
  local function whole(k, lo)
    local v = o[k]
    if type(v) ~= "number" or v ~= math.floor(v) or v < lo then
      error(("train: %s must be a whole number >= %d, got %s"):format(k, lo, tostring(v)), 4)
    end
  end
  whole("steps", 1)
  whole("accum", 1)
  whole("eval_every", 0)
  whole("eval_batches", 1)
  whole("sample_every", 0)
  whole("log_every", 1)
  whole("ckpt_every", 0)
  whole("keep_last", 0)
  whole("start_step", 0)
  if type(o.eval_at_start) ~= "boolean" then error("train: eval_at_start must be true or false", 3) end
  if type(o.resume) ~= "string" or o.resume == "" then
    error("train: resume must be \"none\", \"auto\" or a checkpoint directory", 3)
  end
  if type(o.clip) ~= "number" or o.clip < 0 then error("train: clip must be a number >= 0 (0: no clipping)", 3) end
  if o.eval_every > 0 and not o.val then error("train: eval_every needs a val loader", 3) end
  if o.sample_every > 0 and (type(o.sample) ~= "table" or not o.sample.tokenizer) then
    error("train: sample_every needs sample = {tokenizer =, prompt =, tokens =, temperature =}", 3)
  end
  if o.sample then
    local s = o.sample
    if type(s) ~= "table" then error("train: sample must be a table {tokenizer =, prompt =, tokens =, ...}", 3) end
    for k in pairs(s) do
      if not SAMPLE_KEYS[k] then
        local near = config.nearest(tostring(k), sorted_names(SAMPLE_KEYS))
        error(("train: unknown sample setting '%s'%s (known: %s)"):format(tostring(k),
          near and (" (did you mean '%s'?)"):format(near) or "", table.concat(sorted_names(SAMPLE_KEYS), ", ")), 3)
      end
    end
    if s.prompt ~= nil and type(s.prompt) ~= "string" then
      error(("train: sample.prompt must be a string, got %s"):format(type(s.prompt)), 3)
    end
    local t = s.tokens
    if t ~= nil and (type(t) ~= "number" or t ~= math.floor(t) or t < 1) then
      error(("train: sample.tokens must be a whole number >= 1, got %s"):format(tostring(t)), 3)
    end
    if s.tokenizer and (type(s.tokenizer.encode) ~= "function" or type(s.tokenizer.decode) ~= "function") then
      error("train: sample.tokenizer must have encode and decode (lt.tokenizer.load)", 3)
    end
  end
  local pp = type(o.model) == "table" and rawget(o.model, "pp") or nil
  if o.pp_schedule and pp == nil then
    error("train: pp_schedule is a pipeline's schedule: the model is not split into stages (lt.models.*{pp = mesh.pp})", 3)
  end
  if o.pp_schedule and o.pp_schedule ~= "1f1b" and o.pp_schedule ~= "gpipe" and o.pp_schedule ~= "interleaved" then
    error(("train: pp_schedule must be \"1f1b\", \"gpipe\" or \"interleaved\", got %s"):format(tostring(o.pp_schedule)), 3)
  end
  if o.sample_every > 0 and pp then
    error(("train: sampling (sample_every = %d) is not available with a pipeline-parallel model (this rank holds "
      .. "stage %d of %d): use sample_every = 0, and sample from a checkpoint's whole weights (recipes/sample.lua)")
      :format(o.sample_every, pp.rank, pp.size), 3)
  end
  if o.schedule and type(o.schedule) ~= "function" then error("train: schedule must be a function of the step", 3) end
  for _, g in ipairs(o.optimizer.groups or {}) do
    if not o.schedule and not (g.lr > 0) then error(("train: the learning rate must be > 0, got %s"):format(tostring(g.lr)), 3) end
  end
  if o.schedule then
    local lr1 = o.schedule(1)
    if type(lr1) ~= "number" or lr1 ~= lr1 or lr1 < 0 then error("train: the schedule's rate at step 1 is " .. tostring(lr1), 3) end
  end
  return o
end

--- lt.train(settings) -> summary {steps =, loss =, val_loss =, val_step = (the step val_loss was measured at), skipped =, tokens =, seconds =, interrupted =,
-- preempted =, checkpoint =, resumed_from =, optimizer_steps =}; steps counts the steps this call ran.
function M.run(settings)
  local o = check_opts(settings)
  local model, opt = o.model, o.optimizer
  local params = opt:parameters()
  local device = params[1] and params[1].device or "cpu"
  local peak, peak_text = log.default_peak(device)
  if o.peak_flops then peak, peak_text = o.peak_flops, ("%.3g FLOP/s (given)"):format(o.peak_flops) end
  local pp = type(model) == "table" and rawget(model, "pp") or nil
  if (o.ddp or pp) and comm.world_size() > 1 then -- tokens/s are the job's: so is the peak
    peak, peak_text = peak * comm.world_size(), ("%d ranks x %s"):format(comm.world_size(), peak_text)
  end

  local dir = o.out_dir .. "/" .. o.name
  local ckpt_dir = o.ckpt_dir or (dir .. "/ckpt")
  local rng = o.rng
  if not rng then
    rng = { default = random.default_generator() }
    if type(o.sample) == "table" and o.sample.generator then rng.sample = o.sample.generator end
  end
  local summary = { steps = 0, skipped = 0, tokens = 0, interrupted = false }
  -- what checkpoints need, checked before any step: a loader with a state,
  -- a config that JSON can hold, and a directory that holds no other history
  local ddp = o.ddp or nil
  local tp = records.group(model)
  if (tp or pp) and not ddp then -- (the loop's lead rank, its agreements and its signals go through ddp)
    local how = tp and pp and ("tensor-parallel over %d ranks and split into %d pipeline stages"):format(tp:size(), pp.size)
      or tp and ("tensor-parallel over %d ranks"):format(tp:size()) or ("split into %d pipeline stages"):format(pp.size)
    error(("train: the model is %s: pass ddp = lt.dist.DataParallel(model, {group = "
      .. "mesh.dp}) (its data-parallel group; a group of one rank when dp = 1)"):format(how), 2)
  end
  -- under data parallelism rank 0 alone prints, warns and writes the metrics
  local lead = not ddp or comm.rank() == 0
  if ddp and opt.sharded then
    -- ZeRO 2 and 3 reduce-scatter the gradients themselves; stage 1 takes them all-reduced
    local want = opt.stage >= 2 and "none" or "all_reduce"
    if (ddp.reduce and want == "none") or (not ddp.reduce and want == "all_reduce") then
      error(("train: ZeRO stage %d needs DataParallel{gradients = \"%s\"}"):format(opt.stage, want), 2)
    end
  elseif ddp and not ddp.reduce then
    error("train: DataParallel{gradients = \"none\"} leaves gradients unreduced: use it with lt.dist.Zero{stage = 2 or 3}", 2)
  end
  local can_save = type(o.train.state) == "function" and type(o.train.load_state) == "function"
  if (o.ckpt_every > 0 or o.resume ~= "none") and not can_save then
    error("train: checkpoints need a training loader with state() and load_state() (lt.data.shards has them)", 2)
  end
  if o.config then
    local bad = json.find_unencodable(o.config)
    if bad then error(("train: config.%s cannot be saved in a checkpoint (%s)"):format(bad.path, bad.why), 2) end
  end
  local resumed = checkpoint.resume { dir = ckpt_dir, mode = o.resume, model = model, optimizer = opt,
    loader = o.train, rng = rng, ddp = ddp, steps = o.steps, ckpt_every = o.ckpt_every, start_step = o.start_step,
    level = 3 }
  local start_step, resumed_from = resumed.start_step, resumed.resumed_from
  local opt_step = resumed.optimizer_steps -- optimizer steps taken (the schedule's clock)
  if resumed_from then summary.skipped = resumed.skipped end
  if resumed_from and start_step >= o.steps then
    if not o.quiet then print(("train: %s is at step %d, the last step: nothing to do"):format(resumed_from, start_step)) end
    return { steps = 0, skipped = summary.skipped, tokens = 0, interrupted = false, seconds = 0,
      optimizer_steps = opt_step, resumed_from = resumed_from }
  end
  if start_step >= o.steps then
    error(("train: the run starts at step %d, at or past its last step %d (steps is the last step's number)")
      :format(start_step, o.steps), 2)
  end

  -- the first batch decides the shapes; checked before any update
  local first_x, first_y = o.train:next()
  if not first_x then error("train: the training loader gave no batch", 2) end
  local T = first_x:size(first_x:dim())
  local block = model.config and model.config.block_size
  if block and T > block then
    error(("train: the sequence length %d is longer than the model's context (block_size %d)"):format(T, block), 2)
  end
  local fpt = o.flops_per_token or log.flops_per_token(model, T) -- (a pipeline's: collective, its whole model)

  -- what sampling will do, checked now: the prompt's ids and the settings,
  -- by lt.generate itself (max_tokens = 0 without the cache: no forward, no draw)
  local sample_ids
  local sampler = lead or tp ~= nil -- (under TP every rank: the forward's collectives)
  if o.sample_every > 0 and sampler then
    local s = o.sample
    sample_ids = s.tokenizer:encode(s.prompt or "\n")
    if #sample_ids == 0 then sample_ids = { s.tokenizer.eot } end -- (an empty prompt: from the document start)
    if #sample_ids == 0 then error("train: sample.prompt encodes to no token, and the tokenizer has no eot", 2) end
    local ok, err = pcall(generate, model, sample_ids, { max_tokens = 0, cache = false, truncate = "left",
      temperature = s.temperature or 1, top_k = s.top_k or 0, top_p = s.top_p or 1, generator = s.generator,
      device = device })
    if not ok then error("train: sample: " .. tostring(err):gsub("^.-generate: ", ""), 2) end
  end
  -- the validation batches must fit the model's context: one read, then restarted
  local val_start = o.val and type(o.val.state) == "function" and type(o.val.load_state) == "function" and o.val:state()
  if o.eval_every > 0 and val_start then
    local vx = o.val:next()
    o.val:load_state(val_start)
    if not vx then error("train: the val loader gave no batch", 2) end
    if block and vx:size(vx:dim()) > block then
      error(("train: the validation batches' sequence length %d is longer than the model's context (block_size %d)")
        :format(vx:size(vx:dim()), block), 2)
    end
  end
  -- checkpoints: their directory is made now (a path that cannot be one fails before any step)
  if o.ckpt_every > 0 and lead then log.mkdir_p(ckpt_dir, 3) end

  local out = log.open { dir = dir, quiet = o.quiet, ddp = ddp, log_all_ranks = o.log_all_ranks, level = 3 }
  local metrics_path = out.metrics_path
  local function record(t) out:record(t) end
  local function say(line) out:say(line) end
  -- each run appends: a line marks where it starts (and what it resumed)
  record({ run = o.name, start_step = start_step, resumed_from = resumed_from or nil, steps = o.steps,
    time = os.time() })
  if resumed_from then say(("train: resuming from %s (step %d)"):format(resumed_from, start_step))
  elseif o.resume == "auto" then say(("train: no checkpoint in %s: starting afresh"):format(ckpt_dir)) end
  say(("train: %s, %d steps of %d micro-batch%s, MFU against %s, metrics in %s/metrics.jsonl"):format(o.name, o.steps,
    o.accum, o.accum == 1 and "" or "es", peak_text, dir))
  if o.log_every > 1 then
    say(("train: a line at the first step and every %d steps: loss is the step's, mean(n) the mean of the n steps' losses since the line before")
      :format(o.log_every))
  end

  -- every evaluation reads the same validation batches (a restartable loader restarts: val_start)
  local pending = { first_x, first_y }
  local function next_batch()
    if pending then
      local x, y = pending[1], pending[2]
      pending = nil
      return x, y
    end
    local x, y = o.train:next()
    if not x then error("train: the training loader ran out of batches", 0) end
    return x, y
  end

  local t_start = runtime.clock()
  local t_done = t_start -- when the last complete step (and its evaluation, sample) ended
  local t_loop = t_start -- (when the first step starts)
  local interval_sum, interval_n = 0, 0 -- the finite losses since the last printed line

  -- a Ctrl-C (SIGINT) taken on one rank of a job: the others would wait for
  -- it in their next collective or pipeline message until the watchdog; the
  -- job ends at once instead, naming the rank (a preemption signal to one
  -- rank, SIGTERM or SIGUSR1, is agreed by every rank: they stop after the
  -- same step and save)
  local function job_interrupted(when)
    if ddp and comm.world_size() > 1 then
      error(("train: interrupted (SIGINT) on rank %d %s: the job's other ranks would wait for it, so the job ends "
        .. "(SIGTERM or SIGUSR1 to a rank stops every rank after the same step and saves)"):format(comm.rank(), when), 0)
    end
  end

  local function save(step)
    local t0 = runtime.clock()
    local path, stop = checkpoint.save { dir = ckpt_dir, model = model, optimizer = opt, loader = o.train, step = step,
      rng = rng, config = o.config or nil, optimizer_steps = opt_step, keep_last = o.keep_last, ddp = ddp,
      extra = { skipped = summary.skipped, steps = o.steps } }
    record({ step = step, checkpoint = path })
    say(("step %5d/%d | saved %s in %.1f s"):format(step, o.steps, path, runtime.clock() - t0))
    if o.on_checkpoint then o.on_checkpoint(path, step) end
    if stop then
      job_interrupted(("during step %d's checkpoint (%s, complete)"):format(step, path))
      summary.interrupted = true
      say(("train: interrupted after step %d (loss %.4f) during its checkpoint, which was completed first; metrics in %s")
        :format(step, summary.loss, metrics_path))
    end
    return path
  end

  -- the optimizer step: micro-batches, reduction, clipping, schedule, update
  local stepper = step_part.new { model = model, optimizer = opt, accum = o.accum, clip = o.clip,
    ignore_index = o.ignore_index, ddp = ddp, device = device, schedule = o.schedule or nil,
    skip_nonfinite = o.skip_nonfinite, optimizer_steps = opt_step, pp_schedule = o.pp_schedule or nil }
  local job_signal = 0 -- a job's preemption signal, agreed by every rank at each step
  -- the validation loss (ZeRO 3: every rank gathers the whole parameters first)
  local function validate(step)
    if val_start then o.val:load_state(val_start) end
    local vl = evaluate(model, o.val, { batches = o.eval_batches, ignore_index = o.ignore_index, device = device,
      own_loss = tp ~= nil or pp ~= nil })
    summary.val_loss, summary.val_step = vl, step
    record({ step = step, val_loss = vl })
    say(("step %5d/%d | val loss %.4f%s"):format(step, o.steps, vl, step == 0 and " (before training)" or ""))
    return vl
  end

  local function one_step(step)
    stepper.skipped = summary.skipped
    local r = stepper:run(step, next_batch, { keep_deferred = true })
    opt_step, summary.skipped = stepper.optimizer_steps, stepper.skipped
    if r.signal then job_signal = r.signal end
    local loss, norm, lr, finite, tokens = r.loss, r.grad_norm, r.lr, r.finite, r.tokens
    local now = r.finished
    local dt = r.seconds
    summary.tokens = summary.tokens + tokens
    summary.loss = loss
    local tps = tokens / dt
    local mfu = fpt and tps * fpt / peak or nil
    if finite then interval_sum, interval_n = interval_sum + loss, interval_n + 1 end
    -- printed: the first step of the run, every log_every-th and the last
    local printed = step == start_step + 1 or step % o.log_every == 0 or step == o.steps
    -- on printed steps the tensors Lua has not collected yet go first, so
    -- the memory printed is what the step keeps (after the timing)
    if printed then collectgarbage() end
    local mem, mem_peak = log.memory_now(device)
    -- the time left: the mean time per step so far (evaluations, samples and checkpoints included)
    local elapsed, done = now - t_start, step - start_step
    local eta = (now - t_loop) / done * (o.steps - step)
    local rec = { step = step, loss = loss, lr = lr, grad_norm = norm, ms = dt * 1e3, tokens_per_s = tps, mfu = mfu,
      mem = mem, mem_peak = mem_peak, elapsed_s = elapsed, eta_s = eta, skipped = not finite or nil }
    local mean
    if printed then
      mean = interval_n > 0 and interval_sum / interval_n or 0 / 0
      rec.loss_mean, rec.loss_mean_steps = mean, interval_n
    end
    record(rec)
    summary.steps = summary.steps + 1 -- (complete: updated and recorded)
    t_done = runtime.clock()
    C.lt_interrupt_defer(0, nil)
    if C.lt_is_interrupted() ~= 0 then
      C.lt_clear_interrupt()
      error("interrupted!", 0)
    end
    if printed then
      say(log.step_line { step = step, steps = o.steps, loss = loss, mean_steps = interval_n, mean = mean, lr = lr,
        grad_norm = norm, ms = dt * 1e3, tokens_per_s = tps, mfu = mfu, mem = mem, mem_peak = mem_peak,
        elapsed_s = elapsed, eta_s = eta, skipped = not finite })
      interval_sum, interval_n = 0, 0
    end
    if o.on_step then o.on_step(rec) end
    local evaluating = o.val and o.eval_every > 0 and (step % o.eval_every == 0 or step == o.steps)
    local sampling = o.sample_every > 0 and (step % o.sample_every == 0 or step == o.steps)
    -- ZeRO 3: every rank gathers the whole parameters for evaluation and sampling
    local unsharded = (evaluating or sampling) and opt.unshard and not opt.full
    if unsharded then opt:unshard() end
    if evaluating then validate(step) end
    if sampler and sampling then
      local s = o.sample
      local ids = M.generate(model, sample_ids, { tokens = s.tokens or 64, temperature = s.temperature or 1,
        top_k = s.top_k, top_p = s.top_p, generator = s.generator, device = device })
      if lead then
        local text = s.tokenizer:decode(ids, { errors = "replace" }) -- (valid UTF-8 in the log and the JSON)
        -- (a sampled NUL byte, which the JSON writer cannot hold, recorded as U+2400, the symbol for null)
        record({ step = step, sample = (text:gsub("%z", "\226\144\128")) })
        say(("---- sample at step %d ----\n%s\n----"):format(step, text))
      end
    end
    if unsharded then opt:reshard() end
    t_done = runtime.clock()
  end

  -- preemption saves need a loader state; without one SIGTERM keeps its usual effect
  C.lt_preempt_clear()
  if can_save then C.lt_preempt_watch(1) end
  local ok_all, err_all = pcall(function()
    -- a fresh run's validation loss before any step: what training improves on
    if o.val and o.eval_every > 0 and o.eval_at_start and start_step == 0 then
      local unsharded = opt.unshard and not opt.full
      if unsharded then opt:unshard() end
      local ok, err = pcall(validate, 0)
      if unsharded then opt:reshard() end
      if not ok then
        if not tostring(err):find("interrupted", 1, true) then error(err, 0) end
        job_interrupted("during the evaluation before step 1")
        summary.interrupted = true
        say(("train: interrupted before step 1; metrics in %s/metrics.jsonl"):format(dir))
        return
      end
    end
    t_loop = runtime.clock()
    for step = start_step + 1, o.steps do
      local ok, err = pcall(one_step, step)
      if not ok then
        C.lt_interrupt_defer(0, nil) -- (an error inside the update)
        if tostring(err):find("interrupted!", 1, true) then
          -- Ctrl-C: the step in progress is dropped, with its partial gradients
          -- (one that was updated and recorded counts: it stopped in its evaluation or sample)
          job_interrupted(("during step %d"):format(step))
          summary.interrupted = true
          local last = start_step + summary.steps
          if last < step then opt:zero_grad() end
          if last == step then
            say(("train: interrupted after step %d (loss %.4f), metrics in %s"):format(step, summary.loss, metrics_path))
          elseif last > start_step then
            say(("train: interrupted during step %d; the last complete step is %d (loss %.4f), metrics in %s")
              :format(step, last, summary.loss, metrics_path))
          else
            say(("train: interrupted during step %d, before a step of this run was complete; metrics in %s")
              :format(step, metrics_path))
          end
          break
        end
        error(err, 0)
      end
      local sig = ddp and job_signal or C.lt_preempt_signal()
      if sig ~= 0 then
        summary.preempted = sig == 15 and "SIGTERM" or "SIGUSR1"
        say(("train: %s at step %d: saving and stopping"):format(summary.preempted, step))
        summary.checkpoint = save(step)
        break
      end
      if o.ckpt_every > 0 and (step % o.ckpt_every == 0 or step == o.steps) then
        summary.checkpoint = save(step)
        if summary.interrupted then break end
      end
    end
  end)
  C.lt_preempt_watch(0)
  local closed, err = out:close()
  if ok_all and not closed then ok_all, err_all = false, ("train: cannot write %s: %s"):format(metrics_path, tostring(err)) end
  if not ok_all then error(err_all, 0) end
  summary.seconds = (summary.interrupted and t_done or runtime.clock()) - t_start
  summary.optimizer_steps = opt_step
  summary.resumed_from = resumed_from
  return summary
end

-- the parts, for loops of one's own
M.step = step_part
M.evaluate = evaluate
M.checkpoint = checkpoint
M.log = log

setmetatable(M, { __call = function(_, settings) return M.run(settings) end })

return M
