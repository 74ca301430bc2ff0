/*
 * elementwise.c: unary, binary (with tensor or scalar operands), where, clamp
 * and fill on the CPU. One driver walks an lt_iter in chunks: operands whose
 * dtype is the compute kind's own and whose inner stride is 1 are used in
 * place, the rest are converted into per-thread buffers (as NumPy's buffered
 * ufunc loops do); each op is then written once per compute kind on plain
 * arrays. Work of LT_CPU_PARALLEL_MIN elements or more is split over OpenMP
 * threads by chunk.
 */
#include "cpu.h"
#include "fastexp.h"

#include <math.h>
#include <omp.h>

typedef void (*chunk_fn)(const void *ctx, void *const *in, void *out, int64_t n);

typedef struct {
  const lt_iter *it;
  lt_compute ck;
  chunk_fn fn;
  const void *ctx;
  int64_t inner, tiles_per_row;
} driver;

static void run_tiles(const driver *dr, int64_t t0, int64_t t1) {
  const lt_iter *it = dr->it;
  lt_dtype native = lt_cpu_native_dtype(dr->ck);
  double bufs[LT_ITER_MAX_OPS][LT_CPU_CHUNK];
  int last = it->ndim - 1;
  for (int64_t t = t0; t < t1; t++) {
    int64_t row = t / dr->tiles_per_row, c0 = (t % dr->tiles_per_row) * LT_CPU_CHUNK;
    int64_t n = dr->inner - c0 < LT_CPU_CHUNK ? dr->inner - c0 : LT_CPU_CHUNK;
    int64_t offs[LT_ITER_MAX_OPS];
    lt_cpu_row_offsets(it, row, offs);
    void *ptrs[LT_ITER_MAX_OPS];
    char *opbase[LT_ITER_MAX_OPS];
    int64_t stride[LT_ITER_MAX_OPS];
    for (int k = 0; k < it->nops; k++) {
      int64_t es = lt_dtype_size(it->dtypes[k]);
      stride[k] = last >= 0 ? it->strides[k][last] : 1;
      opbase[k] = it->data[k] + (offs[k] + c0 * stride[k]) * es;
      int direct = it->dtypes[k] == native && stride[k] == 1;
      if (k > 0 && !direct)
        lt_cpu_load(dr->ck, bufs[k], opbase[k], it->dtypes[k], stride[k], n);
      ptrs[k] = direct ? (void *)opbase[k] : (void *)bufs[k];
    }
    dr->fn(dr->ctx, ptrs + 1, ptrs[0], n);
    if (ptrs[0] == (void *)bufs[0])
      lt_cpu_store(dr->ck, opbase[0], it->dtypes[0], stride[0], bufs[0], n);
  }
}

static void run_map(const lt_iter *it, lt_compute ck, chunk_fn fn, const void *ctx) {
  if (it->numel == 0)
    return;
  driver dr = {it, ck, fn, ctx, 0, 0};
  dr.inner = it->ndim ? it->shape[it->ndim - 1] : 1;
  dr.tiles_per_row = (dr.inner + LT_CPU_CHUNK - 1) / LT_CPU_CHUNK;
  int64_t ntiles = (it->numel / dr.inner) * dr.tiles_per_row;
  if (it->numel < LT_CPU_PARALLEL_MIN) {
    run_tiles(&dr, 0, ntiles);
    return;
  }
#pragma omp parallel
  {
    int nt = omp_get_num_threads(), id = omp_get_thread_num();
    int64_t per = (ntiles + nt - 1) / nt, a = id * per, b = a + per < ntiles ? a + per : ntiles;
    if (a < b)
      run_tiles(&dr, a, b);
  }
}

/* ---- unary ---------------------------------------------------------------- */

/* sigmoid(2u) for GELU's u (shared/scalar.h: the formula both devices
   compute), from exp(-|2u|) by GEXP */
#define SIGMOID2U(T, GEXP, x)                                                                 \
  ({                                                                                          \
    T z_ = LT_GELU_2U(T, x);                                                                  \
    T e_ = GEXP(z_ < 0 ? z_ : -z_);                                                           \
    LT_SIGMOID_FROM_EXP(T, z_, e_);                                                           \
  })

