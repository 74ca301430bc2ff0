/*
 * elementwise.cu: copy, fill, unary, binary (tensor or number), where and
 * clamp on the GPU over an lt_iter (any strides, broadcasting by zero
 * strides, mixed dtypes), computing in f32 (f32/bf16/f16), f64 or i64 as
 * the host chose, with the same formulas and NaN rules as kernels/cpu.
 * One thread per element in a grid-stride loop; where every operand is
 * contiguous with one 16-bit or f32 dtype and computes in f32 (most of a
 * training step), 16-byte vector loads and stores instead.
 */
#include "common.cuh"

#include <math.h>

static const int THREADS = 256;

/* float and double versions of the math functions */
__device__ __forceinline__ float m_exp(float x) { return expf(x); }
__device__ __forceinline__ double m_exp(double x) { return exp(x); }
__device__ __forceinline__ float m_log(float x) { return logf(x); }
__device__ __forceinline__ double m_log(double x) { return log(x); }
__device__ __forceinline__ float m_sqrt(float x) { return sqrtf(x); }
__device__ __forceinline__ double m_sqrt(double x) { return sqrt(x); }
__device__ __forceinline__ float m_tanh(float x) { return tanhf(x); }
__device__ __forceinline__ double m_tanh(double x) { return tanh(x); }
__device__ __forceinline__ float m_pow(float x, float y) { return powf(x, y); }
__device__ __forceinline__ double m_pow(double x, double y) { return pow(x, y); }

/* sigmoid(2u) = (1 + tanh u) / 2 for the tanh GELU's u, from exp(-|2u|):
   the formula of shared/scalar.h, which kernels/cpu/elementwise.c computes too */
template <typename T> __device__ __forceinline__ T gelu_sigmoid2u(T x) {
  T z = LT_GELU_2U(T, x);
  T e = m_exp(z < (T)0 ? z : -z);
  return LT_SIGMOID_FROM_EXP(T, z, e);
}

template <typename T> __device__ __forceinline__ T unary_op(int op, T a) {
  const T one = (T)1;
  switch (op) {
  case LT_UNARY_NEG: return -a;
  case LT_UNARY_ABS: return a < (T)0 ? -a : a;
  case LT_UNARY_EXP: return m_exp(a);
  case LT_UNARY_LOG: return m_log(a);
  case LT_UNARY_SQRT: return m_sqrt(a);
  case LT_UNARY_RSQRT: return one / m_sqrt(a);
  case LT_UNARY_TANH: return m_tanh(a);
  case LT_UNARY_SIGMOID: return one / (one + m_exp(-a));
  case LT_UNARY_SIGN: return a > (T)0 ? one : a < (T)0 ? -one : a;
  case LT_UNARY_GELU: return a * gelu_sigmoid2u(a); /* 0.5 x (1 + tanh u) */
  case LT_UNARY_SILU: return a / (one + m_exp(-a));
  default: return a;
  }
}

template <> __device__ __forceinline__ int64_t unary_op<int64_t>(int op, int64_t a) {
  switch (op) {
  case LT_UNARY_NEG: return (int64_t)(0ull - (uint64_t)a);
  case LT_UNARY_ABS: return a < 0 ? (int64_t)(0ull - (uint64_t)a) : a;
  case LT_UNARY_SIGN: return (a > 0) - (a < 0);
  default: return a;
  }
}

template <typename T> __device__ __forceinline__ T binary_op(int op, T a, T b) {
  const T one = (T)1;
  switch (op) {
  case LT_BINARY_ADD: return a + b;
  case LT_BINARY_SUB: return a - b;
  case LT_BINARY_MUL: return a * b;
  case LT_BINARY_DIV: return a / b;
  case LT_BINARY_POW: return m_pow(a, b);
  case LT_BINARY_MAXIMUM: return (a > b || a != a) ? a : b;
  case LT_BINARY_MINIMUM: return (a < b || a != a) ? a : b;
  case LT_BINARY_EQ: return a == b;
  case LT_BINARY_NE: return a != b;
  case LT_BINARY_LT: return a < b;
  case LT_BINARY_LE: return a <= b;
  case LT_BINARY_GT: return a > b;
  case LT_BINARY_GE: return a >= b;
  case LT_BINARY_GELU_GRAD: { /* shared/scalar.h: s = sigmoid(2u) */
    T s = gelu_sigmoid2u(a);
    return LT_GELU_GRAD(T, a, s, b);
  }
  case LT_BINARY_SILU_GRAD: {
    T sg = one / (one + m_exp(-a));
    return b * sg * (one + a * (one - sg));
  }
  default: return a;
  }
}

