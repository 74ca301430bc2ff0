-- tests/dist/jobs/recv_without_sender.lua: rank 0 waits in recv for a send
-- rank 1 never makes; the watchdog (timeout 2 s) must report and abort.
local lt = require "lutra"
local rank = lt.dist.init()
lt.dist.set_timeout(2)
if rank == 0 then lt.dist.recv(lt.zeros(3), 1) else os.execute("sleep 30") end
print("unreachable")
