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

return M
