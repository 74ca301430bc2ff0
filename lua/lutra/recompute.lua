--- lutra.recompute: activation recomputation (gradient checkpointing, Chen
-- et al. 2016; torch.utils.checkpoint's meaning). lt.checkpoint(fn, ...)
-- runs fn without recording its graph, so none of its intermediate
-- activations are kept: only its inputs (which the caller holds anyway) and
-- its outputs. When backward reaches the outputs, fn runs again on the same
-- inputs with recording on, from the default generator's state of the
-- first run (dropout draws the same masks), and backward runs through that
-- recomputed graph with the outputs' gradients; the inputs' gradients go on
-- to the rest of the graph and the parameters' add into their .grad (their
-- gradient hooks fire then: DataParallel's buckets, ZeRO's reductions). The
-- arithmetic is the same as without it, so the gradients are bitwise the
-- same on the CPU.
--
--   local y = lt.checkpoint(block, x)        -- block(x), recomputed in backward
--
-- Models take a policy (lt.models.gpt2/llama{recompute = ...}, applied by
-- recompute.apply): "none"; "full" (every block: a block keeps its input
-- alone, the stream, about B T C values); "every:k" (every k-th block,
-- blocks k, 2k, ...); "selective" (Korthikanti et al. 2022: the attention
-- core, softmax(q k^T) v, recomputed, the linear layers' outputs kept. On
-- the CPU lutra's attention is composed (matmul, softmax, matmul) and keeps
-- the (B, H, T, T) probabilities, which selective drops, as in the paper;
-- on a GPU the fused kernels (FlashAttention's, cuDNN's) keep only their
-- output and softmax statistics, so selective saves far less there).
local autograd = require "lutra.autograd"
local tensor = require "lutra.tensor"
local random = require "lutra.random"
local F = require "lutra.nn.functional"

local M = {}

