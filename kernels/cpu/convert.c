/*
 * convert.c: chunk loads and stores between every dtype and the three
 * compute kinds (f32, f64, i64), and the strided copy kernel built on them.
 *
 * Rules: into bf16/f16 round to nearest even (via f32 from f64); NaN and Inf
 * are kept; float to integer truncates toward zero, NaN gives 0 and values
 * beyond i64 saturate, then narrower integers wrap (as C casts do); anything
 * to bool is "nonzero" (NaN is true, as in torch). The float-to-integer rule
 * is lt_f64_to_i64 (shared/scalar.h), the one the CUDA kernels use too.
 */
#include "cpu.h"
#include "half.h"

#include <math.h>
#include <omp.h>
#include <string.h>


lt_dtype lt_cpu_native_dtype(lt_compute ck) {
  return ck == LT_COMPUTE_F32 ? LT_DTYPE_F32 : ck == LT_COMPUTE_F64 ? LT_DTYPE_F64 : LT_DTYPE_I64;
}

/* One loop per (source dtype, destination kind): b[i] = CONV(s[i * stride]). */
#define LOAD_LOOP(ST, BT, CONV)                                   \
  do {                                                            \
    const ST *s = (const ST *)src;                                \
    BT *b = (BT *)buf;                                            \
    if (stride == 1)                                              \
      for (int64_t i = 0; i < n; i++)                             \
        b[i] = CONV(s[i]);                                        \
    else                                                          \
      for (int64_t i = 0; i < n; i++)                             \
        b[i] = CONV(s[i * stride]);                               \
  } while (0)

#define AS_IS(x) (x)
#define BOOL01(x) ((x) ? 1 : 0)

#define LOAD_ALL(BT, FROM_F32)                                             \
  switch (dt) {                                                           \
  case LT_DTYPE_F32: LOAD_LOOP(float, BT, FROM_F32); break;               \
  case LT_DTYPE_F64: LOAD_LOOP(double, BT, FROM_F32); break;              \
  case LT_DTYPE_BF16: LOAD_LOOP(uint16_t, BT, BF16_TO); break;            \
  case LT_DTYPE_F16: LOAD_LOOP(uint16_t, BT, F16_TO); break;              \
  case LT_DTYPE_I8: LOAD_LOOP(int8_t, BT, AS_IS); break;                  \
  case LT_DTYPE_U8: LOAD_LOOP(uint8_t, BT, AS_IS); break;                 \
  case LT_DTYPE_U16: LOAD_LOOP(uint16_t, BT, AS_IS); break;               \
  case LT_DTYPE_I32: LOAD_LOOP(int32_t, BT, AS_IS); break;                \
  case LT_DTYPE_I64: LOAD_LOOP(int64_t, BT, AS_IS); break;                \
  case LT_DTYPE_BOOL: LOAD_LOOP(uint8_t, BT, BOOL01); break;              \
  default: break;                                                         \
  }

void lt_cpu_load(lt_compute ck, void *buf, const char *src, lt_dtype dt, int64_t stride, int64_t n) {
  switch (ck) {
  case LT_COMPUTE_F32: {
#define BF16_TO(x) lt_bf16_to_f32(x)
#define F16_TO(x) lt_f16_to_f32(x)
    LOAD_ALL(float, (float));
    break;
  }
  case LT_COMPUTE_F64: {
    LOAD_ALL(double, (double));
    break;
  }
  case LT_COMPUTE_I64: {
#undef BF16_TO
#undef F16_TO
#define BF16_TO(x) lt_f64_to_i64(lt_bf16_to_f32(x))
#define F16_TO(x) lt_f64_to_i64(lt_f16_to_f32(x))
    LOAD_ALL(int64_t, lt_f64_to_i64);
#undef BF16_TO
#undef F16_TO
    break;
  }
  }
}

