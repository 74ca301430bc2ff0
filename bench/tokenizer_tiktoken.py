#!/usr/bin/env python3
"""bench/tokenizer_tiktoken.py: tiktoken's side of bench/tokenizer.lua: loads
GPT-2's vocabulary (the same gpt2.tiktoken) and the listed files, and serves
bench/interleave.lua's commands (bench/interleave.py): "one" (every file
with encode_ordinary on this thread, timed), "all" (encode_ordinary_batch
on N threads, timed), "ids PATH" (every file's ids, one after another, as
little-endian int32 into PATH). Arguments: vocab threads listfile."""
import array
import os
import sys
import time

import tiktoken
import tiktoken_ext.openai_public as openai_public
from tiktoken.load import load_tiktoken_bpe

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from interleave import serve, thread_env  # noqa: E402

vocab, threads, listfile = sys.argv[1], int(sys.argv[2]), sys.argv[3]
enc = tiktoken.Encoding(name="gpt2-local", pat_str=openai_public.r50k_pat_str,
                        mergeable_ranks=load_tiktoken_bpe(vocab), special_tokens={"<|endoftext|>": 50256})
texts = [open(p.strip(), "rb").read().decode("utf-8", errors="replace") for p in open(listfile)]


def handle(cmd):
    if cmd.startswith("ids "):
        ids = array.array("i")
        for t in texts:
            ids.extend(enc.encode_ordinary(t))
        if sys.byteorder != "little":
            ids.byteswap()
        with open(cmd[4:], "wb") as f:
            ids.tofile(f)
        return {"tokens": len(ids)}
    t0 = time.perf_counter()
    if cmd == "one":
        for t in texts:
            enc.encode_ordinary(t)
    else:
        enc.encode_ordinary_batch(texts, num_threads=threads)
    return {"seconds": time.perf_counter() - t0}


serve(handle, {"version": tiktoken.__version__, "threads": threads, "env": thread_env()})
