/*
 * nn.cu: the fused row kernels of kernels/cpu (norm.c, softmax.c, loss.c,
 * rope.c) on the GPU, same formulas and edge rules, on contiguous rows of
 * f32 or f64, or of bf16/f16 read and written as they are and computed in
 * f32 (statistics: mean, rstd, log-sum-exp and losses stay f32): LayerNorm
 * (Ba et al. 2016) and RMSNorm (Zhang and Sennrich 2019) with saved mean and rstd,
 * softmax and log-softmax (rows of all -inf give zeros), cross-entropy fused
 * with log-softmax (no probabilities stored), and rotary embeddings (Su et
 * al. 2021, the Hugging Face half-split layout).
 *
 * Norms run a warp per row, softmax and cross-entropy a block per row; rows
 * are read (and written) in 16-byte pieces where every row involved starts on
 * a 16-byte boundary, element by element otherwise. Row sums accumulate in
 * f64 in a fixed order (lt_warp_sum, lt_block_sum). A norm's backward on
 * rows of up to 768 elements in 16-byte pieces is one pass over dy and x
 * (dx and the blocks' weight and bias partial sums) and a sum of the
 * partials; otherwise dx, then weight and bias gradients summed over rows in
 * blocks of 32 columns. Both sum in a fixed order, so they are
 * deterministic.
 */
#include "common.cuh"

#include <initializer_list>
#include <math.h>

