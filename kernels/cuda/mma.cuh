/*
 * mma.cuh: packing of 16-bit values into the 32-bit fragment registers of
 * PTX's warp-wide tensor-core product, and their bits back to floats, for
 * kernels that keep their tiles in registers (the tensor-core attention,
 * attention_mma.cu). The instructions themselves (mma.sync, ldmatrix,
 * cp.async) are ptx.cuh's.
 */
#ifndef LUTRA_CUDA_MMA_CUH
#define LUTRA_CUDA_MMA_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

/* lo and hi rounded to nearest even into H, lo in the low 16 bits */
template <typename H> __device__ __forceinline__ uint32_t lt_pack2(float lo, float hi);
template <> __device__ __forceinline__ uint32_t lt_pack2<__nv_bfloat16>(float lo, float hi) {
  return (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(lo)) |
         (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(hi)) << 16;
}
template <> __device__ __forceinline__ uint32_t lt_pack2<__half>(float lo, float hi) {
  return (uint32_t)__half_as_ushort(__float2half_rn(lo)) | (uint32_t)__half_as_ushort(__float2half_rn(hi)) << 16;
}

/* the 16-bit value of H in bits, as a float */
template <typename H> __device__ __forceinline__ float lt_half_bits_to_float(uint16_t bits);
template <> __device__ __forceinline__ float lt_half_bits_to_float<__nv_bfloat16>(uint16_t bits) {
  union {
    uint32_t u;
    float f;
  } v = {(uint32_t)bits << 16};
  return v.f;
}
template <> __device__ __forceinline__ float lt_half_bits_to_float<__half>(uint16_t bits) {
  return __half2float(__ushort_as_half(bits));
}

#endif
