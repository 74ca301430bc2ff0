--- lutra.models (lt.models): model constructors by family, and the KV cache
-- generation uses.
return {
  gpt2 = require("lutra.models.gpt2").gpt2,
  llama = require("lutra.models.llama").llama,
  KVCache = require("lutra.models.kvcache").KVCache,
}