#define STORE_LOOP(DT, BT, CONV)                                  \
  do {                                                            \
    DT *d = (DT *)dst;                                            \
    const BT *b = (const BT *)buf;                                \
    if (stride == 1)                                              \
      for (int64_t i = 0; i < n; i++)                             \
        d[i] = CONV(b[i]);                                        \
    else                                                          \
      for (int64_t i = 0; i < n; i++)                             \
        d[i * stride] = CONV(b[i]);                               \
  } while (0)

#define NONZERO(x) ((x) != 0)
#define TO_BF16(x) lt_f32_to_bf16((float)(x))
#define TO_F16(x) lt_f32_to_f16((float)(x))

/* Float kinds store to integers through a saturating i64 truncation. */
#define FI64(x) lt_f64_to_i64((double)(x))
#define FI32(x) ((int32_t)lt_f64_to_i64((double)(x)))
#define FI8(x) ((int8_t)lt_f64_to_i64((double)(x)))
#define FU8(x) ((uint8_t)lt_f64_to_i64((double)(x)))
#define FU16(x) ((uint16_t)lt_f64_to_i64((double)(x)))

void lt_cpu_store(lt_compute ck, char *dst, lt_dtype dt, int64_t stride, const void *buf, int64_t n) {
  if (ck == LT_COMPUTE_I64) {
    switch (dt) {
    case LT_DTYPE_F32: STORE_LOOP(float, int64_t, (float)); break;
    case LT_DTYPE_F64: STORE_LOOP(double, int64_t, (double)); break;
    case LT_DTYPE_BF16: STORE_LOOP(uint16_t, int64_t, TO_BF16); break;
    case LT_DTYPE_F16: STORE_LOOP(uint16_t, int64_t, TO_F16); break;
    case LT_DTYPE_I8: STORE_LOOP(int8_t, int64_t, (int8_t)); break;
    case LT_DTYPE_U8: STORE_LOOP(uint8_t, int64_t, (uint8_t)); break;
    case LT_DTYPE_U16: STORE_LOOP(uint16_t, int64_t, (uint16_t)); break;
    case LT_DTYPE_I32: STORE_LOOP(int32_t, int64_t, (int32_t)); break;
    case LT_DTYPE_I64: STORE_LOOP(int64_t, int64_t, AS_IS); break;
    case LT_DTYPE_BOOL: STORE_LOOP(uint8_t, int64_t, NONZERO); break;
    default: break;
    }
    return;
  }
#define STORE_FLOAT_KIND(BT)                                            \
  switch (dt) {                                                        \
  case LT_DTYPE_F32: STORE_LOOP(float, BT, (float)); break;            \
  case LT_DTYPE_F64: STORE_LOOP(double, BT, (double)); break;          \
  case LT_DTYPE_BF16: STORE_LOOP(uint16_t, BT, TO_BF16); break;        \
  case LT_DTYPE_F16: STORE_LOOP(uint16_t, BT, TO_F16); break;          \
  case LT_DTYPE_I8: STORE_LOOP(int8_t, BT, FI8); break;                \
  case LT_DTYPE_U8: STORE_LOOP(uint8_t, BT, FU8); break;               \
  case LT_DTYPE_U16: STORE_LOOP(uint16_t, BT, FU16); break;            \
  case LT_DTYPE_I32: STORE_LOOP(int32_t, BT, FI32); break;             \
  case LT_DTYPE_I64: STORE_LOOP(int64_t, BT, FI64); break;             \
  case LT_DTYPE_BOOL: STORE_LOOP(uint8_t, BT, NONZERO); break;         \
  default: break;                                                      \
  }
  if (ck == LT_COMPUTE_F32) {
    STORE_FLOAT_KIND(float);
  } else {
    STORE_FLOAT_KIND(double);
  }
}

/* ---- the copy kernel --------------------------------------------------- */

/* The compute kind that converts src to dst without losing what dst can hold. */
static lt_compute copy_kind(lt_dtype dst, lt_dtype src) {
  int fd = lt_dtype_is_float(dst), fs = lt_dtype_is_float(src);
  if (!fd && !fs)
    return LT_COMPUTE_I64;
  if (dst == LT_DTYPE_F64 || src == LT_DTYPE_F64 || fd != fs)
    return LT_COMPUTE_F64;
  return LT_COMPUTE_F32;
}

