/*
 * attention.cu: fused scaled-dot-product attention on the GPU, forward and
 * backward in f32 or f64 (the host converts 16-bit inputs), with the row
 * algorithms of kernels/attention_rows.h that the CPU backend runs too: one
 * thread per query row (forward, dq) or per key row (dk and dv, summing the
 * query heads that share the key/value head). Nothing of size (T, S) is
 * stored; each sum runs in a fixed order, so results are deterministic.
 * Threads read K and V rows through the caches, no tiling in shared
 * memory: the path for f32, f64 and the head sizes that the tensor-core
 * kernels (attention_mma.cu: bf16/f16, head sizes 32, 64 and 128) and cuDNN do
 * not take.
 */
#include "common.cuh"

#include "../attention_rows.h"

LT_DEFINE_ATTENTION_ROWS(float, f32, expf, logf)
LT_DEFINE_ATTENTION_ROWS(double, f64, exp, log)

static const int THREADS = 128;

/* the shared row functions by type */
__device__ __forceinline__ float dot(const float *a, const float *b, int64_t n) { return lt_attn_dot_f32(a, b, n); }
__device__ __forceinline__ double dot(const double *a, const double *b, int64_t n) { return lt_attn_dot_f64(a, b, n); }
__device__ __forceinline__ void fwd_row(const float *q, const float *k, const float *v, float *o, float *lse, int64_t L,
                                        int64_t HS, float scale, float *acc) {
  lt_attn_fwd_row_f32(q, k, v, o, lse, L, HS, scale, acc);
}
__device__ __forceinline__ void fwd_row(const double *q, const double *k, const double *v, double *o, double *lse,
                                        int64_t L, int64_t HS, double scale, double *acc) {
  lt_attn_fwd_row_f64(q, k, v, o, lse, L, HS, scale, acc);
}
__device__ __forceinline__ void q_row(const float *q, const float *k, const float *v, const float *g, float lse,
                                      float D, float *dq, int64_t L, int64_t HS, float scale) {
  lt_attn_bwd_q_row_f32(q, k, v, g, lse, D, dq, L, HS, scale);
}
__device__ __forceinline__ void q_row(const double *q, const double *k, const double *v, const double *g, double lse,
                                      double D, double *dq, int64_t L, int64_t HS, double scale) {
  lt_attn_bwd_q_row_f64(q, k, v, g, lse, D, dq, L, HS, scale);
}
__device__ __forceinline__ void kv_row(const float *q, const float *kj, const float *vj, const float *g,
                                       const float *lse, const float *D, float *dk, float *dv, int64_t first, int64_t T,
                                       int64_t HS, float scale) {
  lt_attn_bwd_kv_row_f32(q, kj, vj, g, lse, D, dk, dv, first, T, HS, scale);
}
__device__ __forceinline__ void kv_row(const double *q, const double *kj, const double *vj, const double *g,
                                       const double *lse, const double *D, double *dk, double *dv, int64_t first,
                                       int64_t T, int64_t HS, double scale) {
  lt_attn_bwd_kv_row_f64(q, kj, vj, g, lse, D, dk, dv, first, T, HS, scale);
}

/* HSC: the head size fixed at compile time (loops unroll, rows stay in
   registers), or 0 for any head size up to LT_ATTN_MAX_HS */
template <typename T, int HSC>
__global__ void attention_fwd_kernel(const T *q, const T *k, const T *v, T *o, T *lse, int64_t B, int64_t NH,
                                     int64_t NKV, int64_t Tq, int64_t S, int64_t hs, T scale, int causal) {
  const int64_t HS = HSC ? HSC : hs, rep = NH / NKV, N = B * NH * Tq;
  T acc[HSC ? HSC : LT_ATTN_MAX_HS];
  LT_GRID_STRIDE(r, N) {
    int64_t i = r % Tq, bh = r / Tq, b = bh / NH, g = (bh % NH) / rep;
    fwd_row(q + r * HS, k + (b * NKV + g) * S * HS, v + (b * NKV + g) * S * HS, o + r * HS, lse + r,
            lt_attn_visible(i, Tq, S, causal), HS, scale, acc);
  }
}

template <typename T, int HSC>
__global__ void attention_dq_kernel(const T *q, const T *k, const T *v, const T *o, const T *dout, const T *lse, T *D,
                                    T *dq, int64_t B, int64_t NH, int64_t NKV, int64_t Tq, int64_t S, int64_t hs,
                                    T scale, int causal) {
  const int64_t HS = HSC ? HSC : hs, rep = NH / NKV, N = B * NH * Tq;
  T acc[HSC ? HSC : LT_ATTN_MAX_HS]; /* dq summed here (registers for a fixed HS), stored once */
  LT_GRID_STRIDE(r, N) {
    int64_t i = r % Tq, bh = r / Tq, b = bh / NH, g = (bh % NH) / rep;
    T Dr = dot(dout + r * HS, o + r * HS, HS);
    D[r] = Dr;
    q_row(q + r * HS, k + (b * NKV + g) * S * HS, v + (b * NKV + g) * S * HS, dout + r * HS, lse[r], Dr, acc,
          lt_attn_visible(i, Tq, S, causal), HS, scale);
    for (int64_t d = 0; d < HS; d++)
      dq[r * HS + d] = acc[d];
  }
}

