/*
 * ops/softmax.c: the dispatch of softmax, log_softmax and scaled_softmax
 * (with the causal mask): their checks, and forward and backward over
 * contiguous rows (the softmax's dim last) through the backend's softmax
 * kernels (kernels/cpu/softmax.c, kernels/cuda). The differentiable entry
 * points are host/autograd/softmax.c.
 */
#include "core/iter.h"
#include "ops/nn.h"

lt_status lt_op_softmax_check(const char *op, const lt_tensor *x, int dim, double scale, int causal,
                              const lt_backend_i **bep, lt_dtype *cd) {
  const lt_backend_i *be;
  LT_TRY(lt_same_device(op, 1, &x, &be));
  LT_TRY(lt_nn_need_float(op, x));
  if (x->ndim == 0 || dim < 0 || dim >= x->ndim) {
    char b[200];
    return lt_fail(LT_ERR_ARG, "%s: dim %d is out of range for shape %s", op, dim + 1, lt_tensor_shape_str(x, b));
  }
  LT_TRY(lt_nn_check_scale(op, scale, lt_nn_compute_dtype(x->dtype)));
  if (causal && x->ndim < 2) {
    char b[200];
    return lt_fail(LT_ERR_SHAPE, "%s: a causal mask needs (..., queries, keys) scores, got shape %s", op,
                   lt_tensor_shape_str(x, b));
  }
  if (!be->softmax_fwd)
    return lt_fail(LT_ERR_UNSUPPORTED, "%s: not implemented on the %s backend", op, be->name);
  *cd = lt_nn_row_dtype(be, x->dtype);
  *bep = be;
  return LT_OK;
}

lt_status lt_op_softmax_fwd(lt_dtype cd, const lt_tensor *x, int log, double scale, int64_t causal_T, lt_tensor **y) {
  int64_t C = x->sizes[x->ndim - 1], N = C ? lt_tensor_numel(x) / C : 0;
  LT_TRY(lt_tensor_empty_like(x, cd, y));
  lt_status st = x->storage->backend->softmax_fwd(cd, lt_tensor_ptr(x), lt_tensor_ptr(*y), N, C, log, scale, causal_T);
  if (st != LT_OK) {
    lt_tensor_release(*y);
    *y = NULL;
  }
  return st;
}

lt_status lt_op_softmax_bwd(const lt_tensor *y, const lt_tensor *dy, int log, double scale, lt_tensor **dx) {
  lt_dtype cd = y->dtype;
  int ndim = y->ndim;
  int64_t C = ndim ? y->sizes[ndim - 1] : 1, N = C ? lt_tensor_numel(y) / C : 0;
  LT_TRY(lt_tensor_empty_like(y, cd, dx));
  lt_status st =
      y->storage->backend->softmax_bwd(cd, lt_tensor_ptr(y), lt_tensor_ptr(dy), lt_tensor_ptr(*dx), N, C, log, scale);
  if (st != LT_OK) {
    lt_tensor_release(*dx);
    *dx = NULL;
  }
  return st;
}