/* Same-dtype strided move of n elements of size es. */
static void move_elems(char *d, int64_t ds, const char *s, int64_t ss, int64_t n, int64_t es) {
  if (ds == 1 && ss == 1) {
    memcpy(d, s, (size_t)(n * es));
    return;
  }
  switch (es) {
  case 1: for (int64_t i = 0; i < n; i++) d[i * ds] = s[i * ss]; break;
  case 2: for (int64_t i = 0; i < n; i++) ((uint16_t *)d)[i * ds] = ((const uint16_t *)s)[i * ss]; break;
  case 4: for (int64_t i = 0; i < n; i++) ((uint32_t *)d)[i * ds] = ((const uint32_t *)s)[i * ss]; break;
  default: for (int64_t i = 0; i < n; i++) ((uint64_t *)d)[i * ds] = ((const uint64_t *)s)[i * ss]; break;
  }
}

static void copy_rows(const lt_iter *it, int64_t r0, int64_t r1) {
  int64_t inner = it->ndim ? it->shape[it->ndim - 1] : 1;
  int64_t ds = it->ndim ? it->strides[0][it->ndim - 1] : 1;
  int64_t ss = it->ndim ? it->strides[1][it->ndim - 1] : 1;
  lt_dtype dd = it->dtypes[0], sd = it->dtypes[1];
  int64_t des = lt_dtype_size(dd), ses = lt_dtype_size(sd);
  lt_compute ck = copy_kind(dd, sd);
  double buf[LT_CPU_CHUNK];
  for (int64_t r = r0; r < r1; r++) {
    int64_t offs[LT_ITER_MAX_OPS];
    lt_cpu_row_offsets(it, r, offs);
    char *d = it->data[0] + offs[0] * des;
    const char *s = it->data[1] + offs[1] * ses;
    if (dd == sd) {
      move_elems(d, ds, s, ss, inner, des);
      continue;
    }
    for (int64_t c = 0; c < inner; c += LT_CPU_CHUNK) {
      int64_t n = inner - c < LT_CPU_CHUNK ? inner - c : LT_CPU_CHUNK;
      lt_cpu_load(ck, buf, s + c * ss * ses, sd, ss, n);
      lt_cpu_store(ck, d + c * ds * des, dd, ds, buf, n);
    }
  }
}

lt_status lt_cpu_copy(const lt_iter *it) {
  if (it->numel == 0)
    return LT_OK;
  int64_t inner = it->ndim ? it->shape[it->ndim - 1] : 1;
  int64_t rows = it->numel / inner;
  if (it->numel < LT_CPU_PARALLEL_MIN) {
    copy_rows(it, 0, rows);
    return LT_OK;
  }
  if (rows == 1) {
    /* one long row: split it into column ranges */
    lt_iter sub = *it;
#pragma omp parallel firstprivate(sub)
    {
      int nt = omp_get_num_threads(), id = omp_get_thread_num();
      int64_t per = (inner + nt - 1) / nt, c0 = id * per, c1 = c0 + per < inner ? c0 + per : inner;
      if (c0 < c1) {
        for (int k = 0; k < 2; k++)
          sub.data[k] = it->data[k] + c0 * sub.strides[k][sub.ndim - 1] * lt_dtype_size(sub.dtypes[k]);
        sub.shape[sub.ndim - 1] = c1 - c0;
        sub.numel = c1 - c0;
        copy_rows(&sub, 0, 1);
      }
    }
    return LT_OK;
  }
#pragma omp parallel
  {
    int nt = omp_get_num_threads(), id = omp_get_thread_num();
    int64_t per = (rows + nt - 1) / nt, r0 = id * per, r1 = r0 + per < rows ? r0 + per : rows;
    if (r0 < r1)
      copy_rows(it, r0, r1);
  }
  return LT_OK;
}
