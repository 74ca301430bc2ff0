#!/usr/bin/python3
"""Writes tests/ref/gpt2_tiny.safetensors and tests/ref/llama_tiny.safetensors:
a tiny GPT-2 and a tiny Llama built in PyTorch (Debian's python3-torch) the
way lutra builds them (Hugging Face names; nanoGPT's GPT-2 with tied
embedding and tanh GELU; Llama with RMSNorm, rotate-half RoPE, SwiGLU and
grouped-query attention), with fixed random weights, an input batch, and the
logits, loss and every parameter's gradient. lutra must reproduce them
(tests/lua/models_spec.lua). The files are written by a small safetensors
writer here, so no extra package is needed.
"""
import json
import math
import struct
import sys

import torch
import torch.nn.functional as F

torch.manual_seed(42)
OUT = sys.argv[1]


def save(path, tensors, meta):
    header, data, at = {"__metadata__": meta}, [], 0
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous()
        dtype = {torch.float32: "F32", torch.int64: "I64"}[t.dtype]
        b = t.numpy().tobytes()
        header[name] = {"dtype": dtype, "shape": list(t.shape), "data_offsets": [at, at + len(b)]}
        data.append(b)
        at += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(data))


def attention(q, k, v):
    nh, nkv = q.shape[1], k.shape[1]
    if nkv != nh:
        k = k.repeat_interleave(nh // nkv, dim=1)
        v = v.repeat_interleave(nh // nkv, dim=1)
    T = q.shape[2]
    sc = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    sc = sc.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), -math.inf)
    return torch.softmax(sc, -1) @ v


