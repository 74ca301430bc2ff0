--- lutra.dist (lt.dist): processes and collectives (lutra.dist.comm: init,
-- rank, all_reduce, ..., mesh, memory_bytes) with data parallelism on top:
-- lt.dist.DataParallel (lutra.dist.ddp) and lt.dist.Zero (ZeRO stages 1-2,
-- lutra.dist.zero; stage 3, lutra.dist.zero3), lt.dist.tp (tensor
-- parallelism) and lt.dist.pp (pipeline schedules). All are added to
-- lutra.dist.comm's table, which is returned: code below this module that
-- calls comm.all_reduce calls what lt.dist.all_reduce names.
local M = require "lutra.dist.comm"

M.DataParallel = require("lutra.dist.ddp").DataParallel
M.Zero = require("lutra.dist.zero").Zero
M.tp = require "lutra.dist.tp"
M.pp = require "lutra.dist.pp.schedule"

return M