-- the function's results as a list, at most 4 tensors (autograd.Function's limit)
local function outputs_of(fn, args, n)
  local res = { fn(unpack(args, 1, n)) }
  for i = 1, table.maxn(res) do
    if not tensor.is_tensor(res[i]) then
      error(("checkpoint: the function's result %d is a %s: it must return tensors only"):format(i, type(res[i])), 0)
    end
  end
  if #res == 0 or #res > 4 then
    error(("checkpoint: the function returned %d values: 1 to 4 tensors expected"):format(#res), 0)
  end
  return res
end

--- lt.checkpoint(fn, ...) -> fn(...)'s results (1 to 4 tensors), whose
-- intermediate activations are recomputed during backward instead of kept
-- (see the top of this file). At most 4 of the arguments may be tensors;
-- the others (nil, numbers, booleans, tables) are passed as they are, both
-- times. Under no_grad, or when no tensor argument requires grad and fn
-- uses no parameter, it is fn(...) itself. fn must compute the same thing
-- both times from its arguments and the default generator (no reads of
-- state it changes). A tensor that fn uses and that also takes part in the
-- graph outside it (a weight shared with another layer) is refused at
-- backward ("backward: ... used both inside and outside an lt.checkpoint
-- function"). Raises when fn is not callable or returns something else.
function M.checkpoint(fn, ...)
  local callable = type(fn) == "function" or (type(fn) == "table" and getmetatable(fn) and getmetatable(fn).__call)
  if not callable then error(("checkpoint: expected a function (or a module), got %s"):format(type(fn)), 2) end
  if not autograd.is_grad_enabled() then return fn(...) end
  local n = select("#", ...)
  local args = { ... }
  local gen = random.default_generator()
  local rng = gen:state() -- (the recompute draws what the first run drew)
  local ntensors, any_grad = 0, false
  for i = 1, n do
    if tensor.is_tensor(args[i]) then
      ntensors = ntensors + 1
      any_grad = any_grad or args[i].requires_grad
    end
  end
  -- (no input needs a gradient, but the parameters inside fn may: the node
  -- then takes a dummy first input that requires grad, so backward reaches it)
  local lead = any_grad and 0 or 1
  if ntensors + lead > 4 then error(("checkpoint: %d tensor arguments (at most 4)"):format(ntensors), 2) end
  local nout
  local node = autograd.Function {
    forward = function(_, ...)
      local res = outputs_of(fn, { select(lead + 1, ...) }, n)
      nout = #res
      return unpack(res)
    end,
    backward = function(_, ...)
      local grads = { ... }
      local now = gen:state()
      gen:set_state(rng)
      local ins = {}
      for i = 1, n do
        local a = args[i]
        if tensor.is_tensor(a) then
          ins[i] = a:detach()
          if a.requires_grad then ins[i]:requires_grad_() end
        else
          ins[i] = a
        end
      end
      autograd.set_grad_enabled(true)
      local ok, res = pcall(outputs_of, fn, ins, n)
      gen:set_state(now)
      if not ok then
        autograd.set_grad_enabled(false)
        error("checkpoint: the recompute failed: " .. tostring(res), 0)
      end
      -- one backward through every output that has a gradient: the sum of
      -- out_i * grad_i has exactly grad_i as out_i's gradient
      local total
      for i = 1, nout do
        if grads[i] ~= nil and res[i].requires_grad then
          local term = (res[i] * grads[i]):sum()
          total = total and total + term or term
        end
      end
      local bok, berr = true, nil
      if nout == 1 and total then -- (one output: its own backward with its gradient, no product)
        bok, berr = pcall(res[1].backward, res[1], grads[1])
      elseif total then
        bok, berr = pcall(total.backward, total)
      end
      autograd.set_grad_enabled(false)
      if not bok then error(berr, 0) end
      local out = {}
      for i = 1, n do
        if tensor.is_tensor(ins[i]) and ins[i].requires_grad then out[lead + i] = ins[i].grad end
      end
      return unpack(out, 1, n + lead)
    end,
  }
  if lead == 1 then return node(tensor.zeros({ 1 }):requires_grad_(), ...) end
  return node(...)
end

local POLICIES = { none = true, full = true, selective = true }

--- recompute.parse(policy) -> kind, k: "none", "full", "selective", or
-- "every" with k for "every:k" (k >= 1; "every:1" is "full"). Raises
-- "recompute: ..." naming the policy and the valid ones.
function M.parse(policy)
  if policy == nil or policy == false then return "none" end
  if type(policy) == "string" then
    if POLICIES[policy] then return policy end
    local k = tonumber(policy:match("^every:(%d+)$"))
    if k and k >= 1 then return (k == 1 and "full" or "every"), k end
  end
  error(("recompute must be none, full, selective or every:k (k >= 1: every k-th block), got %s"):format(
    tostring(policy)), 0)
end

--- recompute.apply(model, list, attention_key, policy) -> model: marks the
-- blocks of the ModuleList list whose forward residual.run wraps in
-- lt.checkpoint ("full": all; "every:k": the k-th, 2k-th, ... of the whole
-- model, by their names 0, 1, ..., so a pipeline stage holding some of them
-- marks the same ones), or the attention modules (each block's field
-- attention_key) whose core the models wrap ("selective"); records
-- model.recompute (the policy's text). Raises on a bad policy.
function M.apply(model, list, attention_key, policy)
  local kind, k = M.parse(policy)
  for _, name in ipairs(list._children.names) do
    local b = list._children.by_name[name]
    rawset(b, "recompute", (kind == "full" or (kind == "every" and (name + 1) % k == 0)) or nil)
    rawset(b[attention_key], "recompute_attention", kind == "selective" or nil)
  end
  rawset(model, "recompute", kind == "every" and ("every:" .. k) or kind)
  return model
end

--- recompute.attention(module, q, k, v, opts) -> F.scaled_dot_product_attention(q,
-- k, v, opts), through lt.checkpoint where the module is marked
-- (recompute_attention: the "selective" policy).
function M.attention(module, q, k, v, opts)
  if rawget(module, "recompute_attention") then return M.checkpoint(F.scaled_dot_product_attention, q, k, v, opts) end
  return F.scaled_dot_product_attention(q, k, v, opts)
end

return M
