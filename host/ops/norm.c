/*
 * ops/norm.c: the dispatch of layer_norm and rms_norm (each also with the
 * residual add fused in): their checks, and forward and backward on
 * contiguous rows through the backend's norm kernels (kernels/cpu/norm.c,
 * kernels/cuda). The differentiable entry points are host/autograd/norm.c.
 */
#include "core/iter.h"
#include "ops/nn.h"

#include <string.h>

static lt_status vector_of(const char *op, const char *what, const lt_tensor *v, int64_t C) {
  if (v && (v->ndim != 1 || v->sizes[0] != C)) {
    char b[200];
    return lt_fail(LT_ERR_SHAPE, "%s: %s has shape %s, expected [%lld] (the last dim of the input)", op, what,
                   lt_tensor_shape_str(v, b), (long long)C);
  }
  return LT_OK;
}

lt_status lt_op_norm_check(const char *op, int rms, const lt_tensor *x, const lt_tensor *res, const lt_tensor *w,
                           const lt_tensor *b, double eps, const lt_backend_i **bep, lt_dtype *cdp) {
  const lt_tensor *ins[4];
  const char *names[4];
  const lt_backend_i *be;
  int nin = 0;
  names[nin] = "input", ins[nin++] = x;
  if (res)
    names[nin] = "residual", ins[nin++] = res;
  if (w)
    names[nin] = "weight", ins[nin++] = w;
  if (b)
    names[nin] = "bias", ins[nin++] = b;
  if (!w && b)
    return lt_fail(LT_ERR_ARG, "%s: a bias needs a weight", op);
  LT_TRY(lt_same_device_named(op, nin, ins, names, &be));
  LT_TRY(lt_nn_need_float(op, x));
  if (x->ndim == 0)
    return lt_fail(LT_ERR_SHAPE, "%s: needs at least 1 dim", op);
  if (res) {
    char b1[200], b2[200];
    if (res->ndim != x->ndim || memcmp(res->sizes, x->sizes, sizeof(int64_t) * (size_t)x->ndim) != 0)
      return lt_fail(LT_ERR_SHAPE, "%s: the residual has shape %s, the input %s (they must match)", op,
                     lt_tensor_shape_str(res, b1), lt_tensor_shape_str(x, b2));
    if (res->dtype != x->dtype)
      return lt_fail(LT_ERR_DTYPE, "%s: the residual is %s, the input %s", op, lt_dtype_name(res->dtype),
                     lt_dtype_name(x->dtype));
  }
  int64_t C = x->sizes[x->ndim - 1];
  LT_TRY(vector_of(op, "the weight", w, C));
  LT_TRY(vector_of(op, "the bias", b, C));
  if (!(eps >= 0))
    return lt_fail(LT_ERR_ARG, "%s: eps must be >= 0, got %g", op, eps);
  if ((rms && !be->rms_norm_fwd) || (!rms && !be->layer_norm_fwd))
    return lt_fail(LT_ERR_UNSUPPORTED, "%s: not implemented on the %s backend", op, be->name);
  /* 16-bit rows natively only with weights of their dtype (f32 weights keep f32) */
  int same = (!w || w->dtype == x->dtype) && (!b || b->dtype == x->dtype);
  *cdp = same ? lt_nn_row_dtype(be, x->dtype) : lt_nn_compute_dtype(x->dtype);
  *bep = be;
  return LT_OK;
}

static const void *ptr_or_null(const lt_tensor *t) { return t ? lt_tensor_ptr(t) : NULL; }