#define UNARY_CASES(T, EXP, GEXP, LOG, SQRT, TANH, ONE)                                  \
  switch (op) {                                                                    \
  case LT_UNARY_NEG: for (int64_t i = 0; i < n; i++) o[i] = -a[i]; break;          \
  case LT_UNARY_ABS: for (int64_t i = 0; i < n; i++) o[i] = a[i] < 0 ? -a[i] : a[i]; break; \
  case LT_UNARY_EXP: for (int64_t i = 0; i < n; i++) o[i] = EXP(a[i]); break;      \
  case LT_UNARY_LOG: for (int64_t i = 0; i < n; i++) o[i] = LOG(a[i]); break;      \
  case LT_UNARY_SQRT: for (int64_t i = 0; i < n; i++) o[i] = SQRT(a[i]); break;    \
  case LT_UNARY_RSQRT: for (int64_t i = 0; i < n; i++) o[i] = ONE / SQRT(a[i]); break; \
  case LT_UNARY_TANH: for (int64_t i = 0; i < n; i++) o[i] = TANH(a[i]); break;    \
  case LT_UNARY_SIGMOID: for (int64_t i = 0; i < n; i++) o[i] = ONE / (ONE + EXP(-a[i])); break; \
  case LT_UNARY_SIGN: for (int64_t i = 0; i < n; i++) o[i] = a[i] > 0 ? ONE : a[i] < 0 ? -ONE : a[i]; break; \
  case LT_UNARY_GELU: /* 0.5 x (1 + tanh u) = x sigmoid(2u): one exp, no tanh */ \
    for (int64_t i = 0; i < n; i++) {                                              \
      T x = a[i];                                                                  \
      o[i] = x * SIGMOID2U(T, GEXP, x);                                            \
    }                                                                              \
    break;                                                                         \
  case LT_UNARY_SILU: for (int64_t i = 0; i < n; i++) o[i] = a[i] / (ONE + EXP(-a[i])); break; \
  default: break;                                                                  \
  }

static void unary_f32(const void *ctx, void *const *in, void *out, int64_t n) {
  lt_unary_op op = *(const lt_unary_op *)ctx;
  const float *a = in[0];
  float *o = out;
  UNARY_CASES(float, expf, lt_fast_expf, logf, sqrtf, tanhf, 1.0f);
}

static void unary_f64(const void *ctx, void *const *in, void *out, int64_t n) {
  lt_unary_op op = *(const lt_unary_op *)ctx;
  const double *a = in[0];
  double *o = out;
  UNARY_CASES(double, exp, exp, log, sqrt, tanh, 1.0);
}

static void unary_i64(const void *ctx, void *const *in, void *out, int64_t n) {
  lt_unary_op op = *(const lt_unary_op *)ctx;
  const int64_t *a = in[0];
  int64_t *o = out;
  /* negation through unsigned arithmetic wraps INT64_MIN instead of overflowing */
  if (op == LT_UNARY_NEG)
    for (int64_t i = 0; i < n; i++)
      o[i] = (int64_t)(0u - (uint64_t)a[i]);
  else if (op == LT_UNARY_SIGN)
    for (int64_t i = 0; i < n; i++)
      o[i] = (a[i] > 0) - (a[i] < 0);
  else
    for (int64_t i = 0; i < n; i++)
      o[i] = a[i] < 0 ? (int64_t)(0u - (uint64_t)a[i]) : a[i];
}

lt_status lt_cpu_unary(lt_unary_op op, lt_compute ck, const lt_iter *it) {
  static const chunk_fn fns[] = {unary_f32, unary_f64, unary_i64};
  run_map(it, ck, fns[ck], &op);
  return LT_OK;
}

/* ---- binary --------------------------------------------------------------- */

/* NaN-propagating maximum and minimum, as torch.maximum/minimum. */
#define MAXIMUM(x, y) (((x) > (y) || (x) != (x)) ? (x) : (y))
#define MINIMUM(x, y) (((x) < (y) || (x) != (x)) ? (x) : (y))

