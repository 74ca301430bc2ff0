#!/usr/bin/env python3
"""Writes tests/ref/tokenizer_golden.json: hard strings and the ids tiktoken
gives for them with GPT-2's vocabulary (data/gpt2.tiktoken, the same file
lutra reads). Strings are stored as base64 bytes so invalid UTF-8 survives;
tiktoken takes Python text, so bytes that are not UTF-8 are decoded with
errors="replace" first, which is what lutra's encode does by default.

    python3 tests/ref/gen_tokenizer.py data/gpt2.tiktoken tests/ref/tokenizer_golden.json
(needs PyPI's tiktoken; `make check-tokenizer` installs it under data/pylib)
"""
import base64
import json
import sys

import tiktoken
import tiktoken_ext.openai_public as openai_public
from tiktoken.load import load_tiktoken_bpe

vocab, out = sys.argv[1], sys.argv[2]
enc = tiktoken.Encoding(name="gpt2-local", pat_str=openai_public.r50k_pat_str,
                        mergeable_ranks=load_tiktoken_bpe(vocab), special_tokens={"<|endoftext|>": 50256})

HARD = [
    "Hello world", "", " ", "  ", "\n", "\n\n\n", "\r\n", "a\r\nb\r\n", "\t", "\tindented\n\t\tmore",
    "word   ", "   leading spaces", "trailing   \n", "two  spaces  between", "spaces before\n   newline",
    "line end  \n  next", "mixed \t \n tabs", "x\u00a0y", "no\u2003break", "ogham\u1680mark",
    "emoji 😀🎉👩‍👩‍👧‍👦 flags 🇫🇷🇯🇵", "skin 👍🏽 tone", "CJK 漢字かなカナ한국어", "中文字符测试，标点。",
    "combining e\u0301 a\u0308 n\u0303", "Z̤͔ͧ̑̓ä͖̭̈̇lͮ̒ͫǧ̗͚̚o̙̔ͮ̇͐̇", "Ελληνικά και Русский текст", "עברית ועربية",
    "digits 1234567890 3.14159 1,000,000", "x2 y10 z100", "٠١٢٣ ໑໒", "ⅫⅩⅣ roman", "½ ¾ ² ³",
    "it's they're we've I'm you'll he'd", "IT'S THEY'RE WE'VE I'M", "It'S tHey'Re", "don't can't won't",
    "'s 's' ''s", "quote 'single' and \"double\"", "<|endoftext|>", "a<|endoftext|>b", "<|endoftext|",
    "code: def f(x): return x**2  # comment", "path/to/file.py:123", "https://example.com/a?b=c&d=e",
    "email@example.com", "snake_case camelCase PascalCase", "----====____", "...!!!???", "(((nested)))",
    "$€£¥ symbols ©®™", "math ∑∫√∞≠≤≥", "arrows ←↑→↓", "box ─│┌┐└┘", "    def indented():\n        pass\n",
    "a" * 300, " " * 100 + "x", "9" * 50, "ab" * 64,
]
BAD = [b"invalid \xff byte", b"trunc \xe2\x82", b"\xc0\xaf overlong", b"surrogate \xed\xa0\x80 x",
       b"lone cont \x80\x80 y", b"ok \xe2\x82\xac then \xf0\x9f\x98", b"\xf5\xf6\xf7\xf8", b"\xf4\x90\x80\x80"]

cases = []
for s in HARD:
    b = s.encode("utf-8")
    cases.append({"bytes": base64.b64encode(b).decode(), "ids": enc.encode_ordinary(s),
                  "special_ids": enc.encode(s, allowed_special="all")})
for b in BAD:
    s = b.decode("utf-8", errors="replace")
    cases.append({"bytes": base64.b64encode(b).decode(), "ids": enc.encode_ordinary(s),
                  "special_ids": enc.encode(s, allowed_special="all"), "invalid": True})
json.dump({"tiktoken": tiktoken.__version__, "cases": cases}, open(out, "w"), indent=0)
print(f"wrote {len(cases)} cases to {out}")
