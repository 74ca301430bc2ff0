-- tests/dist/jobs/cuda_nccl_faults.lua: what the CUDA emulator's NCCL does
-- when the ranks' calls go wrong, with lutra's own agreement off
-- (LUTRA_COMM_CHECK=0, so the calls reach NCCL as they are) and the
-- emulator's timeout short (LUTRA_EMU_NCCL_TIMEOUT=1): tests/run.sh runs it
-- on build-emu/lutra under mpirun (2 ranks).
--   1. ranks that all_reduce different sizes: every rank fails, naming each
--      rank's call, and the communicator still works after;
--   2. the last rank comes late (after 3 s): the others fail naming the
--      collective and that rank; when it comes it fails naming them; every
--      later call fails at once.
-- Rank 0 prints "cuda nccl faults: ok" when every rank saw what it should.
local lt = require "lutra"
local rank, world = lt.dist.init()
assert(os.getenv("LUTRA_COMM_CHECK") == "0" and os.getenv("LUTRA_EMU_NCCL_TIMEOUT") == "1",
  "run with LUTRA_COMM_CHECK=0 and LUTRA_EMU_NCCL_TIMEOUT=1 (mpirun -x)")
assert(lt.build_info():find("CUDA emulator", 1, true), "run on the CUDA emulator (build-emu/lutra)")
local CUDA = lt.dist.device()
local bad = {}
local function expect(what, f, ...)
  local ok, err = pcall(f)
  err = tostring(err)
  for _, fragment in ipairs { ... } do
    if ok or not err:find(fragment, 1, true) then
      bad[#bad + 1] = ("%s: expected an error with %q, got %s"):format(what, fragment, ok and "none" or err)
      return
    end
  end
end

-- 1. different sizes
expect("sizes", function() lt.dist.all_reduce(lt.zeros({ 5 + (rank == 1 and 1 or 0) }):to(CUDA)) end,
  "the ranks' calls differ", "rank 0 all_reduce of 5 float32, sum; rank 1 all_reduce of 6 float32, sum")
local t = lt.ones(3):to(CUDA)
lt.dist.all_reduce(t)
if t:to("cpu"):totable()[1] ~= world then bad[#bad + 1] = "the communicator did not carry on after the mismatch" end

-- 2. a late rank
local last = world - 1
if rank == last then
  os.execute("sleep 3")
  expect("the late rank", function() lt.dist.all_reduce(lt.ones(4):to(CUDA)) end, "all_reduce (call 2",
    "never arrived within 1 s", world == 2 and "rank 0 never" or "ranks 0")
else
  expect("waiting for the late rank", function() lt.dist.all_reduce(lt.ones(4):to(CUDA)) end, "all_reduce (call 2",
    ("on rank %d of %d: rank %d never arrived within 1 s"):format(rank, world, last))
end
expect("after", function() lt.dist.all_reduce(lt.ones(4):to(CUDA)) end, "the communicator lost a rank earlier")

-- every rank's findings, rank 0 reports
for q = 0, world - 1 do
  if q == rank then for _, b in ipairs(bad) do io.stderr:write(("[rank %d] %s\n"):format(rank, b)) end end
  lt.dist.barrier()
end
local n = lt.tensor({ #bad }, { dtype = "i32" })
lt.dist.all_reduce(n)
if rank == 0 then print(n:item() == 0 and "cuda nccl faults: ok" or ("cuda nccl faults: %d wrong"):format(n:item())) end
if n:item() ~= 0 then os.exit(1) end
