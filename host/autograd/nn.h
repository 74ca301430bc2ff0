/*
 * autograd/nn.h: what the neural-network ops' differentiable entry points
 * (host/autograd/{norm,softmax,loss,rope,attention,linear}.c) share (host
 * internal): conversions of their inputs to the rows the dispatch
 * (ops/nn.h) takes and of its results back, and the cross-entropy forward
 * that lt_cross_entropy and lt_linear_cross_entropy both run.
 */
#ifndef LUTRA_AUTOGRAD_NN_H
#define LUTRA_AUTOGRAD_NN_H

#include "autograd/autograd.h"
#include "ops/nn.h"

/* Releases each of the tensors (NULL ones skipped). */
#define LT_RELEASE_ALL(...)                                      \
  do {                                                           \
    lt_tensor *rel_[] = {__VA_ARGS__};                           \
    for (size_t k_ = 0; k_ < sizeof rel_ / sizeof rel_[0]; k_++) \
      lt_tensor_release(rel_[k_]);                               \
  } while (0)

/* *out: t as a contiguous tensor of dtype cd on its device (t itself,
   retained, when it is one), recorded by no graph. */
static inline lt_status lt_nn_as_compute(const lt_tensor *t, lt_dtype cd, lt_tensor **out) {
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

/* *out: r converted to dtype d (r itself when it has it); consumes r. */
static inline lt_status lt_nn_to_dtype(lt_tensor *r, lt_dtype d, lt_tensor **out) {
  if (r->dtype == d) {
    *out = r;
    return LT_OK;
  }
  lt_status st;
  LT_NO_GRAD(st = lt_tensor_to(r, d, r->storage->device, out));
  lt_tensor_release(r);
  return st;
}

/* What a cross-entropy forward leaves for its backward: the logits rows as
   the kernels read them (xc, rows ldx apart, dtype cd: the logits' own, or
   f32 where the backend converts 16-bit rows), the targets made contiguous
   (tc), each row's log-sum-exp (lse, dtype sd: f32, f64 for f64), 1 / count
   on the device (inv; NULL when counted on the host: counted), and the loss. */
typedef struct {
  int64_t N, W, V, ldx, counted;
  lt_dtype cd, sd;
  lt_tensor *xc, *tc, *lse, *inv, *loss;
} lt_ce_forward;

/* Checks logits (N, W) and targets (N), then computes the loss (reduction 0
   mean over counted rows, 1 sum, 2 none; classes as lt_cross_entropy's),
   recording nothing. count_on_host: count the rows on the host (a GPU
   waits). grad_in_place: logits are the caller's own scratch (xc is then
   logits itself or a converted copy): xc is overwritten with the gradient
   of the summed row losses, softmax - onehot per row (zeros in ignored rows
   and padding columns), in one kernel where the backend has
   cross_entropy_fwd_bwd; the caller scales by 1 / count (mean) and the
   loss's gradient. On error c holds nothing. Errors as lt_cross_entropy's,
   named by op. (autograd/loss.c) */
lt_status lt_ce_forward_run(const char *op, const lt_tensor *logits, const lt_tensor *targets, int64_t ignore_index,
                            int reduction, int64_t classes, int count_on_host, int grad_in_place, lt_ce_forward *c);
/* Releases what c holds (and clears it). */
void lt_ce_forward_release(lt_ce_forward *c);

#endif
