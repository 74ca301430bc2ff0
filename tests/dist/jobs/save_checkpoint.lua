-- tests/dist/jobs/save_checkpoint.lua: a job that trains a tiny GPT-2 for 2
-- steps under ZeRO (--stage, default 3) and saves a checkpoint into --out
-- (run.sh then samples its weights in one process with recipes/sample.lua).
-- --pp=N: the model split into N pipeline stages (the data-parallel group
-- what the job leaves; ZeRO stage 1 or 2, or 0 for AdamW).
local lt = require "lutra"
local cfg = lt.config { out = "", stage = 3, pp = 1 }
lt.dist.init()
if lt.dist.rank() == 0 then
  os.execute("mkdir -p " .. cfg.out .. "/data")
  lt.data.write_shard(cfg.out .. "/data/train_000000.bin", lt.randint(0, 512, { 4000 }, { generator = lt.Generator(3) }), 512)
end
lt.dist.barrier()
local mesh = lt.dist.mesh { pp = cfg.pp }
local model = lt.models.gpt2("gpt2-tiny", { generator = lt.Generator(5), pp = cfg.pp > 1 and mesh.pp or nil })
local ddp = lt.dist.DataParallel(model, { group = mesh.dp, gradients = cfg.stage >= 2 and "none" or "all_reduce" })
local opt = cfg.stage > 0 and lt.dist.Zero(model, { stage = cfg.stage, lr = 1e-3, group = mesh.dp })
  or lt.optim.AdamW(model:parameters(), { lr = 1e-3 })
local data = lt.data.shards { path = cfg.out .. "/data/train", batch = 2, seq = 16, seed = 9, rank = mesh.coords.dp,
  world = mesh.sizes.dp }
lt.train { model = model, optimizer = opt, train = data, steps = 2, quiet = true, out_dir = cfg.out, name = "job",
  ddp = ddp, ckpt_every = 2, accum = cfg.pp }
