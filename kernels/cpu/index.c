/*
 * index.c: index_select, index_add, gather and scatter_add on the CPU. Index
 * arrays hold 0-based i32 or i64 positions; every index is checked before it
 * is used, and a bad one stops the kernel with its position in *bad. Adds run
 * in index order so results are deterministic (embedding backward relies on
 * it); threads split the independent dims instead.
 */
#include "cpu.h"

#include <omp.h>
#include <string.h>

/* Checks every index of a 1-D index array against [0, limit). */
static int64_t first_bad(const lt_index_desc *d, int64_t limit) {
  for (int64_t i = 0; i < d->nindex; i++) {
    int64_t v = lt_cpu_index_at(d->index, d->index_dtype, d->index_stride, i);
    if (v < 0 || v >= limit)
      return i;
  }
  return -1;
}

lt_status lt_cpu_index_select(const lt_index_desc *d, char *dst, const char *src, int64_t elsize,
                              int64_t *bad) {
  if ((*bad = first_bad(d, d->src_dim)) >= 0)
    return LT_ERR_ARG;
  int64_t rows = d->outer * d->nindex, rowbytes = d->inner * elsize;
#pragma omp parallel for schedule(static) if (rows * d->inner >= LT_CPU_PARALLEL_MIN)
  for (int64_t r = 0; r < rows; r++) {
    int64_t o = r / d->nindex, i = r % d->nindex;
    int64_t v = lt_cpu_index_at(d->index, d->index_dtype, d->index_stride, i);
    memcpy(dst + r * rowbytes, src + (o * d->src_dim + v) * rowbytes, (size_t)rowbytes);
  }
  return LT_OK;
}

lt_status lt_cpu_index_add(const lt_index_desc *d, char *dst, const char *src, lt_dtype dtype,
                           int64_t *bad) {
  if ((*bad = first_bad(d, d->dst_dim)) >= 0)
    return LT_ERR_ARG;
  lt_compute ck = dtype == LT_DTYPE_F64 ? LT_COMPUTE_F64
                  : lt_dtype_is_float(dtype) ? LT_COMPUTE_F32 : LT_COMPUTE_I64;
  int64_t es = lt_dtype_size(dtype);
  /* threads own (outer, column-chunk) pairs; each walks the indices in order */
  int64_t nchunks = (d->inner + LT_CPU_CHUNK - 1) / LT_CPU_CHUNK;
  int64_t jobs = d->outer * nchunks;
#pragma omp parallel for schedule(static) if (d->outer * d->inner * d->nindex >= LT_CPU_PARALLEL_MIN)
  for (int64_t job = 0; job < jobs; job++) {
    int64_t o = job / nchunks, c0 = (job % nchunks) * LT_CPU_CHUNK;
    int64_t n = d->inner - c0 < LT_CPU_CHUNK ? d->inner - c0 : LT_CPU_CHUNK;
    union {
      float f32[LT_CPU_CHUNK];
      double f64[LT_CPU_CHUNK];
      int64_t i64[LT_CPU_CHUNK];
    } acc, add;
    for (int64_t i = 0; i < d->nindex; i++) {
      int64_t v = lt_cpu_index_at(d->index, d->index_dtype, d->index_stride, i);
      char *drow = dst + ((o * d->dst_dim + v) * d->inner + c0) * es;
      const char *srow = src + ((o * d->nindex + i) * d->inner + c0) * es;
      lt_cpu_load(ck, &acc, drow, dtype, 1, n);
      lt_cpu_load(ck, &add, srow, dtype, 1, n);
      if (ck == LT_COMPUTE_F32)
        for (int64_t j = 0; j < n; j++) acc.f32[j] += add.f32[j];
      else if (ck == LT_COMPUTE_F64)
        for (int64_t j = 0; j < n; j++) acc.f64[j] += add.f64[j];
      else
        for (int64_t j = 0; j < n; j++)
          acc.i64[j] = (int64_t)((uint64_t)acc.i64[j] + (uint64_t)add.i64[j]);
      lt_cpu_store(ck, drow, dtype, 1, &acc, n);
    }
  }
  return LT_OK;
}

/*
 * gather/scatter_add iterate over the index's shape with three operands:
 * 0 = out (gather) or src (scatter), 1 = index, 2 = t with a zero stride along
 * the indexed dim; dim_stride_t is t's real stride there.
 */
