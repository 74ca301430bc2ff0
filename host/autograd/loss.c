/*
 * autograd/loss.c: lt_cross_entropy, the differentiable cross-entropy of
 * logits against class ids (fused with log-softmax), with its backward
 * rule; and the forward it shares with lt_linear_cross_entropy
 * (autograd/linear.c): the rows converted to what the kernels read, the
 * dispatch (ops/loss.c), the counted rows and the reduction.
 */
#include "autograd/nn.h"

#include <stdlib.h>
#include <string.h>

/* i[0] reduction, i[1] ignore_index, i[2] 1 / count saved (on the device),
   i[3] V; f[0] the count otherwise. Saved: the logits rows as the kernels
   read them, the targets (contiguous), lse, [1 / count]. */
static lt_status ce_backward(lt_node *n, lt_tensor *const *go, lt_tensor **gi) {
  lt_tensor *x, *tgt, *lse;
  LT_TRY(lt_ag_saved(n, 0, &x));
  LT_TRY(lt_ag_saved(n, 1, &tgt));
  LT_TRY(lt_ag_saved(n, 2, &lse));
  int64_t N = x->sizes[0];
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
    st = lt_op_cross_entropy_bwd(x, n->i[3], tgt, n->i[1], lse, scale, &dx);
  if (st == LT_OK) {
    lt_tensor_retain(dx);
    st = lt_nn_to_dtype(dx, n->in[0].dtype, &gi[0]);
  }
  LT_RELEASE_ALL(scale, g, dx);
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
  LT_RELEASE_ALL(keep, kf, n, n1);
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

/* The loss from the rows' losses: themselves (none), their sum, or the sum
   over the counted rows (mean; 0 when none count), recording nothing. */
static lt_status reduce_rows(lt_ce_forward *c, lt_tensor *rows, int reduction) {
  lt_status st = LT_OK;
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
  return st;
}

lt_status lt_ce_forward_run(const char *op, const lt_tensor *logits, const lt_tensor *targets, int64_t ignore_index,
                            int reduction, int64_t classes, int count_on_host, int grad_in_place, lt_ce_forward *c) {
  const lt_backend_i *be;
  int64_t V;
  memset(c, 0, sizeof *c);
  LT_OP_SCOPE(op);
  LT_TRY(lt_op_cross_entropy_check(op, logits, targets, reduction, classes, &be, &V));
  int64_t N = logits->sizes[0], W = logits->sizes[1];
  lt_dtype cd = lt_nn_row_dtype(be, logits->dtype), sd = lt_nn_compute_dtype(logits->dtype);
  c->N = N, c->W = W, c->V = V, c->cd = cd, c->sd = sd;
  lt_tensor *rows = NULL, *lse = NULL;
  lt_status st = LT_OK;
  /* rows read where they lie when they are unit-stride (a narrowed view of
     padded logits costs no copy), else a contiguous copy */
  if (logits->dtype == cd && (W <= 1 || logits->strides[1] == 1) && (N <= 1 || logits->strides[0] >= W)) {
    lt_tensor_retain((lt_tensor *)logits);
    c->xc = (lt_tensor *)logits;
  } else {
    st = lt_nn_as_compute(logits, cd, &c->xc);
  }
  c->ldx = N > 1 && c->xc ? c->xc->strides[0] : W;
  if (st == LT_OK)
    LT_NO_GRAD(st = lt_tensor_contiguous((lt_tensor *)targets, &c->tc));
  if (st == LT_OK)
    st = lt_op_cross_entropy_fwd(op, cd, sd, c->xc, c->ldx, c->tc, V, ignore_index, grad_in_place, &rows, &lse);
  c->lse = lse;
  /* the counted tokens: on the host when asked for (a wait for a GPU, whose
     read reports a bad target at once), else 1 / count stays on the device
     for the mean */
  if (st == LT_OK)
    st = ce_count(c, op, ignore_index, reduction, !count_on_host && be->defer_index_report);
  if (st == LT_OK)
    st = reduce_rows(c, rows, reduction);
  lt_tensor_release(rows);
  if (st != LT_OK)
    lt_ce_forward_release(c);
  return st;
}

void lt_ce_forward_release(lt_ce_forward *c) {
  LT_RELEASE_ALL(c->xc, c->tc, c->lse, c->inv, c->loss);
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
