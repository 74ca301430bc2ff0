#!/usr/bin/python3
"""bench/train_cpu_torch.py: the PyTorch side of bench/train_cpu.lua: the same
GPT-2 (bench/model_cpu_torch.py's model) from the weights lutra saved,
trained on the batches lutra saved (x, y: steps x B x T) with AdamW as
lutra's (decay on the matrices only; the unfused step: the CPU has no fused
kernel) and gradient clipping at 1.0. Serves bench/interleave.lua's
commands (bench/interleave.py): "step I" (training step I on batch I,
timed), "rss" (peak RSS in bytes). Arguments:
weights.safetensors batches.safetensors n_layer n_head n_embd vocab_size block_size threads.
"""
import os
import resource
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from interleave import serve  # noqa: E402
from model_cpu_torch import hello, load, load_safetensors  # noqa: E402


def main():
    weights, batches = sys.argv[1], sys.argv[2]
    L, NH, C, V, BS, threads = (int(a) for a in sys.argv[3:9])
    torch.set_num_threads(threads)
    model = load(weights, L, NH, C, V, BS)
    b = load_safetensors(batches)
    xs, ys = b["x"].long(), b["y"].long()
    params = list(model.parameters())
    opt = torch.optim.AdamW([{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
                             {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.95), eps=1e-8)

    def handle(cmd):
        if cmd == "rss":
            return {"peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
        i = int(cmd.split()[1])
        t0 = time.perf_counter()
        loss = model(xs[i], ys[i])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        loss = loss.item()
        return {"seconds": time.perf_counter() - t0, "loss": loss}

    serve(handle, hello(model))


if __name__ == "__main__":
    main()
