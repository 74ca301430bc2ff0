/*
 * index.cu: index_select, index_add, gather and scatter_add on the GPU with
 * the CPU's rules (kernels/cpu/index.c): indices are 0-based i32 or i64 and
 * all are checked before anything is written: a check kernel records the
 * first bad position in *bad (device memory, all ones when none), and the
 * kernels that write into existing memory do nothing when it is set.
 * Adds are deterministic. index_add (embedding backward) sorts the indices
 * with CUB's stable radix sort, so each destination row's additions are
 * grouped in the indices' order; a block per group then adds its source
 * rows in that order, a thread per column (the CPU's order and, in f32, its
 * results). Without scratch memory, or for sizes past 32-bit keys, it runs
 * one thread per (outer, column) walking every index (slow: 768 threads for
 * GPT-2). scatter_add runs a thread per line (the elements that share all
 * coordinates but the scattered one, where duplicate indices meet), adding
 * its line in the CPU's order (slow for long lines: nothing on the training
 * path uses it).
 */
#include "common.cuh"

#include <cub/device/device_radix_sort.cuh>

static const int THREADS = 256;
static const unsigned long long NONE = ~0ULL;

__global__ void check_1d_kernel(const char *index, int dt, int64_t stride, int64_t n, int64_t limit,
                                unsigned long long *bad) {
  LT_GRID_STRIDE(i, n) {
    int64_t v = lt_index_at(index, dt, i * stride);
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
    int64_t v = lt_index_at(d.index, d.index_dtype, i * d.index_stride);
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
      int64_t v = lt_index_at(d.index, d.index_dtype, i * d.index_stride);
      int64_t to = (o * d.dst_dim + v) * d.inner + c, from = (o * d.nindex + i) * d.inner + c;
      T a = lt_load<T>(dst, dt, to), b = lt_load<T>(src, dt, from);
      lt_store<T>(dst, dt, to, (T)(a + b));
    }
  }
}

/* bad[1] = index[bad[0]] when bad[0] holds a position (for the message of
   a check read later, when the index may have changed) */
__global__ void index_value_kernel(const char *index, int dt, int64_t stride, unsigned long long *bad) {
  if (bad[0] != NONE)
    bad[1] = (unsigned long long)lt_index_at(index, dt, (int64_t)bad[0] * stride);
}

extern "C" lt_status lt_cuda_index_value(const char *index, lt_dtype dt, int64_t stride, unsigned long long *bad,
                                         lt_cuda_stream s) {
  index_value_kernel<<<1, 1, 0, (cudaStream_t)s>>>(index, dt, stride, bad);
  return lt_cuda_check_launch("index_value_kernel");
}

/* the sort's input: each index as a 32-bit key, its position as the value */
__global__ void sort_input_kernel(const char *index, int dt, int64_t stride, int64_t n, int32_t *keys,
                                  int32_t *pos) {
  LT_GRID_STRIDE(i, n) {
    keys[i] = (int32_t)lt_index_at(index, dt, i * stride);
    pos[i] = (int32_t)i;
  }
}

/* v as dtype dt stores it: each add rounds to the destination's dtype, as
   the unsorted kernel and the CPU's index_add do (bf16 sums differ otherwise) */
template <typename T> __device__ __forceinline__ T stored(int dt, T v) {
  if (dt == LT_DTYPE_BF16)
    return (T)__bfloat162float(__float2bfloat16_rn((float)v));
  if (dt == LT_DTYPE_F16)
    return (T)__half2float(__float2half_rn((float)v));
  return v;
}

/* Block (i, o): when sorted position i starts a run of equal keys, adds the
   run's source rows (outer slice o) into the key's destination row in the
   run's order, which the stable sort keeps as the indices' order. */
