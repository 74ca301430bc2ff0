/*
 * shared/philox.h: Philox4x32-10 (Salmon, Moraes, Dror, Shaw: "Parallel
 * random numbers: as easy as 1, 2, 3", SC'11; constants from Random123)
 * and the uniform and normal draws made from its words.
 *
 * Both devices include this one source: the CPU (kernels/cpu/random.c,
 * which also exports lt_philox4x32_10 for host/io/loader.c's shuffles) and
 * the GPU (kernels/cuda/random.cu). lutra promises that a seed and offset
 * draw the same numbers on either device; written twice, a change to one
 * copy would break that without a word. The GPU checks (tests/gpu, on a GPU
 * or the emulator) compare the devices' draws, tests/c/test_philox.c the
 * rounds against Random123's known answers.
 *
 * Element i of a draw at generator offset `offset` uses word i % 4 of the
 * block for counter offset + i / 4 (so any element can be computed alone):
 * uniforms take the top 24 bits of a word (all 32 for f64), normals the
 * Box-Muller pair of words (0, 1) and (2, 3), both computed in f64 (the
 * GPU's cos, sin and log may differ from glibc's in a double's last bit,
 * far below f32).
 */
#ifndef LUTRA_KERNELS_PHILOX_H
#define LUTRA_KERNELS_PHILOX_H

#include "host_device.h"

#include <math.h>
#include <stdint.h>

/* The ten rounds of Philox4x32 on counter ctr (4 words) and key (2 words), into out (4 words). */
LT_SHARED_INLINE void lt_philox_rounds(const uint32_t *ctr, const uint32_t *key, uint32_t *out) {
  uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
  uint32_t k0 = key[0], k1 = key[1];
  for (int round = 0; round < 10; round++) {
    uint64_t p0 = (uint64_t)0xD2511F53u * c0, p1 = (uint64_t)0xCD9E8D57u * c2;
    uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
    uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  out[0] = c0;
  out[1] = c1;
  out[2] = c2;
  out[3] = c3;
}

/* The 4 words of block `counter` of the stream of `seed`. */
LT_SHARED_INLINE void lt_philox_block(uint64_t seed, uint64_t counter, uint32_t *w) {
  uint32_t ctr[4] = {(uint32_t)counter, (uint32_t)(counter >> 32), 0, 0};
  uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
  lt_philox_rounds(ctr, key, w);
}

/* A uniform in [lo, hi) from word w: its top 24 bits, all 32 when wide (f64). */
LT_SHARED_INLINE double lt_philox_uniform(uint32_t w, int wide, double lo, double hi) {
  double u = wide ? w * 0x1p-32 : (w >> 8) * 0x1p-24;
  return lo + (hi - lo) * u;
}

/* The Box-Muller pair of normals (mean, std) from words w0 and w1, into *a and *b. */
LT_SHARED_INLINE void lt_philox_normal_pair(uint32_t w0, uint32_t w1, double mean, double std, double *a,
                                            double *b) {
  const double two_pi = 6.283185307179586476925286766559;
  double u1 = ((double)w0 + 1.0) * 0x1p-32; /* (0, 1]: log never sees 0 */
  double u2 = (double)w1 * 0x1p-32;
  double r = sqrt(-2.0 * log(u1));
  *a = mean + std * r * cos(two_pi * u2);
  *b = mean + std * r * sin(two_pi * u2);
}

#endif