template <typename T, int HSC>
__global__ void attention_dkv_kernel(const T *q, const T *k, const T *v, const T *dout, const T *lse, const T *D,
                                     T *dk, T *dv, int64_t B, int64_t NH, int64_t NKV, int64_t Tq, int64_t S,
                                     int64_t hs, T scale, int causal) {
  const int64_t HS = HSC ? HSC : hs, rep = NH / NKV, M = B * NKV * S;
  T dka[HSC ? HSC : LT_ATTN_MAX_HS], dva[HSC ? HSC : LT_ATTN_MAX_HS]; /* summed here, stored once */
  LT_GRID_STRIDE(r, M) {
    int64_t j = r % S, bg = r / S, b = bg / NKV, g = bg % NKV;
    for (int64_t d = 0; d < HS; d++)
      dka[d] = dva[d] = 0;
    for (int64_t h = g * rep; h < (g + 1) * rep; h++) {
      int64_t qs = (b * NH + h) * Tq;
      kv_row(q + qs * HS, k + r * HS, v + r * HS, dout + qs * HS, lse + qs, D + qs, dka, dva,
             lt_attn_first_query(j, Tq, S, causal), Tq, HS, scale);
    }
    for (int64_t d = 0; d < HS; d++) {
      dk[r * HS + d] = dka[d];
      dv[r * HS + d] = dva[d];
    }
  }
}

/* launches K<T, HSC> for the head sizes compiled in, else K<T, 0> */
#define LT_ATTN_DISPATCH(HS, LAUNCH)                                                                        \
  switch (HS) {                                                                                          \
  case 32: LAUNCH(32); break;                                                                            \
  case 64: LAUNCH(64); break;                                                                            \
  case 128: LAUNCH(128); break;                                                                          \
  default: LAUNCH(0); break;                                                                             \
  }

/* the launches in compute type T (f64 for f64, else f32) */
template <typename T>
static lt_status attention_fwd_run(const void *q, const void *k, const void *v, void *o, void *lse, int64_t B,
                                   int64_t NH, int64_t NKV, int64_t T_, int64_t S, int64_t HS, T scale, int causal,
                                   cudaStream_t cs) {
  unsigned g = lt_cuda_blocks(B * NH * T_, THREADS);
#define L(H)                                                                                                 \
  attention_fwd_kernel<T, H><<<g, THREADS, 0, cs>>>((const T *)q, (const T *)k, (const T *)v, (T *)o, (T *)lse, B, \
                                                    NH, NKV, T_, S, HS, scale, causal)
  LT_ATTN_DISPATCH(HS, L)
#undef L
  return lt_cuda_check_launch("attention_fwd_kernel");
}

template <typename T>
static lt_status attention_bwd_run(const void *q, const void *k, const void *v, const void *o, const void *dout,
                                   const void *lse, void *D, void *dq, void *dk, void *dv, int64_t B, int64_t NH,
                                   int64_t NKV, int64_t T_, int64_t S, int64_t HS, T scale, int causal,
                                   cudaStream_t cs) {
  int64_t N = B * NH * T_, M = B * NKV * S;
  if (N > 0) { /* D and dq first: the key rows read D */
    unsigned g = lt_cuda_blocks(N, THREADS);
#define L(H)                                                                                                  \
  attention_dq_kernel<T, H><<<g, THREADS, 0, cs>>>((const T *)q, (const T *)k, (const T *)v, (const T *)o,       \
                                                   (const T *)dout, (const T *)lse, (T *)D, (T *)dq, B, NH, NKV, \
                                                   T_, S, HS, scale, causal)
    LT_ATTN_DISPATCH(HS, L)
#undef L
    lt_status st = lt_cuda_check_launch("attention_dq_kernel");
    if (st != LT_OK)
      return st;
  }
  if (M > 0) {
    unsigned g = lt_cuda_blocks(M, THREADS);
#define L(H)                                                                                                    \
  attention_dkv_kernel<T, H><<<g, THREADS, 0, cs>>>((const T *)q, (const T *)k, (const T *)v, (const T *)dout,     \
                                                    (const T *)lse, (const T *)D, (T *)dk, (T *)dv, B, NH, NKV, T_, \
                                                    S, HS, scale, causal)
    LT_ATTN_DISPATCH(HS, L)
#undef L
    return lt_cuda_check_launch("attention_dkv_kernel");
  }
  return LT_OK;
}

extern "C" lt_status lt_cuda_attention_fwd(lt_dtype dt, const void *q, const void *k, const void *v, void *o,
                                           void *lse, int64_t B, int64_t NH, int64_t NKV, int64_t T, int64_t S,
                                           int64_t HS, double scale, int causal, lt_cuda_stream s) {
  if (B * NH * T == 0)
    return LT_OK;
  cudaStream_t cs = (cudaStream_t)s;
  if (dt == LT_DTYPE_F64)
    return attention_fwd_run<double>(q, k, v, o, lse, B, NH, NKV, T, S, HS, scale, causal, cs);
  return attention_fwd_run<float>(q, k, v, o, lse, B, NH, NKV, T, S, HS, (float)scale, causal, cs);
}

extern "C" lt_status lt_cuda_attention_bwd(lt_dtype dt, const void *q, const void *k, const void *v, const void *o,
                                           const void *dout, const void *lse, void *D, void *dq, void *dk, void *dv,
                                           int64_t B, int64_t NH, int64_t NKV, int64_t T, int64_t S, int64_t HS,
                                           double scale, int causal, lt_cuda_stream s) {
  cudaStream_t cs = (cudaStream_t)s;
  if (dt == LT_DTYPE_F64)
    return attention_bwd_run<double>(q, k, v, o, dout, lse, D, dq, dk, dv, B, NH, NKV, T, S, HS, scale, causal, cs);
  return attention_bwd_run<float>(q, k, v, o, dout, lse, D, dq, dk, dv, B, NH, NKV, T, S, HS, (float)scale, causal,
                                  cs);
}