/* A and B index the operands: a[i] and b[i], or a scalar s on either side. */
#define BINARY_CASES(A, B, POW, DIV)                                              \
  switch (op) {                                                                  \
  case LT_BINARY_ADD: for (int64_t i = 0; i < n; i++) o[i] = A + B; break;       \
  case LT_BINARY_SUB: for (int64_t i = 0; i < n; i++) o[i] = A - B; break;       \
  case LT_BINARY_MUL: for (int64_t i = 0; i < n; i++) o[i] = A * B; break;       \
  case LT_BINARY_DIV: for (int64_t i = 0; i < n; i++) o[i] = DIV(A, B); break;   \
  case LT_BINARY_POW: for (int64_t i = 0; i < n; i++) o[i] = POW(A, B); break;   \
  case LT_BINARY_MAXIMUM: for (int64_t i = 0; i < n; i++) o[i] = MAXIMUM(A, B); break; \
  case LT_BINARY_MINIMUM: for (int64_t i = 0; i < n; i++) o[i] = MINIMUM(A, B); break; \
  case LT_BINARY_EQ: for (int64_t i = 0; i < n; i++) o[i] = A == B; break;       \
  case LT_BINARY_NE: for (int64_t i = 0; i < n; i++) o[i] = A != B; break;       \
  case LT_BINARY_LT: for (int64_t i = 0; i < n; i++) o[i] = A < B; break;        \
  case LT_BINARY_LE: for (int64_t i = 0; i < n; i++) o[i] = A <= B; break;       \
  case LT_BINARY_GT: for (int64_t i = 0; i < n; i++) o[i] = A > B; break;        \
  case LT_BINARY_GE: for (int64_t i = 0; i < n; i++) o[i] = A >= B; break;       \
  default: break;                                                                \
  }

#define FDIV(x, y) ((x) / (y))

/* Integer add/sub/mul wrap around (through unsigned arithmetic, no UB); integer
   division never reaches this kind (the host computes it in f32). */
#define IADD(x, y) ((int64_t)((uint64_t)(x) + (uint64_t)(y)))
#define ISUB(x, y) ((int64_t)((uint64_t)(x) - (uint64_t)(y)))
#define IMUL(x, y) ((int64_t)((uint64_t)(x) * (uint64_t)(y)))
#define IDIV(x, y) ((y) == 0 ? 0 : (x) / (y))

#define INT_BINARY_CASES(A, B)                                                    \
  switch (op) {                                                                  \
  case LT_BINARY_ADD: for (int64_t i = 0; i < n; i++) o[i] = IADD(A, B); break;  \
  case LT_BINARY_SUB: for (int64_t i = 0; i < n; i++) o[i] = ISUB(A, B); break;  \
  case LT_BINARY_MUL: for (int64_t i = 0; i < n; i++) o[i] = IMUL(A, B); break;  \
  case LT_BINARY_DIV: for (int64_t i = 0; i < n; i++) o[i] = IDIV(A, B); break;  \
  case LT_BINARY_POW: for (int64_t i = 0; i < n; i++) o[i] = lt_ipow(A, B); break;  \
  case LT_BINARY_MAXIMUM: for (int64_t i = 0; i < n; i++) o[i] = A > B ? A : B; break; \
  case LT_BINARY_MINIMUM: for (int64_t i = 0; i < n; i++) o[i] = A < B ? A : B; break; \
  case LT_BINARY_EQ: for (int64_t i = 0; i < n; i++) o[i] = A == B; break;       \
  case LT_BINARY_NE: for (int64_t i = 0; i < n; i++) o[i] = A != B; break;       \
  case LT_BINARY_LT: for (int64_t i = 0; i < n; i++) o[i] = A < B; break;        \
  case LT_BINARY_LE: for (int64_t i = 0; i < n; i++) o[i] = A <= B; break;       \
  case LT_BINARY_GT: for (int64_t i = 0; i < n; i++) o[i] = A > B; break;        \
  case LT_BINARY_GE: for (int64_t i = 0; i < n; i++) o[i] = A >= B; break;       \
  default: break;                                                                \
  }

