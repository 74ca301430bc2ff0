/*
 * index.cu: index_select, index_add, gather and scatter_add on the GPU with
 * the CPU's rules (kernels/cpu/index.c): indices are 0-based i32 or i64 and
 * all are checked before anything is written: a check kernel records the
 * first bad position in *bad (device memory, all ones when none), and the
 * kernels that write into existing memory do nothing when it is set.
 * Adds are deterministic: index_add runs one thread per (outer, column)
 * walking the indices in order (what embedding backward needs), and
 * scatter_add runs in the CPU's order on one thread (a slow path: nothing on
 * the training path uses it).
 */
#include "common.cuh"

static const int THREADS = 256;
static const unsigned long long NONE = ~0ULL;

__device__ __forceinline__ int64_t index_at(const char *p, int dt, int64_t i) {
  return dt == LT_DTYPE_I32 ? (int64_t)((const int32_t *)p)[i] : ((const int64_t *)p)[i];
}

__global__ void check_1d_kernel(const char *index, int dt, int64_t stride, int64_t n, int64_t limit,
                                unsigned long long *bad) {
  LT_GRID_STRIDE(i, n) {
    int64_t v = index_at(index, dt, i * stride);
    if (v < 0 || v >= limit)
      atomicMin(bad, (unsigned long long)i);
  }
}

template <typename E>
__global__ void index_select_kernel(lt_index_desc d, E *dst, const E *src, const unsigned long long *bad) {
  if (*bad != NONE)
    return;
  int64_t total = d.outer * d.nindex * d.inner;
  LT_GRID_STRIDE(e, total) {
    int64_t c = e % d.inner, r = e / d.inner;
    int64_t o = r / d.nindex, i = r % d.nindex;
    int64_t v = index_at(d.index, d.index_dtype, i * d.index_stride);
    dst[e] = src[(o * d.src_dim + v) * d.inner + c];
  }
}

template <typename T> __global__ void index_add_kernel(lt_index_desc d, char *dst, const char *src, int dt,
                                                       const unsigned long long *bad) {
  if (*bad != NONE)
    return;
  LT_GRID_STRIDE(e, d.outer * d.inner) {
    int64_t o = e / d.inner, c = e % d.inner;
    for (int64_t i = 0; i < d.nindex; i++) {
      int64_t v = index_at(d.index, d.index_dtype, i * d.index_stride);
      int64_t to = (o * d.dst_dim + v) * d.inner + c, from = (o * d.nindex + i) * d.inner + c;
      T a = lt_load<T>(dst, dt, to), b = lt_load<T>(src, dt, from);
      lt_store<T>(dst, dt, to, (T)(a + b));
    }
  }
}

/* i64 adds wrap as the CPU's do */
template <> __global__ void index_add_kernel<int64_t>(lt_index_desc d, char *dst, const char *src, int dt,
                                                      const unsigned long long *bad) {
  if (*bad != NONE)
    return;
  LT_GRID_STRIDE(e, d.outer * d.inner) {
    int64_t o = e / d.inner, c = e % d.inner;
    for (int64_t i = 0; i < d.nindex; i++) {
      int64_t v = index_at(d.index, d.index_dtype, i * d.index_stride);
      int64_t to = (o * d.dst_dim + v) * d.inner + c, from = (o * d.nindex + i) * d.inner + c;
      uint64_t a = (uint64_t)lt_load<int64_t>(dst, dt, to), b = (uint64_t)lt_load<int64_t>(src, dt, from);
      lt_store<int64_t>(dst, dt, to, (int64_t)(a + b));
    }
  }
}

/* gather/scatter iterate the index's shape: operand 0 = out (gather) or src
   (scatter), 1 = index, 2 = t with a zero stride along dim. */
__global__ void check_iter_kernel(lt_iter it, int64_t dim_size, unsigned long long *bad) {
  LT_GRID_STRIDE(e, it.numel) {
    int64_t o[LT_ITER_MAX_OPS];
    lt_offsets(it, e, o);
    int64_t v = index_at(it.data[1], it.dtypes[1], o[1]);
    if (v < 0 || v >= dim_size)
      atomicMin(bad, (unsigned long long)e);
  }
}

template <typename E> __global__ void gather_kernel(lt_iter it, int64_t dim_stride, const unsigned long long *bad) {
  if (*bad != NONE)
    return;
  LT_GRID_STRIDE(e, it.numel) {
    int64_t o[LT_ITER_MAX_OPS];
    lt_offsets(it, e, o);
    int64_t v = index_at(it.data[1], it.dtypes[1], o[1]);
    ((E *)it.data[0])[o[0]] = ((const E *)it.data[2])[o[2] + v * dim_stride];
  }
}

__global__ void scatter_add_kernel(lt_iter it, int64_t dim_stride, const unsigned long long *bad) {
  if (*bad != NONE || threadIdx.x != 0 || blockIdx.x != 0)
    return;
  int tdt = it.dtypes[2], sdt = it.dtypes[0];
  bool integer = !(tdt == LT_DTYPE_F32 || tdt == LT_DTYPE_F64 || tdt == LT_DTYPE_BF16 || tdt == LT_DTYPE_F16);
  for (int64_t e = 0; e < it.numel; e++) {
    int64_t o[LT_ITER_MAX_OPS];
    lt_offsets(it, e, o);
    int64_t v = index_at(it.data[1], it.dtypes[1], o[1]);
    int64_t to = o[2] + v * dim_stride;
    if (integer) {
      uint64_t a = (uint64_t)lt_load<int64_t>(it.data[2], tdt, to), b = (uint64_t)lt_load<int64_t>(it.data[0], sdt, o[0]);
      lt_store<int64_t>(it.data[2], tdt, to, (int64_t)(a + b));
    } else {
      lt_store<double>(it.data[2], tdt, to, lt_load<double>(it.data[2], tdt, to) + lt_load<double>(it.data[0], sdt, o[0]));
    }
  }
}

