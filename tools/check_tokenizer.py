#!/usr/bin/env python3
"""tools/check_tokenizer.py: compares lutra's ids (tools/encode-corpus.lua's
output) with tiktoken's for every file, on the same vocabulary file. Prints
the first difference of each differing file and exits 1 if any differs."""
import sys

import tiktoken
import tiktoken_ext.openai_public as openai_public
from tiktoken.load import load_tiktoken_bpe

vocab, ids_file = sys.argv[1], sys.argv[2]
enc = tiktoken.Encoding(name="gpt2-local", pat_str=openai_public.r50k_pat_str,
                        mergeable_ranks=load_tiktoken_bpe(vocab), special_tokens={"<|endoftext|>": 50256})
files = bad = tokens = 0
for line in open(ids_file, encoding="utf-8"):
    path, _, ids = line.rstrip("\n").partition("\t")
    got = [int(x) for x in ids.split()] if ids else []
    text = open(path, "rb").read().decode("utf-8", errors="replace")
    want = enc.encode_ordinary(text)
    files += 1
    tokens += len(want)
    if got != want:
        bad += 1
        k = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
        print(f"DIFF {path}: first difference at token {k}: lutra {got[k:k+5]} tiktoken {want[k:k+5]}")
print(f"check-tokenizer: {files} files, {tokens} tokens, {files - bad} identical, {bad} different (tiktoken {tiktoken.__version__})")
sys.exit(1 if bad else 0)
