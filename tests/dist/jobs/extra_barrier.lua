-- tests/dist/jobs/extra_barrier.lua: rank 0 alone calls barrier, then every
-- rank does. Without call sites rank 0's extra barrier would pair with the
-- others' and rank 0 would wait in its second one until the watchdog; the
-- ranks must instead fail at once, naming both call sites.
local lt = require "lutra"
local rank = lt.dist.init()
lt.dist.set_timeout(30)
if rank == 0 then lt.dist.barrier() end
lt.dist.barrier()
print("unreachable: the barriers completed")
