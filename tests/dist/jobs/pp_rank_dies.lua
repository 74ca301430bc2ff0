-- tests/dist/jobs/pp_rank_dies.lua: a pipeline stage's rank dies in the
-- middle of a training step; the whole job must end within seconds, with a
-- non-zero status, naming the rank (tests/dist/run.sh times it). Every rank
-- of the job is one stage (pp = the job's size) of a tiny GPT-2 trained by
-- lt.train.step under 1F1B with 4 micro-batches a step; during step 2, at
-- micro-batch 2, rank --rank (default: the last stage):
--   --how=error  raises an error (Lua) inside its stage's forward (--at=fwd)
--                or inside its backward (--at=bwd: from an autograd hook,
--                so it is raised by the engine while the stage's backward runs)
--   --how=kill   is killed by SIGKILL there (no handler, no MPI_Abort: the
--                runtime sees the process gone)
--   --catch      (with error) the error is caught, a full collection runs,
--                and it is raised again (as lt.train's loop rethrows)
-- The other ranks are then waiting for (or about to wait for) its messages
-- in irecv / isend, or in the step's collectives.
local lt = require "lutra"
local ffi = require "ffi"
local pipeline = require "lutra.models.pipeline"

local cfg = lt.config { how = "error", at = "fwd", rank = -1, catch = false }
local rank, world = lt.dist.init()
local dead = cfg.rank >= 0 and cfg.rank or world - 1
if cfg.how ~= "error" and cfg.how ~= "kill" then error("pp_rank_dies: --how must be error or kill") end
if cfg.at ~= "fwd" and cfg.at ~= "bwd" then error("pp_rank_dies: --at must be fwd or bwd") end

ffi.cdef [[ int getpid(void); int kill(int pid, int sig); ]]

local step, mb = 0, 0
local function die()
  io.stderr:write(("[rank %d] pp_rank_dies: dying (%s) in the %s of step %d, micro-batch %d\n"):format(rank, cfg.how,
    cfg.at == "fwd" and "forward" or "backward", step, mb))
  io.stderr:flush()
  if cfg.how == "kill" then ffi.C.kill(ffi.C.getpid(), 9) end
  error(("a deliberate failure on rank %d in its stage's %s"):format(rank, cfg.at == "fwd" and "forward" or "backward"))
end

-- the stage's forward, wrapped: the failing rank dies at step 2's second micro-batch
local forward = pipeline.stage_forward
local seen = 0
pipeline.stage_forward = function(...)
  seen = seen + 1
  mb = (seen - 1) % 4 + 1
  local target = rank == dead and step == 2 and mb == 2
  if target and cfg.at == "fwd" then die() end
  local out = forward(...)
  if target then out = lt.autograd.hook(die)(out) end
  return out
end

local mesh = lt.dist.mesh { pp = world }
local model = lt.models.gpt2 { n_layer = world, n_head = 2, n_embd = 16, block_size = 8, vocab_size = 37,
  generator = lt.Generator(7), pp = mesh.pp }
local opt = lt.optim.AdamW(model:parameters(), { lr = 1e-3 })
local S = lt.train.step.new { model = model, optimizer = opt, accum = 4, clip = 1, pp_schedule = "1f1b" }
local g = lt.Generator(11)
local function train()
  for s = 1, 3 do
    step = s
    S:run(s, function()
      local x = lt.randint(0, 37, { 2, 9 }, { generator = g, dtype = "i64" })
      return x:narrow(2, 1, 8):contiguous(), x:narrow(2, 2, 8):contiguous()
    end)
  end
end
if cfg.catch then
  -- as lt.train does: the step's error caught, work done (here a full
  -- collection: the failed step's garbage, the receives it had posted
  -- ahead among it), then raised again
  local ok, err = pcall(train)
  collectgarbage()
  if not ok then error(err, 0) end
else
  train()
end
print(("unreachable: rank %d finished 3 steps"):format(rank))
