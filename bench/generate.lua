--- bench/generate.lua: generation speed on the CPU for the GPT-2 124M shape
-- (random weights): tokens/s for new tokens with the KV cache and without it
-- (every token reruns the whole window), and PyTorch's same model with a KV
-- cache in the same run (bench/generate_torch.py, Debian's python3-torch,
-- same threads). Greedy decoding, so both draw the same amount of work.
--
--   ./lutra bench/generate.lua [--new_tokens=256] [--prompt=16] [--nocache_tokens=256]
local lt = require "lutra"

local cfg = lt.config { n_layer = 12, n_head = 12, n_embd = 768, vocab = 50257, block = 1024, prompt = 16,
  new_tokens = 256, nocache_tokens = 256 }
local threads = lt.num_threads()

local model = lt.models.gpt2 { n_layer = cfg.n_layer, n_head = cfg.n_head, n_embd = cfg.n_embd,
  block_size = cfg.block, vocab_size = cfg.vocab, generator = lt.Generator(0) }
local g = lt.Generator(1)
local prompt = lt.randint(0, cfg.vocab, { cfg.prompt }, { generator = g }):totable()

local function run(cache, n)
  lt.generate(model, prompt, { max_tokens = 2, temperature = 0, cache = cache }) -- warm-up
  local t0 = lt.clock()
  local ids = lt.generate(model, prompt, { max_tokens = n, temperature = 0, cache = cache })
  return #ids / (lt.clock() - t0)
end

print(("generation on the CPU: GPT-2 %d layers, %d wide, vocabulary %d; prompt %d tokens; %d threads; greedy")
  :format(cfg.n_layer, cfg.n_embd, cfg.vocab, cfg.prompt, threads))
print(("%-28s %12s %10s"):format("runtime", "new tokens", "tokens/s"))
local with = run(true, cfg.new_tokens)
print(("%-28s %12d %10.2f"):format("lutra, KV cache", cfg.new_tokens, with))
local without = run(false, cfg.nocache_tokens)
print(("%-28s %12d %10.2f"):format("lutra, no cache", cfg.nocache_tokens, without))
local p = io.popen(("/usr/bin/python3 bench/generate_torch.py %d %d %d %d %d %d %d %d 2>/dev/null"):format(
  cfg.n_layer, cfg.n_head, cfg.n_embd, cfg.vocab, cfg.block, cfg.prompt, cfg.new_tokens, threads))
local out = p and p:read("*a") or ""
if p then p:close() end
local ok, t = pcall(lt.json.decode, out:match("{.*}") or "")
if ok and t then
  print(("%-28s %12d %10.2f   (torch %s)"):format("torch, KV cache", cfg.new_tokens, t.tokens_per_s, t.torch))
end
print(("KV cache speed-up: %.1fx (target >= 5x at 256 new tokens)%s"):format(with / without,
  ok and t and ("; lutra / torch with cache: %.2f"):format(with / t.tokens_per_s) or "; torch: not available"))
