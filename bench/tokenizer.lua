--- bench/tokenizer.lua: GPT-2 BPE encoding speed on the Python-docs corpus,
-- lutra on one thread and on all threads, side by side with tiktoken (PyPI,
-- installed under data/pylib by `make check-tokenizer`; bench/tokenizer_tiktoken.py)
-- on the same files: the sides take turns (bench/interleave.lua), and the
-- table holds each one's median over the same rounds in MB/s of UTF-8 input
-- and lutra's speed over its. tiktoken runs under its default thread
-- environment and under lutra's (OMP_WAIT_POLICY, OPENBLAS_THREAD_TIMEOUT:
-- host/app/main.c). Then both encoders' ids of every file are compared, id by id.
--
--   ./lutra bench/tokenizer.lua [--input=DIR] [--rounds=3] [--quick]
--
-- --quick: the Python tutorial's files only (that the script runs: tests/lua/bench_spec.lua).
local lt = require "lutra"
local ffi = require "ffi"
local I = require "bench.interleave"

local docs = "/usr/share/doc/python3.11/html/_sources"
local cfg = lt.config { input = docs, vocab = "data/gpt2.tiktoken", rounds = 3, quick = false,
  _help = { rounds = "timed rounds (each runs every side once)", quick = "the Python tutorial's files only" } }
if cfg.quick and cfg.input == docs then cfg.input = docs .. "/tutorial" end
local tok = lt.tokenizer.load(cfg.vocab)
local dir = io.popen("mktemp -d"):read("*l")
local list = dir .. "/files"
os.execute(("LC_ALL=C find %s -type f -name '*.txt' | LC_ALL=C sort > %s"):format(I.shell_quote(cfg.input), list))
local texts, bytes, paths = {}, 0, {}
for path in io.lines(list) do
  local f = assert(io.open(path, "rb"))
  texts[#texts + 1] = f:read("*a")
  paths[#paths + 1] = path
  f:close()
  bytes = bytes + #texts[#texts]
end
if #texts == 0 then error("tokenizer bench: no .txt files under " .. cfg.input) end

local threads = lt.num_threads()
local opts = { append_eot = false, on_invalid_utf8 = "replace" }
local function encode(n)
  return function()
    lt.set_num_threads(n)
    local t0 = lt.clock()
    tok:encode_many(texts, opts)
    local secs = lt.clock() - t0
    lt.set_num_threads(threads)
    return secs
  end
end
local sides = { one = { { name = "lutra", run = encode(1) } }, all = { { name = "lutra", run = encode(threads) } } }
local peers, labels, missing = {}, {}, {}
for _, e in ipairs { { "tiktoken", "default", I.default_env }, { "tiktoken*", "lutra's", I.lutra_env() } } do
  local env = { PYTHONPATH = "data/pylib" }
  for k, v in pairs(e[3]) do env[k] = v end
  local p, err = I.peer { env = env, cmd = ("python3 bench/tokenizer_tiktoken.py %s %d %s"):format(
    I.shell_quote(cfg.vocab), threads, I.shell_quote(list)) }
  if p then
    peers[#peers + 1] = { name = e[1], p = p }
    labels[e[1]] = ("tiktoken %s, 1 / %d threads (encode_ordinary_batch), %s env (%s)"):format(p.info.version,
      p.info.threads, e[2], I.describe_env(p.info.env))
    table.insert(sides.one, { name = e[1], run = function() return p:call("one").seconds end })
    table.insert(sides.all, { name = e[1], run = function() return p:call("all").seconds end })
  else
    missing[#missing + 1] = e[1] .. ": not run: " .. err:gsub("\n", " | ")
  end
end

-- one round: every side on one thread, then every side on all threads
local order = {}
for _, s in ipairs(sides.one) do order[#order + 1] = { name = s.name .. " 1", run = s.run } end
for _, s in ipairs(sides.all) do order[#order + 1] = { name = s.name .. " N", run = s.run } end
local r = I.rounds(cfg.rounds, order)

-- the ids, id by id (lutra's in memory, each peer's written to a file)
local ids, ends = tok:encode_many(texts, opts)
local function compare(p)
  local path = dir .. "/ids"
  local n = p:call("ids " .. path).tokens
  local f = assert(io.open(path, "rb"))
  local s = f:read("*a")
  f:close()
  local a, b = ffi.cast("const int32_t *", ids:data_ptr()), ffi.cast("const int32_t *", s)
  local m = math.min(ids:numel(), n)
  for i = 0, m - 1 do
    if a[i] ~= b[i] then
      local doc = 1
      while ends[doc] <= i do doc = doc + 1 end
      return ("differ: token %d (in %s) is %d in lutra, %d in tiktoken; %d and %d tokens"):format(i, paths[doc], a[i],
        b[i], ids:numel(), n)
    end
  end
  if n ~= ids:numel() then return ("differ: %d tokens in lutra, %d in tiktoken"):format(ids:numel(), n) end
  return ("all %d the same"):format(n)
end
local same = #peers > 0 and compare(peers[1].p) or nil
for _, pe in ipairs(peers) do pe.p:close() end
os.execute("rm -rf " .. I.shell_quote(dir))

local mb = bytes / 1e6
print(("GPT-2 BPE on %d files, %.1f MB, %d tokens; medians of %d interleaved rounds"):format(#texts, mb, ids:numel(),
  r.n))
print(("%-10s %12s %7s %12s %7s  %s"):format("encoder", "1 thread", "lutra/x", threads .. " threads", "lutra/x",
  "threads"))
print(("%-10s %7.1f MB/s %7.2f %7.1f MB/s %7.2f  %s"):format("lutra", mb / r.median["lutra 1"], 1,
  mb / r.median["lutra N"], 1, ("1 / %d threads (%s)"):format(threads, I.describe_env())))
for _, pe in ipairs(peers) do
  local n = pe.name
  print(("%-10s %7.1f MB/s %7.2f %7.1f MB/s %7.2f  %s"):format(n, mb / r.median[n .. " 1"], r:ratio(n .. " 1", "lutra 1"),
    mb / r.median[n .. " N"], r:ratio(n .. " N", "lutra N"), labels[n]))
end
for _, line in ipairs(missing) do print(line) end
if same then
  print("lutra/x: lutra's MB/s over that side's (its median time over lutra's, the same rounds; target >= 1)")
  print(("ids, lutra against tiktoken: %s"):format(same))
else
  print("tiktoken: not installed (make check-tokenizer installs it under data/pylib)")
end
