/*
 * reduce.cu: sum, mean, max, min, argmax, argmin, var and std over the
 * reduced dims of an lt_reduce_iter, with the CPU's rules (kernels/cpu/
 * reduce.c): floats accumulate in f64 and integers in i64; max/min take the
 * first NaN; ties go to the lowest position; var is two-pass (mean first).
 * Wide reductions run a block per output, or per 32 outputs that lie side
 * by side in memory (column sums such as bias gradients), folding in a
 * fixed tree so results do not vary from run to run; narrow ones run one
 * thread per output.
 */
#include "common.cuh"

#include <math.h>
#include <math_constants.h>

static const int THREADS = 256;

struct partial {
  double sum;   /* SUM/MEAN of floats; VAR: squared deviations */
  int64_t isum; /* SUM of integers */
  double val;   /* MAX/MIN/ARG* of floats */
  int64_t ival; /* MAX/MIN/ARG* of integers */
  int64_t idx;  /* ARG*: position in the reduced extent */
  int has;
};

__device__ __forceinline__ bool is_max(int op) { return op == LT_REDUCE_MAX || op == LT_REDUCE_ARGMAX; }

/* Whether partial p should replace acc for max/min (first NaN, then lowest position on ties). */
__device__ __forceinline__ bool better(int op, bool integer, const partial &p, const partial &acc) {
  if (!p.has)
    return false;
  if (!acc.has)
    return true;
  bool mx = is_max(op);
  if (integer) {
    if (p.ival == acc.ival)
      return p.idx < acc.idx;
    return mx ? p.ival > acc.ival : p.ival < acc.ival;
  }
  bool pn = p.val != p.val, an = acc.val != acc.val;
  if (pn || an)
    return pn && (!an || p.idx < acc.idx);
  if (p.val == acc.val)
    return p.idx < acc.idx;
  return mx ? p.val > acc.val : p.val < acc.val;
}

__device__ __forceinline__ void combine(int op, bool integer, partial &acc, const partial &p) {
  if (op == LT_REDUCE_SUM || op == LT_REDUCE_MEAN || op == LT_REDUCE_VAR) {
    acc.sum += p.sum;
    acc.isum = (int64_t)((uint64_t)acc.isum + (uint64_t)p.isum);
  } else if (better(op, integer, p, acc)) {
    acc = p;
  }
}

/* Element offset (in the input) of reduced position r, relative to the output's base. */
__device__ __forceinline__ int64_t red_offset(const lt_reduce_iter &it, int64_t r) {
  if (it.nred == 1)
    return r * it.in_red_strides[0];
  int64_t off = 0;
  for (int d = it.nred - 1; d >= 0; d--) {
    off += (r % it.red_shape[d]) * it.in_red_strides[d];
    r /= it.red_shape[d];
  }
  return off;
}

/* Folds reduced positions r0, r0+step, ... into p. */
__device__ void accumulate(int op, const lt_reduce_iter &it, int64_t base, int64_t r0, int64_t step, bool integer,
                           double mean, partial &p) {
  p.sum = 0;
  p.isum = 0;
  p.val = 0;
  p.ival = 0;
  p.idx = 0;
  p.has = 0;
  for (int64_t r = r0; r < it.red_numel; r += step) {
    int64_t off = base + red_offset(it, r);
    partial q = {};
    if (op == LT_REDUCE_SUM || op == LT_REDUCE_MEAN) {
      if (integer)
        p.isum = (int64_t)((uint64_t)p.isum + (uint64_t)lt_load<int64_t>(it.in, it.in_dtype, off));
      else
        p.sum += lt_load<double>(it.in, it.in_dtype, off);
      continue;
    }
    if (op == LT_REDUCE_VAR) {
      double d = lt_load<double>(it.in, it.in_dtype, off) - mean;
      p.sum += d * d;
      continue;
    }
    q.has = 1;
    q.idx = r;
    if (integer)
      q.ival = lt_load<int64_t>(it.in, it.in_dtype, off);
    else
      q.val = lt_load<double>(it.in, it.in_dtype, off);
    if (better(op, integer, q, p)) {
      p.val = q.val;
      p.ival = q.ival;
      p.idx = q.idx;
      p.has = 1;
    }
  }
}

/* Reduces column x of the block's partials (sh[y * X + x]) into sh[x], in a fixed tree over y. */
__device__ void block_combine(int op, bool integer, partial *sh) {
  int X = blockDim.x, x = threadIdx.x, y = threadIdx.y;
  for (int s = blockDim.y / 2; s > 0; s >>= 1) {
    __syncthreads();
    if (y < s)
      combine(op, integer, sh[y * X + x], sh[(y + s) * X + x]);
  }
  __syncthreads();
}

__device__ void out_offsets(const lt_reduce_iter &it, int64_t o, int64_t *in_off, int64_t *out_off) {
  *in_off = 0;
  *out_off = 0;
  for (int d = it.nkeep - 1; d >= 0; d--) {
    int64_t i = o % it.keep_shape[d];
    o /= it.keep_shape[d];
    *in_off += i * it.in_keep_strides[d];
    *out_off += i * it.out_strides[d];
  }
}

