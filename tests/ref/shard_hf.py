#!/usr/bin/python3
"""Splits a Hugging Face model directory's weights into shards, as
transformers' save_pretrained does when max_shard_size is passed, for
lt.hf's sharded-weights tests (tests/lua/hf_spec.lua).

  shard_hf.py SRC DST N
      Copies SRC/config.json and splits SRC/model.safetensors into N shards,
      DST/model-0000i-of-0000N.safetensors (the tensors in the file's
      order, split by count, each shard's data copied byte for byte), with
      DST/model.safetensors.index.json: {"metadata": {"total_size": bytes},
      "weight_map": {tensor name: shard file}}.

The safetensors format (an 8-byte little-endian header length, a JSON
header of dtype, shape and data_offsets, then the raw data) is read and
written here directly: plain Python, no torch needed.
"""
import json
import math
import os
import shutil
import struct
import sys


def read(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    meta = header.pop("__metadata__", None)
    data = raw[8 + n:]
    return {k: (v["dtype"], v["shape"], data[v["data_offsets"][0]:v["data_offsets"][1]])
            for k, v in header.items()}, meta


def write(path, tensors, meta):
    header, blobs, at = {}, [], 0
    if meta:
        header["__metadata__"] = meta
    for name in sorted(tensors):
        dtype, shape, b = tensors[name]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [at, at + len(b)]}
        blobs.append(b)
        at += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def shard(src, dst, n):
    os.makedirs(dst, exist_ok=True)
    shutil.copy(src + "/config.json", dst + "/config.json")
    tensors, _ = read(src + "/model.safetensors")
    names = list(tensors)
    per = math.ceil(len(names) / n)
    weight_map, total = {}, 0
    for i in range(n):
        part = {k: tensors[k] for k in names[i * per:(i + 1) * per]}
        file = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
        write(dst + "/" + file, part, {"format": "pt"})
        for k, t in part.items():
            weight_map[k] = file
            total += len(t[2])
    with open(dst + "/model.safetensors.index.json", "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    shard(sys.argv[1], sys.argv[2], int(sys.argv[3]))
