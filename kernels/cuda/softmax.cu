/*
 * softmax.cu: softmax and log-softmax of scale * x over contiguous rows on
 * the GPU (f32, f64, bf16/f16 computed in f32: rows.cuh), with the causal
 * mask and edge rules of kernels/cpu/softmax.c (rows of all -inf give
 * zeros), and their backward. A block per row; the row's maximum and sum
 * combine in a fixed order (lt_block_max, lt_block_sum).
 */
#include "rows.cuh"

static const int THREADS = 256;

/* ---- softmax ----------------------------------------------------------------- */

/* softmax of scale * x; under a causal mask of `causal` queries row r sees
   its first r % causal + C - causal + 1 entries (kernels/cpu/softmax.c).
   Rows in pieces of W elements (16 bytes where aligned): for each piece k of
   a row below `limit` elements, each of its elements c < limit. */
#define ROW_PIECES(k, limit) for (int64_t k = threadIdx.x; k < ((limit) + W - 1) / W; k += blockDim.x)

/* f(v) for each of this thread's elements v of row xr below L */
template <int W, typename S, typename A, typename F>
__device__ __forceinline__ void each_below(const S *xr, int64_t L, F f) {
  ROW_PIECES(k, L) {
    A e[W];
    ld_piece<W>(xr, k, e);
#pragma unroll
    for (int j = 0; j < W; j++)
      if (k * W + j < L)
        f(e[j]);
  }
}

/* For each of this thread's element pairs (u, v) of rows a and b (C
   elements, whole pieces): f(u, v) (each_pair), or out's element = f(u, v)
   (map_pair) */
template <int W, typename S, typename A, typename F>
__device__ __forceinline__ void each_pair(const S *a, const S *b, int64_t C, F f) {
  ROW_PIECES(k, C) {
    A u[W], v[W];
    ld_piece<W>(a, k, u);
    ld_piece<W>(b, k, v);
#pragma unroll
    for (int j = 0; j < W; j++)
      f(u[j], v[j]);
  }
}
template <int W, typename S, typename A, typename F>
__device__ __forceinline__ void map_pair(const S *a, const S *b, S *out, int64_t C, F f) {
  ROW_PIECES(k, C) {
    A u[W], v[W];
    ld_piece<W>(a, k, u);
    ld_piece<W>(b, k, v);
#pragma unroll
    for (int j = 0; j < W; j++)
      v[j] = f(u[j], v[j]);
    st_piece<W>(out, k, v);
  }
}

template <typename S, typename A, int W>
__global__ void softmax_fwd_kernel(const S *x, S *y, int64_t N, int64_t C, int logsm, A scale, int64_t causal) {
  __shared__ double sh[32];
  const A ninf = -(A)INFINITY;
  for (int64_t r = blockIdx.x; r < N; r += gridDim.x) {
    const S *xr = x + r * C;
    S *yr = y + r * C;
    int64_t L = C;
    if (causal > 0) {
      L = r % causal + C - causal + 1;
      L = L < 0 ? 0 : (L > C ? C : L);
    }
    double mloc = -CUDART_INF;
    each_below<W, S, A>(xr, L, [&](A v) { mloc = fmax(mloc, (double)(v * scale)); });
    A m = (A)lt_block_max(mloc, sh);
    if (m == ninf) { /* all masked, or all NaN (the maximum skips NaN) */
      double nan = 0;
      each_below<W, S, A>(xr, L, [&](A v) { nan += v != v; });
      bool any_nan = lt_block_sum(nan, sh) > 0;
      ROW_PIECES(k, C) {
        A e[W];
#pragma unroll
        for (int j = 0; j < W; j++) /* (masked columns stay masked, as where the row has values) */
          e[j] = any_nan && k * W + j < L ? (A)NAN : logsm ? ninf : (A)0;
        st_piece<W>(yr, k, e);
      }
      continue;
    }
    double sum = 0;
    each_below<W, S, A>(xr, L, [&](A v) { sum += t_exp(v * scale - m); });
    sum = lt_block_sum(sum, sh);
    A lse = m + (A)log(sum), inv = (A)(1.0 / sum);
    ROW_PIECES(k, C) {
      A e[W];
      ld_piece<W>(xr, k, e);
#pragma unroll
      for (int j = 0; j < W; j++) {
        bool in = k * W + j < L;
        e[j] = logsm ? (in ? e[j] * scale - lse : ninf) : (in ? t_exp(e[j] * scale - m) * inv : (A)0);
      }
      st_piece<W>(yr, k, e);
    }
  }
}

