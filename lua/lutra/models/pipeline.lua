--- lutra.models.pipeline: GPT-2 and Llama split into pipeline stages by
-- blocks (Huang et al. 2019; Narayanan et al. 2021). lt.models.gpt2(name,
-- {pp = group, pp_stages = {...}, virtual_stages = v}) and
-- lt.models.llama(...) build the whole model from the generator (every
-- layout starts from one process's weights; under tensor parallelism
-- already split across its group), then hand it here, which keeps on each
-- rank of the pipeline group only its stages' parts:
--
--   blocks     the model's p x v virtual stages take consecutive blocks,
--              an even split by default (the first n % (p v) stages one
--              more, as torch.tensor_split) or the block counts pp_stages
--              lists; rank r holds virtual stages r, r + p, ..., r + (v-1) p
--              (its chunks 1..v, Megatron-LM's interleaved placement)
--   embedding  on the first stage (virtual stage 0: rank 0's chunk 1)
--   final norm and head   on the last (virtual stage p v - 1: rank p-1's chunk v)
--   tied head  (GPT-2; Llama with tie_embeddings) both ranks hold the
--              weight: the first as the embedding, the last as the head
--              (lm_head.weight); their gradients are summed over the two
--              (model.pp.tied_group) before the optimizer steps, so both
--              copies stay bitwise the same
--
-- Blocks keep their names (transformer.h.5 stays h.5 on whichever stage
-- holds it), so a stage's parameters are named as the whole model's,
-- except the last stage's tied head, "lm_head.weight" (the whole model
-- names it transformer.wte.weight / model.embed_tokens.weight). The stage
-- model's forward is refused (a stage holds part of the model); its loss
-- runs every stage's forward in turn (pipeline.loss: evaluation), and the
-- training schedule runs stage_forward (lutra.dist.pp.executor).
local tensor = require "lutra.tensor"
local comm = require "lutra.dist.comm"
local autograd = require "lutra.autograd"
local residual = require "lutra.models.residual"
local parallel = require "lutra.models.parallel"
local link = require "lutra.dist.pp.link"
local records = require "lutra.dist.tp.records"

local M = {}

-- where each family keeps its parts: the block list, the module holding
-- the embedding(s) and final norm, and the embedding's key
local FAMILIES = {
  GPT = { blocks = function(m) return m.transformer.h end, holder = function(m) return m.transformer end,
    embed = { "wte", "wpe" }, final = "ln_f", whole_tied = "transformer.wte.weight" },
  Llama = { blocks = function(m) return m.model.layers end, holder = function(m) return m.model end,
    embed = { "embed_tokens" }, final = "norm", whole_tied = "model.embed_tokens.weight" },
}

--- pipeline.block_counts(n_blocks, stages[, counts]) -> {blocks of virtual
-- stage 0, 1, ...}: counts checked (stages entries, whole numbers >= 1,
-- summing to n_blocks), or an even split (the first n_blocks % stages one
-- more). Raises "pipeline: <n> stages for <m> blocks ..." when there are
-- more stages than blocks, and names the entry or the sum that is wrong.
function M.block_counts(n, stages, counts)
  if counts == nil then
    if stages > n then
      error(("pipeline: %d stages for %d blocks: each stage needs at least one block (fewer stages, or "
        .. "virtual_stages)"):format(stages, n), 0)
    end
    local out = {}
    for s = 1, stages do out[s] = math.floor(n / stages) + (s <= n % stages and 1 or 0) end
    return out
  end
  if type(counts) ~= "table" or #counts ~= stages then
    error(("pipeline: pp_stages must list the blocks of each of the %d stages, got %s"):format(stages,
      type(counts) == "table" and (#counts .. " entries") or tostring(counts)), 0)
  end
  local sum = 0
  for i, c in ipairs(counts) do
    if type(c) ~= "number" or c < 1 or c ~= math.floor(c) then
      error(("pipeline: pp_stages[%d] = %s: each stage needs a whole number >= 1 of blocks"):format(i, tostring(c)), 0)
    end
    sum = sum + c
  end
  if sum ~= n then
    error(("pipeline: pp_stages %s sums to %d blocks, the model has %d"):format(table.concat(counts, ","), sum, n), 0)
  end
  return counts
end

-- a group of the pipeline's first and last stage ranks (every rank of the
-- job calls it: new_group is the world's); nil on the others' side is a
-- group of their own
local function tied_group(g)
  local id = tensor.tensor({ comm.rank() }, { dtype = "i64" })
  comm.all_reduce(id, { op = "min", group = g }) -- the pipeline's lowest world rank names it
  local member = g:rank() == 0 or g:rank() == g:size() - 1
  local grp = comm.new_group(member and id:item() or comm.world_size() + comm.rank())
  return member and grp or nil
end

local function keep_blocks(list, keep)
  local reg = list._children
  local names = {}
  for _, name in ipairs(reg.names) do
    if keep[name] then names[#names + 1] = name else reg.by_name[name] = nil end
  end
  reg.names = names
end

--- pipeline.split(model, group, {stages = (block counts per virtual
-- stage), chunks = 1}) -> model: the whole model cut in place to this
-- rank's stages (see the top of this file). model.pp = {group, size, rank,
-- chunks, virtual (p v), counts, blocks = {[c] = the blocks of chunk c},
-- vstage = {[c] = its virtual stage, 0-based}, first, last (this rank holds
-- the embedding / the head), tied_group (on the first and last stage of a
-- tied model: the two ranks), tied, copy (pipeline.tied(model) and
-- pipeline.copy(model): the tied weights held now, after model:to too)}.
-- Collective over the job (a group for the tied weight). Raises for an
-- unknown model class, stages or counts that do not fit the blocks.
function M.split(model, g, o)
  o = o or {}
  local fam = FAMILIES[model.__name]
  if not fam then error(("pipeline: no stage layout for a %s model (GPT-2 and Llama have one)"):format(
    tostring(model.__name)), 3) end
  local p, r, v = g:size(), g:rank(), o.chunks or 1
  if type(v) ~= "number" or v < 1 or v ~= math.floor(v) then
    error(("pipeline: virtual_stages must be a whole number >= 1, got %s"):format(tostring(v)), 3)
  end
  local list = fam.blocks(model)
  local S = p * v
  local counts = M.block_counts(list:len(), S, o.stages)
  local starts, at = {}, 0
  for s = 1, S do starts[s], at = at, at + counts[s] end
  local P = { group = g, size = p, rank = r, chunks = v, virtual = S, counts = counts, blocks = {}, vstage = {},
    first = r == 0, last = r == p - 1, family = fam }
  local keep = {}
  for c = 1, v do
    local vs = r + (c - 1) * p
    P.vstage[c] = vs
    local mods = {}
    for b = starts[vs + 1], starts[vs + 1] + counts[vs + 1] - 1 do
      keep[b] = true
      mods[#mods + 1] = list[b + 1]
    end
    P.blocks[c] = mods
  end
  keep_blocks(list, keep)
  local holder = fam.holder(model)
  local tied = model.config.tie_embeddings
  if not P.first then for _, k in ipairs(fam.embed) do holder[k] = nil end end
  if not P.last then
    holder[fam.final] = nil
    model.lm_head = nil
  end
  if tied and p > 1 then P.tied_group = tied_group(g) end
  -- (P.tied and P.copy read the weights held now: model:to replaces the tensors)
  setmetatable(P, { __index = function(_, k)
    if k == "tied" then return M.tied(model) elseif k == "copy" then return M.copy(model) end
  end })
  rawset(model, "pp", P)
  rawset(model, "forward", function()
    error(("pipeline: this rank holds stage %d of %d (blocks of a part of the model): model(x) is not available; "
      .. "use model:loss (every stage calls it) or load the whole weights (lt.ckpt.load_weights)"):format(r, p), 2)
  end)
  rawset(model, "loss", M.loss)
  rawset(model, "loss_is_cross_entropy", M.loss)
  collectgarbage() -- (the other stages' weights are garbage now)
  return model
end

--- pipeline.tied(model) -> the tied embedding's weight this stage holds
-- (the first stage's embedding, the last stage's head; the same tensor
-- when one rank holds both), or nil (untied, or a middle stage).
function M.tied(model)
  local P = model.pp
  if not (P and model.config.tie_embeddings and (P.first or P.last)) then return nil end
  if P.first then return P.family.holder(model)[P.family.embed[1]].weight end
  return model.lm_head.weight
end

--- pipeline.copy(model) -> the last stage's copy of the tied weight (its
-- gradient is summed with the first stage's, and counted once, there, in
-- the gradient norm), or nil.
function M.copy(model)
  local P = model.pp
  if P and P.last and not P.first and model.config.tie_embeddings then return model.lm_head.weight end
  return nil
end

--- pipeline.stage_forward(model, c, input, targets, opts, B, T) -> the
-- output of this rank's chunk c: the residual stream (B, T, C) (under
-- sequence parallelism this rank's rows, (B T / tp, C)) for the next
-- stage, or on the last stage F.cross_entropy's result for targets (opts
-- as its: the training schedule asks for the summed loss). input: the
-- micro-batch's ids (B, T) on the first stage, else the previous stage's
-- output. B, T: the micro-batch's shape (a tensor-parallel stage needs it
-- before its blocks).
function M.stage_forward(model, c, input, targets, opts, B, T)
  local P = model.pp
  if rawget(model, "tp_ctx") then parallel.begin(model, B, T, nil) end
  local vs = P.vstage[c]
  local x = vs == 0 and model:embed(input) or input
  local pending
  x, pending = residual.run(P.blocks[c], x, nil)
  if vs == P.virtual - 1 then
    local _, y = residual.norm(P.family.holder(model)[P.family.final], x, pending)
    return model:head_loss(y, targets, opts)
  end
  if pending then x = x + pending end
  return x
end

--- pipeline.check_shapes(model, xs, ys, who) -> B, T: raises on every rank
-- of the pipeline group unless every micro-batch x of xs (and its targets
-- ys[k]) on every rank of the group is the same B x T. The link agrees a
-- message's shape once per (B, T) and each receiver posts its buffer from
-- its own micro-batch's shape, so a micro-batch of another shape within a
-- step, or a rank holding another shape than its neighbours, would leave a
-- receive waiting until the watchdog aborts the job. One all_reduce (max)
-- of five numbers over the group (and under tensor parallelism one over the
-- stage's TP group, whose ranks must agree too and learn of a refusal in
-- another pipeline); who names the caller in the message.
function M.check_shapes(model, xs, ys, who)
  local P = model.pp
  local B, T = xs[1]:size(1), xs[1]:dim() > 1 and xs[1]:size(2) or 1
  local bad -- {micro-batch, 1 ids / 2 targets, dims, sizes...}
  for k = 1, #xs do
    for w, t in ipairs { xs[k], ys[k] } do
      if not bad and (t:dim() ~= 2 or t:size(1) ~= B or t:size(2) ~= T) then
        bad = { k, w, math.min(t:dim(), 4) }
        for d = 1, 4 do bad[3 + d] = d <= t:dim() and t:size(d) or 0 end
        bad[8], bad[9] = B, T
      end
    end
  end
  local v = tensor.tensor({ B, T, -B, -T, bad and P.rank + 1 or 0 }, { dtype = "f64" })
  comm.all_reduce(v, { op = "max", group = P.group })
  local m = v:totable()
  local msg
  if m[5] > 0 then
    -- (the details of the highest such rank, summed from it alone: every rank names them)
    local mine = m[5] - 1 == P.rank
    local d = tensor.tensor(mine and bad or { 0, 0, 0, 0, 0, 0, 0, 0, 0 }, { dtype = "f64" })
    comm.all_reduce(d, { group = P.group })
    local b = d:totable()
    local dims = {}
    for i = 1, b[3] do dims[i] = ("%d"):format(b[3 + i]) end
    msg = ("%s: under pipeline parallelism every micro-batch of a step must have one shape (B x T): on pipeline "
      .. "rank %d micro-batch %d is %s (%s), micro-batch 1's ids are %dx%d"):format(who, m[5] - 1, b[1],
      table.concat(dims, "x"), b[2] == 1 and "ids" or "targets", b[8], b[9])
  elseif m[1] ~= -m[3] or m[2] ~= -m[4] then
    msg = ("%s: the pipeline's ranks hold micro-batches of different shapes (B %d to %d, T %d to %d; this rank "
      .. "%dx%d): every rank of a pipeline group must read the same batches"):format(who, -m[3], m[1], -m[4], m[2],
      B, T)
  end
  local tp = records.group(model)
  if tp and tp:size() > 1 then
    -- (tp x pp: a stage's TP ranks must hold one shape too, and learn of a pipeline that refused: the
    -- others would wait for them in the stage's collectives)
    local w = tensor.tensor({ msg and 1 or 0, B, T, -B, -T }, { dtype = "f64" })
    comm.all_reduce(w, { op = "max", group = tp })
    local q = w:totable()
    if not msg and q[1] > 0 then
      msg = ("%s: micro-batches of different shapes in the pipeline of another of this stage's tensor-parallel "
        .. "ranks (refused there; this rank %dx%d)"):format(who, B, T)
    elseif not msg and (q[2] ~= -q[4] or q[3] ~= -q[5]) then
      msg = ("%s: the tensor-parallel ranks hold micro-batches of different shapes (B %d to %d, T %d to %d; this "
        .. "rank %dx%d): every rank of a TP group must read the same batches"):format(who, -q[4], q[2], -q[5], q[3], B, T)
    end
  end
  if msg then error(msg, 0) end
  return B, T
end

--- pipeline.link(model, device) -> the stage's link to its neighbours
-- (lutra.dist.pp.link), one per model so that shapes are agreed once per
-- run, its device set to device (where activations arrive). A model whose
-- parameters changed dtype since (model:to("bf16") between steps: every
-- stage does) gets a new link, whose first messages agree the shapes and
-- dtype again (the old one's receivers would post buffers of the old dtype).
function M.link(model, device)
  local P = model.pp
  local first = model:parameters()[1]
  local dtype = first and first.dtype or "f32"
  if P.link and P.link.dtype ~= dtype then P.link = nil end
  P.link = P.link or link.new(P.group, P.chunks, device)
  P.link.dtype = dtype
  P.link.device = device
  return P.link
end

--- pipeline.loss(model, idx, targets[, opts]) -> the loss of the whole
-- model on one batch (and the count of counted targets, as
-- F.cross_entropy's with its opts) on every rank of the pipeline: each
-- rank runs its chunks in order, receiving the stream from the stage
-- before and sending it on (lutra.dist.pp.link), and the last stage's
-- result is broadcast over the pipeline group (an all_reduce of the sum).
-- Without gradients (evaluation); every rank of the pipeline calls it with
-- the same batch. reduction "none" is refused.
function M.loss(model, idx, targets, opts)
  local P = model.pp
  opts = opts or {}
  if opts.reduction == "none" then error("pipeline: loss with reduction \"none\" is not available on a pipeline stage", 2) end
  local lo = {}
  for k, v in pairs(opts) do lo[k] = v end
  lo.reduction, lo.count = "sum", true
  local B, T = M.check_shapes(model, { idx }, { targets }, "pipeline: loss")
  local L = M.link(model, idx.device)
  local sum, count = 0, 0
  autograd.no_grad(function()
    for c = 1, P.chunks do
      local vs = P.vstage[c]
      local input = vs == 0 and idx or L:recv("fwd", vs, 0, B, T):wait_value()
      local out, n = M.stage_forward(model, c, input, targets, lo, B, T)
      if vs == P.virtual - 1 then
        sum, count = out:item(), n
      else
        L:send(out, "fwd", vs + 1, 0, B, T)
      end
    end
    L:finish()
  end)
  local t = tensor.tensor({ sum, count }, { dtype = "f64" })
  comm.all_reduce(t, { group = P.group })
  local v = t:totable()
  local mean = (opts.reduction or "mean") == "sum" and v[1] or v[1] / v[2]
  if opts.count == false then return tensor.tensor(mean) end
  return tensor.tensor(mean), v[2]
end

return M
