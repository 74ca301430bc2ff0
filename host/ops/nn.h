/*
 * ops/nn.h: the dispatch of the neural-network op families (host internal):
 * norms (ops/norm.c), softmax (ops/softmax.c), cross-entropy (ops/loss.c),
 * rope (ops/rope.c), attention (ops/attention.c), the linear layer's fused
 * products (ops/linear.c). Each family has a check (the arguments, before
 * anything is converted or allocated; the errors lutra.h's entry points
 * give) and forward and backward calls that allocate their outputs and run
 * the backend's row kernels on rows already contiguous and of the dtype the
 * kernels read (the row dtype, lt_nn_row_dtype). No autograd here: the
 * differentiable entry points (host/autograd/<family>.c) convert their
 * inputs, call these and record their nodes. On error nothing is returned
 * (every output NULL).
 */
#ifndef LUTRA_OPS_NN_H
#define LUTRA_OPS_NN_H

#include "core/tensor-impl.h"

#include <float.h>
#include <math.h>
#include <stdio.h>

/* The dtype row kernels compute in for inputs of dtype d: f64 for f64, else f32. */
static inline lt_dtype lt_nn_compute_dtype(lt_dtype d) { return d == LT_DTYPE_F64 ? LT_DTYPE_F64 : LT_DTYPE_F32; }

/* The dtype the backend's row kernels (norms, softmax, cross-entropy, rope)
   read and write for inputs of dtype d: bf16/f16 as they are where the
   backend has native_half_rows, else the compute dtype. Their statistics
   (mean, rstd, log-sum-exp, per-row losses) are in lt_nn_compute_dtype(d). */
static inline lt_dtype lt_nn_row_dtype(const lt_backend_i *be, lt_dtype d) {
  if ((d == LT_DTYPE_BF16 || d == LT_DTYPE_F16) && be->native_half_rows)
    return d;
  return lt_nn_compute_dtype(d);
}

/* LT_ERR_DTYPE unless t is a float tensor. */
static inline lt_status lt_nn_need_float(const char *op, const lt_tensor *t) {
  if (!lt_dtype_is_float(t->dtype))
    return lt_fail(LT_ERR_DTYPE, "%s: needs a float tensor, got %s", op, lt_dtype_name(t->dtype));
  return LT_OK;
}

/* LT_ERR_ARG unless scale is finite in cd, the dtype the kernels compute in. */
static inline lt_status lt_nn_check_scale(const char *op, double scale, lt_dtype cd) {
  if (isfinite(scale) && !(cd == LT_DTYPE_F32 && fabs(scale) > FLT_MAX))
    return LT_OK;
  char v[40];
  if (isnan(scale))
    snprintf(v, sizeof v, "nan");
  else
    snprintf(v, sizeof v, "%g", scale);
  return lt_fail(LT_ERR_ARG, "%s: the scale must be finite (in %s), got %s", op, lt_dtype_name(cd), v);
}

/* Whether an (R, C) matrix has unit-stride rows that do not overlap: what
   cuBLASLt's epilogues are given (and what lt_cross_entropy reads in place). */
static inline int lt_nn_unit_rows(const lt_tensor *t) {
  return t->strides[1] == 1 && (t->sizes[0] <= 1 || t->strides[0] >= t->sizes[1]);
}

/* ---- norms (ops/norm.c) --------------------------------------------------------------- */

/* Checks a norm's arguments, in lt_layer_norm's / lt_add_norm's order: a
   bias only with a weight, one device, a float x of >= 1 dim, res (or NULL)
   of x's shape and dtype, w and b (or NULL) of shape (C), C x's last dim,
   eps >= 0, the backend's kernel. *be: the backend; *cd: the dtype the rows
   run in (the row dtype when w and b have x's dtype, else the compute
   dtype). op names the norm in errors. */
lt_status lt_op_norm_check(const char *op, int rms, const lt_tensor *x, const lt_tensor *res, const lt_tensor *w,
                           const lt_tensor *b, double eps, const lt_backend_i **be, lt_dtype *cd);
