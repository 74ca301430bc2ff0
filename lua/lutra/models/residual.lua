--- lutra.models.residual: the residual stream of pre-norm transformer blocks
-- (GPT-2's and Llama's): h = x + attn(norm1(x)), then h + mlp(norm2(h)),
-- with each residual add done inside the norm that follows it where that
-- norm takes it (fuses_residual: F.add_layer_norm or F.add_rms_norm, one
-- pass over the stream instead of an add and a norm, as llm.c fuses them).
-- A block can hand its MLP's output on (carry) for the next block's first
-- norm, or the final norm, to add.
local nn = require "lutra.nn"
local recompute = require "lutra.recompute"

local M = {}

--- residual.norm(norm, x, pending) -> h, norm(h) with h = x + pending (x
-- when pending is nil); one op where the norm fuses the add.
function M.norm(norm, x, pending)
  if pending and nn.fuses(norm, "fuses_residual") then return norm(x, pending) end
  local h = pending and x + pending or x
  return h, norm(h)
end

--- residual.block(norm1, attn, norm2, mlp, x, kv, pending, carry) -> the
-- stream after the block (B, T, C); with carry, the stream before the
-- MLP's add and the MLP's output instead, for the next norm to add. x (B,
-- T, C); pending: a residual still to be added to x (the block before's
-- MLP output) or nil; kv: the KV cache or nil, passed to attn.
function M.block(norm1, attn, norm2, mlp, x, kv, pending, carry)
  local h, y = M.norm(norm1, x, pending)
  local a = attn(y, kv)
  if a == nil then error("residual block: the attention returned nothing (a (B, T, C) tensor expected)", 2) end
  h, y = M.norm(norm2, h, a)
  local m = mlp(y)
  if m == nil then error("residual block: the MLP returned nothing (a (B, T, C) tensor expected)", 2) end
  if carry then return h, m end
  return h + m
end

-- a block's call, through lt.checkpoint where the block is marked (lutra.recompute.apply)
local function call(block, ...)
  if rawget(block, "recompute") then return recompute.checkpoint(block, ...) end
  return block(...)
end

--- residual.run(blocks, x, kv) -> the stream after the blocks and the last
-- block's MLP output still to add (or nil), for residual.norm. blocks: a
-- list of modules called as block(x, kv, pending, carry). A block hands its
-- MLP output on only to a next block that takes it (nn.fuses(block,
-- "fuses_carry"): the models' own blocks; a user's block with its own
-- forward(x, kv) gets the whole stream), and the last block to the final
-- norm.
function M.run(blocks, x, kv)
  local pending
  for i, block in ipairs(blocks) do
    local next_block = blocks[i + 1]
    if next_block == nil or nn.fuses(next_block, "fuses_carry") then
      x, pending = call(block, x, kv, pending, true)
    else
      x, pending = call(block, x, kv, pending), nil
    end
  end
  return x, pending
end

return M
