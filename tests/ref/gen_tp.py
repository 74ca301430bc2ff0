#!/usr/bin/python3
"""Writes tests/ref/tp_ce.json: torch.nn.functional.cross_entropy's losses and
logits gradients, in f64, for tests/dist/tp_vocab_spec.lua to check
lt.dist.tp.vocab_parallel_cross_entropy against (each rank holding its
columns of the logits). Cases: logits (N, V) or (B, T, V) with V = 8 (it
divides by the specs' 1, 2 and 4 ranks), targets with ignored rows (the
default -100 and another ignore_index), reductions mean, sum and none (the
gradient of none is that of the sum of its losses weighted by "weights").
No label_smoothing: lutra's F.cross_entropy has none. Run with Debian's
python3-torch (`make ref`); the JSON is committed.
"""
import json
import sys

import torch
import torch.nn.functional as F

torch.manual_seed(2525)
V = 8


def enc(t):
    return {"shape": list(t.shape), "values": t.detach().reshape(-1).double().tolist()}


def case(name, shape, targets, reduction, ignore_index=-100, scale=1.0):
    logits = (torch.randn(*shape, V, dtype=torch.float64) * scale).requires_grad_()
    t = torch.tensor(targets, dtype=torch.int64).reshape(shape)
    loss = F.cross_entropy(logits.reshape(-1, V), t.reshape(-1), ignore_index=ignore_index, reduction=reduction)
    out = {"name": name, "reduction": reduction, "ignore_index": ignore_index, "logits": enc(logits),
           "targets": {"shape": list(t.shape), "values": t.reshape(-1).tolist()}}
    if reduction == "none":
        w = torch.randn(loss.shape, dtype=torch.float64)
        (loss * w).sum().backward()
        out["weights"] = enc(w.reshape(shape))
        loss = loss.reshape(shape)
    else:
        loss.backward()
    out["loss"] = enc(loss)
    out["grad"] = enc(logits.grad)
    return out


cases = [
    case("mean, one ignored row", (6,), [0, 7, 3, -100, 5, 1], "mean"),
    case("sum, two ignored rows", (6,), [2, -100, 6, 4, -100, 7], "sum"),
    case("none, one ignored row", (6,), [1, 3, -100, 0, 6, 2], "none"),
    case("mean, (B, T, V) logits, ignore_index 5", (2, 3), [5, 0, 7, 5, 2, 4], "mean", ignore_index=5),
    case("mean, large logits", (4,), [3, 1, 6, 0], "mean", scale=40.0),
]
json.dump({"torch": torch.__version__, "V": V, "cases": cases}, open(sys.argv[1], "w"), indent=1)
