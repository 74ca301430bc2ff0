--- lutra.models.gpt2: GPT-2 (Radford et al. 2019) as nanoGPT and llm.c build it:
-- pre-LayerNorm blocks, learned positions, tanh-GELU MLP, the output head
-- tied to the token embedding (unless tie_embeddings = false: then a weight
-- of its own, lm_head.weight), and Hugging Face GPT2LMHeadModel parameter
-- names (transformer.wte.weight, transformer.h.0.attn.c_attn.weight, ...;
-- Linear weights are (out, in), where Hugging Face's Conv1D stores (in, out):
-- lt.ckpt's Hugging Face import and export transpose them). Init as GPT-2:
-- N(0, 0.02), residual projections N(0, 0.02/sqrt(2 n_layer)), biases 0.
--
--   local model = lt.models.gpt2("gpt2", {dropout = 0.1})
--   local logits = model(idx)              -- idx (B, T) ids -> (B, T, V)
--   local loss, n = model:loss(idx, targets)
local tensor = require "lutra.tensor"
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

--- Named configurations; gpt2-tiny is for tests.
M.configs = {
  ["gpt2-tiny"] = { n_layer = 2, n_head = 4, n_embd = 64, block_size = 64, vocab_size = 512 },
  ["gpt2"] = { n_layer = 12, n_head = 12, n_embd = 768, block_size = 1024, vocab_size = 50257 },
  ["gpt2-medium"] = { n_layer = 24, n_head = 16, n_embd = 1024, block_size = 1024, vocab_size = 50257 },
  ["gpt2-large"] = { n_layer = 36, n_head = 20, n_embd = 1280, block_size = 1024, vocab_size = 50257 },
  ["gpt2-xl"] = { n_layer = 48, n_head = 25, n_embd = 1600, block_size = 1024, vocab_size = 50257 },
  -- GPT-3 175B's sizes (Brown et al. 2020, table 2.1: 96 layers, d_model 12288, 96 heads, context 2048) on
  -- GPT-2's architecture (GPT-3's alternating sparse attention left out): for the planner (recipes/plan.lua)
  ["gpt3-175b"] = { n_layer = 96, n_head = 96, n_embd = 12288, block_size = 2048, vocab_size = 50257 },
}

local Attention = nn.Module:extend("CausalSelfAttention")
function Attention:init(cfg, o)
  self.n_head, self.n_embd, self.head_size = cfg.n_head, cfg.n_embd, cfg.n_embd / cfg.n_head
  self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, o)
  self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd, o)
  self.dropout = cfg.dropout or 0
end
function Attention:forward(x, kv)
  local B, T, C = x:size(1), x:size(2), x:size(3)
  local hs = C / self.n_head
  local qkv = self.c_attn(x) -- (B, T, 3C)
  local function heads(t) return t:view(B, T, self.n_head, hs):transpose(2, 3) end -- (B, NH, T, hs)
  -- one chunk node: the three gradients meet in one buffer (cuDNN writes them there side by side)
  local q, k, v = qkv:chunk(3, 3)
  q, k, v = heads(q), heads(k), heads(v)
  if kv then k, v = kv:append(self, k, v) end
  local y = recompute.attention(self, q, k, v, CAUSAL)
  y = y:transpose(2, 3):reshape(B, T, C)
  y = self.c_proj(y)
  if self.dropout > 0 then y = F.dropout(y, self.dropout, { training = self.training }) end
  return y
end

local MLP = nn.Module:extend("MLP")
function MLP:init(cfg, o)
  self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd, o)
  self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd, o)
  self.dropout = cfg.dropout or 0
