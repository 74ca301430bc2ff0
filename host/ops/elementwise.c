/*
 * ops.c: the elementwise op dispatcher and copies: checks shapes, dtypes and
 * devices, picks the result dtype and compute kind (type promotion as torch),
 * prepares the output, builds the iteration and calls the backend's kernel.
 * Also copy_, to, clone, fill_ and the conversions to and from f64 buffers.
 */
#include "autograd/autograd.h"
#include "autograd/grad-ops.h"
#include "core/iter.h"

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

/* After a math op: an in-place result bumps its storage version; a new one
   is recorded for autograd (rec is the op's record call's status). */
static lt_status settle(lt_status st, lt_tensor *out, lt_tensor *r, lt_tensor **res) {
  if (st == LT_OK && out)
    lt_bump_version(out);
  return finish(st, r, res);
}

/* ---- unary --------------------------------------------------------------- */

lt_status lt_unary(lt_unary_op op, const lt_tensor *a, lt_tensor *out, lt_tensor **res) {
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
  LT_TRY(lt_ag_check_inplace(name, out, 1, &a));
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
  if (st == LT_OK && !out)
    st = lt_ag_record_unary(op, a, r);
  return settle(st, out, r, res);
}

/* ---- binary --------------------------------------------------------------- */

/* An operand ready for the kernel: converted first when the common dtype is
   unsigned and the operand a signed integer (torch wraps -3 to 253 before
   computing; loading it as i64 would keep -3), else unaliased from out. */
static lt_status cast_operand(const lt_tensor *out, const lt_tensor *in, lt_dtype common,
                              lt_tensor **safe) {
  int unsigned_common = common == LT_DTYPE_U8 || common == LT_DTYPE_U16;
  if (unsigned_common && in->dtype != common && in->dtype != LT_DTYPE_BOOL)
    return lt_tensor_to((lt_tensor *)in, common, in->storage->device, safe);
  return lt_unalias(out, in, safe);
}

lt_status lt_binary(lt_binary_op op, const lt_tensor *a, const lt_tensor *b, lt_tensor *out,
                    lt_tensor **res) {
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
  LT_TRY(lt_ag_check_inplace(name, out, 2, ins));
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
  if (st == LT_OK && !out)
    st = lt_ag_record_binary(op, a, b, r);
  return settle(st, out, r, res);
}

lt_status lt_binary_scalar(lt_binary_op op, const lt_tensor *a, double s, int reversed,
                           lt_tensor *out, lt_tensor **res) {
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
  LT_TRY(lt_ag_check_inplace(name, out, 1, &a));
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
  if (st == LT_OK && !out)
    st = lt_ag_record_scalar(op, a, s, reversed, r);
  return settle(st, out, r, res);
}

/* ---- where, clamp ------------------------------------------------------------ */

lt_status lt_where(const lt_tensor *cond, const lt_tensor *a, const lt_tensor *b, lt_tensor *out,
                   lt_tensor **res) {
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
  LT_TRY(lt_ag_check_inplace("where", out, 3, ins));
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
  if (st == LT_OK && !out)
    st = lt_ag_record_where(cond, a, b, r);
  return settle(st, out, r, res);
}

lt_status lt_clamp(const lt_tensor *a, double lo, int has_lo, double hi, int has_hi, lt_tensor *out,
                   lt_tensor **res) {
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
  LT_TRY(lt_ag_check_inplace("clamp", out, 1, &a));
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
  if (st == LT_OK && !out)
    st = lt_ag_record_clamp(a, lo, has_lo, hi, has_hi, r);
  return settle(st, out, r, res);
}

/* ---- copies ------------------------------------------------------------------ */

/* dst <- src on one device; src broadcasts to dst's shape. */
static lt_status copy_same_device(lt_tensor *dst, const lt_tensor *src) {
  const lt_backend_i *be = dst->storage->backend;
  if (!be->copy)
    return no_kernel("copy_", be);
  lt_tensor *s;
  LT_TRY(lt_unalias(dst, src, &s));
  lt_iter it;
  const lt_tensor *ops[2] = {dst, s};
  lt_iter_build(&it, 2, ops);
  lt_status st = be->copy(&it);
  lt_tensor_release(s);
  return st;
}

