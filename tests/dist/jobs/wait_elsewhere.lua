-- tests/dist/jobs/wait_elsewhere.lua: rank 0 waits in an all_reduce while
-- rank 1 waits in a recv from rank 0 that never sends; rank 0's watchdog
-- (timeout 2 s; rank 1's is longer) must name rank 1 as never arrived, with
-- what it waits in and where, and abort the job.
local lt = require "lutra"
local rank = lt.dist.init()
if rank == 0 then
  lt.dist.set_timeout(2)
  lt.dist.all_reduce(lt.ones(4))
else
  lt.dist.set_timeout(20)
  lt.dist.recv(lt.zeros(3), 0)
end
print("unreachable")
