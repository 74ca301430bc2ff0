#!/usr/bin/python3
"""Hugging Face interop references for lt.hf (tests/lua/hf_spec.lua).

  gen_hf.py write OUT_DIR
      Writes OUT_DIR/gpt2/, OUT_DIR/llama/ and OUT_DIR/llama_tied/
      (config.json, model.safetensors) in the layouts transformers saves for
      GPT2LMHeadModel and LlamaForCausalLM (llama_tied with
      tie_word_embeddings: no lm_head.weight), with fixed random weights, and
      OUT_DIR/hf.json with an input batch and the logits those weights give
      (for llama_tied also its parameter count and the gradient of the
      next-token loss for its one, shared, embedding). The GPT-2 file uses the
      older layout of the original GPT-2 release (names without
      "transformer.", the attn.bias mask buffers), which lutra must also read.
  gen_hf.py check DIR LOGITS_JSON
      Reads a directory lutra exported (one model.safetensors, or the
      shards model.safetensors.index.json maps), computes the logits of the ids in
      LOGITS_JSON ({"ids": [[...]], "logits": [...]}) with the forward passes
      below, and compares them with lutra's (max abs difference <= 1e-4).
      Where the transformers package is installed it also loads DIR with
      from_pretrained and compares its logits; otherwise it says it skipped
      that. Exit status 0 when everything compared agrees.

The forward passes follow transformers' modeling_gpt2.py (Conv1D weights
stored (in, out), tanh GELU, the head tied unless lm_head.weight is stored) and modeling_llama.py (RMSNorm,
rotate-half rotary embeddings, their rope_scaling "linear" and "llama3" as modeling_rope_utils.py computes
the frequencies, SwiGLU, grouped-query attention), computed in
f64. Safetensors files are read and written by the small code here (the
format: an 8-byte little-endian header length, a JSON header, raw data), so
only Debian's python3-torch is needed.
"""
import json
import math
import struct
import sys

import torch
import torch.nn.functional as F

DT = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64}
DT_NAME = {v: k for k, v in DT.items()}


def save(path, tensors, meta=None):
    header, data, at = {}, [], 0
    if meta:
        header["__metadata__"] = meta
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous()
        b = t.view(torch.uint8).numpy().tobytes() if t.dtype == torch.bfloat16 else t.numpy().tobytes()
        header[name] = {"dtype": DT_NAME[t.dtype], "shape": list(t.shape), "data_offsets": [at, at + len(b)]}
        data.append(b)
        at += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(data))


