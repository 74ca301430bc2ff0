/*
 * nn.cu: the fused row kernels of kernels/cpu (norm.c, softmax.c, loss.c,
 * rope.c) on the GPU, same formulas and edge rules, in f32 or f64 on
 * contiguous rows (the host converts 16-bit floats): LayerNorm (Ba et al.
 * 2016) and RMSNorm (Zhang and Sennrich 2019) with saved mean and rstd,
 * softmax and log-softmax (rows of all -inf give zeros), cross-entropy fused
 * with log-softmax (no probabilities stored), and rotary embeddings (Su et
 * al. 2021, the Hugging Face half-split layout).
 *
 * One block per row; row sums accumulate in f64 through lt_block_sum in a
 * fixed order. Weight and bias gradients sum over rows in blocks of 32
 * columns, in a fixed order, so they are deterministic.
 */
#include "common.cuh"

#include <math.h>

static const int THREADS = 256;

__device__ __forceinline__ float t_exp(float x) { return expf(x); }
__device__ __forceinline__ double t_exp(double x) { return exp(x); }

static unsigned dw_grid(int64_t C) { return (unsigned)((C + 31) / 32); }

static unsigned rows_grid(int64_t N) { return (unsigned)(N < 65535LL * 32 ? N : 65535LL * 32); }

/* ---- LayerNorm / RMSNorm -------------------------------------------------- */

/* with res, the row is h = x + res, written to h by the threads that read it
   back (the same c stride), so no barrier is needed before the sums */
template <typename T>
__device__ __forceinline__ const T *residual_row(const T *x, const T *res, T *h, int64_t r, int64_t C) {
  if (!res)
    return x + r * C;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x)
    h[r * C + c] = x[r * C + c] + res[r * C + c];
  return h + r * C;
}

template <typename T>
__global__ void layer_norm_fwd_kernel(const T *x, const T *res, const T *w, const T *b, T *y, T *h, T *mean, T *rstd,
                                      int64_t N, int64_t C, double eps) {
  __shared__ double sh[32];
  for (int64_t r = blockIdx.x; r < N; r += gridDim.x) {
    const T *xr = residual_row(x, res, h, r, C);
    double m = 0, v = 0;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x)
      m += xr[c];
    m = lt_block_sum(m, sh) / (double)C;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
      double d = xr[c] - m;
      v += d * d;
    }
    v = lt_block_sum(v, sh) / (double)C;
    T s = (T)(1.0 / sqrt(v + eps)), mt = (T)m;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x)
      y[r * C + c] = (xr[c] - mt) * s * (w ? w[c] : (T)1) + (b ? b[c] : (T)0);
    if (threadIdx.x == 0) {
      mean[r] = mt;
      rstd[r] = s;
    }
  }
}

template <typename T>
__global__ void layer_norm_dx_kernel(const T *dy, const T *x, const T *w, const T *mean, const T *rstd,
                                     const T *dadd, T *dx, int64_t N, int64_t C) {
  __shared__ double sh[32];
  for (int64_t r = blockIdx.x; r < N; r += gridDim.x) {
    const T *xr = x + r * C, *gr = dy + r * C;
    T m = mean[r], s = rstd[r];
    double sg = 0, sgn = 0;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
      T g = gr[c] * (w ? w[c] : (T)1), n = (xr[c] - m) * s;
      sg += g;
      sgn += g * n;
    }
    T mg = (T)(lt_block_sum(sg, sh) / (double)C);
    T mgn = (T)(lt_block_sum(sgn, sh) / (double)C);
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
      T g = gr[c] * (w ? w[c] : (T)1), n = (xr[c] - m) * s;
      dx[r * C + c] = s * (g - mg - n * mgn) + (dadd ? dadd[r * C + c] : (T)0);
    }
  }
}

/* dw (and db) for LayerNorm (mean given) or RMSNorm (mean NULL): blocks of
   32 columns x 32 row stripes; each stripe sums its rows in order, then the
   stripes combine in a fixed tree (deterministic, reads coalesced). */
