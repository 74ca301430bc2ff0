/*
 * ops/elementwise.c: the elementwise dispatch (lt_op_unary, lt_op_binary,
 * lt_op_binary_scalar, lt_op_where, lt_op_clamp): checks shapes, dtypes and
 * devices, picks the result dtype and compute kind (type promotion as
 * torch), prepares the output, builds the iteration and calls the backend's
 * kernel. No autograd: the public lt_unary etc. (autograd/elementwise.c)
 * call these and record.
 */
#include "core/iter.h"
#include "ops/ops.h"

#include <math.h>
#include <string.h>

static const char *const unary_names[LT_UNARY_COUNT] = {"neg", "abs", "exp", "log", "sqrt",
                                                         "rsqrt", "tanh", "sigmoid", "sign",
                                                         "gelu", "silu"};
static const char *const binary_names[LT_BINARY_COUNT] = {
    "add", "sub", "mul", "div", "pow", "maximum", "minimum", "eq", "ne", "lt", "le", "gt", "ge",
    "gelu_backward", "silu_backward"};

static int is_comparison(lt_binary_op op) { return op >= LT_BINARY_EQ && op <= LT_BINARY_GE; }

static lt_status no_kernel(const char *op, const lt_backend_i *be) {
  return lt_fail(LT_ERR_UNSUPPORTED, "%s: not implemented on the %s backend", op, be->name);
}

/* torch's rule for writing a result into a given output: a float result
   cannot go into an integer tensor, nor anything but bool into a bool one.
   (copy_ and to convert freely; math ops do not.) */
static lt_status check_cast(const char *op, lt_dtype result, const lt_tensor *out) {
  if (!out)
    return LT_OK;
  int bad = (lt_dtype_is_float(result) && !lt_dtype_is_float(out->dtype)) ||
            (out->dtype == LT_DTYPE_BOOL && result != LT_DTYPE_BOOL);
  if (bad)
    return lt_fail(LT_ERR_DTYPE, "%s: the result is %s and cannot be written into the %s output tensor "
                   "(in-place ops keep their tensor's dtype; convert with :to() first)",
                   op, lt_dtype_name(result), lt_dtype_name(out->dtype));
  return LT_OK;
}

/* Runs a kernel on a prepared output, releasing it on failure. */
static lt_status finish(lt_status st, lt_tensor *r, lt_tensor **res) {
  if (st != LT_OK) {
    lt_tensor_release(r);
    return st;
  }
  *res = r;
  return LT_OK;
}

/* After a math op: an in-place result bumps its storage version. */
static lt_status settle(lt_status st, lt_tensor *out, lt_tensor *r, lt_tensor **res) {
  if (st == LT_OK && out)
    lt_bump_version(out);
  return finish(st, r, res);
}

/* ---- unary --------------------------------------------------------------- */

lt_status lt_op_unary_guarded(lt_unary_op op, const lt_tensor *a, lt_tensor *out, lt_tensor **res,
                              lt_write_guard guard) {
  if ((unsigned)op >= LT_UNARY_COUNT)
    return lt_fail(LT_ERR_ARG, "unary: invalid op code %d", (int)op);
  const char *name = unary_names[op];
  const lt_backend_i *be;
  LT_OP_SCOPE(name);
  LT_TRY(lt_same_device(name, 1, &a, &be));
  lt_dtype rd = a->dtype;
  if (op == LT_UNARY_NEG || op == LT_UNARY_ABS || op == LT_UNARY_SIGN) {
    if (rd == LT_DTYPE_BOOL)
      return lt_fail(LT_ERR_DTYPE, "%s: not defined for bool tensors", name);
  } else if (!lt_dtype_is_float(rd)) {
    rd = LT_DTYPE_F32;
  }
  if (!be->unary)
    return no_kernel(name, be);
  LT_TRY(check_cast(name, rd, out));
  if (guard)
    LT_TRY(guard(name, out, 1, &a));
  lt_tensor *r, *in;
  LT_TRY(lt_prepare_out(name, a->ndim, a->sizes, rd, a->storage->device, out, &r));
  lt_status st = lt_unalias(r, a, &in);
  if (st != LT_OK)
    return finish(st, r, res);
  lt_iter it;
  const lt_tensor *ops[2] = {r, in};
  lt_iter_build(&it, 2, ops);
  st = be->unary(op, lt_compute_for(rd), &it);
  lt_tensor_release(in);
  return settle(st, out, r, res);
}

lt_status lt_op_unary(lt_unary_op op, const lt_tensor *a, lt_tensor *out, lt_tensor **res) {
  return lt_op_unary_guarded(op, a, out, res, NULL);
}