/* The norm (rms: RMSNorm, else LayerNorm) over the last dim C of x, rows of
   dtype cd, contiguous: y = norm(x + res) * w + b, res, w, b NULL when
   absent. With res, h = x + res is written to *h_out (h_out may be NULL
   without res). *mean (LayerNorm only; NULL for RMSNorm) and *rstd
   are (N) in lt_nn_compute_dtype(cd). All outputs new, contiguous, cd. */
lt_status lt_op_norm_fwd(int rms, lt_dtype cd, const lt_tensor *x, const lt_tensor *res, const lt_tensor *w,
                         const lt_tensor *b, double eps, lt_tensor **h_out, lt_tensor **y, lt_tensor **mean,
                         lt_tensor **rstd);
/* The norm's backward on rows of x's dtype (the norm's input as computed,
   contiguous): from dy, with x, w (or NULL), mean (LayerNorm), rstd as the
   forward left them, and dadd (or NULL: the gradient of h, added into dx),
   writes dx (need_dx; else *dx NULL), dw (need_dw, with w) and db (need_db,
   LayerNorm with a bias), new tensors of x's dtype: dx of x's shape, dw and
   db (C). */
lt_status lt_op_norm_bwd(int rms, const lt_tensor *dy, const lt_tensor *x, const lt_tensor *w, const lt_tensor *mean,
                         const lt_tensor *rstd, const lt_tensor *dadd, int need_dx, int need_dw, int need_db,
                         lt_tensor **dx, lt_tensor **dw, lt_tensor **db);

/* ---- softmax (ops/softmax.c) ------------------------------------------------------------ */

/* Checks softmax's arguments: one float tensor with dim (0-based) in
   range, a finite scale, causal only for (..., queries, keys) scores, the
   backend's kernel. *be: the backend; *cd: the row dtype. */
lt_status lt_op_softmax_check(const char *op, const lt_tensor *x, int dim, double scale, int causal,
                              const lt_backend_i **be, lt_dtype *cd);
/* y = softmax(scale * x) (log: log_softmax) over the last dim of x, rows of
   dtype cd, contiguous; causal_T > 0: rows are queries of causal_T-query
   matrices, masked as lt_scaled_softmax's. y new, x's shape and dtype. */
lt_status lt_op_softmax_fwd(lt_dtype cd, const lt_tensor *x, int log, double scale, int64_t causal_T, lt_tensor **y);
/* dx from the forward's output y and its gradient dy (both contiguous, of
   y's dtype and shape); dx new, as y. */
lt_status lt_op_softmax_bwd(const lt_tensor *y, const lt_tensor *dy, int log, double scale, lt_tensor **dx);

/* ---- attention (ops/attention.c) --------------------------------------------------------- */

/* The checks every attention entry makes: one device, float dtypes, q (B,
   NH, T, HS) and k, v (B, NKV, S, HS) with NKV dividing NH, one dtype, a
   finite scale. *be: the backend. */
lt_status lt_op_attention_check(const char *op, const lt_tensor *q, const lt_tensor *k, const lt_tensor *v,
                                double scale, const lt_backend_i **be);
/* lt_attention's route after lt_op_attention_check: LT_ERR_UNSUPPORTED for
   a head size over the row kernels' (kernels/attention_rows.h); *half = 1
   when the backend's 16-bit kernels take q's dtype and head size on
   operands where they are (lt_op_sdpa_fwd with lutra = 1), else 0 after
   checking the backend has the row kernels (lt_op_attention_fwd). */
lt_status lt_op_attention_route(const char *op, const lt_backend_i *be, const lt_tensor *q, const lt_tensor *k,
                                int *half);
/* Fused attention on contiguous rows of dtype cd (f32, f64): q (B, NH, T,
   HS), k, v (B, NKV, S, HS); *o (as q) and *lse (B*NH*T) new, cd. */
lt_status lt_op_attention_fwd(lt_dtype cd, const lt_tensor *q, const lt_tensor *k, const lt_tensor *v, double scale,
                              int causal, lt_tensor **o, lt_tensor **lse);
/* Its backward: from q, k, v, o, dout and lse as the forward's (contiguous,
   of q's dtype), *dq, *dk, *dv new, shaped as q, k, v. */
lt_status lt_op_attention_bwd(const lt_tensor *q, const lt_tensor *k, const lt_tensor *v, const lt_tensor *o,
                              const lt_tensor *dout, const lt_tensor *lse, double scale, int causal, lt_tensor **dq,
                              lt_tensor **dk, lt_tensor **dv);

