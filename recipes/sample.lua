--- recipes/sample.lua: text from a trained model, streamed as it is drawn.
--
--   ./lutra recipes/sample.lua --ckpt=runs/gpt2-pydocs/ckpt --prompt="The json module"
--   ./lutra recipes/sample.lua --ckpt=out/hf-export --temperature=0 --max_tokens=50
--
-- --ckpt is a lutra checkpoint (a step_* directory, or a run's checkpoint
-- directory: its newest complete one) or a Hugging Face directory
-- (config.json + model.safetensors; lt.hf). Sampling: temperature (0 is
-- greedy), top_k (0: off), top_p (1: off), seed; it stops at <|endoftext|>
-- or after max_tokens. A prompt longer than the model's context is refused
-- unless --truncate (keep its end). Output is printed as whole UTF-8
-- characters as the tokens arrive; a last line gives tokens/s. The
-- defaults (the prompt "This module provides", temperature 1, no top-k or
-- top-p) are the main job's, which suit its small model: sharper sampling
-- draws mostly the documentation's whitespace (recipes/gpt2.lua says more).
local lt = require "lutra"

local cfg = lt.config {
  ckpt = "", prompt = "This module provides", vocab = "data/gpt2.tiktoken", max_tokens = 200, temperature = 1,
  top_k = 0, top_p = 1, seed = 1, truncate = false, cache = true, device = "cpu", dtype = "f32",
  _help = {
    ckpt = "a lutra checkpoint (step_* or a run's ckpt directory: its newest) or a Hugging Face directory",
    prompt = "the text to continue", vocab = "GPT-2's BPE vocabulary (tiktoken format)",
    max_tokens = "tokens to draw at most (it stops earlier at <|endoftext|>)",
    temperature = "softmax temperature (0: greedy)", top_k = "keep the k likeliest tokens (0: all)",
    top_p = "keep the likeliest tokens up to this probability (nucleus; 1: all)", seed = "sampling seed",
    truncate = "keep the end of a prompt longer than the context (else an error)",
    cache = "reuse attention keys and values across tokens (KV cache)",
    device = "cpu or cuda[:N]", dtype = "f32, bf16 or f16",
  },
}
local fail = lt.config.fail
if cfg.ckpt == "" then fail("sample: --ckpt=<checkpoint or Hugging Face directory> is required") end
lt.config.refuse_args(cfg) -- ("steps=3", without --)
-- every setting checked before the model is read: a bad one is a settings error naming it
lt.config.check(cfg, {
  vocab = { nonempty = true }, device = { device = true }, max_tokens = { int = true, min = 1, max = 2 ^ 31 - 1 },
  temperature = { min = 0, why = "0: greedy" },
  top_k = { int = true, min = 0, why = "0: all" }, top_p = { gt = 0, max = 1, why = "1: all" },
  seed = { int = true, min = 0, max = 2 ^ 53 }, dtype = { one_of = { "f32", "bf16", "f16" } },
})
local is_dir = os.execute("test -d '" .. cfg.ckpt:gsub("'", "'\\''") .. "'")
if not (is_dir == 0 or is_dir == true) then
  fail(("sample: --ckpt=%s is not a directory (a checkpoint, a run's ckpt directory or a Hugging Face directory)")
    :format(cfg.ckpt))
end

local model
if io.open(cfg.ckpt .. "/config.json") then
  model = lt.hf.load(cfg.ckpt, { device = cfg.device, dtype = cfg.dtype })
else
  model = lt.ckpt.load_model(cfg.ckpt, { device = cfg.device, dtype = cfg.dtype })
end
local tok = lt.tokenizer.load(cfg.vocab)
local prompt = tok:encode(cfg.prompt, { allowed_special = "all" })
if #prompt == 0 then prompt = { tok.eot } end
local vocab = model.config.vocab_size
for _, id in ipairs(prompt) do
  if id >= vocab then
    fail(("sample: the tokenizer %s gives id %d, outside the model's vocabulary of %d: tokenizer and model do not match (--vocab), or the --prompt holds tokens the model does not know")
      :format(cfg.vocab, id, vocab))
  end
end

io.write(cfg.prompt)
io.stdout:flush()
local dec = tok:decoder { errors = "replace" }
local t0 = lt.clock()
local ids, reason = lt.generate(model, prompt, {
  max_tokens = cfg.max_tokens, temperature = cfg.temperature, top_k = cfg.top_k, top_p = cfg.top_p,
  seed = cfg.seed, stop = { tok.eot }, cache = cfg.cache, truncate = cfg.truncate and "left" or false,
  on_token = function(id)
    if id ~= tok.eot then
      io.write(dec:push(id))
      io.stdout:flush()
    end
  end,
})
io.write(dec:flush(), "\n")
io.stdout:flush() -- (the text before the line on stderr, where both go to one pipe)
local dt = lt.clock() - t0
io.stderr:write(("sample: %d tokens in %.2f s (%.1f tokens/s), stopped at %s\n"):format(#ids, dt, #ids / dt,
  reason == "stop" and "<|endoftext|>" or "max_tokens"))
