/*
 * tests/emu/kernels/ptx.cuh: the CUDA emulator's stand-in for
 * kernels/cuda/ptx.cuh (the PTX instructions as inline assembly), found
 * first on the emulator build's include path (-Itests/emu/kernels before
 * -Ikernels/cuda): the same functions, on cuda_emu.h's lt_emu_mma16816,
 * lt_emu_ldmatrix_x4 and lt_emu_cp_async16, written from the PTX ISA's
 * layouts and ordering rules that kernels/cuda/ptx.cuh documents (and
 * selftest.cu checks them against).
 */
#ifndef LUTRA_TESTS_EMU_PTX_CUH
#define LUTRA_TESTS_EMU_PTX_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

/* mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}: c += A B for one warp */
template <typename H> __device__ __forceinline__ void lt_mma16816(float c[4], const uint32_t a[4], const uint32_t b[2]);
template <> __device__ __forceinline__ void lt_mma16816<__nv_bfloat16>(float c[4], const uint32_t a[4],
                                                                      const uint32_t b[2]) {
  lt_emu_mma16816<__nv_bfloat16>(c, a, b);
}
template <> __device__ __forceinline__ void lt_mma16816<__half>(float c[4], const uint32_t a[4], const uint32_t b[2]) {
  lt_emu_mma16816<__half>(c, a, b);
}

/* ldmatrix.sync.aligned.m8n8.x4{.trans}.shared.b16 */
template <bool TRANS> __device__ __forceinline__ void lt_ldmatrix_x4(uint32_t r[4], const uint16_t *row) {
  lt_emu_ldmatrix_x4(r, row, TRANS);
}
/* cp.async.cg.shared.global, 16 bytes (zeros when !valid), and its groups */
__device__ __forceinline__ void lt_cp_async16(void *dst, const void *src, bool valid) {
  lt_emu_cp_async16(dst, src, valid ? 16 : 0);
}
__device__ __forceinline__ void lt_cp_async_commit() { lt_emu_cp_async_commit(); }
template <int N> __device__ __forceinline__ void lt_cp_async_wait() { lt_emu_cp_async_wait(N); }

#endif