enum { DW_X = 32, DW_Y = 32 };
template <typename T>
__global__ void norm_dw_kernel(const T *dy, const T *x, const T *mean, const T *rstd, T *dw, T *db, int64_t N,
                               int64_t C) {
  __shared__ double sw[DW_Y][DW_X], sb[DW_Y][DW_X];
  int tx = threadIdx.x, ty = threadIdx.y;
  int64_t c = (int64_t)blockIdx.x * DW_X + tx;
  double aw = 0, ab = 0;
  if (c < C)
    for (int64_t r = ty; r < N; r += DW_Y) {
      T g = dy[r * C + c];
      aw += g * ((x[r * C + c] - (mean ? mean[r] : (T)0)) * rstd[r]);
      ab += g;
    }
  sw[ty][tx] = aw;
  sb[ty][tx] = ab;
  for (int s = DW_Y / 2; s > 0; s >>= 1) {
    __syncthreads();
    if (ty < s) {
      sw[ty][tx] += sw[ty + s][tx];
      sb[ty][tx] += sb[ty + s][tx];
    }
  }
  if (ty == 0 && c < C) {
    if (dw)
      dw[c] = (T)sw[0][tx];
    if (db)
      db[c] = (T)sb[0][tx];
  }
}

template <typename T>
__global__ void rms_norm_fwd_kernel(const T *x, const T *res, const T *w, T *y, T *h, T *rstd, int64_t N, int64_t C,
                                    double eps) {
  __shared__ double sh[32];
  for (int64_t r = blockIdx.x; r < N; r += gridDim.x) {
    const T *xr = residual_row(x, res, h, r, C);
    double ss = 0;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x)
      ss += (double)xr[c] * xr[c];
    ss = lt_block_sum(ss, sh);
    T s = (T)(1.0 / sqrt(ss / (double)C + eps));
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x)
      y[r * C + c] = xr[c] * s * (w ? w[c] : (T)1);
    if (threadIdx.x == 0)
      rstd[r] = s;
  }
}

template <typename T>
__global__ void rms_norm_dx_kernel(const T *dy, const T *x, const T *w, const T *rstd, const T *dadd, T *dx, int64_t N,
                                   int64_t C) {
  __shared__ double sh[32];
  for (int64_t r = blockIdx.x; r < N; r += gridDim.x) {
    const T *xr = x + r * C, *gr = dy + r * C;
    T s = rstd[r];
    double sgn = 0;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x)
      sgn += gr[c] * (w ? w[c] : (T)1) * xr[c] * s;
    T mgn = (T)(lt_block_sum(sgn, sh) / (double)C);
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
      T g = gr[c] * (w ? w[c] : (T)1), n = xr[c] * s;
      dx[r * C + c] = s * (g - n * mgn) + (dadd ? dadd[r * C + c] : (T)0);
    }
  }
}

/* ---- softmax ----------------------------------------------------------------- */

/* softmax of scale * x; under a causal mask of `causal` queries row r sees
   its first r % causal + C - causal + 1 entries (kernels/cpu/softmax.c) */
template <typename T>
__global__ void softmax_fwd_kernel(const T *x, T *y, int64_t N, int64_t C, int logsm, T scale, int64_t causal) {
  __shared__ double sh[32];
  const T ninf = -(T)INFINITY;
  for (int64_t r = blockIdx.x; r < N; r += gridDim.x) {
    const T *xr = x + r * C;
    T *yr = y + r * C;
    int64_t L = C;
    if (causal > 0) {
      L = r % causal + C - causal + 1;
      L = L < 0 ? 0 : (L > C ? C : L);
    }
    double mloc = -CUDART_INF;
    for (int64_t c = threadIdx.x; c < L; c += blockDim.x)
      mloc = fmax(mloc, (double)(xr[c] * scale));
    T m = (T)lt_block_max(mloc, sh);
    if (m == ninf) { /* all masked, or all NaN (the maximum skips NaN) */
      double nan = 0;
      for (int64_t c = threadIdx.x; c < L; c += blockDim.x)
        nan += xr[c] != xr[c];
      bool any_nan = lt_block_sum(nan, sh) > 0;
      for (int64_t c = threadIdx.x; c < C; c += blockDim.x)
        yr[c] = any_nan ? (T)NAN : logsm ? ninf : (T)0;
      continue;
    }
    double sum = 0;
    for (int64_t c = threadIdx.x; c < L; c += blockDim.x)
      sum += t_exp(xr[c] * scale - m);
    sum = lt_block_sum(sum, sh);
    if (logsm) {
      T lse = m + (T)log(sum);
      for (int64_t c = threadIdx.x; c < C; c += blockDim.x)
        yr[c] = c < L ? xr[c] * scale - lse : ninf;
    } else {
      T inv = (T)(1.0 / sum);
      for (int64_t c = threadIdx.x; c < C; c += blockDim.x)
        yr[c] = c < L ? t_exp(xr[c] * scale - m) * inv : (T)0;
    }
  }
}

