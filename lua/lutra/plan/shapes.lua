--- lutra.plan.shapes: what the planner knows of a model without building
-- it: a description (family, sizes, vocabulary, tied head) from a lutra
-- model name (lt.models.gpt2's and llama's configs), from the flags of
-- recipes/gpt2.lua, or from a Hugging Face config.json (lt.hf.config), and
-- the parameters each tensor-parallel rank holds, with their names and
-- shapes as lutra's models lay them out (lutra.models.gpt2, .llama and
-- .parallel). tests/lua/plan_spec.lua checks the lists against the models
-- themselves, so the planner and the models cannot drift apart.
local gpt2 = require "lutra.models.gpt2"
local llama = require "lutra.models.llama"
local parallel = require "lutra.models.parallel"
local hf = require "lutra.hf"

local M = {}

local function whole(v) return type(v) == "number" and v >= 1 and v == math.floor(v) end

--- shapes.describe(family, config) -> desc: family "gpt2" or "llama" and
-- a lutra model config (gpt2: n_layer, n_head, n_embd, block_size,
-- vocab_size[, pad_vocab, tie_embeddings]; llama: dim, n_layers, n_heads,
-- n_kv_heads, ffn_dim, vocab_size, max_seq_len[, pad_vocab,
-- tie_embeddings]). desc = {family, config (what lt.models.<family>
-- takes), n_layer, n_embd (C), n_head, n_kv_head, head_dim, ffn (the MLP's
-- hidden units), vocab_size, pad_vocab, tied, max_seq, name}. Raises
-- "plan: ..." naming a size that is missing or does not fit.
function M.describe(family, config, name)
  local c = {}
  for k, v in pairs(config) do if k ~= "padded_vocab_size" then c[k] = v end end
  local d = { family = family, config = c, name = name }
  if family == "gpt2" then
    d.n_layer, d.n_embd, d.n_head, d.max_seq = c.n_layer, c.n_embd, c.n_head, c.block_size
    d.n_kv_head, d.ffn, d.tied = c.n_head, 4 * (c.n_embd or 0), c.tie_embeddings ~= false
  elseif family == "llama" then
    d.n_layer, d.n_embd, d.n_head, d.max_seq = c.n_layers, c.dim, c.n_heads, c.max_seq_len
    d.n_kv_head, d.ffn, d.tied = c.n_kv_heads or c.n_heads, c.ffn_dim, c.tie_embeddings == true
  else
    error(("plan: model family %s: gpt2 or llama"):format(tostring(family)), 2)
  end
  d.vocab_size, d.pad_vocab = c.vocab_size, c.pad_vocab
  for _, k in ipairs { "n_layer", "n_embd", "n_head", "n_kv_head", "ffn", "vocab_size", "max_seq" } do
    if not whole(d[k]) then error(("plan: the model's %s is %s: a whole number >= 1 expected"):format(k, tostring(d[k])), 2) end
  end
  if d.n_embd % d.n_head ~= 0 and not c.head_dim then
    error(("plan: the model's width %d is not a multiple of its %d heads"):format(d.n_embd, d.n_head), 2)
  end
  if d.n_head % d.n_kv_head ~= 0 then
    error(("plan: the model's %d heads are not a multiple of its %d key/value heads"):format(d.n_head, d.n_kv_head), 2)
  end
  d.head_dim = c.head_dim or d.n_embd / d.n_head -- (a Llama's head_dim where it is not dim / n_heads)
  return d
end

--- shapes.named(name) -> desc for a lutra model name (gpt2, gpt2-medium,
-- ..., gpt3-175b, llama-tiny, llama2-7b, llama2-70b, llama3-8b, ...);
-- raises naming the known ones.
function M.named(name)
  if gpt2.configs[name] then return M.describe("gpt2", gpt2.configs[name], name) end
  if llama.configs[name] then return M.describe("llama", llama.configs[name], name) end
  local known = {}
  for k in pairs(gpt2.configs) do known[#known + 1] = k end
  for k in pairs(llama.configs) do known[#known + 1] = k end
  table.sort(known)
  error(("plan: unknown model %s (known: %s; or a config.json, or the flags --n_layer= --n_embd= ...)")
    :format(tostring(name), table.concat(known, ", ")), 2)
end

--- shapes.from_hf(path) -> desc from a Hugging Face config.json (a file,
-- or the directory holding it), read by lt.hf.config (its errors name the
-- field).
function M.from_hf(path)
  local dir = path:match("^(.*)/[^/]*%.json$") or (path:match("%.json$") and ".") or path
  local kind, cfg = hf.config(dir, path:match("%.json$") and path or nil)
  local name = (path:match("([^/]+)/[^/]*%.json$") or path:match("([^/]+)$"))
  return M.describe(kind, cfg, name)
end

--- shapes.from_flags(cfg) -> desc from recipes/gpt2.lua's flags (model,
-- n_layer, n_head, n_embd, seq, n_kv_head, ffn, pad_vocab; vocab: 50257,
-- GPT-2's), with the recipe's defaults for the Llama's key/value heads and
-- MLP width.
function M.from_flags(f)
  local V = f.vocab_size or 50257
  local pad = (f.pad_vocab or 0) > 0 and f.pad_vocab or nil
  if f.model == "llama" then
    local kv = (f.n_kv_head or 0) > 0 and f.n_kv_head or (f.n_head % 2 == 0 and f.n_head / 2 or f.n_head)
    local ffn = (f.ffn or 0) > 0 and f.ffn or math.ceil(8 * f.n_embd / 3 / 64) * 64
    return M.describe("llama", { dim = f.n_embd, n_layers = f.n_layer, n_heads = f.n_head, n_kv_heads = kv,
      ffn_dim = ffn, vocab_size = V, max_seq_len = f.seq, pad_vocab = pad }, "llama (flags)")
  end
  return M.describe("gpt2", { n_layer = f.n_layer, n_head = f.n_head, n_embd = f.n_embd, block_size = f.seq,
    vocab_size = V, pad_vocab = pad }, "gpt2 (flags)")
end

--- shapes.padded_vocab(desc, tp) -> the embedding rows the model holds
-- under tp ranks (lutra.models.parallel.padded_vocab).
function M.padded_vocab(d, tp)
  return parallel.padded_vocab(d.vocab_size, d.pad_vocab, tp > 1 and tp or nil)
end

--- shapes.parameters(desc, tp) -> {{name, shape = {...}, numel, sharded
-- (a tensor-parallel shard: true), block = (0-based block index, or nil),
-- part = "embed" | "block" | "final" | "head"}, ...}: the parameters one
-- tensor-parallel rank holds (tp = 1: the whole model), in shard shapes.
-- A tied head is not listed (it is the embedding's tensor). Raises naming
-- the size that does not divide by tp.
function M.parameters(d, tp)
  tp = tp or 1
  d._parameters = d._parameters or {} -- (cached per description and tp: the planner's search asks often)
  if not d._parameters[tp] then d._parameters[tp] = M.list_parameters(d, tp) end
  return d._parameters[tp]
end

--- shapes.list_parameters(desc, tp): shapes.parameters' list, built anew.
function M.list_parameters(d, tp)
  local C, V, out = d.n_embd, M.padded_vocab(d, tp), {}
  local function add(name, shape, sharded, block, part)
    local n = 1
    for _, s in ipairs(shape) do
      if s ~= math.floor(s) then error(("plan: %s does not split across tp %d"):format(name, tp), 3) end
      n = n * s
    end
    out[#out + 1] = { name = name, shape = shape, numel = n, sharded = sharded or nil, block = block, part = part }
  end
  local s = tp > 1
  if d.n_head % tp ~= 0 then error(("plan: %d heads do not divide by tp %d"):format(d.n_head, tp), 2) end
  if d.family == "gpt2" then
    add("transformer.wte.weight", { V / tp, C }, s, nil, "embed")
    add("transformer.wpe.weight", { d.max_seq, C }, false, nil, "embed")
    for b = 0, d.n_layer - 1 do
      local p = "transformer.h." .. b .. "."
      add(p .. "ln_1.weight", { C }, false, b, "block")
      add(p .. "ln_1.bias", { C }, false, b, "block")
      add(p .. "attn.c_attn.weight", { 3 * C / tp, C }, s, b, "block")
      add(p .. "attn.c_attn.bias", { 3 * C / tp }, s, b, "block")
      add(p .. "attn.c_proj.weight", { C, C / tp }, s, b, "block")
      add(p .. "attn.c_proj.bias", { C }, false, b, "block")
      add(p .. "ln_2.weight", { C }, false, b, "block")
      add(p .. "ln_2.bias", { C }, false, b, "block")
      add(p .. "mlp.c_fc.weight", { d.ffn / tp, C }, s, b, "block")
      add(p .. "mlp.c_fc.bias", { d.ffn / tp }, s, b, "block")
      add(p .. "mlp.c_proj.weight", { C, d.ffn / tp }, s, b, "block")
      add(p .. "mlp.c_proj.bias", { C }, false, b, "block")
    end
    add("transformer.ln_f.weight", { C }, false, nil, "final")
    add("transformer.ln_f.bias", { C }, false, nil, "final")
    if not d.tied then add("lm_head.weight", { V / tp, C }, s, nil, "head") end
    return out
  end
  local hd, kv = d.head_dim, d.n_kv_head
  local how = tp > 1 and parallel.kv_split(kv, tp) or "split"
  if not how then error(("plan: %d key/value heads and tp %d: neither divides the other"):format(kv, tp), 2) end
  local kv_rows = how == "split" and kv * hd / tp or hd
  add("model.embed_tokens.weight", { V / tp, C }, s, nil, "embed")
  for b = 0, d.n_layer - 1 do
    local p = "model.layers." .. b .. "."
    add(p .. "input_layernorm.weight", { C }, false, b, "block")
    add(p .. "self_attn.q_proj.weight", { d.n_head * hd / tp, C }, s, b, "block")
    add(p .. "self_attn.k_proj.weight", { kv_rows, C }, s and how == "split", b, "block")
    add(p .. "self_attn.v_proj.weight", { kv_rows, C }, s and how == "split", b, "block")
    add(p .. "self_attn.o_proj.weight", { C, d.n_head * hd / tp }, s, b, "block")
    add(p .. "post_attention_layernorm.weight", { C }, false, b, "block")
    add(p .. "mlp.gate_proj.weight", { d.ffn / tp, C }, s, b, "block")
    add(p .. "mlp.up_proj.weight", { d.ffn / tp, C }, s, b, "block")
    add(p .. "mlp.down_proj.weight", { C, d.ffn / tp }, s, b, "block")
  end
  add("model.norm.weight", { C }, false, nil, "final")
  if not d.tied then add("lm_head.weight", { V / tp, C }, s, nil, "head") end
  return out
end

--- shapes.num_parameters(desc) -> the whole model's parameters (a tied
-- head once), as model:num_parameters() counts them.
function M.num_parameters(d)
  local n = 0
  for _, p in ipairs(M.parameters(d, 1)) do n = n + p.numel end
  return n
end

return M
