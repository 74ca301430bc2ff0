#!/usr/bin/python3
"""Writes tests/ref/nn.json: PyTorch's outputs and gradients for lutra.F.

Each case has inputs (values and shape; those marked grad require it), the
op and its arguments, the output, a fixed random weight w, and the
gradients of sum(output * w) for the inputs that require grad. Run with
Debian's python3-torch (`make ref`); the JSON is committed.
"""
import json
import math
import sys

import torch
import torch.nn.functional as F

torch.manual_seed(1234)
DT = {"f32": torch.float32, "f64": torch.float64, "i64": torch.int64, "bf16": torch.bfloat16}
NAME = {v: k for k, v in DT.items()}


def num(x):
    x = float(x)
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return x


def enc(t):
    return {"shape": list(t.shape), "dtype": NAME[t.dtype],
            "values": [num(v) for v in t.detach().reshape(-1).double().tolist()]}


cases = []


def case(name, op, inputs, fn, args=None):
    """inputs: list of (tensor, requires_grad)."""
    leaves = []
    for t, g in inputs:
        x = t.detach().clone()
        if g:
            x.requires_grad_(True)
        leaves.append(x)
    out = fn(*leaves)
    w = torch.randn(out.shape, dtype=torch.float64).to(out.dtype)
    if any(g for _, g in inputs):
        (out.double() * w.double()).sum().backward()
    cases.append({
        "name": name, "op": op, "args": args or {},
        "inputs": [dict(enc(t), grad=g) for (t, g) in zip(leaves, [g for _, g in inputs])],
        "output": enc(out), "w": enc(w),
        "grads": [enc(t.grad) if g else None for (t, g) in zip(leaves, [g for _, g in inputs])],
    })


