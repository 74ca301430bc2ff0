/*
 * optim.cu: AdamW and SGD updates and gradient sums of squares on the GPU,
 * with the formulas of kernels/cpu/optim.c (torch.optim's single-tensor
 * forms; 16-bit parameters update an f32 master copy and take its
 * rounding; each gradient is read times the step's grad_scale). AdamW
 * updates up to 48 tensors per launch (multi-tensor, as torch's fused
 * AdamW); SGD launches per tensor.
 * Sums of squares too go 48 tensors per launch, deterministic: each chunk's
 * block writes its sum, and one thread per tensor adds its chunks in order.
 */
#include "common.cuh"

#include <type_traits>

static const int THREADS = 256;

/* Multi-tensor launches: up to MT_MAX tensors in one kernel's arguments
   (under the 4 KiB parameter limit), each cut into chunks of CHUNK
   elements; block b updates chunk b - first[k] of the tensor k whose
   chunks it falls in. One launch per 48 tensors instead of one per tensor
   (GPT-2 has 148, most of them small biases and norm weights). */
enum { MT_MAX = 48, CHUNK = 8 * 256 };
struct mt_tensors {
  lt_optim_tensor t[MT_MAX];
  int64_t first[MT_MAX + 1]; /* first[k]: tensor k's first block; first[n]: the blocks in all */
  int n;
};

/* the tensor whose chunks block b falls in, and the chunk's element range */
__device__ __forceinline__ int mt_find(const mt_tensors &a, int64_t b, int64_t *lo, int64_t *hi) {
  int k = 0;
  while (k + 1 < a.n && a.first[k + 1] <= b)
    k++;
  *lo = (b - a.first[k]) * CHUNK;
  int64_t end = *lo + CHUNK;
  *hi = end < a.t[k].numel ? end : a.t[k].numel;
  return k;
}

/* AdamW's constants for one step, in the compute type T */
template <typename T> struct adamw_consts {
  T b1, b2, eps, w1, decay, step_size, bc2_sqrt, grad_scale;
  __device__ explicit adamw_consts(const lt_adamw_hparams &h)
      : b1((T)h.beta1), b2((T)h.beta2), eps((T)h.eps), w1(1 - (T)h.beta1), decay((T)(1.0 - h.lr * h.weight_decay)),
        step_size((T)(h.lr / h.bias_correction1)), bc2_sqrt((T)sqrt(h.bias_correction2)),
        grad_scale((T)h.grad_scale) {}
};

/* One element's update: p (the parameter, or its f32 master), m and v from
   the gradient g times the step's grad_scale (torch.optim.AdamW's
   single-tensor form) */
template <typename T>
__device__ __forceinline__ void adamw_one(const adamw_consts<T> &c, T g, T &p, T &m, T &v) {
  g *= c.grad_scale;
  p *= c.decay;
  m = LT_LERP(T, m, g, c.w1); /* torch.lerp (shared/scalar.h) */
  v = c.b2 * v + (1 - c.b2) * g * g;
  p -= c.step_size * m / (sqrt(v) / c.bc2_sqrt + c.eps);
}

/* T: compute type (f32 or f64); dt: the parameter's dtype */
template <typename T>
__device__ __forceinline__ void adamw_elems(const lt_optim_tensor &t, const adamw_consts<T> &c, int64_t lo,
                                            int64_t hi, int64_t stride) {
  T *m = (T *)t.m, *v = (T *)t.v;
  bool half = t.master != NULL;
  for (int64_t i = lo; i < hi; i += stride) {
    T g = lt_load<T>((const char *)t.grad, t.dtype, i);
    T p = half ? ((const float *)t.master)[i] : lt_load<T>((const char *)t.param, t.dtype, i);
    T mi = m[i], vi = v[i];
    adamw_one(c, g, p, mi, vi);
    m[i] = mi;
    v[i] = vi;
    if (half)
      ((float *)t.master)[i] = (float)p;
    lt_store<T>((char *)t.param, t.dtype, i, p);
  }
}

/* Four 16-bit values (8 bytes) or f32 values (16 bytes): one wide load or
   store, the elements read and written through lt_ld and lt_st */
template <typename E> struct quad {
  typedef typename std::conditional<sizeof(E) == 2, uint2, uint4>::type raw_t;
  union {
    raw_t raw;
    E e[4];
  };
};
/* adamw_elems over elements lo..hi (lo a multiple of 4) four at a time, for
   E-typed parameters and gradients whose arrays all allow it (quads_ok):
   one wide load or store per array instead of four */