template <> __device__ __forceinline__ int64_t binary_op<int64_t>(int op, int64_t a, int64_t b) {
  switch (op) {
  case LT_BINARY_ADD: return (int64_t)((uint64_t)a + (uint64_t)b);
  case LT_BINARY_SUB: return (int64_t)((uint64_t)a - (uint64_t)b);
  case LT_BINARY_MUL: return (int64_t)((uint64_t)a * (uint64_t)b);
  case LT_BINARY_DIV: return b == 0 ? 0 : a / b;
  case LT_BINARY_POW: return lt_ipow(a, b);
  case LT_BINARY_MAXIMUM: return a > b ? a : b;
  case LT_BINARY_MINIMUM: return a < b ? a : b;
  case LT_BINARY_EQ: return a == b;
  case LT_BINARY_NE: return a != b;
  case LT_BINARY_LT: return a < b;
  case LT_BINARY_LE: return a <= b;
  case LT_BINARY_GT: return a > b;
  case LT_BINARY_GE: return a >= b;
  default: return a;
  }
}

template <typename T> __global__ void unary_kernel(lt_iter it, int op) {
  LT_GRID_STRIDE(i, it.numel) {
    int64_t o[LT_ITER_MAX_OPS];
    lt_offsets(it, i, o);
    T a = lt_load<T>(it.data[1], it.dtypes[1], o[1]);
    lt_store<T>(it.data[0], it.dtypes[0], o[0], unary_op<T>(op, a));
  }
}

template <typename T> __global__ void binary_kernel(lt_iter it, int op) {
  LT_GRID_STRIDE(i, it.numel) {
    int64_t o[LT_ITER_MAX_OPS];
    lt_offsets(it, i, o);
    T a = lt_load<T>(it.data[1], it.dtypes[1], o[1]);
    T b = lt_load<T>(it.data[2], it.dtypes[2], o[2]);
    lt_store<T>(it.data[0], it.dtypes[0], o[0], binary_op<T>(op, a, b));
  }
}

template <typename T> __global__ void scalar_kernel(lt_iter it, int op, T v, int reversed) {
  LT_GRID_STRIDE(i, it.numel) {
    int64_t o[LT_ITER_MAX_OPS];
    lt_offsets(it, i, o);
    T a = lt_load<T>(it.data[1], it.dtypes[1], o[1]);
    lt_store<T>(it.data[0], it.dtypes[0], o[0], reversed ? binary_op<T>(op, v, a) : binary_op<T>(op, a, v));
  }
}

template <typename T> __global__ void where_kernel(lt_iter it) {
  LT_GRID_STRIDE(i, it.numel) {
    int64_t o[LT_ITER_MAX_OPS];
    lt_offsets(it, i, o);
    int c = ((const uint8_t *)it.data[1])[o[1]] != 0; /* the host passes a bool condition */
    T v = c ? lt_load<T>(it.data[2], it.dtypes[2], o[2]) : lt_load<T>(it.data[3], it.dtypes[3], o[3]);
    lt_store<T>(it.data[0], it.dtypes[0], o[0], v);
  }
}

template <typename T> __global__ void clamp_kernel(lt_iter it, T lo, int has_lo, T hi, int has_hi) {
  LT_GRID_STRIDE(i, it.numel) {
    int64_t o[LT_ITER_MAX_OPS];
    lt_offsets(it, i, o);
    T x = lt_load<T>(it.data[1], it.dtypes[1], o[1]);
    if (has_lo && x < lo)
      x = lo;
    if (has_hi && x > hi)
      x = hi;
    lt_store<T>(it.data[0], it.dtypes[0], o[0], x);
  }
}

/* Same-dtype copies move raw elements; others convert through f64 (floats,
   or ints with floats) or i64 (ints only), as the CPU's copy does. */
template <typename E> __global__ void move_kernel(lt_iter it) {
  LT_GRID_STRIDE(i, it.numel) {
    int64_t o[LT_ITER_MAX_OPS];
    lt_offsets(it, i, o);
    ((E *)it.data[0])[o[0]] = ((const E *)it.data[1])[o[1]];
  }
}

template <typename T> __global__ void convert_kernel(lt_iter it) {
  LT_GRID_STRIDE(i, it.numel) {
    int64_t o[LT_ITER_MAX_OPS];
    lt_offsets(it, i, o);
    lt_store<T>(it.data[0], it.dtypes[0], o[0], lt_load<T>(it.data[1], it.dtypes[1], o[1]));
  }
}

