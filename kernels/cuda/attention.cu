/*
 * attention.cu: fused scaled-dot-product attention on the GPU, forward and
 * backward in f32 or f64 (the host converts 16-bit inputs), with the row
 * algorithms of kernels/attention_rows.h that the CPU backend runs too: one
 * thread per query row (forward, dq) or per key row (dk and dv, summing the
 * query heads that share the key/value head). Nothing of size (T, S) is
 * stored; each sum runs in a fixed order, so results are deterministic.
 * A first fused path: threads read K and V rows through the caches, no
 * tiling in shared memory and no tensor cores yet (cuDNN's fused attention
 * is the next step).
 */
#include "common.cuh"

#include "../attention_rows.h"

LT_DEFINE_ATTENTION_ROWS(float, f32, expf, logf)
LT_DEFINE_ATTENTION_ROWS(double, f64, exp, log)

static const int THREADS = 128;

#define DEFINE_ATTENTION_KERNELS(T_, SFX)                                                                 \
  __global__ void attention_fwd_kernel_##SFX(const T_ *q, const T_ *k, const T_ *v, T_ *o, T_ *lse,        \
                                             int64_t B, int64_t NH, int64_t NKV, int64_t T, int64_t S,    \
                                             int64_t HS, T_ scale, int causal) {                          \
    int64_t rep = NH / NKV, N = B * NH * T;                                                               \
    T_ acc[LT_ATTN_MAX_HS];                                                                               \
    LT_GRID_STRIDE(r, N) {                                                                                \
      int64_t i = r % T, bh = r / T, b = bh / NH, g = (bh % NH) / rep;                                    \
      lt_attn_fwd_row_##SFX(q + r * HS, k + (b * NKV + g) * S * HS, v + (b * NKV + g) * S * HS,            \
                            o + r * HS, lse + r, lt_attn_visible(i, T, S, causal), HS, scale, acc);        \
    }                                                                                                     \
  }                                                                                                       \
  __global__ void attention_dq_kernel_##SFX(const T_ *q, const T_ *k, const T_ *v, const T_ *o,            \
                                            const T_ *dout, const T_ *lse, T_ *D, T_ *dq, int64_t B,       \
                                            int64_t NH, int64_t NKV, int64_t T, int64_t S, int64_t HS,     \
                                            T_ scale, int causal) {                                       \
    int64_t rep = NH / NKV, N = B * NH * T;                                                               \
    LT_GRID_STRIDE(r, N) {                                                                                \
      int64_t i = r % T, bh = r / T, b = bh / NH, g = (bh % NH) / rep;                                    \
      D[r] = lt_attn_dot_##SFX(dout + r * HS, o + r * HS, HS);                                             \
      lt_attn_bwd_q_row_##SFX(q + r * HS, k + (b * NKV + g) * S * HS, v + (b * NKV + g) * S * HS,          \
                              dout + r * HS, lse[r], D[r], dq + r * HS, lt_attn_visible(i, T, S, causal),  \
                              HS, scale);                                                                 \
    }                                                                                                     \
  }                                                                                                       \
  __global__ void attention_dkv_kernel_##SFX(const T_ *q, const T_ *k, const T_ *v, const T_ *dout,        \
                                             const T_ *lse, const T_ *D, T_ *dk, T_ *dv, int64_t B,        \
                                             int64_t NH, int64_t NKV, int64_t T, int64_t S, int64_t HS,    \
                                             T_ scale, int causal) {                                      \
    int64_t rep = NH / NKV, M = B * NKV * S;                                                              \
    LT_GRID_STRIDE(r, M) {                                                                                \
      int64_t j = r % S, bg = r / S, b = bg / NKV, g = bg % NKV;                                          \
      T_ *dkj = dk + r * HS, *dvj = dv + r * HS;                                                          \
      for (int64_t d = 0; d < HS; d++)                                                                    \
        dkj[d] = dvj[d] = 0;                                                                              \
      for (int64_t h = g * rep; h < (g + 1) * rep; h++) {                                                 \
        int64_t qs = (b * NH + h) * T;                                                                    \
        lt_attn_bwd_kv_row_##SFX(q + qs * HS, k + r * HS, v + r * HS, dout + qs * HS, lse + qs, D + qs,   \
                                 dkj, dvj, lt_attn_first_query(j, T, S, causal), T, HS, scale);           \
      }                                                                                                   \
    }                                                                                                     \
  }