lt_status lt_op_norm_fwd(int rms, lt_dtype cd, const lt_tensor *x, const lt_tensor *res, const lt_tensor *w,
                         const lt_tensor *b, double eps, lt_tensor **h_out, lt_tensor **y_out, lt_tensor **mean_out,
                         lt_tensor **rstd_out) {
  const lt_backend_i *be = x->storage->backend;
  lt_dtype sd = lt_nn_compute_dtype(cd);
  int64_t C = x->sizes[x->ndim - 1], N = C ? lt_tensor_numel(x) / C : 0;
  lt_tensor *h = NULL, *y = NULL, *mean = NULL, *rstd = NULL;
  lt_status st = LT_OK;
  if (res)
    st = lt_tensor_empty_like(x, cd, &h);
  if (st == LT_OK)
    st = lt_tensor_empty_like(x, cd, &y);
  if (st == LT_OK && !rms)
    st = lt_tensor_empty(1, &N, sd, x->storage->device, &mean);
  if (st == LT_OK)
    st = lt_tensor_empty(1, &N, sd, x->storage->device, &rstd);
  void *ph = h ? lt_tensor_ptr(h) : NULL;
  if (st == LT_OK)
    st = rms ? be->rms_norm_fwd(cd, lt_tensor_ptr(x), ptr_or_null(res), ptr_or_null(w), lt_tensor_ptr(y), ph,
                                lt_tensor_ptr(rstd), N, C, eps)
             : be->layer_norm_fwd(cd, lt_tensor_ptr(x), ptr_or_null(res), ptr_or_null(w), ptr_or_null(b),
                                  lt_tensor_ptr(y), ph, lt_tensor_ptr(mean), lt_tensor_ptr(rstd), N, C, eps);
  if (st != LT_OK) {
    lt_tensor *made[4] = {h, y, mean, rstd};
    for (int j = 0; j < 4; j++)
      lt_tensor_release(made[j]);
    return st;
  }
  if (h_out)
    *h_out = h;
  else
    lt_tensor_release(h);
  *y_out = y;
  *mean_out = mean;
  *rstd_out = rstd;
  return LT_OK;
}

lt_status lt_op_norm_bwd(int rms, const lt_tensor *dy, const lt_tensor *x, const lt_tensor *w, const lt_tensor *mean,
                         const lt_tensor *rstd, const lt_tensor *dadd, int need_dx, int need_dw, int need_db,
                         lt_tensor **dx_out, lt_tensor **dw_out, lt_tensor **db_out) {
  lt_dtype cd = x->dtype;
  int64_t C = x->sizes[x->ndim - 1], N = C ? lt_tensor_numel(x) / C : 0;
  const lt_backend_i *be = x->storage->backend;
  lt_tensor *dx = NULL, *dw = NULL, *db = NULL;
  lt_status st = LT_OK;
  if (need_dx)
    st = lt_tensor_empty_like(x, cd, &dx);
  if (st == LT_OK && w && need_dw)
    st = lt_tensor_empty_like(w, cd, &dw);
  if (st == LT_OK && need_db)
    st = lt_tensor_empty(1, &C, cd, x->storage->device, &db);
  const void *pdadd = ptr_or_null(dadd);
  if (st == LT_OK)
    st = rms ? be->rms_norm_bwd(cd, lt_tensor_ptr(dy), lt_tensor_ptr(x), ptr_or_null(w), lt_tensor_ptr(rstd), pdadd,
                                dx ? lt_tensor_ptr(dx) : NULL, dw ? lt_tensor_ptr(dw) : NULL, N, C)
             : be->layer_norm_bwd(cd, lt_tensor_ptr(dy), lt_tensor_ptr(x), ptr_or_null(w), lt_tensor_ptr(mean),
                                  lt_tensor_ptr(rstd), pdadd, dx ? lt_tensor_ptr(dx) : NULL,
                                  dw ? lt_tensor_ptr(dw) : NULL, db ? lt_tensor_ptr(db) : NULL, N, C);
  if (st != LT_OK) {
    lt_tensor_release(dx);
    lt_tensor_release(dw);
    lt_tensor_release(db);
    return st;
  }
  *dx_out = dx;
  *dw_out = dw;
  *db_out = db;
  return LT_OK;
}
