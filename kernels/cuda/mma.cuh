/*
 * mma.cuh: the warp-wide tensor-core product of PTX's mma.sync (sm_80 and
 * later; H100/H200 run it at the Ampere rate, below wgmma's but well above
 * the CUDA cores), and packing of 16-bit values into its 32-bit fragment
 * registers, for kernels that keep their tiles in registers (the
 * tensor-core attention, attention_mma.cu). Under the CUDA emulator the
 * product is tests/emu/cuda_emu.h's lt_emu_mma16816, written from the same
 * fragment layouts.
 */
#ifndef LUTRA_CUDA_MMA_CUH
#define LUTRA_CUDA_MMA_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

/* c (16x8 f32) += A (16x16) B (16x8) for one warp, all 32 lanes taking part,
   H (__nv_bfloat16 or __half) the input type. Fragments as the PTX ISA's
   "Matrix Fragments for mma.m16n8k16 with floating point type": with
   g = lane / 4 and t = lane % 4,
     a[r] holds A[g + 8 (r % 2)][2t + 8 (r / 2) + {0, 1}],
     b[r] holds B[2t + 8 r + {0, 1}][g],
     c[i] is C[g + 8 (i / 2)][2t + i % 2],
   the first of each pair in the register's low 16 bits. */
template <typename H> __device__ __forceinline__ void lt_mma16816(float c[4], const uint32_t a[4], const uint32_t b[2]);

#if defined(LT_CUDA_EMULATED)
template <> __device__ __forceinline__ void lt_mma16816<__nv_bfloat16>(float c[4], const uint32_t a[4],
                                                                      const uint32_t b[2]) {
  lt_emu_mma16816<__nv_bfloat16>(c, a, b);
}
template <> __device__ __forceinline__ void lt_mma16816<__half>(float c[4], const uint32_t a[4], const uint32_t b[2]) {
  lt_emu_mma16816<__half>(c, a, b);
}
#else
template <> __device__ __forceinline__ void lt_mma16816<__nv_bfloat16>(float c[4], const uint32_t a[4],
                                                                      const uint32_t b[2]) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
               "{%8, %9}, {%0, %1, %2, %3};\n"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
template <> __device__ __forceinline__ void lt_mma16816<__half>(float c[4], const uint32_t a[4], const uint32_t b[2]) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
               "{%8, %9}, {%0, %1, %2, %3};\n"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
#endif

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
