/*
 * ops/rope.c: the dispatch of rope (rotary position embedding, Su et al.
 * 2021): its checks, and the rotation (or its inverse, the backward) of
 * contiguous rows through the backend's rope kernel (kernels/cpu/rope.c,
 * kernels/cuda). The differentiable entry point is host/autograd/rope.c.
 */
#include "core/iter.h"
#include "ops/nn.h"

lt_status lt_op_rope_check(const lt_tensor *x, double base, int64_t start, const lt_rope_scaling *sc) {
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
  if (sc && sc->kind != LT_ROPE_PLAIN && sc->kind != LT_ROPE_LINEAR && sc->kind != LT_ROPE_LLAMA3)
    return lt_fail(LT_ERR_ARG, "rope: scaling kind %d is not linear (1) or llama3 (2)", sc->kind);
  if (sc && sc->kind != LT_ROPE_PLAIN && !(sc->factor > 0))
    return lt_fail(LT_ERR_ARG, "rope: the scaling factor must be > 0, got %g", sc->factor);
  if (sc && sc->kind == LT_ROPE_LLAMA3 &&
      !(sc->low_freq_factor > 0 && sc->high_freq_factor > sc->low_freq_factor && sc->original_max > 0))
    return lt_fail(LT_ERR_ARG,
                   "rope: llama3 scaling needs 0 < low_freq_factor < high_freq_factor and original_max > 0 "
                   "(got %g, %g, %g)", sc->low_freq_factor, sc->high_freq_factor, sc->original_max);
  if (!be->rope)
    return lt_fail(LT_ERR_UNSUPPORTED, "rope: not implemented on the %s backend", be->name);
  return LT_OK;
}

lt_status lt_op_rope(const lt_tensor *x, double base, int64_t start, int inverse, const lt_rope_scaling *sc,
                     lt_tensor **y) {
  lt_dtype cd = x->dtype;
  int64_t D = x->sizes[x->ndim - 1], Tn = x->sizes[x->ndim - 2];
  int64_t R = (Tn > 0 && D > 0) ? lt_tensor_numel(x) / (Tn * D) : 0;
  LT_TRY(lt_tensor_empty_like(x, cd, y));
  lt_status st = x->storage->backend->rope(cd, lt_tensor_ptr(x), lt_tensor_ptr(*y), R, Tn, D, base, start, inverse, sc);
  if (st != LT_OK) {
    lt_tensor_release(*y);
    *y = NULL;
  }
  return st;
}
