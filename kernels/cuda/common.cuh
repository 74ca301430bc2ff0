/*
 * common.cuh: what the CUDA kernels share: dtype loads and stores to the
 * three compute kinds (as kernels/cpu/convert.c: round to nearest even into
 * 16-bit floats, float to integer truncating with NaN -> 0 and saturation,
 * lt_f64_to_i64 of shared/scalar.h, which both devices include),
 * element offsets of an lt_iter, grid sizing and launch checks.
 */
#ifndef LUTRA_CUDA_COMMON_CUH
#define LUTRA_CUDA_COMMON_CUH

#include "cuda.h"
#include "../shared/scalar.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math_constants.h>
#include <stdio.h>

/* The host's note for CUDA error e, to append to its message ("" without
   one: lt_cuda_kernel_hooks, cuda.h). */
static inline const char *lt_cuda_note(cudaError_t e) {
  const char *(*note)(int) = lt_cuda_kernel_hooks.error_note;
  return note ? note((int)e) : "";
}

/* Names the work just queued for the profile when one runs (lt.cuda.profile_start). */
static inline void lt_cuda_mark(const char *what) {
  const lt_cuda_hooks *h = &lt_cuda_kernel_hooks;
  if (h->profiling && h->profiling() && h->profile_mark)
    h->profile_mark(what);
}

/* Fails with the CUDA error of the last launch, naming the kernel, file and line. */
static inline lt_status lt_cuda_check_launch_at(const char *file, int line, const char *what) {
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    return lt_fail(LT_ERR_DEVICE, "cuda: %s failed to launch: %s [%s:%d]%s", what, cudaGetErrorString(e), file, line,
                   lt_cuda_note(e));
  lt_cuda_mark(what); /* lt.cuda.profile_start: the launch named for the profile */
  return LT_OK;
}
#define lt_cuda_check_launch(what) lt_cuda_check_launch_at(__FILE__, __LINE__, (what))

static inline unsigned lt_cuda_blocks(int64_t n, int threads) {
  int64_t b = (n + threads - 1) / threads;
  if (b > 65535LL * 32)
    b = 65535LL * 32; /* grid-stride loops cover the rest */
  return (unsigned)(b > 0 ? b : 1);
}

/* Element i of a typed float array in its compute type (f64 for f64, else
   f32), and back: 16-bit values round to nearest even when stored. */
__device__ __forceinline__ float lt_ld(const float *p, int64_t i) { return p[i]; }
__device__ __forceinline__ double lt_ld(const double *p, int64_t i) { return p[i]; }
__device__ __forceinline__ float lt_ld(const __nv_bfloat16 *p, int64_t i) { return __bfloat162float(p[i]); }
__device__ __forceinline__ float lt_ld(const __half *p, int64_t i) { return __half2float(p[i]); }
__device__ __forceinline__ void lt_st(float *p, int64_t i, float v) { p[i] = v; }
__device__ __forceinline__ void lt_st(double *p, int64_t i, double v) { p[i] = v; }
__device__ __forceinline__ void lt_st(__nv_bfloat16 *p, int64_t i, float v) { p[i] = __float2bfloat16(v); }
__device__ __forceinline__ void lt_st(__half *p, int64_t i, float v) { p[i] = __float2half(v); }

/* Element i (an element offset) of an array of dtype dt, as T. */
template <typename T> __device__ __forceinline__ T lt_load(const char *p, int dt, int64_t i);

template <> __device__ __forceinline__ float lt_load<float>(const char *p, int dt, int64_t i) {
  switch (dt) {
  case LT_DTYPE_F32: return ((const float *)p)[i];
  case LT_DTYPE_F64: return (float)((const double *)p)[i];
  case LT_DTYPE_BF16: return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
  case LT_DTYPE_F16: return __half2float(((const __half *)p)[i]);
  case LT_DTYPE_I8: return (float)((const int8_t *)p)[i];
  case LT_DTYPE_U8: return (float)((const uint8_t *)p)[i];
  case LT_DTYPE_U16: return (float)((const uint16_t *)p)[i];
  case LT_DTYPE_I32: return (float)((const int32_t *)p)[i];
  case LT_DTYPE_I64: return (float)((const int64_t *)p)[i];
  default: return ((const uint8_t *)p)[i] ? 1.0f : 0.0f;
  }
}

template <> __device__ __forceinline__ double lt_load<double>(const char *p, int dt, int64_t i) {
  switch (dt) {
  case LT_DTYPE_F32: return ((const float *)p)[i];
  case LT_DTYPE_F64: return ((const double *)p)[i];
  case LT_DTYPE_BF16: return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
  case LT_DTYPE_F16: return __half2float(((const __half *)p)[i]);
  case LT_DTYPE_I8: return ((const int8_t *)p)[i];
  case LT_DTYPE_U8: return ((const uint8_t *)p)[i];
  case LT_DTYPE_U16: return ((const uint16_t *)p)[i];
  case LT_DTYPE_I32: return ((const int32_t *)p)[i];
  case LT_DTYPE_I64: return (double)((const int64_t *)p)[i];
  default: return ((const uint8_t *)p)[i] ? 1.0 : 0.0;
  }
}