template <typename T>
__global__ void sorted_index_add_kernel(lt_index_desc d, char *dst, const char *src, int dt, const int32_t *keys,
                                        const int32_t *pos, const unsigned long long *bad) {
  if (*bad != NONE)
    return;
  int64_t i = blockIdx.x, o = blockIdx.y, n = d.nindex;
  int32_t v = keys[i];
  if (i > 0 && keys[i - 1] == v)
    return;
  int64_t end = i + 1;
  while (end < n && keys[end] == v)
    end++;
  for (int64_t c = threadIdx.x; c < d.inner; c += blockDim.x) {
    int64_t to = (o * d.dst_dim + v) * d.inner + c;
    T acc = lt_load<T>(dst, dt, to);
    int64_t j = i;
    for (; j + 4 <= end; j += 4) { /* four loads in flight, added in order */
      T a0 = lt_load<T>(src, dt, (o * d.nindex + pos[j]) * d.inner + c);
      T a1 = lt_load<T>(src, dt, (o * d.nindex + pos[j + 1]) * d.inner + c);
      T a2 = lt_load<T>(src, dt, (o * d.nindex + pos[j + 2]) * d.inner + c);
      T a3 = lt_load<T>(src, dt, (o * d.nindex + pos[j + 3]) * d.inner + c);
      acc = stored(dt, (T)(acc + a0));
      acc = stored(dt, (T)(acc + a1));
      acc = stored(dt, (T)(acc + a2));
      acc = stored(dt, (T)(acc + a3));
    }
    for (; j < end; j++)
      acc = stored(dt, (T)(acc + lt_load<T>(src, dt, (o * d.nindex + pos[j]) * d.inner + c)));
    lt_store<T>(dst, dt, to, acc);
  }
}

/* The sort's scratch: keys and positions, sorted copies, CUB's temporary
   storage; 0 when the sorted path does not apply. */
static size_t sort_bytes(int64_t n, int64_t dst_dim, size_t *cub_bytes) {
  if (n <= 0 || n > INT32_MAX || dst_dim > INT32_MAX)
    return 0;
  size_t tmp = 0;
  cub::DeviceRadixSort::SortPairs(NULL, tmp, (const int32_t *)NULL, (int32_t *)NULL, (const int32_t *)NULL,
                                  (int32_t *)NULL, (int)n);
  if (cub_bytes)
    *cub_bytes = tmp;
  return 4 * ((size_t)n * sizeof(int32_t) + 256) + tmp + 256;
}

extern "C" size_t lt_cuda_index_add_scratch(int64_t nindex, int64_t dst_dim, int64_t outer) {
  return outer <= 65535 ? sort_bytes(nindex, dst_dim, NULL) : 0;
}

