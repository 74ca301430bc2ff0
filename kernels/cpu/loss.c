/*
 * loss.c: cross-entropy fused with log-softmax over logits (N, V) whose rows
 * are ldx apart (V <= ldx: a view of wider rows, or rows padded past the
 * classes) and integer targets (N), in f32 or f64. Forward writes each row's loss
 * (logsumexp - logit of the target) and logsumexp, 0 for rows whose target
 * is the ignore index; backward writes (softmax - one_hot) * scale[row]
 * without ever storing probabilities. Targets outside [0, V) (other than the
 * ignore index) stop the forward with their row in *bad. f32 rows use the
 * vectorizable exp of fastexp.h (within 2 ulp of expf).
 */
#include "cpu.h"
#include "fastexp.h"

#include <math.h>

#define DEFINE_CE(T, SFX, ROWMAX, SUMEXP, EXPSCALE, LOG)                                                             \
  static void ce_fwd_##SFX(const T *x, int64_t ldx, const char *tgt, lt_dtype tdt, int64_t N,  \
                           int64_t V, int64_t ignore, T *loss, T *lse) {                        \
    _Pragma("omp parallel for schedule(static) if (N * V >= 32768)")                            \
    for (int64_t r = 0; r < N; r++) {                                                           \
      int64_t t = lt_cpu_index_at(tgt, tdt, 1, r);                                              \
      const T *xr = x + r * ldx;                                                                \
      if (t == ignore) {                                                                        \
        loss[r] = 0;                                                                            \
        lse[r] = 0;                                                                             \
        continue;                                                                               \
      }                                                                                         \
      T m = ROWMAX(xr, V);                                                                      \
      double s = SUMEXP(xr, V, m);                                                              \
      T l = m + (T)LOG(s);                                                                      \
      lse[r] = l;                                                                               \
      loss[r] = l - xr[t];                                                                      \
    }                                                                                           \
  }                                                                                             \
  static void ce_bwd_##SFX(const T *x, int64_t ldx, const char *tgt, lt_dtype tdt, int64_t N,  \
                           int64_t V, int64_t ldd, int64_t ignore, const T *lse, const T *scale, \
                           T *dx) {                                                             \
    _Pragma("omp parallel for schedule(static) if (N * V >= 32768)")                            \
    for (int64_t r = 0; r < N; r++) {                                                           \
      int64_t t = lt_cpu_index_at(tgt, tdt, 1, r);                                              \
      const T *xr = x + r * ldx;                                                                \
      T *dr = dx + r * ldd;                                                                     \
      for (int64_t c = V; c < ldd; c++) dr[c] = 0;                                              \
      if (t == ignore) {                                                                        \
        for (int64_t c = 0; c < V; c++) dr[c] = 0;                                              \
        continue;                                                                               \
      }                                                                                         \
      T l = lse[r], s = scale ? scale[r] : (T)1;                                                \
      EXPSCALE(xr, dr, V, l, s);                                                                \
      dr[t] -= s;                                                                               \
    }                                                                                           \
  }

DEFINE_CE(float, f32, lt_row_max_f32, lt_row_sum_exp_f32, lt_row_exp_scale_f32, log)
DEFINE_CE(double, f64, lt_row_max_f64, lt_row_sum_exp_f64, lt_row_exp_scale_f64, log)

lt_status lt_cpu_cross_entropy_fwd(lt_dtype dt, const void *x, int64_t ldx, const char *targets, lt_dtype tdt,
                                   int64_t N, int64_t V, int64_t ignore, void *loss, void *lse, int64_t *bad) {
  for (int64_t r = 0; r < N; r++) {
    int64_t t = lt_cpu_index_at(targets, tdt, 1, r);
    if (t != ignore && (t < 0 || t >= V)) {
      *bad = r;
      return LT_ERR_ARG;
    }
  }
  if (dt == LT_DTYPE_F64)
    ce_fwd_f64(x, ldx, targets, tdt, N, V, ignore, loss, lse);
  else
    ce_fwd_f32(x, ldx, targets, tdt, N, V, ignore, loss, lse);
  return LT_OK;
}

lt_status lt_cpu_cross_entropy_bwd(lt_dtype dt, const void *x, int64_t ldx, const char *targets, lt_dtype tdt,
                                   int64_t N, int64_t V, int64_t ldd, int64_t ignore, const void *lse,
                                   const void *scale, void *dx) {
  if (dt == LT_DTYPE_F64)
    ce_bwd_f64(x, ldx, targets, tdt, N, V, ldd, ignore, lse, scale, dx);
  else
    ce_bwd_f32(x, ldx, targets, tdt, N, V, ldd, ignore, lse, scale, dx);
  return LT_OK;
}
