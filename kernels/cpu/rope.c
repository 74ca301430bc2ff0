/*
 * rope.c: rotary position embeddings (Su et al. 2021) in the Llama /
 * Hugging Face convention: the head dim D is split in halves (x1, x2) and
 * rotated as (x1 cos - x2 sin, x2 cos + x1 sin) with angle
 * pos * base^(-2i/D) for pair i (its frequency scaled as lt_rope_scaling
 * says). x is contiguous (R, T, D): R rows of T
 * positions; position t is start + t. The backward is the rotation by the
 * opposite angle (sign = -1). f32 or f64; angles computed in f64.
 */
#include "cpu.h"

#include <math.h>

#define DEFINE_ROPE(T, SFX)                                                                     \
  static void rope_##SFX(const T *x, T *y, int64_t R, int64_t Tn, int64_t D, double base,       \
                         int64_t start, double sign, lt_rope_scaling sc) {                      \
    int64_t h = D / 2;                                                                          \
    _Pragma("omp parallel for schedule(static) if (R * Tn * D >= 32768)")                       \
    for (int64_t t = 0; t < Tn; t++) {                                                          \
      for (int64_t i = 0; i < h; i++) {                                                         \
        double ang = lt_rope_angle(start + t, i, D, base, sc); /* (shared/scalar.h) */          \
        T c = (T)cos(ang), s = (T)(sign * sin(ang));                                            \
        for (int64_t r = 0; r < R; r++) {                                                       \
          const T *xr = x + (r * Tn + t) * D;                                                   \
          T *yr = y + (r * Tn + t) * D;                                                         \
          T a = xr[i], b = xr[i + h];                                                           \
          yr[i] = a * c - b * s;                                                                \
          yr[i + h] = b * c + a * s;                                                            \
        }                                                                                       \
      }                                                                                         \
    }                                                                                           \
  }

DEFINE_ROPE(float, f32)
DEFINE_ROPE(double, f64)

lt_status lt_cpu_rope(lt_dtype dt, const void *x, void *y, int64_t R, int64_t Tn, int64_t D, double base,
                      int64_t start, int inverse, const lt_rope_scaling *scaling) {
  double sign = inverse ? -1.0 : 1.0;
  lt_rope_scaling sc = {LT_ROPE_PLAIN, 1, 1, 1, 1};
  if (scaling)
    sc = *scaling;
  if (dt == LT_DTYPE_F64)
    rope_f64(x, y, R, Tn, D, base, start, sign, sc);
  else
    rope_f32(x, y, R, Tn, D, base, start, sign, sc);
  return LT_OK;
}
