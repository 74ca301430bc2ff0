#!/usr/bin/python3
"""Writes tests/ref/ops.json: inputs and PyTorch's outputs for lutra's tensor ops.

Run with Debian's python3-torch (`make ref`); the JSON is committed so the
tests need no Python. Each case names an op, its inputs (values of a base
tensor plus the views taken of it, so non-contiguous and broadcast inputs are
exercised), extra arguments, and the expected shape, dtype and values.
Dims are 0-based here; the Lua side adds 1. NaN and infinities are written
as the strings "nan", "inf", "-inf".
"""
import json
import math
import sys

import torch

torch.manual_seed(20240520)

DT = {
    "f32": torch.float32, "f64": torch.float64, "bf16": torch.bfloat16, "f16": torch.float16,
    "i8": torch.int8, "u8": torch.uint8, "i32": torch.int32, "i64": torch.int64, "bool": torch.bool,
}
NAME = {v: k for k, v in DT.items()}
FLOATS = ["f32", "f64", "bf16", "f16"]
INTS = ["i8", "u8", "i32", "i64"]


def num(x):
    if isinstance(x, bool):
        return 1.0 if x else 0.0
    x = float(x)
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return x


def values(t):
    return [num(v) for v in t.detach().reshape(-1).to(torch.float64).tolist()] if t.dtype != torch.bool \
        else [num(v) for v in t.reshape(-1).tolist()]


def rand_base(shape, dtype, kind="normal"):
    if dtype in FLOATS:
        t = torch.randn(shape, dtype=torch.float64)
        if kind == "positive":
            t = t.abs() + 0.1
        elif kind == "wide":
            t = t * 3
        return t.to(DT[dtype])
    if dtype == "bool":
        return torch.rand(shape) > 0.5
    if dtype == "u8":
        return torch.randint(0, 10, shape, dtype=torch.uint8)
    if kind == "exponent":
        return torch.randint(0, 4, shape, dtype=DT[dtype])
    return torch.randint(-5, 6, shape, dtype=DT[dtype])


def apply_views(t, views):
    for v in views:
        op, args = v[0], v[1:]
        if op == "transpose":
            t = t.transpose(*args)
        elif op == "narrow":
            t = t.narrow(*args)
        elif op == "expand":
            t = t.expand(*args)
        elif op == "select":
            t = t.select(*args)
        elif op == "permute":
            t = t.permute(*args)
        elif op == "unsqueeze":
            t = t.unsqueeze(*args)
        else:
            raise ValueError(op)
    return t


def via_f64(fn, x):
    """fn computed in f64 and rounded once to x's dtype."""
    return fn(x.double()).to(x.dtype)


def spec(base, views=()):
    return {"shape": list(base.shape), "dtype": NAME[base.dtype], "values": values(base),
            "views": [list(v) for v in views]}


def expect(t):
    # lutra has no int16: where torch promotes to it (i8 with u8), lutra gives i32
    dtype = "i32" if t.dtype == torch.int16 else NAME[t.dtype]
    return {"shape": list(t.shape), "dtype": dtype, "values": values(t)}


cases = []


def via_f32(fn, *xs):
    """fn on the inputs, with f16 tensors computed in f32 and float results
    rounded back to f16 (torch 1.13's CPU kernels lack many f16 ops; lutra
    computes f16 in f32 and rounds once, which this reproduces)."""
    half = any(isinstance(x, torch.Tensor) and x.dtype == torch.float16 for x in xs)
    if not half:
        return fn(*xs)
    out = fn(*[x.float() if isinstance(x, torch.Tensor) and x.dtype == torch.float16 else x for x in xs])
    tensors = [x for x in xs if isinstance(x, torch.Tensor)]
    if len(xs) == 2:
        promoted = torch.result_type(*xs)
    elif len(tensors) == 3:  # where(cond, a, b): the result type of a and b
        promoted = torch.result_type(tensors[1], tensors[2])
    else:
        promoted = tensors[0].dtype
    if out.is_floating_point() and promoted == torch.float16:
        out = out.to(torch.float16)
    return out


