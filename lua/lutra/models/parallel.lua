--- lutra.models.parallel: GPT-2 and Llama split across a tensor-parallel
-- group, as Megatron-LM splits a transformer (Shoeybi et al. 2019,
-- section 3; sequence parallelism: Korthikanti et al. 2022, section 4.2.2).
-- lt.models.gpt2(name, {tp = group, sequence_parallel = true}) and
-- lt.models.llama(...) build the whole model from the generator (every
-- layout starts from one process's weights) and hand it here, which
-- replaces its layers by their shards in place:
--
--   attention  heads split: GPT-2's c_attn column-parallel by q | k | v
--              (parts = 3), Llama's q_proj, k_proj, v_proj column-parallel;
--              grouped-query K/V heads split when n_kv_heads divides by tp,
--              else (tp dividing by n_kv_heads) every rank keeps the whole
--              K/V weights and uses its queries' head, the gradient summed
--              over the group; c_proj / o_proj row-parallel
--   MLP        the hidden dim split: c_fc, gate_proj, up_proj column-,
--              c_proj, down_proj row-parallel (biases added once)
--   embedding  vocab-parallel (rows V/tp each), the head the same rows
--              (tied) or its own column-parallel weight; the loss
--              vocab-parallel (lt.dist.tp.linear_cross_entropy): no rank
--              holds the (B T, V) logits
--   norms      replicated; under sequence parallelism they run on this
--              rank's 1/tp of the tokens (rows of the flattened (B T, C)
--              stream), their gains' gradients summed over the group
--
-- Communication per block, forward: two all-reduces of (B, T, C) (after
-- attention and after the MLP), or under sequence parallelism two
-- all-gathers and two reduce-scatters of the same bytes; the backward the
-- same again. Parameter names stay the whole model's (Hugging Face's);
-- shapes are the shards'; lt.dist.tp's records say which are shards.
-- Sequence parallelism applies where the batch's tokens (B x T) divide by
-- tp; other calls (generation with a KV cache, a batch that does not
-- divide) run without it, with the same result.
local tensor = require "lutra.tensor"
local F = require "lutra.nn.functional"
local tp = require "lutra.dist.tp"
local residual = require "lutra.models.residual"
local recompute = require "lutra.recompute"
local CAUSAL = { causal = true }
local head = require "lutra.models.head"

local M = {}

--- parallel.check_group(family, g) -> n, the group's size; raises
-- "<family>: tp must be a process group ..." at the constructor's caller.
function M.check_group(family, g)
  if type(g) ~= "table" or type(g.size) ~= "function" or type(g.rank) ~= "function" then
    error(("%s: tp must be a process group (lt.dist.mesh{tp = n}.tp or lt.dist.new_group), got %s")
      :format(family, tostring(g)), 4)
  end
  return g:size()
end

--- parallel.check_sp(family, o): raises "<family>: sequence_parallel ..."
-- at the constructor's caller when o.sequence_parallel is not a boolean
-- (or nil), or is true without a tp group (it would silently do nothing).
function M.check_sp(family, o)
  local sp = o.sequence_parallel
  if sp ~= nil and type(sp) ~= "boolean" then
    error(("%s: sequence_parallel must be true or false, got %s"):format(family, tostring(sp)), 4)
  end
  if sp and o.tp == nil then
    error(("%s: sequence_parallel splits the tokens across a tensor-parallel group: it needs tp (lt.dist.mesh{tp = n}.tp)")
      :format(family), 4)
  end
end

--- parallel.check_pp(family, o): raises "<family>: ..." at the
-- constructor's caller when o.pp is not a process group, or pp_stages or
-- virtual_stages come without it.
function M.check_pp(family, o)
  if o.pp ~= nil then
    M.check_group(family, o.pp)
    return
  end
  for _, k in ipairs { "pp_stages", "virtual_stages" } do
    if o[k] ~= nil then
      error(("%s: %s splits the model into pipeline stages: it needs pp (lt.dist.mesh{pp = n}.pp)"):format(family, k), 4)
    end
  end
end

