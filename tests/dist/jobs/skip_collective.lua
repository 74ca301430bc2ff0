-- tests/dist/jobs/skip_collective.lua: the last rank skips an all_reduce
-- and sleeps; the watchdog on the other ranks (timeout 2 s) must report the
-- collective, its call site and that rank (which answers no question: it
-- is in no collective) as the one that never arrived, and abort the job.
local lt = require "lutra"
local rank, world = lt.dist.init()
lt.dist.set_timeout(2)
if rank == world - 1 then
  os.execute("sleep 30")
else
  lt.dist.all_reduce(lt.ones(4))
end
print("unreachable")
