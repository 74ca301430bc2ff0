/*
 * random.cu: uniform and normal fills from Philox4x32-10 (Salmon et al.,
 * SC'11), drawing exactly the CPU's numbers for the same seed and offset
 * (kernels/cpu/random.c): element i uses word i % 4 of the block at counter
 * offset + i / 4; uniforms take the top 24 bits of a word (all 32 for
 * f64) and normals the Box-Muller pairs, both computed in f64 (cos, sin and
 * log may differ from glibc's in the last bit of a double, far below f32).
 */
#include "common.cuh"

static const int THREADS = 256;

__device__ __forceinline__ void philox(uint64_t seed, uint64_t counter, uint32_t w[4]) {
  uint32_t c0 = (uint32_t)counter, c1 = (uint32_t)(counter >> 32), c2 = 0, c3 = 0;
  uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
  for (int round = 0; round < 10; round++) {
    uint32_t hi0 = __umulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
    uint32_t hi1 = __umulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  w[0] = c0;
  w[1] = c1;
  w[2] = c2;
  w[3] = c3;
}

__global__ void uniform_kernel(char *dst, int dt, int64_t n, uint64_t seed, uint64_t offset, double lo, double hi) {
  int64_t nblocks = (n + 3) / 4;
  bool wide = dt == LT_DTYPE_F64;
  LT_GRID_STRIDE(b, nblocks) {
    uint32_t w[4];
    philox(seed, offset + (uint64_t)b, w);
    for (int j = 0; j < 4 && b * 4 + j < n; j++) {
      double u = wide ? w[j] * 0x1p-32 : (w[j] >> 8) * 0x1p-24;
      lt_store<double>(dst, dt, b * 4 + j, lo + (hi - lo) * u);
    }
  }
}

__global__ void normal_kernel(char *dst, int dt, int64_t n, uint64_t seed, uint64_t offset, double mean, double std) {
  const double two_pi = 6.283185307179586476925286766559;
  int64_t nblocks = (n + 3) / 4;
  LT_GRID_STRIDE(b, nblocks) {
    uint32_t w[4];
    philox(seed, offset + (uint64_t)b, w);
    double v[4];
    for (int j = 0; j < 4; j += 2) {
      double u1 = ((double)w[j] + 1.0) * 0x1p-32, u2 = (double)w[j + 1] * 0x1p-32;
      double r = sqrt(-2.0 * log(u1));
      v[j] = mean + std * r * cos(two_pi * u2);
      v[j + 1] = mean + std * r * sin(two_pi * u2);
    }
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
