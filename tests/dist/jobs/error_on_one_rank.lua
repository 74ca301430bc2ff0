-- tests/dist/jobs/error_on_one_rank.lua: rank 1 raises while the others
-- wait in a collective; the job must end (MPI_Abort) within seconds.
local lt = require "lutra"
local rank = lt.dist.init()
if rank == 1 then error("a deliberate failure on rank 1") end
lt.dist.all_reduce(lt.ones(4))
print("unreachable: the all_reduce completed")
