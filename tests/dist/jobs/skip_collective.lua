-- tests/dist/jobs/skip_collective.lua: rank 1 skips an all_reduce and
-- sleeps; the watchdog on the other ranks (timeout 2 s) must report the
-- collective and abort the job.
local lt = require "lutra"
local rank = lt.dist.init()
lt.dist.set_timeout(2)
if rank == 1 then
  os.execute("sleep 30")
else
  lt.dist.all_reduce(lt.ones(4))
end
print("unreachable")
