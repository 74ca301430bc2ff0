/*
 * softmax.c: softmax and log-softmax over contiguous (N, C) rows, forward
 * and backward, in f32 or f64; numerically stable (the row maximum is
 * subtracted before exp). A row whose every entry is -inf (fully masked
 * attention) gives zeros, and zero gradients, instead of NaN.
 */
#include "cpu.h"
#include "fastexp.h"

#include <math.h>

#define DEFINE_SOFTMAX(T, SFX, EXP, LOG, ROWMAX, SUMEXP, EXPSCALE)                                                       \
  static void softmax_fwd_##SFX(const T *x, T *y, int64_t N, int64_t C, int logsm) {            \
    _Pragma("omp parallel for schedule(static) if (N * C >= 32768)")                           \
    for (int64_t r = 0; r < N; r++) {                                                          \
      const T *xr = x + r * C;                                                                 \
      T *yr = y + r * C;                                                                       \
      T m = ROWMAX(xr, C);                                                                     \
      if (m == -(T)INFINITY) { /* all masked */                                                \
        for (int64_t c = 0; c < C; c++) yr[c] = logsm ? -(T)INFINITY : (T)0;                   \
        continue;                                                                              \
      }                                                                                        \
      double sum = SUMEXP(xr, C, m);                                                           \
      if (logsm) {                                                                             \
        T lse = m + (T)LOG(sum);                                                               \
        for (int64_t c = 0; c < C; c++) yr[c] = xr[c] - lse;                                   \
      } else {                                                                                 \
        T inv = (T)(1.0 / sum);                                                                \
        EXPSCALE(xr, yr, C, m, inv);                                                           \
      }                                                                                        \
    }                                                                                          \
  }                                                                                            \
  /* softmax: dx = y (dy - sum(dy y)); log-softmax: dx = dy - exp(y) sum(dy) */                \
  static void softmax_bwd_##SFX(const T *y, const T *dy, T *dx, int64_t N, int64_t C, int logsm) { \
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
        for (int64_t c = 0; c < C; c++) xr[c] = gr[c] - EXP(yr[c]) * (T)s;                     \
      } else {                                                                                 \
        for (int64_t c = 0; c < C; c++) s += (double)gr[c] * yr[c];                            \
        for (int64_t c = 0; c < C; c++) xr[c] = yr[c] * (gr[c] - (T)s);                        \
      }                                                                                        \
    }                                                                                          \
  }

DEFINE_SOFTMAX(float, f32, lt_fast_expf, log, lt_row_max_f32, lt_row_sum_exp_f32, lt_row_exp_scale_f32)
DEFINE_SOFTMAX(double, f64, exp, log, lt_row_max_f64, lt_row_sum_exp_f64, lt_row_exp_scale_f64)

lt_status lt_cpu_softmax_fwd(lt_dtype dt, const void *x, void *y, int64_t N, int64_t C, int logsm) {
  if (dt == LT_DTYPE_F64)
    softmax_fwd_f64(x, y, N, C, logsm);
  else
    softmax_fwd_f32(x, y, N, C, logsm);
  return LT_OK;
}

lt_status lt_cpu_softmax_bwd(lt_dtype dt, const void *y, const void *dy, void *dx, int64_t N, int64_t C,
                             int logsm) {
  if (dt == LT_DTYPE_F64)
    softmax_bwd_f64(y, dy, dx, N, C, logsm);
  else
    softmax_bwd_f32(y, dy, dx, N, C, logsm);
  return LT_OK;
}
