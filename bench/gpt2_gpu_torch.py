"""bench/gpt2_gpu_torch.py: the PyTorch side of bench/gpt2_gpu.lua: GPT-2 124M
(nanoGPT's layout: pre-LayerNorm, tanh GELU, tied head) trained on random
tokens with bf16 autocast, torch.compile, fused attention
(F.scaled_dot_product_attention, causal) and fused AdamW, at T=1024.
Prints one JSON line: tokens/s, ms per step and peak memory.

    python3 bench/gpt2_gpu_torch.py B [steps] [compile: 1/0]
"""
import json
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, C, H):
        super().__init__()
        self.H = H
        self.ln_1, self.ln_2 = nn.LayerNorm(C), nn.LayerNorm(C)
        self.c_attn, self.c_proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        self.c_fc, self.mlp_proj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.H, C // self.H).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, L=12, H=12, C=768, V=50257, T=1024):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(T, C)
        self.h = nn.ModuleList(Block(C, H) for _ in range(L))
        self.ln_f = nn.LayerNorm(C)
        self.lm_head = nn.Linear(C, V, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for b in self.h:
            x = b(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.view(-1))


def main():
    B = int(sys.argv[1])
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 10
    use_compile = (sys.argv[3] != "0") if len(sys.argv) > 3 else True
    T, V = 1024, 50257
    torch.manual_seed(1)
    torch.backends.cuda.matmul.allow_tf32 = True
    dev = "cuda"
    model = GPT().to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    step_model = torch.compile(model) if use_compile else model
    x = torch.randint(0, V, (B, T), device=dev)
    y = torch.randint(0, V, (B, T), device=dev)
    times = []
    for i in range(steps + 2):  # two warm-up steps (compilation)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = step_model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss.item()
        if i >= 2:
            times.append(time.perf_counter() - t0)
    times.sort()
    dt = times[len(times) // 2]
    print(json.dumps({"B": B, "T": T, "ms": dt * 1e3, "tokens_per_s": B * T / dt,
                      "peak_gib": torch.cuda.max_memory_allocated() / 2**30, "torch": torch.__version__,
                      "compiled": use_compile}))


if __name__ == "__main__":
    main()