/* i64 adds wrap as the CPU's do */
template <> __global__ void index_add_kernel<int64_t>(lt_index_desc d, char *dst, const char *src, int dt,
                                                      const unsigned long long *bad) {
  if (*bad != NONE)
    return;
  LT_GRID_STRIDE(e, d.outer * d.inner) {
    int64_t o = e / d.inner, c = e % d.inner;
    for (int64_t i = 0; i < d.nindex; i++) {
      int64_t v = lt_index_at(d.index, d.index_dtype, i * d.index_stride);
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
    int64_t v = lt_index_at(it.data[1], it.dtypes[1], o[1]);
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
    int64_t v = lt_index_at(it.data[1], it.dtypes[1], o[1]);
    ((E *)it.data[0])[o[0]] = ((const E *)it.data[2])[o[2] + v * dim_stride];
  }
}

/* One thread per line: a line is a choice of every iteration dim along
   which the target moves (outer); the thread adds the line's elements along
   the dims where it does not (inner: the scattered dim, where duplicate
   indices meet) in iteration order. Lines never share a target element, so
   the sums are those of one sequential pass, on any number of threads. */
__global__ void scatter_add_kernel(lt_iter outer, lt_iter inner, int64_t dim_stride,
                                   const unsigned long long *bad) {
  if (*bad != NONE)
    return;
  int tdt = inner.dtypes[2], sdt = inner.dtypes[0];
  bool integer = !(tdt == LT_DTYPE_F32 || tdt == LT_DTYPE_F64 || tdt == LT_DTYPE_BF16 || tdt == LT_DTYPE_F16);
  LT_GRID_STRIDE(line, outer.numel) {
    int64_t base[LT_ITER_MAX_OPS];
    lt_offsets(outer, line, base);
    for (int64_t e = 0; e < inner.numel; e++) {
      int64_t o[LT_ITER_MAX_OPS];
      lt_offsets(inner, e, o);
      int64_t v = lt_index_at(inner.data[1], inner.dtypes[1], base[1] + o[1]);
      int64_t to = base[2] + o[2] + v * dim_stride, from = base[0] + o[0];
      if (integer) {
        uint64_t a = (uint64_t)lt_load<int64_t>(inner.data[2], tdt, to),
                 b = (uint64_t)lt_load<int64_t>(inner.data[0], sdt, from);
        lt_store<int64_t>(inner.data[2], tdt, to, (int64_t)(a + b));
      } else {
        lt_store<double>(inner.data[2], tdt, to,
                         lt_load<double>(inner.data[2], tdt, to) + lt_load<double>(inner.data[0], sdt, from));
      }
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

static char *carve(char **p, size_t bytes) {
  char *r = *p;
  *p += (bytes + 255) / 256 * 256;
  return r;
}

extern "C" lt_status lt_cuda_index_add(const lt_index_desc *d, char *dst, const char *src, lt_dtype dtype,
                                       unsigned long long *bad, void *scratch, size_t scratch_bytes,
                                       lt_cuda_stream s) {
  cudaStream_t cs = (cudaStream_t)s;
  if (d->nindex == 0 || d->outer * d->inner == 0)
    return LT_OK;
  check_1d_kernel<<<blocks(d->nindex), THREADS, 0, cs>>>(d->index, d->index_dtype, d->index_stride, d->nindex,
                                                        d->dst_dim, bad);
  CHECKED("index_add check");
  size_t cub_bytes = 0, need = sort_bytes(d->nindex, d->dst_dim, &cub_bytes);
  if (need && scratch && scratch_bytes >= need && d->outer <= 65535 && dtype != LT_DTYPE_I64 &&
      dtype != LT_DTYPE_I32 && dtype != LT_DTYPE_I8 && dtype != LT_DTYPE_U8 && dtype != LT_DTYPE_U16 &&
      dtype != LT_DTYPE_BOOL) {
    size_t n = (size_t)d->nindex;
    char *p = (char *)scratch;
    int32_t *keys = (int32_t *)carve(&p, n * 4), *pos = (int32_t *)carve(&p, n * 4);
    int32_t *skeys = (int32_t *)carve(&p, n * 4), *spos = (int32_t *)carve(&p, n * 4);
    void *tmp = carve(&p, cub_bytes);
    int end_bit = 1;
    while (end_bit < 31 && ((int64_t)1 << end_bit) < d->dst_dim)
      end_bit++;
    sort_input_kernel<<<blocks(d->nindex), THREADS, 0, cs>>>(d->index, d->index_dtype, d->index_stride, d->nindex,
                                                            keys, pos);
    CHECKED("index_add sort input");
    cudaError_t e = cub::DeviceRadixSort::SortPairs(tmp, cub_bytes, keys, skeys, pos, spos, (int)n, 0, end_bit, cs);
    if (e != cudaSuccess) {
      cudaGetLastError();
      return lt_fail(LT_ERR_DEVICE, "cuda: index_add: sorting the indices failed: %s%s", cudaGetErrorString(e),
                     lt_cuda_note(e));
    }
    lt_cuda_mark("index_add sort (CUB)");
    dim3 grid((unsigned)n, (unsigned)d->outer);
    if (dtype == LT_DTYPE_F64)
      sorted_index_add_kernel<double><<<grid, THREADS, 0, cs>>>(*d, dst, src, dtype, skeys, spos, bad);
    else
      sorted_index_add_kernel<float><<<grid, THREADS, 0, cs>>>(*d, dst, src, dtype, skeys, spos, bad);
    return lt_cuda_check_launch("sorted_index_add_kernel");
  }
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
  /* the target's stride is 0 along the scattered dim (and only there) */
  lt_iter outer = *it, inner = *it;
  outer.ndim = inner.ndim = 0;
  outer.numel = inner.numel = 1;
  for (int d = 0; d < it->ndim; d++) {
    lt_iter *part = it->strides[2][d] == 0 ? &inner : &outer;
    part->shape[part->ndim] = it->shape[d];
    for (int k = 0; k < it->nops; k++)
      part->strides[k][part->ndim] = it->strides[k][d];
    part->ndim++;
    part->numel *= it->shape[d];
  }
  scatter_add_kernel<<<blocks(outer.numel), THREADS, 0, cs>>>(outer, inner, dim_stride, bad);
  return lt_cuda_check_launch("scatter_add_kernel");
}
