#!/usr/bin/env python3
"""rewrite_launches.py IN.cu OUT.cc: a CUDA source as plain C++ for the CUDA
emulator (tests/emu/cuda_emu.h). Each kernel launch

    kernel<T, H><<<grid, block, smem, stream>>>(a, b)

becomes

    lt_emu_launch(lt_emu_cfg(grid, block, smem, stream), "kernel<T, H>", kernel<T, H>, a, b)

(inside a function-like macro whose parameter names the kernel, the name is
the parameter stringified, `#kernel`, so a trace names the kernel given),

each `__shared__ T a[N];` becomes `static T a__emu[LT_EMU_SETS][N]; auto &a =
a__emu[lt_emu_set]; lt_emu_shared(&a, sizeof a);`
(the block's first thread to get there fills it with garbage, as a GPU's
shared memory holds, so a read before any write is noticed), and CUB's
include is dropped (cuda_emu.h provides the sort lutra uses).
Lines keep their numbers, so __LINE__ in launch checks still points at the .cu
file (a #line directive names it)."""
import re
import sys


def callee_start(src, end):
    """Index where the kernel expression ending at src[end-1] begins: an
    identifier, optionally with a template argument list."""
    i = end
    while i > 0 and src[i - 1] in " \t":
        i -= 1
    if i > 0 and src[i - 1] == ">":
        depth = 0
        while i > 0:
            i -= 1
            if src[i] == ">":
                depth += 1
            elif src[i] == "<":
                depth -= 1
                if depth == 0:
                    break
    while i > 0 and (src[i - 1].isalnum() or src[i - 1] in "_:"):
        i -= 1
    return i


def matching_paren(src, open_index):
    depth = 0
    for j in range(open_index, len(src)):
        if src[j] == "(":
            depth += 1
        elif src[j] == ")":
            depth -= 1
            if depth == 0:
                return j
    raise SystemExit("rewrite_launches: unbalanced parentheses after a launch")


def macro_params(src, at):
    """The parameters of the function-like #define whose body holds src[at]
    (its lines continued with backslashes; comments and CRLF endings
    allowed), else an empty list."""
    line = src.rfind("\n", 0, at) + 1
    while True:
        if re.match(r"[ \t]*#[ \t]*define\b", src[line:]):
            head = re.sub(r"\\\r?\n", " ", src[line:at])  # the continued lines as one
            head = re.sub(r"/\*.*?\*/", " ", head)
            m = re.match(r"[ \t]*#[ \t]*define[ \t]+\w+\(([^)]*)\)", head)
            return [x.strip() for x in m.group(1).split(",")] if m else []
        if line == 0 or not src[:line - 1].rstrip(" \t\r").endswith("\\"):
            return []
        line = src.rfind("\n", 0, line - 1) + 1


def rewrite(src):
    out = []
    pos = 0
    while True:
        k = src.find("<<<", pos)
        if k < 0:
            out.append(src[pos:])
            return "".join(out)
        start = callee_start(src, k)
        if start < pos:
            raise SystemExit("rewrite_launches: overlapping launches")
        callee = src[start:k].strip()
        close = src.find(">>>", k)
        cfg = src[k + 3:close]
        p = close + 3
        while src[p] in " \t\\\n":
            p += 1
        if src[p] != "(":
            raise SystemExit("rewrite_launches: no arguments after %s<<<...>>>" % callee)
        gap = src[close + 3:p]  # (kept: its line breaks keep the line numbers)
        q = matching_paren(src, p)
        args = src[p + 1:q]
        name = '"%s"' % " ".join(callee.split())
        base = callee.split("<")[0].strip()
        if base in macro_params(src, start):
            name = "#" + base  # the kernel the macro was given, by name
        out.append(src[pos:start])
        out.append('lt_emu_launch(lt_emu_cfg(%s), %s, %s%s%s%s)' %
                   (cfg, name, callee, gap, ", " if args.strip() else "", args))
        pos = q + 1


def split_top(text):
    """text split at commas outside brackets"""
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return parts


def rewrite_shared(src):
    """`__shared__ T a[N], b[M];` -> statics with LT_EMU_SETS copies
    (`static T a__emu[LT_EMU_SETS][N], b__emu[LT_EMU_SETS][M];`), a
    reference to the block's copy under the variable's name, and a call per
    variable that fills it with garbage once per block (cuda_emu.h); all on
    the declaration's line."""
    def one(m):
        decls = split_top(m.group(1))
        names, copies = [], []
        for d in decls:
            head = d.split("[")[0].split("=")[0].strip()
            name = re.findall(r"[A-Za-z_]\w*", head)[-1]
            names.append(name)
            at = d.rindex(name, 0, len(d.split("[")[0]))
            copies.append(d[:at] + name + "__emu[LT_EMU_SETS]" + d[at + len(name):])
        refs = " ".join("auto &%s = %s__emu[lt_emu_set];" % (n, n) for n in names)
        calls = " ".join("lt_emu_shared(&%s, sizeof %s);" % (n, n) for n in names)
        return "static %s; %s %s" % (",".join(copies).strip(), refs, calls)
    return re.sub(r"__shared__\s+([^;]+);", one, src)


def main():
    if len(sys.argv) != 3:
        raise SystemExit("usage: rewrite_launches.py IN.cu OUT.cc")
    src = open(sys.argv[1]).read()
    src = re.sub(r"#include <cub/[^>]*>", "/* (CUB: cuda_emu.h) */", src)
    src = rewrite_shared(src)
    with open(sys.argv[2], "w") as f:
        f.write('#line 1 "%s"\n' % sys.argv[1])
        f.write(rewrite(src))


if __name__ == "__main__":
    main()
