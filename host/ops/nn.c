/*
 * nn.c: the fused neural-network ops (layer_norm, rms_norm, each also with
 * the residual add fused in, softmax and log_softmax, cross_entropy, rope)
 * with their autograd nodes. Each
 * computes in f32 (f64 for f64 inputs: gradient checks) on contiguous rows
 * through the backend's row kernels (which read and write bf16/f16 rows as
 * they are where the backend has native_half_rows; elsewhere the rows are
 * converted), saves what its backward needs (mean and reciprocal std, the
 * softmax output, the logsumexp) and returns results in the input's dtype;
 * the loss and the statistics stay in f32.
 */
#include "autograd/autograd.h"
#include "core/iter.h"
#include "ops/loss.h"
#include "../../kernels/attention_rows.h"

#include <float.h>
#include <math.h>
#include <string.h>

/* The dtype row kernels run in for inputs of dtype d. */
static lt_dtype compute_dtype(lt_dtype d) { return d == LT_DTYPE_F64 ? LT_DTYPE_F64 : LT_DTYPE_F32; }

/* The dtype the backend's row kernels (norms, softmax, cross-entropy) read
   and write for inputs of dtype d: bf16/f16 as they are where the backend
   has native_half_rows, else the compute dtype. Their statistics (mean,
   rstd, log-sum-exp, per-row losses) are in compute_dtype(d). */
static lt_dtype row_dtype(const lt_backend_i *be, lt_dtype d) {
  if ((d == LT_DTYPE_BF16 || d == LT_DTYPE_F16) && be->native_half_rows)
    return d;
  return compute_dtype(d);
}

/* t as a contiguous tensor of dtype cd (t itself, retained, when it is one). */
static lt_status as_compute(const lt_tensor *t, lt_dtype cd, lt_tensor **out) {
  lt_status st;
  LT_NO_GRAD({
    lt_tensor *c = NULL;
    st = lt_tensor_to((lt_tensor *)t, cd, t->storage->device, &c);
    if (st == LT_OK) {
      st = lt_tensor_contiguous(c, out);
      lt_tensor_release(c);
    }
  });
  return st;
}

/* r converted to dtype d (consumes r). */
static lt_status to_dtype(lt_tensor *r, lt_dtype d, lt_tensor **out) {
  if (r->dtype == d) {
    *out = r;
    return LT_OK;
  }
  lt_status st;
  LT_NO_GRAD(st = lt_tensor_to(r, d, r->storage->device, out));
  lt_tensor_release(r);
  return st;
}

static lt_status need_float(const char *op, const lt_tensor *t) {
  if (!lt_dtype_is_float(t->dtype))
    return lt_fail(LT_ERR_DTYPE, "%s: needs a float tensor, got %s", op, lt_dtype_name(t->dtype));
  return LT_OK;
}

#define RELEASE_ALL(...)                                         \
  do {                                                           \
    lt_tensor *rel_[] = {__VA_ARGS__};                           \
    for (size_t k_ = 0; k_ < sizeof rel_ / sizeof rel_[0]; k_++) \
      lt_tensor_release(rel_[k_]);                               \
  } while (0)

/* ---- cross_entropy --------------------------------------------------------------------- */

static lt_status ce_backward(lt_node *n, lt_tensor *const *go, lt_tensor **gi) {
  lt_tensor *x, *tgt, *lse;
  LT_TRY(lt_ag_saved(n, 0, &x));
  LT_TRY(lt_ag_saved(n, 1, &tgt));
  LT_TRY(lt_ag_saved(n, 2, &lse));
  int64_t N = x->sizes[0], W = x->sizes[1], V = n->i[3], ldx = N > 1 ? x->strides[0] : W;
  int reduction = (int)n->i[0];
  double count = n->f[0];
  lt_tensor *scale = NULL, *g = NULL, *dx = NULL;
  lt_status st;
  /* the gradient of each row's loss: g (reduction none) or g broadcast, / count for mean */
  LT_NO_GRAD({ /* (in the statistics' dtype: f32 for 16-bit logits) */
    st = lt_tensor_to(go[0], lse->dtype, x->storage->device, &g);
    if (st == LT_OK)
      st = lt_tensor_empty(1, &N, lse->dtype, x->storage->device, &scale);
    if (st == LT_OK)
      st = lt_tensor_copy_(scale, g); /* broadcasts a 0-dim g */
    if (st == LT_OK && reduction == 0 && n->i[2]) { /* 1 / count on the device */
      lt_tensor *inv = NULL, *r = NULL;
      st = lt_ag_saved(n, 3, &inv);
      if (st == LT_OK)
        st = lt_binary(LT_BINARY_MUL, scale, inv, scale, &r);
      lt_tensor_release(r);
    } else if (st == LT_OK && reduction == 0) {
      lt_tensor *r = NULL;
      st = lt_binary_scalar(LT_BINARY_MUL, scale, count > 0 ? 1.0 / count : 0.0, 0, scale, &r);
      lt_tensor_release(r);
    }
  });
  if (st == LT_OK)
    st = lt_tensor_empty_like(x, x->dtype, &dx);
  if (st == LT_OK)
    st = x->storage->backend->cross_entropy_bwd(x->dtype, lt_tensor_ptr(x), ldx, lt_tensor_ptr(tgt), tgt->dtype, N,
                                                V, W, n->i[1], lt_tensor_ptr(lse), lt_tensor_ptr(scale),
                                                lt_tensor_ptr(dx));
  if (st == LT_OK) {
    lt_tensor_retain(dx);
    st = to_dtype(dx, n->in[0].dtype, &gi[0]);
  }
  RELEASE_ALL(scale, g, dx);
  return st;
}

