/*
 * cuda_emu.h: the device side of lutra's CUDA emulator, which runs the
 * kernels of kernels/cuda on the CPU so that the GPU checks run where there
 * is no GPU (make emu; tests/emu/README.md). Each .cu file of kernels/cuda is
 * compiled by the host C++ compiler with this header included first, after
 * tests/emu/rewrite_launches.py has turned each `k<<<grid, block, smem,
 * stream>>>(args)` into `lt_emu_launch(lt_emu_cfg(grid, block, smem, stream),
 * "k", k, args)`.
 *
 * What a kernel sees: threadIdx, blockIdx, blockDim, gridDim; __shared__
 * variables (one block runs at a time, so a function's static storage is
 * the block's shared memory; garbage at the start of each block); __syncthreads; __shfl_xor_sync; atomicMin;
 * the tensor-core product mma.m16n8k16 (lt_emu_mma16816, through tests/emu/kernels/ptx.cuh, the
 * stand-in for kernels/cuda/ptx.cuh), the
 * warp's matrix load ldmatrix and the asynchronous copy cp.async with its groups;
 * __umulhi; and cub::DeviceRadixSort::SortPairs (a stable sort on the host).
 * The threads of a block are fibers on one OS thread (tests/emu/scheduler.cc):
 * a barrier or a shuffle switches to the next thread, so the kernels' barrier
 * discipline is checked (a thread that waits at a barrier the others never
 * reach, or a full-warp shuffle with a lane that has exited, fails the
 * launch with a message), and launch configurations are checked as the
 * driver does (grid and block limits, zero-sized grids; parameters within
 * 4 KiB, at compile time). A launch is
 * queued on its stream and runs when the host waits for it (emu_queue.h).
 */
#ifndef LUTRA_TESTS_EMU_CUDA_EMU_H
#define LUTRA_TESTS_EMU_CUDA_EMU_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

/* the bit casts math_constants.h builds its constants with */
static inline double __longlong_as_double(long long v) {
  double d;
  memcpy(&d, &v, sizeof d);
  return d;
}
static inline float __int_as_float(int v) {
  float f;
  memcpy(&f, &v, sizeof f);
  return f;
}

#include <math_constants.h>
#include <cmath>

#include "emu_queue.h"

#include <algorithm>
#include <functional>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

/* a register budget for the device compiler: nothing here */
#ifndef __launch_bounds__
#define __launch_bounds__(...)
#endif

/* the host compiler's CUDA headers define __shared__ as nothing: here it is
   static storage, which one block at a time owns */
#undef __shared__
#define __shared__ static

/* ---- launch --------------------------------------------------------------- */

struct lt_emu_config {
  dim3 grid, block;
  size_t smem;
  cudaStream_t stream;
};

/* The <<<grid, block, smem, stream>>> of a launch (rewrite_launches.py). */
static inline lt_emu_config lt_emu_cfg(dim3 grid, dim3 block, size_t smem = 0, cudaStream_t stream = 0) {
  lt_emu_config c;
  c.grid = grid;
  c.block = block;
  c.smem = smem;
  c.stream = stream;
  return c;
}

/* Whether c is a configuration the driver launches; if not, sets the
   error cudaGetLastError returns (at the launch, as a GPU does). */
bool lt_emu_config_ok(const lt_emu_config &c, const char *name);

/* Runs body once per thread of every block of c, now (scheduler.cc); a
   barrier or shuffle fault stops it and sets the error that the next wait
   (on any stream) or cudaGetLastError returns, once. */
void lt_emu_run(const lt_emu_config &c, const char *name, const std::function<void()> &body);

/* kernel<<<c>>>(args...), named name in fault messages: the configuration
   is checked now, the arguments converted to the kernel's parameter types
   and copied now (as a launch does), and the kernel runs in c.stream's
   order (emu_queue.h). */
template <typename... P, typename... A>
static inline void lt_emu_launch(const lt_emu_config &c, const char *name, void (*kernel)(P...), A &&...args) {
  /* the CUDA limit on a kernel's parameters (4 KiB before CUDA 12.1 and
     Volta; lutra keeps under it) */
  static_assert((sizeof(typename std::decay<P>::type) + ... + 0) <= 4096, "kernel parameters over 4 KiB");
  if (!lt_emu_config_ok(c, name))
    return;
  /* the kernel's body as a std::function made now, on the heap: one made
     on the stack when the launch runs would share stack memory with other
     streams' launches, which make emu-tsan would report */
  std::tuple<typename std::decay<P>::type...> params(std::forward<A>(args)...);
  auto body = std::make_shared<std::function<void()>>([kernel, params] { std::apply(kernel, params); });
  lt_emu_trace(c.stream, "kernel %s %u,%u,%u %u,%u,%u %zu", name, c.grid.x, c.grid.y, c.grid.z, c.block.x, c.block.y,
               c.block.z, c.smem);
  lt_emu_enqueue(c.stream, [c, name, body = std::move(body)] { lt_emu_run(c, name, *body); });
}

