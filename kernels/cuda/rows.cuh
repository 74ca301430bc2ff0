/*
 * rows.cuh: what the CUDA row kernels (norm.cu, softmax.cu, loss.cu,
 * rope.cu) share: rows stored as S (f32, f64, or bf16/f16) and computed in
 * A (f64 for f64, else f32), read and written element by element or in
 * 16-byte pieces where every row involved starts on a 16-byte boundary,
 * grid sizes for a block per row, and the dispatch on the rows' dtype.
 */
#ifndef LUTRA_CUDA_ROWS_CUH
#define LUTRA_CUDA_ROWS_CUH

#include "common.cuh"

#include <initializer_list>
#include <math.h>

__device__ __forceinline__ float t_exp(float x) { return expf(x); }
__device__ __forceinline__ double t_exp(double x) { return exp(x); }

/* Rows are stored as S (f32, f64, or bf16/f16) and computed in A (f64 for
   f64, else f32): lt_ld and lt_st (common.cuh). */
/* v as an S holds it (rounded as lt_st rounds), back in the compute type */
template <typename S, typename A> __device__ __forceinline__ A ld_rounded(A v) {
  S t;
  lt_st(&t, 0, v);
  return lt_ld(&t, 0);
}

/* W = 16 / sizeof(S) consecutive elements of a row, loaded or stored as one
   16-byte access (rows whose start is 16-byte aligned: rows_aligned16) */
template <typename S> union piece {
  uint4 raw;
  S e[16 / sizeof(S)];
};

/* Whether rows at p, ld elements apart, all start on a 16-byte boundary. */
template <typename S> static inline bool rows_aligned16(const void *p, int64_t ld) {
  return ((uintptr_t)p & 15) == 0 && (ld * (int64_t)sizeof(S)) % 16 == 0;
}

/* Piece k of a row (its elements k W .. k W + W - 1) as compute values:
   W = 1 one element, W = 16 / sizeof(S) one aligned 16-byte access. */
template <int W, typename S, typename A> __device__ __forceinline__ void ld_piece(const S *row, int64_t k, A (&v)[W]) {
  if constexpr (W == 1) {
    v[0] = lt_ld(row, k);
  } else {
    piece<S> p;
    p.raw = ((const uint4 *)row)[k];
#pragma unroll
    for (int j = 0; j < W; j++)
      v[j] = lt_ld(p.e, j);
  }
}

template <int W, typename S, typename A> __device__ __forceinline__ void st_piece(S *row, int64_t k, const A (&v)[W]) {
  if constexpr (W == 1) {
    lt_st(row, k, v[0]);
  } else {
    piece<S> p;
#pragma unroll
    for (int j = 0; j < W; j++)
      lt_st(p.e, j, v[j]);
    ((uint4 *)row)[k] = p.raw;
  }
}

/* A weight or bias piece, or W ones (zeros) when there is none. */
template <int W, typename S, typename A>
__device__ __forceinline__ void ld_piece_or(const S *vec, int64_t k, A dflt, A (&v)[W]) {
  if (vec) {
    ld_piece<W>(vec, k, v);
  } else {
#pragma unroll
    for (int j = 0; j < W; j++)
      v[j] = dflt;
  }
}

/* The width of a norm's pieces: 16 bytes when rows of C elements at every
   non-NULL pointer start on 16-byte boundaries, else one element. */
template <typename S> static inline int norm_piece(int64_t C, std::initializer_list<const void *> ptrs) {
  for (const void *p : ptrs)
    if (p && !rows_aligned16<S>(p, C))
      return 1;
  return 16 / (int)sizeof(S);
}

/* a block per row (grid-stride loops cover the rows past the grid) */
static inline unsigned rows_grid(int64_t N) { return (unsigned)(N < 65535LL * 32 ? N : 65535LL * 32); }

/* Calls F<S, A>(args...) for the rows' dtype: f64 in f64, f32 in f32, bf16
   and f16 stored as they are and computed in f32. */
#define DISPATCH_ROWS(dt, F, ...)                                \
  do {                                                           \
    switch (dt) {                                                \
    case LT_DTYPE_F64: F<double, double>(__VA_ARGS__); break;   \
    case LT_DTYPE_BF16: F<__nv_bfloat16, float>(__VA_ARGS__); break; \
    case LT_DTYPE_F16: F<__half, float>(__VA_ARGS__); break;    \
    default: F<float, float>(__VA_ARGS__); break;               \
    }                                                            \
  } while (0)


#endif