template <> __device__ __forceinline__ int64_t lt_load<int64_t>(const char *p, int dt, int64_t i) {
  switch (dt) {
  case LT_DTYPE_F32: return lt_f64_to_i64(((const float *)p)[i]);
  case LT_DTYPE_F64: return lt_f64_to_i64(((const double *)p)[i]);
  case LT_DTYPE_BF16: return lt_f64_to_i64(__bfloat162float(((const __nv_bfloat16 *)p)[i]));
  case LT_DTYPE_F16: return lt_f64_to_i64(__half2float(((const __half *)p)[i]));
  case LT_DTYPE_I8: return ((const int8_t *)p)[i];
  case LT_DTYPE_U8: return ((const uint8_t *)p)[i];
  case LT_DTYPE_U16: return ((const uint16_t *)p)[i];
  case LT_DTYPE_I32: return ((const int32_t *)p)[i];
  case LT_DTYPE_I64: return ((const int64_t *)p)[i];
  default: return ((const uint8_t *)p)[i] ? 1 : 0;
  }
}

/* Stores v (a compute value) as element i of dtype dt. */
template <typename T> __device__ __forceinline__ void lt_store(char *p, int dt, int64_t i, T v) {
  switch (dt) {
  case LT_DTYPE_F32: ((float *)p)[i] = (float)v; break;
  case LT_DTYPE_F64: ((double *)p)[i] = (double)v; break;
  case LT_DTYPE_BF16: ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn((float)v); break;
  case LT_DTYPE_F16: ((__half *)p)[i] = __float2half_rn((float)v); break;
  case LT_DTYPE_I8: ((int8_t *)p)[i] = (int8_t)lt_f64_to_i64((double)v); break;
  case LT_DTYPE_U8: ((uint8_t *)p)[i] = (uint8_t)lt_f64_to_i64((double)v); break;
  case LT_DTYPE_U16: ((uint16_t *)p)[i] = (uint16_t)lt_f64_to_i64((double)v); break;
  case LT_DTYPE_I32: ((int32_t *)p)[i] = (int32_t)lt_f64_to_i64((double)v); break;
  case LT_DTYPE_I64: ((int64_t *)p)[i] = lt_f64_to_i64((double)v); break;
  default: ((uint8_t *)p)[i] = v != (T)0; break;
  }
}

/* Integers store with C's wrap-around, as the CPU's i64 kind does. */
template <> __device__ __forceinline__ void lt_store<int64_t>(char *p, int dt, int64_t i, int64_t v) {
  switch (dt) {
  case LT_DTYPE_F32: ((float *)p)[i] = (float)v; break;
  case LT_DTYPE_F64: ((double *)p)[i] = (double)v; break;
  case LT_DTYPE_BF16: ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn((float)v); break;
  case LT_DTYPE_F16: ((__half *)p)[i] = __float2half_rn((float)v); break;
  case LT_DTYPE_I8: ((int8_t *)p)[i] = (int8_t)v; break;
  case LT_DTYPE_U8: ((uint8_t *)p)[i] = (uint8_t)v; break;
  case LT_DTYPE_U16: ((uint16_t *)p)[i] = (uint16_t)v; break;
  case LT_DTYPE_I32: ((int32_t *)p)[i] = (int32_t)v; break;
  case LT_DTYPE_I64: ((int64_t *)p)[i] = v; break;
  default: ((uint8_t *)p)[i] = v != 0; break;
  }
}

/* Operand offsets (elements) of linear index i of an lt_iter (1-D
   iterations, the usual case after the host merges dims, need no division). */
__device__ __forceinline__ void lt_offsets(const lt_iter &it, int64_t i, int64_t *offs) {
  if (it.ndim == 1) {
    for (int k = 0; k < LT_ITER_MAX_OPS; k++)
      offs[k] = k < it.nops ? i * it.strides[k][0] : 0;
    return;
  }
  for (int k = 0; k < LT_ITER_MAX_OPS; k++)
    offs[k] = 0;
  for (int d = it.ndim - 1; d >= 0; d--) {
    int64_t idx = i % it.shape[d];
    i /= it.shape[d];
    for (int k = 0; k < it.nops; k++)
      offs[k] += idx * it.strides[k][d];
  }
}

/* Sum of v over the warp (all 32 lanes), in a fixed order; every lane gets
   the result. */
__device__ __forceinline__ double lt_warp_sum(double v) {
  for (int o = 16; o > 0; o >>= 1)
    v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

/* Sum of v over the block (blockDim.x a multiple of 32, at most 1024), in a
   fixed order; every thread gets the result. sh holds 32 doubles. */
__device__ __forceinline__ double lt_block_sum(double v, double *sh) {
  v = lt_warp_sum(v);
  int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nwarps = blockDim.x / 32;
  __syncthreads(); /* sh may still be read from a previous call */
  if (lane == 0)
    sh[warp] = v;
  __syncthreads();
  v = lane < nwarps ? sh[lane] : 0.0;
  return lt_warp_sum(v);
}

/* Maximum of v over the block, as lt_block_sum. */
__device__ __forceinline__ double lt_block_max(double v, double *sh) {
  for (int o = 16; o > 0; o >>= 1)
    v = fmax(v, __shfl_xor_sync(0xffffffffu, v, o));
  int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nwarps = blockDim.x / 32;
  __syncthreads();
  if (lane == 0)
    sh[warp] = v;
  __syncthreads();
  v = lane < nwarps ? sh[lane] : -CUDART_INF;
  for (int o = 16; o > 0; o >>= 1)
    v = fmax(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

#define LT_GRID_STRIDE(i, n) \
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (int64_t)gridDim.x * blockDim.x)

#endif