for dt in ["f32", "f64"]:
    d = DT[dt]
    x = torch.randn(4, 3, 8, dtype=d)
    w, b = torch.randn(8, dtype=d), torch.randn(8, dtype=d)
    case(f"layer_norm {dt}", "layer_norm", [(x, True), (w, True), (b, True)],
         lambda x, w, b: F.layer_norm(x, (8,), w, b, 1e-5), {"eps": 1e-5})
    case(f"layer_norm {dt} no affine", "layer_norm", [(x, True)], lambda x: F.layer_norm(x, (8,), None, None, 1e-5),
         {"eps": 1e-5})
    case(f"rms_norm {dt}", "rms_norm", [(x, True), (w, True)],
         lambda x, w: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w, {"eps": 1e-6})
    s = torch.randn(3, 5, 7, dtype=d) * 3
    s[0, 1, 2] = -math.inf
    for dim in [1, 2]:
        case(f"softmax {dt} dim {dim + 1}", "softmax", [(s, True)], lambda x, dim=dim: F.softmax(x, dim),
             {"dim": dim + 1})
        case(f"log_softmax {dt} dim {dim + 1}", "log_softmax", [(s, True)],
             lambda x, dim=dim: F.log_softmax(x, dim), {"dim": dim + 1})
    logits = torch.randn(6, 11, dtype=d) * 2
    tg = torch.tensor([3, -100, 0, 10, 5, -100])
    for red in ["mean", "sum", "none"]:
        case(f"cross_entropy {dt} {red}", "cross_entropy", [(logits, True), (tg, False)],
             lambda x, t, red=red: F.cross_entropy(x, t, ignore_index=-100, reduction=red), {"reduction": red})
    g = torch.randn(5, 7, dtype=d) * 2
    case(f"gelu {dt}", "gelu", [(g, True)], lambda x: F.gelu(x, approximate="tanh"))
    case(f"silu {dt}", "silu", [(g, True)], lambda x: F.silu(x))
    case(f"swiglu {dt}", "swiglu", [(g, True), (torch.randn(5, 7, dtype=d), True)], lambda a, b: F.silu(a) * b)
    xl = torch.randn(2, 3, 5, dtype=d)
    wl, bl = torch.randn(4, 5, dtype=d), torch.randn(4, dtype=d)
    case(f"linear {dt}", "linear", [(xl, True), (wl, True), (bl, True)], lambda x, w, b: F.linear(x, w, b))
    ids = torch.tensor([[3, 0, 3], [1, 4, 2]])
    emb = torch.randn(5, 6, dtype=d)
    case(f"embedding {dt}", "embedding", [(ids, False), (emb, True)], lambda i, e: F.embedding(i, e))

    def rope(x, base=10000.0, start=0):
        T, D = x.shape[-2], x.shape[-1]
        inv = 1.0 / (base ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
        pos = torch.arange(start, start + T, dtype=torch.float64)
        ang = torch.outer(pos, inv)
        emb_ = torch.cat([ang, ang], -1)
        cos, sin = emb_.cos().to(x.dtype), emb_.sin().to(x.dtype)
        x1, x2 = x[..., : D // 2], x[..., D // 2:]
        rot = torch.cat([-x2, x1], -1)
        return x * cos + rot * sin

    q = torch.randn(2, 3, 4, 8, dtype=d)
    case(f"rope {dt}", "rope", [(q, True)], lambda x: rope(x, 10000.0, 0), {"base": 10000.0, "start": 0})
    case(f"rope {dt} base 500 start 7", "rope", [(q, True)], lambda x: rope(x, 500.0, 7), {"base": 500.0, "start": 7})

    def sdpa(q, k, v, causal):
        NH, NKV = q.shape[1], k.shape[1]
        if NKV != NH:
            k = k.repeat_interleave(NH // NKV, dim=1)
            v = v.repeat_interleave(NH // NKV, dim=1)
        sc = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        if causal:
            T, S = q.shape[2], k.shape[2]
            m = torch.ones(T, S, dtype=torch.bool).triu(1 + S - T)
            sc = sc.masked_fill(m, -math.inf)
        return torch.softmax(sc, -1) @ v

    q = torch.randn(2, 4, 5, 8, dtype=d)
    kv = torch.randn(2, 2, 5, 8, dtype=d), torch.randn(2, 2, 5, 8, dtype=d)
    case(f"sdpa {dt} causal gqa", "sdpa", [(q, True), (kv[0], True), (kv[1], True)],
         lambda q, k, v: sdpa(q, k, v, True), {"causal": True})
    kf = torch.randn(2, 4, 5, 8, dtype=d), torch.randn(2, 4, 5, 8, dtype=d)
    case(f"sdpa {dt} full", "sdpa", [(q, True), (kf[0], True), (kf[1], True)],
         lambda q, k, v: sdpa(q, k, v, False), {"causal": False})
    qs = torch.randn(1, 2, 2, 8, dtype=d)  # 2 queries after 5 cached keys
    ks = torch.randn(1, 2, 7, 8, dtype=d), torch.randn(1, 2, 7, 8, dtype=d)
    case(f"sdpa {dt} causal after a cache", "sdpa", [(qs, True), (ks[0], True), (ks[1], True)],
         lambda q, k, v: sdpa(q, k, v, True), {"causal": True})

# bf16 forwards (computed in f32, rounded once, as lutra does)
xb = torch.randn(4, 16).to(torch.bfloat16)
wb, bb = torch.randn(16).to(torch.bfloat16), torch.randn(16).to(torch.bfloat16)
case("layer_norm bf16", "layer_norm", [(xb, False), (wb, False), (bb, False)],
     lambda x, w, b: F.layer_norm(x.float(), (16,), w.float(), b.float(), 1e-5).to(torch.bfloat16), {"eps": 1e-5})
case("softmax bf16", "softmax", [(xb, False)], lambda x: F.softmax(x.float(), -1).to(torch.bfloat16), {"dim": -1})


# softmax(scale * x) under the attention mask aligned at the end (query t sees keys <= t + S - T)
def scaled_softmax(x, scale, causal):
    x = x * scale
    if causal:
        T, S = x.shape[-2], x.shape[-1]
        m = torch.ones(T, S, dtype=torch.bool).triu(1 + S - T)
        x = x.masked_fill(m, -math.inf)
    p = torch.softmax(x, -1)
    return torch.nan_to_num(p, nan=0.0)  # rows with every key masked: zeros


for dt in ["f32", "f64"]:
    d = DT[dt]
    for (shape, scale, causal) in [((2, 3, 5, 5), 0.35, True), ((2, 4, 7), 1.7, False), ((1, 2, 3, 6), 0.5, True),
                                   ((1, 2, 6, 4), 2.0, True)]:
        xs = torch.randn(*shape, dtype=d) * 2
        T, S = shape[-2], shape[-1]
        case(f"scaled_softmax {dt} {'x'.join(map(str, shape))} scale {scale}{' causal' if causal else ''}",
             "scaled_softmax", [(xs, True)], lambda x, s=scale, c=causal: scaled_softmax(x, s, c),
             {"scale": scale, "causal": causal})

# the residual add fused into the next norm: (h, norm(h)) stacked, h = x + res
for dt in ["f32", "f64"]:
    d = DT[dt]
    x, r = torch.randn(3, 5, 16, dtype=d), torch.randn(3, 5, 16, dtype=d)
    w, b = torch.randn(16, dtype=d), torch.randn(16, dtype=d)
    case(f"add_layer_norm {dt}", "add_layer_norm", [(x, True), (r, True), (w, True), (b, True)],
         lambda x, r, w, b: torch.stack([x + r, F.layer_norm(x + r, (16,), w, b, 1e-5)]), {"eps": 1e-5})
    case(f"add_rms_norm {dt}", "add_rms_norm", [(x, True), (r, True), (w, True)],
         lambda x, r, w: torch.stack([x + r, (x + r) * torch.rsqrt((x + r).pow(2).mean(-1, keepdim=True) + 1e-6) * w]),
         {"eps": 1e-6})

# the linear layer with the GELU fused in (lt_linear), from a 3-D input and without a bias
for dt in ["f32", "f64"]:
    d = DT[dt]
    x, w, b = torch.randn(2, 3, 6, dtype=d), torch.randn(5, 6, dtype=d), torch.randn(5, dtype=d)
    case(f"linear gelu {dt}", "linear", [(x, True), (w, True), (b, True)],
         lambda x, w, b: F.gelu(F.linear(x, w, b), approximate="tanh"), {"activation": "gelu"})
    case(f"linear gelu no bias {dt}", "linear_nobias", [(x, True), (w, True)],
         lambda x, w: F.gelu(F.linear(x, w), approximate="tanh"), {"activation": "gelu"})

# GPT-2's MLP as one op (lt_mlp): gelu(x w1^T + b1) w2^T + b2, with and without the first bias
for dt in ["f32", "f64"]:
    d = DT[dt]
    x, w1, b1 = torch.randn(2, 3, 6, dtype=d), torch.randn(10, 6, dtype=d), torch.randn(10, dtype=d)
    w2, b2 = torch.randn(4, 10, dtype=d), torch.randn(4, dtype=d)
    case(f"mlp {dt}", "mlp", [(x, True), (w1, True), (b1, True), (w2, True), (b2, True)],
         lambda x, w1, b1, w2, b2: F.linear(F.gelu(F.linear(x, w1, b1), approximate="tanh"), w2, b2))
    case(f"mlp no first bias {dt}", "mlp_nofcbias", [(x, True), (w1, False), (w2, True), (b2, True)],
         lambda x, w1, w2, b2: F.linear(F.gelu(F.linear(x, w1), approximate="tanh"), w2, b2))

# a model's head and its loss as one op (lt_linear_cross_entropy): cross_entropy(x w^T, targets), the
# targets with x's leading dims, some ignored; a padded head whose first 11 rows are the classes
for dt in ["f32", "f64"]:
    d = DT[dt]
    x, w = torch.randn(2, 3, 6, dtype=d), torch.randn(13, 6, dtype=d)
    tg = torch.tensor([[3, -100, 0], [10, 5, 7]])
    for red in ["mean", "sum"]:
        case(f"linear_cross_entropy {dt} {red}", "linear_cross_entropy", [(x, True), (w, True), (tg, False)],
             lambda x, w, t, red=red: F.cross_entropy(F.linear(x, w).reshape(-1, 13), t.reshape(-1),
                                                      ignore_index=-100, reduction=red), {"reduction": red})
    case(f"linear_cross_entropy {dt} padded head, classes 11", "linear_cross_entropy",
         [(x, True), (w, True), (tg, False)],
         lambda x, w, t: F.cross_entropy(F.linear(x, w)[..., :11].reshape(-1, 11), t.reshape(-1), ignore_index=-100),
         {"reduction": "mean", "classes": 11})

# RoPE with scaled frequencies, as transformers' rope_scaling (modeling_rope_utils.py): "linear" divides
# every inverse frequency by factor; "llama3" (_compute_llama3_parameters) keeps those of wavelength under
# original_max / high_freq_factor, divides those over original_max / low_freq_factor by factor, and blends
# in between; positions long past original_max / 16 so every branch is taken
def scaled_inv(D, base, sc):
    inv = 1.0 / (base ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
    if sc["rope_type"] == "linear":
        return inv / sc["factor"]
    factor, lo, hi, orig = sc["factor"], sc["low_freq_factor"], sc["high_freq_factor"], \
        sc["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv
    out = torch.where(wavelen > orig / lo, inv / factor, inv)
    smooth = (orig / wavelen - lo) / (hi - lo)
    mid = (1 - smooth) * out / factor + smooth * out
    between = (wavelen >= orig / hi) & (wavelen <= orig / lo)
    return torch.where(between, mid, out)


def rope_scaled(x, base, start, sc):
    T, D = x.shape[-2], x.shape[-1]
    ang = torch.outer(torch.arange(start, start + T, dtype=torch.float64), scaled_inv(D, base, sc))
    emb_ = torch.cat([ang, ang], -1)
    cos, sin = emb_.cos().to(x.dtype), emb_.sin().to(x.dtype)
    x1, x2 = x[..., : D // 2], x[..., D // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


for dt in ["f32", "f64"]:
    d = DT[dt]
    q = torch.randn(2, 2, 5, 32, dtype=d)
    for sc in [{"rope_type": "linear", "factor": 4.0},
               {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64}]:
        case(f"rope {dt} scaling {sc['rope_type']} start 300", "rope", [(q, True)],
             lambda x, sc=sc: rope_scaled(x, 500.0, 300, sc), {"base": 500.0, "start": 300, "scaling": sc})

json.dump({"torch": torch.__version__, "cases": cases}, open(sys.argv[1], "w"), separators=(",", ":"))
print(f"wrote {len(cases)} cases to {sys.argv[1]}")