/* ---- binary --------------------------------------------------------------- */

/* An operand ready for the kernel: converted first when the common dtype is
   unsigned and the operand a signed integer (torch wraps -3 to 253 before
   computing; loading it as i64 would keep -3), else unaliased from out. */
static lt_status cast_operand(const lt_tensor *out, const lt_tensor *in, lt_dtype common,
                              lt_tensor **safe) {
  int unsigned_common = common == LT_DTYPE_U8 || common == LT_DTYPE_U16;
  if (unsigned_common && in->dtype != common && in->dtype != LT_DTYPE_BOOL)
    return lt_op_tensor_to((lt_tensor *)in, common, in->storage->device, safe);
  return lt_unalias(out, in, safe);
}

lt_status lt_op_binary_guarded(lt_binary_op op, const lt_tensor *a, const lt_tensor *b, lt_tensor *out,
                               lt_tensor **res, lt_write_guard guard) {
  if ((unsigned)op >= LT_BINARY_COUNT)
    return lt_fail(LT_ERR_ARG, "binary: invalid op code %d", (int)op);
  const char *name = binary_names[op];
  const lt_tensor *ins[2] = {a, b};
  const lt_backend_i *be;
  LT_OP_SCOPE(name);
  LT_TRY(lt_same_device(name, 2, ins, &be));
  int ndim;
  int64_t shape[LT_MAX_DIMS];
  LT_TRY(lt_broadcast_shape(name, 2, ins, &ndim, shape));
  lt_dtype cd = lt_result_type(2, ins);
  lt_dtype rd = is_comparison(op) ? LT_DTYPE_BOOL : cd;
  if ((op == LT_BINARY_DIV || op >= LT_BINARY_GELU_GRAD) && !lt_dtype_is_float(cd))
    rd = cd = LT_DTYPE_F32;
  if (!be->binary)
    return no_kernel(name, be);
  LT_TRY(check_cast(name, rd, out));
  if (guard)
    LT_TRY(guard(name, out, 2, ins));
  lt_tensor *r, *sa = NULL, *sb = NULL;
  LT_TRY(lt_prepare_out(name, ndim, shape, rd, a->storage->device, out, &r));
  lt_status st = cast_operand(r, a, cd, &sa);
  if (st == LT_OK)
    st = cast_operand(r, b, cd, &sb);
  if (st == LT_OK) {
    lt_iter it;
    const lt_tensor *ops[3] = {r, sa, sb};
    lt_iter_build(&it, 3, ops);
    st = be->binary(op, lt_compute_for(cd), &it);
  }
  lt_tensor_release(sa);
  lt_tensor_release(sb);
  return settle(st, out, r, res);
}

lt_status lt_op_binary(lt_binary_op op, const lt_tensor *a, const lt_tensor *b, lt_tensor *out,
                       lt_tensor **res) {
  return lt_op_binary_guarded(op, a, b, out, res, NULL);
}

lt_status lt_op_binary_scalar_guarded(lt_binary_op op, const lt_tensor *a, double s, int reversed,
                                      lt_tensor *out, lt_tensor **res, lt_write_guard guard) {
  if ((unsigned)op >= LT_BINARY_COUNT)
    return lt_fail(LT_ERR_ARG, "binary: invalid op code %d", (int)op);
  const char *name = binary_names[op];
  const lt_backend_i *be;
  LT_OP_SCOPE(name);
  LT_TRY(lt_same_device(name, 1, &a, &be));
  lt_dtype cd = a->dtype;
  if (!lt_dtype_is_float(cd)) {
    if (s != floor(s) || isinf(s))
      cd = LT_DTYPE_F32; /* a fractional scalar makes an integer tensor float */
    else if (cd == LT_DTYPE_BOOL && !is_comparison(op))
      cd = LT_DTYPE_I64; /* bool arithmetic with a number counts */
    if (op == LT_BINARY_DIV)
      cd = LT_DTYPE_F32;
  }
  lt_dtype rd = is_comparison(op) ? LT_DTYPE_BOOL : cd;
  if (!be->binary_scalar)
    return no_kernel(name, be);
  LT_TRY(check_cast(name, rd, out));
  if (guard)
    LT_TRY(guard(name, out, 1, &a));
  lt_tensor *r, *sa;
  LT_TRY(lt_prepare_out(name, a->ndim, a->sizes, rd, a->storage->device, out, &r));
  lt_status st = lt_unalias(r, a, &sa);
  if (st != LT_OK)
    return finish(st, r, res);
  lt_iter it;
  const lt_tensor *ops[2] = {r, sa};
  lt_iter_build(&it, 2, ops);
  st = be->binary_scalar(op, lt_compute_for(cd), &it, s, reversed);
  lt_tensor_release(sa);
  return settle(st, out, r, res);
}

