/*
 * ops/reduce.c: the reduction dispatch lt_op_reduce (sum, mean, max, min,
 * argmax, argmin, var, std over a set of dims with keepdim): checks dims and
 * dtypes, shapes the output and describes kept and reduced dims to the
 * backend kernel. No autograd (lt_reduce, autograd/reduce.c, records).
 */
#include "core/iter.h"
#include "ops/ops.h"

#include <string.h>

static const char *const reduce_names[LT_REDUCE_COUNT] = {"sum", "mean", "max", "min",
                                                           "argmax", "argmin", "var", "std"};

lt_status lt_op_reduce(lt_reduce_op op, const lt_tensor *a, int ndims, const int64_t *dims, int keepdim,
                       int64_t correction, lt_tensor **res) {
  if ((unsigned)op >= LT_REDUCE_COUNT)
    return lt_fail(LT_ERR_ARG, "reduce: invalid op code %d", (int)op);
  const char *name = reduce_names[op];
  const lt_backend_i *be;
  LT_TRY(lt_same_device(name, 1, &a, &be));
  char b[200];
  int reduced[LT_MAX_DIMS] = {0};
  if (ndims < 0)
    return lt_fail(LT_ERR_ARG, "%s: negative number of dims (%d)", name, ndims);
  for (int i = 0; i < ndims; i++) {
    if (dims[i] < 0 || dims[i] >= a->ndim)
      return lt_fail(LT_ERR_ARG, "%s: dim %lld is out of range for a %d-dim tensor of shape %s", name,
                     (long long)dims[i] + 1, a->ndim, lt_tensor_shape_str(a, b));
    if (reduced[dims[i]])
      return lt_fail(LT_ERR_ARG, "%s: dim %lld is listed twice", name, (long long)dims[i] + 1);
    reduced[dims[i]] = 1;
  }
  if (ndims == 0)
    for (int d = 0; d < a->ndim; d++)
      reduced[d] = 1;
  int is_arg = op == LT_REDUCE_ARGMAX || op == LT_REDUCE_ARGMIN;
  if (is_arg && ndims > 1)
    return lt_fail(LT_ERR_ARG, "%s: takes one dim (or none, over all elements), got %d", name, ndims);
  int is_float = lt_dtype_is_float(a->dtype);
  if ((op == LT_REDUCE_MEAN || op == LT_REDUCE_VAR || op == LT_REDUCE_STD) && !is_float)
    return lt_fail(LT_ERR_DTYPE, "%s: needs a float tensor, got %s; convert with :to('f32') first",
                   name, lt_dtype_name(a->dtype));
  if (correction < 0)
    return lt_fail(LT_ERR_ARG, "%s: correction must be >= 0, got %lld", name, (long long)correction);

  lt_reduce_iter it;
  memset(&it, 0, sizeof it);
  int64_t out_sizes[LT_MAX_DIMS];
  int nout = 0;
  it.red_numel = 1;
  for (int d = 0; d < a->ndim; d++) {
    if (reduced[d]) {
      it.red_numel *= a->sizes[d];
      if (keepdim)
        out_sizes[nout++] = 1;
    } else {
      out_sizes[nout++] = a->sizes[d];
    }
  }
  if ((op == LT_REDUCE_MAX || op == LT_REDUCE_MIN || is_arg) && it.red_numel == 0)
    return lt_fail(LT_ERR_SHAPE, "%s: cannot reduce over an empty extent (shape %s) with no identity",
                   name, lt_tensor_shape_str(a, b));
  lt_dtype od = a->dtype;
  if (is_arg || (op == LT_REDUCE_SUM && !is_float))
    od = LT_DTYPE_I64;
  if (!be->reduce)
    return lt_fail(LT_ERR_UNSUPPORTED, "%s: not implemented on the %s backend", name, be->name);
  lt_tensor *r;
  LT_TRY(lt_tensor_empty(nout, out_sizes, od, a->storage->device, &r));

  /* kept dims with the output's strides; reduced dims merged where contiguous */
  int64_t ostrides[LT_MAX_DIMS];
  lt_contiguous_strides(nout, out_sizes, ostrides);
  it.out_numel = 1;
  for (int d = 0, o = 0; d < a->ndim; d++) {
    if (!reduced[d]) {
      it.keep_shape[it.nkeep] = a->sizes[d];
      it.in_keep_strides[it.nkeep] = a->strides[d];
      it.out_strides[it.nkeep] = ostrides[o];
      it.out_numel *= a->sizes[d];
      it.nkeep++;
      o++;
    } else {
      if (keepdim)
        o++;
      if (a->sizes[d] == 1)
        continue;
      int m = it.nred;
      if (m > 0 && it.red_shape[m - 1] != 0 && a->sizes[d] != 0 &&
          it.in_red_strides[m - 1] == a->strides[d] * a->sizes[d]) {
        it.red_shape[m - 1] *= a->sizes[d];
        it.in_red_strides[m - 1] = a->strides[d];
      } else {
        it.red_shape[m] = a->sizes[d];
        it.in_red_strides[m] = a->strides[d];
        it.nred++;
      }
    }
  }
  if (it.nred == 0) { /* every reduced dim has size 1 (or none is reduced) */
    it.nred = 1;
    it.red_shape[0] = 1;
    it.in_red_strides[0] = 0;
  }
  it.in = lt_tensor_ptr(a);
  it.out = lt_tensor_ptr(r);
  it.in_dtype = a->dtype;
  it.out_dtype = od;
  lt_status st = be->reduce(op, &it, correction);
  if (st != LT_OK) {
    lt_tensor_release(r);
    return st;
  }
  *res = r;
  return LT_OK;
}
