/*
 * random.c: the uniform and normal fills on the CPU, from Philox4x32-10 as
 * kernels/shared/philox.h computes it for both devices (element i of a
 * draw at generator offset `offset` uses word i % 4 of the block for
 * counter offset + i / 4), and lt_philox4x32_10 (lutra.h) for the host's
 * own draws (host/io/loader.c's shuffles).
 */
#include "cpu.h"
#include "../shared/philox.h"

#include <math.h>
#include <omp.h>

void lt_philox4x32_10(const uint32_t *ctr, const uint32_t *key, uint32_t *out) { lt_philox_rounds(ctr, key, out); }

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
    lt_philox_block(seed, offset + (uint64_t)b, w);
    double v[4];
    for (int j = 0; j < 4; j++)
      v[j] = lt_philox_uniform(w[j], wide, lo, hi);
    int64_t i0 = b * 4, m = n - i0 < 4 ? n - i0 : 4;
    put4(dst, dtype, i0, m, v);
  }
  return LT_OK;
}

lt_status lt_cpu_normal(char *dst, lt_dtype dtype, int64_t n, uint64_t seed, uint64_t offset,
                        double mean, double std) {
  int64_t nblocks = (n + 3) / 4;
#pragma omp parallel for schedule(static) if (n >= LT_CPU_PARALLEL_MIN)
  for (int64_t b = 0; b < nblocks; b++) {
    uint32_t w[4];
    lt_philox_block(seed, offset + (uint64_t)b, w);
    double v[4];
    for (int j = 0; j < 4; j += 2)
      lt_philox_normal_pair(w[j], w[j + 1], mean, std, &v[j], &v[j + 1]);
    int64_t i0 = b * 4, m = n - i0 < 4 ? n - i0 : 4;
    put4(dst, dtype, i0, m, v);
  }
  return LT_OK;
}