def add(name, op, inputs, out, args=()):
    """inputs: list of (base, views); out: the torch result tensor."""
    cases.append({"name": name, "op": op, "args": list(args),
                  "inputs": [spec(b, v) for b, v in inputs], "expect": expect(out)})


# Layouts for one operand: (base shape, views, logical shape)
LAYOUTS = {
    "contig": ((3, 4), ()),
    "transposed": ((4, 3), (("transpose", 0, 1),)),
    "narrowed": ((3, 7), (("narrow", 1, 2, 4),)),
    "expanded": ((3, 1), (("expand", 3, 4),)),
    "scalar": ((), ()),
    "empty": ((0, 4), ()),
    "size1": ((1, 4), ()),
}

# ---- unary -------------------------------------------------------------------
UNARY = ["neg", "abs", "exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid"]
for op in UNARY:
    for dt in FLOATS + (["i32", "i64", "i8"] if op in ("neg", "abs") else ["i32"]):
        for lay in ["contig", "transposed", "narrowed", "scalar", "empty"]:
            shape, views = LAYOUTS[lay]
            kind = "positive" if op in ("log", "sqrt", "rsqrt") and lay != "contig" else "normal"
            base = rand_base(shape, dt, kind)
            x = apply_views(base, views)
            if op in ("exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid") and dt not in FLOATS:
                xin = x.to(torch.float32)
            else:
                xin = x
            out = via_f32(getattr(torch, op), xin)
            add(f"{op} {dt} {lay}", op, [(base, views)], out)
# special values through the float ops
sp = torch.tensor([0.0, -0.0, float("inf"), float("-inf"), float("nan"), 1e-30, -1e30, 88.0, -104.0])
for op in UNARY:
    add(f"{op} f32 specials", op, [(sp, ())], getattr(torch, op)(sp))

# ---- binary ------------------------------------------------------------------
BINARY = ["add", "sub", "mul", "div", "pow", "maximum", "minimum", "eq", "ne", "lt", "le", "gt", "ge"]
TORCH_BIN = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div, "pow": torch.pow,
             "maximum": torch.maximum, "minimum": torch.minimum, "eq": torch.eq, "ne": torch.ne,
             "lt": torch.lt, "le": torch.le, "gt": torch.gt, "ge": torch.ge}
PAIRS = [("f32", "f32"), ("f64", "f64"), ("bf16", "bf16"), ("f16", "f16"), ("i32", "i32"),
         ("i64", "i64"), ("u8", "u8"), ("i8", "i8"), ("f32", "i64"), ("bf16", "f16"), ("i8", "u8"),
         ("bf16", "f32"), ("bool", "bool"), ("bool", "i32")]
LAYOUT_PAIRS = [("contig", "contig"), ("transposed", "contig"), ("contig", "narrowed"),
                ("expanded", "transposed"), ("scalar", "contig"), ("size1", "contig"), ("empty", "size1")]
for op in BINARY:
    for da, db in PAIRS:
        if op == "sub" and "bool" in (da, db):
            continue  # torch refuses bool subtraction
        if op == "pow" and (da == "bool" or db == "bool" or da == "u8" or da == "i8"):
            continue
        for la, lb in LAYOUT_PAIRS:
            sa, va = LAYOUTS[la]
            sb, vb = LAYOUTS[lb]
            a = rand_base(sa, da, "positive" if op == "pow" else "normal")
            b = rand_base(sb, db, "exponent" if op == "pow" and db in INTS else "normal")
            if op == "pow" and da in INTS and db not in INTS:
                continue
            out = via_f32(TORCH_BIN[op], apply_views(a, va), apply_views(b, vb))
            add(f"{op} {da}/{db} {la}/{lb}", op, [(a, va), (b, vb)], out)
# a broadcast in three dims: (2, 1, 4) with (3, 1)
for op in ["add", "mul", "maximum", "lt"]:
    a, b = torch.randn(2, 1, 4), torch.randn(3, 1)
    add(f"{op} f32 broadcast3", op, [(a, ()), (b, ())], TORCH_BIN[op](a, b))
