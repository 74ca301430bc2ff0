/*
 * ptx.cuh: the PTX instructions that CUDA C++ has no function for, as inline
 * assembly: the warp-wide tensor-core product mma.sync (sm_80 and later;
 * H100/H200 run it at the Ampere rate, below wgmma's but well above the
 * CUDA cores), the warp's fragment load from shared memory (ldmatrix) and
 * the asynchronous global-to-shared copy (cp.async) that lets a block load
 * its next tile while it computes on this one (attention_mma.cu; mma.cuh
 * packs the fragments). A kernel includes this header itself, never through
 * another header: the CUDA emulator's build finds its stand-in,
 * tests/emu/kernels/ptx.cuh (the same functions on cuda_emu.h's
 * lt_emu_mma16816, lt_emu_ldmatrix_x4 and lt_emu_cp_async16, written from
 * the same layouts and ordering rules), first on its include path.
 */
#ifndef LUTRA_CUDA_PTX_CUH
#define LUTRA_CUDA_PTX_CUH

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

/* ldmatrix.sync.aligned.m8n8.x4{.trans}.shared.b16 (sm_75 and later; PTX
   ISA, "Warp-level matrix load instruction: ldmatrix"), all 32 lanes taking
   part: lane l passes row, the address of row l % 8 of 8x8 matrix l / 8
   (8 16-bit values, 16-byte aligned, in shared memory); r[m] of lane l
   receives matrix m's pair at row l / 4, columns 2 (l % 4) and one more, or
   with TRANS (the matrix read column-major) the pair at rows 2 (l % 4) and
   one more, column l / 4, the first of a pair in the low 16 bits. Without
   TRANS, rows of a row-major tile give mma B fragments whose columns are
   the tile's rows; with TRANS, B fragments whose rows are the tile's. */
template <bool TRANS> __device__ __forceinline__ void lt_ldmatrix_x4(uint32_t r[4], const uint16_t *row);

/* cp.async.cg.shared.global (sm_80 and later; PTX ISA, "cp.async"): 16
   bytes from global src to shared dst, both 16-byte aligned, or 16 zeros
   when !valid (src is then not read); the copy lands by the
   lt_cp_async_wait that covers the group the next lt_cp_async_commit
   closes, and other threads see it after a __syncthreads that follows. */
__device__ __forceinline__ void lt_cp_async16(void *dst, const void *src, bool valid);
/* cp.async.commit_group: the copies issued since the last commit form a group (maybe empty) */
__device__ __forceinline__ void lt_cp_async_commit();
/* cp.async.wait_group N: waits until at most the N most recent groups are in flight */
template <int N> __device__ __forceinline__ void lt_cp_async_wait();

template <> __device__ __forceinline__ void lt_ldmatrix_x4<false>(uint32_t r[4], const uint16_t *row) {
  unsigned a = (unsigned)__cvta_generic_to_shared(row);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}
template <> __device__ __forceinline__ void lt_ldmatrix_x4<true>(uint32_t r[4], const uint16_t *row) {
  unsigned a = (unsigned)__cvta_generic_to_shared(row);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}
__device__ __forceinline__ void lt_cp_async16(void *dst, const void *src, bool valid) {
  unsigned a = (unsigned)__cvta_generic_to_shared(dst);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(a), "l"(src), "r"(valid ? 16 : 0) : "memory");
}
__device__ __forceinline__ void lt_cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void lt_cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

#endif