/* Copies between devices through contiguous host staging. */
static lt_status copy_across_devices(lt_tensor *dst, const lt_tensor *src) {
  const lt_backend_i *dbe = dst->storage->backend, *sbe = src->storage->backend;
  lt_status st;
  lt_tensor *src_c = NULL, *host = NULL, *dev = NULL;
  /* 1. src as a contiguous tensor on its own device */
  st = lt_tensor_contiguous((lt_tensor *)src, &src_c);
  /* 2. bring it to the host */
  if (st == LT_OK) {
    if (src->storage->device == LT_DEVICE_CPU) {
      host = src_c;
      src_c = NULL;
    } else if (!sbe->copy_to_host) {
      st = no_kernel("copy_ (to host)", sbe);
    } else if ((st = lt_tensor_empty(src->ndim, src->sizes, src->dtype, LT_DEVICE_CPU, &host)) == LT_OK) {
      st = sbe->copy_to_host(src->storage->device, lt_tensor_ptr(host), lt_tensor_ptr(src_c),
                             (size_t)(lt_tensor_numel(host) * lt_dtype_size(host->dtype)));
    }
  }
  /* 3. onto the destination */
  if (st == LT_OK) {
    if (dst->storage->device == LT_DEVICE_CPU) {
      st = copy_same_device(dst, host);
    } else if (!dbe->copy_from_host) {
      st = no_kernel("copy_ (from host)", dbe);
    } else {
      lt_tensor *staged = NULL; /* host data in dst's dtype and shape, contiguous */
      st = lt_tensor_empty(dst->ndim, dst->sizes, dst->dtype, LT_DEVICE_CPU, &staged);
      if (st == LT_OK)
        st = copy_same_device(staged, host);
      if (st == LT_OK && lt_tensor_is_contiguous(dst)) {
        st = dbe->copy_from_host(dst->storage->device, lt_tensor_ptr(dst), lt_tensor_ptr(staged),
                                 (size_t)(lt_tensor_numel(dst) * lt_dtype_size(dst->dtype)));
      } else if (st == LT_OK) {
        st = lt_tensor_empty(dst->ndim, dst->sizes, dst->dtype, dst->storage->device, &dev);
        if (st == LT_OK)
          st = dbe->copy_from_host(dst->storage->device, lt_tensor_ptr(dev), lt_tensor_ptr(staged),
                                   (size_t)(lt_tensor_numel(dst) * lt_dtype_size(dst->dtype)));
        if (st == LT_OK)
          st = copy_same_device(dst, dev);
      }
      lt_tensor_release(staged);
    }
  }
  lt_tensor_release(src_c);
  lt_tensor_release(host);
  lt_tensor_release(dev);
  return st;
}

lt_status lt_tensor_copy_(lt_tensor *dst, const lt_tensor *src) {
  LT_TRY(lt_check_tensor("copy_", dst, 1));
  LT_TRY(lt_check_tensor("copy_", src, 2));
  LT_OP_SCOPE("copy_");
  LT_TRY(lt_check_interrupt("copy_"));
  LT_TRY(lt_ag_check_inplace("copy_", dst, 1, &src));
  const lt_tensor *ins[2] = {dst, src};
  int ndim;
  int64_t shape[LT_MAX_DIMS];
  LT_TRY(lt_broadcast_shape("copy_", 2, ins, &ndim, shape));
  lt_tensor *chk;
  LT_TRY(lt_prepare_out("copy_", ndim, shape, dst->dtype, dst->storage->device, dst, &chk));
  lt_tensor_release(chk);
  lt_status st = dst->storage->device == src->storage->device ? copy_same_device(dst, src)
                                                               : copy_across_devices(dst, src);
  if (st == LT_OK)
    lt_bump_version(dst);
  return st;
}

lt_status lt_tensor_clone(const lt_tensor *t, lt_tensor **out) {
  LT_OP_SCOPE("clone");
  LT_TRY(lt_check_tensor("clone", t, 1));
  lt_tensor *r;
  LT_TRY(lt_tensor_empty_like(t, t->dtype, &r));
  lt_status st = copy_same_device(r, t);
  if (st == LT_OK)
    st = lt_ag_record_view(LT_VIEW_IDENTITY, t, r, NULL, 0);
  return finish(st, r, out);
}