static const lt_node_ops ce_ops = {"CrossEntropyBackward", ce_backward, NULL};

/* 1 / max(the targets that are not ignore, 1), a 0-dim tensor of dtype cd
   computed where the targets are (no wait for the device). */
static lt_status inverse_count(const lt_tensor *targets, int64_t ignore, lt_dtype cd, lt_tensor **out) {
  lt_status st;
  lt_tensor *keep = NULL, *kf = NULL, *n = NULL, *n1 = NULL;
  LT_NO_GRAD({
    st = lt_binary_scalar(LT_BINARY_NE, targets, (double)ignore, 0, NULL, &keep);
    if (st == LT_OK)
      st = lt_tensor_to(keep, cd, targets->storage->device, &kf);
    if (st == LT_OK)
      st = lt_reduce(LT_REDUCE_SUM, kf, 0, NULL, 0, 0, &n);
    if (st == LT_OK)
      st = lt_clamp(n, 1, 1, 0, 0, NULL, &n1);
    if (st == LT_OK)
      st = lt_binary_scalar(LT_BINARY_DIV, n1, 1.0, 1, NULL, out);
  });
  RELEASE_ALL(keep, kf, n, n1);
  return st;
}

/* A target outside [0, V) found by a cross-entropy kernel: deferred to the
   next read (a GPU) or reported now, naming the row and the value */
static lt_status ce_report(const lt_backend_i *be, lt_status st, int64_t bad, const char *op, int64_t V,
                           int64_t ignore_index, lt_tensor *tc) {
  lt_index_report rep;
  memset(&rep, 0, sizeof rep);
  rep.kind = LT_REPORT_TARGET, rep.op = op, rep.limit = V, rep.ignore = ignore_index, rep.index = tc;
  if (st == LT_OK && bad == LT_BAD_LATER)
    return lt_index_defer(be, &rep);
  if (st != LT_OK && bad >= 0) {
    double v = 0;
    lt_tensor *one = NULL;
    if (lt_tensor_narrow(tc, 0, bad, 1, &one) == LT_OK)
      lt_tensor_item(one, &v);
    lt_tensor_release(one);
    return lt_index_report_fail(&rep, bad, (int64_t)v);
  }
  return st;
}

/* c->counted on the host (a wait for a GPU; the read reports a bad target
   that an earlier kernel left for later), or 1 / count on the device for
   the mean (count_on_device) */
static lt_status ce_count(lt_ce_forward *c, const char *op, int64_t ignore_index, int reduction, int count_on_device) {
  if (count_on_device)
    return reduction == 0 ? inverse_count(c->tc, ignore_index, c->sd, &c->inv) : LT_OK;
  double *tv = malloc(sizeof(double) * (size_t)(c->N > 0 ? c->N : 1));
  lt_status st = tv ? lt_tensor_to_f64(c->tc, tv, c->N) : lt_fail(LT_ERR_OOM, "%s: out of host memory", op);
  for (int64_t k = 0; st == LT_OK && k < c->N; k++)
    c->counted += tv[k] != (double)ignore_index;
  free(tv);
  return st;
}

