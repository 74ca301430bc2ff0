/*
 * norm.c: LayerNorm (Ba, Kiros, Hinton 2016) and RMSNorm (Zhang and Sennrich
 * 2019) over the last dim of contiguous (N, C) rows, forward and backward,
 * in f32 or f64 (the host converts 16-bit floats). Forward saves the mean
 * (LayerNorm) and reciprocal std per row; backward recomputes the normalized
 * row from them. With a residual the input is h = x + res, written out as
 * it is formed (the pre-norm block's residual add fused in), and backward
 * adds the gradient arriving at h into dx. Rows run in parallel; weight and bias gradients are summed
 * over rows by column blocks, in row order, so they do not depend on the
 * number of threads.
 */
#include "cpu.h"

#include <math.h>
#include <omp.h>


/* h = x + res over one row; returns h (the residual add fused into the norm) */
#define DEFINE_ADD_ROW(T)                                                                      \
  static inline const T *add_row_##T(const T *x, const T *res, T *h, int64_t C) {              \
    for (int64_t c = 0; c < C; c++) h[c] = x[c] + res[c];                                      \
    return h;                                                                                  \
  }
DEFINE_ADD_ROW(float)
DEFINE_ADD_ROW(double)
#define add_row(x, res, h, C) _Generic((h), float *: add_row_float, double *: add_row_double)(x, res, h, C)

#define DEFINE_NORM(T, SFX, SQRT)                                                              \
  static void layer_norm_fwd_##SFX(const T *x, const T *res, const T *w, const T *b, T *y, T *h, \
                                   T *mean, T *rstd, int64_t N, int64_t C, double eps) {        \
    _Pragma("omp parallel for schedule(static) if (N * C >= 32768)")                                       \
    for (int64_t r = 0; r < N; r++) {                                                           \
      const T *xr = res ? add_row(x + r * C, res + r * C, h + r * C, C) : x + r * C;            \
      T *yr = y + r * C;                                                                        \
      double m = 0, v = 0;                                                                      \
      for (int64_t c = 0; c < C; c++) m += xr[c];                                               \
      m /= (double)C;                                                                           \
      for (int64_t c = 0; c < C; c++) { double d = xr[c] - m; v += d * d; }                     \
      v /= (double)C;                                                                           \
      T s = (T)(1.0 / SQRT(v + eps));                                                           \
      T mt = (T)m;                                                                              \
      for (int64_t c = 0; c < C; c++) {                                                         \
        T n = (xr[c] - mt) * s;                                                                 \
        yr[c] = n * (w ? w[c] : (T)1) + (b ? b[c] : (T)0);                                      \
      }                                                                                         \
      mean[r] = mt;                                                                             \
      rstd[r] = s;                                                                              \
    }                                                                                           \
  }                                                                                             \
  static void layer_norm_bwd_##SFX(const T *dy, const T *x, const T *w, const T *mean,          \
                                   const T *rstd, const T *dadd, T *dx, T *dw, T *db, int64_t N, \
                                   int64_t C) {                                                 \
    _Pragma("omp parallel for schedule(static) if (N * C >= 32768)")                                       \
    for (int64_t r = 0; r < N; r++) {                                                           \
      const T *xr = x + r * C, *gr = dy + r * C;                                                \
      T m = mean[r], s = rstd[r];                                                               \
      double sum_g = 0, sum_gn = 0;                                                             \
      for (int64_t c = 0; c < C; c++) {                                                         \
        T g = gr[c] * (w ? w[c] : (T)1), n = (xr[c] - m) * s;                                   \
        sum_g += g;                                                                             \
        sum_gn += g * n;                                                                        \
      }                                                                                         \
      T mg = (T)(sum_g / (double)C), mgn = (T)(sum_gn / (double)C);                             \
      if (dx)                                                                                   \
        for (int64_t c = 0; c < C; c++) {                                                       \
          T g = gr[c] * (w ? w[c] : (T)1), n = (xr[c] - m) * s;                                 \
          dx[r * C + c] = s * (g - mg - n * mgn) + (dadd ? dadd[r * C + c] : (T)0);             \
        }                                                                                       \
    }                                                                                           \
    if (!dw && !db)                                                                             \
      return;                                                                                   \
    _Pragma("omp parallel for schedule(static) if (N * C >= 32768)")                                       \
    for (int64_t c = 0; c < C; c++) {                                                           \
      double aw = 0, ab = 0;                                                                    \
      for (int64_t r = 0; r < N; r++) {                                                         \
        T g = dy[r * C + c];                                                                    \
        aw += g * ((x[r * C + c] - mean[r]) * rstd[r]);                                         \
        ab += g;                                                                                \
      }                                                                                         \
      if (dw) dw[c] = (T)aw;                                                                    \
      if (db) db[c] = (T)ab;                                                                    \
    }                                                                                           \
  }                                                                                             \
  static void rms_norm_fwd_##SFX(const T *x, const T *res, const T *w, T *y, T *h, T *rstd,       \
                                 int64_t N, int64_t C, double eps) {                            \
    _Pragma("omp parallel for schedule(static) if (N * C >= 32768)")                                       \
    for (int64_t r = 0; r < N; r++) {                                                           \
      const T *xr = res ? add_row(x + r * C, res + r * C, h + r * C, C) : x + r * C;            \
      double ss = 0;                                                                            \
      for (int64_t c = 0; c < C; c++) ss += (double)xr[c] * xr[c];                              \
      T s = (T)(1.0 / SQRT(ss / (double)C + eps));                                              \
      for (int64_t c = 0; c < C; c++) y[r * C + c] = xr[c] * s * (w ? w[c] : (T)1);             \
      rstd[r] = s;                                                                              \
    }                                                                                           \
  }                                                                                             \
  static void rms_norm_bwd_##SFX(const T *dy, const T *x, const T *w, const T *rstd,              \
                                 const T *dadd, T *dx, T *dw, int64_t N, int64_t C) {           \
    _Pragma("omp parallel for schedule(static) if (N * C >= 32768)")                                       \
    for (int64_t r = 0; r < N; r++) {                                                           \
      const T *xr = x + r * C, *gr = dy + r * C;                                                \
      T s = rstd[r];                                                                            \
      double sum_gn = 0;                                                                        \
      for (int64_t c = 0; c < C; c++) sum_gn += gr[c] * (w ? w[c] : (T)1) * xr[c] * s;          \
      T mgn = (T)(sum_gn / (double)C);                                                          \
      if (dx)                                                                                   \
        for (int64_t c = 0; c < C; c++) {                                                       \
          T g = gr[c] * (w ? w[c] : (T)1), n = xr[c] * s;                                       \
          dx[r * C + c] = s * (g - n * mgn) + (dadd ? dadd[r * C + c] : (T)0);                  \
        }                                                                                       \
    }                                                                                           \
    if (!dw)                                                                                    \
      return;                                                                                   \
    _Pragma("omp parallel for schedule(static) if (N * C >= 32768)")                                       \
    for (int64_t c = 0; c < C; c++) {                                                           \
      double aw = 0;                                                                            \
      for (int64_t r = 0; r < N; r++) aw += dy[r * C + c] * (x[r * C + c] * rstd[r]);           \
      dw[c] = (T)aw;                                                                            \
    }                                                                                           \
  }

