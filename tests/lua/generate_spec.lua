-- tests/lua/generate_spec.lua: lt.generate and the KV cache: cached logits
-- equal full reruns (GPT-2 and Llama); greedy with and without the cache
-- agree; the nucleus is the smallest set reaching top_p and never empty;
-- top_k; temperature 0 is greedy; stop tokens; seeds repeat; past the
-- context every token is a fresh forward over the last block_size ids (with
-- or without the cache; past_context = "half" rebuilds the cache from the
-- newest half); long prompts are refused or truncated;
-- bad settings are errors; recipes/sample.lua streams from a checkpoint.
local lt = require "lutra"
local H = require "tests.lua.helpers"

local function gpt2() return lt.models.gpt2("gpt2-tiny", { generator = lt.Generator(21) }) end
local function llama() return lt.models.llama("llama-tiny", { generator = lt.Generator(22) }) end

local function greedy_reference(model, prompt, n)
  -- the most likely token each time from full reruns, no cache
  local ids = {}
  for i, v in ipairs(prompt) do ids[i] = v end
  local out = {}
  lt.no_grad(function()
    for _ = 1, n do
      local logits = model(lt.tensor({ ids }, { dtype = "i64" })):select(1, 1):select(1, #ids)
      local _, idx = logits:max(1)
      ids[#ids + 1] = idx:item()
      out[#out + 1] = idx:item()
    end
  end)
  return out
end

-- the logits (f64, CPU) of the last position of each model(...) call, in
-- order: lt.generate calls the model once per token it draws
local function record_logits(model)
  local seen, forward = {}, model.forward
  model.forward = function(self, idx, ...)
    local logits = forward(self, idx, ...)
    seen[#seen + 1] = logits:select(1, 1):select(1, idx:size(2)):to("cpu", "f64")
    return logits
  end
  return seen, function() model.forward = nil end
end

-- greedy decoding where each token comes from a fresh forward (no cache)
-- over the last `block` ids: the tokens and each step's logits
local function fresh_window_reference(model, prompt, n, block)
  local ids, out, steps = {}, {}, {}
  for i, v in ipairs(prompt) do ids[i] = v end
  lt.no_grad(function()
    for _ = 1, n do
      local w = {}
      for i = math.max(1, #ids - block + 1), #ids do w[#w + 1] = ids[i] end
      local row = model(lt.tensor({ w }, { dtype = "i64" })):select(1, 1):select(1, #w):to("cpu", "f64")
      local _, idx = row:max(1)
      steps[#steps + 1] = row
      ids[#ids + 1] = idx:item()
      out[#out + 1] = idx:item()
    end
  end)
  return out, steps
end

describe("lt.generate", function()
  local small_context = {
    { "gpt2", function() return lt.models.gpt2("gpt2-tiny", { block_size = 16, generator = lt.Generator(21) }) end },
    { "llama", function() return lt.models.llama("llama-tiny", { max_seq_len = 16, generator = lt.Generator(22) }) end },
  }
  for _, case in ipairs(small_context) do
    it(case[1] .. ": past the context every token is a fresh forward over the last block_size ids", function()
      local model = case[2]()
      model:eval()
      local prompt, n, block = { 5, 17, 300, 2, 9, 41, 7, 100, 3, 250 }, 20, 16
      local want, want_logits = fresh_window_reference(model, prompt, n, block)
      for _, cache in ipairs { true, false } do
        local seen, restore = record_logits(model)
        local got = lt.generate(model, prompt, { max_tokens = n, temperature = 0, cache = cache })
        restore()
        assert.are.same(want, got)
        assert.are.equal(n, #seen)
        for i = 1, n do
          local d = (seen[i] - want_logits[i]):abs():max():item()
          if #prompt + i - 1 > block then
            -- the same computation as the reference: bit for bit
            assert(d == 0, ("cache %s, token %d (past the context): max abs difference %g"):format(tostring(cache), i, d))
          else
            assert(d < 1e-5, ("cache %s, token %d: max abs difference %g"):format(tostring(cache), i, d))
          end
        end
      end
      -- past_context = "half" rebuilds the cache from the newest half when it
      -- fills: the first token after that sees only the last block / 2 ids
      local seen, restore = record_logits(model)
      local got = lt.generate(model, prompt, { max_tokens = n, temperature = 0, past_context = "half" })
      restore()
      assert.are.equal(n, #got)
      local first_past = block - #prompt + 2 -- the token drawn from block + 1 ids
      local ids = {}
      for i, v in ipairs(prompt) do ids[i] = v end
      for i = 1, first_past - 1 do ids[#ids + 1] = got[i] end
      local half = {}
      for i = #ids - block / 2 + 1, #ids do half[#half + 1] = ids[i] end
      local ref = lt.no_grad(function()
        return model(lt.tensor({ half }, { dtype = "i64" })):select(1, 1):select(1, #half):to("cpu", "f64")
      end)
      local d = (seen[first_past] - ref):abs():max():item()
      assert(d < 1e-5, ("half: token %d against a forward over the newest %d ids: max abs difference %g")
        :format(first_past, #half, d))
    end)
  end

  for _, case in ipairs { { "gpt2", gpt2 }, { "llama", llama } } do
    it(case[1] .. ": logits through the KV cache equal a full rerun", function()
      local model = case[2]()
      model:eval()
      local ids = lt.randint(0, 512, { 2, 12 }, { generator = lt.Generator(3) })
      local full = lt.no_grad(function() return model(ids) end)
      local kv = lt.models.KVCache(64)
      local parts = lt.no_grad(function()
        local a = model(ids:narrow(2, 1, 7), kv)
        local b = model(ids:narrow(2, 8, 1), kv)
        local c = model(ids:narrow(2, 9, 4), kv)
        return lt.cat({ a, b, c }, 2)
      end)
      assert.are.equal(12, kv.len)
      local d = (full - parts):abs():max():item()
      assert(d < 1e-5, ("max abs difference %g"):format(d))
    end)

    it(case[1] .. ": greedy decoding with and without the cache gives the reference tokens", function()
      local model = case[2]()
      local prompt = { 5, 17, 300, 2 }
      local want = greedy_reference(model, prompt, 20)
      assert.are.same(want, (lt.generate(model, prompt, { max_tokens = 20, temperature = 0 })))
      assert.are.same(want, (lt.generate(model, prompt, { max_tokens = 20, temperature = 0, cache = false })))
    end)
  end

  it("keeps the smallest set of most likely tokens whose probability reaches top_p, never empty", function()
    local pick = lt.generate.pick
    local p = { 0.05, 0.5, 0.15, 0.3 }
    -- top_p = 0.7: {2, 4} (0.8); u spans their mass in the order 2, 4
    assert.are.equal(2, pick(p, 0, 0.7, 0.0))
    assert.are.equal(2, pick(p, 0, 0.7, 0.62))
    assert.are.equal(4, pick(p, 0, 0.7, 0.63))
    assert.are.equal(4, pick(p, 0, 0.7, 0.999))
    -- exactly reaching p is enough: {2}
    assert.are.equal(2, pick(p, 0, 0.5, 0.999))
    -- a tiny p still keeps the most likely token
    assert.are.equal(2, pick(p, 0, 1e-12, 0.999))
    -- top_k = 3 drops token 1; the remaining mass is 0.95
    assert.are.equal(3, pick(p, 3, 1, 0.999))
    assert.are.equal(2, pick(p, 1, 1, 0.999))
    -- no filtering: the cumulative distribution in id order
    assert.are.equal(1, pick(p, 0, 1, 0.04))
    assert.are.equal(4, pick(p, 0, 1, 0.71))
  end)

  it("finds the nucleus exactly over a long tail", function()
    -- 5000 tokens: one of 0.3, the rest equal: top_p = 0.9 needs a long sorted prefix
    local n, p = 5000, {}
    for i = 1, n do p[i] = 0.7 / (n - 1) end
    p[4000] = 0.3
    local need = math.ceil((0.9 - 0.3) / (0.7 / (n - 1)) - 1e-9)
    -- the last kept token is the need-th of the tail in id order (ties: lower id first)
    local tail = {}
    for i = 1, n do if i ~= 4000 then tail[#tail + 1] = i end end
    assert.are.equal(tail[need], lt.generate.pick(p, 0, 0.9, 0.9999999))
  end)

  it("repeats a seeded run and differs with another seed", function()
    local model = gpt2()
    local a = lt.generate(model, { 1, 2 }, { max_tokens = 30, seed = 5, top_k = 50, top_p = 0.9 })
    local b = lt.generate(model, { 1, 2 }, { max_tokens = 30, seed = 5, top_k = 50, top_p = 0.9 })
    local c = lt.generate(model, { 1, 2 }, { max_tokens = 30, seed = 6, top_k = 50, top_p = 0.9 })
    assert.are.same(a, b)
    assert.are_not.same(a, c)
  end)

  it("stops at a stop token (included) or the token limit", function()
    local model = gpt2()
    local first = greedy_reference(model, { 9 }, 1)[1]
    local ids, reason = lt.generate(model, { 9 }, { temperature = 0, stop = { first }, max_tokens = 10 })
    assert.are.same({ first }, ids)
    assert.are.equal("stop", reason)
    ids, reason = lt.generate(model, { 9 }, { max_tokens = 7, seed = 1 })
    assert.are.equal(7, #ids)
    assert.are.equal("length", reason)
  end)

  it("rebuilds the cache when the context fills, and refuses or truncates long prompts", function()
    local model = gpt2() -- block_size 64
    local ids = lt.generate(model, { 1 }, { max_tokens = 150, seed = 2 })
    assert.are.equal(150, #ids)
    assert.are.equal(150, #lt.generate(model, { 1 }, { max_tokens = 150, seed = 2, past_context = "half" }))
    local long = {}
    for i = 1, 70 do long[i] = i end
    H.assert_error(function() lt.generate(model, long, { max_tokens = 2 }) end,
      "the prompt has 70 tokens, more than the model's context of 64")
    local a = lt.generate(model, long, { max_tokens = 3, temperature = 0, truncate = "left" })
    local tail = {}
    for i = 7, 70 do tail[#tail + 1] = i end
    assert.are.same(a, (lt.generate(model, tail, { max_tokens = 3, temperature = 0 })))
  end)

  it("rejects bad settings and prompts", function()
    local model = gpt2()
    H.assert_error(function() lt.generate(model, {}, {}) end, "at least one token id")
    H.assert_error(function() lt.generate(model, { 600 }, {}) end, "outside the vocabulary")
    H.assert_error(function() lt.generate(model, { 1 }, { top_p = 0 }) end, "top_p must be > 0")
    H.assert_error(function() lt.generate(model, { 1 }, { temperature = -1 }) end, "temperature must be")
    H.assert_error(function() lt.generate(model, { 1 }, { top_k = 1.5 }) end, "whole numbers")
    H.assert_error(function() lt.generate(model, { 1 }, { truncate = "right" }) end, "truncate must be")
    H.assert_error(function() lt.generate(model, { 1 }, { max_tokenz = 3 }) end, "unknown option 'max_tokenz'")
    H.assert_error(function() lt.generate(model, { 1 }, { stop = 5 }) end, "stop must be a table")
    H.assert_error(function() lt.generate(model, { 1 }, { cache = "no" }) end, "cache must be true or false")
    H.assert_error(function() lt.generate(model, { 1 }, { past_context = "slide" }) end,
      "past_context must be \"exact\" or \"half\", got slide")
    H.assert_error(function() lt.generate(model, { 1 }, { past_context = "half", cache = false }) end,
      "policy of the KV cache")
    H.assert_error(function() lt.generate(model, { 1 }, { temperature = 1e-320, top_p = 0.9 }) end,
      "use temperature = 0 for greedy")
    assert.is_true(model.training)
  end)

  it("stops with a message when the logits are not finite, and leaves the model's mode", function()
    local model = gpt2()
    lt.no_grad(function() model.transformer.ln_f.weight:fill_(0 / 0) end)
    H.assert_error(function() lt.generate(model, { 1 }, { max_tokens = 2 }) end, "logits for token 1 are not finite")
    assert.is_true(model.training)
  end)

  it("generates with a context of one position", function()
    local model = lt.models.gpt2 { n_layer = 1, n_head = 1, n_embd = 8, block_size = 1, vocab_size = 16,
      generator = lt.Generator(1) }
    assert.are.equal(3, #lt.generate(model, { 1 }, { temperature = 0, max_tokens = 3 }))
  end)

  it("recipes/sample.lua streams text from a training checkpoint", function()
    local dir = os.tmpname() .. "-sample"
    local model = lt.models.gpt2 { n_layer = 1, n_head = 2, n_embd = 16, block_size = 32, vocab_size = 50257,
      generator = lt.Generator(1) }
    lt.ckpt.save(dir, { model = model, step = 1 })
    local p = io.popen(("./lutra recipes/sample.lua --ckpt=%s --prompt='Hello' --max_tokens=5 --seed=3 2>&1; echo rc=$?")
      :format(dir))
    local out = p:read("*a")
    p:close()
    assert.truthy(out:find("rc=0", 1, true), out)
    assert.truthy(out:find("^Hello"), out)
    assert.truthy(out:find("\nsample: 5 tokens", 1, true), out) -- (the text flushed before the line on stderr)
    -- settings checked before the model is read: the message alone
    for _, c in ipairs {
      { "--top_p=0", "--top_p must be a number > 0 and <= 1 (1: all), got 0" },
      { "--max_tokens=0", "--max_tokens must be a whole number >= 1 and <= 2147483647, got 0" },
      { "--temperature=-1", "--temperature must be a number >= 0 (0: greedy), got -1" },
      { "--device=tpu", '--device must be cpu, cuda or cuda:N, got "tpu"' },
    } do
      p = io.popen(("./lutra recipes/sample.lua --ckpt=%s %s 2>&1; echo rc=$?"):format(dir, c[1]))
      out = p:read("*a")
      p:close()
      assert.truthy(out:find("lutra: " .. c[2], 1, true), out)
      assert.truthy(out:find("rc=1", 1, true), out)
      assert.falsy(out:find("traceback", 1, true), out)
    end
    os.execute("rm -rf " .. dir)
  end)
end)