/* Whether the vendor library (and lutra's 16-bit kernels) can read t (4-D)
   where it is: the last stride 1, the others positive multiples of 8
   elements, the address 16-byte aligned. */
int lt_op_sdpa_layout(const lt_tensor *t);
/* lt_attention_library's checks after lt_op_attention_check: a library on
   the backend, bf16/f16, causal only with T == S, a head size that is a
   multiple of 8, no empty dim (LT_ERR_UNSUPPORTED with the reason). */
lt_status lt_op_sdpa_check(const char *op, const lt_backend_i *be, const lt_tensor *q, const lt_tensor *k, int causal);
/* Attention on q, k, v where they are (each lt_op_sdpa_layout's): the
   library's (lutra 0; prepared for the backward too with backward set) or
   lutra's attention_half kernels (lutra 1). *o (B, NH, T, HS) new, laid out
   as (B, T, NH, HS) (its transpose back to (B, T, NH, HS) needs no copy),
   *stats (B*NH*T) f32 the log-sum-exps; *deterministic: the
   lt_cuda_deterministic() the call ran under (the backward's). */
lt_status lt_op_sdpa_fwd(const lt_backend_i *be, const lt_tensor *q, const lt_tensor *k, const lt_tensor *v,
                         double scale, int causal, int lutra, int backward, int *deterministic, lt_tensor **o,
                         lt_tensor **stats);
/* The backward of an lt_op_sdpa_fwd call: q, k, v, o, stats as it used and
   left them, deterministic as it returned, dout of q's dtype in o's layout
   (the caller copies it there: lt_op_sdpa_layout, lt_op_sdpa_empty). *dq,
   *dk, *dv new: side by side in one (B, T, 3, NH, HS) buffer when q, k, v
   were cut in order from one (a GPT-2 block's qkv), else each laid out as
   o. Where the library refuses its backward and the backend has no 16-bit
   kernel for it: LT_ERR_UNSUPPORTED with *by_rows = 1 and the gradients
   allocated, once the row kernels are known to take the head size (else
   that error); the caller then runs lt_op_attention_bwd on compute-dtype
   copies and writes the results into *dq, *dk, *dv. */
lt_status lt_op_sdpa_bwd(const lt_tensor *q, const lt_tensor *k, const lt_tensor *v, const lt_tensor *o,
                         const lt_tensor *stats, const lt_tensor *dout, double scale, int causal, int lutra,
                         int deterministic, lt_tensor **dq, lt_tensor **dk, lt_tensor **dv, int *by_rows);
/* A new (B, H, L, HS) tensor of dtype dt on dev laid out as (B, L, H, HS)
   (the layout of lt_op_sdpa_fwd's output). */
lt_status lt_op_sdpa_empty(int64_t B, int64_t H, int64_t L, int64_t HS, lt_dtype dt, lt_device dev, lt_tensor **out);

/* ---- cross-entropy (ops/loss.c) --------------------------------------------------------- */

/* Checks cross-entropy's arguments: logits (N, W) float and targets (N)
   i32/i64 on one device, reduction 0 (mean), 1 (sum) or 2 (none), classes
   in [0, W], the backend's kernel. *be: the backend; *V: the classes
   (classes, or W for 0). */
lt_status lt_op_cross_entropy_check(const char *op, const lt_tensor *logits, const lt_tensor *targets, int reduction,
                                    int64_t classes, const lt_backend_i **be, int64_t *V);
/* Each row's loss and log-sum-exp from logits x (N rows ldx apart, first V
   columns the classes, unit stride, dtype cd) and contiguous targets t (N):
   *rows and *lse (N) new, sd (lt_nn_compute_dtype). grad_in_place: x is
   the caller's scratch, overwritten with d(row loss)/d(logits) (softmax -
   onehot; zeros in ignored rows and padding columns up to ldx), in one
   kernel where the backend has cross_entropy_fwd_bwd. A target outside [0,
   V) (not ignore) fails naming its row and value, or on a GPU at the next
   read (deferred). op names the op in errors. */