template <typename E>
__device__ __forceinline__ void adamw_quads(const lt_optim_tensor &t, const adamw_consts<float> &c, int64_t lo,
                                            int64_t hi, int64_t stride) {
  typedef quad<E> Q;
  bool half = t.master != NULL;
  int64_t q0 = lo / 4 + threadIdx.x, q1 = hi / 4;
  for (int64_t q = q0; q < q1; q += stride) {
    Q g, p;
    quad<float> m, v, w;
    g.raw = ((const typename Q::raw_t *)t.grad)[q];
    m.raw = ((const uint4 *)t.m)[q];
    v.raw = ((const uint4 *)t.v)[q];
    if (half)
      w.raw = ((const uint4 *)t.master)[q];
    else
      p.raw = ((const typename Q::raw_t *)t.param)[q];
#pragma unroll
    for (int j = 0; j < 4; j++) {
      float pj = half ? w.e[j] : lt_ld(p.e, j);
      adamw_one(c, lt_ld(g.e, j), pj, m.e[j], v.e[j]);
      w.e[j] = pj;
      lt_st(p.e, j, pj);
    }
    ((uint4 *)t.m)[q] = m.raw;
    ((uint4 *)t.v)[q] = v.raw;
    if (half)
      ((uint4 *)t.master)[q] = w.raw;
    ((typename Q::raw_t *)t.param)[q] = p.raw;
  }
  adamw_elems<float>(t, c, q1 * 4 + threadIdx.x, hi, stride); /* (the tail past the last quad) */
}

/* whether every array of t allows four elements at a time: f32, bf16 or
   f16 parameters, m, v and the master 16-byte aligned, the parameter and
   its gradient aligned to four of their elements */
__device__ __forceinline__ bool quads_ok(const lt_optim_tensor &t) {
  int es = t.dtype == LT_DTYPE_F32 ? 4 : t.dtype == LT_DTYPE_BF16 || t.dtype == LT_DTYPE_F16 ? 2 : 0;
  uintptr_t wide = (uintptr_t)t.m | (uintptr_t)t.v | (uintptr_t)t.master;
  return es && (es == 4 || t.master) && wide % 16 == 0 && ((uintptr_t)t.param | (uintptr_t)t.grad) % (4 * es) == 0;
}

template <typename T> __global__ void adamw_mt_kernel(mt_tensors a, lt_adamw_hparams h) {
  int64_t lo, hi;
  int k = mt_find(a, blockIdx.x, &lo, &hi);
  const lt_optim_tensor &t = a.t[k];
  adamw_consts<T> c(h);
  if constexpr (sizeof(T) == 4) {
    if (quads_ok(t)) {
      if (t.dtype == LT_DTYPE_F32)
        adamw_quads<float>(t, c, lo, hi, blockDim.x);
      else if (t.dtype == LT_DTYPE_BF16)
        adamw_quads<__nv_bfloat16>(t, c, lo, hi, blockDim.x);
      else
        adamw_quads<__half>(t, c, lo, hi, blockDim.x);
      return;
    }
  }
  adamw_elems<T>(t, c, lo + threadIdx.x, hi, blockDim.x);
}

template <typename T>
__global__ void sgd_kernel(lt_optim_tensor t, lt_sgd_hparams h) {
  T lr = (T)h.lr, mom = (T)h.momentum, damp = (T)(1.0 - h.dampening), wd = (T)h.weight_decay;
  T gs = (T)h.grad_scale;
  T *buf = (T *)t.m;
  bool half = t.master != NULL;
  LT_GRID_STRIDE(i, t.numel) {
    T d = lt_load<T>((const char *)t.grad, t.dtype, i) * gs;
    T p = half ? ((const float *)t.master)[i] : lt_load<T>((const char *)t.param, t.dtype, i);
    if (wd != 0)
      d += wd * p;
    if (buf) {
      T b = h.first_step ? d : mom * buf[i] + damp * d;
      buf[i] = b;
      d = h.nesterov ? d + mom * b : b;
    }
    p -= lr * d;
    if (half)
      ((float *)t.master)[i] = (float)p;
    lt_store<T>((char *)t.param, t.dtype, i, p);
  }
}

/* sums of squares, multi-tensor: each block writes its chunk's sum (f64),
   then one thread per tensor adds its chunks in order (deterministic) */
__global__ void sumsq_mt_kernel(mt_tensors a, double *partials) {
  __shared__ double sh[32];
  int64_t lo, hi;
  int k = mt_find(a, blockIdx.x, &lo, &hi);
  double s = 0;
  for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
    double g = lt_load<double>((const char *)a.t[k].grad, a.t[k].dtype, i);
    s += g * g;
  }
  s = lt_block_sum(s, sh);
  if (threadIdx.x == 0)
    partials[blockIdx.x] = s;
}

__global__ void sumsq_mt_final_kernel(mt_tensors a, const double *partials, double *outs) {
  int k = blockIdx.x * blockDim.x + threadIdx.x;
  if (k >= a.n)
    return;
  double s = 0;
  for (int64_t b = a.first[k]; b < a.first[k + 1]; b++)
    s += partials[b];
  outs[k] = s;
}

/* Launches the AdamW update for the tensors of ts whose compute type is T
   (f64 parameters in f64, the rest in f32), MT_MAX at a time. */
