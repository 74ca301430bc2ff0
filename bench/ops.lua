--- bench/ops.lua: the cost of lutra's tensor core on the CPU, as a table.
--   make bench          (builds build/bench/blas_direct, then runs this)
-- Rows: one small op from Lua (ns per `a + b` on 1-element tensors, result
-- allocated and released each time), f32 matrix products (GFLOP/s) next to
-- OpenBLAS called directly from C, and elementwise add on 64 MiB tensors
-- (GB/s counting bytes read and written) next to memcpy. Numbers only: this
-- never passes or fails.
local lt = require "lutra"
local ffi = require "ffi"

ffi.cdef [[
  typedef struct { long tv_sec; long tv_nsec; } lt_bench_timespec;
  int clock_gettime(int clk, lt_bench_timespec *ts);
  void *memcpy(void *dst, const void *src, size_t n);
]]
local ts = ffi.new("lt_bench_timespec")
local function now()
  ffi.C.clock_gettime(1, ts) -- CLOCK_MONOTONIC
  return tonumber(ts.tv_sec) + tonumber(ts.tv_nsec) * 1e-9
end

--- Best time per call of fn over `rounds` rounds of `reps` calls.
local function best_time(fn, reps, rounds)
  local best = math.huge
  for _ = 1, rounds do
    local t0 = now()
    for _ = 1, reps do fn() end
    local t = (now() - t0) / reps
    if t < best then best = t end
  end
  return best
end

local rows = {}
local function row(what, ours, ref, unit, target)
  rows[#rows + 1] = { what, ours, ref, unit, target }
end

-- 1. one small op, allocation and release included
do
  local a, b = lt.tensor { 1 }, lt.tensor { 2 }
  local n = 200000
  local t = best_time(function()
    for _ = 1, n do
      local c = a + b
      c:free() -- release now, as the collector would, so the cached block is reused
    end
  end, 1, 5) / n
  local t_gc = best_time(function()
    for _ = 1, n do local _ = a + b end
    collectgarbage()
  end, 1, 3) / n
  row("a + b, 1 element (ns/op, explicit free)", t * 1e9, nil, "ns", "< 1000")
  row("a + b, 1 element (ns/op, left to the GC)", t_gc * 1e9, nil, "ns", "< 1000")
end

-- 2. f32 matrix products against OpenBLAS from C
do
  local direct = {}
  local p = io.popen("build/bench/blas_direct 256 1024 2048 2>/dev/null")
  if p then
    for line in p:lines() do
      local n, g = line:match("^(%d+) ([%d.]+)")
      if n then direct[tonumber(n)] = tonumber(g) end
    end
    p:close()
  end
  lt.manual_seed(0)
  for _, n in ipairs { 256, 1024, 2048 } do
    local a, b = lt.randn(n, n), lt.randn(n, n)
    local reps = n <= 256 and 200 or n <= 1024 and 10 or 4
    lt.matmul(a, b):free()
    local t = best_time(function() lt.matmul(a, b):free() end, reps, 3)
    row(("matmul f32 %dx%d (GFLOP/s)"):format(n, n), 2 * n ^ 3 / t * 1e-9, direct[n], "GFLOP/s", ">= 0.95x")
  end
end

-- 3. elementwise add on 64 MiB against memcpy
do
  local n = 64 * 1024 * 1024 / 4
  local a, b = lt.rand(n), lt.rand(n)
  local out = lt.empty(n)
  local t_add = best_time(function() lt.add(a, b):free() end, 5, 3)
  local t_add_ = best_time(function() out:copy_(a):add_(b) end, 1, 1) -- warm the output pages
  t_add_ = best_time(function() out:add_(b) end, 5, 3)
  local src, dst = a:data_ptr(), out:data_ptr()
  local bytes = n * 4
  local t_cpy = best_time(function() ffi.C.memcpy(dst, src, bytes) end, 5, 3)
  local mb = bytes / 1e9
  row("add 64 MiB f32, a + b (GB/s, 3 x 64 MiB moved)", 3 * mb / t_add, 2 * mb / t_cpy, "GB/s", ">= 0.7x")
  row("add_ 64 MiB f32 in place (GB/s, 3 x 64 MiB moved)", 3 * mb / t_add_, 2 * mb / t_cpy, "GB/s", ">= 0.7x")
end

print(("lutra %s, %d threads; %s"):format(lt.version, lt.num_threads(), lt.build_info():match("cpu: ([^,]+)")))
print(("%-50s %12s %12s %8s %10s"):format("measure", "lutra", "reference", "ratio", "target"))
for _, r in ipairs(rows) do
  local ratio = r[3] and ("%.2f"):format(r[2] / r[3]) or "-"
  print(("%-50s %12.1f %12s %8s %10s"):format(r[1], r[2], r[3] and ("%.1f"):format(r[3]) or "-", ratio, r[5]))
end
print("references: matmul = cblas_sgemm from C (build/bench/blas_direct); add = memcpy of 64 MiB (GB/s, 2 x 64 MiB moved)")