lt_status lt_tensor_to(lt_tensor *t, lt_dtype dtype, lt_device device, lt_tensor **out) {
  LT_OP_SCOPE("to");
  LT_TRY(lt_check_tensor("to", t, 1));
  if (t->dtype == dtype && t->storage->device == device) {
    lt_tensor_retain(t);
    *out = t;
    return LT_OK;
  }
  lt_tensor *r;
  LT_TRY(lt_tensor_empty_as("to", t->ndim, t->sizes, dtype, device, &r));
  lt_status st;
  LT_NO_GRAD(st = lt_tensor_copy_(r, t));
  if (st == LT_OK)
    st = lt_ag_record_view(LT_VIEW_CONVERT, t, r, NULL, 0);
  return finish(st, r, out);
}

lt_status lt_tensor_fill_(lt_tensor *t, double value) {
  LT_TRY(lt_check_tensor("fill_", t, 1));
  const lt_backend_i *be = t->storage->backend;
  LT_OP_SCOPE("fill_");
  LT_TRY(lt_check_interrupt("fill_"));
  LT_TRY(lt_ag_check_inplace("fill_", t, 0, NULL));
  if (!be->fill)
    return no_kernel("fill_", be);
  lt_iter it;
  const lt_tensor *ops[1] = {t};
  lt_iter_build(&it, 1, ops);
  lt_status st = be->fill(&it, value);
  if (st == LT_OK)
    lt_bump_version(t);
  return st;
}

/* ---- f64 buffers ------------------------------------------------------------- */

/* A CPU f64 tensor header over caller memory, valid while the buffer is. */
static void wrap_f64(lt_tensor *t, lt_storage *s, const double *data, int ndim, const int64_t *sizes) {
  memset(s, 0, sizeof *s);
  s->refcount = 1;
  s->data = (void *)data;
  s->device = LT_DEVICE_CPU;
  s->backend = &lt_backend_cpu;
  memset(t, 0, sizeof *t);
  t->refcount = 1;
  t->storage = s;
  t->ndim = ndim;
  t->dtype = LT_DTYPE_F64;
  memcpy(t->sizes, sizes, sizeof(int64_t) * (size_t)ndim);
  s->nbytes = (size_t)lt_contiguous_strides(ndim, sizes, t->strides) * 8;
}

lt_status lt_tensor_from_f64(const double *values, int ndim, const int64_t *sizes, lt_dtype dtype,
                             lt_device device, lt_tensor **out) {
  LT_OP_SCOPE("tensor");
  lt_tensor *r;
  LT_TRY(lt_tensor_empty(ndim, sizes, dtype, device, &r));
  lt_tensor src;
  lt_storage s;
  wrap_f64(&src, &s, values, ndim, sizes);
  lt_status st = lt_tensor_copy_(r, &src);
  return finish(st, r, out);
}

void lt_canonical_nans(double *v, int64_t n) {
  for (int64_t i = 0; i < n; i++)
    if (v[i] != v[i])
      v[i] = NAN;
}

lt_status lt_tensor_to_f64(const lt_tensor *t, double *dst, int64_t n) {
  LT_OP_SCOPE("totable");
  LT_TRY(lt_check_tensor("to_f64", t, 1));
  int64_t numel = lt_tensor_numel(t);
  if (n < numel)
    return lt_fail(LT_ERR_ARG, "to_f64: buffer of %lld doubles for %lld elements", (long long)n,
                   (long long)numel);
  lt_tensor d;
  lt_storage s;
  wrap_f64(&d, &s, dst, t->ndim, t->sizes);
  lt_status st;
  LT_NO_GRAD(st = lt_tensor_copy_(&d, t)); /* reading values out is not an op to record */
  if (st == LT_OK && lt_dtype_is_float(t->dtype))
    lt_canonical_nans(dst, numel);
  return st;
}

lt_status lt_tensor_item(const lt_tensor *t, double *value) {
  LT_OP_SCOPE("item");
  LT_TRY(lt_check_tensor("item", t, 1));
  if (lt_tensor_numel(t) != 1) {
    char b[200];
    return lt_fail(LT_ERR_SHAPE, "item: the tensor has %lld elements (shape %s), item() needs exactly 1",
                   (long long)lt_tensor_numel(t), lt_tensor_shape_str(t, b));
  }
  return lt_tensor_to_f64(t, value, 1);
}