lt_status lt_op_binary_scalar(lt_binary_op op, const lt_tensor *a, double s, int reversed, lt_tensor *out,
                              lt_tensor **res) {
  return lt_op_binary_scalar_guarded(op, a, s, reversed, out, res, NULL);
}

/* ---- where, clamp ------------------------------------------------------------ */

lt_status lt_op_where_guarded(const lt_tensor *cond, const lt_tensor *a, const lt_tensor *b, lt_tensor *out,
                              lt_tensor **res, lt_write_guard guard) {
  const lt_tensor *ins[3] = {cond, a, b};
  const lt_backend_i *be;
  static const char *const names[3] = {"condition", "input", "other"};
  LT_OP_SCOPE("where");
  LT_TRY(lt_same_device_named("where", 3, ins, names, &be));
  if (cond->dtype != LT_DTYPE_BOOL)
    return lt_fail(LT_ERR_DTYPE, "where: the condition must be bool, got %s (compare it first, e.g. x:ne(0))",
                   lt_dtype_name(cond->dtype));
  int ndim;
  int64_t shape[LT_MAX_DIMS];
  LT_TRY(lt_broadcast_shape("where", 3, ins, &ndim, shape));
  lt_dtype rd = lt_result_type(2, ins + 1);
  if (!be->where)
    return no_kernel("where", be);
  LT_TRY(check_cast("where", rd, out));
  if (guard)
    LT_TRY(guard("where", out, 3, ins));
  lt_tensor *r, *safe[3] = {NULL, NULL, NULL};
  LT_TRY(lt_prepare_out("where", ndim, shape, rd, a->storage->device, out, &r));
  lt_status st = LT_OK;
  for (int i = 0; i < 3 && st == LT_OK; i++)
    st = i == 0 ? lt_unalias(r, ins[i], &safe[i]) : cast_operand(r, ins[i], rd, &safe[i]);
  if (st == LT_OK) {
    lt_iter it;
    const lt_tensor *ops[4] = {r, safe[0], safe[1], safe[2]};
    lt_iter_build(&it, 4, ops);
    st = be->where(lt_compute_for(rd), &it);
  }
  for (int i = 0; i < 3; i++)
    lt_tensor_release(safe[i]);
  return settle(st, out, r, res);
}

lt_status lt_op_where(const lt_tensor *cond, const lt_tensor *a, const lt_tensor *b, lt_tensor *out,
                      lt_tensor **res) {
  return lt_op_where_guarded(cond, a, b, out, res, NULL);
}

lt_status lt_op_clamp_guarded(const lt_tensor *a, double lo, int has_lo, double hi, int has_hi, lt_tensor *out,
                              lt_tensor **res, lt_write_guard guard) {
  const lt_backend_i *be;
  LT_OP_SCOPE("clamp");
  LT_TRY(lt_same_device("clamp", 1, &a, &be));
  lt_dtype rd = a->dtype;
  if (a->dtype == LT_DTYPE_BOOL)
    return lt_fail(LT_ERR_DTYPE, "clamp: not defined for bool tensors");
  if (!lt_dtype_is_float(rd) && ((has_lo && lo != floor(lo)) || (has_hi && hi != floor(hi))))
    rd = LT_DTYPE_F32;
  if (!be->clamp)
    return no_kernel("clamp", be);
  LT_TRY(check_cast("clamp", rd, out));
  if (guard)
    LT_TRY(guard("clamp", out, 1, &a));
  lt_tensor *r, *sa;
  LT_TRY(lt_prepare_out("clamp", a->ndim, a->sizes, rd, a->storage->device, out, &r));
  lt_status st = lt_unalias(r, a, &sa);
  if (st != LT_OK)
    return finish(st, r, res);
  lt_iter it;
  const lt_tensor *ops[2] = {r, sa};
  lt_iter_build(&it, 2, ops);
  st = be->clamp(lt_compute_for(rd), &it, lo, has_lo, hi, has_hi);
  lt_tensor_release(sa);
  return settle(st, out, r, res);
}

lt_status lt_op_clamp(const lt_tensor *a, double lo, int has_lo, double hi, int has_hi, lt_tensor *out,
                      lt_tensor **res) {
  return lt_op_clamp_guarded(a, lo, has_lo, hi, has_hi, out, res, NULL);
}