template <typename T> __global__ void fill_kernel(lt_iter it, T v) {
  LT_GRID_STRIDE(i, it.numel) {
    int64_t o[LT_ITER_MAX_OPS];
    lt_offsets(it, i, o);
    lt_store<T>(it.data[0], it.dtypes[0], o[0], v);
  }
}

/* ---- contiguous fast path: one storage type E, f32 compute, 16-byte vectors ---- */

template <typename E> struct store_type;
template <> struct store_type<float> {
  static __device__ __forceinline__ float get(float v) { return v; }
  static __device__ __forceinline__ float put(float v) { return v; }
};
template <> struct store_type<__nv_bfloat16> {
  static __device__ __forceinline__ float get(__nv_bfloat16 v) { return __bfloat162float(v); }
  static __device__ __forceinline__ __nv_bfloat16 put(float v) { return __float2bfloat16_rn(v); }
};
template <> struct store_type<__half> {
  static __device__ __forceinline__ float get(__half v) { return __half2float(v); }
  static __device__ __forceinline__ __half put(float v) { return __float2half_rn(v); }
};

enum { FAST_UNARY, FAST_BINARY, FAST_SCALAR, FAST_FILL };

template <typename E>
__device__ __forceinline__ float fast_op(int kind, int op, float a, float b, float v, int reversed) {
  switch (kind) {
  case FAST_UNARY: return unary_op<float>(op, a);
  case FAST_BINARY: return binary_op<float>(op, a, b);
  case FAST_SCALAR: return reversed ? binary_op<float>(op, v, a) : binary_op<float>(op, a, v);
  default: return v;
  }
}