lt_status lt_op_cross_entropy_fwd(const char *op, lt_dtype cd, lt_dtype sd, const lt_tensor *x, int64_t ldx,
                                  const lt_tensor *t, int64_t V, int64_t ignore, int grad_in_place, lt_tensor **rows,
                                  lt_tensor **lse);
/* The backward: d(loss)/d(x) for x (N, W) rows as the forward read them
   (rows ldx apart, x's dtype), targets t and lse as it left them, each row
   times scale[row] (N, lse's dtype): *dx new (N, W) contiguous, x's dtype,
   zeros past V. */
lt_status lt_op_cross_entropy_bwd(const lt_tensor *x, int64_t V, const lt_tensor *t, int64_t ignore,
                                  const lt_tensor *lse, const lt_tensor *scale, lt_tensor **dx);

/* ---- rope (ops/rope.c) --------------------------------------------------------------------- */

/* Checks rope's arguments: x (..., T, D) float with D even, base > 0,
   start >= 0, the backend's kernel. */
lt_status lt_op_rope_check(const lt_tensor *x, double base, int64_t start, const lt_rope_scaling *sc);
/* Rotary embedding of x (..., T, D), contiguous rows of the row dtype for
   x's backend, positions from start (inverse: the inverse rotation, the
   backward). *y new, as x. */
lt_status lt_op_rope(const lt_tensor *x, double base, int64_t start, int inverse, const lt_rope_scaling *sc,
                     lt_tensor **y);

/* ---- the linear layer's fused products (ops/linear.c) ------------------------------------ */

/* Checks lt_linear's arguments: one device, act 0 or 1, one float dtype,
   x of >= 1 dim, w (out, in) fitting x's last dim, b (out) or NULL. */
lt_status lt_op_linear_check(const char *op, const lt_tensor *x, const lt_tensor *w, const lt_tensor *b, int act,
                             const lt_backend_i **be);
/* Checks lt_mlp's arguments: one device and float dtype, x of >= 1 dim, w1
   (hidden, in), b1 (hidden) or NULL, w2 (out, hidden), b2 (out) or NULL. */
lt_status lt_op_mlp_check(const char *op, const lt_tensor *x, const lt_tensor *w1, const lt_tensor *b1,
                          const lt_tensor *w2, const lt_tensor *b2, const lt_backend_i **be);
/* Checks lt_linear_cross_entropy's arguments: x (..., in) with rows, w (V,
   in), targets with x's leading dims or flat (*N: the rows), reduction 0
   or 1, classes in [0, V]. */
lt_status lt_op_linear_ce_check(const char *op, const lt_tensor *x, const lt_tensor *w, const lt_tensor *targets,
                                int reduction, int64_t classes, const lt_backend_i **be, int64_t *N);
/* y2 (M, out) = act(x2 w^T + b) in one product with the epilogue, and with
   act *pre = x2 w^T + b (else NULL): x2 (M, in), w (out, in), b (out) or
   NULL. LT_ERR_UNSUPPORTED when the backend has no such epilogue for it (a
   refusal said once on stderr): the caller composes matmul, add, gelu. */
lt_status lt_op_linear_fused(const lt_backend_i *be, const lt_tensor *x2, const lt_tensor *w, const lt_tensor *b,
                             int act, lt_tensor **y2, lt_tensor **pre);
/* dw = g^T x2 (out, in) with db = g's column sums (out) in the same product
   (BGRADB); g (M, out), x2 (M, in). LT_ERR_UNSUPPORTED (no error set when
   the backend has no epilogues) when the backend cannot: the caller
   multiplies and reduces. */
lt_status lt_op_linear_weight_grad_fused(const lt_tensor *g, const lt_tensor *x2, lt_tensor **dw, lt_tensor **db);
/* dh = (g w) gelu'(pre) (M, in) in one product, with *db = dh's column
   sums (in) when want_db (DGELU / DGELU_BGRAD); g (M, out), w (out, in),
   pre (M, in). LT_ERR_UNSUPPORTED when the backend has no such epilogue for
   it (a refusal said once on stderr): the caller composes. */
lt_status lt_op_gelu_input_grad_fused(const lt_tensor *g, const lt_tensor *w, const lt_tensor *pre, int want_db,
                                      lt_tensor **dh, lt_tensor **db);

#endif
