/*
 * elementwise.cu: copy, fill, unary, binary (tensor or number), where and
 * clamp on the GPU over an lt_iter (any strides, broadcasting by zero
 * strides, mixed dtypes), computing in f32 (f32/bf16/f16), f64 or i64 as
 * the host chose, with the same formulas and NaN rules as kernels/cpu.
 * One thread per element in a grid-stride loop.
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

#define GELU_K 0.7978845608028654
#define GELU_C 0.044715

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
  case LT_UNARY_GELU: return (T)0.5 * a * (one + m_tanh((T)GELU_K * (a + (T)GELU_C * a * a * a)));
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
  case LT_BINARY_GELU_GRAD: {
    T u = (T)GELU_K * (a + (T)GELU_C * a * a * a), t = m_tanh(u);
    T du = (T)GELU_K * (one + (T)(3 * GELU_C) * a * a);
    return b * ((T)0.5 * (one + t) + (T)0.5 * a * (one - t * t) * du);
  }
  case LT_BINARY_SILU_GRAD: {
    T sg = one / (one + m_exp(-a));
    return b * sg * (one + a * (one - sg));
  }
  default: return a;
  }
}

__device__ __forceinline__ int64_t ipow(int64_t x, int64_t e) {
  if (e < 0)
    return x == 1 ? 1 : x == -1 ? ((e & 1) ? -1 : 1) : 0;
  uint64_t r = 1, b = (uint64_t)x;
  while (e) {
    if (e & 1)
      r *= b;
    b *= b;
    e >>= 1;
  }
  return (int64_t)r;
}

template <> __device__ __forceinline__ int64_t binary_op<int64_t>(int op, int64_t a, int64_t b) {
  switch (op) {
  case LT_BINARY_ADD: return (int64_t)((uint64_t)a + (uint64_t)b);
  case LT_BINARY_SUB: return (int64_t)((uint64_t)a - (uint64_t)b);
  case LT_BINARY_MUL: return (int64_t)((uint64_t)a * (uint64_t)b);
  case LT_BINARY_DIV: return b == 0 ? 0 : a / b;
  case LT_BINARY_POW: return ipow(a, b);
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

extern "C" lt_status lt_cuda_copy(const lt_iter *it, lt_cuda_stream s) {
  int dd = it->dtypes[0], sd = it->dtypes[1];
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
  if (dt == LT_DTYPE_F64)
    LAUNCH(fill_kernel<double>, *it, value);
  if (is_float_dt(dt))
    LAUNCH(fill_kernel<float>, *it, (float)value);
  if (dt == LT_DTYPE_BOOL)
    LAUNCH(fill_kernel<int64_t>, *it, (int64_t)(value != 0));
  /* integers: truncate toward zero, NaN -> 0, saturate (then wrap on store) */
  int64_t v = value != value ? 0 : value >= 9223372036854775807.0 ? INT64_MAX
              : value <= -9223372036854775808.0 ? INT64_MIN : (int64_t)value;
  LAUNCH(fill_kernel<int64_t>, *it, v);
}

extern "C" lt_status lt_cuda_unary(lt_unary_op op, lt_compute ck, const lt_iter *it, lt_cuda_stream s) {
  if (ck == LT_COMPUTE_F64)
    LAUNCH(unary_kernel<double>, *it, (int)op);
  if (ck == LT_COMPUTE_I64)
    LAUNCH(unary_kernel<int64_t>, *it, (int)op);
  LAUNCH(unary_kernel<float>, *it, (int)op);
}

extern "C" lt_status lt_cuda_binary(lt_binary_op op, lt_compute ck, const lt_iter *it, lt_cuda_stream s) {
  if (ck == LT_COMPUTE_F64)
    LAUNCH(binary_kernel<double>, *it, (int)op);
  if (ck == LT_COMPUTE_I64)
    LAUNCH(binary_kernel<int64_t>, *it, (int)op);
  LAUNCH(binary_kernel<float>, *it, (int)op);
}

extern "C" lt_status lt_cuda_binary_scalar(lt_binary_op op, lt_compute ck, const lt_iter *it, double v, int reversed,
                                           lt_cuda_stream s) {
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