/* ---- what a thread sees --------------------------------------------------- */

/* a cp.async copy waiting for its group's wait (lt_emu_cp_async16) */
struct lt_emu_async_copy {
  void *dst;
  const void *src;
  unsigned src_bytes, group;
};
enum { LT_EMU_ASYNC_MAX = 64 }; /* copies a thread may have pending (a GPU has no such limit) */

struct lt_emu_thread {
  uint3 idx;
  unsigned linear, warp, lane;
  unsigned async_n, async_committed; /* pending copies; groups committed in this block */
  lt_emu_async_copy async[LT_EMU_ASYNC_MAX];
};
extern lt_emu_thread *lt_emu_self;
extern uint3 lt_emu_block_idx;
extern dim3 lt_emu_block_dim, lt_emu_grid_dim;

#define threadIdx (lt_emu_self->idx)
#define blockIdx lt_emu_block_idx
#define blockDim lt_emu_block_dim
#define gridDim lt_emu_grid_dim

/* the first thread of a block to declare shared variable p fills it with
   0xff bytes (rewrite_launches.py inserts the call after each declaration) */
void lt_emu_shared(void *p, size_t bytes);

/* Shared variables have LT_EMU_SETS copies, and a block uses copy
   lt_emu_set: two under ThreadSanitizer (make emu-tsan), where every other
   block runs on a second set of fibers (scheduler.cc), one otherwise. */
#if LT_EMU_TSAN
#define LT_EMU_SETS 2
#else
#define LT_EMU_SETS 1
#endif
extern unsigned lt_emu_set;

/* waits until every thread of the block is at this barrier (line of file) */
void lt_emu_syncthreads(const char *file, int line);
/* lane's value after every lane of mask's warp wrote its own (bits: up to 8 bytes) */
uint64_t lt_emu_shuffle(unsigned mask, uint64_t bits, unsigned src_lane);

#define __syncthreads() lt_emu_syncthreads(__FILE__, __LINE__)

template <typename T> static inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
  static_assert(sizeof(T) <= 8, "shuffles move up to 8 bytes");
  uint64_t bits = 0;
  memcpy(&bits, &v, sizeof v);
  unsigned lane = lt_emu_self->lane, src = (lane ^ (unsigned)lane_mask) % 32;
  if (src / (unsigned)width != lane / (unsigned)width)
    src = lane;
  bits = lt_emu_shuffle(mask, bits, src);
  T r;
  memcpy(&r, &bits, sizeof r);
  return r;
}

/* Every lane of mask's warp passes bytes at mine and receives all of them,
   lane l's at all + l * bytes (the emulator's ground for warp-wide
   operations such as the tensor-core product below). */
void lt_emu_warp_exchange(unsigned mask, const void *mine, void *all, size_t bytes);

/* the 16-bit float in bits as a float, by the type named by the null pointer */
static inline float lt_emu_bits_to_float(uint16_t bits, const __nv_bfloat16 *) {
  uint32_t u = (uint32_t)bits << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}
static inline float lt_emu_bits_to_float(uint16_t bits, const __half *) { return __half2float(__ushort_as_half(bits)); }

/* PTX's mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32
   with C = D: c (16x8, f32) += A (16x16) B (16x8), H the input type; each
   lane holds the fragments of the PTX ISA's "Matrix Fragments for
   mma.m16n8k16 with floating point type" (group g = lane / 4, t = lane % 4;
   a[r]: row g + 8 (r % 2), columns 2t + 8 (r / 2) and one more; b[r]:
   rows 2t + 8 r and one more, column g; c[i]: row g + 8 (i / 2), column
   2t + i % 2; the lower column or row in a register's low 16 bits). Sums
   in f32, k in order (the hardware's order is unspecified). */