template <typename E>
__global__ void fast_kernel(int kind, int op, E *out, const E *a, const E *b, int64_t n, float v, int reversed) {
  typedef store_type<E> S;
  const int VEC = 16 / sizeof(E);
  int64_t nvec = n / VEC;
  LT_GRID_STRIDE(i, nvec) {
    union {
      uint4 raw;
      E e[16 / sizeof(E)];
    } ra, rb, ro;
    if (kind != FAST_FILL)
      ra.raw = ((const uint4 *)a)[i];
    if (kind == FAST_BINARY)
      rb.raw = ((const uint4 *)b)[i];
#pragma unroll
    for (int j = 0; j < VEC; j++)
      ro.e[j] = S::put(fast_op<E>(kind, op, kind != FAST_FILL ? S::get(ra.e[j]) : 0.f,
                                  kind == FAST_BINARY ? S::get(rb.e[j]) : 0.f, v, reversed));
    ((uint4 *)out)[i] = ro.raw;
  }
  for (int64_t i = nvec * VEC + (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    out[i] = S::put(fast_op<E>(kind, op, kind != FAST_FILL ? S::get(a[i]) : 0.f,
                               kind == FAST_BINARY ? S::get(b[i]) : 0.f, v, reversed));
}

/* Launches the fast path when it applies (operands 0..nin contiguous, one
   dtype f32/bf16/f16, 16-byte aligned); returns 0 when it does not. */
static int try_fast(int kind, int op, lt_compute ck, const lt_iter *it, int nin, float v, int reversed,
                    cudaStream_t s, lt_status *st) {
  if (ck != LT_COMPUTE_F32 || it->numel == 0 || it->ndim > 1)
    return 0;
  int dt = it->dtypes[0];
  if (dt != LT_DTYPE_F32 && dt != LT_DTYPE_BF16 && dt != LT_DTYPE_F16)
    return 0;
  for (int k = 0; k <= nin; k++) {
    if (it->dtypes[k] != dt || ((uintptr_t)it->data[k] & 15))
      return 0;
    if (it->ndim == 1 && it->strides[k][0] != 1)
      return 0;
  }
  unsigned grid = lt_cuda_blocks((it->numel + 7) / 8, THREADS);
  char *o = it->data[0];
  const char *a = nin > 0 ? it->data[1] : NULL, *b = nin > 1 ? it->data[2] : NULL;
  if (dt == LT_DTYPE_F32)
    fast_kernel<float><<<grid, THREADS, 0, s>>>(kind, op, (float *)o, (const float *)a, (const float *)b, it->numel,
                                                v, reversed);
  else if (dt == LT_DTYPE_BF16)
    fast_kernel<__nv_bfloat16><<<grid, THREADS, 0, s>>>(kind, op, (__nv_bfloat16 *)o, (const __nv_bfloat16 *)a,
                                                        (const __nv_bfloat16 *)b, it->numel, v, reversed);
  else
    fast_kernel<__half><<<grid, THREADS, 0, s>>>(kind, op, (__half *)o, (const __half *)a, (const __half *)b,
                                                 it->numel, v, reversed);
  *st = lt_cuda_check_launch("fast_kernel");
  return 1;
}

#define TRY_FAST(kind, op, ck, nin, v, reversed)                                                     \
  do {                                                                                              \
    lt_status fst_;                                                                                 \
    if (try_fast((kind), (op), (ck), it, (nin), (v), (reversed), (cudaStream_t)s, &fst_))            \
      return fst_;                                                                                  \
  } while (0)

static int is_float_dt(int d) { return d == LT_DTYPE_F32 || d == LT_DTYPE_F64 || d == LT_DTYPE_BF16 || d == LT_DTYPE_F16; }

static int64_t elem_size(int d) {
  switch (d) {
  case LT_DTYPE_F64: case LT_DTYPE_I64: return 8;
  case LT_DTYPE_F32: case LT_DTYPE_I32: return 4;
  case LT_DTYPE_BF16: case LT_DTYPE_F16: case LT_DTYPE_U16: return 2;
  default: return 1;
  }
}

#define LAUNCH(kernel, ...)                                                                  \
  do {                                                                                       \
    if (it->numel == 0)                                                                      \
      return LT_OK;                                                                          \
    kernel<<<lt_cuda_blocks(it->numel, THREADS), THREADS, 0, (cudaStream_t)s>>>(__VA_ARGS__); \
    return lt_cuda_check_launch(#kernel);                                                    \
  } while (0)

/* Converts contiguous 16-bit floats and f32 into each other. */
template <typename D, typename S> __global__ void convert_fast_kernel(D *dst, const S *src, int64_t n) {
  LT_GRID_STRIDE(i, n) dst[i] = store_type<D>::put(store_type<S>::get(src[i]));
}

static bool is_f32_or_half(int d) { return d == LT_DTYPE_F32 || d == LT_DTYPE_BF16 || d == LT_DTYPE_F16; }

template <typename D>
static lt_status convert_from(char *dst, const char *src, int sd, int64_t n, cudaStream_t s) {
  unsigned g = lt_cuda_blocks(n, THREADS);
  if (sd == LT_DTYPE_F32)
    convert_fast_kernel<D, float><<<g, THREADS, 0, s>>>((D *)dst, (const float *)src, n);
  else if (sd == LT_DTYPE_BF16)
    convert_fast_kernel<D, __nv_bfloat16><<<g, THREADS, 0, s>>>((D *)dst, (const __nv_bfloat16 *)src, n);
  else
    convert_fast_kernel<D, __half><<<g, THREADS, 0, s>>>((D *)dst, (const __half *)src, n);
  return lt_cuda_check_launch("convert_fast_kernel");
}

extern "C" lt_status lt_cuda_copy(const lt_iter *it, lt_cuda_stream s) {
  int dd = it->dtypes[0], sd = it->dtypes[1];
  bool contiguous = it->numel > 0 && (it->ndim == 0 || (it->ndim == 1 && it->strides[0][0] == 1 && it->strides[1][0] == 1));
  if (contiguous && dd == sd) {
    cudaError_t e = cudaMemcpyAsync(it->data[0], it->data[1], (size_t)(it->numel * elem_size(dd)),
                                    cudaMemcpyDeviceToDevice, (cudaStream_t)s);
    if (e != cudaSuccess)
      return lt_fail(LT_ERR_DEVICE, "cuda: copy failed: %s%s", cudaGetErrorString(e), lt_cuda_note(e));
    lt_cuda_mark("copy on the device");
    return LT_OK;
  }
  if (contiguous && is_f32_or_half(dd) && is_f32_or_half(sd)) {
    if (dd == LT_DTYPE_F32)
      return convert_from<float>(it->data[0], it->data[1], sd, it->numel, (cudaStream_t)s);
    if (dd == LT_DTYPE_BF16)
      return convert_from<__nv_bfloat16>(it->data[0], it->data[1], sd, it->numel, (cudaStream_t)s);
    return convert_from<__half>(it->data[0], it->data[1], sd, it->numel, (cudaStream_t)s);
  }
  if (dd == sd) {
    switch (elem_size(dd)) {
    case 8: LAUNCH(move_kernel<uint64_t>, *it);
    case 4: LAUNCH(move_kernel<uint32_t>, *it);
    case 2: LAUNCH(move_kernel<uint16_t>, *it);
    default: LAUNCH(move_kernel<uint8_t>, *it);
    }
  }
  if (!is_float_dt(dd) && !is_float_dt(sd))
    LAUNCH(convert_kernel<int64_t>, *it);
  if (dd == LT_DTYPE_F64 || sd == LT_DTYPE_F64 || is_float_dt(dd) != is_float_dt(sd))
    LAUNCH(convert_kernel<double>, *it);
  LAUNCH(convert_kernel<float>, *it);
}

extern "C" lt_status lt_cuda_fill(const lt_iter *it, double value, lt_cuda_stream s) {
  int dt = it->dtypes[0];
  if (dt == LT_DTYPE_F32 || dt == LT_DTYPE_BF16 || dt == LT_DTYPE_F16)
    TRY_FAST(FAST_FILL, 0, LT_COMPUTE_F32, 0, (float)value, 0);
  if (dt == LT_DTYPE_F64)
    LAUNCH(fill_kernel<double>, *it, value);
  if (is_float_dt(dt))
    LAUNCH(fill_kernel<float>, *it, (float)value);
  if (dt == LT_DTYPE_BOOL)
    LAUNCH(fill_kernel<int64_t>, *it, (int64_t)(value != 0));
  /* integers: truncate toward zero, NaN -> 0, saturate (then wrap on store) */
  LAUNCH(fill_kernel<int64_t>, *it, lt_f64_to_i64(value));
}

extern "C" lt_status lt_cuda_unary(lt_unary_op op, lt_compute ck, const lt_iter *it, lt_cuda_stream s) {
  TRY_FAST(FAST_UNARY, (int)op, ck, 1, 0.f, 0);
  if (ck == LT_COMPUTE_F64)
    LAUNCH(unary_kernel<double>, *it, (int)op);
  if (ck == LT_COMPUTE_I64)
    LAUNCH(unary_kernel<int64_t>, *it, (int)op);
  LAUNCH(unary_kernel<float>, *it, (int)op);
}

extern "C" lt_status lt_cuda_binary(lt_binary_op op, lt_compute ck, const lt_iter *it, lt_cuda_stream s) {
  if (op < LT_BINARY_EQ || op > LT_BINARY_GE) /* comparisons write bool */
    TRY_FAST(FAST_BINARY, (int)op, ck, 2, 0.f, 0);
  if (ck == LT_COMPUTE_F64)
    LAUNCH(binary_kernel<double>, *it, (int)op);
  if (ck == LT_COMPUTE_I64)
    LAUNCH(binary_kernel<int64_t>, *it, (int)op);
  LAUNCH(binary_kernel<float>, *it, (int)op);
}

extern "C" lt_status lt_cuda_binary_scalar(lt_binary_op op, lt_compute ck, const lt_iter *it, double v, int reversed,
                                           lt_cuda_stream s) {
  if (op < LT_BINARY_EQ || op > LT_BINARY_GE)
    TRY_FAST(FAST_SCALAR, (int)op, ck, 1, (float)v, reversed);
  if (ck == LT_COMPUTE_F64)
    LAUNCH(scalar_kernel<double>, *it, (int)op, v, reversed);
  if (ck == LT_COMPUTE_I64)
    LAUNCH(scalar_kernel<int64_t>, *it, (int)op, (int64_t)v, reversed);
  LAUNCH(scalar_kernel<float>, *it, (int)op, (float)v, reversed);
}

extern "C" lt_status lt_cuda_where(lt_compute ck, const lt_iter *it, lt_cuda_stream s) {
  if (ck == LT_COMPUTE_F64)
    LAUNCH(where_kernel<double>, *it);
  if (ck == LT_COMPUTE_I64)
    LAUNCH(where_kernel<int64_t>, *it);
  LAUNCH(where_kernel<float>, *it);
}

extern "C" lt_status lt_cuda_clamp(lt_compute ck, const lt_iter *it, double lo, int has_lo, double hi, int has_hi,
                                   lt_cuda_stream s) {
  if (ck == LT_COMPUTE_F64)
    LAUNCH(clamp_kernel<double>, *it, lo, has_lo, hi, has_hi);
  if (ck == LT_COMPUTE_I64)
    LAUNCH(clamp_kernel<int64_t>, *it, (int64_t)lo, has_lo, (int64_t)hi, has_hi);
  LAUNCH(clamp_kernel<float>, *it, (float)lo, has_lo, (float)hi, has_hi);
}
