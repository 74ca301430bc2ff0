/*
 * cuda.h: the CUDA kernels' launchers, called by host/cuda/backend.c. Each
 * takes the descriptor the host built (kernels/kernel.h) and the stream to run
 * on, launches, checks the launch and returns a status. Kernels allocate
 * nothing and keep no state: memory, streams and handles are the host's.
 */
#ifndef LUTRA_KERNELS_CUDA_H
#define LUTRA_KERNELS_CUDA_H

#include "../kernel.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct CUstream_st *lt_cuda_stream;

/* What the kernels call back into the host for, as function pointers the
   host installs (host/cuda/backend.c, when it initialises a device, before
   any kernel runs); a NULL entry means none. Defined in hooks.cu. */
typedef struct lt_cuda_hooks {
  /* the note to append to a CUDA error's message ("" or, for an error that
     loses the process's context, one that says so: lt_cuda_error_note);
     NULL: no note */
  const char *(*error_note)(int cuda_error);
  /* whether lt.cuda.profile_start runs (lt_cuda_profiling), and a mark
     naming the work just queued on the profiled stream
     (lt_cuda_profile_mark); NULL: no profiling */
  int (*profiling)(void);
  void (*profile_mark)(const char *what);
} lt_cuda_hooks;
extern lt_cuda_hooks lt_cuda_kernel_hooks;

lt_status lt_cuda_copy(const lt_iter *it, lt_cuda_stream s);
lt_status lt_cuda_fill(const lt_iter *it, double value, lt_cuda_stream s);
lt_status lt_cuda_unary(lt_unary_op op, lt_compute ck, const lt_iter *it, lt_cuda_stream s);
lt_status lt_cuda_binary(lt_binary_op op, lt_compute ck, const lt_iter *it, lt_cuda_stream s);
lt_status lt_cuda_binary_scalar(lt_binary_op op, lt_compute ck, const lt_iter *it, double v, int reversed,
                                lt_cuda_stream s);
lt_status lt_cuda_where(lt_compute ck, const lt_iter *it, lt_cuda_stream s);
lt_status lt_cuda_clamp(lt_compute ck, const lt_iter *it, double lo, int has_lo, double hi, int has_hi,
                        lt_cuda_stream s);
lt_status lt_cuda_reduce(lt_reduce_op op, const lt_reduce_iter *it, int64_t correction, lt_cuda_stream s);
lt_status lt_cuda_uniform(char *dst, lt_dtype dtype, int64_t n, uint64_t seed, uint64_t offset, double lo,
                          double hi, lt_cuda_stream s);
lt_status lt_cuda_normal(char *dst, lt_dtype dtype, int64_t n, uint64_t seed, uint64_t offset, double mean,
                         double std, lt_cuda_stream s);
/* index kernels: the first out-of-range index position goes into *bad
   (device memory the host sets to all ones); nothing is written then */
lt_status lt_cuda_index_select(const lt_index_desc *d, char *dst, const char *src, int64_t elsize,
                               unsigned long long *bad, lt_cuda_stream s);
lt_status lt_cuda_index_add(const lt_index_desc *d, char *dst, const char *src, lt_dtype dtype,
                            unsigned long long *bad, void *scratch, size_t scratch_bytes, lt_cuda_stream s);
/* bad[1] = the index's value at position bad[0], when an index check set it */
lt_status lt_cuda_index_value(const char *index, lt_dtype dt, int64_t stride, unsigned long long *bad,
                              lt_cuda_stream s);
/* device scratch bytes for index_add's sorted path (0: it runs without sorting) */
size_t lt_cuda_index_add_scratch(int64_t nindex, int64_t dst_dim, int64_t outer);
lt_status lt_cuda_gather(const lt_iter *it, int64_t dim_stride, int64_t dim_size, unsigned long long *bad,
                         lt_cuda_stream s);
/* scatter_add: the iteration's dims where the target's stride is 0 (the
   scattered dim) are added by one thread in order; the other dims run in
   parallel: results repeat bit for bit and match the CPU's sequential pass */
lt_status lt_cuda_scatter_add(const lt_iter *it, int64_t dim_stride, int64_t dim_size, unsigned long long *bad,
                              lt_cuda_stream s);

/* nn row kernels on contiguous f32 or f64 data, as kernels/cpu/cpu.h */
lt_status lt_cuda_layer_norm_fwd(lt_dtype dt, const void *x, const void *res, const void *w, const void *b, void *y,
                                 void *h, void *mean, void *rstd, int64_t N, int64_t C, double eps, lt_cuda_stream s);
