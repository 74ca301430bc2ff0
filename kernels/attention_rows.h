/*
 * attention_rows.h: fused scaled-dot-product attention, one query row (or,
 * in backward, one key row) at a time, shared by the CPU backend
 * (kernels/cpu/attention.c, OpenMP over rows) and the CUDA one
 * (kernels/cuda/attention.cu, a thread per row): the same code, so what the
 * CPU tests check is what the GPU runs.
 *
 * Forward is the online softmax of FlashAttention (Dao et al. 2022; Milakov
 * and Gimelshein 2018): one pass over the visible keys keeps the running
 * maximum m, the running sum l of exp(s - m) and the running weighted sum of
 * value rows, so the (T, S) scores are never stored; it saves the row's
 * log-sum-exp. Backward recomputes each probability p = exp(s - lse) as
 * FlashAttention-2 does: with D_i = dO_i . O_i and dS_ij = p_ij (dO_i . V_j
 * - D_i), dQ_i = scale sum_j dS_ij K_j (a pass over query rows) and dK_j =
 * scale sum_i dS_ij Q_i, dV_j = sum_i p_ij dO_i (a pass over key rows, no
 * atomics, so the sums run in a fixed order).
 *
 * Layout: q (T, HS) rows of one head, k and v (S, HS) of its key/value
 * head, contiguous. Causal: query i sees keys j <= i + S - T (the mask
 * aligned at the end, as after a KV cache); a query that sees no key gives
 * zeros and lse = -inf.
 */
#ifndef LUTRA_ATTENTION_ROWS_H
#define LUTRA_ATTENTION_ROWS_H

#include "shared/host_device.h"

#include <math.h>
#include <stdint.h>

#define LT_HD LT_SHARED_INLINE /* (compiled for both devices) */
#ifdef __CUDA_ARCH__ /* the device pass: loops over a fixed HS unroll into registers */
#define LT_UNROLL _Pragma("unroll")
#else
#define LT_UNROLL
#endif
#if defined(_OPENMP) && !defined(__CUDACC__) /* the CPU: dot products in SIMD lanes (summed in another order) */
#define LT_SIMD_SUM(s) _Pragma("omp simd reduction(+ : s)")
#else
#define LT_SIMD_SUM(s)
#endif

/* head sizes up to this run fused (the CUDA thread keeps a row of HS
   accumulators; kernels compiled for a fixed HS keep them in registers) */
#define LT_ATTN_MAX_HS 256

/* the keys query i of T sees among S */
LT_HD int64_t lt_attn_visible(int64_t i, int64_t T, int64_t S, int causal) {
  if (!causal)
    return S;
  int64_t n = i + S - T + 1;
  return n < 0 ? 0 : (n > S ? S : n);
}

/* the first query of T that sees key j among S */
LT_HD int64_t lt_attn_first_query(int64_t j, int64_t T, int64_t S, int causal) {
  if (!causal)
    return 0;
  int64_t i = j - (S - T);
  return i < 0 ? 0 : i;
}

