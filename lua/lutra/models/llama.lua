--- lutra.models.llama: Llama (Touvron et al. 2023; Llama 3 shapes) with
-- RMSNorm, rotary position embeddings, a SwiGLU MLP, grouped-query attention
-- and an output head, untied unless tie_embeddings (then lm_head.weight is
-- model.embed_tokens.weight, one tensor, as Hugging Face's
-- tie_word_embeddings), under Hugging Face LlamaForCausalLM parameter names
-- (model.embed_tokens.weight, model.layers.0.self_attn.q_proj.weight, ...,
-- lm_head.weight). Init N(0, 0.02).
--
--   local model = lt.models.llama("llama-tiny")
--   local loss, n = model:loss(idx, targets)
local autograd = require "lutra.autograd"
local F = require "lutra.nn.functional"
local nn = require "lutra.nn"
local residual = require "lutra.models.residual"
local recompute = require "lutra.recompute"
local CAUSAL = { causal = true }
local head = require "lutra.models.head"
local mconfig = require "lutra.models.config"
local parallel = require "lutra.models.parallel"
local pipeline = require "lutra.models.pipeline"

local M = {}

M.configs = {
  ["llama-tiny"] = { dim = 64, n_layers = 2, n_heads = 4, n_kv_heads = 2, vocab_size = 512, ffn_dim = 176,
    rope_theta = 10000, norm_eps = 1e-5, max_seq_len = 128 },
  -- Llama 2 (Touvron et al. 2023; the released config.json files' sizes)
  ["llama2-7b"] = { dim = 4096, n_layers = 32, n_heads = 32, n_kv_heads = 32, vocab_size = 32000, ffn_dim = 11008,
    rope_theta = 10000, norm_eps = 1e-5, max_seq_len = 4096 },
  ["llama2-70b"] = { dim = 8192, n_layers = 80, n_heads = 64, n_kv_heads = 8, vocab_size = 32000, ffn_dim = 28672,
    rope_theta = 10000, norm_eps = 1e-5, max_seq_len = 4096 },
  ["llama3-8b"] = { dim = 4096, n_layers = 32, n_heads = 32, n_kv_heads = 8, vocab_size = 128256, ffn_dim = 14336,
    rope_theta = 500000, norm_eps = 1e-5, max_seq_len = 8192 },
}

local Attention = nn.Module:extend("LlamaAttention")
function Attention:init(cfg, o)
  local hd = cfg.head_dim or cfg.dim / cfg.n_heads
  self.n_heads, self.n_kv, self.hd, self.theta = cfg.n_heads, cfg.n_kv_heads, hd, cfg.rope_theta
  self.rope_scaling = cfg.rope_scaling
  local nb = { bias = false, dtype = o.dtype, device = o.device, init = false }
  self.q_proj = nn.Linear(cfg.dim, cfg.n_heads * hd, nb)
  self.k_proj = nn.Linear(cfg.dim, cfg.n_kv_heads * hd, nb)
  self.v_proj = nn.Linear(cfg.dim, cfg.n_kv_heads * hd, nb)
  self.o_proj = nn.Linear(cfg.n_heads * hd, cfg.dim, nb)
end
function Attention:forward(x, kv)
  local B, T = x:size(1), x:size(2)
  local start = kv and kv.len or 0
  local q = self.q_proj(x):view(B, T, self.n_heads, self.hd):transpose(2, 3)
  local k = self.k_proj(x):view(B, T, self.n_kv, self.hd):transpose(2, 3)
  local v = self.v_proj(x):view(B, T, self.n_kv, self.hd):transpose(2, 3)
  q = F.rope(q, { base = self.theta, start = start, scaling = self.rope_scaling })
  k = F.rope(k, { base = self.theta, start = start, scaling = self.rope_scaling })
  if kv then k, v = kv:append(self, k, v) end
  local y = recompute.attention(self, q, k, v, CAUSAL)
  return self.o_proj(y:transpose(2, 3):reshape(B, T, self.n_heads * self.hd))
end

local MLP = nn.Module:extend("LlamaMLP")
function MLP:init(cfg, o)
  local nb = { bias = false, dtype = o.dtype, device = o.device, init = false }
  self.gate_proj = nn.Linear(cfg.dim, cfg.ffn_dim, nb)
  self.up_proj = nn.Linear(cfg.dim, cfg.ffn_dim, nb)
  self.down_proj = nn.Linear(cfg.ffn_dim, cfg.dim, nb)
end
function MLP:forward(x) return self.down_proj(F.swiglu(self.gate_proj(x), self.up_proj(x))) end

local Layer = nn.Module:extend("LlamaDecoderLayer")
function Layer:init(cfg, o)
  self.input_layernorm = nn.RMSNorm(cfg.dim, { eps = cfg.norm_eps, dtype = o.dtype, device = o.device })
  self.self_attn = Attention(cfg, o)
  self.post_attention_layernorm = nn.RMSNorm(cfg.dim, { eps = cfg.norm_eps, dtype = o.dtype, device = o.device })
  self.mlp = MLP(cfg, o)
end
--- layer(x[, kv[, pending[, carry]]]) -> the residual stream after the
-- layer; pending (the layer before's MLP output) is added inside
-- input_layernorm, and carry = true returns (h, mlp output) for the next
-- norm to add (lutra.models.residual).
function Layer:forward(x, kv, pending, carry)
  return residual.block(self.input_layernorm, self.self_attn, self.post_attention_layernorm, self.mlp, x, kv,
    pending, carry)
end
Layer.fuses_carry = Layer.forward -- (it takes pending and carry: lutra.models.residual)

local Body = nn.Module:extend("LlamaModel")
function Body:init(cfg, o)
  self.embed_tokens = nn.Embedding(cfg.padded_vocab_size, cfg.dim, o)
  local layers = {}
  for i = 1, cfg.n_layers do layers[i] = Layer(cfg, o) end
  self.layers = nn.ModuleList(layers)
  self.norm = nn.RMSNorm(cfg.dim, { eps = cfg.norm_eps, dtype = o.dtype, device = o.device })
end

local Llama = nn.Module:extend("Llama")
M.Llama = Llama

function Llama:init(cfg, o)
  self.config = cfg
  self.model = Body(cfg, o)
  self.lm_head = nn.Linear(cfg.dim, cfg.padded_vocab_size,
    { bias = false, dtype = o.dtype, device = o.device, init = false })
  if cfg.tie_embeddings then self.lm_head.weight = self.model.embed_tokens.weight end -- one tensor, stored once
  -- (a vocabulary padded for tensor parallelism: the extra rows zero, the draws the unpadded model's)
  local padded = cfg.padded_vocab_size ~= cfg.vocab_size
  autograd.no_grad(function()
    for _, np in ipairs(self:named_parameters()) do
      local name, p = np[1], np[2]
      if padded and (name == "model.embed_tokens.weight" or name == "lm_head.weight") then
        p:zero_()
        p:narrow(1, 1, cfg.vocab_size):normal_(0, 0.02, o.generator)
      elseif not name:match("norm") then
        p:normal_(0, 0.02, o.generator)
      end
    end
  end)
end

--- model:embed(idx[, kv]) -> the token embeddings (B, T, dim) entering the
-- first layer. Raises when kv.len + T passes max_seq_len.
function Llama:embed(idx, kv)
  local start = kv and kv.len or 0
  if start + idx:size(2) > self.config.max_seq_len then
    error(("Llama: sequence length %d is longer than max_seq_len %d"):format(start + idx:size(2),
      self.config.max_seq_len))
  end
  return self.model.embed_tokens(idx)
end

--- model:hidden(idx[, kv]) -> the final norm's output (B, T, dim): what the
-- head multiplies; with a KV cache (lt.models.KVCache) the ids continue the
-- cached ones (rotary positions from kv.len).
function Llama:hidden(idx, kv)
  local x, pending = residual.run(self.model.layers:list(), self:embed(idx, kv), kv)
  if kv then kv:advance(idx:size(2)) end
  local _, y = residual.norm(self.model.norm, x, pending)
  return y
end

--- model:head_loss(y, targets[, opts]) -> F.cross_entropy(lm_head(y),
-- targets, opts)'s results over the vocab_size columns, y the final norm's
-- output (B, T, dim) (the head and the loss as one op where it is plain).
function Llama:head_loss(y, targets, opts)
  return head.loss(self.lm_head, y, targets, head.with_classes(self.config, opts))
end

--- model(idx[, kv[, padded]]) -> logits (B, T, V), as model:hidden
-- (padded = true: the padded vocabulary's columns too).
function Llama:forward(idx, kv, padded)
  local cfg = self.config
  local logits = self.lm_head(self:hidden(idx, kv))
  if cfg.padded_vocab_size ~= cfg.vocab_size and not padded then logits = logits:narrow(3, 1, cfg.vocab_size) end
  return logits
end

--- model:loss(idx, targets[, opts]) -> mean loss over counted tokens, their
-- count (opts as F.cross_entropy's): the head and the loss as one op where
-- the head is plain (lutra.models.head) and the model's forward its own
-- (also wrapped by lt.dist.Zero's stage 3; one overridden runs as
-- model(idx)).
function Llama:loss(idx, targets, opts) return head.model_loss(self, Llama.forward, idx, targets, opts) end
-- (lt.train computes the loss with it: it is F.cross_entropy(model(idx), targets, opts))
Llama.loss_is_cross_entropy = Llama.loss

--- lt.models.llama(name or config[, overrides]): dim, n_layers, n_heads,
-- n_kv_heads, vocab_size, ffn_dim, rope_theta, rope_scaling (Hugging Face's
-- table: {rope_type = "linear", factor =} or {rope_type = "llama3", factor =,
-- low_freq_factor =, high_freq_factor =, original_max_position_embeddings =};
-- F.rope_scaling), head_dim (the heads' width; default dim / n_heads),
-- norm_eps, max_seq_len,
-- tie_embeddings (false: the head its own (vocab_size, dim) weight; true: the
-- head is the token embedding), pad_vocab (the embedding and head rows
-- rounded up to a multiple; logits keep vocab_size columns); dtype, device, generator; tp (a
-- tensor-parallel process group: built whole, then each rank keeps its
-- shards, lutra.models.parallel; n_heads and ffn_dim must divide by its
-- size, and n_kv_heads divide by it or it by n_kv_heads; the vocabulary is
-- padded to a multiple of it) and sequence_parallel (with tp; refused
-- without); pp, pp_stages, virtual_stages: pipeline stages as
-- lt.models.gpt2's (lutra.models.pipeline); recompute as lt.models.gpt2's.
function M.llama(name, overrides)
  local cfg, o = mconfig.resolve("llama", M.configs, name, overrides)
  local n = o.tp ~= nil and parallel.check_group("llama", o.tp) or 1
  parallel.check_sp("llama", o)
  parallel.check_pp("llama", o)
  local rok, rerr = pcall(recompute.parse, o.recompute)
  if not rok then error("llama: " .. rerr, 2) end
  local known = { dim = 1, n_layers = 1, n_heads = 1, n_kv_heads = 1, vocab_size = 1, ffn_dim = 1, max_seq_len = 1,
    rope_theta = 2, norm_eps = 2, tie_embeddings = 3, pad_vocab = 1, rope_scaling = 4, head_dim = 1 }
  for k, v in pairs(cfg) do
    if not known[k] then
      local names = {}
      for n in pairs(known) do names[#names + 1] = n end
      table.sort(names)
      error(("llama: unknown setting '%s' (valid: %s, dtype, device, generator)"):format(tostring(k),
        table.concat(names, ", ")), 2)
    end
    if known[k] == 1 and (type(v) ~= "number" or v < 1 or v ~= math.floor(v) or v > 2 ^ 31) then
      error(("llama: config %s must be a whole number in 1..2^31, got %s"):format(k, tostring(v)), 2)
    end
    if known[k] == 2 and (type(v) ~= "number" or not (v > 0) or v == math.huge) then
      error(("llama: config %s must be a positive number, got %s"):format(k, tostring(v)), 2)
    end
    if known[k] == 3 and type(v) ~= "boolean" then
      error(("llama: config %s must be true or false, got %s"):format(k, tostring(v)), 2)
    end
    if known[k] == 4 then
      local sok, serr = pcall(F.rope_scaling, v)
      if not sok then error("llama: config " .. tostring(serr):gsub("^.-rope: ", "rope_scaling: "), 2) end
    end
  end
  for _, k in ipairs { "dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "ffn_dim" } do
    if cfg[k] == nil then error(("llama: config %s is missing"):format(k), 2) end
  end
  local width = cfg.head_dim or cfg.dim / cfg.n_heads
  if width ~= math.floor(width) or cfg.n_heads % cfg.n_kv_heads ~= 0 or width % 2 ~= 0 then
    error(("llama: dim %d, n_heads %d%s and n_kv_heads %d do not fit (even head size, kv heads dividing heads)")
      :format(cfg.dim, cfg.n_heads, cfg.head_dim and (", head_dim %d"):format(cfg.head_dim) or "", cfg.n_kv_heads), 2)
  end
  cfg.rope_theta = cfg.rope_theta or 10000
  cfg.norm_eps = cfg.norm_eps or 1e-5
  cfg.max_seq_len = cfg.max_seq_len or 2048
  cfg.tie_embeddings = cfg.tie_embeddings == true
  parallel.divides("llama", n, { { "n_heads", cfg.n_heads, "each rank takes n_heads / tp query heads" },
    { "ffn_dim", cfg.ffn_dim, "each rank takes ffn_dim / tp of the MLP's hidden units" } })
  if not parallel.kv_split(cfg.n_kv_heads, n) then
    error(("llama: n_kv_heads %d and tp %d: the key/value heads can neither be split (n_kv_heads divides by tp) nor replicated (tp divides by n_kv_heads)")
      :format(cfg.n_kv_heads, n), 2)
  end
  cfg.padded_vocab_size = parallel.padded_vocab(cfg.vocab_size, cfg.pad_vocab, n)
  local model = Llama(cfg, o)
  if n > 1 then parallel.llama(model, o.tp, o.sequence_parallel) end
  if o.pp ~= nil and o.pp:size() > 1 then pipeline.split(model, o.pp, { stages = o.pp_stages, chunks = o.virtual_stages }) end
  recompute.apply(model, model.model.layers, "self_attn", o.recompute)
  return model
end

return M
