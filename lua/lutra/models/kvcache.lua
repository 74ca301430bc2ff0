--- lutra.models.kvcache: the key/value cache of autoregressive generation
-- (lt.models.KVCache). Each attention layer appends its new keys and values
-- (B, NKV, T, HS) into buffers allocated once for `size` positions and
-- attends over the filled part; the model advances kv.len by T after all
-- layers ran. GPT-2 and Llama take it as model(idx, kv).
--
--   local kv = lt.models.KVCache(model.config.block_size)
--   lt.no_grad(function()                      -- the cache is for inference
--     local logits = model(prompt, kv)         -- fills positions 1..#prompt
--     logits = model(next_id, kv)              -- one more position
--   end)
local tensor = require "lutra.tensor"

local M = {}
local KV = {}
KV.__index = KV

--- lt.models.KVCache(size) -> an empty cache for up to size positions.
function M.KVCache(size)
  if type(size) ~= "number" or size < 1 or size ~= math.floor(size) then
    error("KVCache: size must be a whole number >= 1, got " .. tostring(size), 2)
  end
  return setmetatable({ len = 0, size = size, k = {}, v = {} }, KV)
end

--- kv:append(layer, k, v) -> the keys and values of every position so far
-- (views of the buffers), after writing k and v (B, NKV, T, HS) at kv.len.
function KV:append(layer, k, v)
  local T = k:size(3)
  if self.len + T > self.size then
    error(("KVCache: %d cached + %d new positions exceed its size %d"):format(self.len, T, self.size), 3)
  end
  local K, V = self.k[layer], self.v[layer]
  if K and (K:size(1) ~= k:size(1) or K:size(2) ~= k:size(2) or K:size(4) ~= k:size(4)) then
    error(("KVCache: keys of batch %d, %d heads of %d do not fit the cached batch %d, %d heads of %d (kv:reset() keeps the shape; make a new cache)")
      :format(k:size(1), k:size(2), k:size(4), K:size(1), K:size(2), K:size(4)), 3)
  end
  if not K then
    local shape = { k:size(1), k:size(2), self.size, k:size(4) }
    K = tensor.zeros(shape, { dtype = k.dtype, device = k.device })
    V = tensor.zeros(shape, { dtype = v.dtype, device = v.device })
    self.k[layer], self.v[layer] = K, V
  end
  K:narrow(3, self.len + 1, T):copy_(k)
  V:narrow(3, self.len + 1, T):copy_(v)
  return K:narrow(3, 1, self.len + T), V:narrow(3, 1, self.len + T)
end

--- kv:advance(T): T more positions are cached (the model calls it).
function KV:advance(T) self.len = self.len + T end

--- kv:reset(): empty again (the buffers are kept).
function KV:reset() self.len = 0 end

return M
