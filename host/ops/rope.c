/*
 * ops/rope.c: the dispatch of rope (rotary position embedding, Su et al.
 * 2021): its checks, and the rotation (or its inverse, the backward) of
 * contiguous rows through the backend's rope kernel (kernels/cpu/rope.c,
 * kernels/cuda). The differentiable entry point is host/autograd/rope.c.
 */
#include "core/iter.h"
#include "ops/nn.h"

lt_status lt_op_rope_check(const lt_tensor *x, double base, int64_t start) {
  const lt_backend_i *be;
  char b[200];
  LT_TRY(lt_same_device("rope", 1, &x, &be));
  LT_TRY(lt_nn_need_float("rope", x));
  if (x->ndim < 2 || x->sizes[x->ndim - 1] % 2 != 0)
    return lt_fail(LT_ERR_SHAPE, "rope: expects (..., T, D) with an even head size D, got %s",
                   lt_tensor_shape_str(x, b));
  if (!(base > 0) || start < 0)
    return lt_fail(LT_ERR_ARG, "rope: base must be > 0 and the start position >= 0 (got %g and %lld)", base,
                   (long long)start);
  if (!be->rope)
    return lt_fail(LT_ERR_UNSUPPORTED, "rope: not implemented on the %s backend", be->name);
  return LT_OK;
}

lt_status lt_op_rope(const lt_tensor *x, double base, int64_t start, int inverse, lt_tensor **y) {
  lt_dtype cd = x->dtype;
  int64_t D = x->sizes[x->ndim - 1], Tn = x->sizes[x->ndim - 2];
  int64_t R = (Tn > 0 && D > 0) ? lt_tensor_numel(x) / (Tn * D) : 0;
  LT_TRY(lt_tensor_empty_like(x, cd, y));
  lt_status st = x->storage->backend->rope(cd, lt_tensor_ptr(x), lt_tensor_ptr(*y), R, Tn, D, base, start, inverse);
  if (st != LT_OK) {
    lt_tensor_release(*y);
    *y = NULL;
  }
  return st;
}
