/*
 * optim.cu: AdamW and SGD updates and gradient sums of squares on the GPU,
 * with the formulas of kernels/cpu/optim.c (torch.optim's single-tensor
 * forms; 16-bit parameters update an f32 master copy and take its
 * rounding). One launch per parameter tensor for now: the multi-tensor
 * launch (one kernel for a whole group) is the CUDA issue's next step.
 * Sums of squares are deterministic: fixed blocks write partials that one
 * block per tensor adds in order.
 */
#include "common.cuh"

static const int THREADS = 256;
enum { MAX_PARTIALS = 1024 };

/* T: compute type (f32 or f64); dt: the parameter's dtype */
template <typename T>
__global__ void adamw_kernel(lt_optim_tensor t, lt_adamw_hparams h) {
  T b1 = (T)h.beta1, b2 = (T)h.beta2, eps = (T)h.eps, w1 = 1 - b1;
  T decay = (T)(1.0 - h.lr * h.weight_decay), step_size = (T)(h.lr / h.bias_correction1);
  T bc2_sqrt = (T)sqrt(h.bias_correction2);
  T *m = (T *)t.m, *v = (T *)t.v;
  bool half = t.master != NULL;
  LT_GRID_STRIDE(i, t.numel) {
    T g = lt_load<T>((const char *)t.grad, t.dtype, i);
    T p = half ? ((const float *)t.master)[i] : lt_load<T>((const char *)t.param, t.dtype, i);
    p *= decay;
    T mi = w1 < (T)0.5 ? m[i] + w1 * (g - m[i]) : g - (g - m[i]) * (1 - w1);
    T vi = b2 * v[i] + (1 - b2) * g * g;
    m[i] = mi;
    v[i] = vi;
    p -= step_size * mi / (sqrt(vi) / bc2_sqrt + eps);
    if (half)
      ((float *)t.master)[i] = (float)p;
    lt_store<T>((char *)t.param, t.dtype, i, p);
  }
}

template <typename T>
__global__ void sgd_kernel(lt_optim_tensor t, lt_sgd_hparams h) {
  T lr = (T)h.lr, mom = (T)h.momentum, damp = (T)(1.0 - h.dampening), wd = (T)h.weight_decay;
  T *buf = (T *)t.m;
  bool half = t.master != NULL;
  LT_GRID_STRIDE(i, t.numel) {
    T d = lt_load<T>((const char *)t.grad, t.dtype, i);
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

__global__ void sumsq_partial_kernel(lt_optim_tensor t, double *partials) {
  __shared__ double sh[32];
  double s = 0;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < t.numel; i += (int64_t)gridDim.x * blockDim.x) {
    double g = lt_load<double>((const char *)t.grad, t.dtype, i);
    s += g * g;
  }
  s = lt_block_sum(s, sh);
  if (threadIdx.x == 0)
    partials[blockIdx.x] = s;
}

__global__ void sumsq_final_kernel(const double *partials, int nparts, double *out) {
  if (threadIdx.x == 0 && blockIdx.x == 0) {
    double s = 0;
    for (int b = 0; b < nparts; b++)
      s += partials[b];
    *out = s;
  }
}

extern "C" lt_status lt_cuda_adamw(int n, const lt_optim_tensor *ts, const lt_adamw_hparams *h, lt_cuda_stream s) {
  for (int k = 0; k < n; k++) {
    if (ts[k].numel == 0)
      continue;
    unsigned g = lt_cuda_blocks(ts[k].numel, THREADS);
    if (ts[k].dtype == LT_DTYPE_F64)
      adamw_kernel<double><<<g, THREADS, 0, (cudaStream_t)s>>>(ts[k], *h);
    else
      adamw_kernel<float><<<g, THREADS, 0, (cudaStream_t)s>>>(ts[k], *h);
    lt_status st = lt_cuda_check_launch("adamw_kernel");
    if (st != LT_OK)
      return st;
  }
  return LT_OK;
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

extern "C" size_t lt_cuda_sum_squares_scratch(int n) { return (size_t)n * (MAX_PARTIALS + 1) * sizeof(double); }

extern "C" lt_status lt_cuda_grad_sum_squares(int n, const lt_optim_tensor *ts, double *scratch, double *out_host,
                                              lt_cuda_stream s) {
  cudaStream_t cs = (cudaStream_t)s;
  double *outs = scratch + (size_t)n * MAX_PARTIALS;
  for (int k = 0; k < n; k++) {
    int64_t blocks = (ts[k].numel + THREADS * 4 - 1) / (THREADS * 4);
    int nparts = (int)(blocks < 1 ? 1 : blocks > (int64_t)MAX_PARTIALS ? (int64_t)MAX_PARTIALS : blocks);
    double *parts = scratch + (size_t)k * MAX_PARTIALS;
    sumsq_partial_kernel<<<nparts, THREADS, 0, cs>>>(ts[k], parts);
    sumsq_final_kernel<<<1, 32, 0, cs>>>(parts, nparts, outs + k);
    lt_status st = lt_cuda_check_launch("sum of squares");
    if (st != LT_OK)
      return st;
  }
  cudaError_t e = cudaMemcpyAsync(out_host, outs, (size_t)n * sizeof(double), cudaMemcpyDeviceToHost, cs);
  if (e == cudaSuccess)
    e = cudaStreamSynchronize(cs);
  if (e != cudaSuccess)
    return lt_fail(LT_ERR_DEVICE, "cuda: reading gradient norms: %s", cudaGetErrorString(e));
  return LT_OK;
}
