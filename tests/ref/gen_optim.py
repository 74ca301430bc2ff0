#!/usr/bin/python3
"""Writes tests/ref/optim.json: parameters after each of several steps of
torch.optim.AdamW and torch.optim.SGD (single-tensor implementations,
foreach=False), torch.nn.utils.clip_grad_norm_'s norms and clipped
gradients, and steps each after a clip_grad_norm_ (clip_steps). Each optimizer case has two parameters (a matrix and a vector)
with starting values, the gradient of every step, the settings, and the
values after every step. bf16 cases model lutra's master weights: torch
updates an f32 copy and the expected parameter is that copy rounded to
bf16 after each step, with the bf16 gradients given. Run with Debian's
python3-torch (`make ref`); the JSON is committed.
"""
import json
import sys

import torch

torch.manual_seed(4321)
STEPS = 5


def enc(t, dtype):
    return {"shape": list(t.shape), "dtype": dtype, "values": t.detach().reshape(-1).double().tolist()}


def run(name, kind, settings, dtype, clip=None):
    shapes = [(4, 3), (3,)]
    start = [torch.randn(s) for s in shapes]
    grads = [[torch.randn(s) * 0.5 for s in shapes] for _ in range(STEPS)]
    if dtype == "bf16":  # what lutra starts from and is given: bf16 values
        start = [t.bfloat16().float() for t in start]
        grads = [[g.bfloat16().float() for g in gs] for gs in grads]
    if dtype == "f64":
        start = [t.double() for t in start]
        grads = [[g.double() for g in gs] for gs in grads]
    params = [t.clone().requires_grad_() for t in start]
    if kind == "AdamW":
        opt = torch.optim.AdamW(params, lr=settings["lr"], betas=tuple(settings["betas"]), eps=settings["eps"],
                                weight_decay=settings["weight_decay"], foreach=False)
    else:
        opt = torch.optim.SGD(params, lr=settings["lr"], momentum=settings["momentum"],
                              dampening=settings["dampening"], weight_decay=settings["weight_decay"],
                              nesterov=settings["nesterov"], foreach=False)
    after, norms = [], []
    for step in range(STEPS):
        for p, g in zip(params, grads[step]):
            p.grad = g.clone()
        if clip is not None:  # the gradients scaled in place, then the step reads them
            norms.append(float(torch.nn.utils.clip_grad_norm_(params, clip)))
        opt.step()
        out = [p.detach().clone() for p in params]
        if dtype == "bf16":
            out = [t.bfloat16().float() for t in out]
        after.append([enc(t, dtype) for t in out])
    case = {"name": name, "kind": kind, "settings": settings, "dtype": dtype,
            "start": [enc(t, dtype) for t in start],
            "grads": [[enc(g, dtype) for g in gs] for gs in grads], "after": after}
    if clip is not None:
        case["max_norm"], case["norms"] = clip, norms
    return case


cases = []
adam = {"lr": 1e-2, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}
for dtype in ["f32", "f64", "bf16"]:
    cases.append(run("AdamW " + dtype, "AdamW", adam, dtype))
cases.append(run("AdamW without weight decay, large eps", "AdamW",
                 {"lr": 3e-3, "betas": [0.8, 0.999], "eps": 1e-3, "weight_decay": 0.0}, "f32"))
sgd_sets = [
    ("SGD plain", {"lr": 0.1, "momentum": 0.0, "dampening": 0.0, "weight_decay": 0.0, "nesterov": False}),
    ("SGD momentum and weight decay", {"lr": 0.05, "momentum": 0.9, "dampening": 0.0, "weight_decay": 0.01,
                                       "nesterov": False}),
    ("SGD dampening", {"lr": 0.05, "momentum": 0.9, "dampening": 0.3, "weight_decay": 0.0, "nesterov": False}),
    ("SGD Nesterov", {"lr": 0.05, "momentum": 0.8, "dampening": 0.0, "weight_decay": 0.001, "nesterov": True}),
]
for name, s in sgd_sets:
    cases.append(run(name, "SGD", s, "f32"))
cases.append(run("SGD Nesterov bf16", "SGD", sgd_sets[3][1], "bf16"))

clips = []
for max_norm, scale in [(1.0, 1.0), (100.0, 1.0), (0.5, 3.0)]:
    grads = [torch.randn(5, 4) * scale, torch.randn(7) * scale]
    params = [torch.zeros_like(g, requires_grad=True) for g in grads]
    for p, g in zip(params, grads):
        p.grad = g.clone()
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
    clips.append({"max_norm": max_norm, "grads": [enc(g, "f32") for g in grads], "norm": float(norm),
                  "clipped": [enc(p.grad, "f32") for p in params]})

# clip_grad_norm_ before every step (max_norm 1.5: the norms of these
# gradients, about 1.9, are clipped in most steps and not in some); last, so
# the draws of the cases above are unchanged
clip_steps = [run("AdamW " + dtype + " clipped", "AdamW", adam, dtype, clip=1.5) for dtype in ["f32", "f64", "bf16"]]
clip_steps.append(run("SGD momentum and weight decay clipped", "SGD", sgd_sets[1][1], "f32", clip=1.5))

json.dump({"torch": torch.__version__, "cases": cases, "clip": clips, "clip_steps": clip_steps},
          open(sys.argv[1], "w"))
