/*
 * norm.cu: LayerNorm (Ba et al. 2016) and RMSNorm (Zhang and Sennrich 2019)
 * on the GPU, the formulas and edge rules of kernels/cpu/norm.c, on
 * contiguous rows of f32 or f64, or of bf16/f16 read and written as they
 * are and computed in f32 (rows.cuh), saving mean and rstd (f32, f64 for
 * f64 rows), with the residual add fused in (h = x + res) and its gradient
 * (dadd) added into dx.
 *
 * A warp per row; row sums accumulate in f64 in a fixed order
 * (lt_warp_sum). A norm's backward on rows of up to 768 elements in 16-byte
 * pieces is one pass over dy and x (dx and the blocks' weight and bias
 * partial sums) and a sum of the partials; otherwise dx, then weight and
 * bias gradients summed over rows in blocks of 32 columns. Both sum in a
 * fixed order, so they are deterministic.
 */
#include "rows.cuh"

static const int THREADS = 256;
enum { NORM_WARPS = THREADS / 32 }; /* a norm's rows per block */

static unsigned dw_grid(int64_t C) { return (unsigned)((C + 31) / 32); }

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

/* ---- launchers ------------------------------------------------------------------ */

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
