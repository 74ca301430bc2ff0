/*
 * random.c: Philox4x32-10 (Salmon, Moraes, Dror, Shaw: "Parallel random
 * numbers: as easy as 1, 2, 3", SC'11; constants from Random123) and the
 * uniform and normal fills built on it. Element i of a draw at generator
 * offset `offset` uses word i % 4 of the block for counter offset + i / 4,
 * so any element can be computed alone (the CUDA backend does the same).
 */
#include "cpu.h"

#include <math.h>
#include <omp.h>

void lt_philox4x32_10(const uint32_t *ctr, const uint32_t *key, uint32_t *out) {
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

static inline void block_words(uint64_t seed, uint64_t counter, uint32_t w[4]) {
  uint32_t ctr[4] = {(uint32_t)counter, (uint32_t)(counter >> 32), 0, 0};
  uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
  lt_philox4x32_10(ctr, key, w);
}

/* Converts 4 doubles of one block into dst elements [i0, i0 + n). */
static void put4(char *dst, lt_dtype dtype, int64_t i0, int64_t n, const double v[4]) {
  lt_cpu_store(LT_COMPUTE_F64, dst + i0 * lt_dtype_size(dtype), dtype, 1, v, n);
}

lt_status lt_cpu_uniform(char *dst, lt_dtype dtype, int64_t n, uint64_t seed, uint64_t offset,
                         double lo, double hi) {
  int64_t nblocks = (n + 3) / 4;
  int wide = dtype == LT_DTYPE_F64;
#pragma omp parallel for schedule(static) if (n >= LT_CPU_PARALLEL_MIN)
  for (int64_t b = 0; b < nblocks; b++) {
    uint32_t w[4];
    block_words(seed, offset + (uint64_t)b, w);
    double v[4];
    for (int j = 0; j < 4; j++) {
      double u = wide ? w[j] * 0x1p-32 : (w[j] >> 8) * 0x1p-24;
      v[j] = lo + (hi - lo) * u;
    }
    int64_t i0 = b * 4, m = n - i0 < 4 ? n - i0 : 4;
    put4(dst, dtype, i0, m, v);
  }
  return LT_OK;
}

lt_status lt_cpu_normal(char *dst, lt_dtype dtype, int64_t n, uint64_t seed, uint64_t offset,
                        double mean, double std) {
  int64_t nblocks = (n + 3) / 4;
  const double two_pi = 6.283185307179586476925286766559;
#pragma omp parallel for schedule(static) if (n >= LT_CPU_PARALLEL_MIN)
  for (int64_t b = 0; b < nblocks; b++) {
    uint32_t w[4];
    block_words(seed, offset + (uint64_t)b, w);
    double v[4];
    for (int j = 0; j < 4; j += 2) {
      double u1 = ((double)w[j] + 1.0) * 0x1p-32; /* (0, 1]: log never sees 0 */
      double u2 = (double)w[j + 1] * 0x1p-32;
      double r = sqrt(-2.0 * log(u1));
      v[j] = mean + std * r * cos(two_pi * u2);
      v[j + 1] = mean + std * r * sin(two_pi * u2);
    }
    int64_t i0 = b * 4, m = n - i0 < 4 ? n - i0 : 4;
    put4(dst, dtype, i0, m, v);
  }
  return LT_OK;
}
