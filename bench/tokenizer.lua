--- bench/tokenizer.lua: GPT-2 BPE encoding speed on the Python-docs corpus,
-- lutra on one thread and on all threads, next to tiktoken (PyPI, installed
-- under data/pylib by `make check-tokenizer`) on the same files in the same
-- run. MB/s of UTF-8 input; best of 3 runs.
--   ./lutra bench/tokenizer.lua [--input=DIR]
local lt = require "lutra"

local cfg = lt.config { input = "/usr/share/doc/python3.11/html/_sources", vocab = "data/gpt2.tiktoken" }
local tok = lt.tokenizer.load(cfg.vocab)
local list = os.tmpname()
os.execute(("LC_ALL=C find '%s' -type f -name '*.txt' | LC_ALL=C sort > %s"):format(cfg.input, list))
local texts, bytes = {}, 0
for path in io.lines(list) do
  local f = assert(io.open(path, "rb"))
  texts[#texts + 1] = f:read("*a")
  f:close()
  bytes = bytes + #texts[#texts]
end
if #texts == 0 then error("tokenizer bench: no .txt files under " .. cfg.input) end

local function best(fn)
  local b = math.huge
  for _ = 1, 3 do
    local t0 = lt.clock()
    fn()
    b = math.min(b, lt.clock() - t0)
  end
  return b
end

local threads = lt.num_threads()
lt.set_num_threads(1)
local ntok
local one = best(function()
  local ids = tok:encode_many(texts, { append_eot = false, on_invalid_utf8 = "replace" })
  ntok = ids:numel()
end)
lt.set_num_threads(threads)
local all = best(function() tok:encode_many(texts, { append_eot = false, on_invalid_utf8 = "replace" }) end)

local tk
local p = io.popen(("PYTHONPATH=data/pylib python3 bench/tokenizer_tiktoken.py %s %d %s 2>/dev/null")
  :format(cfg.vocab, threads, list))
if p then
  local out = p:read("*a")
  p:close()
  local ok, res = pcall(lt.json.decode, out:match("{.*}") or "")
  if ok then tk = res end
end
os.remove(list)

local mb = bytes / 1e6
print(("GPT-2 BPE on %d files, %.1f MB, %d tokens"):format(#texts, mb, ntok))
print(("%-22s %12s %12s"):format("encoder", "1 thread", threads .. " threads"))
print(("%-22s %9.1f MB/s %9.1f MB/s"):format("lutra", mb / one, mb / all))
if tk then
  print(("%-22s %9.1f MB/s %9.1f MB/s"):format("tiktoken " .. tk.version, mb / tk.one, mb / tk.all))
  print(("lutra / tiktoken, one thread: %.2f (target >= 1); ids: %s"):format(tk.one / one,
    tk.tokens == ntok and "the same count" or ("counts differ: " .. tk.tokens)))
else
  print("tiktoken: not installed (make check-tokenizer installs it under data/pylib)")
end
