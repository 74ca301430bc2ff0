#!/usr/bin/python3
"""bench/model_cpu_torch.py: the PyTorch side of bench/model_cpu.lua (and the
model of bench/train_cpu_torch.py). Builds the same GPT-2 (nanoGPT's layout:
pre-LN, tanh GELU, tied head) with Debian's python3-torch, times
forward+backward of one batch, and prints one JSON line. Arguments:
n_layer n_head n_embd vocab_size block_size B T threads steps.
"""
import json
import math
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


def build(L, NH, C, V, BS):
    """A GPT-2 whose forward(idx, targets) returns the mean cross-entropy."""

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1, self.ln_2 = nn.LayerNorm(C), nn.LayerNorm(C)
            self.c_attn, self.c_proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
            self.c_fc, self.mlp_proj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)
            self.register_buffer("mask", torch.ones(BS, BS, dtype=torch.bool).triu(1))

        def forward(self, x):
            b, t, _ = x.shape
            q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
            q, k, v = [z.view(b, t, NH, C // NH).transpose(1, 2) for z in (q, k, v)]
            att = (q @ k.transpose(-2, -1)) / math.sqrt(C // NH)
            att = F.softmax(att.masked_fill(self.mask[:t, :t], float("-inf")), -1)
            x = x + self.c_proj((att @ v).transpose(1, 2).reshape(b, t, C))
            return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(BS, C)
            self.h = nn.ModuleList(Block() for _ in range(L))
            self.ln_f = nn.LayerNorm(C)

        def forward(self, idx, targets):
            x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
            for blk in self.h:
                x = blk(x)
            logits = self.ln_f(x) @ self.wte.weight.t()
            return F.cross_entropy(logits.view(-1, V), targets.view(-1))

    return GPT()


def main():
    L, NH, C, V, BS, B, T, threads, steps = (int(a) for a in sys.argv[1:10])
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = build(L, NH, C, V, BS)
    n_params = sum(p.numel() for p in model.parameters())
    idx, tgt = torch.randint(0, V, (B, T)), torch.randint(0, V, (B, T))
    times = []
    for _ in range(steps + 1):
        t0 = time.perf_counter()
        loss = model(idx, tgt)
        loss.backward()
        model.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
    times = sorted(times[1:])  # the first step warms up
    print(json.dumps({"torch": torch.__version__, "params": n_params, "seconds": times[len(times) // 2],
                      "threads": torch.get_num_threads()}))


if __name__ == "__main__":
    main()
