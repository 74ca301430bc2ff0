--- bench/comm.lua: all_reduce bandwidth over the job's ranks, as nccl-tests
-- reports it: for sizes from 1 KB to 256 MB (f32), the time per call, the
-- algorithm bandwidth (bytes / time) and the bus bandwidth (algbw x 2(n-1)/n,
-- what each link carries in a ring all-reduce). CPU tensors through MPI.
--
--   mpirun -np 2 ./lutra bench/comm.lua [--max_mb=256] [--iters=20]
local lt = require "lutra"

local cfg = lt.config { max_mb = 256, iters = 20, warmup = 3 }
local rank, world = lt.dist.init()
if rank == 0 then
  print(("all_reduce (sum, f32) over %d ranks through MPI"):format(world))
  print(("%12s %12s %12s %12s"):format("bytes", "time (us)", "algbw (GB/s)", "busbw (GB/s)"))
end
local bytes = 1024
while bytes <= cfg.max_mb * 2 ^ 20 do
  local t = lt.ones({ bytes / 4 })
  local iters = bytes >= 64 * 2 ^ 20 and math.max(3, math.floor(cfg.iters / 4)) or cfg.iters
  for _ = 1, cfg.warmup do lt.dist.all_reduce(t) end
  lt.dist.barrier()
  local t0 = lt.clock()
  for _ = 1, iters do lt.dist.all_reduce(t) end
  local dt = (lt.clock() - t0) / iters
  -- the slowest rank's time is the collective's
  local worst = lt.tensor({ dt }, { dtype = "f64" })
  lt.dist.all_reduce(worst, { op = "max" })
  dt = worst:item()
  if rank == 0 then
    local algbw = bytes / dt / 1e9
    print(("%12d %12.1f %12.3f %12.3f"):format(bytes, dt * 1e6, algbw, algbw * 2 * (world - 1) / world))
  end
  bytes = bytes * 4
end
