/*
 * attention.c: fused scaled-dot-product attention on the CPU, forward and
 * backward, f32 or f64: the row algorithms of kernels/attention_rows.h
 * (shared with the CUDA backend) run in parallel over query rows, and in
 * backward over query rows (dq) then key rows (dk, dv, summing the query
 * heads that share a key/value head). Rows are independent and each sums in
 * a fixed order, so results do not depend on the number of threads.
 */
#include "cpu.h"

#include "../attention_rows.h"

#include <math.h>

LT_DEFINE_ATTENTION_ROWS(float, f32, expf, logf)
LT_DEFINE_ATTENTION_ROWS(double, f64, exp, log)

#define DEFINE_ATTENTION(T_, SFX)                                                                         \
  static void attention_fwd_##SFX(const T_ *q, const T_ *k, const T_ *v, T_ *o, T_ *lse, int64_t B,        \
                                  int64_t NH, int64_t NKV, int64_t T, int64_t S, int64_t HS, T_ scale,      \
                                  int causal) {                                                           \
    int64_t rep = NH / NKV, N = B * NH * T;                                                               \
    _Pragma("omp parallel for schedule(static)")                                                          \
    for (int64_t r = 0; r < N; r++) {                                                                     \
      T_ acc[LT_ATTN_MAX_HS]; /* the host keeps HS within it */                                          \
      int64_t i = r % T, bh = r / T, b = bh / NH, g = (bh % NH) / rep;                                    \
      const T_ *kv_k = k + (b * NKV + g) * S * HS, *kv_v = v + (b * NKV + g) * S * HS;                     \
      lt_attn_fwd_row_##SFX(q + r * HS, kv_k, kv_v, o + r * HS, lse + r, lt_attn_visible(i, T, S, causal),  \
                            HS, scale, acc);                                                              \
    }                                                                                                     \
  }                                                                                                       \
  static void attention_bwd_##SFX(const T_ *q, const T_ *k, const T_ *v, const T_ *o, const T_ *dout,      \
                                  const T_ *lse, T_ *D, T_ *dq, T_ *dk, T_ *dv, int64_t B, int64_t NH,      \
                                  int64_t NKV, int64_t T, int64_t S, int64_t HS, T_ scale, int causal) {    \
    int64_t rep = NH / NKV, N = B * NH * T, M = B * NKV * S;                                              \
    _Pragma("omp parallel for schedule(static)")                                                          \
    for (int64_t r = 0; r < N; r++) { /* D = dO . O, then dq */                                           \
      int64_t i = r % T, bh = r / T, b = bh / NH, g = (bh % NH) / rep;                                    \
      D[r] = lt_attn_dot_##SFX(dout + r * HS, o + r * HS, HS);                                             \
      lt_attn_bwd_q_row_##SFX(q + r * HS, k + (b * NKV + g) * S * HS, v + (b * NKV + g) * S * HS,          \
                              dout + r * HS, lse[r], D[r], dq + r * HS, lt_attn_visible(i, T, S, causal),  \
                              HS, scale);                                                                 \
    }                                                                                                     \
    _Pragma("omp parallel for schedule(static)")                                                          \
    for (int64_t r = 0; r < M; r++) { /* dk, dv of key row j of head g, over its query heads */          \
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

DEFINE_ATTENTION(float, f32)
DEFINE_ATTENTION(double, f64)

lt_status lt_cpu_attention_fwd(lt_dtype dt, const void *q, const void *k, const void *v, void *o, void *lse,
                                int64_t B, int64_t NH, int64_t NKV, int64_t T, int64_t S, int64_t HS, double scale,
                                int causal) {
  if (dt == LT_DTYPE_F64)
    attention_fwd_f64(q, k, v, o, lse, B, NH, NKV, T, S, HS, scale, causal);
  else
    attention_fwd_f32(q, k, v, o, lse, B, NH, NKV, T, S, HS, (float)scale, causal);
  return LT_OK;
}

lt_status lt_cpu_attention_bwd(lt_dtype dt, const void *q, const void *k, const void *v, const void *o,
                                const void *dout, const void *lse, void *D, void *dq, void *dk, void *dv, int64_t B,
                                int64_t NH, int64_t NKV, int64_t T, int64_t S, int64_t HS, double scale, int causal) {
  if (dt == LT_DTYPE_F64)
    attention_bwd_f64(q, k, v, o, dout, lse, D, dq, dk, dv, B, NH, NKV, T, S, HS, scale, causal);
  else
    attention_bwd_f32(q, k, v, o, dout, lse, D, dq, dk, dv, B, NH, NKV, T, S, HS, (float)scale, causal);
  return LT_OK;
}
