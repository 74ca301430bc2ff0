/*
 * cpu.h: the CPU kernels' entry points, gathered into lt_backend_cpu by
 * host/cpu/backend.c, and the chunk conversions they share.
 * Kernels compute only: the host checks shapes, allocates (scratch too)
 * and builds the descriptors (kernels/kernel.h), all this header includes.
 */
#ifndef LUTRA_KERNELS_CPU_H
#define LUTRA_KERNELS_CPU_H

#include "../kernel.h"
#include "../shared/scalar.h"

/* Elements per chunk that elementwise kernels convert and compute at a time. */
enum { LT_CPU_CHUNK = 1024 };
/* Below this many elements a kernel runs on the calling thread alone. */
enum { LT_CPU_PARALLEL_MIN = 32768 };

/* Loads n elements of dtype dt at src (stride in elements) into buf as ck values. */
void lt_cpu_load(lt_compute ck, void *buf, const char *src, lt_dtype dt, int64_t stride, int64_t n);
/* Stores n ck values from buf into dst (dtype dt, stride in elements), converting. */
void lt_cpu_store(lt_compute ck, char *dst, lt_dtype dt, int64_t stride, const void *buf, int64_t n);
/* The dtype a compute kind holds natively (f32, f64, i64). */
lt_dtype lt_cpu_native_dtype(lt_compute ck);

/* convert.c / elementwise.c */
lt_status lt_cpu_copy(const lt_iter *it);
lt_status lt_cpu_fill(const lt_iter *it, double value);
lt_status lt_cpu_unary(lt_unary_op op, lt_compute ck, const lt_iter *it);
lt_status lt_cpu_binary(lt_binary_op op, lt_compute ck, const lt_iter *it);
lt_status lt_cpu_binary_scalar(lt_binary_op op, lt_compute ck, const lt_iter *it, double s, int reversed);
lt_status lt_cpu_where(lt_compute ck, const lt_iter *it);
lt_status lt_cpu_clamp(lt_compute ck, const lt_iter *it, double lo, int has_lo, double hi, int has_hi);

/* reduce.c */
lt_status lt_cpu_reduce(lt_reduce_op op, const lt_reduce_iter *it, int64_t correction);

/* matmul.c */
lt_status lt_cpu_matmul(const lt_matmul_desc *d);

/* index.c */
lt_status lt_cpu_index_select(const lt_index_desc *d, char *dst, const char *src, int64_t elsize, int64_t *bad);
lt_status lt_cpu_index_add(const lt_index_desc *d, char *dst, const char *src, lt_dtype dtype, int64_t *bad);
lt_status lt_cpu_gather(const lt_iter *it, int64_t dim_stride_t, int64_t dim_size, int64_t *bad);
lt_status lt_cpu_scatter_add(const lt_iter *it, int64_t dim_stride_t, int64_t dim_size, int64_t *bad);

/* random.c */
lt_status lt_cpu_uniform(char *dst, lt_dtype dtype, int64_t n, uint64_t seed, uint64_t offset, double lo, double hi);
lt_status lt_cpu_normal(char *dst, lt_dtype dtype, int64_t n, uint64_t seed, uint64_t offset, double mean, double std);

/* norm.c, softmax.c, loss.c, rope.c: row kernels on contiguous f32 or f64 data */
lt_status lt_cpu_layer_norm_fwd(lt_dtype dt, const void *x, const void *res, const void *w, const void *b, void *y,
                                void *h, void *mean, void *rstd, int64_t N, int64_t C, double eps);
lt_status lt_cpu_layer_norm_bwd(lt_dtype dt, const void *dy, const void *x, const void *w, const void *mean,
                                const void *rstd, const void *dadd, void *dx, void *dw, void *db, int64_t N,
                                int64_t C);
lt_status lt_cpu_rms_norm_fwd(lt_dtype dt, const void *x, const void *res, const void *w, void *y, void *h,
                              void *rstd, int64_t N, int64_t C, double eps);