--- parallel.divides(family, n, checks): raises "<family>: <name> <value>
-- does not divide by tp <n> (<why>)" for the first {name, value, why}
-- whose value is not a multiple of n, at the constructor's caller.
function M.divides(family, n, checks)
  for _, c in ipairs(checks) do
    if c[2] % n ~= 0 then
      error(("%s: %s %d does not divide by tp %d (%s)"):format(family, c[1], c[2], n, c[3]), 4)
    end
  end
end

--- parallel.padded_vocab(vocab, pad, n) -> the vocabulary rows a model
-- holds: vocab rounded up to a multiple of pad x n (Megatron-LM pads to
-- make_vocab_size_divisible_by x tp), so each rank's rows are a multiple
-- of pad. The padding rows start at zero, are never looked up, and their
-- logits are masked (classes = vocab): the model is the unpadded one.
function M.padded_vocab(vocab, pad, n)
  local m = (pad or 1) * (n or 1)
  return math.ceil(vocab / m) * m
end

-- every module of the model that acts differently under sequence
-- parallelism shares one context: {group, n, rank, sp (on for this call),
-- B, T (the batch's shape, for views of gathered rows)}
local function set_context(model, ctx)
  for _, nm in ipairs(model:named_modules()) do rawset(nm[2], "tp_ctx", ctx) end
end

-- sequence parallelism on or off for this call: the parallel layers' flags follow
local function use_sp(model, ctx, on)
  if ctx.sp == on then return end
  ctx.sp = on
  for _, nm in ipairs(model:named_modules()) do
    local m = nm[2]
    if rawget(m, "sequence_parallel") ~= nil then rawset(m, "sequence_parallel", on) end
  end
end

--- parallel.begin(model, B, T, kv) -> ctx: records the batch's shape (B,
-- T) and whether this call runs sequence-parallel (the model asked for it,
-- no KV cache, and B x T divides by tp). A pipeline stage without the
-- embedding calls it with the micro-batch's shape before its blocks.
function M.begin(model, B, T, kv)
  local ctx = rawget(model, "tp_ctx")
  ctx.B, ctx.T = B, T
  use_sp(model, ctx, rawget(model, "tp_sequence_parallel") == true and kv == nil and (ctx.B * ctx.T) % ctx.n == 0)
  return ctx
end

-- dropout on the residual stream: the whole activation (the same mask on
-- every rank, the generators being in step), or under sequence parallelism
-- this rank's rows of one process's mask (tp.dropout_rows)
local function dropout(ctx, x, p, training)
  if p <= 0 then return x end
  if ctx.sp then return tp.dropout_rows(x, p, ctx.group, { training = training }) end
  return F.dropout(x, p, { training = training })
end

-- the input of a column-parallel product: gathered rows (sequence
-- parallel) or the whole activation through f
local function column_input(ctx, x)
  if ctx.sp then return tp.gather_rows(x, ctx.group) end
  return tp.copy_to_region(x, ctx.group)
end

-- a norm's forward whose gains, under sequence parallelism, pass through f
-- (each rank's rows give part of their gradient)
local function norm_forward(kind)
  return function(self, x, res)
    local ctx = self.tp_ctx
    local w, b = self.weight, self._params.by_name.bias
    if ctx.sp then
      w = tp.copy_to_region(w, ctx.group)
      if b then b = tp.copy_to_region(b, ctx.group) end
    end
    if kind == "layer" then
      if res ~= nil then return F.add_layer_norm(x, res, w, b, self.eps) end
      return F.layer_norm(x, w, b, self.eps)
    end
    if res ~= nil then return F.add_rms_norm(x, res, w, self.eps) end
    return F.rms_norm(x, w, self.eps)
  end
end
local layer_norm_forward, rms_norm_forward = norm_forward("layer"), norm_forward("rms")

local function parallel_norm(norm, kind)
  local f = kind == "layer" and layer_norm_forward or rms_norm_forward
  rawset(norm, "forward", f)
  rawset(norm, "fuses_residual", f) -- (it takes the residual add: lutra.models.residual)
  rawset(norm, "sequence_parallel", false)
end

-- the head: logits (B, T, V) whole (gathered across the group), and the
-- vocab-parallel loss
local function whole_logits(model, y, padded)
  local ctx, cfg = model.tp_ctx, model.config
  local yin = column_input(ctx, y)
  local logits = tp.gather_from_region(F.linear(yin, model.lm_head.weight), ctx.group)
  logits = logits:view(ctx.B, ctx.T, logits:size(-1))
  local vocab = cfg.vocab_size
  if logits:size(3) ~= vocab and not padded then logits = logits:narrow(3, 1, vocab) end
  return logits
end

local function vocab_loss(model, y, targets, opts)
  local ctx, cfg = model.tp_ctx, model.config
  local o = {}
  for k, v in pairs(opts or {}) do o[k] = v end
  o.classes = o.classes or cfg.vocab_size -- (the padding's columns out of the softmax, on either path)
  if (o.reduction or "mean") == "none" then
    return F.cross_entropy(whole_logits(model, y, true), targets, o)
  end
  local yin = column_input(ctx, y)
  if ctx.sp then targets = targets:reshape(-1) end
  return tp.linear_cross_entropy(yin, model.lm_head.weight, targets, ctx.group, o)
end

-- the model's forward and loss under tensor parallelism (as the classes'
-- own, which stay for one process): set on the instance
local function install_head(model, hidden)
  local function forward(self, idx, kv, padded)
    M.begin(self, idx:size(1), idx:size(2), kv)
    return whole_logits(self, hidden(self, idx, kv), padded)
  end
  local function loss(self, idx, targets, opts)
    local run = head.runner(self, forward)
    if not run then return F.cross_entropy(self(idx, nil, true), targets, opts) end
    return run(function(m)
      M.begin(m, idx:size(1), idx:size(2), nil)
      return vocab_loss(m, hidden(m, idx, nil), targets, opts)
    end)
  end
  rawset(model, "forward", forward)
  rawset(model, "loss", loss)
  rawset(model, "loss_is_cross_entropy", loss)
  rawset(model, "head_loss", vocab_loss) -- (a pipeline's last stage: after begin, on the final norm's output)
end

-- the split's last part, the same for both models: the embedding (holder[key]) vocab-parallel,
-- the head its rows (tied) or column-parallel, the model's records, forward and loss
local function finish(model, holder, key, g, sp, hidden, embed, ctx)
  holder[key] = tp.VocabParallelEmbedding.from(holder[key], g, { vocab = model.config.vocab_size })
  if model.config.tie_embeddings then
    model.lm_head.weight = holder[key].weight -- tied: the same rows of the vocabulary
    tp.mark(model.lm_head, "weight", 1)
  else
    model.lm_head = tp.ColumnParallelLinear.from(model.lm_head, g)
  end
  rawset(model, "tp_group", g)
  rawset(model, "tp_sequence_parallel", sp == true)
  rawset(model, "hidden", hidden)
  rawset(model, "embed", embed) -- (after begin: a pipeline's first stage runs it alone)
  install_head(model, hidden)
  set_context(model, ctx)
  collectgarbage() -- (the whole weights are garbage now: free them before training allocates)
  return model
end

-- ---- GPT-2 ----------------------------------------------------------------

local function gpt2_attention(self, x, kv)
  local ctx = self.tp_ctx
  local B, T, nh, hs = ctx.B, ctx.T, self.n_head, self.head_size
  local qkv = self.c_attn(x):view(B, T, 3 * nh * hs) -- this rank's heads of q, k and v
  local function heads(t) return t:view(B, T, nh, hs):transpose(2, 3) end
  local q, k, v = qkv:chunk(3, 3)
  q, k, v = heads(q), heads(k), heads(v)
  if kv then k, v = kv:append(self, k, v) end
  local y = recompute.attention(self, q, k, v, CAUSAL)
  y = self.c_proj(y:transpose(2, 3):reshape(B, T, nh * hs))
  return dropout(ctx, y, self.dropout, self.training)
end

local function gpt2_mlp(self, x)
  local ctx = self.tp_ctx
  local fc, proj = self.c_fc, self.c_proj
  -- one op for the two products and the GELU (F.mlp), the bias added once after the sum
  local y = F.mlp(column_input(ctx, x), fc.weight, fc._params.by_name.bias, proj.weight, nil)
  local b = proj._params.by_name.bias
  if ctx.sp then
    y = tp.reduce_scatter_rows(y, ctx.group)
    if b then b = tp.copy_to_region(b, ctx.group) end
  else
    y = tp.reduce_from_region(y, ctx.group)
  end
  if b then y = y + b end
  return dropout(ctx, y, self.dropout, self.training)
end

-- this rank's rows' positions (the flattened (B, T) tokens r N/n .. (r+1) N/n), as ids;
-- made once per batch shape (every step of a run has the same), not every forward
local function row_positions(ctx, start, device)
  local key = ("%d %d %d %s"):format(ctx.B, ctx.T, start, device)
  if ctx.positions_key ~= key then
    local N = ctx.B * ctx.T / ctx.n
    local first, ids = ctx.rank * N, {}
    for i = 0, N - 1 do ids[i + 1] = start + (first + i) % ctx.T end
    ctx.positions, ctx.positions_key = tensor.tensor(ids, { dtype = "i64", device = device }), key
  end
  return ctx.positions
end

local function gpt2_embed(self, idx, kv)
  local cfg, ctx, tr = self.config, self.tp_ctx, self.transformer
  local T = idx:size(2)
  local start = kv and kv.len or 0
  if start + T > cfg.block_size then
    error(("GPT: sequence length %d is longer than the block size %d"):format(start + T, cfg.block_size), 3)
  end
  local x = tr.wte(idx) -- whole (B, T, C), or this rank's rows under sequence parallelism
  if ctx.sp then
    x = x + F.embedding(row_positions(ctx, start, idx.device), tp.copy_to_region(tr.wpe.weight, ctx.group))
  else
    x = x + tr.wpe(tensor.arange(start, start + T, { device = idx.device }))
  end
  return dropout(ctx, x, cfg.dropout or 0, self.training)
end

local function gpt2_hidden(self, idx, kv)
  local tr = self.transformer
  local x, pending = residual.run(tr.h:list(), gpt2_embed(self, idx, kv), kv)
  if kv then kv:advance(idx:size(2)) end
  local _, y = residual.norm(tr.ln_f, x, pending)
  return y
end

--- parallel.gpt2(model, group, sequence_parallel) -> model: the whole GPT-2
-- model split in place across group (its config checked by lt.models.gpt2:
-- n_head and the padded vocabulary divide by the group's size).
function M.gpt2(model, g, sp)
  local cfg, n = model.config, g:size()
  local ctx = { group = g, n = n, rank = g:rank(), sp = false }
  local tr = model.transformer
  for _, block in ipairs(tr.h:list()) do
    local attn, mlp = block.attn, block.mlp
    attn.c_attn = tp.ColumnParallelLinear.from(attn.c_attn, g, { parts = 3 })
    attn.c_proj = tp.RowParallelLinear.from(attn.c_proj, g)
    attn.head_size = cfg.n_embd / cfg.n_head
    attn.n_head = cfg.n_head / n
    rawset(attn, "forward", gpt2_attention)
    mlp.c_fc = tp.ColumnParallelLinear.from(mlp.c_fc, g)
    mlp.c_proj = tp.RowParallelLinear.from(mlp.c_proj, g)
    rawset(mlp, "forward", gpt2_mlp)
    parallel_norm(block.ln_1, "layer")
    parallel_norm(block.ln_2, "layer")
  end
  parallel_norm(tr.ln_f, "layer")
  return finish(model, tr, "wte", g, sp, gpt2_hidden, gpt2_embed, ctx)
end

-- ---- Llama ----------------------------------------------------------------

local function llama_attention(self, x, kv)
  local ctx = self.tp_ctx
  local B, T, g = ctx.B, ctx.T, ctx.group
  local start = kv and kv.len or 0
  local xin = column_input(ctx, x) -- gathered once for q, k and v
  local nq, nkv, hd = self.n_heads, self.n_kv, self.hd
  local q = F.linear(xin, self.q_proj.weight):view(B, T, nq, hd):transpose(2, 3)
  local kw, vw = self.k_proj.weight, self.v_proj.weight
  if self.kv_head then
    -- whole K/V weights on every rank: this rank's queries' head, its gradient summed over the group
    kw = tp.copy_to_region(kw, g):narrow(1, self.kv_head * hd + 1, hd)
    vw = tp.copy_to_region(vw, g):narrow(1, self.kv_head * hd + 1, hd)
  end
  local k = F.linear(xin, kw):view(B, T, nkv, hd):transpose(2, 3)
  local v = F.linear(xin, vw):view(B, T, nkv, hd):transpose(2, 3)
  q = F.rope(q, { base = self.theta, start = start, scaling = self.rope_scaling })
  k = F.rope(k, { base = self.theta, start = start, scaling = self.rope_scaling })
  if kv then k, v = kv:append(self, k, v) end
  local y = recompute.attention(self, q, k, v, CAUSAL)
  return self.o_proj(y:transpose(2, 3):reshape(B, T, nq * hd))
end

local function llama_mlp(self, x)
  local xin = column_input(self.tp_ctx, x)
  return self.down_proj(F.swiglu(F.linear(xin, self.gate_proj.weight), F.linear(xin, self.up_proj.weight)))
end

local function llama_embed(self, idx, kv)
  local start = kv and kv.len or 0
  if start + idx:size(2) > self.config.max_seq_len then
    error(("Llama: sequence length %d is longer than max_seq_len %d"):format(start + idx:size(2),
      self.config.max_seq_len), 3)
  end
  return self.model.embed_tokens(idx)
end

local function llama_hidden(self, idx, kv)
  local x, pending = residual.run(self.model.layers:list(), llama_embed(self, idx, kv), kv)
  if kv then kv:advance(idx:size(2)) end
  local _, y = residual.norm(self.model.norm, x, pending)
  return y
end

--- parallel.kv_split(n_kv_heads, n) -> "split" (n_kv_heads divides by n:
-- each rank n_kv_heads / n of them), "replicate" (n divides by
-- n_kv_heads: each rank the one its queries use), or nil (neither).
function M.kv_split(n_kv, n)
  if n_kv % n == 0 then return "split" end
  if n % n_kv == 0 then return "replicate" end
  return nil
end

--- parallel.llama(model, group, sequence_parallel) -> model: the whole Llama
-- split in place across group (config checked by lt.models.llama).
function M.llama(model, g, sp)
  local cfg, n, r = model.config, g:size(), g:rank()
  local ctx = { group = g, n = n, rank = r, sp = false }
  local how = M.kv_split(cfg.n_kv_heads, n)
  for _, layer in ipairs(model.model.layers:list()) do
    local attn, mlp = layer.self_attn, layer.mlp
    attn.q_proj = tp.ColumnParallelLinear.from(attn.q_proj, g)
    if how == "split" then
      attn.k_proj = tp.ColumnParallelLinear.from(attn.k_proj, g)
      attn.v_proj = tp.ColumnParallelLinear.from(attn.v_proj, g)
      attn.n_kv = cfg.n_kv_heads / n
    else
      attn.kv_head = math.floor(r * cfg.n_kv_heads / n)
      attn.n_kv = 1
    end
    attn.o_proj = tp.RowParallelLinear.from(attn.o_proj, g)
    attn.n_heads = cfg.n_heads / n
    rawset(attn, "forward", llama_attention)
    mlp.gate_proj = tp.ColumnParallelLinear.from(mlp.gate_proj, g)
    mlp.up_proj = tp.ColumnParallelLinear.from(mlp.up_proj, g)
    mlp.down_proj = tp.RowParallelLinear.from(mlp.down_proj, g)
    rawset(mlp, "forward", llama_mlp)
    parallel_norm(layer.input_layernorm, "rms")
    parallel_norm(layer.post_attention_layernorm, "rms")
  end
  parallel_norm(model.model.norm, "rms")
  return finish(model, model.model, "embed_tokens", g, sp, llama_hidden, llama_embed, ctx)
end

return M
