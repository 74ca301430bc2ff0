--- lutra.plan.hardware: the accelerators the planner knows, from their
-- makers' published data sheets (dense tensor-core rates, without 2:4
-- sparsity), and the links between them.
--
--   key       peak bf16 / fp8 (FLOP/s), memory (bytes, nvidia-smi's total),
--             HBM bandwidth, NVLink (per GPU and direction, within a node),
--             network (per GPU and direction, across nodes: one 400 Gb/s
--             NDR InfiniBand port a GPU for H100/H200, 200 Gb/s HDR for
--             A100), TDP (W), host power per 8-GPU server (W), latency of a
--             collective's step within a node and across nodes (s)
--
-- Sources: NVIDIA H100 Tensor Core GPU data sheet (SXM5: 989.4 TFLOP/s
-- bf16, 1978.9 fp8, 80 GB HBM3 at 3.35 TB/s, NVLink 900 GB/s both
-- directions, up to 700 W); H200 data sheet (141 GB HBM3e at 4.8 TB/s,
-- the same compute, NVLink and TDP); A100 data sheet (SXM 80GB: 312
-- TFLOP/s bf16, no fp8, 2.04 TB/s, NVLink 600 GB/s, 400 W); DGX H100 /
-- H200 system: 10.2 kW at most for 8 GPUs, DGX A100: 6.5 kW. Latencies are
-- the usual orders of NCCL's (a few microseconds a step on NVLink, about
-- ten across InfiniBand).
local tensor = require "lutra.tensor"
local runtime = require "lutra.runtime"

local M = {}

M.gpus = {
  h100 = { name = "H100 SXM", bf16 = 989.4e12, fp8 = 1978.9e12, f32 = 66.9e12, memory = 81559 * 2 ^ 20,
    hbm = 3.35e12, nvlink = 450e9, network = 50e9, tdp = 700, server = 10200, latency_intra = 3e-6,
    latency_inter = 10e-6 },
  h200 = { name = "H200 SXM", bf16 = 989.4e12, fp8 = 1978.9e12, f32 = 66.9e12, memory = 143771 * 2 ^ 20,
    hbm = 4.8e12, nvlink = 450e9, network = 50e9, tdp = 700, server = 10200, latency_intra = 3e-6,
    latency_inter = 10e-6 },
  a100 = { name = "A100 SXM 80GB", bf16 = 312e12, fp8 = nil, f32 = 19.5e12, memory = 81920 * 2 ^ 20,
    hbm = 2.04e12, nvlink = 300e9, network = 25e9, tdp = 400, server = 6500, latency_intra = 4e-6,
    latency_inter = 12e-6 },
}
M.aliases = { ["h100-sxm"] = "h100", ["h100_sxm"] = "h100", ["a100-80gb"] = "a100", ["a100_80gb"] = "a100" }

--- hardware.gpu(name) -> the spec table (a copy, with key = its key);
-- "cpu" measures this machine (hardware.cpu). Raises naming the known ones.
function M.gpu(name)
  local key = type(name) == "string" and name:lower() or name
  key = M.aliases[key] or key
  if key == "cpu" then return M.cpu() end
  local g = M.gpus[key]
  if not g then
    local known = {}
    for k in pairs(M.gpus) do known[#known + 1] = k end
    table.sort(known)
    error(("plan: unknown GPU %s (known: %s, cpu)"):format(tostring(name), table.concat(known, ", ")), 2)
  end
  local out = { key = key }
  for k, v in pairs(g) do out[k] = v end
  return out
end

--- hardware.peak(gpu, dtype) -> FLOP/s of the dtype's products (bf16 and
-- f16 the bf16 rate, fp8, f32 without tensor cores), nil where the chip
-- has none (fp8 on an A100).
function M.peak(g, dtype)
  if dtype == "bf16" or dtype == "f16" then return g.bf16 end
  if dtype == "fp8" then return g.fp8 end
  return g.f32
end

--- hardware.gemm_rate([n = 512]) -> FLOP/s of an f32 n x n x n product on
-- this machine's CPU threads (the best of a few, after a warm-up).
function M.gemm_rate(n)
  n = n or 512
  local a, b = tensor.ones({ n, n }), tensor.ones({ n, n })
  local best = math.huge
  for i = 1, 6 do
    local t0 = runtime.clock()
    local c = tensor.matmul(a, b)
    local dt = runtime.clock() - t0
    c:free()
    if i > 1 then best = math.min(best, dt) end
  end
  return 2 * n * n * n / best
end

--- hardware.cpu([rate]) -> this machine as the planner's device: its f32
-- GEMM rate (given, or measured by hardware.gemm_rate) as every dtype's
-- peak, its memory (/proc/meminfo), shared-memory MPI links between its ranks.
function M.cpu(rate)
  rate = rate or M.gemm_rate()
  local mem = 0
  local f = io.open("/proc/meminfo", "r")
  if f then
    local text = f:read("*a")
    f:close()
    mem = (tonumber(text:match("MemTotal:%s*(%d+) kB")) or 0) * 1024
  end
  return { key = "cpu", name = ("this CPU (f32 GEMM %.0f GFLOP/s measured)"):format(rate / 1e9), bf16 = rate,
    f32 = rate, memory = mem, nvlink = 5e9, network = 5e9, tdp = 0, server = 0, latency_intra = 20e-6,
    latency_inter = 20e-6, measured = true }
end

return M
