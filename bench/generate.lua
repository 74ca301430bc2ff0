--- bench/generate.lua: generation speed on the CPU for the GPT-2 124M shape
-- (random weights): tokens/s for new tokens with the KV cache, against
-- PyTorch's same model with a KV cache (bench/generate_torch.py, Debian's
-- python3-torch, same thread count), and without the cache (every token
-- reruns the whole window). Greedy decoding, so both draw the same amount
-- of work; each side counts the prompt's forward and new_tokens tokens.
--
-- The CPU may be shared, so the runs are interleaved: each of `rounds`
-- rounds runs lutra, then torch under lutra's environment (lutra sets
-- OMP_WAIT_POLICY=PASSIVE and OPENBLAS_THREAD_TIMEOUT=4 unless they are set,
-- host/app/main.c, and torch inherits them), then torch under its default one
-- (those two unset); the table gives each round, the medians, and the
-- median of the per-round ratios, with the load average before and after.
--
--   ./lutra bench/generate.lua [--new_tokens=256] [--prompt=16] [--rounds=3] [--nocache_tokens=256]
local lt = require "lutra"

local cfg = lt.config { n_layer = 12, n_head = 12, n_embd = 768, vocab = 50257, block = 1024, prompt = 16,
  new_tokens = 256, nocache_tokens = 256, rounds = 3 }
local threads = lt.num_threads()

local model = lt.models.gpt2 { n_layer = cfg.n_layer, n_head = cfg.n_head, n_embd = cfg.n_embd,
  block_size = cfg.block, vocab_size = cfg.vocab, generator = lt.Generator(0) }
local g = lt.Generator(1)
local prompt = lt.randint(0, cfg.vocab, { cfg.prompt }, { generator = g }):totable()

local function loadavg()
  local f = io.open("/proc/loadavg")
  local s = f and f:read("*l") or "?"
  if f then f:close() end
  return s:match("^(%S+ %S+ %S+)") or s
end

local function run(cache, n)
  lt.generate(model, prompt, { max_tokens = 2, temperature = 0, cache = cache }) -- warm-up
  local t0 = lt.clock()
  local ids = lt.generate(model, prompt, { max_tokens = n, temperature = 0, cache = cache })
  return #ids / (lt.clock() - t0)
end

-- one torch run: its JSON line as a table, or nil and why
local function torch(env_prefix)
  local p = io.popen(("%s/usr/bin/python3 bench/generate_torch.py %d %d %d %d %d %d %d %d 2>&1"):format(env_prefix,
    cfg.n_layer, cfg.n_head, cfg.n_embd, cfg.vocab, cfg.block, cfg.prompt, cfg.new_tokens, threads))
  local out = p and p:read("*a") or ""
  if p then p:close() end
  local ok, t = pcall(lt.json.decode, out:match("{.*}") or "")
  if ok and type(t) == "table" and t.tokens_per_s then return t end
  return nil, out:sub(-300)
end

local median = require("bench.interleave").median

local function env(k) return os.getenv(k) or "unset" end
local sides = {
  { name = "torch, lutra's env", prefix = "" },
  { name = "torch, default env", prefix = "env -u OMP_WAIT_POLICY -u OPENBLAS_THREAD_TIMEOUT " },
}

print(("generation on the CPU: GPT-2 %d layers, %d wide, vocabulary %d; prompt %d tokens; %d new tokens; greedy")
  :format(cfg.n_layer, cfg.n_embd, cfg.vocab, cfg.prompt, cfg.new_tokens))
print(("lutra: %d threads (OpenMP and OpenBLAS), OMP_WAIT_POLICY=%s OPENBLAS_THREAD_TIMEOUT=%s; %s")
  :format(threads, env("OMP_WAIT_POLICY"), env("OPENBLAS_THREAD_TIMEOUT"),
    (lt.build_info():match("cpu: ([^\n]*)") or "?")))
print(("load average before: %s (%d rounds, interleaved)"):format(loadavg(), cfg.rounds))

local lutra_tps, torch_tps, ratios, info = {}, { {}, {} }, { {}, {} }, {}
print(("%-6s %-22s %10s %14s"):format("round", "runtime", "tokens/s", "lutra / torch"))
for r = 1, cfg.rounds do
  local l = run(true, cfg.new_tokens)
  lutra_tps[r] = l
  print(("%-6d %-22s %10.2f"):format(r, "lutra, KV cache", l))
  for i, side in ipairs(sides) do
    local t, why = torch(side.prefix)
    if t then
      info[i] = t
      torch_tps[i][#torch_tps[i] + 1] = t.tokens_per_s
      ratios[i][#ratios[i] + 1] = l / t.tokens_per_s
      print(("%-6d %-22s %10.2f %14.2f"):format(r, side.name, t.tokens_per_s, l / t.tokens_per_s))
    else
      print(("%-6d %-22s %10s   (%s)"):format(r, side.name, "-", (why:gsub("%s+", " "))))
    end
  end
end
local without = run(false, cfg.nocache_tokens)
print(("load average after: %s"):format(loadavg()))
print()
print(("%-22s %16s %24s"):format("medians", "tokens/s", "lutra / torch per round"))
local with = median(lutra_tps)
print(("%-22s %16.2f"):format("lutra, KV cache", with))
for i, side in ipairs(sides) do
  if info[i] then
    print(("%-22s %16.2f %24.2f   (torch %s: %d threads, %d inter-op; OMP_WAIT_POLICY=%s OPENBLAS_THREAD_TIMEOUT=%s)")
      :format(side.name, median(torch_tps[i]), median(ratios[i]), info[i].torch, info[i].threads,
        info[i].interop_threads, info[i].env.OMP_WAIT_POLICY, info[i].env.OPENBLAS_THREAD_TIMEOUT))
  else
    print(("%-22s %16s   (torch not available)"):format(side.name, "-"))
  end
end
print(("%-22s %16.2f   (%d new tokens, once)"):format("lutra, no cache", without, cfg.nocache_tokens))
print(("KV cache speed-up: %.1fx (target >= 5x at 256 new tokens); lutra / torch target >= 1.3x"):format(
  with / without))
