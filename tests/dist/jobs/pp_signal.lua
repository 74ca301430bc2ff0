-- tests/dist/jobs/pp_signal.lua: a signal to one rank of a pipeline trained
-- by lt.train (pp = the job's ranks, a tiny GPT-2, 1F1B with 2
-- micro-batches a step, 6 steps); tests/dist/run.sh checks the outcome.
-- During step 3 (in its loader's next) rank --rank (default 1) sends itself
--   --sig=INT   SIGINT (Ctrl-C): the job must end within seconds, naming the
--               rank ("train: interrupted (SIGINT) on rank R during step 3"),
--               not leave the other ranks waiting for its messages
--   --sig=TERM  SIGTERM (preemption): every rank stops after step 3 and the
--               checkpoint of step 3 is saved (--dir=<a directory>); each
--               rank prints "rank R stopped after step S, preempted SIGTERM"
local lt = require "lutra"
local ffi = require "ffi"

local cfg = lt.config { sig = "INT", rank = 1, dir = "" }
local rank, world = lt.dist.init()
lt.dist.set_timeout(20)
ffi.cdef [[ int getpid(void); int kill(int pid, int sig); ]]
local SIG = { INT = 2, TERM = 15 }
if not SIG[cfg.sig] then error("pp_signal: --sig must be INT or TERM") end

local mesh = lt.dist.mesh { pp = world }
local model = lt.models.gpt2 { n_layer = world, n_head = 2, n_embd = 16, block_size = 8, vocab_size = 37,
  generator = lt.Generator(7), pp = mesh.pp }
local opt = lt.optim.AdamW(model:parameters(), { lr = 1e-3 })
local ddp = lt.dist.DataParallel(model, { group = mesh.dp })

-- a loader with a state (preemption saves need one): micro-batch i from seed 11 + i
local loader = { i = 0 }
function loader:next()
  self.i = self.i + 1
  if self.i == 5 and rank == cfg.rank then ffi.C.kill(ffi.C.getpid(), SIG[cfg.sig]) end -- (step 3's first)
  local x = lt.randint(0, 37, { 2, 9 }, { generator = lt.Generator(11 + self.i), dtype = "i64" })
  return x:narrow(2, 1, 8):contiguous(), x:narrow(2, 2, 8):contiguous()
end
function loader:state() return { epoch = 0, index = self.i, seed = 11 } end
function loader:load_state(s) self.i = s.index end

local s = lt.train { model = model, optimizer = opt, ddp = ddp, train = loader, steps = 6, accum = 2,
  name = "pp-signal", out_dir = cfg.dir ~= "" and cfg.dir or "/tmp", log_every = 1, quiet = true }
print(("rank %d stopped after step %d, preempted %s"):format(rank, s.steps, tostring(s.preempted)))