#define LT_DEFINE_ATTENTION_ROWS(T_, SFX, EXP, LOG)                                                        \
  LT_HD T_ lt_attn_dot_##SFX(const T_ *a, const T_ *b, int64_t n) {                                         \
    T_ s = 0;                                                                                              \
    LT_UNROLL LT_SIMD_SUM(s)                                                                               \
    for (int64_t d = 0; d < n; d++)                                                                        \
      s += a[d] * b[d];                                                                                    \
    return s;                                                                                              \
  }                                                                                                        \
  /* o = softmax(scale q K^T) V over the first L keys; acc: HS scratch */                                  \
  LT_HD void lt_attn_fwd_row_##SFX(const T_ *q, const T_ *k, const T_ *v, T_ *o, T_ *lse, int64_t L,        \
                                   int64_t HS, T_ scale, T_ *acc) {                                        \
    T_ m = -(T_)INFINITY, l = 0;                                                                           \
    int nan = 0;                                                                                           \
    LT_UNROLL                                                                                              \
    for (int64_t d = 0; d < HS; d++)                                                                       \
      acc[d] = 0;                                                                                          \
    for (int64_t j = 0; j < L; j++) {                                                                      \
      const T_ *kj = k + j * HS, *vj = v + j * HS;                                                         \
      T_ s = lt_attn_dot_##SFX(q, kj, HS) * scale;                                                         \
      if (s != s) { /* NaN: the row is NaN, as the composed softmax gives */                              \
        nan = 1;                                                                                           \
        continue;                                                                                          \
      }                                                                                                    \
      if (s == -(T_)INFINITY) /* weight 0 */                                                               \
        continue;                                                                                          \
      if (s > m) { /* a new maximum: rescale what was summed */                                           \
        T_ c = m == -(T_)INFINITY ? (T_)0 : EXP(m - s);                                                    \
        l = l * c + 1;                                                                                     \
        LT_UNROLL                                                                                          \
        for (int64_t d = 0; d < HS; d++)                                                                   \
          acc[d] = acc[d] * c + vj[d];                                                                     \
        m = s;                                                                                             \
      } else {                                                                                             \
        T_ p = EXP(s - m);                                                                                 \
        l += p;                                                                                            \
        LT_UNROLL                                                                                          \
        for (int64_t d = 0; d < HS; d++)                                                                   \
          acc[d] += p * vj[d];                                                                             \
      }                                                                                                    \
    }                                                                                                      \
    if (nan || l != l) { /* a NaN score (or inf - inf): NaN, as the composed softmax gives */             \
      for (int64_t d = 0; d < HS; d++)                                                                     \
        o[d] = (T_)NAN;                                                                                    \
      *lse = (T_)NAN;                                                                                      \
      return;                                                                                              \
    }                                                                                                      \
    if (!(l > 0)) { /* no visible key (or all scores -inf) */                                              \
      LT_UNROLL                                                                                            \
      for (int64_t d = 0; d < HS; d++)                                                                     \
        o[d] = 0;                                                                                          \
      *lse = -(T_)INFINITY;                                                                                \
      return;                                                                                              \
    }                                                                                                      \
    T_ inv = 1 / l;                                                                                        \
    LT_UNROLL                                                                                              \
    for (int64_t d = 0; d < HS; d++)                                                                       \
      o[d] = acc[d] * inv;                                                                                 \
    *lse = m + LOG(l);                                                                                     \
  }                                                                                                        \
  /* dq = scale sum_j p (dO . V_j - D) K_j over the first L keys (D = dO . O) */                           \
  LT_HD void lt_attn_bwd_q_row_##SFX(const T_ *q, const T_ *k, const T_ *v, const T_ *dout, T_ lse, T_ D,    \
                                     T_ *dq, int64_t L, int64_t HS, T_ scale) {                            \
    LT_UNROLL                                                                                              \
    for (int64_t d = 0; d < HS; d++)                                                                       \
      dq[d] = 0;                                                                                           \
    if (lse == -(T_)INFINITY)                                                                              \
      return;                                                                                              \
    for (int64_t j = 0; j < L; j++) {                                                                      \
      const T_ *kj = k + j * HS, *vj = v + j * HS;                                                         \
      T_ p = EXP(lt_attn_dot_##SFX(q, kj, HS) * scale - lse);                                              \
      T_ ds = p * (lt_attn_dot_##SFX(dout, vj, HS) - D) * scale;                                           \
      LT_UNROLL                                                                                            \
      for (int64_t d = 0; d < HS; d++)                                                                     \
        dq[d] += ds * kj[d];                                                                               \
    }                                                                                                      \
  }                                                                                                        \
  /* key row j's share from one query head (adds into dk, dv): queries first..T-1 */                       \
  LT_HD void lt_attn_bwd_kv_row_##SFX(const T_ *q, const T_ *kj, const T_ *vj, const T_ *dout,              \
                                      const T_ *lse, const T_ *D, T_ *dk, T_ *dv, int64_t first,             \
                                      int64_t T, int64_t HS, T_ scale) {                                   \
    for (int64_t i = first; i < T; i++) {                                                                  \
      if (lse[i] == -(T_)INFINITY)                                                                         \
        continue;                                                                                          \
      const T_ *qi = q + i * HS, *gi = dout + i * HS;                                                      \
      T_ p = EXP(lt_attn_dot_##SFX(qi, kj, HS) * scale - lse[i]);                                          \
      T_ ds = p * (lt_attn_dot_##SFX(gi, vj, HS) - D[i]) * scale;                                          \
      LT_UNROLL                                                                                            \
      for (int64_t d = 0; d < HS; d++) {                                                                   \
        dv[d] += p * gi[d];                                                                                \
        dk[d] += ds * qi[d];                                                                               \
      }                                                                                                    \
    }                                                                                                      \
  }

#endif
