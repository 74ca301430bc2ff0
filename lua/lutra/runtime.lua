--- lutra.runtime: the process-wide controls lt carries at its top level:
-- lt.build_info, lt.clock, lt.num_threads / get_num_threads /
-- set_num_threads, lt.memory_stats, lt.collect_garbage and lt.empty_cache
-- (CPU memory). The umbrella (lutra) copies every field of this table into lt.
local capi = require "lutra.capi"
local ffi, C = capi.ffi, capi.C

local lt = {}

--- lt.build_info(): the lines `lutra --version` prints.
function lt.build_info() return ffi.string(C.lt_build_info()) end

--- lt.clock() -> seconds on a monotonic clock, for timing.
function lt.clock() return C.lt_clock() end

--- lt.get_num_threads() (or lt.num_threads()) -> the CPU threads that kernels
-- (OpenMP) and matrix products (OpenBLAS) use; every core by default, or
-- OMP_NUM_THREADS, or `lutra --threads=N`.
-- lt.set_num_threads(n): both pools' threads (n a whole number 1..1024; raises otherwise).
function lt.num_threads() return C.lt_num_threads() end
lt.get_num_threads = lt.num_threads
function lt.set_num_threads(n)
  if type(n) ~= "number" or n ~= math.floor(n) or n < 1 or n > 1024 then
    error("set_num_threads: n must be a whole number in 1..1024, got " .. tostring(n), 2)
  end
  C.lt_set_num_threads(n)
end

--- lt.memory_stats() -> {allocated=, reserved=, peak=} in bytes for CPU tensors
-- (reserved includes blocks cached for reuse).
function lt.memory_stats()
  local a, r, p = ffi.new("int64_t[1]"), ffi.new("int64_t[1]"), ffi.new("int64_t[1]")
  C.lt_cpu_memory_stats(a, r, p)
  return { allocated = tonumber(a[0]), reserved = tonumber(r[0]), peak = tonumber(p[0]) }
end

--- lt.reset_peak_memory_stats(): the CPU peak (lt.memory_stats().peak)
-- starts again from the bytes live now (as torch.cuda.reset_peak_memory_stats).
function lt.reset_peak_memory_stats() C.lt_cpu_reset_peak() end

--- lt.collect_garbage() -> bytes of CPU tensors still allocated: runs full
-- garbage collections until lutra's CPU allocations stay the same for three
-- in a row (at most 50). One collectgarbage() is not enough to free a dropped
-- graph: a tensor freed in one cycle can release what only the next cycle
-- frees (a custom function's context holding its inputs). For measuring
-- what is really live (tests, the planner's checks), not for training loops.
function lt.collect_garbage()
  local same, last = 0, -1
  local a, r, p = ffi.new("int64_t[1]"), ffi.new("int64_t[1]"), ffi.new("int64_t[1]")
  for _ = 1, 50 do
    collectgarbage()
    C.lt_cpu_memory_stats(a, r, p)
    local now = tonumber(a[0])
    same = now == last and same + 1 or 0
    last = now
    if same == 3 then break end
  end
  return last
end

--- lt.empty_cache(): returns cached CPU blocks to the system.
function lt.empty_cache() C.lt_cpu_empty_cache() end

return lt