end
function MLP:forward(x)
  local y
  local plain = nn.Linear.forward
  if self.c_fc.forward == plain and self.c_proj.forward == plain then
    -- two plain Linears (their forward nn.Linear's own, so nothing of a subclass is skipped):
    -- one op (F.mlp), the GELU and its gradient inside the products
    y = F.mlp(x, self.c_fc.weight, self.c_fc._params.by_name.bias, self.c_proj.weight,
      self.c_proj._params.by_name.bias)
  else -- the GELU inside c_fc's product where the layer takes it (one pass fewer)
    local h = nn.fuses(self.c_fc, "fuses_activation") and self.c_fc(x, "gelu") or F.gelu(self.c_fc(x))
    y = self.c_proj(h)
  end
  if self.dropout > 0 then y = F.dropout(y, self.dropout, { training = self.training }) end
  return y
end

local Block = nn.Module:extend("Block")
function Block:init(cfg, o)
  self.ln_1 = nn.LayerNorm(cfg.n_embd, o)
  self.attn = Attention(cfg, o)
  self.ln_2 = nn.LayerNorm(cfg.n_embd, o)
  self.mlp = MLP(cfg, o)
end
--- block(x[, kv[, pending[, carry]]]) -> x + attn + mlp, the residual stream
-- after the block; pending (the block before's MLP output) is added inside
-- ln_1, and carry = true returns (h, mlp output) for the next norm to add
-- (lutra.models.residual).
function Block:forward(x, kv, pending, carry)
  return residual.block(self.ln_1, self.attn, self.ln_2, self.mlp, x, kv, pending, carry)
end
Block.fuses_carry = Block.forward -- (it takes pending and carry: lutra.models.residual)

local Transformer = nn.Module:extend("Transformer")
function Transformer:init(cfg, o)
  self.wte = nn.Embedding(cfg.padded_vocab_size, cfg.n_embd, o)
  self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd, o)
  local blocks = {}
  for i = 1, cfg.n_layer do blocks[i] = Block(cfg, o) end
  self.h = nn.ModuleList(blocks)
  self.ln_f = nn.LayerNorm(cfg.n_embd, o)
end

local GPT = nn.Module:extend("GPT")
M.GPT = GPT

function GPT:init(cfg, o)
  self.config = cfg
  self.transformer = Transformer(cfg, o)
  self.lm_head = nn.Linear(cfg.n_embd, cfg.padded_vocab_size,
    { bias = false, dtype = o.dtype, device = o.device, init = false })
  if cfg.tie_embeddings then self.lm_head.weight = self.transformer.wte.weight end -- tied: one tensor, stored once
  self:init_weights(o.generator)
end

--- GPT-2's initialisation (from the given generator, or the default one).
-- A padded vocabulary's extra rows (wte's, an untied head's) start at zero
-- and the draws are those of the unpadded model: padding changes nothing.
function GPT:init_weights(generator)
  local cfg = self.config
  local std = 0.02
  local proj_std = 0.02 / math.sqrt(2 * cfg.n_layer)
  autograd.no_grad(function()
    for _, np in ipairs(self:named_parameters()) do
      local name, p = np[1], np[2]
      if (name == "transformer.wte.weight" or name == "lm_head.weight") and cfg.padded_vocab_size ~= cfg.vocab_size then
        p:zero_()
        p:narrow(1, 1, cfg.vocab_size):normal_(0, std, generator)
      elseif name:match("%.bias$") then
        p:zero_()
      elseif name:match("ln_") then
        p:fill_(1)
      elseif name:match("c_proj%.weight$") then
        p:normal_(0, proj_std, generator)
      else
        p:normal_(0, std, generator)
      end
    end
  end)
end

--- model:embed(idx[, kv]) -> the residual stream entering the first block
-- (B, T, C): token plus position embeddings (positions from kv.len with a
-- KV cache), dropout in training. Raises when kv.len + T passes block_size.
function GPT:embed(idx, kv)
  local cfg = self.config
  local T = idx:size(2)
  local start = kv and kv.len or 0
  if start + T > cfg.block_size then
    error(("GPT: sequence length %d is longer than the block size %d"):format(start + T, cfg.block_size))
  end
  local tr = self.transformer
  local pos = tensor.arange(start, start + T, { device = idx.device })
  local x = tr.wte(idx) + tr.wpe(pos)
  if (cfg.dropout or 0) > 0 then x = F.dropout(x, cfg.dropout, { training = self.training }) end
  return x
end

--- model:hidden(idx[, kv]) -> the final norm's output (B, T, C) for ids idx
-- (B, T) (i32 or i64, 0-based): what the head multiplies. With a KV cache
-- (lt.models.KVCache) the ids continue the cached ones: positions start at
-- kv.len, attention sees the cached keys and values, and the cache grows
-- by T.
function GPT:hidden(idx, kv)
  local tr = self.transformer
  local x, pending = residual.run(tr.h:list(), self:embed(idx, kv), kv) -- (each block's MLP output added in the next norm)
  if kv then kv:advance(idx:size(2)) end
  local _, y = residual.norm(tr.ln_f, x, pending)
  return y
end

--- model:head_loss(y, targets[, opts]) -> F.cross_entropy(lm_head(y),
-- targets, opts)'s results over the vocabulary's vocab_size columns (the
-- padding's out of the softmax), y the final norm's output (B, T, C): the
-- head and the loss as one op where the head is plain (lutra.models.head).
function GPT:head_loss(y, targets, opts)
  return head.loss(self.lm_head, y, targets, head.with_classes(self.config, opts))
end

--- model(idx[, kv[, padded]]) -> logits (B, T, V) for ids idx (B, T), as
-- model:hidden. padded = true returns the head's padded_vocab_size columns.
function GPT:forward(idx, kv, padded)
  local cfg = self.config
  local logits = self.lm_head(self:hidden(idx, kv))
  if cfg.padded_vocab_size ~= cfg.vocab_size and not padded then logits = logits:narrow(3, 1, cfg.vocab_size) end
  return logits
end

--- model:loss(idx, targets[, opts]) -> mean loss over counted tokens, their
-- count (opts as F.cross_entropy's), over the padded head's first
-- vocab_size columns: the head and the loss as one op where the head is
-- plain (lutra.models.head) and the model's forward its own (also wrapped
-- by lt.dist.Zero's stage 3; one overridden runs as model(idx)).
function GPT:loss(idx, targets, opts) return head.model_loss(self, GPT.forward, idx, targets, opts) end
-- (lt.train computes the loss with it: it is F.cross_entropy(model(idx), targets, opts))
GPT.loss_is_cross_entropy = GPT.loss

--- lt.models.gpt2(name or config[, overrides]): a GPT-2. Overrides and
-- configs take n_layer, n_head, n_embd, block_size, vocab_size, dropout,
-- pad_vocab (round the embedding rows up to a multiple, e.g. 64 or 128, as
-- llm.c does for speed; logits keep vocab_size columns), tie_embeddings
-- (true by default: the head is wte; false: a (padded) vocab x n_embd
-- weight of its own), dtype, device, generator (for the initialisation),
-- tp (a tensor-parallel process group: the model is built whole, then each
-- rank keeps its shards, lutra.models.parallel; n_head must divide by its
-- size and the vocabulary is padded to a multiple of pad_vocab x tp) and
-- sequence_parallel (with tp: norms and dropout on 1/tp of the tokens; refused
-- without tp), pp (a pipeline group: each rank keeps its stages' blocks,
-- the first the embeddings, the last the final norm and head,
-- lutra.models.pipeline), pp_stages (blocks per virtual stage; default an
-- even split), virtual_stages (chunks a rank, for the interleaved
-- schedule; default 1) and recompute ("none", "full", "every:k" or
-- "selective": which activations backward recomputes instead of keeping,
-- lutra.recompute).
function M.gpt2(name, overrides)
  local cfg, o = mconfig.resolve("gpt2", M.configs, name, overrides)
  local n = o.tp ~= nil and parallel.check_group("gpt2", o.tp) or 1
  parallel.check_sp("gpt2", o)
  parallel.check_pp("gpt2", o)
  local rok, rerr = pcall(recompute.parse, o.recompute)
  if not rok then error("gpt2: " .. rerr, 2) end
  local known = { n_layer = 1, n_head = 1, n_embd = 1, block_size = 1, vocab_size = 1, pad_vocab = 1, dropout = 2,
    tie_embeddings = 3 }
  for k, v in pairs(cfg) do
    if not known[k] then
      local names = {}
      for n in pairs(known) do names[#names + 1] = n end
      table.sort(names)
      error(("gpt2: unknown setting '%s' (valid: %s, dtype, device, generator)"):format(tostring(k),
        table.concat(names, ", ")), 2)
    end
    if known[k] == 1 and (type(v) ~= "number" or v < 1 or v ~= math.floor(v) or v > 2 ^ 31) then
      error(("gpt2: config %s must be a whole number in 1..2^31, got %s"):format(k, tostring(v)), 2)
    end
    if known[k] == 3 and type(v) ~= "boolean" then
      error(("gpt2: config %s must be true or false, got %s"):format(k, tostring(v)), 2)
    end
  end
  if cfg.dropout ~= nil and (type(cfg.dropout) ~= "number" or not (cfg.dropout >= 0 and cfg.dropout < 1)) then
    error(("gpt2: dropout must be in [0, 1), got %s"):format(tostring(cfg.dropout)), 2)
  end
  for _, k in ipairs { "n_layer", "n_head", "n_embd", "block_size", "vocab_size" } do
    if cfg[k] == nil then error(("gpt2: config %s is missing"):format(k), 2) end
  end
  if cfg.n_embd % cfg.n_head ~= 0 then
    error(("gpt2: n_embd %d is not a multiple of n_head %d"):format(cfg.n_embd, cfg.n_head), 2)
  end
  parallel.divides("gpt2", n, { { "n_head", cfg.n_head, "each rank takes n_head / tp heads" } })
  cfg.padded_vocab_size = parallel.padded_vocab(cfg.vocab_size, cfg.pad_vocab, n)
  cfg.tie_embeddings = cfg.tie_embeddings ~= false
  local model = GPT(cfg, o)
  if n > 1 then parallel.gpt2(model, o.tp, o.sequence_parallel) end
  if o.pp ~= nil and o.pp:size() > 1 then pipeline.split(model, o.pp, { stages = o.pp_stages, chunks = o.virtual_stages }) end
  recompute.apply(model, model.transformer.h, "attn", o.recompute)
  return model
end

return M
