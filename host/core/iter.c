/*
 * iter.c: broadcasting, output checks and the dimension coalescing that turns
 * tensors into an lt_iter: size-1 dims dropped, dims ordered by the output's
 * strides (so a transposed output is walked in memory order), and adjacent
 * dims merged where every operand is contiguous across them.
 */
#include "core/iter.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

void lt_iter_build(lt_iter *it, int nops, const lt_tensor *const *ops) {
  const lt_tensor *out = ops[0];
  int nd = out->ndim;
  int64_t shape[LT_MAX_DIMS], strides[LT_ITER_MAX_OPS][LT_MAX_DIMS];
  int n = 0;
  it->nops = nops;
  it->numel = 1;
  for (int k = 0; k < nops; k++) {
    it->data[k] = lt_tensor_ptr(ops[k]);
    it->dtypes[k] = ops[k]->dtype;
  }
  for (int d = 0; d < nd; d++) {
    it->numel *= out->sizes[d];
    if (out->sizes[d] == 1)
      continue;
    shape[n] = out->sizes[d];
    for (int k = 0; k < nops; k++) {
      const lt_tensor *t = ops[k];
      int j = d - (nd - t->ndim);
      strides[k][n] = (j < 0 || t->sizes[j] == 1) ? 0 : t->strides[j];
    }
    n++;
  }
  /* order dims by decreasing |output stride|, then by the first input's (stable) */
  int perm[LT_MAX_DIMS];
  for (int d = 0; d < n; d++)
    perm[d] = d;
  for (int i = 1; i < n; i++) {
    int p = perm[i], j = i;
    while (j > 0) {
      int q = perm[j - 1], before = 0;
      for (int k = 0; k < nops; k++) {
        int64_t sp = llabs(strides[k][p]), sq = llabs(strides[k][q]);
        if (sp == sq)
          continue;
        before = sp > sq;
        break;
      }
      if (!before)
        break;
      perm[j] = q;
      j--;
    }
    perm[j] = p;
  }
  /* merge adjacent dims that are contiguous in every operand */
  int m = 0;
  for (int i = 0; i < n; i++) {
    int d = perm[i];
    if (m > 0) {
      int ok = 1;
      for (int k = 0; k < nops && ok; k++)
        ok = it->strides[k][m - 1] == strides[k][d] * shape[d];
      if (ok) {
        it->shape[m - 1] *= shape[d];
        for (int k = 0; k < nops; k++)
          it->strides[k][m - 1] = strides[k][d];
        continue;
      }
    }
    it->shape[m] = shape[d];
    for (int k = 0; k < nops; k++)
      it->strides[k][m] = strides[k][d];
    m++;
  }
  it->ndim = m;
}

static int category(lt_dtype d) {
  return d == LT_DTYPE_BOOL ? 0 : lt_dtype_is_float(d) ? 2 : 1;
}

lt_dtype lt_result_type(int n, const lt_tensor *const *ts) {
  int have_dim = 0, have_zero = 0;
  lt_dtype dim = LT_DTYPE_BOOL, zero = LT_DTYPE_BOOL;
  for (int i = 0; i < n; i++) {
    lt_dtype d = ts[i]->dtype;
    if (ts[i]->ndim > 0) {
      dim = have_dim ? lt_dtype_promote(dim, d) : d;
      have_dim = 1;
    } else {
      zero = have_zero ? lt_dtype_promote(zero, d) : d;
      have_zero = 1;
    }
  }
  if (!have_dim)
    return zero;
  if (have_zero && category(zero) > category(dim))
    return zero;
  return dim;
}

static const char *shape_of(const lt_tensor *t, char *buf) { return lt_tensor_shape_str(t, buf); }

lt_status lt_broadcast_shape(const char *op, int n, const lt_tensor *const *ts, int *ndim, int64_t *shape) {
  int nd = 0;
  for (int i = 0; i < n; i++)
    if (ts[i]->ndim > nd)
      nd = ts[i]->ndim;
  for (int d = 0; d < nd; d++) {
    int64_t size = 1;
    int from = -1;
    for (int i = 0; i < n; i++) {
      int j = d - (nd - ts[i]->ndim);
      if (j < 0)
        continue;
      int64_t s = ts[i]->sizes[j];
      if (s == 1)
        continue;
      if (size != 1 && s != size) {
        char b1[200], b2[200];
        return lt_fail(LT_ERR_SHAPE,
                       "%s: shapes %s and %s cannot be broadcast together (dim %d from the right: %"
                       PRId64 " vs %" PRId64 ")", op, shape_of(ts[from], b1), shape_of(ts[i], b2),
                       nd - d, size, s);
      }
      size = s;
      from = i;
    }
    shape[d] = size;
  }
  *ndim = nd;
  return LT_OK;
}

lt_status lt_prepare_out(const char *op, int ndim, const int64_t *shape, lt_dtype dtype,
                         lt_device device, lt_tensor *out, lt_tensor **res) {
  if (!out)
    return lt_tensor_empty(ndim, shape, dtype, device, res);
  char b1[200], b2[200], d1[16], d2[16];
  int same = out->ndim == ndim;
  for (int d = 0; same && d < ndim; d++)
    same = out->sizes[d] == shape[d];
  if (!same)
    return lt_fail(LT_ERR_SHAPE, "%s: the result has shape %s but the output tensor has shape %s", op,
                   lt_shape_str(ndim, shape, b1), shape_of(out, b2));
  if (out->storage->device != device)
    return lt_fail(LT_ERR_DEVICE, "%s: the output tensor is on %s but the inputs are on %s", op,
                   lt_device_name(out->storage->device, d1), lt_device_name(device, d2));
  int64_t numel = 1;
  for (int d = 0; d < ndim; d++)
    numel *= shape[d];
  for (int d = 0; d < ndim && numel > 0; d++)
    if (out->strides[d] == 0 && out->sizes[d] > 1)
      return lt_fail(LT_ERR_ARG,
                     "%s: cannot write into an expanded tensor of shape %s (dim %d has stride 0); "
                     "clone() it first", op, shape_of(out, b1), d + 1);
  lt_tensor_retain(out);
  *res = out;
  return LT_OK;
}

lt_status lt_same_device_named(const char *op, int n, const lt_tensor *const *ts, const char *const *names,
                               const lt_backend_i **be) {
  for (int i = 0; i < n; i++)
    LT_TRY(lt_check_tensor(op, ts[i], i + 1));
  lt_device dev = ts[0]->storage->device;
  for (int i = 1; i < n; i++)
    if (ts[i]->storage->device != dev) {
      char d1[16], d2[16], arg[24];
      snprintf(arg, sizeof arg, "argument %d", i + 1);
      return lt_fail(LT_ERR_DEVICE, "%s: tensors are on different devices (%s on %s, %s on %s); move one with :to()",
                     op, names ? names[0] : "argument 1", lt_device_name(dev, d1), names ? names[i] : arg,
                     lt_device_name(ts[i]->storage->device, d2));
    }
  *be = ts[0]->storage->backend;
  return lt_check_interrupt(op);
}

lt_status lt_same_device(const char *op, int n, const lt_tensor *const *ts, const lt_backend_i **be) {
  return lt_same_device_named(op, n, ts, NULL, be);
}