typedef struct {
  lt_binary_op op;
  double s;
  int reversed;
} binary_ctx;

/* The derivatives of the activations, times the incoming gradient g. */
#define ACTIVATION_GRADS(T, EXP, GEXP, ONE)                                          \
  case LT_BINARY_GELU_GRAD: /* shared/scalar.h: s = sigmoid(2u) */                \
    for (int64_t i = 0; i < n; i++) {                                                \
      T x = a[i], s = SIGMOID2U(T, GEXP, x);                                         \
      o[i] = LT_GELU_GRAD(T, x, s, b[i]);                                            \
    }                                                                                \
    break;                                                                           \
  case LT_BINARY_SILU_GRAD:                                                          \
    for (int64_t i = 0; i < n; i++) {                                                \
      T x = a[i], sg = ONE / (ONE + EXP(-x));                                        \
      o[i] = b[i] * sg * (ONE + x * (ONE - sg));                                     \
    }                                                                                \
    break;

static void binary_f32(const void *ctx, void *const *in, void *out, int64_t n) {
  lt_binary_op op = ((const binary_ctx *)ctx)->op;
  const float *a = in[0], *b = in[1];
  float *o = out;
  switch (op) {
    ACTIVATION_GRADS(float, expf, lt_fast_expf, 1.0f)
  default:
    BINARY_CASES(a[i], b[i], powf, FDIV);
  }
}

static void binary_f64(const void *ctx, void *const *in, void *out, int64_t n) {
  lt_binary_op op = ((const binary_ctx *)ctx)->op;
  const double *a = in[0], *b = in[1];
  double *o = out;
  switch (op) {
    ACTIVATION_GRADS(double, exp, exp, 1.0)
  default:
    BINARY_CASES(a[i], b[i], pow, FDIV);
  }
}

static void binary_i64(const void *ctx, void *const *in, void *out, int64_t n) {
  lt_binary_op op = ((const binary_ctx *)ctx)->op;
  const int64_t *a = in[0], *b = in[1];
  int64_t *o = out;
  INT_BINARY_CASES(a[i], b[i]);
}

lt_status lt_cpu_binary(lt_binary_op op, lt_compute ck, const lt_iter *it) {
  static const chunk_fn fns[] = {binary_f32, binary_f64, binary_i64};
  binary_ctx c = {op, 0, 0};
  run_map(it, ck, fns[ck], &c);
  return LT_OK;
}

static void scalar_f32(const void *ctx, void *const *in, void *out, int64_t n) {
  const binary_ctx *c = ctx;
  lt_binary_op op = c->op;
  const float *a = in[0];
  const float s = (float)c->s;
  float *o = out;
  if (c->reversed) {
    BINARY_CASES(s, a[i], powf, FDIV);
  } else {
    BINARY_CASES(a[i], s, powf, FDIV);
  }
}

static void scalar_f64(const void *ctx, void *const *in, void *out, int64_t n) {
  const binary_ctx *c = ctx;
  lt_binary_op op = c->op;
  const double *a = in[0];
  const double s = c->s;
  double *o = out;
  if (c->reversed) {
    BINARY_CASES(s, a[i], pow, FDIV);
  } else {
    BINARY_CASES(a[i], s, pow, FDIV);
  }
}

static void scalar_i64(const void *ctx, void *const *in, void *out, int64_t n) {
  const binary_ctx *c = ctx;
  lt_binary_op op = c->op;
  const int64_t *a = in[0];
  const int64_t s = (int64_t)c->s;
  int64_t *o = out;
  if (c->reversed) {
    INT_BINARY_CASES(s, a[i]);
  } else {
    INT_BINARY_CASES(a[i], s);
  }
}

lt_status lt_cpu_binary_scalar(lt_binary_op op, lt_compute ck, const lt_iter *it, double s, int reversed) {
  static const chunk_fn fns[] = {scalar_f32, scalar_f64, scalar_i64};
  binary_ctx c = {op, s, reversed};
  run_map(it, ck, fns[ck], &c);
  return LT_OK;
}

