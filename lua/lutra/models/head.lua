--- lutra.models.head: a language model's head and its loss. A plain
-- bias-free nn.Linear head (GPT-2's tied one, Llama's) runs with its loss as
-- one op, F.linear_cross_entropy: the logits are never kept, and their
-- gradient is written over them in the forward (llm.c's fused classifier).
local nn = require "lutra.nn"
local F = require "lutra.nn.functional"

local M = {}

--- head.loss(head, y, targets, opts) -> F.cross_entropy(head(y), targets,
-- opts)'s results (loss[, count]). y (B, T, C) the final norm's output,
-- targets (B, T); opts as F.cross_entropy's (classes: the head's first
-- classes rows are the vocabulary, the rest padding). A head with its own
-- forward or a bias, or reduction "none", runs as the two ops.
function M.loss(head, y, targets, opts)
  opts = opts or {}
  if head.forward == nn.Linear.forward and head.bias == nil and (opts.reduction or "mean") ~= "none" then
    return F.linear_cross_entropy(y, head.weight, targets, opts)
  end
  return F.cross_entropy(head(y), targets, opts)
end

--- head.runner(model, own_forward) -> run(fn, ...) that calls fn(model, ...)
-- as the model's forward would run: as it is where the model's forward is
-- own_forward (its class's), inside lt.dist.Zero stage 3's gathers and
-- hooks where the forward wraps own_forward (so a model's loss fuses its
-- head there too); nil where the forward is another (a subclass's or a
-- user's: the loss then runs the forward).
function M.runner(model, own_forward)
  if model.forward == own_forward then return function(fn, ...) return fn(model, ...) end end
  local around = rawget(model, "_zero3_around")
  if around and rawget(model, "_wrapped_forward") == own_forward then
    return function(fn, ...) return around(fn, model, ...) end
  end
end

--- head.with_classes(cfg, opts) -> a copy of opts (F.cross_entropy's)
-- with classes = cfg.vocab_size where the model's vocabulary is padded
-- (cfg.padded_vocab_size rows: the padding's columns out of the softmax);
-- opts' own classes win.
function M.with_classes(cfg, opts)
  local o = { classes = cfg.padded_vocab_size ~= cfg.vocab_size and cfg.vocab_size or nil }
  for k, v in pairs(opts or {}) do o[k] = v end
  return o
end

--- head.model_loss(model, own_forward, idx, targets, opts) -> the loss of a
-- language model of lt.models (GPT-2's, Llama's model:loss):
-- model:head_loss(model:hidden(idx), ...) run as the model's forward runs
-- (M.runner), or, where the forward is another, F.cross_entropy of its
-- padded logits over the vocabulary's columns.
function M.model_loss(model, own_forward, idx, targets, opts)
  local run = M.runner(model, own_forward)
  if not run then return F.cross_entropy(model(idx, nil, true), targets, M.with_classes(model.config, opts)) end
  return run(function(m) return m:head_loss(m:hidden(idx), targets, opts) end)
end

return M