lt_status lt_ce_forward_run(const char *op, const lt_tensor *logits, const lt_tensor *targets, int64_t ignore_index,
                            int reduction, int64_t classes, int count_on_host, int grad_in_place, lt_ce_forward *c) {
  const lt_tensor *ins[2] = {logits, targets};
  static const char *const names[2] = {"logits", "targets"};
  const lt_backend_i *be;
  char b1[200], b2[200];
  memset(c, 0, sizeof *c);
  LT_OP_SCOPE(op);
  LT_TRY(lt_same_device_named(op, 2, ins, names, &be));
  LT_TRY(need_float(op, logits));
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
  int64_t N = logits->sizes[0], W = logits->sizes[1];
  if (classes < 0 || classes > W)
    return lt_fail(LT_ERR_ARG, "%s: classes %lld is outside [1, %lld] (the logits' last dim; 0 takes them all)", op,
                   (long long)classes, (long long)W);
  int64_t V = classes > 0 ? classes : W; /* the columns past V are padding: no logits, zero gradient */
  lt_dtype cd = row_dtype(be, logits->dtype), sd = compute_dtype(logits->dtype);
  c->N = N, c->W = W, c->V = V, c->cd = cd, c->sd = sd;
  lt_tensor *rows = NULL;
  lt_status st = LT_OK;
  /* rows read where they lie when they are unit-stride (a narrowed view of
     padded logits costs no copy), else a contiguous copy */
  if (logits->dtype == cd && (W <= 1 || logits->strides[1] == 1) && (N <= 1 || logits->strides[0] >= W)) {
    lt_tensor_retain((lt_tensor *)logits);
    c->xc = (lt_tensor *)logits;
  } else {
    st = as_compute(logits, cd, &c->xc);
  }
  c->ldx = N > 1 && c->xc ? c->xc->strides[0] : W;
  if (st == LT_OK)
    LT_NO_GRAD(st = lt_tensor_contiguous((lt_tensor *)targets, &c->tc));
  if (st == LT_OK)
    st = lt_tensor_empty(1, &N, sd, logits->storage->device, &rows);
  if (st == LT_OK)
    st = lt_tensor_empty(1, &N, sd, logits->storage->device, &c->lse);
  /* with grad_in_place, the rows' gradient d(row loss)/d(logits): scale NULL
     (1; the count and the loss's gradient are the caller's to apply) */
  int64_t bad = -1;
  void *x = c->xc ? lt_tensor_ptr(c->xc) : NULL, *t = c->tc ? lt_tensor_ptr(c->tc) : NULL;
  if (st == LT_OK && grad_in_place && be->cross_entropy_fwd_bwd) { /* one kernel: the loss and the gradient */
    st = be->cross_entropy_fwd_bwd(cd, x, c->ldx, t, c->tc->dtype, N, V, ignore_index, lt_tensor_ptr(rows),
                                   lt_tensor_ptr(c->lse), NULL, x, &bad);
    st = ce_report(be, st, bad, op, V, ignore_index, c->tc);
  } else if (st == LT_OK) {
    st = be->cross_entropy_fwd(cd, x, c->ldx, t, c->tc->dtype, N, V, ignore_index, lt_tensor_ptr(rows),
                               lt_tensor_ptr(c->lse), &bad);
    st = ce_report(be, st, bad, op, V, ignore_index, c->tc);
    if (st == LT_OK && grad_in_place) /* (each element read before it is written) */
      st = be->cross_entropy_bwd(cd, x, c->ldx, t, c->tc->dtype, N, V, c->ldx, ignore_index, lt_tensor_ptr(c->lse),
                                 NULL, x);
  }
  /* the counted tokens: on the host when asked for (a wait for a GPU, whose
     read reports a bad target at once), else 1 / count stays on the device
     for the mean */
  if (st == LT_OK)
    st = ce_count(c, op, ignore_index, reduction, !count_on_host && be->defer_index_report);
  if (st == LT_OK) {
    LT_NO_GRAD({
      if (reduction == 2) {
        lt_tensor_retain(rows);
        c->loss = rows;
      } else {
        lt_tensor *s = NULL;
        st = lt_reduce(LT_REDUCE_SUM, rows, 0, NULL, 0, 0, &s);
        if (st == LT_OK && reduction == 0 && c->inv) { /* (rows that do not count are 0) */
          st = lt_binary(LT_BINARY_MUL, s, c->inv, NULL, &c->loss);
          lt_tensor_release(s);
        } else if (st == LT_OK && reduction == 0) { /* mean over counted tokens; 0 when none count */
          st = lt_binary_scalar(LT_BINARY_MUL, s, c->counted ? 1.0 / (double)c->counted : 0.0, 0, NULL, &c->loss);
          lt_tensor_release(s);
        } else if (st == LT_OK) {
          c->loss = s;
        }
      }
    });
  }
  lt_tensor_release(rows);
  if (st != LT_OK)
    lt_ce_forward_release(c);
  return st;
}

void lt_ce_forward_release(lt_ce_forward *c) {
  RELEASE_ALL(c->xc, c->tc, c->lse, c->inv, c->loss);
  c->xc = c->tc = c->lse = c->inv = c->loss = NULL;
}

lt_status lt_cross_entropy(const lt_tensor *logits, const lt_tensor *targets, int64_t ignore_index,
                           int reduction, int64_t classes, lt_tensor **loss, int64_t *count) {
  const lt_tensor *ins[2] = {logits, targets};
  lt_ce_forward c;
  LT_TRY(lt_ce_forward_run("cross_entropy", logits, targets, ignore_index, reduction, classes, count != NULL, 0, &c));
  lt_status st = LT_OK;
  if (lt_ag_needed(1, &logits)) {
    lt_node *n;
    st = lt_ag_node_new(&ce_ops, 2, ins, &n);
    if (st == LT_OK) {
      n->i[0] = reduction;
      n->i[1] = ignore_index;
      n->i[2] = c.inv != NULL;
      n->i[3] = c.V;
      n->f[0] = (double)c.counted;
      st = lt_ag_save(n, c.xc);
      if (st == LT_OK)
        st = lt_ag_save(n, c.tc);
      if (st == LT_OK)
        st = lt_ag_save(n, c.lse);
      if (st == LT_OK && c.inv)
        st = lt_ag_save(n, c.inv);
      if (st == LT_OK)
        st = lt_ag_attach(n, c.loss, 0);
      lt_node_release(n);
    }
  }
  if (st == LT_OK) {
    *loss = c.loss;
    c.loss = NULL;
    if (count)
      *count = c.counted;
  }
  lt_ce_forward_release(&c);
  return st;
}