# division by zero and NaN through maximum
a = torch.tensor([1.0, -1.0, 0.0, float("nan"), 2.0])
b = torch.tensor([0.0, 0.0, 0.0, 1.0, float("nan")])
for op in ["div", "maximum", "minimum", "eq", "ne", "lt"]:
    add(f"{op} f32 specials", op, [(a, ()), (b, ())], TORCH_BIN[op](a, b))

# ---- binary with a number --------------------------------------------------------
for op in ["add", "sub", "mul", "div", "pow", "maximum", "lt", "ge", "eq"]:
    for dt, s in [("f32", 2.5), ("f64", -1.25), ("bf16", 3.0), ("f16", 0.5), ("i32", 3), ("i64", -2),
                  ("i32", 0.5), ("u8", 2), ("bool", 1)]:
        if op == "sub" and dt == "bool":
            continue
        if op == "maximum":
            continue  # torch.maximum takes tensors only
        if op == "pow" and dt in INTS + ["bool"] and s < 0:
            continue  # torch refuses negative integer powers of integers
        base = rand_base((3, 4), dt, "positive" if op == "pow" else "normal")
        x = base.transpose(0, 1)
        out = via_f32(TORCH_BIN[op], x, s)
        cases.append({"name": f"{op} {dt} scalar {s}", "op": op + "_scalar", "args": [s, False],
                      "inputs": [spec(base, [("transpose", 0, 1)])], "expect": expect(out)})
        if op in ("sub", "div", "pow") and dt in FLOATS:
            out = via_f32(lambda xx: TORCH_BIN[op](s, xx), x)
            cases.append({"name": f"{op} {dt} reversed scalar {s}", "op": op + "_scalar", "args": [s, True],
                          "inputs": [spec(base, [("transpose", 0, 1)])], "expect": expect(out)})

# ---- where, clamp ------------------------------------------------------------------
for dt in ["f32", "bf16", "i64", "f64"]:
    c = torch.rand(3, 1) > 0.5
    a = rand_base((3, 4), dt)
    b = rand_base((4,), dt)
    add(f"where {dt}", "where", [(c, ()), (a, ()), (b, ())], via_f32(torch.where, c, a, b))
for dt, lo, hi in [("f32", -0.5, 0.5), ("f64", None, 0.0), ("bf16", -1.0, None), ("i32", -2, 3),
                   ("f16", -0.25, 0.75)]:
    base = rand_base((4, 3), dt)
    x = base.transpose(0, 1)
    add(f"clamp {dt} {lo} {hi}", "clamp", [(base, [("transpose", 0, 1)])], via_f32(lambda xx: torch.clamp(xx, lo, hi), x), [lo, hi])
x = torch.tensor([float("nan"), -3.0, 3.0, 0.1])
add("clamp f32 nan", "clamp", [(x, ())], torch.clamp(x, -1.0, 1.0), [-1.0, 1.0])

