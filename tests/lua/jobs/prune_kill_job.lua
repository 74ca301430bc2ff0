-- tests/lua/jobs/prune_kill_job.lua: for ckpt_spec.lua, run as its own
-- process: saves checkpoints of steps 1 and 2 into --dir, the second with
-- keep_last = 1, and dies by SIGKILL in the middle of removing step 1. The
-- removal (lt_remove_tree, as lt.ckpt sees it) is stood in for by one that,
-- given step 1's files (wherever they are by then), deletes state.json, as a
-- recursive removal may do first, then kills the process.
local lt = require "lutra"
local capi = require "lutra.capi"
local ffi = require "ffi"
pcall(ffi.cdef, "int getpid(void); int kill(int pid, int sig);")

local cfg = lt.config { dir = "" }
local real, armed = capi.C, false
capi.C = setmetatable({
  lt_remove_tree = function(path)
    if armed and path:find("step_00000001", 1, true) and io.open(path .. "/state.json") then
      os.remove(path .. "/state.json")
      ffi.C.kill(ffi.C.getpid(), 9)
    end
    return real.lt_remove_tree(path)
  end,
}, { __index = function(_, k) return real[k] end })
package.loaded["lutra.ckpt"] = nil
local ckpt = require "lutra.ckpt" -- a copy of lt.ckpt that calls the stand-in
capi.C = real

local model = lt.models.gpt2("gpt2-tiny", { generator = lt.Generator(1) })
ckpt.save(cfg.dir, { model = model, step = 1 })
armed = true
ckpt.save(cfg.dir, { model = model, step = 2, keep_last = 1 })
print("prune_kill_job: not killed (the removal of step 1 never came)")
