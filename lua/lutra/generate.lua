--- lutra.generate (lt.generate): autoregressive sampling from a GPT-2 or
-- Llama, with a KV cache.
--
--   local ids = lt.generate(model, tok:encode("The "), { max_tokens = 128, temperature = 0.8,
--     top_p = 0.95, seed = 1, stop = { tok.eot }, on_token = function(id) io.write(dec:push(id)) end })
--
-- Each new token is drawn from softmax(logits / temperature) of the last
-- position, restricted to the top_k most likely tokens (top_k > 0) and then
-- to the nucleus: the smallest set of the most likely tokens whose
-- probability reaches top_p (Holtzman et al. 2020, "The Curious Case of
-- Neural Text Degeneration"), which always holds at least the most likely
-- token. temperature = 0 is greedy (the most likely token, the lowest id on
-- ties). Sampling is done in f64 on the CPU from a Philox generator, so a
-- seed repeats a run.
--
-- With the cache (the default) the prompt is run once and every new token
-- costs one position while the context has room. Without the cache every
-- token reruns the window of the last block_size ids (what bench/generate.lua
-- measures the cache against). Past the context (prompt plus new tokens
-- beyond block_size) the default, past_context = "exact", gives each token
-- the logits of a fresh forward over the last block_size ids, with or
-- without the cache: a model with learned absolute positions (GPT-2) sees
-- every kept id at a new position once the window slides, and with RoPE
-- (Llama) the kept ids' hidden states no longer attend to the dropped ones,
-- so no cached key or value stays valid and each such token costs a whole
-- window. past_context = "half" (cache only) is the faster approximation:
-- when the cache fills it is rebuilt from the newest half of the context and
-- then grows one position per token again, so a token sees between half
-- and all of the last block_size ids and its logits differ from the fresh
-- forward's (measured on GPT-2 124M's shape with random weights and a
-- 128-id context: by up to 2.2, and greedy tokens change).
local tensor = require "lutra.tensor"
local autograd = require "lutra.autograd"
local random = require "lutra.random"
local F = require "lutra.nn.functional"
local models = require "lutra.models"

local M = {}

local function context_size(model)
  local cfg = model.config or {}
  return cfg.block_size or cfg.max_seq_len or math.huge
end

