-- tests/lua/jobs/resume_job.lua: a small training job for ckpt_spec.lua, run
-- as its own process: a tiny GPT-2 with dropout on shuffled shards, AdamW
-- with warmup and cosine, clipping, checkpoints every few steps. Options:
--   --data=DIR --out=DIR --name=NAME --steps=20 --ckpt_every=5 --resume=none
--   --kill_after=N   SIGKILL itself right after the step-N checkpoint is saved
--   --term_at=N      send itself --signal (15, SIGTERM; 10, SIGUSR1) during step N (preemption)
local lt = require "lutra"
local ffi = require "ffi"
pcall(ffi.cdef, "int getpid(void); int kill(int pid, int sig);")

local cfg = lt.config { data = "", out = "", name = "job", steps = 20, ckpt_every = 5, resume = "none",
  kill_after = 0, term_at = 0, signal = 15, keep_last = 0 }

lt.manual_seed(7)
local train = lt.data.shards { path = cfg.data .. "/train", batch = 2, seq = 16, seed = 3 }
local model = lt.models.gpt2("gpt2-tiny", { dropout = 0.1, generator = lt.Generator(11) })
local opt = lt.optim.AdamW(model, { lr = 3e-3, betas = { 0.9, 0.95 }, weight_decay = 0.1 })
local schedule = lt.optim.schedules.cosine { lr = 3e-3, warmup = 4, steps = cfg.steps, final = 3e-4 }

local s = lt.train {
  model = model, optimizer = opt, train = train, steps = cfg.steps, schedule = schedule, clip = 1.0,
  name = cfg.name, out_dir = cfg.out, quiet = true, ckpt_every = cfg.ckpt_every, resume = cfg.resume,
  keep_last = cfg.keep_last, config = cfg,
  on_step = function(rec)
    if rec.step == cfg.term_at then ffi.C.kill(ffi.C.getpid(), cfg.signal) end
  end,
  on_checkpoint = function(_, step)
    if step == cfg.kill_after then ffi.C.kill(ffi.C.getpid(), 9) end
  end,
}
print(("job: ran %d steps, preempted %s, resumed from %s"):format(s.steps, tostring(s.preempted),
  tostring(s.resumed_from)))
