--- lutra.plan.memory: the memory one rank needs for a training step
-- under a layout: the model state (lutra.plan.state: exact), the
-- activations each micro-batch keeps for its backward, the transient
-- buffers at the step's high-water mark, the communication buffers, and
-- a fragmentation margin; whether it fits a GPU.
--
-- Activations are counted tensor by tensor as lutra's models save them
-- (per token of a micro-batch, in elements; t = tp, C the width, F the
-- MLP's hidden units, H the heads, T the sequence):
--   GPT-2 block   the stream x and x + attention (C each; /t under
--                 sequence parallelism), both layer norms' outputs (C
--                 each, whole: the column-parallel inputs), their mean and
--                 rstd (4), q|k|v (3C/t), the attention's output (C/t),
--                 the MLP's hidden units before and after GELU (2F/t);
--                 16C + 4 in all at t = 1
--   Llama block   the stream twice, both RMSNorms' outputs (C each),
--                 rstd (2), q after RoPE and the keys and values the
--                 attention reads (3C/t), its output (C/t), the gate, the
--                 up projection, SiLU(gate) and the SwiGLU product (4F/t);
--                 8C + 4F + 2 at t = 1
--   attention     composed (the CPU's matmul, softmax, matmul) keeps the
--                 probabilities (H/t x T per token); fused (FlashAttention,
--                 cuDNN: GPUs) its output and softmax statistics (C/t + H/t)
--   recompute     full: a block keeps its input and the pending residual
--                 (2C) and recomputes the rest in its backward (one
--                 block's activations live again, transiently);
--                 selective: the attention core's share is not kept;
--                 every:k: full for every k-th block
--   outside       the embedding's output (C), the final norm's input and
--                 output (2C), the logits (V/t; their gradient is written
--                 over them) and the loss's statistics
-- Every tensor is rounded to lutra's allocator size classes (four per
-- power of two: host/base/size-class.h), as the allocator's statistics
-- count it. Micro-batches in flight: 1 without a pipeline; under PP the
-- stage's count in the schedule (lutra.dist.pp.schedule.simulate's; GPipe
-- m, 1F1B's stage s min(pp - s, m)), plus one chunk of block activations
-- under 1F1B and interleaving (memory.in_flight). Dropout's masks are not counted (the
-- planner's layouts train without dropout, as the large runs do).
local state = require "lutra.plan.state"
local shapes = require "lutra.plan.shapes"
local recompute = require "lutra.recompute"
local schedule = require "lutra.dist.pp.schedule"

local M = {}

--- memory.round(bytes, device): lutra.plan.state.round (the allocator's size classes).
M.round = state.round

-- the saved tensors of one block for one micro-batch: {{what, elements, bytes each}, ...}
local function block_tensors(d, L, attention, kind)
  local t, sp = L.tp, L.sp and L.tp > 1
  local BT, C, F, H = L.micro_batch * L.seq, d.n_embd, d.ffn, d.n_head
  local act = state.dtype_bytes[L.dtype]
  local out = {}
  local function add(what, elems, bytes) out[#out + 1] = { what, elems, bytes or act } end
  local stream = sp and BT * C / t or BT * C
  if kind == "full" then
    add("block input", stream)
    add("pending residual", stream)
    return out
  end
  local stats = sp and BT / t or BT
  add("stream", stream)
  add("stream + attention", stream)
  if d.family == "gpt2" then
    add("ln_1 out", BT * C)
    add("ln_2 out", BT * C)
    for _ = 1, 4 do add("norm statistics", stats, 4) end
    add("q|k|v", BT * 3 * C / t)
  else
    add("input_layernorm out", BT * C)
    add("post_attention_layernorm out", BT * C)
    for _ = 1, 2 do add("norm statistics", stats, 4) end
    add("q (RoPE)", BT * C / t)
    add("k (for the attention)", BT * C / t)
    add("v (for the attention)", BT * C / t)
  end
  add("attention output", BT * C / t)
  if kind ~= "selective" then
    if attention == "composed" then
      add("attention probabilities", L.micro_batch * (H / t) * L.seq * L.seq)
    else
      add("attention output (kernel's)", BT * C / t)
      add("softmax statistics", L.micro_batch * H / t * L.seq, 4)
    end
  end
  if d.family == "gpt2" then
    add("MLP hidden (pre-GELU)", BT * F / t)
    add("MLP hidden (GELU)", BT * F / t)
  else
    for _, w in ipairs { "gate", "up", "SiLU(gate)", "SwiGLU" } do add("MLP " .. w, BT * F / t) end
  end
  return out
end
M.block_tensors = block_tensors

-- a byte count as the allocator hands it out (R), or as written (touched: what a resident set counts)
local function rounding(L, touched)
  return function(n) return touched and n or M.round(n, L.device) end
end

--- memory.block_bytes(desc, layout, kind[, touched]) -> bytes one block
-- keeps for one micro-batch (kind: "none", "selective" or "full"), each
-- tensor rounded to the allocator's classes (touched: not rounded).
function M.block_bytes(d, L, kind, touched)
  local R, n = rounding(L, touched), 0
  for _, e in ipairs(block_tensors(d, L, L.attention, kind)) do n = n + R(e[2] * e[3]) end
  return n
end

-- what lies outside the blocks for one micro-batch: embedding output, final norm, logits
local function outside_bytes(d, L, first, last, R)
  local BT, C = L.micro_batch * L.seq, d.n_embd
  local act = state.dtype_bytes[L.dtype]
  local n = 0
  if first then n = n + R(BT * C * act) + R(BT * 8) end
  if last then
    local V = shapes.padded_vocab(d, L.tp) / L.tp
    n = n + 2 * R(BT * C * act) + 2 * R(BT * 4) + R(BT * V * act) + R(BT * 4)
  end
  return n
end

--- memory.schedule_in_flight(layout[, stage = 0]) -> the most micro-batch
-- chunks the schedule has between their forward and their backward on the
-- stage (lutra.dist.pp.schedule.simulate's count; long pipelines by
-- formula: GPipe m, 1F1B's stage s min(p - s, m), interleaved's
-- min(m v, 2 (p - s - 1) + (v - 1) p + 1), Megatron-LM's warm-up count plus
-- one; tests/lua/plan_spec.lua checks the formulas against the simulation).
local simulated = {}
function M.schedule_in_flight(L, stage)
  local s, p, m, v = stage or 0, L.pp, L.micro_batches, L.v
  if L.schedule == "gpipe" or p * m * v > 512 then return M.in_flight_formula(L, s) end
  local key = table.concat({ L.schedule, p, m, v, s }, ":")
  if not simulated[key] then
    local sched = L.schedule == "interleaved" and schedule.interleaved(p, m, v) or schedule.one_f_one_b(p, m)
    simulated[key] = schedule.simulate(sched).in_flight[s + 1]
  end
  return simulated[key]
end

--- memory.in_flight_formula(layout[, stage = 0]) -> schedule_in_flight's
-- formulas (GPipe m; 1F1B min(p - s, m); interleaved min(m v, 2 (p - s - 1)
-- + (v - 1) p + 1) chunks), without simulating.
function M.in_flight_formula(L, stage)
  local s, p, m, v = stage or 0, L.pp, L.micro_batches, L.v
  if L.schedule == "gpipe" then return m end
  if L.schedule ~= "interleaved" then return math.min(p - s, m) end
  return math.min(m * v, 2 * (p - s - 1) + (v - 1) * p + 1)
end

--- memory.in_flight(layout[, stage = 0]) -> the micro-batches of the whole
-- stage whose activations it holds at its peak (1 without a pipeline): the
-- schedule's count, plus one chunk where a forward follows a backward (1F1B,
-- interleaved): a finished micro-batch's tensors go when Lua's collector
-- frees the handles its forward made, after the next forward has begun
-- (measured on the CPU). An interleaved chunk is 1/v of the stage.
function M.in_flight(L, stage)
  if L.pp == 1 then return 1 end
  local n = M.schedule_in_flight(L, stage)
  if L.schedule ~= "gpipe" then n = math.min(n + 1, L.micro_batches * L.v) end
  return n / L.v
end

--- memory.estimate(desc, layout[, coords]) -> {state = (state.bytes'),
-- activations =, per_micro_batch =, in_flight =, transient =,
-- comm_buffers =, fragmentation =, peak =, tensors = (block_tensors of a
-- block under the policy, for the report)}: bytes for the rank at coords
-- (default: stage 0, the one keeping the most micro-batches). peak is the
-- predicted high-water mark of live tensors in a step as lutra's
-- allocator counts them (size classes), touched the same without the
-- classes' rounding (the bytes written: what a resident set grows by on
-- the CPU, where the unused tail of a block is never paged in); fragmentation the
-- margin on top (layout.fragmentation, default 0.05 of the peak, for
-- blocks cached in the wrong size) that "fits" adds.
function M.estimate(d, L, coords)
  local e = M.estimate_once(d, L, coords)
  e.touched = M.estimate_once(d, L, coords, true).peak
  return e
end

--- memory.estimate_once(desc, layout[, coords[, touched]]): memory.estimate
-- without the touched field, each tensor rounded to the allocator's
-- classes (touched: not rounded).
function M.estimate_once(d, L, coords, touched)
  coords = coords or {}
  local R = rounding(L, touched)
  local s = coords.pp or 0
  local st = state.bytes(d, L, coords, touched)
  local blocks = {}
  for _, p in ipairs(state.stage_parameters(d, L, s)) do if p.block then blocks[p.block] = true end end
  local kind, k = recompute.parse(L.recompute)
  local per_mb, n_blocks, biggest = 0, 0, 0
  for b in pairs(blocks) do
    n_blocks = n_blocks + 1
    local this = kind
    if kind == "every" then this = (b + 1) % k == 0 and "full" or "none" end
    per_mb = per_mb + M.block_bytes(d, L, this, touched)
  end
  biggest = M.block_bytes(d, L, "none", touched)
  local S = L.pp * L.v
  local first, last = s == 0, (S - 1) % L.pp == s
  local outside = outside_bytes(d, L, first, last, R)
  local inflight = M.in_flight(L, s)
  -- (the late-freed chunk holds the blocks' tensors; the embedding's and the logits' go with the schedule)
  local acts = per_mb * inflight + outside * (L.pp == 1 and 1 or M.schedule_in_flight(L, s) / L.v)
  per_mb = per_mb + outside
  -- the step's phases, each with what is live at its high-water mark (B bytes an element):
  --   backward  the activations in flight (autograd drops what it saved when the whole backward is
  --             done; the logits' gradient is written over the logits), a tied embedding's two
  --             gradients (V/t x C each: the head's and the lookup's are each made whole before
  --             they are summed, where one rank holds both), or a block's backward: composed
  --             attention's gradients of the probabilities and the scores (2 H/t x T a token)
  --             and, recomputed, the block's activations; and the gradients (ZeRO 3: of the
  --             root unit, whole until its reduce-scatter, and of two blocks' units)
  --   reduce    ZeRO 1-2: the full gradients, their flat copies (reduce_gradients) and the chunk's
  --   update    ZeRO 1-2: the chunk's gradients and the all-gathered flat parameters
  local B = state.dtype_bytes[L.dtype]
  local BT = L.micro_batch * L.seq
  local V = shapes.padded_vocab(d, L.tp) / L.tp
  -- (a tied embedding's two gradients, the head's and the lookup's, are each made whole before their sum)
  local loss_tmp = (d.tied and first and last) and 2 * R(V * d.n_embd * B) or 0
  -- (composed attention's backward: the probabilities' gradient and the scores' gradient, one block's)
  local attn_bwd = L.attention == "composed"
    and 2 * R(L.micro_batch * (d.n_head / L.tp) * L.seq * L.seq * B) or 0
  local recomputed = (kind == "full" or kind == "every") and biggest or 0
  local transient = math.max(loss_tmp, recomputed + attn_bwd)
  local q = st.rounded -- (as the allocator hands the tensors out)
  local G = q.whole_grads
  local held = q.params + q.optimizer + q.buffers -- (throughout the step)
  local phases = {}
  if L.zero == 3 then
    local root, unit = 0, 0
    for _, p in ipairs(state.stage_parameters(d, L, s)) do
      if not p.block then root = root + p.numel elseif p.block == 0 then unit = unit + p.numel end
    end
    -- at the end of the backward: the root unit's whole parameters, whole gradients and their flat
    -- for the reduce-scatter (3x); a block's unit gathered with the one prefetched, and its gradients
    -- with their flat (4x); the chunks' gradients
    phases.backward = held + q.grads + (3 * root + 4 * unit) * B + acts + transient
  else
    phases.backward = held + G + acts + transient
    if L.zero >= 1 then -- (one flat at a time: lutra.dist.zero frees each when done)
      local flat = R(st.numel * B)
      phases.reduce = held + G + flat + q.grads
      phases.update = held + q.grads + flat
    end
  end
  if L.pp > 1 then -- sends in flight: the link lets each go at the poll that finds it done, about one a
    -- chunk and direction at a time (activations forward, their gradients backward), and the receive
    -- posted ahead for each
    local msg = R(BT * d.n_embd / ((L.sp and L.tp > 1) and L.tp or 1) * B)
    local sends = 0
    for vs = s, L.pp * L.v - 1, L.pp do
      if vs < L.pp * L.v - 1 then sends = sends + 2 end
      if vs > 0 then sends = sends + 2 end
    end
    for k, v in pairs(phases) do phases[k] = v + sends * msg end
    st.pp_sends = sends * msg
  end
  local peak, at = 0, nil
  for name, v in pairs(phases) do if v > peak then peak, at = v, name end end
  local comm = st.buffers + (st.pp_sends or 0)
  local frag = (L.fragmentation or 0.05) * peak
  return { state = st, activations = acts, per_micro_batch = per_mb, in_flight = inflight, transient = transient,
    comm_buffers = comm, peak = peak, peak_phase = at, phases = phases, fragmentation = frag, blocks = n_blocks,
    tensors = block_tensors(d, L, L.attention, kind == "every" and "none" or kind) }
end

return M
