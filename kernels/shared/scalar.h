/*
 * shared/scalar.h: the scalar rules both devices must compute alike, from
 * one source that the CPU kernels (kernels/cpu) and the CUDA kernels
 * (kernels/cuda) both include: the float-to-integer conversion, the
 * integer power, an index element, GELU's formula and its derivative,
 * torch.lerp's two-sided form (AdamW's moment) and RoPE's angle. The GPU
 * checks (tests/gpu: ops.json, nn.json, optim.json on both devices) compare
 * what the two compute; two copies could drift apart unseen.
 *
 * Type-generic rules are macros over T (C has no templates): each device
 * expands them in its own loops and functions, with its own exp.
 */
#ifndef LUTRA_KERNELS_SCALAR_H
#define LUTRA_KERNELS_SCALAR_H

#include "../kernel.h"
#include "host_device.h"

#include <math.h>
#include <stdint.h>

/* x truncated toward zero as an i64: NaN gives 0, values beyond i64 saturate
   (narrower integers then wrap, as C casts do). */
LT_SHARED_INLINE int64_t lt_f64_to_i64(double x) {
  if (isnan(x))
    return 0;
  if (x >= 9223372036854775807.0)
    return INT64_MAX;
  if (x <= -9223372036854775808.0)
    return INT64_MIN;
  return (int64_t)x;
}

/* Integer power by squaring, wrapping around as unsigned arithmetic does; a
   negative exponent gives 1/x^e truncated. */
LT_SHARED_INLINE int64_t lt_ipow(int64_t x, int64_t e) {
  if (e < 0)
    return x == 1 ? 1 : x == -1 ? ((e & 1) ? -1 : 1) : 0;
  uint64_t r = 1, b = (uint64_t)x;
  while (e) {
    if (e & 1)
      r *= b;
    b *= b;
    e >>= 1;
  }
  return (int64_t)r;
}

/* Element i (an element offset) of an i32 or i64 index array (dt an lt_dtype). */
LT_SHARED_INLINE int64_t lt_index_at(const char *index, int dt, int64_t i) {
  return dt == LT_DTYPE_I32 ? (int64_t)((const int32_t *)index)[i] : ((const int64_t *)index)[i];
}

/* GELU, tanh approximation (Hendrycks and Gimpel 2016; as GPT-2):
   0.5 x (1 + tanh u) with u = sqrt(2/pi) (x + 0.044715 x^3), computed as
   x sigmoid(2u) from e = exp(-|2u|), so that it neither overflows nor loses
   its tail (no cancellation in 1 + tanh u where tanh u nears -1): 1 / (1 + e)
   for u >= 0, e / (1 + e) below (an infinite u gives exactly 1 or 0). */
#define LT_GELU_K 0.7978845608028654 /* sqrt(2/pi) */
#define LT_GELU_C 0.044715
/* 2u for x, in type T */
#define LT_GELU_2U(T, x) ((T)(2 * LT_GELU_K) * ((x) + (T)LT_GELU_C * (x) * (x) * (x)))
/* sigmoid(z) from e = exp(-|z|), in type T */
#define LT_SIGMOID_FROM_EXP(T, z, e) ((z) >= (T)0 ? (T)1 / ((T)1 + (e)) : (e) / ((T)1 + (e)))
/* du/dx */
#define LT_GELU_DU(T, x) ((T)LT_GELU_K * ((T)1 + (T)(3 * LT_GELU_C) * (x) * (x)))
/* GELU's derivative at x times g, from s = sigmoid(2u) = (1 + tanh u) / 2
   (1 - tanh^2 u = 4 s (1 - s)); where tanh u is +-1 (|x| > ~10), s (1 - s)
   is 0 and du/dx may be inf: the term is 0 */
#define LT_GELU_GRAD(T, x, s, g) \
  ((g) * ((s) + ((s) * ((T)1 - (s)) != (T)0 ? (T)2 * (x) * ((s) * ((T)1 - (s))) * LT_GELU_DU(T, x) : (T)0)))

/* torch.lerp(a, b, w)'s two-sided form in type T, exact at both ends */
#define LT_LERP(T, a, b, w) ((w) < (T)0.5 ? (a) + (w) * ((b) - (a)) : (b) - ((b) - (a)) * ((T)1 - (w)))

/* RoPE's angle for position pos and pair i of a head of D (Su et al. 2021):
   pos base^(-2i/D), the frequency scaled as sc says (lutra.h's
   lt_rope_scaling; kind LT_ROPE_PLAIN: unscaled), in f64 on both devices */
LT_SHARED_INLINE double lt_rope_angle(int64_t pos, int64_t i, int64_t D, double base, lt_rope_scaling sc) {
  double f = pow(base, -2.0 * (double)i / (double)D);
  if (sc.kind == LT_ROPE_LINEAR) {
    f /= sc.factor;
  } else if (sc.kind == LT_ROPE_LLAMA3) {
    double wavelen = 2.0 * 3.14159265358979323846 / f;
    double low = sc.original_max / sc.low_freq_factor, high = sc.original_max / sc.high_freq_factor;
    if (wavelen > low) {
      f /= sc.factor;
    } else if (wavelen >= high) {
      double smooth = (sc.original_max / wavelen - sc.low_freq_factor) / (sc.high_freq_factor - sc.low_freq_factor);
      f = (1.0 - smooth) * f / sc.factor + smooth * f;
    }
  }
  return (double)pos * f;
}

#endif
