/*
 * softmax.c: softmax and log-softmax over contiguous (N, C) rows, forward
 * and backward, in f32 or f64, of the rows times a scale and, for attention,
 * under a causal mask (the masked entries never read); numerically stable
 * (the row maximum is subtracted before exp). A row whose every entry is -inf (fully masked
 * attention) gives zeros, and zero gradients, instead of NaN.
 */
#include "cpu.h"
#include "fastexp.h"

#include <math.h>

/* The entries of row r that take part: all, or under a causal mask of
   `causal` queries the first (r % causal) + C - causal + 1 (at most C). */
static inline int64_t visible(int64_t r, int64_t C, int64_t causal) {
  if (causal <= 0)
    return C;
  int64_t n = r % causal + C - causal + 1;
  return n < 0 ? 0 : (n > C ? C : n);
}

#define DEFINE_SOFTMAX(T, SFX, EXP, LOG, ROWMAX, SUMEXP, EXPSCALE)                                                       \
  static void softmax_fwd_##SFX(const T *x, T *y, int64_t N, int64_t C, int logsm, T scale, int64_t causal) { \
    _Pragma("omp parallel for schedule(static) if (N * C >= 32768)")                           \
    for (int64_t r = 0; r < N; r++) {                                                          \
      const T *xr = x + r * C;                                                                 \
      T *yr = y + r * C;                                                                       \
      int64_t L = visible(r, C, causal);                                                       \
      const T *src = xr;                                                                       \
      if (scale != (T)1) { /* the scaled row, in y's memory */                                 \
        for (int64_t c = 0; c < L; c++) yr[c] = xr[c] * scale;                                 \
        src = yr;                                                                              \
      }                                                                                        \
      T m = L > 0 ? ROWMAX(src, L) : -(T)INFINITY;                                             \
      if (m == -(T)INFINITY) { /* all masked, or all NaN (the maximum skips NaN) */            \
        int nan = 0;                                                                           \
        for (int64_t c = 0; c < L; c++) nan |= src[c] != src[c];                               \
        for (int64_t c = 0; c < C; c++) /* (masked columns stay masked) */                      \
          yr[c] = nan && c < L ? (T)NAN : logsm ? -(T)INFINITY : (T)0;                         \
        continue;                                                                              \
      }                                                                                        \
      double sum = SUMEXP(src, L, m);                                                          \
      if (logsm) {                                                                             \
        T lse = m + (T)LOG(sum);                                                               \
        for (int64_t c = 0; c < L; c++) yr[c] = src[c] - lse;                                  \
        for (int64_t c = L; c < C; c++) yr[c] = -(T)INFINITY;                                  \
      } else {                                                                                 \
        T inv = (T)(1.0 / sum);                                                                \
        EXPSCALE(src, yr, L, m, inv);                                                          \
        for (int64_t c = L; c < C; c++) yr[c] = 0;                                             \
      }                                                                                        \
    }                                                                                          \
  }                                                                                            \
  /* softmax: dx = scale y (dy - sum(dy y)); log-softmax: dx = scale (dy - exp(y) sum(dy)) */  \
  static void softmax_bwd_##SFX(const T *y, const T *dy, T *dx, int64_t N, int64_t C, int logsm, T scale) { \
    _Pragma("omp parallel for schedule(static) if (N * C >= 32768)")                           \
    for (int64_t r = 0; r < N; r++) {                                                          \
      const T *yr = y + r * C, *gr = dy + r * C;                                               \
      T *xr = dx + r * C;                                                                      \
      double s = 0;                                                                            \
      if (logsm) {                                                                             \
        if (C > 0 && yr[0] == -(T)INFINITY && (T)EXP(yr[0]) == 0) {                            \
          int masked = 1;                                                                      \
          for (int64_t c = 0; c < C && masked; c++) masked = yr[c] == -(T)INFINITY;            \
          if (masked) {                                                                        \
            for (int64_t c = 0; c < C; c++) xr[c] = 0;                                         \
            continue;                                                                          \
          }                                                                                    \
        }                                                                                      \
        for (int64_t c = 0; c < C; c++) s += gr[c];                                            \
        for (int64_t c = 0; c < C; c++) xr[c] = scale * (gr[c] - EXP(yr[c]) * (T)s);           \
      } else {                                                                                 \
        for (int64_t c = 0; c < C; c++) s += (double)gr[c] * yr[c];                            \
        for (int64_t c = 0; c < C; c++) xr[c] = scale * yr[c] * (gr[c] - (T)s);                \
      }                                                                                        \
    }                                                                                          \
  }

DEFINE_SOFTMAX(float, f32, lt_fast_expf, log, lt_row_max_f32, lt_row_sum_exp_f32, lt_row_exp_scale_f32)
DEFINE_SOFTMAX(double, f64, exp, log, lt_row_max_f64, lt_row_sum_exp_f64, lt_row_exp_scale_f64)

lt_status lt_cpu_softmax_fwd(lt_dtype dt, const void *x, void *y, int64_t N, int64_t C, int logsm, double scale,
                             int64_t causal) {
  if (dt == LT_DTYPE_F64)
    softmax_fwd_f64(x, y, N, C, logsm, scale, causal);
  else
    softmax_fwd_f32(x, y, N, C, logsm, (float)scale, causal);
  return LT_OK;
}

lt_status lt_cpu_softmax_bwd(lt_dtype dt, const void *y, const void *dy, void *dx, int64_t N, int64_t C,
                             int logsm, double scale) {
  if (dt == LT_DTYPE_F64)
    softmax_bwd_f64(y, dy, dx, N, C, logsm, scale);
  else
    softmax_bwd_f32(y, dy, dx, N, C, logsm, (float)scale);
  return LT_OK;
}