# ---- reductions ----------------------------------------------------------------------
for op in ["sum", "mean", "max", "min", "argmax", "argmin", "var"]:
    for dt in FLOATS + (["i32", "i64", "bool"] if op in ("sum", "max", "min", "argmax", "argmin") else []):
        if dt == "bool" and op != "sum":
            continue
        for dims in [None, 0, 1, 2, [0, 2], [1, 2]]:
            if op in ("argmax", "argmin") and isinstance(dims, list):
                continue
            for keep in [False, True]:
                for lay in ["contig", "permuted"]:
                    if lay == "contig":
                        base, views = rand_base((3, 4, 5), dt), ()
                    else:
                        base, views = rand_base((5, 3, 4), dt), (("permute", 1, 2, 0),)
                    x = apply_views(base, views)
                    if dt in ("bf16", "f16") and op in ("sum", "mean", "var"):
                        # the correctly rounded result: torch 1.13 rounds partial sums of
                        # multi-dim bf16 reductions, lutra accumulates in f64 and rounds once
                        red = via_f64
                    else:
                        red = via_f32
                    if op in ("max", "min", "argmax", "argmin"):
                        if dims is None:
                            out = via_f32(getattr(torch, op), x)
                            if keep:
                                continue
                        elif op in ("max", "min"):
                            if isinstance(dims, list):
                                out = via_f32(lambda xx: getattr(torch, "amax" if op == "max" else "amin")(xx, dims, keepdim=keep), x)
                            else:
                                out = via_f32(lambda xx: getattr(torch, op)(xx, dims, keepdim=keep).values, x)
                        else:
                            out = via_f32(lambda xx: getattr(torch, op)(xx, dims, keepdim=keep), x)
                    elif op == "var":
                        for corr in [0, 1]:
                            out = red(lambda xx: torch.var(xx, dims, unbiased=bool(corr), keepdim=keep)
                                          if dims is not None else torch.var(xx, unbiased=bool(corr)), x)
                            if dims is None and keep:
                                continue
                            cases.append({"name": f"var {dt} {dims} keep={keep} corr={corr} {lay}", "op": "var",
                                          "args": [dims, keep, corr], "inputs": [spec(base, views)],
                                          "expect": expect(out)})
                        continue
                    else:
                        out = red(lambda xx: getattr(torch, op)(xx, dims, keepdim=keep) if dims is not None
                                      else getattr(torch, op)(xx), x)
                        if dims is None and keep:
                            continue
                    add(f"{op} {dt} {dims} keep={keep} {lay}", op, [(base, views)], out, [dims, keep])
for op in ["sum", "mean"]:
    e = torch.zeros(0, 3)
    add(f"{op} empty dim0", op, [(e, ())], getattr(torch, op)(e, 0), [0, False])
    add(f"{op} empty all", op, [(e, ())], getattr(torch, op)(e), [None, False])
x = torch.tensor([[1.0, float("nan"), 3.0], [2.0, 5.0, 4.0]])
for op in ["max", "argmax", "min", "argmin"]:
    out = getattr(torch, op)(x, 1)
    out = out.values if op in ("max", "min") else out
    add(f"{op} nan", op, [(x, ())], out, [1, False])

# ---- matmul --------------------------------------------------------------------------
MM = [((3, 4), (), (4, 5), ()), ((4,), (), (4,), ()), ((3,), (), (3, 4), ()), ((3, 4), (), (4,), ()),
      ((2, 3, 4), (), (4, 5), ()), ((2, 1, 3, 4), (), (5, 4, 2), ()),
      ((4, 3), (("transpose", 0, 1),), (4, 5), ()), ((3, 4), (), (5, 4), (("transpose", 0, 1),)),
      ((4, 3), (("transpose", 0, 1),), (5, 4), (("transpose", 0, 1),)),
      ((3, 9), (("narrow", 1, 2, 4),), (4, 5), ()), ((2, 4, 3), (("transpose", 1, 2),), (2, 4, 6), ()),
      ((3, 0), (), (0, 5), ()), ((0, 4), (), (4, 5), ()), ((1, 4), (), (4, 1), ()),
      ((5, 1), (("expand", 5, 4),), (4, 3), ())]
for dt in ["f32", "f64", "bf16", "f16"]:
    for sa, va, sb, vb in MM:
        a, b = rand_base(sa, dt), rand_base(sb, dt)
        xa, xb = apply_views(a, va), apply_views(b, vb)
        if dt in ("bf16", "f16"):
            out = torch.matmul(xa.float(), xb.float()).to(DT[dt])
        else:
            out = torch.matmul(xa, xb)
        add(f"matmul {dt} {list(xa.shape)}x{list(xb.shape)} {va}{vb}", "matmul", [(a, va), (b, vb)], out)