template <typename T>
__global__ void softmax_bwd_kernel(const T *y, const T *dy, T *dx, int64_t N, int64_t C, int logsm, T scale) {
  __shared__ double sh[32];
  const T ninf = -(T)INFINITY;
  for (int64_t r = blockIdx.x; r < N; r += gridDim.x) {
    const T *yr = y + r * C, *gr = dy + r * C;
    T *xr = dx + r * C;
    if (logsm) {
      double live = 0; /* entries that are not -inf */
      for (int64_t c = threadIdx.x; c < C; c += blockDim.x)
        live += yr[c] != ninf;
      if (lt_block_sum(live, sh) == 0) {
        for (int64_t c = threadIdx.x; c < C; c += blockDim.x)
          xr[c] = 0;
        continue;
      }
      double s = 0;
      for (int64_t c = threadIdx.x; c < C; c += blockDim.x)
        s += gr[c];
      T st = (T)lt_block_sum(s, sh);
      for (int64_t c = threadIdx.x; c < C; c += blockDim.x)
        xr[c] = scale * (gr[c] - t_exp(yr[c]) * st);
    } else {
      double s = 0;
      for (int64_t c = threadIdx.x; c < C; c += blockDim.x)
        s += (double)gr[c] * yr[c];
      T st = (T)lt_block_sum(s, sh);
      for (int64_t c = threadIdx.x; c < C; c += blockDim.x)
        xr[c] = scale * yr[c] * (gr[c] - st);
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

template <typename T>
__global__ void ce_fwd_kernel(const T *x, const char *tgt, int tdt, int64_t N, int64_t V, int64_t ignore, T *loss,
                              T *lse, const unsigned long long *bad) {
  __shared__ double sh[32];
  if (*bad != ~0ULL)
    return;
  for (int64_t r = blockIdx.x; r < N; r += gridDim.x) {
    int64_t t = target_at(tgt, tdt, r);
    const T *xr = x + r * V;
    if (t == ignore) {
      if (threadIdx.x == 0)
        loss[r] = lse[r] = 0;
      continue;
    }
    double mloc = -CUDART_INF;
    for (int64_t c = threadIdx.x; c < V; c += blockDim.x)
      mloc = fmax(mloc, (double)xr[c]);
    T m = (T)lt_block_max(mloc, sh);
    double s = 0;
    for (int64_t c = threadIdx.x; c < V; c += blockDim.x)
      s += t_exp(xr[c] - m);
    s = lt_block_sum(s, sh);
    if (threadIdx.x == 0) {
      T l = m + (T)log(s);
      lse[r] = l;
      loss[r] = l - xr[t];
    }
  }
}

template <typename T>
__global__ void ce_bwd_kernel(const T *x, const char *tgt, int tdt, int64_t N, int64_t V, int64_t ignore,
                              const T *lse, const T *scale, T *dx) {
  for (int64_t r = blockIdx.x; r < N; r += gridDim.x) {
    int64_t t = target_at(tgt, tdt, r);
    const T *xr = x + r * V;
    T *dr = dx + r * V;
    if (t == ignore) {
      for (int64_t c = threadIdx.x; c < V; c += blockDim.x)
        dr[c] = 0;
      continue;
    }
    T l = lse[r], s = scale[r];
    for (int64_t c = threadIdx.x; c < V; c += blockDim.x)
      dr[c] = t_exp(xr[c] - l) * s - (c == t ? s : (T)0);
  }
}

/* ---- rope ---------------------------------------------------------------------- */

template <typename T>
__global__ void rope_kernel(const T *x, T *y, int64_t R, int64_t Tn, int64_t D, double base, int64_t start,
                            double sign) {
  int64_t h = D / 2;
  LT_GRID_STRIDE(e, R * Tn * h) {
    int64_t i = e % h, rt = e / h, t = rt % Tn;
    double ang = (double)(start + t) * pow(base, -2.0 * (double)i / (double)D);
    T c = (T)cos(ang), s = (T)(sign * sin(ang));
    const T *xr = x + rt * D;
    T *yr = y + rt * D;
    T a = xr[i], b = xr[i + h];
    yr[i] = a * c - b * s;
    yr[i + h] = b * c + a * s;
  }
}

/* ---- launchers ------------------------------------------------------------------ */


extern "C" lt_status lt_cuda_layer_norm_fwd(lt_dtype dt, const void *x, const void *res, const void *w, const void *b,
                                            void *y, void *h, void *mean, void *rstd, int64_t N, int64_t C, double eps,
                                            lt_cuda_stream s) {
  if (N == 0)
    return LT_OK;
  if (dt == LT_DTYPE_F64)
    layer_norm_fwd_kernel<double><<<rows_grid(N), THREADS, 0, (cudaStream_t)s>>>(
        (const double *)x, (const double *)res, (const double *)w, (const double *)b, (double *)y, (double *)h,
        (double *)mean, (double *)rstd, N, C, eps);
  else
    layer_norm_fwd_kernel<float><<<rows_grid(N), THREADS, 0, (cudaStream_t)s>>>(
        (const float *)x, (const float *)res, (const float *)w, (const float *)b, (float *)y, (float *)h,
        (float *)mean, (float *)rstd, N, C, eps);
  return lt_cuda_check_launch("layer_norm_fwd_kernel");
}

template <typename T>
static void layer_norm_bwd_launch(const void *dy, const void *x, const void *w, const void *mean, const void *rstd,
                                  const void *dadd, void *dx, void *dw, void *db, int64_t N, int64_t C,
                                  cudaStream_t cs) {
  if (dx)
    layer_norm_dx_kernel<T><<<rows_grid(N), THREADS, 0, cs>>>((const T *)dy, (const T *)x, (const T *)w,
                                                             (const T *)mean, (const T *)rstd, (const T *)dadd,
                                                             (T *)dx, N, C);
  if (dw || db)
    norm_dw_kernel<T><<<dw_grid(C), dim3(DW_X, DW_Y), 0, cs>>>((const T *)dy, (const T *)x, (const T *)mean,
                                                              (const T *)rstd, (T *)dw, (T *)db, N, C);
}

extern "C" lt_status lt_cuda_layer_norm_bwd(lt_dtype dt, const void *dy, const void *x, const void *w,
                                            const void *mean, const void *rstd, const void *dadd, void *dx, void *dw,
                                            void *db, int64_t N, int64_t C, lt_cuda_stream s) {
  if (N == 0)
    return LT_OK;
  if (dt == LT_DTYPE_F64)
    layer_norm_bwd_launch<double>(dy, x, w, mean, rstd, dadd, dx, dw, db, N, C, (cudaStream_t)s);
  else
    layer_norm_bwd_launch<float>(dy, x, w, mean, rstd, dadd, dx, dw, db, N, C, (cudaStream_t)s);
  return lt_cuda_check_launch("layer_norm backward");
}

extern "C" lt_status lt_cuda_rms_norm_fwd(lt_dtype dt, const void *x, const void *res, const void *w, void *y, void *h,
                                          void *rstd, int64_t N, int64_t C, double eps, lt_cuda_stream s) {
  if (N == 0)
    return LT_OK;
  if (dt == LT_DTYPE_F64)
    rms_norm_fwd_kernel<double><<<rows_grid(N), THREADS, 0, (cudaStream_t)s>>>(
        (const double *)x, (const double *)res, (const double *)w, (double *)y, (double *)h, (double *)rstd, N, C, eps);
  else
    rms_norm_fwd_kernel<float><<<rows_grid(N), THREADS, 0, (cudaStream_t)s>>>(
        (const float *)x, (const float *)res, (const float *)w, (float *)y, (float *)h, (float *)rstd, N, C, eps);
  return lt_cuda_check_launch("rms_norm_fwd_kernel");
}

template <typename T>
static void rms_norm_bwd_launch(const void *dy, const void *x, const void *w, const void *rstd, const void *dadd,
                                void *dx, void *dw, int64_t N, int64_t C, cudaStream_t cs) {
  if (dx)
    rms_norm_dx_kernel<T><<<rows_grid(N), THREADS, 0, cs>>>((const T *)dy, (const T *)x, (const T *)w,
                                                           (const T *)rstd, (const T *)dadd, (T *)dx, N, C);
  if (dw)
    norm_dw_kernel<T><<<dw_grid(C), dim3(DW_X, DW_Y), 0, cs>>>((const T *)dy, (const T *)x, NULL, (const T *)rstd,
                                                              (T *)dw, NULL, N, C);
}

extern "C" lt_status lt_cuda_rms_norm_bwd(lt_dtype dt, const void *dy, const void *x, const void *w, const void *rstd,
                                          const void *dadd, void *dx, void *dw, int64_t N, int64_t C, lt_cuda_stream s) {
  if (N == 0)
    return LT_OK;
  if (dt == LT_DTYPE_F64)
    rms_norm_bwd_launch<double>(dy, x, w, rstd, dadd, dx, dw, N, C, (cudaStream_t)s);
  else
    rms_norm_bwd_launch<float>(dy, x, w, rstd, dadd, dx, dw, N, C, (cudaStream_t)s);
  return lt_cuda_check_launch("rms_norm backward");
}

extern "C" lt_status lt_cuda_softmax_fwd(lt_dtype dt, const void *x, void *y, int64_t N, int64_t C, int logsm,
                                         double scale, int64_t causal, lt_cuda_stream s) {
  if (N == 0)
    return LT_OK;
  if (dt == LT_DTYPE_F64)
    softmax_fwd_kernel<double><<<rows_grid(N), THREADS, 0, (cudaStream_t)s>>>((const double *)x, (double *)y, N, C,
                                                                              logsm, scale, causal);
  else
    softmax_fwd_kernel<float><<<rows_grid(N), THREADS, 0, (cudaStream_t)s>>>((const float *)x, (float *)y, N, C, logsm,
                                                                             (float)scale, causal);
  return lt_cuda_check_launch("softmax_fwd_kernel");
}

extern "C" lt_status lt_cuda_softmax_bwd(lt_dtype dt, const void *y, const void *dy, void *dx, int64_t N, int64_t C,
                                         int logsm, double scale, lt_cuda_stream s) {
  if (N == 0)
    return LT_OK;
  if (dt == LT_DTYPE_F64)
    softmax_bwd_kernel<double><<<rows_grid(N), THREADS, 0, (cudaStream_t)s>>>((const double *)y, (const double *)dy,
                                                                              (double *)dx, N, C, logsm, scale);
  else
    softmax_bwd_kernel<float><<<rows_grid(N), THREADS, 0, (cudaStream_t)s>>>((const float *)y, (const float *)dy,
                                                                             (float *)dx, N, C, logsm, (float)scale);
  return lt_cuda_check_launch("softmax_bwd_kernel");
}

extern "C" lt_status lt_cuda_cross_entropy_fwd(lt_dtype dt, const void *x, const char *targets, lt_dtype tdt,
                                               int64_t N, int64_t V, int64_t ignore, void *loss, void *lse,
                                               unsigned long long *bad, lt_cuda_stream s) {
  if (N == 0)
    return LT_OK;
  cudaStream_t cs = (cudaStream_t)s;
  ce_check_kernel<<<lt_cuda_blocks(N, THREADS), THREADS, 0, cs>>>(targets, tdt, N, V, ignore, bad);
  lt_status st = lt_cuda_check_launch("cross_entropy check");
  if (st != LT_OK)
    return st;
  if (dt == LT_DTYPE_F64)
    ce_fwd_kernel<double><<<rows_grid(N), THREADS, 0, cs>>>((const double *)x, targets, tdt, N, V, ignore,
                                                            (double *)loss, (double *)lse, bad);
  else
    ce_fwd_kernel<float><<<rows_grid(N), THREADS, 0, cs>>>((const float *)x, targets, tdt, N, V, ignore,
                                                           (float *)loss, (float *)lse, bad);
  return lt_cuda_check_launch("ce_fwd_kernel");
}

extern "C" lt_status lt_cuda_cross_entropy_bwd(lt_dtype dt, const void *x, const char *targets, lt_dtype tdt,
                                               int64_t N, int64_t V, int64_t ignore, const void *lse,
                                               const void *scale, void *dx, lt_cuda_stream s) {
  if (N == 0)
    return LT_OK;
  if (dt == LT_DTYPE_F64)
    ce_bwd_kernel<double><<<rows_grid(N), THREADS, 0, (cudaStream_t)s>>>(
        (const double *)x, targets, tdt, N, V, ignore, (const double *)lse, (const double *)scale, (double *)dx);
  else
    ce_bwd_kernel<float><<<rows_grid(N), THREADS, 0, (cudaStream_t)s>>>(
        (const float *)x, targets, tdt, N, V, ignore, (const float *)lse, (const float *)scale, (float *)dx);
  return lt_cuda_check_launch("ce_bwd_kernel");
}

extern "C" lt_status lt_cuda_rope(lt_dtype dt, const void *x, void *y, int64_t R, int64_t Tn, int64_t D, double base,
                                  int64_t start, int inverse, lt_cuda_stream s) {
  int64_t n = R * Tn * (D / 2);
  if (n == 0)
    return LT_OK;
  double sign = inverse ? -1.0 : 1.0;
  if (dt == LT_DTYPE_F64)
    rope_kernel<double><<<lt_cuda_blocks(n, THREADS), THREADS, 0, (cudaStream_t)s>>>((const double *)x, (double *)y, R,
                                                                                     Tn, D, base, start, sign);
  else
    rope_kernel<float><<<lt_cuda_blocks(n, THREADS), THREADS, 0, (cudaStream_t)s>>>((const float *)x, (float *)y, R,
                                                                                    Tn, D, base, start, sign);
  return lt_cuda_check_launch("rope_kernel");
}
