#!/usr/bin/python3
"""bench/train_cpu_torch.py: the PyTorch side of bench/train_cpu.lua: the same
GPT-2 config (bench/model_cpu_torch.py's model) trained for the same steps
on random tokens with AdamW (fused=False: the CPU has no fused kernel),
gradient clipping at 1.0 and the same batch and threads. Prints one JSON
line: tokens/s (steps after the first), peak RSS in bytes.
Arguments: n_layer n_head n_embd vocab_size block_size B T threads steps.
"""
import json
import os
import resource
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model_cpu_torch import build  # noqa: E402


def main():
    L, NH, C, V, BS, B, T, threads, steps = (int(a) for a in sys.argv[1:10])
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = build(L, NH, C, V, BS)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
    g = torch.Generator().manual_seed(1)
    t_first = None
    t0 = time.perf_counter()
    for step in range(steps + 1):
        idx = torch.randint(0, V, (B, T), generator=g)
        tgt = torch.randint(0, V, (B, T), generator=g)
        loss = model(idx, tgt)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        loss.item()
        if step == 0:
            t_first = time.perf_counter()
    dt = time.perf_counter() - t_first
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"torch": torch.__version__, "tokens_per_s": steps * B * T / dt, "seconds": dt,
                      "peak_rss": rss, "threads": torch.get_num_threads(), "loss": float(loss)}))


if __name__ == "__main__":
    main()
