/*
 * loss.cu: cross-entropy over rows of logits on the GPU, fused with
 * log-softmax (no probabilities stored), as kernels/cpu/loss.c: per row the
 * log-sum-exp and the loss (0 for the ignored target), the backward
 * softmax(x) - onehot(t) times a per-row scale, and both in one kernel
 * (the forward and backward fused, dx may be x). f32, f64, bf16/f16
 * computed in f32 (rows.cuh); a block per row. Targets outside [0, V)
 * (and not ignored) are found by a check kernel into *bad, as the index
 * kernels do, and nothing is computed then.
 */
#include "rows.cuh"

static const int THREADS = 256;

/* ---- cross-entropy ------------------------------------------------------------- */

__global__ void ce_check_kernel(const char *tgt, int tdt, int64_t N, int64_t V, int64_t ignore,
                                unsigned long long *bad) {
  LT_GRID_STRIDE(r, N) {
    int64_t t = lt_index_at(tgt, tdt, r);
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
    int64_t t = lt_index_at(tgt, tdt, r);
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
    int64_t t = lt_index_at(tgt, tdt, r);
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

/* ---- launchers ------------------------------------------------------------------ */

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
