#!/usr/bin/python3
"""bench/model_cpu_torch.py: the PyTorch side of bench/model_cpu.lua (and the
model of bench/train_cpu_torch.py). Builds the same GPT-2 (nanoGPT's layout:
pre-LN, tanh GELU, tied head; lutra's parameter names) with Debian's
python3-torch, loads the weights and the batch that lutra wrote (so both
start from the same numbers), and serves bench/interleave.lua's commands
(bench/interleave.py): "loss" (the batch's loss, no gradients), "step"
(forward+backward of the batch, timed). Arguments:
weights.safetensors batch.safetensors n_layer n_head n_embd vocab_size block_size threads.
"""
import json
import math
import os
import struct
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from interleave import serve, thread_env  # noqa: E402

DTYPES = {"F32": torch.float32, "F64": torch.float64, "I64": torch.int64, "I32": torch.int32,
          "U16": torch.int16, "BF16": torch.bfloat16, "F16": torch.float16}


def load_safetensors(path):
    """{name: tensor} from a safetensors file (the python3-safetensors package is not needed)."""
    with open(path, "rb") as f:
        data = bytearray(f.read())
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    out = {}
    for name, h in header.items():
        if name == "__metadata__":
            continue
        a, b = h["data_offsets"]
        dtype = DTYPES[h["dtype"]]
        t = torch.empty(0, dtype=dtype)
        if b > a:  # (a view of the file's bytes: load_state_dict copies it)
            t = torch.frombuffer(data, dtype=dtype, count=(b - a) // t.element_size(), offset=8 + n + a)
        out[name] = t.reshape(h["shape"])
    return out


def build(L, NH, C, V, BS):
    """A GPT-2 whose forward(idx, targets) returns the mean cross-entropy;
    its state_dict names are lutra's (transformer.h.0.attn.c_attn.weight, ...)."""

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.c_attn, self.c_proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
            self.register_buffer("mask", torch.ones(BS, BS, dtype=torch.bool).triu(1), persistent=False)

        def forward(self, x):
            b, t, _ = x.shape
            q, k, v = self.c_attn(x).split(C, dim=2)
            q, k, v = [z.view(b, t, NH, C // NH).transpose(1, 2) for z in (q, k, v)]
            att = (q @ k.transpose(-2, -1)) / math.sqrt(C // NH)
            att = F.softmax(att.masked_fill(self.mask[:t, :t], float("-inf")), -1)
            return self.c_proj((att @ v).transpose(1, 2).reshape(b, t, C))

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.c_fc, self.c_proj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

        def forward(self, x):
            return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1, self.attn, self.ln_2, self.mlp = nn.LayerNorm(C), Attention(), nn.LayerNorm(C), MLP()

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.transformer = nn.ModuleDict(dict(wte=nn.Embedding(V, C), wpe=nn.Embedding(BS, C),
                                                  h=nn.ModuleList(Block() for _ in range(L)), ln_f=nn.LayerNorm(C)))

        def forward(self, idx, targets):
            tr = self.transformer
            x = tr.wte(idx) + tr.wpe(torch.arange(idx.shape[1]))
            for blk in tr.h:
                x = blk(x)
            logits = tr.ln_f(x) @ tr.wte.weight.t()  # the head tied to the embedding
            return F.cross_entropy(logits.view(-1, V), targets.view(-1))

    return GPT()


def load(weights, L, NH, C, V, BS):
    """The model with the weights lutra saved (every parameter must be there)."""
    model = build(L, NH, C, V, BS)
    model.load_state_dict(load_safetensors(weights), strict=True)
    return model


def hello(model):
    """The peer's first line: versions, threads and the thread variables it runs under."""
    return {"torch": torch.__version__, "threads": torch.get_num_threads(),
            "interop": torch.get_num_interop_threads(), "env": thread_env(),
            "params": sum(p.numel() for p in model.parameters())}


def main():
    weights, batch = sys.argv[1], sys.argv[2]
    L, NH, C, V, BS, threads = (int(a) for a in sys.argv[3:9])
    torch.set_num_threads(threads)
    model = load(weights, L, NH, C, V, BS)
    b = load_safetensors(batch)
    idx, tgt = b["x"].long(), b["y"].long()

    def handle(cmd):
        if cmd == "loss":
            with torch.no_grad():
                return {"loss": float(model(idx, tgt))}
        t0 = time.perf_counter()
        loss = model(idx, tgt)
        loss.backward()
        model.zero_grad(set_to_none=True)
        return {"seconds": time.perf_counter() - t0, "loss": float(loss)}

    serve(handle, hello(model))


if __name__ == "__main__":
    main()