template <typename T>
static lt_status adamw_launch(int n, const lt_optim_tensor *ts, const lt_adamw_hparams *h, cudaStream_t cs) {
  mt_tensors a;
  a.n = 0;
  a.first[0] = 0;
  for (int k = 0; k <= n; k++) {
    int flush = k == n || a.n == MT_MAX;
    if (flush && a.n > 0) {
      int64_t blocks = a.first[a.n];
      if (blocks > (int64_t)INT32_MAX) /* (2^31 chunks of 2048: no parameter list comes near) */
        return lt_fail(LT_ERR_UNSUPPORTED, "cuda: adamw: %lld blocks in one launch", (long long)blocks);
      adamw_mt_kernel<T><<<(unsigned)blocks, THREADS, 0, cs>>>(a, *h);
      lt_status st = lt_cuda_check_launch("adamw_mt_kernel");
      if (st != LT_OK)
        return st;
      a.n = 0;
    }
    if (k == n)
      break;
    int is64 = ts[k].dtype == LT_DTYPE_F64;
    if (ts[k].numel == 0 || is64 != (sizeof(T) == 8))
      continue;
    a.t[a.n] = ts[k];
    a.first[a.n + 1] = a.first[a.n] + (ts[k].numel + CHUNK - 1) / CHUNK;
    a.n++;
  }
  return LT_OK;
}

extern "C" lt_status lt_cuda_adamw(int n, const lt_optim_tensor *ts, const lt_adamw_hparams *h, lt_cuda_stream s) {
  lt_status st = adamw_launch<float>(n, ts, h, (cudaStream_t)s);
  if (st == LT_OK)
    st = adamw_launch<double>(n, ts, h, (cudaStream_t)s);
  return st;
}

extern "C" lt_status lt_cuda_sgd(int n, const lt_optim_tensor *ts, const lt_sgd_hparams *h, lt_cuda_stream s) {
  for (int k = 0; k < n; k++) {
    if (ts[k].numel == 0)
      continue;
    unsigned g = lt_cuda_blocks(ts[k].numel, THREADS);
    if (ts[k].dtype == LT_DTYPE_F64)
      sgd_kernel<double><<<g, THREADS, 0, (cudaStream_t)s>>>(ts[k], *h);
    else
      sgd_kernel<float><<<g, THREADS, 0, (cudaStream_t)s>>>(ts[k], *h);
    lt_status st = lt_cuda_check_launch("sgd_kernel");
    if (st != LT_OK)
      return st;
  }
  return LT_OK;
}

/* chunks of every tensor, and one slot per tensor */
extern "C" size_t lt_cuda_sum_squares_scratch(int n, const lt_optim_tensor *ts) {
  size_t chunks = 0;
  for (int k = 0; k < n; k++)
    chunks += (size_t)((ts[k].numel + CHUNK - 1) / CHUNK);
  return (chunks + (size_t)n + 1) * sizeof(double);
}

extern "C" lt_status lt_cuda_grad_sum_squares(int n, const lt_optim_tensor *ts, double *scratch, double *out_host,
                                              lt_cuda_stream s) {
  cudaStream_t cs = (cudaStream_t)s;
  double *outs = scratch, *partials = scratch + n;
  mt_tensors a;
  int base = 0; /* the first tensor of the batch */
  for (int k = 0; k <= n; k++) {
    if (k == n || k - base == MT_MAX) {
      a.n = k - base;
      a.first[0] = 0;
      for (int j = 0; j < a.n; j++) {
        a.t[j] = ts[base + j];
        a.first[j + 1] = a.first[j] + (ts[base + j].numel + CHUNK - 1) / CHUNK;
      }
      int64_t blocks = a.first[a.n];
      if (blocks > (int64_t)INT32_MAX)
        return lt_fail(LT_ERR_UNSUPPORTED, "cuda: gradient norm: %lld blocks in one launch", (long long)blocks);
      if (a.n > 0) {
        if (blocks > 0)
          sumsq_mt_kernel<<<(unsigned)blocks, THREADS, 0, cs>>>(a, partials);
        sumsq_mt_final_kernel<<<(a.n + 63) / 64, 64, 0, cs>>>(a, partials, outs + base);
        lt_status st = lt_cuda_check_launch("sum of squares");
        if (st != LT_OK)
          return st;
        partials += blocks;
      }
      base = k;
    }
  }
  cudaError_t e = cudaMemcpyAsync(out_host, outs, (size_t)n * sizeof(double), cudaMemcpyDeviceToHost, cs);
  if (e == cudaSuccess)
    e = cudaStreamSynchronize(cs);
  if (e != cudaSuccess) {
    cudaGetLastError(); /* (reported here: not again by the next launch's check) */
    return lt_fail(LT_ERR_DEVICE, "cuda: reading gradient norms: %s%s", cudaGetErrorString(e), lt_cuda_note(e));
  }
  return LT_OK;
}
