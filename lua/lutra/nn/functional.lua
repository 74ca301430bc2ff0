--- lutra.nn.functional (lt.F): functions of neural networks that own no
-- parameters, as torch.nn.functional. The fused ones (layer_norm, rms_norm,
-- softmax, log_softmax, cross_entropy, rope, gelu, silu) are C kernels with
-- their own backward (host/autograd/norm.c, softmax.c, loss.c, rope.c, ...,
-- over the dispatch in host/ops/); the others compose tensor ops, whose
-- gradients autograd already knows.
local capi = require "lutra.capi"
local tensor = require "lutra.tensor"
local random = require "lutra.random"
local ffi, C, fail = capi.ffi, capi.C, capi.fail
local box = capi.tensor_box
local take, is_tensor = tensor.take, tensor.is_tensor

local F = {}

local function need(op, x, pos)
  if not is_tensor(x) then
    error(("bad argument #%d to '%s' (tensor expected, got %s)"):format(pos, op, type(x)), 3)
  end
end

local ACTIVATIONS = { none = 0, gelu = 1 }

-- opts, or {} for nil; anything else is the caller's error
local function opts_arg(op, opts, pos, known)
  if opts ~= nil and type(opts) ~= "table" then
    error(("bad argument #%d to '%s' (options table expected, got %s)"):format(pos, op, type(opts)), 3)
  end
  for k in pairs(known and opts or {}) do -- (a misspelt option would be silently ignored)
    if not known[k] then
      local names = {}
      for n in pairs(known) do names[#names + 1] = n end
      table.sort(names)
      error(("%s: unknown option '%s' (known: %s)"):format(op, tostring(k), table.concat(names, ", ")), 3)
    end
  end
  return opts or {}
end

--- F.linear(x, weight, bias, {activation = "none" | "gelu"}): x (..., in) @
-- weight(out, in)^T + bias(out), then the activation (GELU: the tanh
-- approximation, as F.gelu) -- one op (lt_linear): on a GPU the bias and
-- the GELU run inside cuBLASLt's product. A bias of another dtype is added
-- after the product (the result promoted, as x + bias would be).
function F.linear(x, weight, bias, opts)
  need("linear", x, 1)
  need("linear", weight, 2)
  opts = opts_arg("linear", opts, 4)
  local act = ACTIVATIONS[opts.activation or "none"]
  if not act then
    error(("linear: activation must be 'none' or 'gelu', got %s"):format(tostring(opts.activation)), 2)
  end
  if weight:dim() ~= 2 or x:dim() < 1 or x:size(-1) ~= weight:size(2) then
    error(("linear: input %s does not fit weight %s (out, in): the input's last dim must be in")
      :format(tostring(x:shape()), tostring(weight:shape())), 2)
  end
  if bias ~= nil and (not is_tensor(bias) or bias:dim() ~= 1 or bias:size(1) ~= weight:size(1)) then
    error(("linear: bias must be a (%d) tensor, got %s"):format(weight:size(1),
      is_tensor(bias) and tostring(bias:shape()) or type(bias)), 2)
  end
  if x.dtype ~= weight.dtype then
    error(("linear: the input is %s and the weight %s; convert them to one dtype"):format(x.dtype, weight.dtype), 2)
  end
  if (bias == nil or bias.dtype == x.dtype) and x:is_floating_point() then
    if C.lt_linear(x, weight, bias, act, box) ~= 0 then fail(2) end
    return take()
  end
  local y = tensor.matmul(x, weight:t())
  if bias ~= nil then y = y + bias end
  if act == 1 then y = y:gelu() end
  return y
end

--- F.mlp(x, fc_weight, fc_bias, proj_weight, proj_bias): GPT-2's MLP,
-- gelu(x fc_weight^T + fc_bias) proj_weight^T + proj_bias (GELU in its tanh
-- approximation), as one op (lt_mlp): x (..., in), fc_weight (hidden, in),
-- proj_weight (out, hidden), biases (hidden) and (out) or nil -> (..., out).
-- The same values and gradients as two F.linear calls; on a GPU the GELU's
-- backward and the first bias's gradient run inside the product that makes
-- the hidden gradient (cuBLASLt's DGELU_BGRAD, as NVIDIA Apex's
-- FusedDenseGeluDense), one pass over the hidden activations fewer. All
-- five tensors share one float dtype and one device (errors name them).
function F.mlp(x, fc_weight, fc_bias, proj_weight, proj_bias)
  need("mlp", x, 1)
  need("mlp", fc_weight, 2)
  need("mlp", proj_weight, 4)
  if fc_bias ~= nil then need("mlp", fc_bias, 3) end
  if proj_bias ~= nil then need("mlp", proj_bias, 5) end
  if C.lt_mlp(x, fc_weight, fc_bias, proj_weight, proj_bias, box) ~= 0 then fail(2) end
  return take()
end

--- F.embedding(ids, weight): rows of weight (V, C) for integer ids of any
-- shape (0-based, i32 or i64) -> (..., C). Its backward is a deterministic
-- scatter-add. An id outside [0, V) is an error naming it and its position.
function F.embedding(ids, weight)
  need("embedding", ids, 1)
  need("embedding", weight, 2)
  if weight:dim() ~= 2 then error("embedding: the weight must be (V, C), got " .. tostring(weight:shape()), 2) end
  local flat = ids:dim() == 1 and ids or ids:reshape(-1)
  if C.lt_embedding(weight, flat, box) ~= 0 then error(ffi.string(C.lt_last_error()), 2) end
  local rows = take()
  local shape = ids:shape()
  shape[#shape + 1] = weight:size(2)
  return rows:view(shape)
end

local function optional_tensor(op, v, pos)
  if v ~= nil and not is_tensor(v) then
    error(("bad argument #%d to '%s' (tensor or nil expected, got %s)"):format(pos, op, type(v)), 4)
  end
end

local function number_arg(op, name, v)
  if v ~= nil and (type(v) ~= "number" or v ~= v) then
    error(("%s: %s must be a number, got %s"):format(op, name, tostring(v)), 3) -- at the F function's caller
  end
end

local function whole_arg(op, name, v, deeper)
  if v ~= nil and (type(v) ~= "number" or v ~= math.floor(v) or math.abs(v) > 2 ^ 53) then
    error(("%s: %s must be a whole number, got %s"):format(op, name, tostring(v)), 3 + (deeper or 0))
  end
end

--- F.layer_norm(x, weight, bias, eps): LayerNorm over the last dim (eps default 1e-5).
function F.layer_norm(x, weight, bias, eps)
  need("layer_norm", x, 1)
  optional_tensor("layer_norm", weight, 2)
  optional_tensor("layer_norm", bias, 3)
  number_arg("layer_norm", "eps", eps)
  if C.lt_layer_norm(x, weight, bias, eps or 1e-5, box) ~= 0 then fail(2) end
  return take()
end

local h_box = ffi.new("lt_tensor*[1]")
local function h_take() return ffi.gc(h_box[0], C.lt_tensor_release) end

--- F.add_layer_norm(x, residual, weight, bias, eps) -> h, y: h = x + residual
-- and y = layer_norm(h) in one pass (a pre-norm block's residual add and
-- its next norm; eps default 1e-5). x and residual of one shape and dtype.
function F.add_layer_norm(x, res, weight, bias, eps)
  need("add_layer_norm", x, 1)
  need("add_layer_norm", res, 2)
  optional_tensor("add_layer_norm", weight, 3)
  optional_tensor("add_layer_norm", bias, 4)
  number_arg("add_layer_norm", "eps", eps)
  if C.lt_add_norm(0, x, res, weight, bias, eps or 1e-5, h_box, box) ~= 0 then fail(2) end
  local h = h_take()
  return h, take()
end

--- F.add_rms_norm(x, residual, weight, eps) -> h, y: h = x + residual and
-- y = rms_norm(h) in one pass (eps default 1e-6).
function F.add_rms_norm(x, res, weight, eps)
  need("add_rms_norm", x, 1)
  need("add_rms_norm", res, 2)
  optional_tensor("add_rms_norm", weight, 3)
  number_arg("add_rms_norm", "eps", eps)
  if C.lt_add_norm(1, x, res, weight, nil, eps or 1e-6, h_box, box) ~= 0 then fail(2) end
  local h = h_take()
  return h, take()
end

--- F.rms_norm(x, weight, eps): RMSNorm over the last dim (eps default 1e-6).
function F.rms_norm(x, weight, eps)
  need("rms_norm", x, 1)
  optional_tensor("rms_norm", weight, 2)
  number_arg("rms_norm", "eps", eps)
  if C.lt_rms_norm(x, weight, eps or 1e-6, box) ~= 0 then fail(2) end
  return take()
end

--- F.gelu(x): GELU with the tanh approximation (GPT-2's).
function F.gelu(x)
  need("gelu", x, 1)
  return x:gelu()
end

--- F.silu(x) = x * sigmoid(x).
function F.silu(x)
  need("silu", x, 1)
  return x:silu()
end

--- F.swiglu(gate, up) = silu(gate) * up (Shazeer 2020; Llama's MLP).
function F.swiglu(gate, up)
  need("swiglu", gate, 1)
  return gate:silu() * up
end

--- F.relu(x) = max(x, 0), with gradient 0 at 0 (as torch).
function F.relu(x)
  need("relu", x, 1)
  return tensor.where(x:gt(0), x, 0)
end

local function softmax(op, x, dim, log)
  need(op, x, 1)
  local d = tensor.cdim(op, x, dim or -1, 3)
  if C.lt_softmax(x, d, log, box) ~= 0 then fail(3) end
  return take()
end

--- F.softmax(x, dim): along dim (default -1); an all -inf row gives zeros.
function F.softmax(x, dim) return softmax("softmax", x, dim, 0) end

--- F.scaled_softmax(scores, scale[, {causal = false}]) = softmax(scale *
-- scores) over the last dim in one pass. causal: scores are (..., T, S) and
-- query t sees keys up to t + S - T (aligned at the end, as
-- scaled_dot_product_attention's mask); masked entries give 0 and get no
-- gradient, and the scaled or masked scores are never written out.
function F.scaled_softmax(x, scale, opts)
  need("scaled_softmax", x, 1)
  if type(scale) ~= "number" then error("scaled_softmax: scale must be a number", 2) end
  if opts ~= nil and type(opts) ~= "table" then error("scaled_softmax: options must be a table {causal = ...}", 2) end
  if C.lt_scaled_softmax(x, scale, opts and opts.causal and 1 or 0, box) ~= 0 then fail(2) end
  return take()
end
--- F.log_softmax(x, dim)
function F.log_softmax(x, dim) return softmax("log_softmax", x, dim, 1) end

local REDUCTIONS = { mean = 0, sum = 1, none = 2 }
local count_out = ffi.new("int64_t[1]")

-- a cross-entropy's ignore_index, whether to count, and classes, checked (errors at the op's caller)
local function ce_options(op, opts)
  local ignore = opts.ignore_index or -100
  whole_arg(op, "ignore_index", ignore, 1)
  if opts.count ~= nil and type(opts.count) ~= "boolean" then error(op .. ": count must be true or false", 3) end
  local classes = opts.classes or 0
  whole_arg(op, "classes", classes, 1)
  return ignore, opts.count ~= false, classes
end

--- F.cross_entropy(logits, targets, {ignore_index = -100, reduction = "mean", count = true, classes = V})
-- -> loss, count. logits (N, V) (or (B, T, V) with targets (B, T)); targets
-- hold integer class ids. count is the number of targets that count (not
-- ignored); the mean is over them, and 0 with zero gradients when none count.
-- count = false returns the loss alone: on a GPU nothing then waits for the
-- device (a bad target is reported at the next read from it). classes: only
-- the first classes columns are logits; the rest are padding (a vocabulary
-- padded to a multiple of 128, as llm.c does) and get zero gradient.
function F.cross_entropy(logits, targets, opts)
  need("cross_entropy", logits, 1)
  need("cross_entropy", targets, 2)
  opts = opts_arg("cross_entropy", opts, 3)
  local red = REDUCTIONS[opts.reduction or "mean"]
  if not red then error("cross_entropy: reduction must be 'mean', 'sum' or 'none'", 2) end
  local ignore, want_count, classes = ce_options("cross_entropy", opts)
  local shape = targets:shape()
  if logits:dim() > 2 then
    logits = logits:reshape(-1, logits:size(-1))
    targets = targets:reshape(-1)
  end
  if C.lt_cross_entropy(logits, targets, ignore, red, classes, box, want_count and count_out or nil) ~= 0 then
    fail(2)
  end
  local loss = take()
  if red == 2 and #shape > 1 then loss = loss:view(shape) end
  if not want_count then return loss end
  return loss, tonumber(count_out[0])
end

--- F.linear_cross_entropy(x, weight, targets, {ignore_index = -100, reduction = "mean", count = true, classes = V})
-- -> loss, count: F.cross_entropy(F.linear(x, weight), targets) as one op,
-- for a model's head (as Apple's Cut Cross-Entropy names it). x (N, in) or
-- (B, T, in), weight (V, in) without bias, targets x's leading dims;
-- reduction "mean" or "sum"; the other options as F.cross_entropy's. The
-- logits are never returned: when a gradient is needed the forward writes
-- their gradient over them (llm.c's fused classifier: one pass over the
-- logits on a GPU, no second (N, V) buffer), and the backward scales the
-- two products by the loss's gradient.
function F.linear_cross_entropy(x, weight, targets, opts)
  need("linear_cross_entropy", x, 1)
  need("linear_cross_entropy", weight, 2)
  need("linear_cross_entropy", targets, 3)
  opts = opts_arg("linear_cross_entropy", opts, 4)
  local red = REDUCTIONS[opts.reduction or "mean"]
  if red ~= 0 and red ~= 1 then
    error("linear_cross_entropy: reduction must be 'mean' or 'sum' (for a loss per row: F.linear, then F.cross_entropy)", 2)
  end
  local ignore, want_count, classes = ce_options("linear_cross_entropy", opts)
  if C.lt_linear_cross_entropy(x, weight, targets, ignore, red, classes, box, want_count and count_out or nil) ~= 0 then
    fail(2)
  end
  local loss = take()
  if not want_count then return loss end
  return loss, tonumber(count_out[0])
end

local rope_scaling = ffi.new("lt_rope_scaling[1]")
local ROPE_KINDS = { linear = C.LT_ROPE_LINEAR, llama3 = C.LT_ROPE_LLAMA3 }

--- F.rope_scaling(t) -> the lt_rope_scaling F.rope takes, from a Hugging
-- Face rope_scaling table: {rope_type (or type) = "linear", factor =} or
-- {rope_type = "llama3", factor =, low_freq_factor =, high_freq_factor =,
-- original_max_position_embeddings =}; nil for nil or type "default".
-- Raises "rope: ..." naming an unknown type or a missing or bad field.
function F.rope_scaling(t)
  if t == nil then return nil end
  if type(t) ~= "table" then error("rope: scaling must be a table (Hugging Face's rope_scaling)", 3) end
  local kind = t.rope_type or t.type
  if kind == "default" then return nil end
  if not ROPE_KINDS[kind] then
    error(("rope: scaling type %s is not supported (linear or llama3)"):format(tostring(kind)), 3)
  end
  local function num(k, default)
    local v = t[k]
    if v == nil then v = default end
    if type(v) ~= "number" or not (v > 0) then
      error(("rope: %s scaling needs %s > 0, got %s"):format(kind, k, tostring(v)), 4)
    end
    return v
  end
  local sc = rope_scaling[0]
  sc.kind, sc.factor = ROPE_KINDS[kind], num("factor")
  if kind == "llama3" then
    sc.low_freq_factor, sc.high_freq_factor = num("low_freq_factor"), num("high_freq_factor")
    sc.original_max = num("original_max_position_embeddings")
  else
    sc.low_freq_factor, sc.high_freq_factor, sc.original_max = 1, 1, 1
  end
  return rope_scaling
end

--- F.rope(x, {base = 10000, start = 0, scaling =}) -> x (..., T, D) with
-- rotary position embeddings (lt_rope: Llama's half-split convention), the
-- frequencies scaled as scaling says (F.rope_scaling's table: Hugging
-- Face's rope_scaling, linear or llama3). Differentiable.
function F.rope(x, opts)
  need("rope", x, 1)
  opts = opts or {}
  number_arg("rope", "base", opts.base)
  whole_arg("rope", "start", opts.start)
  local sc = F.rope_scaling(opts.scaling)
  if C.lt_rope_scaled(x, opts.base or 10000, opts.start or 0, sc, box) ~= 0 then fail(2) end
  return take()
end

local FUSED_MAX_HS = 256 -- LT_ATTN_MAX_HS (kernels/attention_rows.h)

--- F.fused_attention: whether scaled_dot_product_attention fuses on a GPU
-- by default (off until a GPU run has measured the fused kernel against
-- the composed path: bench/ops_gpu.lua prints both).
F.fused_attention = false

--- F.library_attention: whether scaled_dot_product_attention on bf16/f16
-- GPU tensors goes to the vendor library first (cuDNN's fused flash
-- attention: lt_attention_library). Where the library refuses a shape the
-- call falls back (below) and says why once per reason on stderr (the
-- first shape refused for it named: reasons that differ only in numbers
-- are one).
F.library_attention = true

local library_noted = {}

-- lt_attention_library's result, or nil after noting why it did not run
local function library_attention(q, k, v, scale, causal)
  local rc = C.lt_attention_library(q, k, v, scale, causal and 1 or 0, box)
  if rc == 0 then return take() end
  local why = ffi.string(C.lt_last_error())
  if rc ~= C.LT_ERR_UNSUPPORTED then error(why, 3) end
  local reason = why:gsub("%d+", "#")
  if not library_noted[reason] then
    library_noted[reason] = true
    io.stderr:write("lutra: ", why, "; using lutra's attention instead (noted once)\n")
  end
end

local SDPA_OPTIONS = { causal = true, scale = true, fused = true, library = true }

--- F.scaled_dot_product_attention(q, k, v, {causal = false, scale = 1/sqrt(HS), fused = false, library = nil})
-- q (B, NH, T, HS), k and v (B, NKV, S, HS) with NKV dividing NH (grouped-
-- query attention repeats each K/V head NH/NKV times). The causal mask lets
-- query t see keys up to t + S - T (aligned at the end, so a query after a
-- KV cache sees the whole prefix; the same as torch's when S == T). A row
-- whose every score is masked gives zeros. On a GPU, bf16/f16 inputs go to
-- cuDNN's flash attention first (F.library_attention); library = true asks
-- for the library path (bf16/f16; on the CPU an f64 reference) and raises
-- its refusal, library = false never takes it. An unknown option (torch's
-- is_causal) is an error. fused = true (head sizes up to
-- 256) runs the fused kernel: one pass, nothing of size (T, S) stored,
-- forward and backward (on a GPU, bf16/f16 with head size 32, 64 or 128 on
-- tensor cores, FlashAttention-2's tiling; otherwise a row per thread in
-- f32); otherwise (fused = false, the default on the CPU, where OpenBLAS
-- products are 3-5x faster, and on a GPU unless F.fused_attention; fused
-- chooses between lutra's kernels, so fused = false still takes the
-- library first) it runs as matmul, scaled_softmax, matmul.
function F.scaled_dot_product_attention(q, k, v, opts)
  need("scaled_dot_product_attention", q, 1)
  need("scaled_dot_product_attention", k, 2)
  need("scaled_dot_product_attention", v, 3)
  opts = opts_arg("scaled_dot_product_attention", opts, 4, SDPA_OPTIONS)
  if q:dim() ~= 4 or k:dim() ~= 4 or v:dim() ~= 4 then
    error(("scaled_dot_product_attention: expects (B, NH, T, HS) tensors, got %s, %s, %s")
      :format(tostring(q:shape()), tostring(k:shape()), tostring(v:shape())), 2)
  end
  for i, t in ipairs { q, k, v } do
    if not t:is_floating_point() then
      error(("scaled_dot_product_attention: %s must be a float tensor, got %s"):format(({ "q", "k", "v" })[i], t.dtype), 2)
    end
  end
  local B, NH, T, HS = q:size(1), q:size(2), q:size(3), q:size(4)
  local NKV, S, Bk, HSV = k:size(2), k:size(3), k:size(1), v:size(4)
  local function bad(what)
    error(("scaled_dot_product_attention: %s: q %s, k %s, v %s"):format(what, tostring(q:shape()),
      tostring(k:shape()), tostring(v:shape())), 3)
  end
  if k:size(4) ~= HS then bad("q and k have different head sizes") end
  if v:size(2) ~= NKV or v:size(3) ~= S then bad("k and v have different heads or lengths") end
  if NKV == 0 or NH % NKV ~= 0 then bad("the K/V heads must divide the query heads") end
  if (Bk ~= B and Bk ~= 1) or v:size(1) ~= Bk then bad("k and v need q's batch (or 1)") end
  if opts.scale ~= nil and type(opts.scale) ~= "number" then
    error("scaled_dot_product_attention: scale must be a number, got " .. type(opts.scale), 2)
  end
  if opts.causal ~= nil and type(opts.causal) ~= "boolean" then
    error("scaled_dot_product_attention: causal must be true or false", 2)
  end
  local scale = opts.scale or (HS > 0 and 1 / math.sqrt(HS) or 1)
  if opts.library ~= nil and type(opts.library) ~= "boolean" then
    error("scaled_dot_product_attention: library must be true or false", 2)
  end
  if opts.library then -- asked for: a refusal is the caller's error
    if C.lt_attention_library(q, k, v, scale, opts.causal and 1 or 0, box) ~= 0 then fail(2) end
    return take()
  end
  local fused = opts.fused
  if fused ~= nil and type(fused) ~= "boolean" then
    error("scaled_dot_product_attention: fused must be true or false", 2)
  end
  if opts.library == nil and fused ~= true and F.library_attention and q.device ~= "cpu"
    and (q.dtype == "bf16" or q.dtype == "f16") and Bk == B and HSV == HS and HS % 8 == 0
    and not (opts.causal and T ~= S) then -- (queries after a KV cache stay with lutra's kernels)
    local y = library_attention(q, k, v, scale, opts.causal)
    if y then return y end
  end
  if fused == nil then fused = F.fused_attention and q.device ~= "cpu" end
  -- the fused kernel takes k and v of q's batch and head size; other inputs run composed
  if fused and HS <= FUSED_MAX_HS and Bk == B and HSV == HS then
    -- fused: the (T, S) scores are never stored (lt_attention, FlashAttention's online softmax)
    if C.lt_attention(q, k, v, scale, opts.causal and 1 or 0, box) ~= 0 then fail(2) end
    return take()
  end
  if NKV ~= NH then
    local rep = NH / NKV
    k = k:unsqueeze(3):expand(Bk, NKV, rep, S, HS):reshape(Bk, NH, S, HS)
    v = v:unsqueeze(3):expand(Bk, NKV, rep, S, HSV):reshape(Bk, NH, S, HSV)
  end
  -- the scale and the mask inside the softmax: one pass over the (T, S) scores
  local probs = F.scaled_softmax(tensor.matmul(q, k:transpose(3, 4)), scale, { causal = opts.causal })
  return tensor.matmul(probs, v)
end

--- F.dropout(x, p, {training = true, generator = g}): zeroes each element
-- with probability p and scales the rest by 1/(1-p); the mask is drawn from
-- the Philox generator, so a seed and step reproduce it. Identity when not
-- training or p == 0.
function F.dropout(x, p, opts)
  need("dropout", x, 1)
  opts = opts or {}
  if type(p) ~= "number" or not (p >= 0 and p <= 1) then error("dropout: p must be in [0, 1], got " .. tostring(p), 2) end
  if opts.training == false or p == 0 then return x end
  if p == 1 then return x * 0 end
  local keep = random.rand(x:shape(), { device = x.device, generator = opts.generator }):ge(p)
  return x * keep:to(x.dtype) * (1 / (1 - p))
end

return F