-- the index (1-based) to sample from probabilities p (a Lua array summing
-- to about 1), after top_k and top_p, using the uniform number u in [0, 1)
local function pick(p, top_k, top_p, u)
  local n = #p
  local keep -- indices allowed, most likely first (nil: all)
  if (top_k > 0 and top_k < n) or top_p < 1 then
    -- the candidates with p >= tau, sorted; tau is lowered until they hold
    -- enough: any token below tau sorts after them, so the nucleus and the
    -- top k lie inside (exact, and usually a few hundred of 50k are sorted)
    local pmax = 0
    for i = 1, n do if p[i] > pmax then pmax = p[i] end end
    local tau = pmax * 1e-3
    while true do
      local cand, mass = {}, 0
      for i = 1, n do
        if p[i] >= tau then
          cand[#cand + 1] = i
          mass = mass + p[i]
        end
      end
      local enough_k = top_k <= 0 or #cand >= top_k
      local enough_p = top_p >= 1 or mass >= top_p
      if (enough_k and enough_p) or tau == 0 then
        table.sort(cand, function(a, b)
          if p[a] ~= p[b] then return p[a] > p[b] end
          return a < b
        end)
        keep = cand
        break
      end
      tau = tau > 1e-300 and tau * 1e-3 or 0
    end
    if top_k > 0 and #keep > top_k then
      for i = #keep, top_k + 1, -1 do keep[i] = nil end
    end
    if top_p < 1 then
      local acc, cut = 0, #keep
      for i = 1, #keep do
        acc = acc + p[keep[i]]
        if acc >= top_p then
          cut = i
          break
        end
      end
      for i = #keep, cut + 1, -1 do keep[i] = nil end
    end
  end
  local total = 0
  for i = 1, n do
    local v = p[i]
    if v ~= v or v == math.huge then return nil end
  end
  if keep then
    for _, i in ipairs(keep) do total = total + p[i] end
    local target, acc = u * total, 0
    for _, i in ipairs(keep) do
      acc = acc + p[i]
      if target < acc then return i end
    end
    return keep[#keep]
  end
  for i = 1, n do total = total + p[i] end
  local target, acc = u * total, 0
  for i = 1, n do
    acc = acc + p[i]
    if target < acc then return i end
  end
  return n
end

local function argmax(logits)
  local _, idx = logits:max(1)
  return idx:item() + 1
end

local KNOWN = { max_tokens = true, temperature = true, top_k = true, top_p = true, seed = true, generator = true,
  stop = true, cache = true, truncate = true, on_token = true, device = true, past_context = true }

local function check_opts(o)
  for k in pairs(o) do
    if not KNOWN[k] then
      local names = {}
      for n in pairs(KNOWN) do names[#names + 1] = n end
      table.sort(names)
      error(("generate: unknown option '%s' (known: %s)"):format(tostring(k), table.concat(names, ", ")), 4)
    end
  end
  if type(o.cache) ~= "boolean" then error("generate: cache must be true or false, got " .. tostring(o.cache), 4) end
  if o.stop ~= nil and type(o.stop) ~= "table" then error("generate: stop must be a table of token ids", 4) end
  if o.on_token ~= nil and type(o.on_token) ~= "function" then error("generate: on_token must be a function", 4) end
  local function number(k, lo, hi)
    local v = o[k]
    if type(v) ~= "number" or v ~= v or v < lo or v > hi then
      error(("generate: %s must be a number in [%g, %g], got %s"):format(k, lo, hi, tostring(v)), 4)
    end
  end
  number("temperature", 0, math.huge)
  number("top_p", 0, 1)
  if o.top_p <= 0 then error("generate: top_p must be > 0 (1 keeps every token)", 4) end
  number("top_k", 0, 2 ^ 31)
  number("max_tokens", 0, 2 ^ 31)
  if o.top_k ~= math.floor(o.top_k) or o.max_tokens ~= math.floor(o.max_tokens) then
    error("generate: top_k and max_tokens must be whole numbers", 4)
  end
  if o.truncate ~= false and o.truncate ~= "left" then
    error("generate: truncate must be false or \"left\", got " .. tostring(o.truncate), 4)
  end
  if o.past_context ~= "exact" and o.past_context ~= "half" then
    error("generate: past_context must be \"exact\" or \"half\", got " .. tostring(o.past_context), 4)
  end
  if o.past_context == "half" and not o.cache then
    error("generate: past_context = \"half\" is a policy of the KV cache; without the cache every token is exact", 4)
  end
end

--- lt.generate(model, prompt, opts) -> ids, reason: prompt is a Lua table of
-- ids (0-based, at least one); returns the new ids (a table) and why it
-- stopped ("stop" at a stop token, which is included, or "length").
-- opts: max_tokens = 256, temperature = 1, top_k = 0 (off), top_p = 1 (off),
-- seed (a new generator) or generator (default: lt's default generator),
-- stop = {ids} (default none), cache = true, truncate = false (a prompt
-- longer than the context is an error) or "left" (keep its end),
-- past_context = "exact" (past block_size each token is drawn from a fresh
-- forward over the last block_size ids) or "half" (with the cache: rebuild
-- it from the newest half when full; faster, approximate), on_token =
-- function(id) called as each token is drawn, device (where the ids go;
-- default the model's).
-- Errors: an empty or too long prompt, ids outside the vocabulary, bad opts.
function M.generate(model, prompt, opts)
  opts = opts or {}
  local o = { max_tokens = 256, temperature = 1, top_k = 0, top_p = 1, cache = true, truncate = false,
    past_context = "exact" }
  for k, v in pairs(opts) do o[k] = v end
  check_opts(o)
  if type(prompt) ~= "table" or #prompt == 0 then
    error("generate: the prompt must be a table of at least one token id", 2)
  end
  local vocab = model.config and model.config.vocab_size
  for i, id in ipairs(prompt) do
    if type(id) ~= "number" or id ~= math.floor(id) or id < 0 or (vocab and id >= vocab) then
      error(("generate: prompt token %d is %s, outside the vocabulary [0, %s)"):format(i, tostring(id),
        tostring(vocab)), 2)
    end
  end
  local block = context_size(model)
  local ids = {}
  if #prompt > block then
    if o.truncate ~= "left" then
      error(("generate: the prompt has %d tokens, more than the model's context of %d (truncate = \"left\" keeps its end)")
        :format(#prompt, block), 2)
    end
    for i = #prompt - block + 1, #prompt do ids[#ids + 1] = prompt[i] end
  else
    for i = 1, #prompt do ids[i] = prompt[i] end
  end
  local gen = o.generator or (o.seed and random.Generator(o.seed)) or random.default_generator()
  local device = o.device or (model:parameters()[1] or {}).device or "cpu"
  local stop = {}
  for _, id in ipairs(o.stop or {}) do stop[id] = true end

  local out, reason = {}, "length"
  local was_training = model.training
  model:eval()
  local kv = o.cache and models.KVCache(block < math.huge and block or 4096) or nil
  local function run(window, cache)
    local x = tensor.tensor({ window }, { dtype = "i64", device = device })
    local logits = model(x, cache)
    return logits:select(1, 1):select(1, #window)
  end
  local function window_of(first)
    local w = {}
    for i = first, #ids do w[#w + 1] = ids[i] end
    return w
  end
  local ok, err = pcall(autograd.no_grad, function()
    local logits
    if kv then logits = run(ids, kv) end
    for _ = 1, o.max_tokens do
      if not kv then logits = run(window_of(math.max(1, #ids - block + 1))) end
      local id
      local row = logits:to("cpu", "f64")
      local top = row:max():item()
      if top ~= top or top == math.huge or top == -math.huge then
        error(("generate: the model's logits for token %d are not finite (max %s)"):format(#out + 1, tostring(top)), 0)
      end
      if o.temperature == 0 then
        id = argmax(row) - 1
      else
        local p = F.softmax(row / o.temperature, -1):totable()
        local u = random.rand({ 1 }, { dtype = "f64", generator = gen }):item()
        local k = pick(p, o.top_k, o.top_p, u)
        if not k then
          error(("generate: temperature %g makes the probabilities overflow; use temperature = 0 for greedy decoding")
            :format(o.temperature), 0)
        end
        id = k - 1
      end
      ids[#ids + 1] = id
      out[#out + 1] = id
      if o.on_token then o.on_token(id) end
      if stop[id] then
        reason = "stop"
        break
      end
      if #out == o.max_tokens then break end
      if kv then
        if kv.len + 1 <= kv.size then
          logits = run({ id }, kv)
        elseif o.past_context == "half" then
          -- full: rebuild from the newest half of the context (approximate)
          kv:reset()
          logits = run(window_of(#ids - math.max(1, math.floor(kv.size / 2)) + 1), kv)
        else
          -- full: from here on a fresh forward over the last block_size ids
          -- (kv.len stays at kv.size, so every later token comes here too)
          logits = run(window_of(math.max(1, #ids - block + 1)))
        end
      end
    end
  end)
  if was_training then model:train() end
  if not ok then error(err, 2) end
  return out, reason
end

M.pick = pick -- for tests

setmetatable(M, { __call = function(_, ...) return M.generate(...) end })

return M
