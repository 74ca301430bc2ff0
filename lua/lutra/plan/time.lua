--- lutra.plan.time: a training step's time under a layout on a cluster:
-- compute from the FLOP count lt.train's MFU uses (6N + 6 L C T a token,
-- lt.train.log.transformer_flops) at an assumed fraction of the GPU's
-- peak, plus what recomputation runs again; the pipeline bubble; tensor-,
-- data- and pipeline-parallel communication from message sizes,
-- bandwidths and latencies, with the part that overlaps compute taken
-- off. The model of each collective is the textbook one (Thakur et al.
-- 2005; NCCL's ring and double binary tree): for n ranks, a message of S
-- bytes, bandwidth bw per rank and direction and a latency a per step,
--   all-reduce, ring   2 (n - 1) a + 2 (n - 1) / n x S / bw
--   all-reduce, tree   2 ceil(log2 n) a + 2 S / bw   (the faster is taken,
--                      as NCCL picks: trees win on small messages)
--   reduce-scatter, all-gather (ring)   (n - 1) a + (n - 1) / n x S / bw
-- Links: lutra's mesh puts tp innermost, then dp, then pp (rank = t + tp
-- (d + dp p)), nodes hold consecutive ranks; a group whose ranks share a
-- node uses NVLink, else the network (per GPU).
--
-- What overlaps (lutra's own schedule): DataParallel's bucketed
-- all-reduce runs during the last micro-batch's backward (about 2/3 of its
-- compute); ZeRO 1-2's gathers of the updated parameters after the
-- optimizer step do not; ZeRO 3's gathers and reduce-scatters overlap the
-- whole compute (prefetch); tensor-parallel all-reduces sit on the
-- critical path (Megatron-LM's without its overlap options); pipeline
-- sends overlap except while the pipeline fills and drains.
local log = require "lutra.train.log"
local hardware = require "lutra.plan.hardware"
local shapes = require "lutra.plan.shapes"
local state = require "lutra.plan.state"
local recompute = require "lutra.recompute"

local M = {}

local function log2ceil(n) return math.ceil(math.log(n) / math.log(2) - 1e-9) end

--- time.all_reduce(bytes, n, bw, latency) -> seconds (the faster of ring and tree).
function M.all_reduce(S, n, bw, a)
  if n <= 1 or S <= 0 then return 0 end
  local ring = 2 * (n - 1) * a + 2 * (n - 1) / n * S / bw
  local tree = 2 * log2ceil(n) * a + 2 * S / bw
  return math.min(ring, tree)
end

--- time.gather(bytes, n, bw, latency) -> seconds of a ring all-gather or
-- reduce-scatter of S bytes in all (S / n a rank).
function M.gather(S, n, bw, a)
  if n <= 1 or S <= 0 then return 0 end
  return (n - 1) * a + (n - 1) / n * S / bw
end

-- the link of a group of n ranks spaced `stride` apart
local function link(g, per_node, stride, n)
  if stride * n <= per_node then return g.nvlink, g.latency_intra, "NVLink" end
  return g.network, g.latency_inter, "network"
end

--- time.recompute_share(desc, layout) -> the FLOPs recomputation adds, as
-- a fraction of a step's 6N + 6 L C T: "full" runs each block's forward
-- again (2 N_blocks + 2 L C T of the 6N + 6LCT), "every:k" 1/k of that,
-- "selective" the attention core's forward (2 L C T).
function M.recompute_share(d, L)
  local kind, k = recompute.parse(L.recompute)
  if kind == "none" then return 0 end
  local N = shapes.num_parameters(d)
  local blocks = 0
  for _, p in ipairs(shapes.parameters(d, 1)) do if p.block then blocks = blocks + p.numel end end
  local total = log.transformer_flops(N, d.n_layer, d.n_embd, L.seq)
  local attn = 2 * d.n_layer * d.n_embd * L.seq
  if kind == "selective" then return attn / total end
  local full = (2 * blocks + attn) / total
  return kind == "every" and full / k or full
end

--- time.estimate(desc, layout, gpu, {gpus_per_node = 8, mfu = 0.4}) ->
-- {flops_per_token, compute_s (per step, busy time of a rank), bubble
-- (fraction of the step), tp_s, dp_s, dp_exposed_s, pp_s, pp_exposed_s,
-- step_s, tokens_per_s, mfu (model FLOPs / peak), hfu (with the
-- recompute), links = {tp =, dp =, pp =}}. mfu: the fraction of the
-- dtype's peak the rank's products run at (an assumption, or lutra's
-- measured MFU on that GPU); the step's MFU comes out lower by the bubble
-- and the exposed communication.
function M.estimate(d, L, g, o)
  o = o or {}
  local per_node = o.gpus_per_node or 8
  local eff = o.mfu or 0.4
  local peak = hardware.peak(g, L.dtype)
  if not peak then error(("plan: the %s has no %s tensor cores"):format(g.name, L.dtype), 2) end
  local N = shapes.num_parameters(d)
  local fpt = log.transformer_flops(N, d.n_layer, d.n_embd, L.seq)
  local tokens = L.global_batch * L.seq
  local r = M.recompute_share(d, L)
  local ranks = L.dp * L.tp * L.pp
  local compute = fpt * tokens * (1 + r) / ranks / (peak * eff)
  local bubble = L.pp > 1 and (L.pp - 1) / (L.v * L.micro_batches + L.pp - 1) or 0
  local act = state.dtype_bytes[L.dtype]
  local out = { flops_per_token = fpt, recompute_share = r, compute_s = compute, bubble = bubble, links = {} }

  -- tensor parallel: 2 all-reduces (or all-gather + reduce-scatter under SP: the same bytes) of (b, T, C)
  -- a block forward, 2 backward, 2 more when the forward is recomputed
  local bw, a, name = link(g, per_node, 1, L.tp)
  out.links.tp = L.tp > 1 and name or nil
  local msg = L.micro_batch * L.seq * d.n_embd * act
  local kind = recompute.parse(L.recompute)
  local per_block = 4 + ((kind == "full" or kind == "every") and 2 or 0)
  local blocks = d.n_layer / L.pp
  out.tp_s = L.tp > 1 and per_block * blocks * L.micro_batches * M.all_reduce(msg, L.tp, bw, a) or 0

  -- data parallel over the rank's stage and shard
  bw, a, name = link(g, per_node, L.tp, L.dp)
  out.links.dp = L.dp > 1 and name or nil
  local G = 0 -- (the bytes of the rank's parameters: its stage's, its TP shard)
  for _, p in ipairs(state.stage_parameters(d, L, 0)) do G = G + p.numel * act end
  local dp, window = 0, 0
  local backward_last = compute / L.micro_batches * 2 / 3
  if L.dp > 1 then
    if L.zero <= 1 then
      dp = M.all_reduce(G, L.dp, bw, a)
      window = math.min(dp, backward_last)
      if L.zero == 1 then dp = dp + M.gather(G, L.dp, bw, a) end
    elseif L.zero == 2 then
      dp = M.gather(G, L.dp, bw, a) * 2 -- (reduce-scatter after the backward, all-gather after the update)
    else
      dp = L.micro_batches * 3 * M.gather(G, L.dp, bw, a) -- (gather forward, gather backward, reduce-scatter)
      window = math.min(dp, compute)
    end
  end
  out.dp_s, out.dp_exposed_s = dp, dp - window

  -- pipeline: (b, T, C) forward and its gradient backward per micro-batch and chunk; exposed while filling
  bw, a, name = link(g, per_node, L.tp * L.dp, L.pp)
  out.links.pp = L.pp > 1 and name or nil
  local p2p = a + msg / ((L.sp and L.tp > 1) and L.tp or 1) / bw
  out.pp_s = L.pp > 1 and 2 * L.micro_batches * L.v * p2p or 0
  out.pp_exposed_s = L.pp > 1 and 2 * (L.pp - 1) * p2p or 0

  out.step_s = compute / (1 - bubble) + out.tp_s + out.dp_exposed_s + out.pp_exposed_s
  out.tokens_per_s = tokens / out.step_s
  out.mfu = out.tokens_per_s * fpt / (ranks * peak)
  out.hfu = out.mfu * (1 + r)
  out.peak_flops = peak
  return out
end

--- time.implied_mfu(desc, layout, gpu, step_s) -> the MFU a claimed step
-- time implies (the step's model FLOPs over the ranks' peak in that time).
function M.implied_mfu(d, L, g, step_s)
  local fpt = log.transformer_flops(shapes.num_parameters(d), d.n_layer, d.n_embd, L.seq)
  return fpt * L.global_batch * L.seq / (step_s * L.dp * L.tp * L.pp * hardware.peak(g, L.dtype))
end

return M