def gpt2(cfg):
    C, V, L, NH, BS = cfg["n_embd"], cfg["vocab_size"], cfg["n_layer"], cfg["n_head"], cfg["block_size"]
    P = {"transformer.wte.weight": torch.randn(V, C) * 0.02, "transformer.wpe.weight": torch.randn(BS, C) * 0.02,
         "transformer.ln_f.weight": 1 + 0.1 * torch.randn(C), "transformer.ln_f.bias": 0.1 * torch.randn(C)}
    for i in range(L):
        p = f"transformer.h.{i}."
        for ln in ["ln_1", "ln_2"]:
            P[p + ln + ".weight"] = 1 + 0.1 * torch.randn(C)
            P[p + ln + ".bias"] = 0.1 * torch.randn(C)
        for name, (o, n) in {"attn.c_attn": (3 * C, C), "attn.c_proj": (C, C), "mlp.c_fc": (4 * C, C),
                             "mlp.c_proj": (C, 4 * C)}.items():
            P[p + name + ".weight"] = torch.randn(o, n) * 0.05
            P[p + name + ".bias"] = torch.randn(o) * 0.02
    for t in P.values():
        t.requires_grad_(True)

    def forward(idx):
        B, T = idx.shape
        x = P["transformer.wte.weight"][idx] + P["transformer.wpe.weight"][:T]
        for i in range(L):
            p = f"transformer.h.{i}."
            h = F.layer_norm(x, (C,), P[p + "ln_1.weight"], P[p + "ln_1.bias"], 1e-5)
            qkv = F.linear(h, P[p + "attn.c_attn.weight"], P[p + "attn.c_attn.bias"])
            q, k, v = [t.view(B, T, NH, C // NH).transpose(1, 2) for t in qkv.split(C, dim=2)]
            y = attention(q, k, v).transpose(1, 2).reshape(B, T, C)
            x = x + F.linear(y, P[p + "attn.c_proj.weight"], P[p + "attn.c_proj.bias"])
            h = F.layer_norm(x, (C,), P[p + "ln_2.weight"], P[p + "ln_2.bias"], 1e-5)
            h = F.gelu(F.linear(h, P[p + "mlp.c_fc.weight"], P[p + "mlp.c_fc.bias"]), approximate="tanh")
            x = x + F.linear(h, P[p + "mlp.c_proj.weight"], P[p + "mlp.c_proj.bias"])
        x = F.layer_norm(x, (C,), P["transformer.ln_f.weight"], P["transformer.ln_f.bias"], 1e-5)
        return x @ P["transformer.wte.weight"].t()  # the tied head
    return P, forward


def llama(cfg):
    D, V, L, NH, NKV, FF = cfg["dim"], cfg["vocab_size"], cfg["n_layers"], cfg["n_heads"], cfg["n_kv_heads"], cfg["ffn_dim"]
    hd, eps, theta = D // NH, cfg["norm_eps"], cfg["rope_theta"]
    P = {"model.embed_tokens.weight": torch.randn(V, D) * 0.02, "model.norm.weight": 1 + 0.1 * torch.randn(D),
         "lm_head.weight": torch.randn(V, D) * 0.02}
    for i in range(L):
        p = f"model.layers.{i}."
        P[p + "input_layernorm.weight"] = 1 + 0.1 * torch.randn(D)
        P[p + "post_attention_layernorm.weight"] = 1 + 0.1 * torch.randn(D)
        for name, (o, n) in {"self_attn.q_proj": (NH * hd, D), "self_attn.k_proj": (NKV * hd, D),
                             "self_attn.v_proj": (NKV * hd, D), "self_attn.o_proj": (D, NH * hd),
                             "mlp.gate_proj": (FF, D), "mlp.up_proj": (FF, D), "mlp.down_proj": (D, FF)}.items():
            P[p + name + ".weight"] = torch.randn(o, n) * 0.05
    for t in P.values():
        t.requires_grad_(True)

    def rms(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w

    def rope(x):
        T = x.shape[-2]
        inv = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
        ang = torch.outer(torch.arange(T, dtype=torch.float64), inv)
        emb = torch.cat([ang, ang], -1)
        cos, sin = emb.cos().float(), emb.sin().float()
        rot = torch.cat([-x[..., hd // 2:], x[..., : hd // 2]], -1)
        return x * cos + rot * sin

    def forward(idx):
        B, T = idx.shape
        x = P["model.embed_tokens.weight"][idx]
        for i in range(L):
            p = f"model.layers.{i}."
            h = rms(x, P[p + "input_layernorm.weight"])
            q = F.linear(h, P[p + "self_attn.q_proj.weight"]).view(B, T, NH, hd).transpose(1, 2)
            k = F.linear(h, P[p + "self_attn.k_proj.weight"]).view(B, T, NKV, hd).transpose(1, 2)
            v = F.linear(h, P[p + "self_attn.v_proj.weight"]).view(B, T, NKV, hd).transpose(1, 2)
            y = attention(rope(q), rope(k), v).transpose(1, 2).reshape(B, T, NH * hd)
            x = x + F.linear(y, P[p + "self_attn.o_proj.weight"])
            h = rms(x, P[p + "post_attention_layernorm.weight"])
            g = F.silu(F.linear(h, P[p + "mlp.gate_proj.weight"])) * F.linear(h, P[p + "mlp.up_proj.weight"])
            x = x + F.linear(g, P[p + "mlp.down_proj.weight"])
        return F.linear(rms(x, P["model.norm.weight"]), P["lm_head.weight"])
    return P, forward


def run(name, cfg, build, B, T, V):
    P, forward = build(cfg)
    idx = torch.randint(0, V, (B, T))
    targets = torch.randint(0, V, (B, T))
    targets[0, 1] = -100  # an ignored position
    logits = forward(idx)
    loss = F.cross_entropy(logits.view(-1, V), targets.view(-1), ignore_index=-100)
    loss.backward()
    out = {"input.idx": idx, "input.targets": targets, "logits": logits, "loss": loss.reshape(1)}
    for k, t in P.items():
        out["param." + k] = t
        out["grad." + k] = t.grad
    save(f"{OUT}/{name}.safetensors", out, {"config": json.dumps(cfg, sort_keys=True), "torch": torch.__version__})
    print(f"{name}: loss {loss.item():.6f}, {sum(t.numel() for t in P.values())} parameters")


run("gpt2_tiny", {"n_layer": 2, "n_head": 2, "n_embd": 32, "block_size": 16, "vocab_size": 96}, gpt2, 2, 12, 96)
run("llama_tiny", {"dim": 32, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "vocab_size": 96, "ffn_dim": 64,
                   "rope_theta": 10000.0, "norm_eps": 1e-5, "max_seq_len": 16}, llama, 2, 12, 96)
