/*
 * loss.h: the cross-entropy forward that nn.c's lt_cross_entropy and
 * linear.c's lt_linear_cross_entropy share (host internal).
 */
#ifndef LUTRA_LOSS_H
#define LUTRA_LOSS_H

#include "core/tensor-impl.h"

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
   mean over counted rows, 1 sum, 2 none; classes as lt_cross_entropy's).
   count_on_host: count the rows on the host (a GPU waits). grad_in_place:
   logits are the caller's own scratch (xc is then logits itself or a
   converted copy): xc is overwritten with the gradient of the summed row
   losses, softmax - onehot per row (zeros in ignored rows and padding
   columns), in one kernel where the backend has cross_entropy_fwd_bwd;
   the caller scales by 1 / count (mean) and the loss's gradient. On error
   c holds nothing. Errors as lt_cross_entropy's, named by op. */
lt_status lt_ce_forward_run(const char *op, const lt_tensor *logits, const lt_tensor *targets, int64_t ignore_index,
                            int reduction, int64_t classes, int count_on_host, int grad_in_place, lt_ce_forward *c);
void lt_ce_forward_release(lt_ce_forward *c);

#endif