__device__ void finish(int op, const lt_reduce_iter &it, int64_t out_off, bool integer, const partial &acc,
                       double var_sum, int64_t correction) {
  int64_t R = it.red_numel;
  switch (op) {
  case LT_REDUCE_SUM:
    if (integer)
      lt_store<int64_t>(it.out, it.out_dtype, out_off, acc.isum);
    else
      lt_store<double>(it.out, it.out_dtype, out_off, acc.sum);
    break;
  case LT_REDUCE_MEAN: lt_store<double>(it.out, it.out_dtype, out_off, acc.sum / (double)R); break;
  case LT_REDUCE_VAR:
  case LT_REDUCE_STD: {
    double denom = (double)(R - correction);
    double v = denom > 0 ? var_sum / denom : CUDART_NAN;
    lt_store<double>(it.out, it.out_dtype, out_off, op == LT_REDUCE_STD ? sqrt(v) : v);
    break;
  }
  case LT_REDUCE_MAX:
  case LT_REDUCE_MIN:
    if (integer)
      lt_store<int64_t>(it.out, it.out_dtype, out_off, acc.ival);
    else
      lt_store<double>(it.out, it.out_dtype, out_off, acc.val);
    break;
  default: lt_store<int64_t>(it.out, it.out_dtype, out_off, acc.idx); break;
  }
}

/* blockDim (X, Y): X consecutive outputs per block (coalesced reads when the
   input's innermost kept dim is contiguous), Y threads folding each one. */
__global__ void reduce_block_kernel(lt_reduce_iter it, int op, int64_t correction, bool integer) {
  __shared__ partial sh[THREADS];
  bool var = op == LT_REDUCE_VAR || op == LT_REDUCE_STD;
  int first = var ? LT_REDUCE_SUM : op;
  int X = blockDim.x, x = threadIdx.x, y = threadIdx.y;
  partial *mine = &sh[y * X + x];
  for (int64_t o0 = (int64_t)blockIdx.x * X; o0 < it.out_numel; o0 += (int64_t)gridDim.x * X) {
    int64_t o = o0 + x;
    bool live = o < it.out_numel;
    int64_t in_off = 0, out_off = 0;
    if (live)
      out_offsets(it, o, &in_off, &out_off);
    accumulate(first, it, in_off, live ? y : it.red_numel, blockDim.y, integer, 0, *mine);
    block_combine(first, integer, sh);
    partial acc = sh[x];
    double var_sum = 0;
    if (var) {
      double mean = acc.sum / (double)it.red_numel;
      __syncthreads();
      accumulate(LT_REDUCE_VAR, it, in_off, live ? y : it.red_numel, blockDim.y, integer, mean, *mine);
      block_combine(LT_REDUCE_VAR, integer, sh);
      var_sum = sh[x].sum;
    }
    if (y == 0 && live)
      finish(op, it, out_off, integer, acc, var_sum, correction);
    __syncthreads();
  }
}

__global__ void reduce_thread_kernel(lt_reduce_iter it, int op, int64_t correction, bool integer) {
  bool var = op == LT_REDUCE_VAR || op == LT_REDUCE_STD;
  LT_GRID_STRIDE(o, it.out_numel) {
    int64_t in_off, out_off;
    out_offsets(it, o, &in_off, &out_off);
    partial acc;
    accumulate(var ? LT_REDUCE_SUM : op, it, in_off, 0, 1, integer, 0, acc);
    double var_sum = 0;
    if (var) {
      partial v;
      accumulate(LT_REDUCE_VAR, it, in_off, 0, 1, integer, acc.sum / (double)it.red_numel, v);
      var_sum = v.sum;
    }
    finish(op, it, out_off, integer, acc, var_sum, correction);
  }
}

extern "C" lt_status lt_cuda_reduce(lt_reduce_op op, const lt_reduce_iter *it, int64_t correction,
                                    lt_cuda_stream s) {
  if (it->out_numel == 0)
    return LT_OK;
  bool integer = !(it->in_dtype == LT_DTYPE_F32 || it->in_dtype == LT_DTYPE_F64 || it->in_dtype == LT_DTYPE_BF16 ||
                   it->in_dtype == LT_DTYPE_F16);
  if (it->red_numel < 64 || it->out_numel >= 65536LL * 4) {
    reduce_thread_kernel<<<lt_cuda_blocks(it->out_numel, THREADS), THREADS, 0, (cudaStream_t)s>>>(*it, (int)op,
                                                                                                   correction, integer);
    return lt_cuda_check_launch("reduce_thread_kernel");
  }
  /* outputs side by side in memory: 32 per block, 8 threads on each; else one output per block */
  bool side_by_side = it->nkeep > 0 && it->in_keep_strides[it->nkeep - 1] == 1 && it->out_numel >= 32;
  dim3 block = side_by_side ? dim3(32, THREADS / 32) : dim3(1, THREADS);
  int64_t groups = (it->out_numel + block.x - 1) / block.x;
  unsigned grid = (unsigned)(groups < 65535LL * 32 ? groups : 65535LL * 32);
  reduce_block_kernel<<<grid, block, 0, (cudaStream_t)s>>>(*it, (int)op, correction, integer);
  return lt_cuda_check_launch("reduce_block_kernel");
}
