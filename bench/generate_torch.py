#!/usr/bin/python3
"""bench/generate_torch.py: the PyTorch side of bench/generate.lua. A GPT-2
of the given shape (nanoGPT's layout: pre-LN, tanh GELU, tied head; random
N(0, 0.02) weights) with a KV cache, decoding greedily from a prompt of
random ids; prints one JSON line with tokens/s for the new tokens (the
prompt's forward included, as lutra's side counts it: the prompt's forward
draws the first token and each of the other new_tokens - 1 costs one
position) and the thread settings it ran with (torch's intra- and inter-op
threads, the OpenMP and OpenBLAS variables it saw). Arguments:
n_layer n_head n_embd vocab_size block_size prompt_len new_tokens threads.
"""
import json
import math
import os
import sys
import time

import torch
import torch.nn.functional as F


def main():
    L, NH, C, V, BS, P, N, threads = (int(a) for a in sys.argv[1:9])
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    hs = C // NH

    def w(*shape):
        return torch.randn(*shape) * 0.02

    wte, wpe = w(V, C), w(BS, C)
    layers = [dict(ln1=(torch.ones(C), torch.zeros(C)), ln2=(torch.ones(C), torch.zeros(C)),
                   attn=(w(3 * C, C), torch.zeros(3 * C)), proj=(w(C, C), torch.zeros(C)),
                   fc=(w(4 * C, C), torch.zeros(4 * C)), fc2=(w(C, 4 * C), torch.zeros(C))) for _ in range(L)]
    lnf = (torch.ones(C), torch.zeros(C))
    cache_k = [torch.zeros(1, NH, BS, hs) for _ in range(L)]
    cache_v = [torch.zeros(1, NH, BS, hs) for _ in range(L)]

    def forward(idx, start):
        t = idx.shape[1]
        x = wte[idx] + wpe[start:start + t]
        mask = torch.ones(t, start + t, dtype=torch.bool).triu(start + 1)
        for i, p in enumerate(layers):
            h = F.layer_norm(x, (C,), *p["ln1"])
            q, k, v = F.linear(h, *p["attn"]).split(C, dim=2)
            q, k, v = [z.view(1, t, NH, hs).transpose(1, 2) for z in (q, k, v)]
            cache_k[i][:, :, start:start + t] = k
            cache_v[i][:, :, start:start + t] = v
            K, Vv = cache_k[i][:, :, :start + t], cache_v[i][:, :, :start + t]
            att = (q @ K.transpose(-2, -1)) / math.sqrt(hs)
            att = F.softmax(att.masked_fill(mask, float("-inf")), -1)
            x = x + F.linear((att @ Vv).transpose(1, 2).reshape(1, t, C), *p["proj"])
            h = F.layer_norm(x, (C,), *p["ln2"])
            x = x + F.linear(F.gelu(F.linear(h, *p["fc"]), approximate="tanh"), *p["fc2"])
        return F.layer_norm(x[:, -1], (C,), *lnf) @ wte.t()

    prompt = torch.randint(0, V, (1, P))
    with torch.no_grad():
        forward(prompt, 0)  # warm-up
        t0 = time.perf_counter()
        logits = forward(prompt, 0)
        pos, drawn = P, 0
        while True:
            nxt = logits.argmax(-1, keepdim=True)
            drawn += 1
            if drawn == N or pos >= BS:
                break
            logits = forward(nxt, pos)
            pos += 1
        dt = time.perf_counter() - t0
    env = {k: os.environ.get(k, "unset") for k in ("OMP_WAIT_POLICY", "OPENBLAS_THREAD_TIMEOUT", "OMP_NUM_THREADS")}
    print(json.dumps({"tokens_per_s": drawn / dt, "tokens": drawn, "seconds": dt, "torch": torch.__version__,
                      "threads": torch.get_num_threads(), "interop_threads": torch.get_num_interop_threads(),
                      "env": env}))


if __name__ == "__main__":
    main()
