#!/usr/bin/python3
"""Writes tests/ref/reference.safetensors with the safetensors library itself
(PyPI `safetensors`, with Debian's python3-torch) and tests/ref/reference_safetensors.json
with its tensors' values, so lutra's reader is checked against the reference
writer without Python at test time. When a lutra-written file is given as a
second argument, also loads it with the reference reader and prints what it found.

    PYTHONPATH=<dir with safetensors> /usr/bin/python3 tests/ref/gen_safetensors.py tests/ref [lutra.safetensors]
"""
import json
import os
import sys

import torch

try:
    from safetensors.torch import load_file, save_file
except ImportError:
    print("skipped: the safetensors package is not installed (pip install --target DIR safetensors)")
    sys.exit(0)

out = sys.argv[1]
torch.manual_seed(5)
tensors = {
    "transformer.h.0.attn.c_attn.weight": torch.randn(4, 12),
    "bias": torch.randn(12, dtype=torch.float64),
    "half": torch.randn(3, 2).to(torch.float16),
    "brain": torch.randn(5).to(torch.bfloat16),
    "ids": torch.tensor([[1, -2], [3, 4]], dtype=torch.int64),
    "small": torch.tensor([1, 2, 3], dtype=torch.int32),
    "bytes": torch.tensor([0, 255], dtype=torch.uint8),
    "mask": torch.tensor([True, False, True]),
    "empty": torch.zeros(0, 3),
    "scalar": torch.tensor(2.5),
}
save_file(tensors, os.path.join(out, "reference.safetensors"), metadata={"format": "pt", "note": "made by safetensors"})
values = {k: {"shape": list(v.shape), "values": v.double().reshape(-1).tolist()} for k, v in tensors.items()}
json.dump(values, open(os.path.join(out, "reference_safetensors.json"), "w"), sort_keys=True)
print(f"wrote {len(tensors)} tensors")
if len(sys.argv) > 2:
    d = load_file(sys.argv[2])
    print("the reference reader loaded", sys.argv[2], {k: (str(v.dtype), list(v.shape)) for k, v in sorted(d.items())})