# ---- indexing --------------------------------------------------------------------------
for dt in ["f32", "bf16", "i64", "f64"]:
    t = rand_base((5, 3), dt)
    for idt in ["i64", "i32"]:
        idx = torch.tensor([4, 0, 0, 2], dtype=DT[idt])
        add(f"index_select {dt} {idt} dim0", "index_select", [(t, ()), (idx, ())], t.index_select(0, idx.long()), [0])
        add(f"index_select {dt} {idt} dim1", "index_select", [(t, ()), (torch.tensor([2, 1], dtype=DT[idt]), ())],
            t.index_select(1, torch.tensor([2, 1])), [1])
    g = torch.tensor([[0, 2], [1, 1], [2, 0], [0, 0]])
    tt = rand_base((4, 3), dt)
    add(f"gather {dt} dim1", "gather", [(tt, ()), (g, ())], tt.gather(1, g), [1])
    g0 = torch.tensor([[3, 0, 1], [0, 2, 3]])
    add(f"gather {dt} dim0", "gather", [(tt, ()), (g0, ())], tt.gather(0, g0), [0])
    src = rand_base((4, 2), dt)
    tgt = rand_base((4, 3), dt)
    out = tgt.clone().scatter_add_(1, g, src)  # bf16: torch rounds after each add, as lutra
    add(f"scatter_add {dt} dim1", "scatter_add", [(tgt, ()), (g, ()), (src, ())], out, [1])
    tgt = rand_base((5, 3), dt)
    src = rand_base((4, 3), dt)
    idx = torch.tensor([4, 1, 4, 0])
    out = tgt.clone().index_add_(0, idx, src)
    add(f"index_add {dt} dim0", "index_add", [(tgt, ()), (idx, ()), (src, ())], out, [0])
g = torch.tensor([[0, 2], [1, 1], [2, 0]])
base = torch.randn(3, 4)
add("gather transposed", "gather", [(base, [("transpose", 0, 1)]), (g, ())], base.transpose(0, 1).gather(1, g), [1])

# ---- conversions -------------------------------------------------------------------------
conv_vals = torch.tensor([0.0, -0.0, 1.0, -1.5, 2.5, 3.5, 100.25, 1.0 / 3.0, 65504.0, 65520.0, 1e-8,
                          6e-8, 1.00390625, 1.01171875, 3.0e38, -7.75, 255.0, 127.0],
                         dtype=torch.float64)
specials = torch.tensor([float("nan"), float("inf"), float("-inf"), 1e39], dtype=torch.float64)
for src in FLOATS:
    x = conv_vals.to(DT[src])
    xs = specials.to(DT[src])
    for dst in FLOATS + INTS + ["bool"]:
        if dst in INTS:
            ok = x.to(torch.float64)
            keep = (ok.abs() < 120) & ((ok >= 0) | (dst != "u8"))  # in range for every int dtype
            xi = x[keep]
            add(f"to {src}->{dst}", "to", [(xi, ())], xi.to(DT[dst]), [dst])
        else:
            add(f"to {src}->{dst}", "to", [(x, ())], x.to(DT[dst]), [dst])
            add(f"to {src}->{dst} specials", "to", [(xs, ())], xs.to(DT[dst]), [dst])
int_vals = torch.tensor([0, 1, -1, 7, -128, 127, 100], dtype=torch.int64)
for src in INTS + ["bool"]:
    x = (int_vals.abs() if src == "u8" else int_vals).to(DT[src]) if src != "bool" else (int_vals != 0)
    for dst in FLOATS + INTS + ["bool"]:
        add(f"to {src}->{dst}", "to", [(x, ())], x.to(DT[dst]), [dst])
# rounding to nearest even into bf16 and f16 on random f32 bits near the halfway points
r = torch.randn(2000, dtype=torch.float32) * torch.exp(torch.randn(2000) * 6)
for dst in ["bf16", "f16"]:
    add(f"to f32->{dst} random", "to", [(r, ())], r.to(DT[dst]), [dst])

# ---- views, copied out with contiguous() -----------------------------------------------------
base = torch.randn(2, 3, 4)
for views in [[("transpose", 0, 2)], [("permute", 2, 0, 1)], [("narrow", 2, 1, 2)], [("select", 1, 2)],
              [("unsqueeze", 1), ("expand", 2, 5, 3, 4)], [("transpose", 1, 2), ("narrow", 1, 1, 3)]]:
    add(f"view {views}", "contiguous", [(base, views)], apply_views(base, views).contiguous())

json.dump({"torch": torch.__version__, "cases": cases}, open(sys.argv[1], "w"), separators=(",", ":"))
print(f"wrote {len(cases)} cases to {sys.argv[1]}")
