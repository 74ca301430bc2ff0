--- lutra.models (lt.models): model constructors by family, and the KV cache
-- generation uses.
local gpt2 = require "lutra.models.gpt2"
local llama = require "lutra.models.llama"
local kvcache = require "lutra.models.kvcache"

return {
  gpt2 = gpt2.gpt2,
  llama = llama.llama,
  KVCache = kvcache.KVCache,
}