static unsigned blocks(int64_t n) { return lt_cuda_blocks(n, THREADS); }

#define CHECKED(what)                      \
  do {                                     \
    lt_status st_ = lt_cuda_check_launch(what); \
    if (st_ != LT_OK)                      \
      return st_;                          \
  } while (0)

extern "C" lt_status lt_cuda_index_select(const lt_index_desc *d, char *dst, const char *src, int64_t elsize,
                                          unsigned long long *bad, lt_cuda_stream s) {
  cudaStream_t cs = (cudaStream_t)s;
  if (d->nindex > 0) {
    check_1d_kernel<<<blocks(d->nindex), THREADS, 0, cs>>>(d->index, d->index_dtype, d->index_stride, d->nindex,
                                                          d->src_dim, bad);
    CHECKED("index_select check");
  }
  int64_t total = d->outer * d->nindex * d->inner;
  if (total == 0)
    return LT_OK;
  switch (elsize) {
  case 8: index_select_kernel<uint64_t><<<blocks(total), THREADS, 0, cs>>>(*d, (uint64_t *)dst, (const uint64_t *)src, bad); break;
  case 4: index_select_kernel<uint32_t><<<blocks(total), THREADS, 0, cs>>>(*d, (uint32_t *)dst, (const uint32_t *)src, bad); break;
  case 2: index_select_kernel<uint16_t><<<blocks(total), THREADS, 0, cs>>>(*d, (uint16_t *)dst, (const uint16_t *)src, bad); break;
  default: index_select_kernel<uint8_t><<<blocks(total), THREADS, 0, cs>>>(*d, (uint8_t *)dst, (const uint8_t *)src, bad); break;
  }
  return lt_cuda_check_launch("index_select_kernel");
}

extern "C" lt_status lt_cuda_index_add(const lt_index_desc *d, char *dst, const char *src, lt_dtype dtype,
                                       unsigned long long *bad, lt_cuda_stream s) {
  cudaStream_t cs = (cudaStream_t)s;
  if (d->nindex == 0 || d->outer * d->inner == 0)
    return LT_OK;
  check_1d_kernel<<<blocks(d->nindex), THREADS, 0, cs>>>(d->index, d->index_dtype, d->index_stride, d->nindex,
                                                        d->dst_dim, bad);
  CHECKED("index_add check");
  unsigned g = blocks(d->outer * d->inner);
  if (dtype == LT_DTYPE_F64)
    index_add_kernel<double><<<g, THREADS, 0, cs>>>(*d, dst, src, dtype, bad);
  else if (dtype == LT_DTYPE_F32 || dtype == LT_DTYPE_BF16 || dtype == LT_DTYPE_F16)
    index_add_kernel<float><<<g, THREADS, 0, cs>>>(*d, dst, src, dtype, bad);
  else
    index_add_kernel<int64_t><<<g, THREADS, 0, cs>>>(*d, dst, src, dtype, bad);
  return lt_cuda_check_launch("index_add_kernel");
}

extern "C" lt_status lt_cuda_gather(const lt_iter *it, int64_t dim_stride, int64_t dim_size, unsigned long long *bad,
                                    lt_cuda_stream s) {
  cudaStream_t cs = (cudaStream_t)s;
  if (it->numel == 0)
    return LT_OK;
  check_iter_kernel<<<blocks(it->numel), THREADS, 0, cs>>>(*it, dim_size, bad);
  CHECKED("gather check");
  switch (lt_dtype_size(it->dtypes[0])) {
  case 8: gather_kernel<uint64_t><<<blocks(it->numel), THREADS, 0, cs>>>(*it, dim_stride, bad); break;
  case 4: gather_kernel<uint32_t><<<blocks(it->numel), THREADS, 0, cs>>>(*it, dim_stride, bad); break;
  case 2: gather_kernel<uint16_t><<<blocks(it->numel), THREADS, 0, cs>>>(*it, dim_stride, bad); break;
  default: gather_kernel<uint8_t><<<blocks(it->numel), THREADS, 0, cs>>>(*it, dim_stride, bad); break;
  }
  return lt_cuda_check_launch("gather_kernel");
}

extern "C" lt_status lt_cuda_scatter_add(const lt_iter *it, int64_t dim_stride, int64_t dim_size,
                                         unsigned long long *bad, lt_cuda_stream s) {
  cudaStream_t cs = (cudaStream_t)s;
  if (it->numel == 0)
    return LT_OK;
  check_iter_kernel<<<blocks(it->numel), THREADS, 0, cs>>>(*it, dim_size, bad);
  CHECKED("scatter_add check");
  scatter_add_kernel<<<1, 1, 0, cs>>>(*it, dim_stride, bad);
  return lt_cuda_check_launch("scatter_add_kernel");
}