DEFINE_ATTENTION_KERNELS(float, f32)
DEFINE_ATTENTION_KERNELS(double, f64)

extern "C" lt_status lt_cuda_attention_fwd(lt_dtype dt, const void *q, const void *k, const void *v, void *o,
                                           void *lse, int64_t B, int64_t NH, int64_t NKV, int64_t T, int64_t S,
                                           int64_t HS, double scale, int causal, lt_cuda_stream s) {
  int64_t N = B * NH * T;
  if (N == 0)
    return LT_OK;
  unsigned g = lt_cuda_blocks(N, THREADS);
  if (dt == LT_DTYPE_F64)
    attention_fwd_kernel_f64<<<g, THREADS, 0, (cudaStream_t)s>>>((const double *)q, (const double *)k,
                                                                 (const double *)v, (double *)o, (double *)lse, B,
                                                                 NH, NKV, T, S, HS, scale, causal);
  else
    attention_fwd_kernel_f32<<<g, THREADS, 0, (cudaStream_t)s>>>((const float *)q, (const float *)k,
                                                                 (const float *)v, (float *)o, (float *)lse, B, NH,
                                                                 NKV, T, S, HS, (float)scale, causal);
  return lt_cuda_check_launch("attention_fwd_kernel");
}

extern "C" lt_status lt_cuda_attention_bwd(lt_dtype dt, const void *q, const void *k, const void *v, const void *o,
                                           const void *dout, const void *lse, void *D, void *dq, void *dk, void *dv,
                                           int64_t B, int64_t NH, int64_t NKV, int64_t T, int64_t S, int64_t HS,
                                           double scale, int causal, lt_cuda_stream s) {
  int64_t N = B * NH * T, M = B * NKV * S;
  cudaStream_t cs = (cudaStream_t)s;
  if (N > 0) { /* D and dq first: the key rows read D */
    unsigned g = lt_cuda_blocks(N, THREADS);
    if (dt == LT_DTYPE_F64)
      attention_dq_kernel_f64<<<g, THREADS, 0, cs>>>((const double *)q, (const double *)k, (const double *)v,
                                                     (const double *)o, (const double *)dout, (const double *)lse,
                                                     (double *)D, (double *)dq, B, NH, NKV, T, S, HS, scale, causal);
    else
      attention_dq_kernel_f32<<<g, THREADS, 0, cs>>>((const float *)q, (const float *)k, (const float *)v,
                                                     (const float *)o, (const float *)dout, (const float *)lse,
                                                     (float *)D, (float *)dq, B, NH, NKV, T, S, HS, (float)scale,
                                                     causal);
    lt_status st = lt_cuda_check_launch("attention_dq_kernel");
    if (st != LT_OK)
      return st;
  }
  if (M > 0) {
    unsigned g = lt_cuda_blocks(M, THREADS);
    if (dt == LT_DTYPE_F64)
      attention_dkv_kernel_f64<<<g, THREADS, 0, cs>>>((const double *)q, (const double *)k, (const double *)v,
                                                      (const double *)dout, (const double *)lse, (const double *)D,
                                                      (double *)dk, (double *)dv, B, NH, NKV, T, S, HS, scale,
                                                      causal);
    else
      attention_dkv_kernel_f32<<<g, THREADS, 0, cs>>>((const float *)q, (const float *)k, (const float *)v,
                                                      (const float *)dout, (const float *)lse, (const float *)D,
                                                      (float *)dk, (float *)dv, B, NH, NKV, T, S, HS, (float)scale,
                                                      causal);
    return lt_cuda_check_launch("attention_dkv_kernel");
  }
  return LT_OK;
}