template <typename H> static inline void lt_emu_mma16816(float c[4], const uint32_t a[4], const uint32_t b[2]) {
  struct frag {
    uint32_t a[4], b[2];
  } mine, all[32];
  memcpy(mine.a, a, sizeof mine.a);
  memcpy(mine.b, b, sizeof mine.b);
  lt_emu_warp_exchange(0xffffffffu, &mine, all, sizeof mine);
  auto half = [](uint32_t w, unsigned high) {
    return lt_emu_bits_to_float((uint16_t)(high ? w >> 16 : w & 0xffff), (const H *)nullptr);
  };
  unsigned lane = lt_emu_self->lane, g = lane / 4, t = lane % 4;
  for (unsigned i = 0; i < 4; i++) {
    unsigned row = g + 8 * (i / 2), col = 2 * t + i % 2;
    float s = c[i];
    for (unsigned k = 0; k < 16; k++) {
      float av = half(all[4 * (row % 8) + (k % 8) / 2].a[row / 8 + 2 * (k / 8)], k % 2);
      float bv = half(all[4 * col + (k % 8) / 2].b[k / 8], k % 2);
      s += av * bv;
    }
    c[i] = s;
  }
}

/* Stops the calling thread with a fault that fails its launch, as a GPU's
   would (a misaligned or out-of-place address): what says what was wrong,
   and the launch's message names the kernel, block and thread. */
[[noreturn]] void lt_emu_kernel_fault(const char *what);
/* whether [p, p + bytes) lies inside one __shared__ variable */
bool lt_emu_in_shared(const void *p, size_t bytes);

/* PTX's ldmatrix.sync.aligned.m8n8.x4{.trans}.shared.b16 (PTX ISA,
   "Warp-level matrix load instruction: ldmatrix"): lane l passes row, the
   address of row l % 8 of 8x8 matrix l / 8 (8 16-bit values, 16-byte
   aligned, in shared memory); register m of lane l receives matrix m's pair
   at row l / 4, columns 2 (l % 4) and one more, or with trans (the matrix
   read column-major) the pair at rows 2 (l % 4) and one more, column l / 4;
   the first of a pair in the low 16 bits. Each lane checks its own address
   (a bad one fails the launch, naming the lane) and reads its row before the
   warp exchanges the rows, so the load is one warp-wide read, as on a GPU. */
static inline void lt_emu_ldmatrix_x4(uint32_t r[4], const void *row, bool trans) {
  unsigned lane = lt_emu_self->lane, g = lane / 4, t = lane % 4;
  if ((uintptr_t)row % 16 || !lt_emu_in_shared(row, 16)) {
    char what[160];
    snprintf(what, sizeof what, "ldmatrix: lane %u's row address %p is not %s", lane, row,
             (uintptr_t)row % 16 ? "16-byte aligned" : "in shared memory");
    lt_emu_kernel_fault(what);
  }
  uint16_t mine[8], rows[32][8]; /* rows[8 m + i]: row i of matrix m */
  memcpy(mine, row, sizeof mine);
  lt_emu_warp_exchange(0xffffffffu, mine, rows, sizeof mine);
  for (unsigned m = 0; m < 4; m++) {
    uint16_t lo, hi;
    if (!trans)
      lo = rows[8 * m + g][2 * t], hi = rows[8 * m + g][2 * t + 1];
    else
      lo = rows[8 * m + 2 * t][g], hi = rows[8 * m + 2 * t + 1][g];
    r[m] = (uint32_t)lo | (uint32_t)hi << 16;
  }
}

/* a cp.async copy landing: src_bytes of src, then zeros, to the 16 bytes at dst */
static inline void lt_emu_land_copy(void *dst, const void *src, unsigned src_bytes) {
  memcpy(dst, src, src_bytes);
  memset((char *)dst + src_bytes, 0, 16 - src_bytes);
}

/* Whether the running block's cp.async copies land when issued (1) or at
   the wait that covers them (0): chosen per block (scheduler.cc). */
extern unsigned lt_emu_async_eager;

/* PTX's cp.async.cg.shared.global [dst], [src], 16, src_bytes (PTX ISA,
   "Data Movement and Conversion Instructions: cp.async"): the first
   src_bytes (0 to 16) of global src, then zeros, to shared dst, both
   16-byte aligned. The copy belongs to the group the next commit closes and
   may land any time from its issue to the wait that covers that group: the
   emulator copies at one end or the other (lt_emu_async_eager), so a read
   before the wait sees the old bytes in some blocks, and a copy into a
   buffer that other threads still read (no barrier between) lands on them
   in others; either way a check fails. A bad address or more than
   LT_EMU_ASYNC_MAX pending copies fails the launch. */
