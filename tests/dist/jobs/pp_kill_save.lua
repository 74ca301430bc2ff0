-- tests/dist/jobs/pp_kill_save.lua: a pipeline (pp = the job's ranks, a
-- tiny GPT-2, 1F1B, 2 micro-batches a step) trained by lt.train for 6
-- steps with a checkpoint every 2 into --dir; tests/dist/run.sh checks:
--   --kill=4    rank --rank (default 1) writes half of its model file of the
--               step-4 checkpoint and is killed by SIGKILL there (no handler
--               runs): the job ends, the step-4 checkpoint never complete
--   --resume    resume = "auto" from --dir: the newest complete checkpoint
--               (step 2), its steps 3 to 6 those of a run never killed
--   --dropout=p  the model's dropout (the stages' masks drawn from the
--               default generator that the checkpoint restores)
-- Each rank 0 prints "step S loss L" (%.17g) for every step it ran.
local lt = require "lutra"
local ffi = require "ffi"
local safetensors = require "lutra.safetensors"

local cfg = lt.config { kill = 0, rank = 1, resume = false, dir = "", dropout = 0 }
if cfg.dir == "" then error("pp_kill_save: --dir is required") end
local rank, world = lt.dist.init()
lt.dist.set_timeout(20)
ffi.cdef [[ int getpid(void); int kill(int pid, int sig); ]]

if cfg.kill > 0 and rank == cfg.rank then
  local save = safetensors.save
  safetensors.save = function(path, tensors, meta)
    if path:match(("step_%08d"):format(cfg.kill)) and path:match("/model%-pp%d+%.safetensors$") then
      local f = assert(io.open(path, "wb"))
      f:write(("x"):rep(4096)) -- (half a file)
      f:close()
      ffi.C.kill(ffi.C.getpid(), 9)
    end
    return save(path, tensors, meta)
  end
end

local mesh = lt.dist.mesh { pp = world }
local model = lt.models.gpt2 { n_layer = world, n_head = 2, n_embd = 16, block_size = 8, vocab_size = 37,
  generator = lt.Generator(7), pp = mesh.pp, dropout = cfg.dropout }
lt.manual_seed(5)
local opt = lt.optim.AdamW(model:parameters(), { lr = 1e-3 })
local ddp = lt.dist.DataParallel(model, { group = mesh.dp })
local loader = { i = 0 } -- micro-batch i from seed 11 + i
function loader:next()
  self.i = self.i + 1
  local x = lt.randint(0, 37, { 2, 9 }, { generator = lt.Generator(11 + self.i), dtype = "i64" })
  return x:narrow(2, 1, 8):contiguous(), x:narrow(2, 2, 8):contiguous()
end
function loader:state() return { epoch = 0, index = self.i, seed = 11 } end
function loader:load_state(s) self.i = s.index end

local s = lt.train { model = model, optimizer = opt, ddp = ddp, train = loader, steps = 6, accum = 2,
  name = "pp-kill-save", out_dir = cfg.dir, ckpt_every = 2, keep_last = 5, resume = cfg.resume and "auto" or "none",
  quiet = true, on_step = function(r)
    if rank == 0 then print(("step %d loss %.17g"):format(r.step, r.loss)) end
  end }
if rank == 0 then print(("resumed from %s"):format(tostring(s.resumed_from))) end
