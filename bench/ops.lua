--- bench/ops.lua: the cost of lutra's tensor core on the CPU, as a table.
--   make bench
-- Rows: one small op from Lua (ns per `a + b` on 1-element tensors, the
-- result allocated and released each time); f32 matrix products (GFLOP/s)
-- next to OpenBLAS's cblas_sgemm called directly on the same buffers (through
-- the FFI: no lutra code in between), the two timed in alternating rounds so
-- machine noise hits both; elementwise add on 64 MiB tensors (GB/s counting
-- bytes read and written) next to memcpy. The status column compares with
-- the issue's targets for information: a benchmark never passes or fails.
local lt = require "lutra"
local ffi = require "ffi"

ffi.cdef [[
  typedef struct { long tv_sec; long tv_nsec; } lt_bench_timespec;
  int clock_gettime(int clk, lt_bench_timespec *ts);
  void *memcpy(void *dst, const void *src, size_t n);
  void cblas_sgemm(int order, int transa, int transb, int m, int n, int k, float alpha,
                   const float *a, int lda, const float *b, int ldb, float beta, float *c, int ldc);
]]
local ts = ffi.new("lt_bench_timespec")
local function now()
  ffi.C.clock_gettime(1, ts) -- CLOCK_MONOTONIC
  return tonumber(ts.tv_sec) + tonumber(ts.tv_nsec) * 1e-9
end

--- Time per call of fn: the best of `rounds` rounds of `reps` calls.
local function time_per_call(fn, reps)
  local t0 = now()
  for _ = 1, reps do fn() end
  return (now() - t0) / reps
end

--- Best times of two functions measured in alternating rounds.
local function best_pair(f, g, reps, rounds)
  local bf, bg = math.huge, math.huge
  f()
  g()
  for _ = 1, rounds do
    bf = math.min(bf, time_per_call(f, reps))
    bg = math.min(bg, time_per_call(g, reps))
  end
  return bf, bg
end

local rows = {}
-- kind: "max" means lutra's number should stay under target; "ratio" that
-- lutra / reference should reach target
local function row(what, ours, ref, kind, target)
  local ok
  if kind == "max" then ok = ours < target else ok = ours / ref >= target end
  rows[#rows + 1] = { what, ours, ref, kind == "max" and ("< " .. target) or (">= " .. target .. "x"), ok }
end

-- 1. one small op, allocation and release included
do
  local a, b = lt.tensor { 1 }, lt.tensor { 2 }
  local n = 200000
  local t_free, t_gc = best_pair(function()
    for _ = 1, n do
      local c = a + b
      c:free() -- release at once, so the cached block is reused
    end
  end, function()
    for _ = 1, n do local _ = a + b end -- left to the garbage collector
  end, 1, 5)
  row("a + b, 1 element, freed explicitly (ns)", t_free / n * 1e9, nil, "max", 1000)
  row("a + b, 1 element, left to the GC (ns)", t_gc / n * 1e9, nil, "max", 1000)
end

-- 2. f32 matrix products against cblas_sgemm on the same buffers
do
  lt.manual_seed(0)
  for _, n in ipairs { 256, 1024, 2048 } do
    local a, b, c = lt.randn(n, n), lt.randn(n, n), lt.empty(n, n)
    local pa, pb, pc = a:data_ptr(), b:data_ptr(), c:data_ptr()
    local reps = n <= 256 and 100 or n <= 1024 and 5 or 2
    local t_lt, t_blas = best_pair(function() lt.matmul(a, b):free() end, function()
      ffi.C.cblas_sgemm(101, 111, 111, n, n, n, 1, pa, n, pb, n, 0, pc, n) -- row-major, no transposes
    end, reps, 5)
    local flops = 2 * n ^ 3
    row(("matmul f32 %dx%d (GFLOP/s)"):format(n, n), flops / t_lt * 1e-9, flops / t_blas * 1e-9, "ratio", 0.95)
  end
end

-- 3. elementwise add on 64 MiB against memcpy
do
  local n = 64 * 1024 * 1024 / 4
  local a, b = lt.rand(n), lt.rand(n)
  local out = lt.empty(n):copy_(a) -- touch the pages once
  local src, dst, bytes = a:data_ptr(), out:data_ptr(), n * 4
  local gb = bytes / 1e9
  local t_add, t_cpy = best_pair(function() lt.add(a, b):free() end,
    function() ffi.C.memcpy(dst, src, bytes) end, 3, 5)
  row("add 64 MiB f32, a + b (GB/s, 3 x 64 MiB moved)", 3 * gb / t_add, 2 * gb / t_cpy, "ratio", 0.7)
  local t_add_ = best_pair(function() out:add_(b) end, function() end, 3, 5)
  row("add_ 64 MiB f32 in place (GB/s, 3 x 64 MiB moved)", 3 * gb / t_add_, 2 * gb / t_cpy, "ratio", 0.7)
  local t_copy = best_pair(function() out:copy_(a) end, function() end, 3, 5)
  row("copy_ 64 MiB f32 (GB/s, 2 x 64 MiB moved)", 2 * gb / t_copy, 2 * gb / t_cpy, "ratio", 0.7)
end

print(("lutra %s, %d threads; %s"):format(lt.version, lt.num_threads(), lt.build_info():match("cpu: ([^,]+)")))
print(("%-48s %10s %10s %7s %9s %6s"):format("measure", "lutra", "reference", "ratio", "target", "status"))
for _, r in ipairs(rows) do
  local ratio = r[3] and ("%.2f"):format(r[2] / r[3]) or "-"
  print(("%-48s %10.1f %10s %7s %9s %6s"):format(r[1], r[2], r[3] and ("%.1f"):format(r[3]) or "-", ratio, r[4],
    r[5] and "ok" or "MISS"))
end
print("references: matmul = cblas_sgemm on the same buffers; add/copy = one memcpy of 64 MiB on one thread")
