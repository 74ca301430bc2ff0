/*
 * fastexp.h: expf for the f32 row kernels (softmax, cross-entropy) in a form
 * compilers vectorize: Cody-Waite range reduction by ln 2 and Cephes'
 * degree-6 polynomial for exp on [-ln2/2, ln2/2] (Moshier, Cephes Math
 * Library, expf.c), then scaling by 2^k through the exponent bits. Within
 * 2 ulp of expf over the normal range; below -87.3 (where expf becomes
 * subnormal) it returns 0, and -inf gives 0 exactly as masking needs. NaN
 * propagates. No libm call and no branch, so loops of it become SIMD code.
 */
#ifndef LUTRA_FASTEXP_H
#define LUTRA_FASTEXP_H

#include <math.h>
#include <stdint.h>
#include <string.h>

static inline float lt_fast_expf(float x) {
  float xc = x > 88.3762626647949f ? 88.3762626647949f : x;
  xc = xc < -87.3365447505531f ? -87.3365447505531f : xc;
  xc = xc != xc ? 0.0f : xc; /* NaN: converting it to int below would be undefined; returned as NaN at the end */
  /* round(xc / ln2) by truncating a positive number: SSE2 has that, not floor */
  float k = (float)((int32_t)(xc * 1.44269504088896341f + 128.5f) - 128);
  float r = xc - k * 0.693359375f;
  r = r - k * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  float y = p * r * r + r + 1.0f;
  int32_t bits = ((int32_t)k + 127) << 23;
  float scale;
  memcpy(&scale, &bits, sizeof scale);
  y *= scale;
  y = x < -87.3365447505531f ? 0.0f : y; /* also -inf */
  return x != x ? x : y;
}

/* Row helpers over 8 independent lanes (fixed order, so deterministic),
   which compilers turn into SIMD code. */
enum { LT_LANES = 8 };

/* max over x[0..n), ignoring NaN as `a > b ? a : b` does; -inf for n = 0 */
static inline float lt_row_max_f32(const float *x, int64_t n) {
  float lane[LT_LANES];
  for (int j = 0; j < LT_LANES; j++)
    lane[j] = -__builtin_inff();
  int64_t c = 0;
  for (; c + LT_LANES <= n; c += LT_LANES)
    for (int j = 0; j < LT_LANES; j++)
      lane[j] = x[c + j] > lane[j] ? x[c + j] : lane[j];
  float m = -__builtin_inff();
  for (int j = 0; j < LT_LANES; j++)
    m = lane[j] > m ? lane[j] : m;
  for (; c < n; c++)
    m = x[c] > m ? x[c] : m;
  return m;
}

/* sum of exp(x[c] - m) over the row, accumulated in f64 lanes */
static inline double lt_row_sum_exp_f32(const float *x, int64_t n, float m) {
  double lane[LT_LANES] = {0};
  int64_t c = 0;
  for (; c + LT_LANES <= n; c += LT_LANES)
    for (int j = 0; j < LT_LANES; j++)
      lane[j] += (double)lt_fast_expf(x[c + j] - m);
  double s = 0;
  for (int j = 0; j < LT_LANES; j++)
    s += lane[j];
  for (; c < n; c++)
    s += (double)lt_fast_expf(x[c] - m);
  return s;
}

/* y[c] = exp(x[c] - m) * scale */
static inline void lt_row_exp_scale_f32(const float *x, float *y, int64_t n, float m, float scale) {
  for (int64_t c = 0; c < n; c++)
    y[c] = lt_fast_expf(x[c] - m) * scale;
}

/* the same helpers for f64 rows, with libm's exp */
static inline double lt_row_max_f64(const double *x, int64_t n) {
  double m = -__builtin_inf();
  for (int64_t c = 0; c < n; c++)
    m = x[c] > m ? x[c] : m;
  return m;
}

static inline double lt_row_sum_exp_f64(const double *x, int64_t n, double m) {
  double s = 0;
  for (int64_t c = 0; c < n; c++)
    s += exp(x[c] - m);
  return s;
}

static inline void lt_row_exp_scale_f64(const double *x, double *y, int64_t n, double m, double scale) {
  for (int64_t c = 0; c < n; c++)
    y[c] = exp(x[c] - m) * scale;
}

#endif