template <typename S, typename A, int W>
__global__ void softmax_bwd_kernel(const S *y, const S *dy, S *dx, int64_t N, int64_t C, int logsm, A scale) {
  __shared__ double sh[32];
  const A ninf = -(A)INFINITY;
  for (int64_t r = blockIdx.x; r < N; r += gridDim.x) {
    const S *yr = y + r * C, *gr = dy + r * C;
    S *xr = dx + r * C;
    if (logsm) {
      double live = 0, s = 0; /* live: entries that are not -inf */
      each_pair<W, S, A>(yr, gr, C, [&](A yv, A g) {
        live += yv != ninf;
        s += g;
      });
      bool dead = lt_block_sum(live, sh) == 0;
      A sg = (A)lt_block_sum(s, sh);
      map_pair<W, S, A>(yr, gr, xr, C, [&](A yv, A g) { return dead ? (A)0 : scale * (g - t_exp(yv) * sg); });
    } else {
      double s = 0;
      each_pair<W, S, A>(yr, gr, C, [&](A yv, A g) { s += (double)g * yv; });
      A sg = (A)lt_block_sum(s, sh);
      map_pair<W, S, A>(yr, gr, xr, C, [&](A yv, A g) { return scale * yv * (g - sg); });
    }
  }
}

/* ---- launchers ------------------------------------------------------------------ */

template <typename S, typename A>
static void softmax_fwd_launch(const void *x, void *y, int64_t N, int64_t C, int logsm, double scale, int64_t causal,
                               cudaStream_t cs) {
  if (norm_piece<S>(C, {x, y}) > 1)
    softmax_fwd_kernel<S, A, 16 / sizeof(S)><<<rows_grid(N), THREADS, 0, cs>>>((const S *)x, (S *)y, N, C, logsm,
                                                                              (A)scale, causal);
  else
    softmax_fwd_kernel<S, A, 1><<<rows_grid(N), THREADS, 0, cs>>>((const S *)x, (S *)y, N, C, logsm, (A)scale, causal);
}

extern "C" lt_status lt_cuda_softmax_fwd(lt_dtype dt, const void *x, void *y, int64_t N, int64_t C, int logsm,
                                         double scale, int64_t causal, lt_cuda_stream s) {
  if (N == 0)
    return LT_OK;
  DISPATCH_ROWS(dt, softmax_fwd_launch, x, y, N, C, logsm, scale, causal, (cudaStream_t)s);
  return lt_cuda_check_launch("softmax_fwd_kernel");
}

template <typename S, typename A>
static void softmax_bwd_launch(const void *y, const void *dy, void *dx, int64_t N, int64_t C, int logsm, double scale,
                               cudaStream_t cs) {
  if (norm_piece<S>(C, {y, dy, dx}) > 1)
    softmax_bwd_kernel<S, A, 16 / sizeof(S)><<<rows_grid(N), THREADS, 0, cs>>>((const S *)y, (const S *)dy, (S *)dx,
                                                                              N, C, logsm, (A)scale);
  else
    softmax_bwd_kernel<S, A, 1><<<rows_grid(N), THREADS, 0, cs>>>((const S *)y, (const S *)dy, (S *)dx, N, C, logsm,
                                                                 (A)scale);
}

extern "C" lt_status lt_cuda_softmax_bwd(lt_dtype dt, const void *y, const void *dy, void *dx, int64_t N, int64_t C,
                                         int logsm, double scale, lt_cuda_stream s) {
  if (N == 0)
    return LT_OK;
  DISPATCH_ROWS(dt, softmax_bwd_launch, y, dy, dx, N, C, logsm, scale, (cudaStream_t)s);
  return lt_cuda_check_launch("softmax_bwd_kernel");
}