static inline void lt_emu_cp_async16(void *dst, const void *src, unsigned src_bytes) {
  lt_emu_thread *self = lt_emu_self;
  char what[160];
  if (src_bytes > 16 || (uintptr_t)dst % 16 || (uintptr_t)src % 16) /* (src aligned even when not read) */
    snprintf(what, sizeof what, "cp.async: copy of %u bytes from %p to %p: addresses must be 16-byte aligned, at most 16 bytes",
             src_bytes, src, dst);
  else if (!lt_emu_in_shared(dst, 16))
    snprintf(what, sizeof what, "cp.async: destination %p is not in shared memory", dst);
  else if (src_bytes && lt_emu_in_shared(src, 1))
    snprintf(what, sizeof what, "cp.async: source %p is in shared memory (global memory expected)", src);
  else if (self->async_n == LT_EMU_ASYNC_MAX)
    snprintf(what, sizeof what, "cp.async: more than %d copies pending in one thread (the emulator's limit)",
             (int)LT_EMU_ASYNC_MAX);
  else if (lt_emu_async_eager) {
    lt_emu_land_copy(dst, src, src_bytes);
    return;
  } else {
    self->async[self->async_n++] = lt_emu_async_copy{dst, src, src_bytes, self->async_committed};
    return;
  }
  lt_emu_kernel_fault(what);
}

/* cp.async.commit_group: the copies issued since the last commit form a group (maybe empty) */
static inline void lt_emu_cp_async_commit() { lt_emu_self->async_committed++; }

/* cp.async.wait_group n: the copies of every committed group but the n most recent land now (copies not
   yet committed wait for a later wait) */
static inline void lt_emu_cp_async_wait(unsigned n) {
  lt_emu_thread *self = lt_emu_self;
  unsigned kept = 0;
  for (unsigned i = 0; i < self->async_n; i++) {
    lt_emu_async_copy c = self->async[i];
    if (c.group + n < self->async_committed)
      lt_emu_land_copy(c.dst, c.src, c.src_bytes);
    else
      self->async[kept++] = c;
  }
  self->async_n = kept;
}

/* atomics as the compiler's (one thread runs at a time, but the race
   detector of make emu-tsan must see them as atomic) */
static inline unsigned long long atomicMin(unsigned long long *p, unsigned long long v) {
  unsigned long long old = __atomic_load_n(p, __ATOMIC_RELAXED);
  while (v < old && !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
  return old;
}

static inline unsigned __umulhi(unsigned a, unsigned b) { return (unsigned)(((uint64_t)a * b) >> 32); }

/* ---- cub::DeviceRadixSort::SortPairs (the one CUB call lutra makes) -------- */

namespace cub {
struct DeviceRadixSort {
  /* as CUB: with temp NULL, sets temp_bytes; else sorts pairs by the key
     bits [begin_bit, end_bit), stably (as a radix sort is), in stream order */
  template <typename K, typename V, typename N>
  static cudaError_t SortPairs(void *temp, size_t &temp_bytes, const K *keys_in, K *keys_out, const V *values_in,
                               V *values_out, N n, int begin_bit = 0, int end_bit = (int)sizeof(K) * 8,
                               cudaStream_t stream = 0) {
    /* about what CUB asks for (its double buffers), so a caller that
       under-sizes the scratch fails here too; scribbled over when used */
    size_t need = 2 * (size_t)n * (sizeof(K) + sizeof(V)) + 4096;
    if (!temp) {
      temp_bytes = need;
      return cudaSuccess;
    }
    if (temp_bytes < need)
      return cudaErrorInvalidValue;
    lt_emu_trace(stream, "sort %lld", (long long)n);
    lt_emu_enqueue(stream, [=] { sort_now(temp, need, keys_in, keys_out, values_in, values_out, n, begin_bit, end_bit); });
    return cudaSuccess;
  }

private:
  template <typename K, typename V, typename N>
  static void sort_now(void *temp, size_t need, const K *keys_in, K *keys_out, const V *values_in, V *values_out, N n,
                       int begin_bit, int end_bit) {
    memset(temp, 0xff, need);
    typedef typename std::make_unsigned<K>::type U;
    /* CUB orders signed keys by value: the sign bit flipped */
    const U sign = std::is_signed<K>::value ? (U)((U)1 << (sizeof(K) * 8 - 1)) : (U)0;
    U mask = (U)(end_bit - begin_bit >= (int)sizeof(K) * 8 ? ~(U)0 : (((U)1 << (end_bit - begin_bit)) - 1));
    std::vector<std::pair<U, V>> pairs((size_t)n);
    for (N i = 0; i < n; i++)
      pairs[(size_t)i] = std::make_pair((U)((((U)keys_in[i] ^ sign) >> begin_bit) & mask), values_in[i]);
    std::vector<K> keys(keys_in, keys_in + n);
    std::vector<size_t> order((size_t)n);
    for (size_t i = 0; i < order.size(); i++)
      order[i] = i;
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return pairs[a].first < pairs[b].first; });
    for (size_t i = 0; i < order.size(); i++) {
      keys_out[i] = keys[order[i]];
      values_out[i] = pairs[order[i]].second;
    }
  }
};
} // namespace cub

#endif
