/*
 * half.h: bit-exact conversions between f32 and the 16-bit floats bf16 and
 * f16 (IEEE 754 binary16), rounding to nearest even; NaN stays NaN (quiet)
 * and infinities stay infinite. Shared by the CPU kernels and the tests.
 */
#ifndef LUTRA_HALF_H
#define LUTRA_HALF_H

#include <stdint.h>
#include <string.h>

static inline uint32_t lt_f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

static inline float lt_bits_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static inline float lt_bf16_to_f32(uint16_t h) { return lt_bits_f32((uint32_t)h << 16); }

static inline uint16_t lt_f32_to_bf16(float f) {
  uint32_t u = lt_f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: keep sign and top payload, set quiet bit */
    return (uint16_t)((u >> 16) | 0x0040u);
  /* add half an ulp of bf16, plus one if the kept part is odd (ties to even) */
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

static inline float lt_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  if (exp == 0x1f) /* Inf or NaN */
    return lt_bits_f32(sign | 0x7f800000u | (mant << 13));
  if (exp == 0) { /* zero or subnormal: mant * 2^-24, exact in f32 */
    float v = (float)mant * 0x1p-24f;
    return sign ? -v : v;
  }
  return lt_bits_f32(sign | ((exp + 112u) << 23) | (mant << 13));
}

static inline uint16_t lt_f32_to_f16(float f) {
  uint32_t u = lt_f32_bits(f);
  uint32_t sign = (u >> 16) & 0x8000u;
  u &= 0x7fffffffu;
  if (u >= 0x47800000u) /* |f| >= 2^16, Inf or NaN */
    return (uint16_t)(sign | (u > 0x7f800000u ? 0x7e00u : 0x7c00u));
  if (u < 0x38800000u) {
    /* below f16's smallest normal (2^-14): adding 0.5 shifts the value so that
       the f32 adder's own round-to-nearest-even lands on the f16 subnormal
       grid (2^-24 steps) in the low mantissa bits */
    float shifted = lt_bits_f32(u) + 0.5f;
    return (uint16_t)(sign | (lt_f32_bits(shifted) - 0x3f000000u));
  }
  /* normal: rebias the exponent (127 -> 15), round the 13 dropped bits to even */
  uint32_t odd = (u >> 13) & 1u;
  u += 0xc8000fffu + odd; /* (15 - 127) << 23, plus half an ulp minus one */
  return (uint16_t)(sign | (u >> 13));
}

#endif
