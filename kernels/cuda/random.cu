/*
 * random.cu: uniform and normal fills from Philox4x32-10 (Salmon et al.,
 * SC'11) on the GPU, drawing the CPU's numbers for the same seed and offset
 * (kernels/cpu/random.c): both compute them with kernels/shared/philox.h
 * (element i uses word i % 4 of the block at counter offset + i / 4;
 * uniforms the top 24 bits of a word, all 32 for f64; normals the
 * Box-Muller pairs, in f64). A thread per block of four.
 */
#include "common.cuh"
#include "../shared/philox.h"

static const int THREADS = 256;

__global__ void uniform_kernel(char *dst, int dt, int64_t n, uint64_t seed, uint64_t offset, double lo, double hi) {
  int64_t nblocks = (n + 3) / 4;
  bool wide = dt == LT_DTYPE_F64;
  LT_GRID_STRIDE(b, nblocks) {
    uint32_t w[4];
    lt_philox_block(seed, offset + (uint64_t)b, w);
    for (int j = 0; j < 4 && b * 4 + j < n; j++)
      lt_store<double>(dst, dt, b * 4 + j, lt_philox_uniform(w[j], wide, lo, hi));
  }
}

__global__ void normal_kernel(char *dst, int dt, int64_t n, uint64_t seed, uint64_t offset, double mean, double std) {
  int64_t nblocks = (n + 3) / 4;
  LT_GRID_STRIDE(b, nblocks) {
    uint32_t w[4];
    lt_philox_block(seed, offset + (uint64_t)b, w);
    double v[4];
    for (int j = 0; j < 4; j += 2)
      lt_philox_normal_pair(w[j], w[j + 1], mean, std, &v[j], &v[j + 1]);
    for (int j = 0; j < 4 && b * 4 + j < n; j++)
      lt_store<double>(dst, dt, b * 4 + j, v[j]);
  }
}

extern "C" lt_status lt_cuda_uniform(char *dst, lt_dtype dtype, int64_t n, uint64_t seed, uint64_t offset, double lo,
                                     double hi, lt_cuda_stream s) {
  if (n <= 0)
    return LT_OK;
  uniform_kernel<<<lt_cuda_blocks((n + 3) / 4, THREADS), THREADS, 0, (cudaStream_t)s>>>(dst, (int)dtype, n, seed,
                                                                                         offset, lo, hi);
  return lt_cuda_check_launch("uniform_kernel");
}

extern "C" lt_status lt_cuda_normal(char *dst, lt_dtype dtype, int64_t n, uint64_t seed, uint64_t offset, double mean,
                                    double std, lt_cuda_stream s) {
  if (n <= 0)
    return LT_OK;
  normal_kernel<<<lt_cuda_blocks((n + 3) / 4, THREADS), THREADS, 0, (cudaStream_t)s>>>(dst, (int)dtype, n, seed,
                                                                                        offset, mean, std);
  return lt_cuda_check_launch("normal_kernel");
}