static int64_t scan_bad(const lt_iter *it, int64_t dim_size) {
  int64_t inner = it->ndim ? it->shape[it->ndim - 1] : 1;
  int64_t rows = it->numel / inner, is = it->ndim ? it->strides[1][it->ndim - 1] : 1;
  for (int64_t r = 0; r < rows; r++) {
    int64_t offs[LT_ITER_MAX_OPS];
    lt_cpu_row_offsets(it, r, offs);
    for (int64_t j = 0; j < inner; j++) {
      int64_t v = lt_cpu_index_at(it->data[1], it->dtypes[1], 1, offs[1] + j * is);
      if (v < 0 || v >= dim_size)
        return r * inner + j;
    }
  }
  return -1;
}

lt_status lt_cpu_gather(const lt_iter *it, int64_t dim_stride_t, int64_t dim_size, int64_t *bad) {
  if (it->numel == 0)
    return LT_OK;
  if ((*bad = scan_bad(it, dim_size)) >= 0)
    return LT_ERR_ARG;
  int64_t inner = it->ndim ? it->shape[it->ndim - 1] : 1, rows = it->numel / inner;
  int last = it->ndim - 1;
  int64_t os = last >= 0 ? it->strides[0][last] : 1, is = last >= 0 ? it->strides[1][last] : 1,
          ts = last >= 0 ? it->strides[2][last] : 1;
  int64_t es = lt_dtype_size(it->dtypes[0]);
#pragma omp parallel for schedule(static) if (it->numel >= LT_CPU_PARALLEL_MIN)
  for (int64_t r = 0; r < rows; r++) {
    int64_t offs[LT_ITER_MAX_OPS];
    lt_cpu_row_offsets(it, r, offs);
    for (int64_t j = 0; j < inner; j++) {
      int64_t v = lt_cpu_index_at(it->data[1], it->dtypes[1], 1, offs[1] + j * is);
      memcpy(it->data[0] + (offs[0] + j * os) * es,
             it->data[2] + (offs[2] + j * ts + v * dim_stride_t) * es, (size_t)es);
    }
  }
  return LT_OK;
}

lt_status lt_cpu_scatter_add(const lt_iter *it, int64_t dim_stride_t, int64_t dim_size, int64_t *bad) {
  if (it->numel == 0)
    return LT_OK;
  if ((*bad = scan_bad(it, dim_size)) >= 0)
    return LT_ERR_ARG;
  int64_t inner = it->ndim ? it->shape[it->ndim - 1] : 1, rows = it->numel / inner;
  int last = it->ndim - 1;
  int64_t ss = last >= 0 ? it->strides[0][last] : 1, is = last >= 0 ? it->strides[1][last] : 1,
          ts = last >= 0 ? it->strides[2][last] : 1;
  lt_dtype dt = it->dtypes[2];
  int64_t tes = lt_dtype_size(dt), ses = lt_dtype_size(it->dtypes[0]);
  lt_compute ck = lt_dtype_is_float(dt) ? LT_COMPUTE_F64 : LT_COMPUTE_I64;
  /* sequential: duplicate indices must add in a fixed order */
  for (int64_t r = 0; r < rows; r++) {
    int64_t offs[LT_ITER_MAX_OPS];
    lt_cpu_row_offsets(it, r, offs);
    for (int64_t j = 0; j < inner; j++) {
      int64_t v = lt_cpu_index_at(it->data[1], it->dtypes[1], 1, offs[1] + j * is);
      char *tp = it->data[2] + (offs[2] + j * ts + v * dim_stride_t) * tes;
      const char *sp = it->data[0] + (offs[0] + j * ss) * ses;
      union {
        double f;
        int64_t i;
      } a, b;
      lt_cpu_load(ck, &a, tp, dt, 1, 1);
      lt_cpu_load(ck, &b, sp, it->dtypes[0], 1, 1);
      if (ck == LT_COMPUTE_F64)
        a.f += b.f;
      else
        a.i = (int64_t)((uint64_t)a.i + (uint64_t)b.i);
      lt_cpu_store(ck, tp, dt, 1, &a, 1);
    }
  }
  return LT_OK;
}