DEFINE_NORM(float, f32, sqrt)
DEFINE_NORM(double, f64, sqrt)

lt_status lt_cpu_layer_norm_fwd(lt_dtype dt, const void *x, const void *res, const void *w, const void *b, void *y,
                                void *h, void *mean, void *rstd, int64_t N, int64_t C, double eps) {
  if (dt == LT_DTYPE_F64)
    layer_norm_fwd_f64(x, res, w, b, y, h, mean, rstd, N, C, eps);
  else
    layer_norm_fwd_f32(x, res, w, b, y, h, mean, rstd, N, C, eps);
  return LT_OK;
}

lt_status lt_cpu_layer_norm_bwd(lt_dtype dt, const void *dy, const void *x, const void *w, const void *mean,
                                const void *rstd, const void *dadd, void *dx, void *dw, void *db, int64_t N,
                                int64_t C) {
  if (dt == LT_DTYPE_F64)
    layer_norm_bwd_f64(dy, x, w, mean, rstd, dadd, dx, dw, db, N, C);
  else
    layer_norm_bwd_f32(dy, x, w, mean, rstd, dadd, dx, dw, db, N, C);
  return LT_OK;
}

lt_status lt_cpu_rms_norm_fwd(lt_dtype dt, const void *x, const void *res, const void *w, void *y, void *h,
                              void *rstd, int64_t N, int64_t C, double eps) {
  if (dt == LT_DTYPE_F64)
    rms_norm_fwd_f64(x, res, w, y, h, rstd, N, C, eps);
  else
    rms_norm_fwd_f32(x, res, w, y, h, rstd, N, C, eps);
  return LT_OK;
}

lt_status lt_cpu_rms_norm_bwd(lt_dtype dt, const void *dy, const void *x, const void *w, const void *rstd,
                              const void *dadd, void *dx, void *dw, int64_t N, int64_t C) {
  if (dt == LT_DTYPE_F64)
    rms_norm_bwd_f64(dy, x, w, rstd, dadd, dx, dw, N, C);
  else
    rms_norm_bwd_f32(dy, x, w, rstd, dadd, dx, dw, N, C);
  return LT_OK;
}
