/*
 * ops/loss.c: the dispatch of cross-entropy (fused with log-softmax): its
 * checks, each row's loss and log-sum-exp from the backend's kernels
 * (kernels/cpu/loss.c, kernels/cuda), with the logits' gradient written
 * over them in the same pass where asked (llm.c's fused classifier), the
 * report of a target out of range, and the backward. The differentiable
 * entry points (lt_cross_entropy; lt_linear_cross_entropy, the head with its
 * loss) are host/autograd/loss.c and host/autograd/linear.c.
 */
#include "core/iter.h"
#include "ops/nn.h"

#include <string.h>

lt_status lt_op_cross_entropy_check(const char *op, const lt_tensor *logits, const lt_tensor *targets, int reduction,
                                    int64_t classes, const lt_backend_i **bep, int64_t *Vp) {
  const lt_tensor *ins[2] = {logits, targets};
  static const char *const names[2] = {"logits", "targets"};
  const lt_backend_i *be;
  char b1[200], b2[200];
  LT_TRY(lt_same_device_named(op, 2, ins, names, &be));
  LT_TRY(lt_nn_need_float(op, logits));
  if (targets->dtype != LT_DTYPE_I32 && targets->dtype != LT_DTYPE_I64)
    return lt_fail(LT_ERR_DTYPE, "%s: targets must be integer class ids (i32 or i64), got %s", op,
                   lt_dtype_name(targets->dtype));
  if (logits->ndim != 2 || targets->ndim != 1 || targets->sizes[0] != logits->sizes[0])
    return lt_fail(LT_ERR_SHAPE, "%s: expects logits (N, V) and targets (N), got %s and %s", op,
                   lt_tensor_shape_str(logits, b1), lt_tensor_shape_str(targets, b2));
  if (reduction < 0 || reduction > 2)
    return lt_fail(LT_ERR_ARG, "%s: reduction must be mean, sum or none", op);
  if (!be->cross_entropy_fwd)
    return lt_fail(LT_ERR_UNSUPPORTED, "%s: not implemented on the %s backend", op, be->name);
  int64_t W = logits->sizes[1];
  if (classes < 0 || classes > W)
    return lt_fail(LT_ERR_ARG, "%s: classes %lld is outside [1, %lld] (the logits' last dim; 0 takes them all)", op,
                   (long long)classes, (long long)W);
  *Vp = classes > 0 ? classes : W; /* the columns past V are padding: no logits, zero gradient */
  *bep = be;
  return LT_OK;
}

/* Target pos of the contiguous targets t, read from its device (as a double
   holds it, as lt_tensor_item reads; 0 when the read fails). */
static int64_t target_at(const lt_tensor *t, int64_t pos) {
  const lt_backend_i *be = t->storage->backend;
  size_t es = lt_dtype_size(t->dtype);
  const char *p = lt_tensor_ptr(t) + (size_t)pos * es;
  if (t->dtype == LT_DTYPE_I32) {
    int32_t v = 0;
    return be->copy_to_host(t->storage->device, &v, p, es) == LT_OK ? (int64_t)(double)v : 0;
  }
  int64_t v = 0;
  return be->copy_to_host(t->storage->device, &v, p, es) == LT_OK ? (int64_t)(double)v : 0;
}

/* A target outside [0, V) found by a cross-entropy kernel: deferred to the
   next read (a GPU) or reported now, naming the row and the value */
static lt_status ce_report(const lt_backend_i *be, lt_status st, int64_t bad, const char *op, int64_t V,
                           int64_t ignore_index, const lt_tensor *tc) {
  lt_index_report rep;
  memset(&rep, 0, sizeof rep);
  rep.kind = LT_REPORT_TARGET, rep.op = op, rep.limit = V, rep.ignore = ignore_index, rep.index = (lt_tensor *)tc;
  if (st == LT_OK && bad == LT_BAD_LATER)
    return lt_index_defer(be, &rep);
  if (st != LT_OK && bad >= 0)
    return lt_index_report_fail(&rep, bad, target_at(tc, bad));
  return st;
}

lt_status lt_op_cross_entropy_fwd(const char *op, lt_dtype cd, lt_dtype sd, const lt_tensor *xt, int64_t ldx,
                                  const lt_tensor *tc, int64_t V, int64_t ignore_index, int grad_in_place,
                                  lt_tensor **rows, lt_tensor **lse) {
  const lt_backend_i *be = xt->storage->backend;
  int64_t N = xt->sizes[0];
  *rows = *lse = NULL;
  lt_status st = lt_tensor_empty(1, &N, sd, xt->storage->device, rows);
  if (st == LT_OK)
    st = lt_tensor_empty(1, &N, sd, xt->storage->device, lse);
  /* with grad_in_place, the rows' gradient d(row loss)/d(logits): scale NULL
     (1; the count and the loss's gradient are the caller's to apply) */
  int64_t bad = -1;
  void *x = lt_tensor_ptr(xt), *t = lt_tensor_ptr(tc);
  if (st == LT_OK && grad_in_place && be->cross_entropy_fwd_bwd) { /* one kernel: the loss and the gradient */
    st = be->cross_entropy_fwd_bwd(cd, x, ldx, t, tc->dtype, N, V, ignore_index, lt_tensor_ptr(*rows),
                                   lt_tensor_ptr(*lse), NULL, x, &bad);
    st = ce_report(be, st, bad, op, V, ignore_index, tc);
  } else if (st == LT_OK) {
    st = be->cross_entropy_fwd(cd, x, ldx, t, tc->dtype, N, V, ignore_index, lt_tensor_ptr(*rows),
                               lt_tensor_ptr(*lse), &bad);
    st = ce_report(be, st, bad, op, V, ignore_index, tc);
    if (st == LT_OK && grad_in_place) /* (each element read before it is written) */
      st = be->cross_entropy_bwd(cd, x, ldx, t, tc->dtype, N, V, ldx, ignore_index, lt_tensor_ptr(*lse), NULL, x);
  }
  if (st != LT_OK) {
    lt_tensor_release(*rows);
    lt_tensor_release(*lse);
    *rows = *lse = NULL;
  }
  return st;
}

lt_status lt_op_cross_entropy_bwd(const lt_tensor *x, int64_t V, const lt_tensor *t, int64_t ignore,
                                  const lt_tensor *lse, const lt_tensor *scale, lt_tensor **dx) {
  int64_t N = x->sizes[0], W = x->sizes[1], ldx = N > 1 ? x->strides[0] : W;
  LT_TRY(lt_tensor_empty_like(x, x->dtype, dx));
  lt_status st = x->storage->backend->cross_entropy_bwd(x->dtype, lt_tensor_ptr(x), ldx, lt_tensor_ptr(t), t->dtype,
                                                        N, V, W, ignore, lt_tensor_ptr(lse), lt_tensor_ptr(scale),
                                                        lt_tensor_ptr(*dx));
  if (st != LT_OK) {
    lt_tensor_release(*dx);
    *dx = NULL;
  }
  return st;
}