/* ---- where, clamp, fill ---------------------------------------------------- */

#define WHERE_BODY(T)                                           \
  const T *c = in[0], *a = in[1], *b = in[2];                   \
  T *o = out;                                                   \
  for (int64_t i = 0; i < n; i++)                               \
    o[i] = c[i] != 0 ? a[i] : b[i];

static void where_f32(const void *ctx, void *const *in, void *out, int64_t n) {
  (void)ctx;
  WHERE_BODY(float)
}
static void where_f64(const void *ctx, void *const *in, void *out, int64_t n) {
  (void)ctx;
  WHERE_BODY(double)
}
static void where_i64(const void *ctx, void *const *in, void *out, int64_t n) {
  (void)ctx;
  WHERE_BODY(int64_t)
}

lt_status lt_cpu_where(lt_compute ck, const lt_iter *it) {
  static const chunk_fn fns[] = {where_f32, where_f64, where_i64};
  run_map(it, ck, fns[ck], NULL);
  return LT_OK;
}

typedef struct {
  double lo, hi;
  int has_lo, has_hi;
} clamp_ctx;

/* NaN passes through: both comparisons are false for it. */
#define CLAMP_BODY(T)                                           \
  const clamp_ctx *c = ctx;                                     \
  const T *a = in[0];                                           \
  T *o = out;                                                   \
  const T lo = (T)c->lo, hi = (T)c->hi;                         \
  for (int64_t i = 0; i < n; i++) {                             \
    T x = a[i];                                                 \
    if (c->has_lo && x < lo)                                    \
      x = lo;                                                   \
    if (c->has_hi && x > hi)                                    \
      x = hi;                                                   \
    o[i] = x;                                                   \
  }

static void clamp_f32(const void *ctx, void *const *in, void *out, int64_t n) { CLAMP_BODY(float) }
static void clamp_f64(const void *ctx, void *const *in, void *out, int64_t n) { CLAMP_BODY(double) }
static void clamp_i64(const void *ctx, void *const *in, void *out, int64_t n) { CLAMP_BODY(int64_t) }

lt_status lt_cpu_clamp(lt_compute ck, const lt_iter *it, double lo, int has_lo, double hi, int has_hi) {
  static const chunk_fn fns[] = {clamp_f32, clamp_f64, clamp_i64};
  clamp_ctx c = {lo, hi, has_lo, has_hi};
  run_map(it, ck, fns[ck], &c);
  return LT_OK;
}

static void fill_f64(const void *ctx, void *const *in, void *out, int64_t n) {
  (void)in;
  double v = *(const double *)ctx, *o = out;
  for (int64_t i = 0; i < n; i++)
    o[i] = v;
}

static void fill_i64(const void *ctx, void *const *in, void *out, int64_t n) {
  (void)in;
  int64_t v = *(const int64_t *)ctx, *o = out;
  for (int64_t i = 0; i < n; i++)
    o[i] = v;
}

static void fill_f32(const void *ctx, void *const *in, void *out, int64_t n) {
  (void)in;
  float v = *(const float *)ctx, *o = out;
  for (int64_t i = 0; i < n; i++)
    o[i] = v;
}

lt_status lt_cpu_fill(const lt_iter *it, double value) {
  lt_dtype dt = it->dtypes[0];
  if (dt == LT_DTYPE_F64) {
    run_map(it, LT_COMPUTE_F64, fill_f64, &value);
  } else if (lt_dtype_is_float(dt)) {
    float v = (float)value;
    run_map(it, LT_COMPUTE_F32, fill_f32, &v);
  } else if (dt == LT_DTYPE_BOOL) {
    int64_t v = value != 0;
    run_map(it, LT_COMPUTE_I64, fill_i64, &v);
  } else {
    /* through the store conversion, so fill follows the same float-to-int rule */
    int64_t v;
    double one = value;
    lt_cpu_store(LT_COMPUTE_F64, (char *)&v, LT_DTYPE_I64, 1, &one, 1);
    run_map(it, LT_COMPUTE_I64, fill_i64, &v);
  }
  return LT_OK;
}