static const int THREADS = 256;
enum { NORM_WARPS = THREADS / 32 }; /* a norm's rows per block */

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
template <typename S> static bool rows_aligned16(const void *p, int64_t ld) {
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
template <typename S> static int norm_piece(int64_t C, std::initializer_list<const void *> ptrs) {
  for (const void *p : ptrs)
    if (p && !rows_aligned16<S>(p, C))
      return 1;
  return 16 / (int)sizeof(S);
}

static unsigned dw_grid(int64_t C) { return (unsigned)((C + 31) / 32); }

static unsigned rows_grid(int64_t N) { return (unsigned)(N < 65535LL * 32 ? N : 65535LL * 32); }

/* one warp per row: NORM_WARPS rows a block */
static unsigned warp_rows_grid(int64_t N) { return rows_grid((N + NORM_WARPS - 1) / NORM_WARPS); }

/* ---- LayerNorm / RMSNorm -------------------------------------------------- */

/* The rows r of a norm, one warp each: NORM_ROWS(r, N) { ... } */
#define NORM_ROWS(r, N)                                                                                        \
  for (int64_t r = (int64_t)blockIdx.x * NORM_WARPS + threadIdx.x / 32; r < (N);                               \
       r += (int64_t)gridDim.x * NORM_WARPS)

/* Sums x (and with res, x + res, written to h: each lane reads back only
   what it wrote) over a row; returns the row to normalise (x or h) */
template <int W, typename S, typename A>
__device__ __forceinline__ const S *sum_row(const S *x, const S *res, S *h, int64_t r, int64_t C, bool squares,
                                            double *sum) {
  const S *xr = x + r * C;
  double acc = 0;
  for (int64_t k = threadIdx.x % 32; k < C / W; k += 32) {
    A v[W];
    ld_piece<W>(xr, k, v);
    if (res) {
      A e[W];
      ld_piece<W>(res + r * C, k, e);
#pragma unroll
      for (int j = 0; j < W; j++)
        v[j] = ld_rounded<S, A>(v[j] + e[j]); /* (h as stored) */
      st_piece<W>(h + r * C, k, v);
    }
#pragma unroll
    for (int j = 0; j < W; j++)
      acc += squares ? (double)v[j] * v[j] : (double)v[j];
  }
  *sum = lt_warp_sum(acc);
  return res ? h + r * C : xr;
}

/* LayerNorm (mean given: centred, with a bias) or RMSNorm (mean NULL: the
   root mean square, no bias) of each row, writing mean and rstd per row */
template <typename S, typename A, int W>
__global__ void norm_fwd_kernel(const S *x, const S *res, const S *w, const S *b, S *y, S *h, A *mean, A *rstd,
                                int64_t N, int64_t C, double eps) {
  NORM_ROWS(r, N) {
    double sum;
    const S *xr = sum_row<W, S, A>(x, res, h, r, C, mean == NULL, &sum);
    double m = 0, v = sum / (double)C; /* RMSNorm: the mean of squares */
    if (mean) {
      m = v;
      v = 0;
      for (int64_t k = threadIdx.x % 32; k < C / W; k += 32) {
        A e[W];
        ld_piece<W>(xr, k, e);
#pragma unroll
        for (int j = 0; j < W; j++) {
          double d = e[j] - m;
          v += d * d;
        }
      }
      v = lt_warp_sum(v) / (double)C;
    }
    A s = (A)(1.0 / sqrt(v + eps)), mt = (A)m;
    for (int64_t k = threadIdx.x % 32; k < C / W; k += 32) {
      A e[W], wv[W], bv[W];
      ld_piece<W>(xr, k, e);
      ld_piece_or<W>(w, k, (A)1, wv);
      ld_piece_or<W>(b, k, (A)0, bv);
#pragma unroll
      for (int j = 0; j < W; j++)
        e[j] = (e[j] - mt) * s * wv[j] + bv[j];
      st_piece<W>(y + r * C, k, e);
    }
    if (threadIdx.x % 32 == 0) {
      if (mean)
        mean[r] = mt;
      rstd[r] = s;
    }
  }
}

/* dx of LayerNorm (mean given) or RMSNorm (mean NULL), plus dadd (the
   gradient reaching the residual sum h directly) when given:
   dx = rstd (g w - mean(g w) - n mean(g w n)), n the normalised row (for
   RMSNorm the mean(g w) term is absent). A row's two sums come piece by
   piece (dx_sums_piece), then each piece of dx (dx_piece). */
template <int W, typename S, typename A>
__device__ __forceinline__ void dx_sums_piece(const S *gr, const S *xr, const S *w, int64_t k, A m, A s, double &sg,
                                              double &sgn) {
  A g[W], e[W], wv[W];
  ld_piece<W>(gr, k, g);
  ld_piece<W>(xr, k, e);
  ld_piece_or<W>(w, k, (A)1, wv);
#pragma unroll
  for (int j = 0; j < W; j++) {
    A gw = g[j] * wv[j];
    sg += gw;
    sgn += gw * ((e[j] - m) * s);
  }
}

/* The row's means from its sums (over a warp): mg = mean(g w) (0 for
   RMSNorm, layer false) and mgn = mean(g w n) */
template <typename A>
__device__ __forceinline__ void dx_means(double sg, double sgn, int64_t C, bool layer, A &mg, A &mgn) {
  mg = layer ? (A)(lt_warp_sum(sg) / (double)C) : (A)0;
  mgn = (A)(lt_warp_sum(sgn) / (double)C);
}

/* Piece k of dx (with addr, the row of dadd, or NULL); g and the
   normalised n come back for the weight gradients */
template <int W, typename S, typename A>
__device__ __forceinline__ void dx_piece(const S *gr, const S *xr, const S *w, const S *addr, S *dxr, int64_t k, A m,
                                         A s, A mg, A mgn, A (&g)[W], A (&n)[W]) {
  A wv[W], add[W], d[W];
  ld_piece<W>(gr, k, g);
  ld_piece<W>(xr, k, n);
  ld_piece_or<W>(w, k, (A)1, wv);
  ld_piece_or<W>(addr, k, (A)0, add);
#pragma unroll
  for (int j = 0; j < W; j++) {
    n[j] = (n[j] - m) * s;
    d[j] = s * (g[j] * wv[j] - mg - n[j] * mgn) + add[j];
  }
  st_piece<W>(dxr, k, d);
}

template <typename S, typename A, int W>
__global__ void norm_dx_kernel(const S *dy, const S *x, const S *w, const A *mean, const A *rstd, const S *dadd,
                               S *dx, int64_t N, int64_t C) {
  NORM_ROWS(r, N) {
    const S *xr = x + r * C, *gr = dy + r * C;
    A m = mean ? mean[r] : (A)0, s = rstd[r], mg, mgn;
    double sg = 0, sgn = 0;
    for (int64_t k = threadIdx.x % 32; k < C / W; k += 32)
      dx_sums_piece<W>(gr, xr, w, k, m, s, sg, sgn);
    dx_means(sg, sgn, C, mean != NULL, mg, mgn);
    for (int64_t k = threadIdx.x % 32; k < C / W; k += 32) {
      A g[W], n[W];
      dx_piece<W>(gr, xr, w, dadd ? dadd + r * C : (const S *)NULL, dx + r * C, k, m, s, mg, mgn, g, n);
    }
  }
}

/* dx, and dw (and db) partial sums, in one pass over dy and x, for rows of
   at most FUSED_MAX_C elements in 16-byte pieces (at most P per lane): a
   block takes `rows` consecutive rows, each warp its rows in order (every
   NORM_WARPS-th) adding g n and g into f32 registers per lane and piece;
   then the block adds its warps in warp order (f64, shared memory) and
   writes one row of partial sums to scratch for norm_dw_finish_kernel.
   The grid depends on N alone (fused_blocks), so the sums are
   deterministic. (llm.c's layernorm_backward fuses dx, dw and db alike.)
   FUSED_MAX_C keeps the registers under the two-blocks-a-SM bound
   without spills (bf16, three pieces a lane: 119 registers). */
enum { FUSED_MAX_C = 768, FUSED_MAX_BLOCKS = 256, FUSED_MIN_BLOCK_ROWS = 32 };
static int fused_blocks(int64_t N) {
  int64_t b = (N + FUSED_MIN_BLOCK_ROWS - 1) / FUSED_MIN_BLOCK_ROWS;
  return (int)(b < 1 ? 1 : (b > (int64_t)FUSED_MAX_BLOCKS ? (int64_t)FUSED_MAX_BLOCKS : b));
}

template <typename S, typename A, int W, int P>
__global__ void __launch_bounds__(THREADS, 2)
    norm_bwd_fused_kernel(const S *dy, const S *x, const S *w, const A *mean, const A *rstd, const S *dadd, S *dx,
                          double *pw, double *pb, int64_t N, int64_t C, int64_t rows) {
  __shared__ double sw[FUSED_MAX_C], sb[FUSED_MAX_C];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t pieces = C / W, r0 = (int64_t)blockIdx.x * rows, r1 = r0 + rows < N ? r0 + rows : N;
  A aw[P][W], ab[P][W];
#pragma unroll
  for (int p = 0; p < P; p++)
#pragma unroll
    for (int j = 0; j < W; j++)
      aw[p][j] = ab[p][j] = 0;
  for (int64_t r = r0 + warp; r < r1; r += NORM_WARPS) {
    const S *xr = x + r * C, *gr = dy + r * C;
    A m = mean ? mean[r] : (A)0, s = rstd[r], mg, mgn;
    double sg = 0, sgn = 0;
#pragma unroll
    for (int p = 0; p < P; p++)
      if (lane + 32 * p < pieces)
        dx_sums_piece<W>(gr, xr, w, lane + 32 * p, m, s, sg, sgn);
    dx_means(sg, sgn, C, mean != NULL, mg, mgn);
#pragma unroll
    for (int p = 0; p < P; p++)
      if (lane + 32 * p < pieces) {
        A g[W], n[W];
        dx_piece<W>(gr, xr, w, dadd ? dadd + r * C : (const S *)NULL, dx + r * C, lane + 32 * p, m, s, mg, mgn, g, n);
#pragma unroll
        for (int j = 0; j < W; j++) {
          aw[p][j] += g[j] * n[j];
          ab[p][j] += g[j];
        }
      }
  }
  for (int v = 0; v < NORM_WARPS; v++) { /* the warps' sums in order */
    if (warp == v)
#pragma unroll
      for (int p = 0; p < P; p++)
        if (lane + 32 * p < pieces)
#pragma unroll
          for (int j = 0; j < W; j++) {
            int c = (lane + 32 * p) * W + j;
            sw[c] = (v ? sw[c] : 0.0) + (double)aw[p][j];
            sb[c] = (v ? sb[c] : 0.0) + (double)ab[p][j];
          }
    __syncthreads();
  }
  for (int64_t c = threadIdx.x; c < C; c += THREADS) {
    pw[(int64_t)blockIdx.x * C + c] = sw[c];
    pb[(int64_t)blockIdx.x * C + c] = sb[c];
  }
}

/* dw (and db) for LayerNorm (mean given) or RMSNorm (mean NULL) in two
   passes through scratch: blocks of 32 columns x a chunk of rows write f64
   partial sums, enough blocks to fill the GPU (one block per 32 columns
   would leave most SMs idle for GPT-2's 768); then one thread per column
   adds the chunks in order. In a block, 32 / W threads take the 32 columns
   in pieces of W (16 bytes where the rows are aligned) and 256 W / 32 row
   stripes each sum their rows in order, combined in a fixed tree.
   Deterministic, reads coalesced. */
enum { DW_X = 32, DW_THREADS = 256, DW_CHUNKS = 64, DW_CHUNK_ROWS = 256 };
static int dw_chunks(int64_t N) {
  int64_t y = (N + DW_CHUNK_ROWS - 1) / DW_CHUNK_ROWS;
  return (int)(y < 1 ? 1 : (y > (int64_t)DW_CHUNKS ? (int64_t)DW_CHUNKS : y));
}

/* Adds the PY stripes of sw and sb into stripe 0 in a fixed tree, for this
   thread's N columns from col (ty its stripe) */
template <int PY, int X, int N>
__device__ __forceinline__ void stripes_sum(double (&sw)[PY][X], double (&sb)[PY][X], int ty, int col) {
  for (int h = PY / 2; h > 0; h >>= 1) {
    __syncthreads();
    if (ty < h)
#pragma unroll
      for (int j = 0; j < N; j++) {
        sw[ty][col + j] += sw[ty + h][col + j];
        sb[ty][col + j] += sb[ty + h][col + j];
      }
  }
}

template <typename S, typename A, int W>
__global__ void norm_dw_partial_kernel(const S *dy, const S *x, const A *mean, const A *rstd, double *pw, double *pb,
                                       int64_t N, int64_t C, int64_t rows) {
  const int PX = DW_X / W, PY = DW_THREADS / PX; /* pieces across, row stripes */
  __shared__ double sw[PY][DW_X], sb[PY][DW_X];
  int tx = threadIdx.x % PX, ty = threadIdx.x / PX;
  int64_t k = (int64_t)blockIdx.x * PX + tx, r0 = (int64_t)blockIdx.y * rows; /* k: this thread's piece */
  int64_t r1 = r0 + rows < N ? r0 + rows : N;
  double aw[W], ab[W];
#pragma unroll
  for (int j = 0; j < W; j++)
    aw[j] = ab[j] = 0;
  if (k * W < C)
    for (int64_t r = r0 + ty; r < r1; r += PY) {
      A g[W], e[W], mu = mean ? mean[r] : (A)0, s = rstd[r];
      ld_piece<W>(dy + r * C, k, g);
      ld_piece<W>(x + r * C, k, e);
#pragma unroll
      for (int j = 0; j < W; j++) {
        aw[j] += g[j] * ((e[j] - mu) * s);
        ab[j] += g[j];
      }
    }
#pragma unroll
  for (int j = 0; j < W; j++) {
    sw[ty][tx * W + j] = aw[j];
    sb[ty][tx * W + j] = ab[j];
  }
  stripes_sum<PY, DW_X, W>(sw, sb, ty, tx * W);
  if (ty == 0)
#pragma unroll
    for (int j = 0; j < W; j++)
      if (k * W + j < C) {
        pw[(int64_t)blockIdx.y * C + k * W + j] = sw[0][tx * W + j];
        pb[(int64_t)blockIdx.y * C + k * W + j] = sb[0][tx * W + j];
      }
}

/* dw (and db) from `chunks` rows of partial sums: blocks of 32 columns,
   each of THREADS / 32 stripes adding every stripe-th row in order, the
   stripes then combined in a fixed tree */
template <typename S, typename A>
__global__ void norm_dw_finish_kernel(const double *pw, const double *pb, int chunks, int64_t C, S *dw, S *db) {
  const int PY = THREADS / DW_X;
  __shared__ double sw[PY][DW_X], sb[PY][DW_X];
  int tx = threadIdx.x % DW_X, ty = threadIdx.x / DW_X;
  int64_t c = (int64_t)blockIdx.x * DW_X + tx;
  double w = 0, b = 0;
  if (c < C)
    for (int y = ty; y < chunks; y += PY) {
      w += pw[(int64_t)y * C + c];
      b += pb[(int64_t)y * C + c];
    }
  sw[ty][tx] = w;
  sb[ty][tx] = b;
  stripes_sum<PY, DW_X, 1>(sw, sb, ty, tx);
  if (ty == 0 && c < C) {
    if (dw)
      lt_st(dw, c, (A)sw[0][tx]);
    if (db)
      lt_st(db, c, (A)sb[0][tx]);
  }
}

/* scratch for a norm's weight gradients: two rows of f64 sums per chunk
   (norm_dw_partial_kernel) or per block (norm_bwd_fused_kernel) */
extern "C" size_t lt_cuda_norm_dw_scratch(int64_t N, int64_t C) {
  int rows = dw_chunks(N);
  if (C <= FUSED_MAX_C && fused_blocks(N) > rows)
    rows = fused_blocks(N);
  return 2 * (size_t)rows * (size_t)C * 8;
}

/* dw (and db) of a norm in two passes; scratch holds lt_cuda_norm_dw_scratch(N, C) bytes */
template <typename S, typename A>
static void norm_dw_launch(const void *dy, const void *x, const void *mean, const void *rstd, void *dw, void *db,
                           int64_t N, int64_t C, void *scratch, cudaStream_t cs) {
  int chunks = dw_chunks(N);
  double *pw = (double *)scratch, *pb = pw + (size_t)chunks * (size_t)C;
  int64_t rows = (N + chunks - 1) / chunks;
  dim3 grid(dw_grid(C), (unsigned)chunks);
  if (norm_piece<S>(C, {dy, x}) > 1)
    norm_dw_partial_kernel<S, A, 16 / sizeof(S)><<<grid, DW_THREADS, 0, cs>>>(
        (const S *)dy, (const S *)x, (const A *)mean, (const A *)rstd, pw, pb, N, C, rows);
  else
    norm_dw_partial_kernel<S, A, 1><<<grid, DW_THREADS, 0, cs>>>((const S *)dy, (const S *)x, (const A *)mean,
                                                                 (const A *)rstd, pw, pb, N, C, rows);
  norm_dw_finish_kernel<S, A><<<dw_grid(C), THREADS, 0, cs>>>(pw, pb, chunks, C, (S *)dw, (S *)db);
}

/* Whether a norm's backward runs fused (norm_bwd_fused_kernel): dx and a
   weight gradient wanted, f32 or 16-bit rows of at most FUSED_MAX_C
   elements in 16-byte pieces */
template <typename S> static bool fused_norm_bwd(bool wide, bool dx, bool dw, int64_t C) {
  return dx && dw && wide && sizeof(S) <= 4 && C > 0 && C <= FUSED_MAX_C;
}

/* dx, dw (and db) of a norm in one pass and a sum of the blocks' partials */
template <typename S, typename A>
static void norm_bwd_fused_launch(const void *dy, const void *x, const void *w, const void *mean, const void *rstd,
                                  const void *dadd, void *dx, void *dw, void *db, int64_t N, int64_t C,
                                  void *scratch, cudaStream_t cs) {
  constexpr int W = 16 / sizeof(S);
  int blocks = fused_blocks(N);
  double *pw = (double *)scratch, *pb = pw + (size_t)blocks * (size_t)C;
  int64_t rows = (N + blocks - 1) / blocks, per_lane = (C / W + 31) / 32;
#define FUSED(P)                                                                                              \
  norm_bwd_fused_kernel<S, A, W, P><<<blocks, THREADS, 0, cs>>>((const S *)dy, (const S *)x, (const S *)w,   \
                                                                (const A *)mean, (const A *)rstd,             \
                                                                (const S *)dadd, (S *)dx, pw, pb, N, C, rows)
  switch (per_lane) {
  case 1: FUSED(1); break;
  case 2: FUSED(2); break;
  case 3: FUSED(3); break;
  default:
    if constexpr (W == 4) { /* f32: 4 to 6 pieces a lane */
      if (per_lane == 4)
        FUSED(4);
      else
        FUSED(6);
    }
  }
#undef FUSED
  norm_dw_finish_kernel<S, A><<<dw_grid(C), THREADS, 0, cs>>>(pw, pb, blocks, C, (S *)dw, (S *)db);
}

static lt_status dw_scratch_ok(void *dw, void *db, int64_t N, int64_t C, void *scratch, size_t scratch_bytes) {
  if ((dw || db) && (!scratch || scratch_bytes < lt_cuda_norm_dw_scratch(N, C)))
    return lt_fail(LT_ERR_INTERNAL, "cuda: a norm's weight gradient needs %zu bytes of scratch, got %zu",
                   lt_cuda_norm_dw_scratch(N, C), scratch_bytes);
  return LT_OK;
}

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

/* ---- cross-entropy ------------------------------------------------------------- */

__device__ __forceinline__ int64_t target_at(const char *p, int dt, int64_t i) {
  return dt == LT_DTYPE_I32 ? (int64_t)((const int32_t *)p)[i] : ((const int64_t *)p)[i];
}

__global__ void ce_check_kernel(const char *tgt, int tdt, int64_t N, int64_t V, int64_t ignore,
                                unsigned long long *bad) {
  LT_GRID_STRIDE(r, N) {
    int64_t t = target_at(tgt, tdt, r);
    if (t != ignore && (t < 0 || t >= V))
      atomicMin(bad, (unsigned long long)r);
  }
}

/* One logit into a thread's running maximum m and sum s of exp(x - m): a
   larger x rescales s first (the online softmax, Milakov and Gimelshein
   2018); -inf adds nothing, and NaN or +inf make s NaN, as the two-pass
   form (max, then sum) gives. */
template <typename A> __device__ __forceinline__ void lse_push(A x, A &m, double &s) {
  if (x > m) {
    s *= exp((double)m - (double)x);
    m = x;
  }
  if (!(x == (A)-CUDART_INF))
    s += t_exp(x - m);
}

/* The log-sum-exp of row xr's V logits in one pass (each logit read once
   from memory), in 16-byte pieces where the rows are aligned (vec); each
   thread's (m, s) combine in a fixed order: lse = M + log(sum of s exp(m -
   M)), M the row's maximum. Every thread of the block gets it. */
template <typename S, typename A>
__device__ __forceinline__ A ce_row_lse(const S *xr, int64_t V, int vec, double *sh) {
  const int W = 16 / sizeof(S);
  A m = (A)-CUDART_INF;
  double s = 0;
  int64_t c0 = 0;
  if (vec) {
    int64_t np = V / W;
    for (int64_t i = threadIdx.x; i < np; i += blockDim.x) {
      piece<S> p;
      p.raw = ((const uint4 *)xr)[i];
#pragma unroll
      for (int j = 0; j < W; j++)
        lse_push(lt_ld(p.e, j), m, s);
    }
    c0 = np * W;
  }
  for (int64_t c = c0 + threadIdx.x; c < V; c += blockDim.x)
    lse_push(lt_ld(xr, c), m, s);
  A mx = (A)lt_block_max((double)m, sh);
  s = lt_block_sum(s * exp((double)m - (double)mx), sh);
  return mx + (A)log(s);
}

/* dx rows are ldd apart; their columns V..ldd-1 (padding past the classes)
   get 0. In 16-byte pieces where x's and dx's rows are aligned (vec). */
template <typename A> __device__ __forceinline__ A ce_grad(A x, int64_t c, int64_t t, A l, A s) {
  return t_exp(x - l) * s - (c == t ? s : (A)0);
}

/* Row dr = s (softmax(xr) - onehot(t)) from its log-sum-exp l; zeros past
   V, and everywhere when the row does not count (live false). Each
   element of xr is read by the thread that then writes it in dr, so dr
   may be xr. */
template <typename S, typename A>
__device__ __forceinline__ void ce_row_grad(const S *xr, S *dr, int64_t t, int64_t V, int64_t ldd, bool live, A l,
                                            A s, int vec) {
  const int W = 16 / sizeof(S);
  int64_t c0 = 0;
  if (vec) {
    int64_t np = ldd / W;
    for (int64_t i = threadIdx.x; i < np; i += blockDim.x) {
      int64_t base = i * W;
      piece<S> in, out;
      bool whole = live && base + W <= V; /* (a piece past the classes is not read) */
      if (whole)
        in.raw = ((const uint4 *)xr)[i];
#pragma unroll
      for (int j = 0; j < W; j++) {
        int64_t c = base + j;
        A v = (A)0;
        if (whole)
          v = ce_grad<A>(lt_ld(in.e, j), c, t, l, s);
        else if (live && c < V)
          v = ce_grad<A>(lt_ld(xr, c), c, t, l, s);
        lt_st(out.e, j, v);
      }
      ((uint4 *)dr)[i] = out.raw;
    }
    c0 = np * W;
  }
  for (int64_t c = c0 + threadIdx.x; c < ldd; c += blockDim.x)
    lt_st(dr, c, live && c < V ? ce_grad<A>(lt_ld(xr, c), c, t, l, s) : (A)0);
}

template <typename S, typename A>
__global__ void ce_bwd_kernel(const S *x, int64_t ldx, const char *tgt, int tdt, int64_t N, int64_t V, int64_t ldd,
                              int64_t ignore, const A *lse, const A *scale, S *dx, int vec) {
  for (int64_t r = blockIdx.x; r < N; r += gridDim.x) {
    int64_t t = target_at(tgt, tdt, r);
    bool live = t != ignore; /* (an ignored row's gradient is zeros) */
    A s = scale ? scale[r] : (A)1;
    ce_row_grad<S, A>(x + r * ldx, dx + r * ldd, t, V, ldd, live, live ? lse[r] : (A)0, live ? s : (A)0, vec);
  }
}

/* Each row's log-sum-exp and loss; with dx (else NULL), the backward in
   the same kernel (llm.c's fused classifier): the row's gradient times
   scale[r] (1 when scale is NULL), the row read a second time while the
   GPU's caches still hold it; dx (rows ldx apart) may be x. vec_x: x's rows
   aligned; vec: x's and dx's. */
template <typename S, typename A>
__global__ void ce_fwd_bwd_kernel(const S *x, int64_t ldx, const char *tgt, int tdt, int64_t N, int64_t V,
                                  int64_t ignore, A *loss, A *lse, const A *scale, S *dx,
                                  const unsigned long long *bad, int vec_x, int vec) {
  __shared__ double sh[32];
  if (*bad != ~0ULL)
    return;
  for (int64_t r = blockIdx.x; r < N; r += gridDim.x) {
    int64_t t = target_at(tgt, tdt, r);
    const S *xr = x + r * ldx;
    bool live = t != ignore;
    A l = 0, xt = 0;
    if (live) {
      if (threadIdx.x == 0)
        xt = lt_ld(xr, t); /* (before any thread writes the row: the lse's barriers come first) */
      l = ce_row_lse<S, A>(xr, V, vec_x, sh);
    }
    if (threadIdx.x == 0) {
      lse[r] = l;
      loss[r] = live ? l - xt : (A)0;
    }
    if (dx)
      ce_row_grad<S, A>(xr, dx + r * ldx, t, V, ldx, live, l, live ? (scale ? scale[r] : (A)1) : (A)0, vec);
  }
}

/* ---- rope ---------------------------------------------------------------------- */

/* Rows of D elements as S computed in A; the angles in f64 (as the CPU's) */
template <typename S, typename A>
__global__ void rope_kernel(const S *x, S *y, int64_t R, int64_t Tn, int64_t D, double base, int64_t start,
                            double sign) {
  int64_t h = D / 2;
  LT_GRID_STRIDE(e, R * Tn * h) {
    int64_t i = e % h, rt = e / h, t = rt % Tn;
    double ang = (double)(start + t) * pow(base, -2.0 * (double)i / (double)D);
    A c = (A)cos(ang), s = (A)(sign * sin(ang));
    const S *xr = x + rt * D;
    S *yr = y + rt * D;
    A a = lt_ld(xr, i), b = lt_ld(xr, i + h);
    lt_st(yr, i, a * c - b * s);
    lt_st(yr, i + h, b * c + a * s);
  }
}

/* ---- launchers ------------------------------------------------------------------ */

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

/* Launches KERNEL<S, A, W> with W 16 bytes of elements where `wide` (norm_piece), else one. */
#define NORM_LAUNCH(KERNEL, N, cs, wide, ...)                                                        \
  do {                                                                                               \
    if (wide)                                                                                        \
      KERNEL<S, A, 16 / sizeof(S)><<<warp_rows_grid(N), THREADS, 0, cs>>>(__VA_ARGS__);              \
    else                                                                                             \
      KERNEL<S, A, 1><<<warp_rows_grid(N), THREADS, 0, cs>>>(__VA_ARGS__);                           \
  } while (0)

template <typename S, typename A>
static void layer_norm_fwd_launch(const void *x, const void *res, const void *w, const void *b, void *y, void *h,
                                  void *mean, void *rstd, int64_t N, int64_t C, double eps, cudaStream_t cs) {
  bool wide = norm_piece<S>(C, {x, res, w, b, y, h}) > 1;
  NORM_LAUNCH(norm_fwd_kernel, N, cs, wide, (const S *)x, (const S *)res, (const S *)w,
              (const S *)b, (S *)y, (S *)h, (A *)mean, (A *)rstd, N, C, eps);
}

extern "C" lt_status lt_cuda_layer_norm_fwd(lt_dtype dt, const void *x, const void *res, const void *w, const void *b,
                                            void *y, void *h, void *mean, void *rstd, int64_t N, int64_t C, double eps,
                                            lt_cuda_stream s) {
  if (N == 0)
    return LT_OK;
  DISPATCH_ROWS(dt, layer_norm_fwd_launch, x, res, w, b, y, h, mean, rstd, N, C, eps, (cudaStream_t)s);
  return lt_cuda_check_launch("layer_norm forward");
}

template <typename S, typename A>
static void layer_norm_bwd_launch(const void *dy, const void *x, const void *w, const void *mean, const void *rstd,
                                  const void *dadd, void *dx, void *dw, void *db, int64_t N, int64_t C,
                                  void *scratch, cudaStream_t cs) {
  bool wide = norm_piece<S>(C, {dy, x, w, dadd, dx}) > 1;
  if constexpr (sizeof(S) <= 4)
    if (fused_norm_bwd<S>(wide, dx, dw || db, C))
      return norm_bwd_fused_launch<S, A>(dy, x, w, mean, rstd, dadd, dx, dw, db, N, C, scratch, cs);
  if (dx)
    NORM_LAUNCH(norm_dx_kernel, N, cs, wide, (const S *)dy, (const S *)x, (const S *)w,
                (const A *)mean, (const A *)rstd, (const S *)dadd, (S *)dx, N, C);
  if (dw || db)
    norm_dw_launch<S, A>(dy, x, mean, rstd, dw, db, N, C, scratch, cs);
}

/* no rows: the weight gradients are zeros (as the CPU's) */
static lt_status zero_vectors(lt_dtype dt, void *a, void *b, int64_t C, cudaStream_t cs) {
  size_t bytes = (size_t)C * (size_t)lt_dtype_size(dt);
  if (a)
    cudaMemsetAsync(a, 0, bytes, cs);
  if (b)
    cudaMemsetAsync(b, 0, bytes, cs);
  return lt_cuda_check_launch("zeroing a norm's weight gradients");
}

extern "C" lt_status lt_cuda_layer_norm_bwd(lt_dtype dt, const void *dy, const void *x, const void *w,
                                            const void *mean, const void *rstd, const void *dadd, void *dx, void *dw,
                                            void *db, int64_t N, int64_t C, void *scratch, size_t scratch_bytes,
                                            lt_cuda_stream s) {
  if (N == 0)
    return zero_vectors(dt, dw, db, C, (cudaStream_t)s);
  lt_status ok = dw_scratch_ok(dw, db, N, C, scratch, scratch_bytes);
  if (ok != LT_OK)
    return ok;
  DISPATCH_ROWS(dt, layer_norm_bwd_launch, dy, x, w, mean, rstd, dadd, dx, dw, db, N, C, scratch, (cudaStream_t)s);
  return lt_cuda_check_launch("layer_norm backward");
}

template <typename S, typename A>
static void rms_norm_fwd_launch(const void *x, const void *res, const void *w, void *y, void *h, void *rstd, int64_t N,
                                int64_t C, double eps, cudaStream_t cs) {
  bool wide = norm_piece<S>(C, {x, res, w, y, h}) > 1;
  NORM_LAUNCH(norm_fwd_kernel, N, cs, wide, (const S *)x, (const S *)res, (const S *)w, (const S *)NULL, (S *)y,
              (S *)h, (A *)NULL, (A *)rstd, N, C, eps);
}

extern "C" lt_status lt_cuda_rms_norm_fwd(lt_dtype dt, const void *x, const void *res, const void *w, void *y, void *h,
                                          void *rstd, int64_t N, int64_t C, double eps, lt_cuda_stream s) {
  if (N == 0)
    return LT_OK;
  DISPATCH_ROWS(dt, rms_norm_fwd_launch, x, res, w, y, h, rstd, N, C, eps, (cudaStream_t)s);
  return lt_cuda_check_launch("rms_norm forward");
}

template <typename S, typename A>
static void rms_norm_bwd_launch(const void *dy, const void *x, const void *w, const void *rstd, const void *dadd,
                                void *dx, void *dw, int64_t N, int64_t C, void *scratch, cudaStream_t cs) {
  bool wide = norm_piece<S>(C, {dy, x, w, dadd, dx}) > 1;
  if constexpr (sizeof(S) <= 4)
    if (fused_norm_bwd<S>(wide, dx, dw, C))
      return norm_bwd_fused_launch<S, A>(dy, x, w, NULL, rstd, dadd, dx, dw, NULL, N, C, scratch, cs);
  if (dx)
    NORM_LAUNCH(norm_dx_kernel, N, cs, wide, (const S *)dy, (const S *)x, (const S *)w, (const A *)NULL,
                (const A *)rstd, (const S *)dadd, (S *)dx, N, C);
  if (dw)
    norm_dw_launch<S, A>(dy, x, NULL, rstd, dw, NULL, N, C, scratch, cs);
}

extern "C" lt_status lt_cuda_rms_norm_bwd(lt_dtype dt, const void *dy, const void *x, const void *w, const void *rstd,
                                          const void *dadd, void *dx, void *dw, int64_t N, int64_t C, void *scratch,
                                          size_t scratch_bytes, lt_cuda_stream s) {
  if (N == 0)
    return zero_vectors(dt, dw, NULL, C, (cudaStream_t)s);
  lt_status ok = dw_scratch_ok(dw, NULL, N, C, scratch, scratch_bytes);
  if (ok != LT_OK)
    return ok;
  DISPATCH_ROWS(dt, rms_norm_bwd_launch, dy, x, w, rstd, dadd, dx, dw, N, C, scratch, (cudaStream_t)s);
  return lt_cuda_check_launch("rms_norm backward");
}

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

/* the targets' check: *bad ends as the first row whose target is outside [0, V) and not ignore */
static lt_status ce_check(const char *targets, lt_dtype tdt, int64_t N, int64_t V, int64_t ignore,
                          unsigned long long *bad, cudaStream_t cs) {
  ce_check_kernel<<<lt_cuda_blocks(N, THREADS), THREADS, 0, cs>>>(targets, tdt, N, V, ignore, bad);
  return lt_cuda_check_launch("cross_entropy check");
}

/* the forward, and with dx (else NULL) the backward in the same kernel */
template <typename S, typename A>
static void ce_fwd_bwd_launch(const void *x, int64_t ldx, const char *targets, lt_dtype tdt, int64_t N, int64_t V,
                              int64_t ignore, void *loss, void *lse, const void *scale, void *dx,
                              unsigned long long *bad, cudaStream_t cs) {
  int vec_x = rows_aligned16<S>(x, ldx), vec = vec_x && (!dx || rows_aligned16<S>(dx, ldx));
  ce_fwd_bwd_kernel<S, A><<<rows_grid(N), THREADS, 0, cs>>>((const S *)x, ldx, targets, tdt, N, V, ignore, (A *)loss,
                                                           (A *)lse, (const A *)scale, (S *)dx, bad, vec_x, vec);
}

static lt_status ce_fwd_run(lt_dtype dt, const void *x, int64_t ldx, const char *targets, lt_dtype tdt, int64_t N,
                            int64_t V, int64_t ignore, void *loss, void *lse, const void *scale, void *dx,
                            unsigned long long *bad, lt_cuda_stream s) {
  if (N == 0)
    return LT_OK;
  cudaStream_t cs = (cudaStream_t)s;
  lt_status st = ce_check(targets, tdt, N, V, ignore, bad, cs);
  if (st != LT_OK)
    return st;
  DISPATCH_ROWS(dt, ce_fwd_bwd_launch, x, ldx, targets, tdt, N, V, ignore, loss, lse, scale, dx, bad, cs);
  return lt_cuda_check_launch(dx ? "cross_entropy forward and backward" : "cross_entropy forward");
}

extern "C" lt_status lt_cuda_cross_entropy_fwd(lt_dtype dt, const void *x, int64_t ldx, const char *targets,
                                               lt_dtype tdt, int64_t N, int64_t V, int64_t ignore, void *loss,
                                               void *lse, unsigned long long *bad, lt_cuda_stream s) {
  return ce_fwd_run(dt, x, ldx, targets, tdt, N, V, ignore, loss, lse, NULL, NULL, bad, s);
}

extern "C" lt_status lt_cuda_cross_entropy_fwd_bwd(lt_dtype dt, const void *x, int64_t ldx, const char *targets,
                                                   lt_dtype tdt, int64_t N, int64_t V, int64_t ignore, void *loss,
                                                   void *lse, const void *scale, void *dx, unsigned long long *bad,
                                                   lt_cuda_stream s) {
  return ce_fwd_run(dt, x, ldx, targets, tdt, N, V, ignore, loss, lse, scale, dx, bad, s);
}

template <typename S, typename A>
static void ce_bwd_launch(const void *x, int64_t ldx, const char *targets, lt_dtype tdt, int64_t N, int64_t V,
                          int64_t ldd, int64_t ignore, const void *lse, const void *scale, void *dx,
                          cudaStream_t cs) {
  int vec = rows_aligned16<S>(x, ldx) && rows_aligned16<S>(dx, ldd);
  ce_bwd_kernel<S, A><<<rows_grid(N), THREADS, 0, cs>>>((const S *)x, ldx, targets, tdt, N, V, ldd, ignore,
                                                       (const A *)lse, (const A *)scale, (S *)dx, vec);
}

extern "C" lt_status lt_cuda_cross_entropy_bwd(lt_dtype dt, const void *x, int64_t ldx, const char *targets,
                                               lt_dtype tdt, int64_t N, int64_t V, int64_t ldd, int64_t ignore,
                                               const void *lse, const void *scale, void *dx, lt_cuda_stream s) {
  if (N == 0)
    return LT_OK;
  DISPATCH_ROWS(dt, ce_bwd_launch, x, ldx, targets, tdt, N, V, ldd, ignore, lse, scale, dx, (cudaStream_t)s);
  return lt_cuda_check_launch("ce_bwd_kernel");
}

template <typename S, typename A>
static void rope_launch(const void *x, void *y, int64_t R, int64_t Tn, int64_t D, double base, int64_t start,
                        double sign, cudaStream_t cs) {
  rope_kernel<S, A><<<lt_cuda_blocks(R * Tn * (D / 2), THREADS), THREADS, 0, cs>>>((const S *)x, (S *)y, R, Tn, D,
                                                                                 base, start, sign);
}

extern "C" lt_status lt_cuda_rope(lt_dtype dt, const void *x, void *y, int64_t R, int64_t Tn, int64_t D, double base,
                                  int64_t start, int inverse, lt_cuda_stream s) {
  int64_t n = R * Tn * (D / 2);
  if (n == 0)
    return LT_OK;
  DISPATCH_ROWS(dt, rope_launch, x, y, R, Tn, D, base, start, inverse ? -1.0 : 1.0, (cudaStream_t)s);
  return lt_cuda_check_launch("rope_kernel");
}