lt_status lt_cuda_layer_norm_bwd(lt_dtype dt, const void *dy, const void *x, const void *w, const void *mean,
                                 const void *rstd, const void *dadd, void *dx, void *dw, void *db, int64_t N,
                                 int64_t C, void *scratch, size_t scratch_bytes, lt_cuda_stream s);
lt_status lt_cuda_rms_norm_fwd(lt_dtype dt, const void *x, const void *res, const void *w, void *y, void *h,
                               void *rstd, int64_t N, int64_t C, double eps, lt_cuda_stream s);
lt_status lt_cuda_rms_norm_bwd(lt_dtype dt, const void *dy, const void *x, const void *w, const void *rstd,
                               const void *dadd, void *dx, void *dw, int64_t N, int64_t C, void *scratch,
                               size_t scratch_bytes, lt_cuda_stream s);
/* device scratch the norms' backward needs for weight gradients (partial sums) */
size_t lt_cuda_norm_dw_scratch(int64_t N, int64_t C);
lt_status lt_cuda_attention_fwd(lt_dtype dt, const void *q, const void *k, const void *v, void *o, void *lse,
                                int64_t B, int64_t NH, int64_t NKV, int64_t T, int64_t S, int64_t HS, double scale,
                                int causal, lt_cuda_stream s);
lt_status lt_cuda_attention_bwd(lt_dtype dt, const void *q, const void *k, const void *v, const void *o,
                                const void *dout, const void *lse, void *D, void *dq, void *dk, void *dv, int64_t B,
                                int64_t NH, int64_t NKV, int64_t T, int64_t S, int64_t HS, double scale, int causal,
                                lt_cuda_stream s);
/* attention_mma.cu: fused attention on tensor cores for bf16/f16 of head
   size 32, 64 or 128 (lt_cuda_attention_mma_takes), operands as d describes them
   (strides multiples of 8 elements, 16-byte aligned), stats the f32
   log-sum-exp; the backward takes D, B * NH * T f32 of scratch */
int lt_cuda_attention_mma_takes(lt_dtype dt, int64_t HS);
lt_status lt_cuda_attention_mma_fwd(const lt_sdpa_desc *d, lt_cuda_stream s);
lt_status lt_cuda_attention_mma_bwd(const lt_sdpa_desc *d, float *D, lt_cuda_stream s);
lt_status lt_cuda_softmax_fwd(lt_dtype dt, const void *x, void *y, int64_t N, int64_t C, int logsm,
                              double scale, int64_t causal, lt_cuda_stream s);
lt_status lt_cuda_softmax_bwd(lt_dtype dt, const void *y, const void *dy, void *dx, int64_t N, int64_t C, int logsm,
                              double scale, lt_cuda_stream s);
/* cross-entropy: the first bad target row goes into *bad as for the index kernels */
lt_status lt_cuda_cross_entropy_fwd(lt_dtype dt, const void *x, int64_t ldx, const char *targets, lt_dtype tdt,
                                    int64_t N, int64_t V, int64_t ignore, void *loss, void *lse,
                                    unsigned long long *bad, lt_cuda_stream s);
lt_status lt_cuda_cross_entropy_bwd(lt_dtype dt, const void *x, int64_t ldx, const char *targets, lt_dtype tdt,
                                    int64_t N, int64_t V, int64_t ldd, int64_t ignore, const void *lse,
                                    const void *scale, void *dx, lt_cuda_stream s);
/* both in one kernel, dx rows ldx apart (dx may be x) */
lt_status lt_cuda_cross_entropy_fwd_bwd(lt_dtype dt, const void *x, int64_t ldx, const char *targets, lt_dtype tdt,
                                        int64_t N, int64_t V, int64_t ignore, void *loss, void *lse,
                                        const void *scale, void *dx, unsigned long long *bad, lt_cuda_stream s);
lt_status lt_cuda_rope(lt_dtype dt, const void *x, void *y, int64_t R, int64_t Tn, int64_t D, double base,
                       int64_t start, int inverse, const lt_rope_scaling *scaling, lt_cuda_stream s);

/* optimizers (optim.cu); the sum of squares needs lt_cuda_sum_squares_scratch(n, ts)
   bytes of device scratch and waits for the stream to read its result */
lt_status lt_cuda_adamw(int n, const lt_optim_tensor *ts, const lt_adamw_hparams *h, lt_cuda_stream s);
lt_status lt_cuda_sgd(int n, const lt_optim_tensor *ts, const lt_sgd_hparams *h, lt_cuda_stream s);
size_t lt_cuda_sum_squares_scratch(int n, const lt_optim_tensor *ts);
lt_status lt_cuda_grad_sum_squares(int n, const lt_optim_tensor *ts, double *scratch, double *out_host,
                                   lt_cuda_stream s);

#ifdef __cplusplus
}
#endif

#endif
