-- tests/dist/jobs/split_on_one_rank.lua: rank 0 makes a group that rank 1
-- never joins; the watchdog (timeout 2 s) must report it and end the job.
local lt = require "lutra"
local rank = lt.dist.init()
lt.dist.set_timeout(2)
if rank == 0 then lt.dist.new_group(0) else os.execute("sleep 30") end
print("unreachable")
