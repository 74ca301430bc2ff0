/*
 * backend/backend.h: the interface every device backend implements: the
 * lt_backend_i vtable (memory, copies, synchronisation, and one entry per
 * kernel the ops dispatch to), and the index report a backend that checks
 * indices later (CUDA) keeps until its next synchronisation. The
 * descriptors its entries take are the kernels' (kernels/kernel.h).
 *
 * One const table per backend: lt_backend_cpu (host/cpu/backend.c)
 * and, in a build with CUDA, lt_backend_cuda (host/cuda/backend.c); the
 * device-to-backend map is host/core/backend.c (lt_backend_for).
 */
#ifndef LUTRA_BACKEND_H
#define LUTRA_BACKEND_H

#include "../../kernels/kernel.h"
#include "backend/index-report.h" /* lt_index_report, LT_BAD_LATER */

/* Backend vtable: one const table per backend; optional entries are NULL. */
typedef struct lt_backend_i {
  const char *name;
  lt_status (*alloc)(lt_device device, size_t nbytes, void **ptr);
  void (*free)(lt_device device, void *ptr, size_t nbytes);
  /* copies between host memory and this device, contiguous bytes */
  lt_status (*copy_to_host)(lt_device device, void *dst, const void *src, size_t nbytes);
  lt_status (*copy_from_host)(lt_device device, void *dst, const void *src, size_t nbytes);
  lt_status (*synchronize)(lt_device device);
  /* elementwise: operand 0 is the output */
  lt_status (*copy)(const lt_iter *it);
  lt_status (*fill)(const lt_iter *it, double value);
  lt_status (*unary)(lt_unary_op op, lt_compute ck, const lt_iter *it);
  lt_status (*binary)(lt_binary_op op, lt_compute ck, const lt_iter *it);
  lt_status (*binary_scalar)(lt_binary_op op, lt_compute ck, const lt_iter *it, double s, int reversed);
  lt_status (*where)(lt_compute ck, const lt_iter *it);
  lt_status (*clamp)(lt_compute ck, const lt_iter *it, double lo, int has_lo, double hi, int has_hi);
  lt_status (*reduce)(lt_reduce_op op, const lt_reduce_iter *it, int64_t correction);
  lt_status (*matmul)(const lt_matmul_desc *d);
  int native_half_matmul; /* matmul takes bf16/f16 itself (f32 accumulation); else the host converts */
  /* matmul takes lt_matmul_desc's epilogues (bias, GELU with its aux) */
  int matmul_epilogues;
  /* the row kernels (norms, softmax, cross-entropy) take bf16/f16 rows
     themselves (computing in f32, statistics in f32); else the host
     converts the rows to f32 */
  int native_half_rows;
  /* takes a report (and its index reference) for the index kernel that just
     set *bad to LT_BAD_LATER; NULL for backends that check at once */
  lt_status (*defer_index_report)(const lt_index_report *r);
  /* index kernels return LT_OK (*bad LT_BAD_LATER: the check finishes later,
     see defer_index_report), or LT_ERR_ARG with *bad set to the position
     of the first out-of-range index */
  lt_status (*index_select)(const lt_index_desc *d, char *dst, const char *src, int64_t elsize, int64_t *bad);
  lt_status (*index_add)(const lt_index_desc *d, char *dst, const char *src, lt_dtype dtype, int64_t *bad);
  lt_status (*gather)(const lt_iter *it, int64_t dim_stride_t, int64_t dim_size, int64_t *bad);
  lt_status (*scatter_add)(const lt_iter *it, int64_t dim_stride_t, int64_t dim_size, int64_t *bad);
  lt_status (*uniform)(char *dst, lt_dtype dtype, int64_t n, uint64_t seed, uint64_t offset, double lo, double hi);
  /* fused nn kernels on contiguous rows of dtype dt (f32 or f64, see
     kernels/cpu/cpu.h; bf16/f16 with native_half_rows); statistics (mean,
     rstd, lse, per-row losses and gradient scales) are f64 for f64 rows,
     else f32 */
  /* norms; with res (else NULL) the input is h = x + res, written to h (the
     residual add fused in); backward adds dadd (else NULL) into dx */
  lt_status (*layer_norm_fwd)(lt_dtype dt, const void *x, const void *res, const void *w, const void *b, void *y,
                              void *h, void *mean, void *rstd, int64_t N, int64_t C, double eps);
  lt_status (*layer_norm_bwd)(lt_dtype dt, const void *dy, const void *x, const void *w, const void *mean,
                              const void *rstd, const void *dadd, void *dx, void *dw, void *db, int64_t N, int64_t C);
  lt_status (*rms_norm_fwd)(lt_dtype dt, const void *x, const void *res, const void *w, void *y, void *h, void *rstd,
                            int64_t N, int64_t C, double eps);
  lt_status (*rms_norm_bwd)(lt_dtype dt, const void *dy, const void *x, const void *w, const void *rstd,
                            const void *dadd, void *dx, void *dw, int64_t N, int64_t C);
  /* softmax of scale * x over rows of C; causal > 0: row r is query r % causal
     of causal queries, seeing the first r % causal + C - causal + 1 entries
     (the rest give 0); backward multiplies by scale */
  lt_status (*softmax_fwd)(lt_dtype dt, const void *x, void *y, int64_t N, int64_t C, int logsm, double scale,
                           int64_t causal);
  lt_status (*softmax_bwd)(lt_dtype dt, const void *y, const void *dy, void *dx, int64_t N, int64_t C,
                           int logsm, double scale);
  /* fused attention (kernels/attention_rows.h) on contiguous f32/f64 rows:
     q, o (B, NH, T, HS), k, v (B, NKV, S, HS), lse (B, NH, T); backward
     takes D (B, NH, T) scratch and writes dq, dk, dv */
  lt_status (*attention_fwd)(lt_dtype dt, const void *q, const void *k, const void *v, void *o, void *lse, int64_t B,
                             int64_t NH, int64_t NKV, int64_t T, int64_t S, int64_t HS, double scale, int causal);
  lt_status (*attention_bwd)(lt_dtype dt, const void *q, const void *k, const void *v, const void *o,
                             const void *dout, const void *lse, void *D, void *dq, void *dk, void *dv, int64_t B,
                             int64_t NH, int64_t NKV, int64_t T, int64_t S, int64_t HS, double scale, int causal);
  /* lutra's fused attention on 16-bit operands where they are (lt_sdpa_desc,
     as the library's below; NULL where the backend has none): whether it
     takes dtype dt and head size HS, the forward (writes o and stats) and
     the backward (CUDA: tensor cores, kernels/cuda/attention_mma.cu) */
  int (*attention_half)(lt_dtype dt, int64_t HS);
  lt_status (*attention_half_fwd)(const lt_sdpa_desc *d);
  lt_status (*attention_half_bwd)(const lt_sdpa_desc *d);
  /* library attention (lt_sdpa_desc; NULL where the backend has none).
     prepare checks that the library takes the shape (building what the
     calls need, the backward's too when backward is set): LT_ERR_UNSUPPORTED
     with the library's reason when it refuses, so the caller falls back */
  lt_status (*sdpa_prepare)(const lt_sdpa_desc *d, int backward);
  lt_status (*sdpa_fwd)(const lt_sdpa_desc *d);
  lt_status (*sdpa_bwd)(const lt_sdpa_desc *d);
  /* cross-entropy over logits rows ldx apart (V <= ldx); backward writes
     rows ldd apart, zeros in columns V..ldd-1 (padding past the classes),
     each row times its scale (scale NULL: 1) */
  lt_status (*cross_entropy_fwd)(lt_dtype dt, const void *x, int64_t ldx, const char *targets, lt_dtype tdt,
                                 int64_t N, int64_t V, int64_t ignore, void *loss, void *lse, int64_t *bad);
  lt_status (*cross_entropy_bwd)(lt_dtype dt, const void *x, int64_t ldx, const char *targets, lt_dtype tdt,
                                 int64_t N, int64_t V, int64_t ldd, int64_t ignore, const void *lse,
                                 const void *scale, void *dx);
  /* optional: the forward and, into dx (rows ldx apart; may be x itself),
     the backward with per-row scales, in one pass over each row; NULL: the
     two above */
  lt_status (*cross_entropy_fwd_bwd)(lt_dtype dt, const void *x, int64_t ldx, const char *targets, lt_dtype tdt,
                                     int64_t N, int64_t V, int64_t ignore, void *loss, void *lse, const void *scale,
                                     void *dx, int64_t *bad);
  lt_status (*rope)(lt_dtype dt, const void *x, void *y, int64_t R, int64_t Tn, int64_t D, double base,
                    int64_t start, int inverse, const lt_rope_scaling *scaling); /* (scaling NULL: plain) */
  lt_status (*normal)(char *dst, lt_dtype dtype, int64_t n, uint64_t seed, uint64_t offset, double mean, double std);
  /* optimizers over n parameters in one call (kernels/<backend>/optim) */
  lt_status (*adamw)(int n, const lt_optim_tensor *ts, const lt_adamw_hparams *h);
  lt_status (*sgd)(int n, const lt_optim_tensor *ts, const lt_sgd_hparams *h);
  /* out[i] (host memory) = the sum of squares of ts[i].grad, accumulated in f64 */
  lt_status (*grad_sum_squares)(int n, const lt_optim_tensor *ts, double *out);
} lt_backend_i;

extern const lt_backend_i lt_backend_cpu;
#ifdef LT_WITH_CUDA
extern const lt_backend_i lt_backend_cuda;
#endif

#endif
