--- lutra.dist.tp.vocab: the vocabulary side of tensor parallelism
-- (Megatron-LM, Shoeybi et al. 2019, section 3: the input embedding split
-- by vocabulary rows, the output head by vocabulary columns, and a
-- cross-entropy that never gathers the whole (N, V) logits).
--
--   tp.VocabParallelEmbedding.from(emb, g[, {sequence_parallel}])
--                   this rank's V/n rows of a whole nn.Embedding; the
--                   partial lookups summed over the group (g), or
--                   reduce-scattered to this rank's token rows under SP
--   tp.vocab_parallel_cross_entropy(logits, targets, g[, opts])
--                   F.cross_entropy over logits split by columns: the
--                   row max, the sum of exps and the target's logit
--                   all-reduced ((N) vectors)
--   tp.linear_cross_entropy(y, weight, targets, g[, opts])
--                   the head (weight: this rank's V/n rows) and that loss
--                   fused, as F.linear_cross_entropy: one (N, V/n) buffer,
--                   the logits' gradient written over them in the forward
--                   (llm.c's fused classifier)
--
-- Rank r of a group of n holds vocabulary ids r*V/n .. (r+1)*V/n - 1 (V the
-- whole, possibly padded, vocabulary; V must divide by n). Ids and targets
-- are whole (the same on every rank). With a group of one rank the two
-- losses are F.cross_entropy / F.linear_cross_entropy themselves.
local tensor = require "lutra.tensor"
local autograd = require "lutra.autograd"
local capi = require "lutra.capi"
local nn = require "lutra.nn"
local F = require "lutra.nn.functional"
local comm = require "lutra.dist.comm"
local regions = require "lutra.dist.tp.regions"
local records = require "lutra.dist.tp.records"
local check_group, shard = regions.check_group, regions.shard
local is_tensor = tensor.is_tensor
local C = capi.C
local INF = math.huge

local M = {}

-- A bad argument found on this rank: the group learns of it (as
-- lt.dist's own checks do), so a rank whose inputs were fine fails at its
-- next collective naming this one instead of waiting; then raises at
-- level (default 4: the user's line, for the helpers a public function
-- calls). g must already be a group.
local function refuse(g, msg, level)
  C.lt_comm_refuse(g.c)
  error(msg, level or 4)
end

local function is_int(t) return t.dtype == "i32" or t.dtype == "i64" end
local function is_half(t) return t.dtype == "bf16" or t.dtype == "f16" end

-- this rank's columns [lo, lo + W) of the whole V = W * n
local function span(g, W) return g:rank() * W, W end

-- ---- the embedding ------------------------------------------------------------

--- tp.VocabParallelEmbedding: rows of a vocabulary split across a group.
-- Each rank looks up the ids in its range (zero rows for the others), and
-- the partial results are summed (reduce_from_region), or under sequence
-- parallelism reduce-scattered to this rank's token rows
-- (reduce_scatter_rows). The weight's gradient is exactly this rank's rows
-- of the whole embedding's gradient.
M.VocabParallelEmbedding = nn.Module:extend("VocabParallelEmbedding")

--- VocabParallelEmbedding.from(embedding, group[, {sequence_parallel = false, vocab = V}])
-- -> the module holding rows r*V/n .. (r+1)*V/n of the whole nn.Embedding's
-- weight (V, C) (recorded as a shard along dim 1). vocab: the ids the
-- model has, when V is padded past them (GPT-2's 97 of 98 rows at tp=2):
-- an id in the padding is refused as one process's unpadded embedding
-- refuses it. Errors, naming V and n, when V does not divide by the
-- group's size n, and when vocab is not a whole number in 1..V.
function M.VocabParallelEmbedding.from(emb, g, o)
  check_group("VocabParallelEmbedding", g)
  o = o or {}
  local w = emb.weight
  if not is_tensor(w) or w:dim() ~= 2 then
    error("VocabParallelEmbedding: expected an nn.Embedding with a (V, C) weight", 2)
  end
  local m = M.VocabParallelEmbedding({ group = g })
  m.num_embeddings, m.embedding_dim = w:size(1), w:size(2)
  m.weight = nn.Parameter(shard(w:detach(), 1, g, "VocabParallelEmbedding",
    "the vocabulary's %d rows (V) do"))
  records.mark(m, "weight", 1)
  m.sequence_parallel = o.sequence_parallel or false
  local vocab = o.vocab or m.num_embeddings
  if type(vocab) ~= "number" or vocab ~= math.floor(vocab) or vocab < 1 or vocab > m.num_embeddings then
    error(("VocabParallelEmbedding: vocab must be a whole number in 1..%d (the rows), got %s"):format(m.num_embeddings,
      tostring(vocab)), 2)
  end
  m.vocab = vocab
  return m
end
function M.VocabParallelEmbedding:init(o) self.group = o.group end

--- emb(ids) -> (..., C) on every rank (ids of any shape, i32 or i64,
-- 0-based whole-vocabulary ids); under sequence_parallel -> (N/n, C), this
-- rank's rows of the tokens flattened (N = ids:numel() must divide by n).
-- An id outside [0, vocab) is an error naming it and its position, on every
-- rank (on a GPU reported at the next read from the device, as
-- F.embedding).
function M.VocabParallelEmbedding:forward(ids)
  local g = self.group
  if not is_tensor(ids) or not is_int(ids) then
    refuse(g, ("VocabParallelEmbedding: ids must be an i32 or i64 tensor, got %s")
      :format(is_tensor(ids) and ids.dtype or type(ids)), 3)
  end
  local V, W = self.vocab or self.num_embeddings, self.weight:size(1)
  -- the range check against the whole vocabulary (its ids, not the padding):
  -- a lookup in a (V, 0) tensor (nothing moved; F.embedding's check, deferred on a GPU)
  local ok, err = pcall(F.embedding, ids, tensor.empty({ V, 0 }, { dtype = self.weight.dtype, device = ids.device }))
  if not ok then
    local v, pos = tostring(err):match("index (%-?%d+) %(position (%d+)")
    refuse(g, v and ("VocabParallelEmbedding: id %s at position %s (1-based) of the ids is outside the"
      .. " vocabulary [0, %d) (ids are 0-based)"):format(v, pos, V) or "VocabParallelEmbedding: " .. tostring(err), 3)
  end
  local lo = span(g, W)
  local flat = ids:reshape(-1)
  local local_ids = flat - lo
  local other = local_ids:lt(0):maximum(local_ids:ge(W))
  local rows = F.embedding(local_ids:masked_fill(other, 0), self.weight)
  rows = rows:masked_fill(other:unsqueeze(2), 0) -- (also zeroes their gradient into row 0)
  if self.sequence_parallel then return regions.reduce_scatter_rows(rows, g) end
  local shape = ids:shape()
  shape[#shape + 1] = self.embedding_dim
  return regions.reduce_from_region(rows, g):view(shape)
end
function M.VocabParallelEmbedding:extra_repr()
  return ("%d, %d, rows %d of %d ranks%s"):format(self.num_embeddings, self.embedding_dim, self.group:rank(),
    self.group:size(), self.sequence_parallel and ", sequence_parallel" or "")
end

-- ---- the loss: checks ---------------------------------------------------------

local REDUCTIONS = { mean = true, sum = true, none = true }

-- opts checked -> ignore, reduction, want_count, classes (0: all V)
local function loss_options(op, g, opts, V, reductions)
  if opts ~= nil and type(opts) ~= "table" then refuse(g, op .. ": options must be a table") end
  opts = opts or {}
  for k in pairs(opts) do
    if k ~= "ignore_index" and k ~= "reduction" and k ~= "count" and k ~= "classes" then
      refuse(g, ("%s: unknown option '%s' (known: classes, count, ignore_index, reduction)"):format(op, tostring(k)))
    end
  end
  local red = opts.reduction or "mean"
  if not reductions[red] then
    refuse(g, ("%s: reduction must be %s, got %s"):format(op, reductions == REDUCTIONS and "'mean', 'sum' or 'none'"
      or "'mean' or 'sum'", tostring(red)))
  end
  local ignore = opts.ignore_index or -100
  if type(ignore) ~= "number" or ignore ~= math.floor(ignore) then
    refuse(g, op .. ": ignore_index must be a whole number")
  end
  if opts.count ~= nil and type(opts.count) ~= "boolean" then refuse(g, op .. ": count must be true or false") end
  local classes = opts.classes or 0
  if type(classes) ~= "number" or classes ~= math.floor(classes) or classes < 0 or classes > V then
    refuse(g, ("%s: classes %s is outside [1, %d] (the whole vocabulary: %d ranks' columns; 0 takes them all)")
      :format(op, tostring(classes), V, g:size()))
  end
  return ignore, red, opts.count ~= false, classes > 0 and classes or V
end

-- targets (N) checked against the real vocabulary [0, classes) (the ignore
-- index aside): a lookup in a (classes, 0) tensor, whose error (at once on
-- a CPU, deferred on a GPU) is put as F.cross_entropy puts it
local function check_targets(op, g, t, classes, ignore)
  local probe = tensor.empty({ classes, 0 }, { device = t.device })
  local ok, err = pcall(F.embedding, t:masked_fill(t:eq(ignore), 0), probe)
  if not ok then
    local v, pos = tostring(err):match("index (%-?%d+) %(position (%d+)")
    if v then
      err = ("%s: target %s at position %s (1-based) is outside the vocabulary [0, %d) and is not the ignore index %d")
        :format(op, v, pos, classes, ignore)
    end
    refuse(g, err)
  end
end

-- ---- the loss: the vocabulary-parallel log-softmax ------------------------------

-- Over x (N, W), this rank's columns of the logits in the compute dtype (a
-- buffer of its own, overwritten): the whole rows' loss (N) (0 on ignored
-- rows), x turned into the softmax minus the one-hot target (the rows'
-- gradient), and the (N) 0/1 weights of the rows that count. Megatron's
-- vocab_parallel_cross_entropy: all-reduce max of the rows' max, all-reduce
-- sum of exp(x - max) and of the target's logit (from the rank holding it).
local function softmax_rows(x, t, g, classes, ignore)
  local W = x:size(2)
  local lo = span(g, W)
  local valid = math.max(0, math.min(W, classes - lo)) -- this rank's real columns
  if valid < W then -- padding: no probability
    local pad = x:narrow(2, valid + 1, W - valid)
    pad:fill_(-INF)
    pad:free() -- (the view lets go of the buffer now: the backward frees it)
  end
  local ignored = t:eq(ignore)
  local counted = t:ne(ignore)
  -- (bool and / or as minimum / maximum)
  local here = counted:minimum(t:ge(lo):minimum(t:lt(lo + valid))) -- counted, and this rank's column
  local there = ignored:maximum(t:lt(lo):maximum(t:ge(lo + valid))) -- the others
  -- the target's element of the flattened x (column 0 where another rank
  -- holds it): index_select / index_add_, whose range checks do not wait
  -- for a GPU (gather / scatter_add_'s do)
  local N = x:size(1)
  local at = tensor.arange(N, { dtype = "i64", device = x.device }) * W + (t - lo):masked_fill(there, 0):to("i64")
  local flat = x:view(-1)
  local xt = flat:index_select(1, at):masked_fill(there, 0) -- the target's logit, from the rank that holds it
  local m = x:max(2)
  m = m:contiguous()
  regions.count("all_reduce", m:nbytes())
  comm.all_reduce(m, { op = "max", group = g })
  x:sub_(m:unsqueeze(2))
  x:exp_()
  local s = x:sum(2):contiguous()
  -- (the target's logit and the sum of exps reduced together: one call)
  local both = tensor.stack({ xt, s }, 1)
  regions.count("all_reduce", both:nbytes())
  comm.all_reduce(both, { group = g })
  xt, s = both:select(1, 1), both:select(1, 2)
  local loss = (s:log() + m - xt):masked_fill(ignored, 0)
  x:div_(s:unsqueeze(2))
  flat:index_add_(1, at, -here:to(x.dtype)) -- minus the one-hot target
  flat:free() -- (the view lets go of the buffer: the backward frees it)
  return loss, x, counted:to(x.dtype)
end

-- (N, W) logits and (N) targets from logits (N, W) / (B, T, W) and targets
-- (N) / (B, T), checked
local function rows_and_targets(op, g, logits, targets, lname)
  if not is_tensor(logits) or not logits:is_floating_point() then
    refuse(g, ("%s: %s must be a float tensor, got %s"):format(op, lname,
      is_tensor(logits) and logits.dtype or type(logits)))
  end
  if not is_tensor(targets) or not is_int(targets) then
    refuse(g, ("%s: targets must be integer class ids (i32 or i64), got %s"):format(op,
      is_tensor(targets) and targets.dtype or type(targets)))
  end
  local d = logits:dim()
  local fits = (d == 2 or d == 3) and targets:dim() == d - 1
  for i = 1, d - 1 do fits = fits and targets:size(i) == logits:size(i) end
  if not fits then
    refuse(g, ("%s: expects %s (N, %s) and targets (N), or (B, T, %s) and (B, T), got %s and %s"):format(op, lname,
      lname == "logits" and "V/n" or "C", lname == "logits" and "V/n" or "C", tostring(logits:shape()),
      tostring(targets:shape())))
  end
  local W = logits:size(d)
  return logits:reshape(-1, W), targets:reshape(-1)
end

-- the forward's (N, V/n) gradient buffer, handed over once: the backward
-- uses it up (in place, then freed), so it never outlives the step waiting
-- for Lua's garbage collector; a second backward through the same graph
-- (retain_graph) is an error saying so
local function used_up(ctx, op)
  local G = ctx.grad
  if not G then
    error(op .. ": its backward ran twice (retain_graph): the forward's gradient buffer is used up by the first", 0)
  end
  ctx.grad = nil
  return G
end

local vce_fn = autograd.Function {
  forward = function(ctx, logits, targets, g, ignore, red, classes)
    local x2, t = logits:reshape(-1, logits:size(-1)), targets:reshape(-1)
    local x = is_half(x2) and x2:to("f32") or x2:clone()
    local loss, grad, counted = softmax_rows(x, t, g, classes, ignore)
    ctx.grad, ctx.counted, ctx.red, ctx.shape, ctx.dtype = grad, counted, red, logits:shape(), logits.dtype
    if not ctx.needs_input_grad[1] then -- (no gradient wanted: the buffer goes now)
      grad:free()
      ctx.grad = nil
    end
    if red == "none" then return loss:view(targets:shape()) end
    local total = loss:sum()
    if red == "sum" then return total end
    ctx.denom = counted:sum():clamp(1, nil)
    return total / ctx.denom
  end,
  backward = function(ctx, dloss)
    local G = used_up(ctx, "vocab_parallel_cross_entropy")
    local cd = G.dtype
    local scale -- (N) d(loss)/d(row loss), 0 on the rows that do not count
    if ctx.red == "none" then
      scale = dloss:reshape(-1):to(cd) * ctx.counted
    elseif ctx.red == "sum" then
      scale = ctx.counted * dloss:to(cd)
    else
      scale = ctx.counted * (dloss:to(cd) / ctx.denom)
    end
    G:mul_(scale:unsqueeze(2)) -- (in place: the buffer becomes the logits' gradient)
    if G.dtype == ctx.dtype then return G:view(ctx.shape), nil end
    local dx = G:to(ctx.dtype)
    G:free()
    return dx:view(ctx.shape), nil
  end,
}

--- tp.vocab_parallel_cross_entropy(logits, targets, group[, {ignore_index =
-- -100, reduction = "mean" | "sum" | "none", count = true, classes = V}])
-- -> loss[, count], as F.cross_entropy returns them for the whole logits.
-- logits (N, V/n) or (B, T, V/n): this rank's columns r*V/n .. (r+1)*V/n of
-- the whole vocabulary's logits (a column-parallel head's output, not
-- gathered); targets (N) or (B, T): whole-vocabulary ids, the same on every
-- rank. classes: the real vocabulary when V is padded (columns >= classes,
-- on whichever ranks hold them, get no probability and zero gradient).
-- The (N, V) logits are never gathered: each rank's row max all-reduced
-- (max), then its sums of exp(l - max) and the target's logit (from the
-- rank holding it) all-reduced together (sum): 3N values a rank
-- (Megatron's vocab_parallel_cross_entropy, its two sums in one call).
-- bf16/f16 logits are reduced in f32. The backward gives each rank the
-- gradient of its columns. The mean is over the targets that count; none
-- counting gives 0 and zero gradients. A target outside [0, classes) that
-- is not the ignore index, bad shapes or options are errors on every rank.
-- A group of one rank: F.cross_entropy itself.
function M.vocab_parallel_cross_entropy(logits, targets, g, opts)
  local op = "vocab_parallel_cross_entropy"
  check_group(op, g)
  if g:size() == 1 then return F.cross_entropy(logits, targets, opts) end
  local x2, t = rows_and_targets(op, g, logits, targets, "logits")
  local V = x2:size(2) * g:size()
  local ignore, red, want_count, classes = loss_options(op, g, opts, V, REDUCTIONS)
  check_targets(op, g, t, classes, ignore)
  local loss = vce_fn(logits, targets, g, ignore, red, classes)
  if not want_count then return loss end
  return loss, targets:ne(ignore):sum():item()
end

-- ---- the head and the loss fused -----------------------------------------------

local REDUCTIONS_FUSED = { mean = true, sum = true }

local lce_fn = autograd.Function {
  forward = function(ctx, y, w, targets, g, ignore, red, classes)
    local y2, t = y:reshape(-1, y:size(-1)):contiguous(), targets:reshape(-1)
    local x = tensor.matmul(y2, w:t()) -- (N, V/n): the one buffer
    if is_half(x) then -- (bf16/f16: reduced in f32)
      local h = x
      x = h:to("f32")
      h:free()
    end
    local loss, grad, counted = softmax_rows(x, t, g, classes, ignore)
    local total = loss:sum()
    local scale = counted
    if red == "mean" then
      local denom = counted:sum():clamp(1, nil)
      total = total / denom
      scale = scale / denom
    end
    if ctx.needs_input_grad[1] or ctx.needs_input_grad[2] then
      -- the gradient for a loss gradient of 1, kept in the product's dtype
      grad:mul_(scale:unsqueeze(2))
      if grad.dtype == y.dtype then
        ctx.grad = grad
      else
        ctx.grad = grad:to(y.dtype)
        grad:free()
      end
      ctx.y2, ctx.w, ctx.shape = y2, w, y:shape()
    else
      grad:free() -- (no gradient wanted: the buffer goes now)
    end
    return total -- (f32 for bf16/f16, as F.linear_cross_entropy's)
  end,
  backward = function(ctx, dloss)
    local G = used_up(ctx, "linear_cross_entropy")
    local d = dloss:to(G.dtype)
    local dy, dw
    -- the (N, C) and (V/n, C) products scaled, not the (N, V/n) buffer
    if ctx.needs_input_grad[1] then dy = tensor.matmul(G, ctx.w):mul_(d):view(ctx.shape) end
    if ctx.needs_input_grad[2] then
      local Gt = G:t()
      dw = tensor.matmul(Gt, ctx.y2):mul_(d)
      Gt:free() -- (a view holds the storage too)
    end
    G:free()
    ctx.y2, ctx.w = nil, nil
    return dy, dw, nil
  end,
}

--- tp.linear_cross_entropy(y, weight, targets, group[, {ignore_index = -100,
-- reduction = "mean" | "sum", count = true, classes = V}]) -> loss[, count]:
-- the vocabulary-parallel head and its loss in one op, as
-- F.linear_cross_entropy(y, whole_weight, targets) is in one process. y (N,
-- C) or (B, T, C), the same on every rank: pass it through
-- tp.copy_to_region (or tp.gather_rows under sequence parallelism), whose
-- backward sums the ranks' gradients -- the y gradient this op gives is
-- this rank's partial, not reduced here. weight (V/n, C): this rank's rows
-- of the head (for a tied head, the VocabParallelEmbedding's weight
-- itself); targets y's leading dims, whole-vocabulary ids; options as
-- tp.vocab_parallel_cross_entropy's (classes: the real vocabulary of a
-- padded V). Memory: one (N, V/n) buffer, the local logits, over which the
-- forward writes their gradient (softmax minus one-hot, scaled by the
-- reduction: llm.c's fused classifier); the backward only scales the two
-- products (dy = G W, dW = G^T y) by the loss's gradient. bf16/f16 reduce
-- in f32 (the buffer is converted: a second, f32 one while the forward
-- runs) and return an f32 loss, as F.linear_cross_entropy. A group of one
-- rank: F.linear_cross_entropy itself.
function M.linear_cross_entropy(y, w, targets, g, opts)
  local op = "linear_cross_entropy"
  check_group(op, g)
  if g:size() == 1 then return F.linear_cross_entropy(y, w, targets, opts) end
  local y2, t = rows_and_targets(op, g, y, targets, "y")
  if not is_tensor(w) or w:dim() ~= 2 or w:size(2) ~= y2:size(2) or w.dtype ~= y.dtype then
    refuse(g, ("%s: weight must be this rank's (V/n, %d) %s rows of the head, got %s"):format(op, y2:size(2), y.dtype,
      is_tensor(w) and (tostring(w:shape()) .. " " .. w.dtype) or type(w)), 3)
  end
  local V = w:size(1) * g:size()
  local ignore, red, want_count, classes = loss_options(op, g, opts, V, REDUCTIONS_FUSED)
  check_targets(op, g, t, classes, ignore)
  local loss = lce_fn(y, w, targets, g, ignore, red, classes)
  if not want_count then return loss end
  return loss, targets:ne(ignore):sum():item()
end

return M
