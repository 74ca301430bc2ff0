--- tools/encode-corpus.lua: writes, for every .txt file under --input, one
-- line "<path>\t<ids separated by spaces>" with lutra's GPT-2 ids, for
-- tools/check-tokenizer to compare with tiktoken.
local lt = require "lutra"
local cfg = lt.config { input = "/usr/share/doc/python3.11/html/_sources", out = "build/corpus_ids.txt",
  vocab = "data/gpt2.tiktoken" }
local tok = lt.tokenizer.load(cfg.vocab)
local out = assert(io.open(cfg.out, "w"))
local p = io.popen("LC_ALL=C find '" .. cfg.input:gsub("'", "'\\''") .. "' -type f -name '*.txt' | LC_ALL=C sort")
local n = 0
for path in p:lines() do
  local f = assert(io.open(path, "rb"))
  local ids = tok:encode(f:read("*a"))
  f:close()
  out:write(path, "\t", table.concat(ids, " "), "\n")
  n = n + 1
end
p:close()
out:close()
print(("encode-corpus: %d files -> %s"):format(n, cfg.out))
