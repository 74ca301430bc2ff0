--- lutra.train.evaluate (lt.train.evaluate): the validation loss, the piece
-- of lt.train a custom loop reuses.
--
--   local val_loss = lt.train.evaluate(model, val_loader, { batches = 20 })
local autograd = require "lutra.autograd"
local F = require "lutra.nn.functional"
local records = require "lutra.dist.tp.records"
local tpnorm = require "lutra.dist.tp.norm"
local tensor = require "lutra.tensor"
local comm = require "lutra.dist.comm"

-- under a pipeline (or tensor parallelism) the ranks of group g must run
-- out of batches together: one that stops while another calls model:loss
-- would leave that one waiting for it (a receive, a collective) until the
-- watchdog. Returns the message for every rank of g when some have a batch
-- i and some not (the caller raises once both groups have been asked: a
-- rank raising after the first would leave the second group waiting).
local function differs(g, have, i, kind)
  local t = tensor.tensor({ have and 1 or 0, have and 0 or 1 }, { dtype = "f64" })
  comm.all_reduce(t, { op = "max", group = g })
  local v = t:totable()
  if v[1] > 0 and v[2] > 0 then
    return ("train: the %s ranks' validation loaders ran out at different batches (batch %d: this rank %s): every "
      .. "rank of a %s group must read the same batches"):format(kind, i, have and "has one" or "has none", kind)
  end
end

--- lt.train.evaluate(model, loader[, {batches = 20, ignore_index = -100, device = "cpu", own_loss = false}])
-- -> the mean token loss (cross-entropy of model(x) against y, summed over
-- the targets other than ignore_index and divided by their count) over the
-- next `batches` batches of loader:next() (fewer where it runs out; NaN when
-- no target counted), without gradients, with the model in eval mode (put
-- back in training mode after, unless it was in eval mode already). Batches
-- are moved to device. The loader is read from where it is: restart it
-- (loader:load_state) for evaluations that compare. Raises "train: the
-- validation batches' sequence length N is longer than the model's context
-- (block_size B)" and what the model raises. own_loss: a model whose class
-- says model:loss is its cross-entropy (model.loss_is_cross_entropy ==
-- model.loss, lt.models') computes it with model:loss (lt.train asks for
-- it under tensor parallelism: a vocabulary-parallel head's loss never
-- gathers the logits). Under tensor parallelism every rank of the TP
-- group calls it on the same batches (the forward's collectives); the
-- first batch is checked to be (lt.dist.tp.check_same_batch: "train: the
-- tensor-parallel ranks read different validation batches ...").
-- A pipeline stage model (model.pp) computes it with model:loss, the
-- forward-only pipeline: every rank of the pipeline calls it on the same
-- batches (checked on the first, as under TP) and gets the whole model's loss.
-- Under a pipeline or TP the group's ranks agree at each batch that they
-- all have one (one all_reduce of two numbers a group; under tp x pp one
-- more over TP): a loader that runs out on some ranks only raises on every
-- rank of the model instead of a hang.
local function evaluate(model, loader, opts)
  opts = opts or {}
  local n, ignore_index, device = opts.batches or 20, opts.ignore_index or -100, opts.device or "cpu"
  local sum, count = 0, 0
  local pp = type(model) == "table" and rawget(model, "pp") or nil -- (a stage model: model:loss always)
  local own = (opts.own_loss or pp ~= nil) and model.loss ~= nil and model.loss_is_cross_entropy == model.loss
  local was_training = model.training
  local block = model.config and model.config.block_size
  local tpg, checked = records.group(model), false
  local ppg, pp_checked = pp and pp.group, false
  model:eval()
  autograd.no_grad(function()
    for i = 1, n do
      local x, y = loader:next()
      local bad_pp = ppg and differs(ppg, x ~= nil, i, "pipeline")
      local bad_tp = tpg and differs(tpg, x ~= nil, i, "tensor-parallel")
      local bad = bad_pp or bad_tp
      if ppg and tpg then
        -- (tp x pp: the pipeline check flagged every stage of the rank that differs; each stage's TP
        -- group then learns of it, so every rank of the model raises)
        local t = tensor.tensor({ bad and 1 or 0 }, { dtype = "f64" })
        comm.all_reduce(t, { op = "max", group = tpg })
        if t:item() > 0 and not bad then
          bad = ("train: the validation loaders of the model's tensor-parallel x pipeline ranks ran out at different "
            .. "batches (batch %d, on another stage): every rank must read the same batches"):format(i)
        end
      end
      if bad then error(bad, 0) end
      if not x then break end
      if block and x:size(x:dim()) > block then
        error(("train: the validation batches' sequence length %d is longer than the model's context (block_size %d)")
          :format(x:size(x:dim()), block), 0)
      end
      if device ~= "cpu" then x, y = x:to(device), y:to(device) end
      if tpg and not checked then -- (the first batch: a val loader split by the job's ranks is refused)
        checked = true
        tpnorm.check_same_batch(tpg, x, y, "train", "validation batches")
      end
      if ppg and not pp_checked then -- (so must a pipeline's stages: model:loss pairs up what they hold)
        pp_checked = true
        tpnorm.check_same_batch(ppg, x, y, "train", "validation batches", nil, "pipeline")
      end
      local lo = { reduction = "sum", ignore_index = ignore_index }
      local l, c
      if own then l, c = model:loss(x, y, lo) else l, c = F.cross_entropy(model(x), y, lo) end
      sum = sum + l:item()
      count = count + c
    end
  end)
  if was_training ~= false then model:train() end
  if count == 0 then return 0 / 0 end
  return sum / count
end

return evaluate
