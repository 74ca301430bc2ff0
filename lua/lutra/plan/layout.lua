--- lutra.plan.layout: a training layout for the planner, with the
-- field's terms: dp x tp x pp ranks (data, tensor, pipeline parallel), v
-- virtual stages a rank (interleaved 1F1B), the ZeRO stage (0-3), the
-- micro-batch (sequences a rank runs at once), micro-batches per optimizer
-- step (gradient accumulation; the pipeline's m), the global batch
-- (micro_batch x micro_batches x dp sequences), the sequence length, the
-- recompute policy (lt.recompute.parse's), dtype (f32, bf16), sequence
-- parallelism, the pipeline schedule, the device ("cpu" or "cuda") and
-- the attention ("composed": matmul, softmax, matmul, the CPU's; "fused":
-- FlashAttention or cuDNN, a GPU's).
local recompute = require "lutra.recompute"

local M = {}

local DEFAULTS = { dp = 1, tp = 1, pp = 1, v = 1, zero = 0, micro_batch = 1, micro_batches = 1, seq = 1024,
  recompute = "none", dtype = "bf16", sp = false, schedule = "1f1b", device = "cuda" }
local KNOWN = { global_batch = true, attention = true, pp_stages = true, fragmentation = true }
for k in pairs(DEFAULTS) do KNOWN[k] = true end

local function whole(name, v, lo)
  if type(v) ~= "number" or v ~= math.floor(v) or v < lo then
    error(("plan: %s must be a whole number >= %d, got %s"):format(name, lo, tostring(v)), 4)
  end
end

--- layout.new(t) -> a complete layout: t's fields over the defaults (dp,
-- tp, pp, v = 1; zero 0; micro_batch 1; micro_batches 1, or what
-- global_batch / (micro_batch x dp) gives; seq 1024; recompute "none";
-- dtype bf16; device cuda; attention fused on cuda, composed on the CPU;
-- schedule 1f1b, interleaved when v > 1). Raises "plan: ..." naming a
-- field that is unknown, not whole, or a global batch that micro_batch x
-- dp does not divide, or a combination lutra refuses (ZeRO 3 with a
-- pipeline, sequence parallelism without tp).
function M.new(t)
  local L = {}
  for k, v in pairs(t) do
    if not KNOWN[k] then error(("plan: unknown layout setting %s"):format(tostring(k)), 2) end
    L[k] = v
  end
  for k, v in pairs(DEFAULTS) do if L[k] == nil then L[k] = v end end
  for _, k in ipairs { "dp", "tp", "pp", "v", "micro_batch", "micro_batches", "seq" } do whole(k, L[k], 1) end
  if L.zero ~= 0 and L.zero ~= 1 and L.zero ~= 2 and L.zero ~= 3 then
    error(("plan: zero must be a ZeRO stage 0-3, got %s"):format(tostring(L.zero)), 2)
  end
  if L.dtype ~= "f32" and L.dtype ~= "bf16" and L.dtype ~= "f16" then
    error(("plan: dtype must be f32, bf16 or f16, got %s"):format(tostring(L.dtype)), 2)
  end
  if L.device ~= "cpu" and L.device ~= "cuda" then
    error(("plan: device must be cpu or cuda, got %s"):format(tostring(L.device)), 2)
  end
  L.attention = L.attention or (L.device == "cpu" and "composed" or "fused")
  if t.schedule == nil and L.v > 1 then L.schedule = "interleaved" end
  if L.global_batch then
    whole("global_batch", L.global_batch, 1)
    local per = L.micro_batch * L.dp
    if L.global_batch % per ~= 0 then
      error(("plan: global batch %d is not a multiple of micro_batch %d x dp %d"):format(L.global_batch,
        L.micro_batch, L.dp), 2)
    end
    if t.micro_batches and t.micro_batches * per ~= L.global_batch then
      error(("plan: global batch %d is not micro_batch %d x micro_batches %d x dp %d"):format(L.global_batch,
        L.micro_batch, t.micro_batches, L.dp), 2)
    end
    L.micro_batches = L.global_batch / per
  end
  L.global_batch = L.micro_batch * L.micro_batches * L.dp
  recompute.parse(L.recompute) -- (raises naming the policy)
  if L.zero == 3 and L.pp > 1 then
    error("plan: ZeRO stage 3 with pipeline parallelism: lutra refuses the pair (each micro-batch would gather "
      .. "the stage's parameters again); use zero 1 or 2", 2)
  end
  if L.sp and L.tp == 1 then error("plan: sequence parallelism (sp) needs tp > 1", 2) end
  if L.v > 1 and L.schedule ~= "interleaved" then
    error(("plan: v = %d virtual stages needs the interleaved schedule, got %s"):format(L.v, L.schedule), 2)
  end
  L.ranks = L.dp * L.tp * L.pp
  return L
end

--- layout.text(L) -> "dp 2 x tp 4 x pp 8 (v 2), ZeRO 1, micro-batch 1 x 16, seq 2048, recompute full,
-- bf16" (micro-batch: its sequences x the micro-batches of a step).
function M.text(L)
  local parts = { ("dp %d x tp %d%s x pp %d%s"):format(L.dp, L.tp, L.sp and " (sp)" or "", L.pp,
    L.v > 1 and (" (v %d)"):format(L.v) or "") }
  parts[#parts + 1] = ("ZeRO %d"):format(L.zero)
  parts[#parts + 1] = ("micro-batch %d x %d"):format(L.micro_batch, L.micro_batches) -- (sequences x micro-batches)
  parts[#parts + 1] = ("seq %d"):format(L.seq)
  if L.recompute ~= "none" then parts[#parts + 1] = "recompute " .. L.recompute end
  parts[#parts + 1] = L.dtype
  return table.concat(parts, ", ")
end

return M
