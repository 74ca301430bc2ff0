--- lutra.models (lt.models): model constructors by family, the KV cache
-- generation uses, and lt.models.pipeline (a model's pipeline stages:
-- tied, copy, stage_forward, block_counts).
local gpt2 = require "lutra.models.gpt2"
local llama = require "lutra.models.llama"
local kvcache = require "lutra.models.kvcache"
local pipeline = require "lutra.models.pipeline"

return {
  gpt2 = gpt2.gpt2,
  llama = llama.llama,
  KVCache = kvcache.KVCache,
  pipeline = pipeline,
}