lt_status lt_cpu_rms_norm_bwd(lt_dtype dt, const void *dy, const void *x, const void *w, const void *rstd,
                              const void *dadd, void *dx, void *dw, int64_t N, int64_t C);
lt_status lt_cpu_attention_fwd(lt_dtype dt, const void *q, const void *k, const void *v, void *o, void *lse,
                                int64_t B, int64_t NH, int64_t NKV, int64_t T, int64_t S, int64_t HS, double scale,
                                int causal);
lt_status lt_cpu_attention_bwd(lt_dtype dt, const void *q, const void *k, const void *v, const void *o,
                                const void *dout, const void *lse, void *D, void *dq, void *dk, void *dv, int64_t B,
                                int64_t NH, int64_t NKV, int64_t T, int64_t S, int64_t HS, double scale, int causal);
/* library attention's reference (sdpa_ref.c): lt_sdpa_desc operands in f64;
   LT_ERR_UNSUPPORTED (no message) where lt_cpu_sdpa_supports says no */
int lt_cpu_sdpa_supports(const lt_sdpa_desc *d);
lt_status lt_cpu_sdpa_fwd(const lt_sdpa_desc *d);
lt_status lt_cpu_sdpa_bwd(const lt_sdpa_desc *d);
lt_status lt_cpu_softmax_fwd(lt_dtype dt, const void *x, void *y, int64_t N, int64_t C, int logsm, double scale,
                             int64_t causal);
lt_status lt_cpu_softmax_bwd(lt_dtype dt, const void *y, const void *dy, void *dx, int64_t N, int64_t C,
                             int logsm, double scale);
lt_status lt_cpu_cross_entropy_fwd(lt_dtype dt, const void *x, int64_t ldx, const char *targets, lt_dtype tdt,
                                   int64_t N, int64_t V, int64_t ignore, void *loss, void *lse, int64_t *bad);
lt_status lt_cpu_cross_entropy_bwd(lt_dtype dt, const void *x, int64_t ldx, const char *targets, lt_dtype tdt,
                                   int64_t N, int64_t V, int64_t ldd, int64_t ignore, const void *lse,
                                   const void *scale, void *dx);
lt_status lt_cpu_rope(lt_dtype dt, const void *x, void *y, int64_t R, int64_t Tn, int64_t D, double base,
                      int64_t start, int inverse, const lt_rope_scaling *scaling);

/* optim.c: fused AdamW and SGD over a group, and gradient sums of squares */
lt_status lt_cpu_adamw(int n, const lt_optim_tensor *ts, const lt_adamw_hparams *h);
lt_status lt_cpu_sgd(int n, const lt_optim_tensor *ts, const lt_sgd_hparams *h);
/* out[k] = the sum of squares of ts[k].grad in f64; scratch (NULL: none) of
   lt_cpu_sum_squares_scratch(n, ts) bytes, from the caller, lets a tensor's
   blocks run on all threads (without it they run in turn: the same sums in
   the same order, the same result) */
size_t lt_cpu_sum_squares_scratch(int n, const lt_optim_tensor *ts);
lt_status lt_cpu_grad_sum_squares(int n, const lt_optim_tensor *ts, double *scratch, double *out);

/* Reads index element i of an i32/i64 index array with a stride (shared/scalar.h's lt_index_at). */
static inline int64_t lt_cpu_index_at(const char *index, lt_dtype dt, int64_t stride, int64_t i) {
  return lt_index_at(index, dt, i * stride);
}

/*
 * Walks the rows of an iteration: calls body(row_offsets, inner_len) where
 * row_offsets[k] is operand k's element offset of the row's first element.
 * Rows are all dims but the innermost.
 */
static inline void lt_cpu_row_offsets(const lt_iter *it, int64_t row, int64_t *offs) {
  for (int k = 0; k < it->nops; k++)
    offs[k] = 0;
  for (int d = it->ndim - 2; d >= 0; d--) {
    int64_t i = row % it->shape[d];
    row /= it->shape[d];
    for (int k = 0; k < it->nops; k++)
      offs[k] += i * it->strides[k][d];
  }
}

#endif
