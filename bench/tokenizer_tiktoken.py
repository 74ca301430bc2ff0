#!/usr/bin/env python3
"""bench/tokenizer_tiktoken.py: tiktoken's side of bench/tokenizer.lua: encodes
the given files with GPT-2's vocabulary (the same gpt2.tiktoken), on one
thread and with encode_ordinary_batch on N threads; prints one JSON line."""
import json
import sys
import time

import tiktoken
import tiktoken_ext.openai_public as openai_public
from tiktoken.load import load_tiktoken_bpe

vocab, threads, listfile = sys.argv[1], int(sys.argv[2]), sys.argv[3]
enc = tiktoken.Encoding(name="gpt2-local", pat_str=openai_public.r50k_pat_str,
                        mergeable_ranks=load_tiktoken_bpe(vocab), special_tokens={"<|endoftext|>": 50256})
texts = [open(p.strip(), "rb").read().decode("utf-8", errors="replace") for p in open(listfile)]
nbytes = sum(len(t.encode("utf-8")) for t in texts)
enc.encode_ordinary(texts[0])  # warm up
best1 = bestn = 1e30
for _ in range(3):
    t0 = time.perf_counter()
    n = sum(len(enc.encode_ordinary(t)) for t in texts)
    best1 = min(best1, time.perf_counter() - t0)
    t0 = time.perf_counter()
    enc.encode_ordinary_batch(texts, num_threads=threads)
    bestn = min(bestn, time.perf_counter() - t0)
print(json.dumps({"version": tiktoken.__version__, "bytes": nbytes, "tokens": n, "one": best1, "all": bestn}))
