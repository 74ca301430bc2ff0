--- lutra.hf (lt.hf): Hugging Face model directories (a `config.json` and
-- `model.safetensors`, or sharded weights with model.safetensors.index.json:
-- lutra.safetensors_sharded) to and from lutra models, for GPT2LMHeadModel
-- and LlamaForCausalLM.
--
--   lt.hf.export(model, "out/gpt2-pydocs")          -- writes config.json, model.safetensors
--   lt.hf.export(model, "out/big", { max_shard_bytes = 2e9 })  -- model-0000i-of-0000N + the index
--   local model = lt.hf.load("out/gpt2-pydocs")     -- a lutra GPT-2 or Llama (either layout)
--
-- Layouts (transformers' modeling_gpt2.py and modeling_llama.py):
-- - GPT-2: names transformer.wte.weight, transformer.h.<i>.attn.c_attn.weight,
--   ...; the Conv1D weights (attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj)
--   are stored (in, out), the transpose of lutra's Linear (out, in). Loading
--   also takes names without the "transformer." prefix (GPT2Model files) and
--   ignores the attn.bias / attn.masked_bias mask buffers older files hold.
-- - Llama: the same names and (out, in) layout as lutra's; rotary embeddings
--   in the rotate-half convention both use, config.json's rope_scaling
--   ("llama3" or "linear": F.rope_scaling) the model's rope_scaling.
-- - The head: config.json's tie_word_embeddings (default true for GPT-2,
--   false for Llama, as transformers' configs) gives the model's
--   tie_embeddings. Tied, the head is the token embedding, one tensor
--   counted once, and the file holds no lm_head.weight (one that holds it
--   with the embedding's data is taken, other data refused); untied,
--   lm_head.weight is a tensor of its own, which the file must hold.
-- Errors name the file and the field or tensor: a missing config field, an
-- unknown architecture, a missing, unexpected or mis-shaped tensor, a dtype
-- safetensors cannot hold.
local tensor = require "lutra.tensor"
local autograd = require "lutra.autograd"
local models = require "lutra.models"
local sharded = require "lutra.safetensors_sharded"
local json = require "lutra.json"
local capi = require "lutra.capi"
local comm = require "lutra.dist.comm"
local records = require "lutra.dist.tp.records"
local F = require "lutra.nn.functional"
local tp_state = require "lutra.dist.tp.state"
local ppck = require "lutra.dist.pp.ckpt"
local C = capi.C

local M = {}

local CONV1D = { ["attn.c_attn.weight"] = true, ["attn.c_proj.weight"] = true, ["mlp.c_fc.weight"] = true,
  ["mlp.c_proj.weight"] = true }

local function is_conv1d(name) return CONV1D[name:match("^transformer%.h%.%d+%.(.+)$") or ""] == true end

local function kind_of(model)
  local cfg = model.config or {}
  if cfg.n_layer and cfg.n_embd then return "gpt2" end
  if cfg.n_layers and cfg.dim then return "llama" end
  return nil
end

local DTYPE_NAMES = { f32 = "float32", bf16 = "bfloat16", f16 = "float16" }

local function write_text(path, text)
  if C.lt_write_file_atomic(path, text, #text) ~= 0 then
    error("hf.export: " .. capi.ffi.string(C.lt_last_error()), 3)
  end
end

--- lt.hf.export(model, dir[, {dtype = the model's, max_shard_bytes = 5e9}]):
-- writes dir/config.json and dir/model.safetensors in the Hugging Face
-- layout of the model's kind (GPT-2 or Llama), or, when the weights pass
-- max_shard_bytes, shards of at most that with model.safetensors.index.json
-- (save_pretrained's files; lutra.safetensors_sharded.write); dtype f32,
-- bf16 or f16 converts the weights. A padded
-- vocabulary (pad_vocab, or tensor parallelism's) is cut back to vocab_size rows. Returns dir.
-- A tensor-parallel model (model.tp_group) exports whole: every rank of its
-- TP group calls it (each sharded tensor is gathered in turn,
-- tp.full_state_dict) and the job's rank 0 (TP rank 0 of DP rank 0 in
-- lt.dist.mesh's order) alone writes; the other DP replicas need not call it.
-- A pipeline model (model.pp) exports whole too: every rank of the job
-- calls it; each stage's tensors are sent to rank 0 one at a time
-- (lutra.dist.pp.ckpt.full_state_dict: the last stage's tied head copy left
-- out), which writes the files one process would.
function M.export(model, dir, opts)
  opts = opts or {}
  local kind = type(model) == "table" and kind_of(model)
  if not kind then error("hf.export: expects a lutra GPT-2 or Llama model (one with a config)", 2) end
  if type(dir) ~= "string" or dir == "" then error("hf.export: dir must be a non-empty string", 2) end
  if opts.dtype ~= nil and not DTYPE_NAMES[opts.dtype] then -- (before any gather: on every rank)
    error(("hf.export: dtype must be f32, bf16 or f16, got %s"):format(tostring(opts.dtype)), 2)
  end
  local tp_group = records.group(model)
  local pp = rawget(model, "pp")
  local writes = not (tp_group or pp) or comm.rank() == 0
  local made = not writes or C.lt_mkdir_p(dir) == 0
  local why = not made and ("hf.export: " .. capi.ffi.string(C.lt_last_error())) or nil
  if pp then -- (every rank learns of rank 0's failure before the stages send it their tensors)
    local bad, msg = comm.first_error(made, why)
    if bad then error(msg, 2) end
  elseif not made then
    error(why, 2)
  end
  local cfg = model.config
  local sd = model:state_dict()
  if pp then -- every stage's whole tensors, gathered to rank 0
    sd = ppck.full_state_dict(model, { keep = writes })
    if not writes then return dir end
  elseif tp_group then -- the whole tensors (kept where they are written)
    sd = tp_state.full_state_dict(model, { keep = writes })
    if not writes then return dir end
  end
  local dtype = opts.dtype or sd[next(sd)].dtype
  if not DTYPE_NAMES[dtype] then error(("hf.export: dtype must be f32, bf16 or f16, got %s"):format(tostring(dtype)), 2) end
  local out = {}
  local tied = cfg.tie_embeddings ~= false
  if kind == "llama" then tied = cfg.tie_embeddings == true end
  autograd.no_grad(function()
    for name, t in pairs(sd) do
      local v = t:to { device = "cpu", dtype = dtype }
      if name == "lm_head.weight" and tied then
        v = nil -- (not in a tied model's state dict: the embedding's, stored once as Hugging Face does)
      elseif (name == "transformer.wte.weight" or name == "model.embed_tokens.weight" or name == "lm_head.weight")
          and (cfg.padded_vocab_size or cfg.vocab_size) ~= cfg.vocab_size then
        v = v:narrow(1, 1, cfg.vocab_size) -- (the padding rows: not part of the model)
      elseif kind == "gpt2" and is_conv1d(name) then
        v = v:t()
      end
      if v then out[name] = v:contiguous() end
    end
  end)
  local ok, err = pcall(sharded.write, dir, out, { max_shard_bytes = opts.max_shard_bytes })
  if not ok then error(tostring(err):gsub("^.-hf%.export: ", "hf.export: "), 2) end
  local config
  if kind == "gpt2" then
    config = {
      architectures = { "GPT2LMHeadModel" }, model_type = "gpt2", vocab_size = cfg.vocab_size,
      n_positions = cfg.block_size, n_ctx = cfg.block_size, n_embd = cfg.n_embd, n_layer = cfg.n_layer,
      n_head = cfg.n_head, activation_function = "gelu_new", layer_norm_epsilon = 1e-5,
      resid_pdrop = cfg.dropout or 0, embd_pdrop = cfg.dropout or 0, attn_pdrop = 0, tie_word_embeddings = tied,
      torch_dtype = DTYPE_NAMES[dtype], initializer_range = 0.02,
    }
    if cfg.vocab_size > 50256 then config.bos_token_id, config.eos_token_id = 50256, 50256 end -- <|endoftext|>
  else
    config = {
      architectures = { "LlamaForCausalLM" }, model_type = "llama", vocab_size = cfg.vocab_size,
      hidden_size = cfg.dim, intermediate_size = cfg.ffn_dim, num_hidden_layers = cfg.n_layers,
      num_attention_heads = cfg.n_heads, num_key_value_heads = cfg.n_kv_heads,
      max_position_embeddings = cfg.max_seq_len, rms_norm_eps = cfg.norm_eps, rope_theta = cfg.rope_theta,
      hidden_act = "silu", tie_word_embeddings = tied, attention_bias = false, mlp_bias = false,
      torch_dtype = DTYPE_NAMES[dtype], initializer_range = 0.02, rope_scaling = cfg.rope_scaling,
      head_dim = cfg.head_dim or cfg.dim / cfg.n_heads,
    }
  end
  write_text(dir .. "/config.json", json.encode(config) .. "\n")
  return dir
end

local function read_config(dir, file)
  local path = file or (dir .. "/config.json")
  local f = io.open(path, "rb")
  if not f then error(("hf.load: %s is missing"):format(path), 3) end
  local text = f:read("*a")
  f:close()
  local ok, cfg = pcall(json.decode, text)
  if not ok or type(cfg) ~= "table" then error(("hf.load: %s is not a JSON object"):format(path), 3) end
  return cfg, path
end

-- a numeric field: whole sizes (kind "size", >= 1) or positive reals ("real")
local function field(cfg, path, name, default, kind)
  local v = cfg[name]
  if v == nil or v == json.null then
    if default ~= nil then return default end
    error(("hf.load: %s: the field '%s' is missing"):format(path, name), 4)
  end
  if type(v) ~= "number" or v ~= v then
    error(("hf.load: %s: the field '%s' must be a number, got %s"):format(path, name, tostring(v)), 4)
  end
  if (kind or "size") == "size" and (v < 1 or v ~= math.floor(v) or v > 2 ^ 31) then
    error(("hf.load: %s: the field '%s' must be a whole number in 1..2^31, got %s"):format(path, name, tostring(v)), 4)
  end
  if kind == "real" and not (v > 0 and v < math.huge) then
    error(("hf.load: %s: the field '%s' must be a positive number, got %s"):format(path, name, tostring(v)), 4)
  end
  return v
end

local function flag(cfg, path, name)
  local v = cfg[name]
  if v ~= nil and v ~= json.null and type(v) ~= "boolean" then
    error(("hf.load: %s: the field '%s' must be true or false, got %s"):format(path, name, tostring(v)), 4)
  end
  return v == true
end

local function architecture(cfg, path)
  local archs = cfg.architectures
  if type(archs) == "string" then archs = { archs } end
  if archs ~= nil and archs ~= json.null and type(archs) ~= "table" then
    error(("hf.load: %s: the field 'architectures' must be a list of names"):format(path), 3)
  end
  local arch = archs and archs ~= json.null and archs[1] or nil
  if arch == "GPT2LMHeadModel" or (arch == nil and cfg.model_type == "gpt2") then return "gpt2" end
  if arch == "LlamaForCausalLM" or (arch == nil and cfg.model_type == "llama") then return "llama" end
  error(("hf.load: %s: architectures %s, model_type %s: lutra reads GPT2LMHeadModel and LlamaForCausalLM")
    :format(path, tostring(arch), tostring(cfg.model_type)), 3)
end

--- lt.hf.config(dir[, file]) -> kind ("gpt2" or "llama"), the lutra model config
-- read from dir/config.json (tie_embeddings from tie_word_embeddings: true
-- where missing for GPT-2, false for Llama, as transformers' defaults).
-- Raises naming the field that is missing or that lutra's models do not
-- support. file: the config's path, when it is not dir/config.json.
function M.config(dir, file)
  local cfg, path = read_config(dir, file)
  local kind = architecture(cfg, path)
  if kind == "gpt2" then
    local act = cfg.activation_function or "gelu_new"
    if act ~= "gelu_new" and act ~= "gelu_pytorch_tanh" then
      error(("hf.load: %s: activation_function %s is not supported (lutra's GPT-2 uses the tanh GELU, gelu_new)")
        :format(path, tostring(act)), 2)
    end
    local eps = field(cfg, path, "layer_norm_epsilon", 1e-5, "real")
    if math.abs(eps - 1e-5) > 1e-12 then
      error(("hf.load: %s: layer_norm_epsilon %g is not supported (lutra's GPT-2 uses 1e-5)"):format(path, eps), 2)
    end
    local out = {
      n_layer = field(cfg, path, "n_layer"), n_head = field(cfg, path, "n_head"), n_embd = field(cfg, path, "n_embd"),
      vocab_size = field(cfg, path, "vocab_size"), block_size = field(cfg, path, "n_positions"),
      tie_embeddings = cfg.tie_word_embeddings == nil or cfg.tie_word_embeddings == json.null or
        flag(cfg, path, "tie_word_embeddings"),
    }
    if out.n_embd % out.n_head ~= 0 then
      error(("hf.load: %s: n_embd %d is not a multiple of n_head %d"):format(path, out.n_embd, out.n_head), 2)
    end
    return kind, out
  end
  -- rope_scaling: Llama 3.1's "llama3" and "linear" (F.rope_scaling); others named and refused
  local scaling = cfg.rope_scaling
  if scaling == json.null then scaling = nil end
  if scaling ~= nil then
    local sok, serr = pcall(F.rope_scaling, scaling)
    if not sok then
      error(("hf.load: %s: rope_scaling: %s"):format(path, tostring(serr):gsub("^.-rope: ", "")), 2)
    end
  end
  if flag(cfg, path, "attention_bias") or flag(cfg, path, "mlp_bias") then
    error(("hf.load: %s: attention_bias / mlp_bias are not supported (lutra's Llama has no biases)"):format(path), 2)
  end
  if cfg.hidden_act and cfg.hidden_act ~= "silu" then
    error(("hf.load: %s: hidden_act %s is not supported (SwiGLU with silu)"):format(path, tostring(cfg.hidden_act)), 2)
  end
  if cfg.sliding_window ~= nil and cfg.sliding_window ~= json.null then
    error(("hf.load: %s: sliding_window is not supported (lutra's Llama has full attention)"):format(path), 2)
  end
  local heads = field(cfg, path, "num_attention_heads")
  local out = {
    dim = field(cfg, path, "hidden_size"), ffn_dim = field(cfg, path, "intermediate_size"),
    n_layers = field(cfg, path, "num_hidden_layers"), n_heads = heads,
    n_kv_heads = field(cfg, path, "num_key_value_heads", heads), vocab_size = field(cfg, path, "vocab_size"),
    max_seq_len = field(cfg, path, "max_position_embeddings", 2048),
    norm_eps = field(cfg, path, "rms_norm_eps", 1e-6, "real"), rope_theta = field(cfg, path, "rope_theta", 10000, "real"),
    tie_embeddings = flag(cfg, path, "tie_word_embeddings"), rope_scaling = scaling,
  }
  -- head_dim: the heads' width where it is not hidden_size / heads (Mistral-Nemo's, Qwen3's)
  local hd = field(cfg, path, "head_dim", json.null)
  if hd ~= json.null and hd * out.n_heads ~= out.dim then out.head_dim = hd end
  local width = out.head_dim or out.dim / out.n_heads
  if width ~= math.floor(width) or out.n_heads % out.n_kv_heads ~= 0 or width % 2 ~= 0 then
    error(("hf.load: %s: hidden_size %d, num_attention_heads %d and num_key_value_heads %d do not fit (an even head size, key/value heads dividing heads)")
      :format(path, out.dim, out.n_heads, out.n_kv_heads), 2)
  end
  return kind, out
end

-- the file's tensors under lutra's names, in lutra's layout
local function gpt2_tensors(file, path)
  local out = {}
  for name, t in pairs(file) do
    local full = name
    if not name:match("^transformer%.") and name ~= "lm_head.weight" then
      full = "transformer." .. name
      if file[full] ~= nil then
        error(("hf.load: %s holds both %s and %s"):format(path, name, full), 4)
      end
    end
    if full:match("%.attn%.bias$") and t:dim() == 4 or full:match("%.attn%.masked_bias$") then
      full = nil -- the causal-mask buffers of older files
    elseif is_conv1d(full) then
      if t:dim() ~= 2 then error(("hf.load: %s: %s should be 2-D, got %s"):format(path, name, tostring(t:shape())), 4) end
      t = t:t():contiguous()
    end
    if full then out[full] = t end
  end
  return out
end

--- lt.hf.load(dir[, {dtype = "f32", device = "cpu", pad_vocab =}]) -> model:
-- the GPT-2 or Llama that dir/config.json describes, with the weights of
-- dir/model.safetensors or of the shards dir/model.safetensors.index.json
-- maps (lutra.safetensors_sharded.read). Raises naming the file and field
-- or tensor (a shard the index names that is missing among them).
function M.load(dir, opts)
  opts = opts or {}
  if type(dir) ~= "string" then error("hf.load: dir must be a string", 2) end
  if opts.dtype ~= nil and not (DTYPE_NAMES[opts.dtype] or opts.dtype == "f64") then
    error(("hf.load: dtype must be f32, bf16, f16 or f64, got %s"):format(tostring(opts.dtype)), 2)
  end
  local kind, mcfg = M.config(dir)
  local ok, file, paths = pcall(sharded.read, dir, "hf.load")
  if not ok then error(file, 2) end
  local wpath = #paths == 1 and paths[1] or (dir .. "/" .. sharded.INDEX) -- (named in the errors below)
  -- the number of layers the file holds, before building a model of the config's size
  local layers, pattern = -1, kind == "gpt2" and "h%.(%d+)%." or "^model%.layers%.(%d+)%."
  for name, t in pairs(file) do
    local i = tonumber(name:match(pattern))
    if i and i > layers then layers = i end
    if kind == "llama" and name:match("rotary_emb%.inv_freq$") then file[name] = nil end -- a buffer older files hold
  end
  local want = kind == "gpt2" and mcfg.n_layer or mcfg.n_layers
  if layers + 1 ~= want then
    error(("hf.load: %s/config.json: %s is %d but %s holds %d layers"):format(dir,
      kind == "gpt2" and "n_layer" or "num_hidden_layers", want, wpath, layers + 1), 2)
  end
  local model, tensors
  local embed = kind == "gpt2" and "transformer.wte.weight" or "model.embed_tokens.weight"
  if kind == "gpt2" then
    mcfg.pad_vocab = opts.pad_vocab
    model = models.gpt2(mcfg) -- config.json's values were checked above
    tensors = gpt2_tensors(file, wpath)
  else
    model = models.llama(mcfg)
    tensors = file
  end
  local head = tensors["lm_head.weight"]
  if mcfg.tie_embeddings then
    -- one tensor: a file may store it under both names (with the same data) or, rarely, as the head only
    local stored = tensors[embed]
    if head and stored and (tostring(head:shape()) ~= tostring(stored:shape()) or
        (head:to("f64") - stored:to("f64")):abs():max():item() ~= 0) then
      error(("hf.load: %s: lm_head.weight differs from %s, and %s/config.json ties them (tie_word_embeddings)")
        :format(wpath, embed, dir), 2)
    end
    tensors[embed] = stored or head
    tensors["lm_head.weight"] = nil
  elseif not head then
    error(("hf.load: %s/config.json: tie_word_embeddings is false but %s holds no lm_head.weight"):format(dir, wpath), 2)
  end
  if kind == "gpt2" then
    for _, name in ipairs { "transformer.wte.weight", "lm_head.weight" } do
      local w = tensors[name]
      if w and mcfg.pad_vocab and w:dim() == 2 and w:size(1) == mcfg.vocab_size then
        local padded = tensor.zeros({ model.config.padded_vocab_size, w:size(2) }, { dtype = w.dtype })
        padded:narrow(1, 1, mcfg.vocab_size):copy_(w)
        tensors[name] = padded
      end
    end
  end
  local ok2, err = pcall(model.load_state_dict, model, tensors)
  if not ok2 then err = tostring(err):gsub("^.-load_state_dict: ", "") end
  if not ok2 then error(("hf.load: %s: %s"):format(wpath, err), 2) end
  if opts.dtype or opts.device then model:to(opts.device or "cpu", opts.dtype or "f32") end
  return model
end

return M