def load(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    base = 8 + n
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        a, b = e["data_offsets"]
        buf = bytearray(raw[base + a:base + b])
        dt = DT[e["dtype"]]
        if dt == torch.bfloat16:
            t = torch.frombuffer(buf, dtype=torch.int16).view(torch.bfloat16)
        else:
            t = torch.frombuffer(buf, dtype=dt) if len(buf) else torch.empty(0, dtype=dt)
        out[name] = t.reshape(e["shape"]).double()
    return out


def causal_attention(q, k, v):
    nh, nkv = q.shape[1], k.shape[1]
    if nkv != nh:
        k = k.repeat_interleave(nh // nkv, dim=1)
        v = v.repeat_interleave(nh // nkv, dim=1)
    T = q.shape[2]
    sc = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    sc = sc.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), -math.inf)
    return torch.softmax(sc, -1) @ v


def gpt2_forward(sd, cfg, idx):
    def p(name):  # GPT2LMHeadModel names, or GPT2Model's without the prefix
        return sd["transformer." + name] if "transformer." + name in sd else sd[name]
    C, NH, L = cfg["n_embd"], cfg["n_head"], cfg["n_layer"]
    eps = cfg.get("layer_norm_epsilon", 1e-5)
    B, T = idx.shape
    x = p("wte.weight")[idx] + p("wpe.weight")[:T]
    for i in range(L):
        h = F.layer_norm(x, (C,), p(f"h.{i}.ln_1.weight"), p(f"h.{i}.ln_1.bias"), eps)
        qkv = h @ p(f"h.{i}.attn.c_attn.weight") + p(f"h.{i}.attn.c_attn.bias")  # Conv1D: (in, out)
        q, k, v = [t.view(B, T, NH, C // NH).transpose(1, 2) for t in qkv.split(C, dim=2)]
        y = causal_attention(q, k, v).transpose(1, 2).reshape(B, T, C)
        x = x + y @ p(f"h.{i}.attn.c_proj.weight") + p(f"h.{i}.attn.c_proj.bias")
        h = F.layer_norm(x, (C,), p(f"h.{i}.ln_2.weight"), p(f"h.{i}.ln_2.bias"), eps)
        h = F.gelu(h @ p(f"h.{i}.mlp.c_fc.weight") + p(f"h.{i}.mlp.c_fc.bias"), approximate="tanh")
        x = x + h @ p(f"h.{i}.mlp.c_proj.weight") + p(f"h.{i}.mlp.c_proj.bias")
    x = F.layer_norm(x, (C,), p("ln_f.weight"), p("ln_f.bias"), eps)
    head = sd["lm_head.weight"] if "lm_head.weight" in sd else p("wte.weight")  # tied unless the file holds a head
    return x @ head.t()


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], dim=-1)


def llama_forward(sd, cfg, idx):
    D, L, NH = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_attention_heads"]
    NKV = cfg.get("num_key_value_heads", NH)
    hd = cfg.get("head_dim") or D // NH
    eps, theta = cfg.get("rms_norm_eps", 1e-6), cfg.get("rope_theta", 10000.0)
    B, T = idx.shape
    inv = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    sc = cfg.get("rope_scaling")
    if sc and sc.get("rope_type", sc.get("type")) == "linear":
        inv = inv / sc["factor"]
    elif sc and sc.get("rope_type", sc.get("type")) == "llama3":  # transformers' _compute_llama3_parameters
        factor, lo, hi = sc["factor"], sc["low_freq_factor"], sc["high_freq_factor"]
        orig = sc["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > orig / lo, inv / factor, inv)
        smooth = (orig / wavelen - lo) / (hi - lo)
        mid = (1 - smooth) * scaled / factor + smooth * scaled
        inv = torch.where((wavelen >= orig / hi) & (wavelen <= orig / lo), mid, scaled)
    ang = torch.outer(torch.arange(T, dtype=torch.float64), inv)
    cos, sin = torch.cat([ang, ang], -1).cos(), torch.cat([ang, ang], -1).sin()

    def rms(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w

    x = sd["model.embed_tokens.weight"][idx]
    for i in range(L):
        p = f"model.layers.{i}."
        h = rms(x, sd[p + "input_layernorm.weight"])
        q = (h @ sd[p + "self_attn.q_proj.weight"].t()).view(B, T, NH, hd).transpose(1, 2)
        k = (h @ sd[p + "self_attn.k_proj.weight"].t()).view(B, T, NKV, hd).transpose(1, 2)
        v = (h @ sd[p + "self_attn.v_proj.weight"].t()).view(B, T, NKV, hd).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        y = causal_attention(q, k, v).transpose(1, 2).reshape(B, T, NH * hd)
        x = x + y @ sd[p + "self_attn.o_proj.weight"].t()
        h = rms(x, sd[p + "post_attention_layernorm.weight"])
        g, u = h @ sd[p + "mlp.gate_proj.weight"].t(), h @ sd[p + "mlp.up_proj.weight"].t()
        x = x + (F.silu(g) * u) @ sd[p + "mlp.down_proj.weight"].t()
    x = rms(x, sd["model.norm.weight"])
    head = sd["lm_head.weight"] if "lm_head.weight" in sd else sd["model.embed_tokens.weight"]
    return x @ head.t()


def load_dir(directory):
    import os
    index = directory + "/model.safetensors.index.json"
    if not os.path.exists(index):
        return load(directory + "/model.safetensors")
    with open(index) as f:
        weight_map = json.load(f)["weight_map"]
    sd = {}
    for file in sorted(set(weight_map.values())):
        part = load(directory + "/" + file)
        for name, t in part.items():
            if weight_map.get(name) == file:
                sd[name] = t
    missing = [n for n in weight_map if n not in sd]
    if missing:
        raise SystemExit(f"{directory}: the index maps {missing[0]} to a shard that does not hold it")
    return sd


def forward(directory, idx):
    with open(directory + "/config.json") as f:
        cfg = json.load(f)
    sd = load_dir(directory)
    if cfg.get("model_type") == "gpt2":
        return gpt2_forward(sd, cfg, idx)
    return llama_forward(sd, cfg, idx)


def write(out):
    import os
    torch.manual_seed(20261130)
    V, T = 96, 8
    # GPT-2 in the original release's layout: GPT2Model names and mask buffers
    g = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "vocab_size": V, "n_positions": 16,
         "n_ctx": 16, "n_embd": 32, "n_layer": 2, "n_head": 4, "activation_function": "gelu_new",
         "layer_norm_epsilon": 1e-5, "tie_word_embeddings": True}
    C = g["n_embd"]
    sd = {"wte.weight": torch.randn(V, C) * 0.1, "wpe.weight": torch.randn(16, C) * 0.05,
          "ln_f.weight": 1 + 0.1 * torch.randn(C), "ln_f.bias": 0.1 * torch.randn(C)}
    for i in range(g["n_layer"]):
        p = f"h.{i}."
        for ln in ["ln_1", "ln_2"]:
            sd[p + ln + ".weight"] = 1 + 0.1 * torch.randn(C)
            sd[p + ln + ".bias"] = 0.1 * torch.randn(C)
        for name, (n_in, n_out) in {"attn.c_attn": (C, 3 * C), "attn.c_proj": (C, C), "mlp.c_fc": (C, 4 * C),
                                    "mlp.c_proj": (4 * C, C)}.items():
            sd[p + name + ".weight"] = torch.randn(n_in, n_out) * 0.1  # Conv1D: (in, out)
            sd[p + name + ".bias"] = torch.randn(n_out) * 0.05
        sd[p + "attn.bias"] = torch.ones(16, 16).tril().view(1, 1, 16, 16)
    # Llama with grouped-query attention and an untied head
    lc = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": V, "hidden_size": 32,
          "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
          "max_position_embeddings": 32, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "hidden_act": "silu",
          "tie_word_embeddings": False}
    D, H = lc["hidden_size"], lc["intermediate_size"]
    hd = D // lc["num_attention_heads"]
    ld = {"model.embed_tokens.weight": torch.randn(V, D) * 0.1, "model.norm.weight": 1 + 0.1 * torch.randn(D),
          "lm_head.weight": torch.randn(V, D) * 0.1}
    for i in range(lc["num_hidden_layers"]):
        p = f"model.layers.{i}."
        ld[p + "input_layernorm.weight"] = 1 + 0.1 * torch.randn(D)
        ld[p + "post_attention_layernorm.weight"] = 1 + 0.1 * torch.randn(D)
        ld[p + "self_attn.q_proj.weight"] = torch.randn(D, D) * 0.1
        ld[p + "self_attn.k_proj.weight"] = torch.randn(2 * hd, D) * 0.1
        ld[p + "self_attn.v_proj.weight"] = torch.randn(2 * hd, D) * 0.1
        ld[p + "self_attn.o_proj.weight"] = torch.randn(D, D) * 0.1
        ld[p + "mlp.gate_proj.weight"] = torch.randn(H, D) * 0.1
        ld[p + "mlp.up_proj.weight"] = torch.randn(H, D) * 0.1
        ld[p + "mlp.down_proj.weight"] = torch.randn(D, H) * 0.1
    idx = torch.randint(0, V, (2, T))
    # Llama with tie_word_embeddings: the head is embed_tokens, the file holds no lm_head.weight (drawn after
    # idx, so the fixtures above stay as they were)
    tc = dict(lc, tie_word_embeddings=True)
    td = {k: (v + 0.01 * torch.randn(v.shape) if v.dim() == 2 else v) for k, v in ld.items() if k != "lm_head.weight"}
    result = {"ids": idx.tolist()}
    for name, cfg, weights in [("gpt2", g, sd), ("llama", lc, ld), ("llama_tied", tc, td)]:
        d = f"{out}/{name}"
        os.makedirs(d, exist_ok=True)
        save(d + "/model.safetensors", weights, {"format": "pt"})
        with open(d + "/config.json", "w") as f:
            json.dump(cfg, f, indent=2)
        logits = forward(d, idx)
        result[name] = {"shape": list(logits.shape), "logits": logits.reshape(-1).tolist()}
    # the tied Llama's parameter count (each tensor once, as transformers' num_parameters counts a tied
    # weight) and the gradient of next-token cross-entropy on ids for the one embedding both uses share
    tw = load(f"{out}/llama_tied/model.safetensors")
    emb = tw["model.embed_tokens.weight"].requires_grad_()
    logits = llama_forward(tw, tc, idx)
    F.cross_entropy(logits[:, :-1].reshape(-1, V), idx[:, 1:].reshape(-1)).backward()
    result["llama_tied"]["num_parameters"] = sum(t.numel() for t in tw.values())
    result["llama_tied"]["embed_grad"] = emb.grad.reshape(-1).tolist()
    with open(f"{out}/hf.json", "w") as f:
        json.dump(result, f)


def check(directory, logits_json):
    with open(logits_json) as f:
        ref = json.load(f)
    idx = torch.tensor(ref["ids"])
    ours = torch.tensor(ref["logits"], dtype=torch.float64).reshape(ref["shape"])
    mine = forward(directory, idx)
    diff = (mine - ours).abs().max().item()
    print(f"check {directory}: torch forward vs lutra logits: max abs difference {diff:.3g}")
    ok = diff <= 1e-4
    try:
        from transformers import AutoModelForCausalLM
    except ImportError as e:  # (absent, or a release that needs a newer torch than Debian's)
        print(f"skipped from_pretrained: transformers cannot be used here ({str(e).splitlines()[0]})")
        return ok
    model = AutoModelForCausalLM.from_pretrained(directory, torch_dtype=torch.float64)
    with torch.no_grad():
        hf = model(idx).logits
    d2 = (hf - ours).abs().max().item()
    print(f"check {directory}: transformers from_pretrained vs lutra logits: max abs difference {d2:.3g}")
    return ok and d2 <= 1e-4


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "write":
        write(sys.argv[2])
    elif len(sys.argv) == 4 and sys.argv[1] == "check":
        sys.exit(0 if check(sys.argv[2], sys.argv[3]) else 1)
    else:
        sys.exit(__doc__)
