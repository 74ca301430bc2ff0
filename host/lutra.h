/*
 * lutra.h: the public C API of lutra's core (tensors, ops, RNG, errors).
 *
 * This is the one header the LuaJIT FFI reads: the build copies the text between
 * the LT_FFI_BEGIN and LT_FFI_END marker lines into the string that
 * `ffi.cdef` loads (see tools/embed.c), so that part holds no preprocessor
 * lines, passes no struct by value and writes sizes as int64_t.
 *
 * Conventions (ARCHITECTURE.md, "C conventions"):
 * - Dimensions are 0-based here; the Lua layer maps 1-based and negative dims.
 * - Index tensors (index_select, gather, scatter_add, argmax results) hold
 *   0-based positions, as token ids are 0-based values.
 * - Fallible functions return lt_status; on failure lt_last_error() names the
 *   op, the shapes, dtypes and devices involved. Outputs are written through
 *   `lt_tensor **out` parameters and carry one reference owned by the caller.
 * - Ops that take `lt_tensor *out` write into it when it is not NULL (it must
 *   have the result's shape and live on the same device) and return it
 *   retained in *res; with NULL they allocate the result.
 */
#ifndef LUTRA_H
#define LUTRA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* LT_FFI_BEGIN */
typedef enum lt_status {
  LT_OK = 0,
  LT_ERR_ARG = 1,         /* a bad argument: dims, sizes, values */
  LT_ERR_SHAPE = 2,       /* shapes that do not fit together */
  LT_ERR_DTYPE = 3,       /* a dtype the op does not take */
  LT_ERR_DEVICE = 4,      /* a device that is absent or mismatched */
  LT_ERR_OOM = 5,         /* an allocation failed */
  LT_ERR_UNSUPPORTED = 6, /* the backend lacks this op */
  LT_ERR_IO = 7,
  LT_ERR_INTERRUPTED = 8, /* SIGINT arrived: the op did not run */
  LT_ERR_INTERNAL = 9
} lt_status;

typedef enum lt_dtype {
  LT_DTYPE_F32 = 0,
  LT_DTYPE_F64 = 1,
  LT_DTYPE_BF16 = 2,
  LT_DTYPE_F16 = 3,
  LT_DTYPE_I8 = 4,
  LT_DTYPE_U8 = 5,
  LT_DTYPE_U16 = 6,
  LT_DTYPE_I32 = 7,
  LT_DTYPE_I64 = 8,
  LT_DTYPE_BOOL = 9,
  LT_DTYPE_COUNT = 10
} lt_dtype;

/* A device is one int: LT_DEVICE_CPU, or LT_DEVICE_CUDA + N for cuda:N. */
typedef int32_t lt_device;
enum { LT_DEVICE_CPU = 0, LT_DEVICE_CUDA = 256, LT_MAX_DIMS = 8 };

typedef enum lt_unary_op {
  LT_UNARY_NEG = 0, LT_UNARY_ABS, LT_UNARY_EXP, LT_UNARY_LOG, LT_UNARY_SQRT,
  LT_UNARY_RSQRT, LT_UNARY_TANH, LT_UNARY_SIGMOID, LT_UNARY_SIGN,
  LT_UNARY_GELU, /* tanh approximation, as GPT-2: 0.5x(1 + tanh(sqrt(2/pi)(x + 0.044715x^3))) */
  LT_UNARY_SILU, /* x * sigmoid(x) */
  LT_UNARY_COUNT
} lt_unary_op;

typedef enum lt_binary_op {
  LT_BINARY_ADD = 0, LT_BINARY_SUB, LT_BINARY_MUL, LT_BINARY_DIV, LT_BINARY_POW,
  LT_BINARY_MAXIMUM, LT_BINARY_MINIMUM,
  LT_BINARY_EQ, LT_BINARY_NE, LT_BINARY_LT, LT_BINARY_LE, LT_BINARY_GT, LT_BINARY_GE,
  LT_BINARY_GELU_GRAD, /* (x, g) -> g * gelu'(x), the backward of LT_UNARY_GELU */
  LT_BINARY_SILU_GRAD, /* (x, g) -> g * silu'(x) */
  LT_BINARY_COUNT
} lt_binary_op;

typedef enum lt_reduce_op {
  LT_REDUCE_SUM = 0, LT_REDUCE_MEAN, LT_REDUCE_MAX, LT_REDUCE_MIN,
  LT_REDUCE_ARGMAX, LT_REDUCE_ARGMIN, LT_REDUCE_VAR, LT_REDUCE_STD, LT_REDUCE_COUNT
} lt_reduce_op;

typedef struct lt_tensor lt_tensor;
typedef struct lt_generator lt_generator;

/* ---- errors, version, configuration ---------------------------------- */

/* The message of the last failure on this thread ("" when none). */
const char *lt_last_error(void);
/* Sets that message (for callers reporting their own failures); returns st. */
lt_status lt_set_last_error(lt_status st, const char *msg);
/* lutra's version, e.g. "0.1.0". */
const char *lt_version(void);
/* Number of CUDA devices usable now (0 when CUDA is not compiled in or no
   driver/device is present); *why receives the reason when 0 (static text). */
int lt_cuda_device_count(const char **why);
/* The CUDA caching allocator of device N (host/cuda/backend.c), in bytes:
   bytes in live tensors (rounded to the allocator's size classes), bytes
   held from the driver (live plus cached), and the peak of live since the
   start or the last lt_cuda_reset_peak. Zeros without CUDA. */
void lt_cuda_memory_stats(int device_index, int64_t *allocated, int64_t *reserved, int64_t *peak);
void lt_cuda_reset_peak(int device_index);
/* Returns device N's cached blocks to the driver (waits for its stream). */
void lt_cuda_empty_cache(int device_index);
/* Waits for device N's queued work; errors of kernels that failed since. */
lt_status lt_cuda_synchronize(int device_index);
/* Where device N's time goes (host/cuda/profile.c): after profile_start,
   each piece of work lutra queues on the device's compute stream (kernel,
   cuBLASLt product, cuDNN attention, copy) is followed by a timing event
   named for it; profile_stop waits for the device and returns, per name,
   the calls and milliseconds from the event before each piece to its own
   (largest first; *rows freed with lt_cuda_profile_free), the span from
   start to the last piece, and how many pieces went unrecorded beyond
   65536. A piece's time is its run time while the device has work queued
   ahead; a wait for the host counts to the next piece. Errors: start while
   a profile runs, stop without one, no CUDA or no such device, a failed
   event (its CUDA error). */
typedef struct lt_cuda_profile_row {
  char name[64];
  int64_t calls;
  double ms;
} lt_cuda_profile_row;
lt_status lt_cuda_profile_start(int device_index);
lt_status lt_cuda_profile_stop(lt_cuda_profile_row **rows, int *nrows, double *total_ms, int64_t *dropped);
void lt_cuda_profile_free(lt_cuda_profile_row *rows);
/* Names the phase of the work that follows ("forward", at most 23 bytes):
   its pieces are named "phase: name" until the next call (NULL or "" ends
   it; profile_start clears it). */
void lt_cuda_profile_phase(const char *name);
/* Whether a profile runs; names the piece of work just queued (kernels/cuda,
   host/cuda/cublaslt.c, host/cuda/cudnn-attention.c: cheap when not profiling). */
int lt_cuda_profiling(void);
void lt_cuda_profile_mark(const char *what);
/* Whether f32 matrix products on CUDA may use TF32 (default off). */
void lt_cuda_set_allow_tf32(int on);
/* On: cuDNN's attention backward writes dQ without atomics (cudnn-frontend's
   deterministic graph: more workspace), so attention gradients repeat bit
   for bit; off by default (as torch.use_deterministic_algorithms). It is
   read at the forward: the backward of an attention follows the setting its
   forward ran under. */
void lt_cuda_set_deterministic(int on);
/* The setting lt_cuda_set_deterministic made (0 or 1). */
int lt_cuda_deterministic(void);
/* The version of the cuDNN that attention uses, as cudnnGetVersion gives it
   (91900 for 9.19.0; as torch.backends.cudnn.version()), loading it on first
   call; 0 where it cannot be loaded or lutra was built without CUDA or
   without cuDNN's headers. */
int64_t lt_cudnn_version(void);
/* cuDNN's description of device device_index (its device property
   descriptor's JSON, cuDNN 9.8+; what tests/ref/cudnn-device-h200.json
   stands in for) into buf (cap bytes, NUL-terminated; its length in *len).
   Errors: no such device, a cuDNN that cannot describe it, cap too small. */
lt_status lt_cudnn_device_properties(int device_index, char *buf, int64_t cap, int64_t *len);
/* Whether the build includes CUDA / MPI (1) or not (0). */
int lt_has_cuda(void);
int lt_has_mpi(void);
/* Several lines describing this build and what was found at run time: lutra's
   version, BLAS, CUDA (compiled in, runtime and driver, devices), MPI. */
const char *lt_build_info(void);
/* Seconds on a monotonic clock (for timing; the origin is arbitrary). */
double lt_clock(void);
/* OpenMP threads used by CPU kernels; set_num_threads clamps n to 1..1024. */
int lt_num_threads(void);
void lt_set_num_threads(int n);
/* Raised by the SIGINT handler: the next op fails with LT_ERR_INTERRUPTED. */
void lt_interrupt(void);
void lt_clear_interrupt(void);
int lt_is_interrupted(void);
/* The name of the outermost lutra op running on the calling thread ("matmul",
   "all_reduce", ...), or NULL between ops: how the SIGINT machinery tells a
   long op (the interrupt is taken when it returns) from a compiled Lua loop.
   Async-signal-safe (it reads a thread-local). */
const char *lt_op_running(void);
/* Defers interrupts while on (nonzero): ops do not fail with
   LT_ERR_INTERRUPTED and the pending interrupt is kept, for work that must not
   stop halfway (an optimizer update); the caller checks lt_is_interrupted()
   after turning it off. what (copied; may be NULL) says what it waits for,
   for the message after a Ctrl-C that waits ("the optimizer step"). */
void lt_interrupt_defer(int on, const char *what);
/* What a deferral on now waits for (its what, or "" without one), or NULL when
   interrupts are not deferred. Async-signal-safe. */
const char *lt_interrupt_deferred(void);

/* ---- dtypes and devices ---------------------------------------------- */

const char *lt_dtype_name(lt_dtype dtype);               /* "f32", "bf16", ... */
lt_status lt_dtype_parse(const char *name, lt_dtype *out); /* also "float32", "float", "int64", ... */
int64_t lt_dtype_size(lt_dtype dtype);                    /* bytes per element */
int lt_dtype_is_float(lt_dtype dtype);
/* The dtype torch's type promotion gives for a op b. */
lt_dtype lt_dtype_promote(lt_dtype a, lt_dtype b);
/* Parses "cpu", "cuda", "cuda:N". */
lt_status lt_device_parse(const char *name, lt_device *out);
/* Writes "cpu" or "cuda:N" into buf (at least 16 bytes) and returns buf. */
const char *lt_device_name(lt_device device, char *buf);

/* ---- tensor objects --------------------------------------------------- */

void lt_tensor_retain(lt_tensor *t);
void lt_tensor_release(lt_tensor *t);
/* Drops t's data now when the caller holds the only reference (Lua's
   t:free()); the header stays until its last release, marked freed, so any
   later use fails with a message instead of touching freed memory. */
void lt_tensor_free_data(lt_tensor *t);
/* Sharded parameters (ZeRO stage 3, FSDP's "resharding"): lt_tensor_drop_data
   frees the memory of t's storage while every view of it, including those
   autograd saved, stays alive; any op given one of them then fails naming
   the argument. lt_tensor_restore_data allocates it again (t must span its
   whole storage: contiguous, offset 0) and copies src (same numel, any
   float dtype, same device) in without bumping the storage's version, so
   saved views read the same values again in backward. The caller must put
   back the values that were there (that is what the version promises).
   lt_tensor_has_data: 0 after a drop, 1 otherwise. */
lt_status lt_tensor_drop_data(lt_tensor *t);
lt_status lt_tensor_restore_data(lt_tensor *t, const lt_tensor *src);
int lt_tensor_has_data(const lt_tensor *t);
int lt_tensor_ndim(const lt_tensor *t);
int64_t lt_tensor_size(const lt_tensor *t, int dim);   /* dim 0-based, in range */
int64_t lt_tensor_stride(const lt_tensor *t, int dim); /* in elements */
int64_t lt_tensor_numel(const lt_tensor *t);
int64_t lt_tensor_offset(const lt_tensor *t);          /* storage offset, elements */
lt_dtype lt_tensor_dtype(const lt_tensor *t);
lt_device lt_tensor_device(const lt_tensor *t);
int lt_tensor_is_contiguous(const lt_tensor *t);
/* Whether a and b view the same storage. */
int lt_tensor_same_storage(const lt_tensor *a, const lt_tensor *b);
/* Address of element 0 for CPU tensors, NULL otherwise. */
void *lt_tensor_data(const lt_tensor *t);
/* Writes "[2, 3]" into buf (at least 200 bytes) and returns buf. */
const char *lt_tensor_shape_str(const lt_tensor *t, char *buf);

/* ---- creation ---------------------------------------------------------- */

/* Uninitialised contiguous tensor of the given shape. Errors: negative size,
   more than LT_MAX_DIMS dims, absent device, out of memory. */
lt_status lt_tensor_empty(int ndim, const int64_t *sizes, lt_dtype dtype, lt_device device, lt_tensor **out);
/* Every element set to value (converted to dtype with round-to-nearest-even). */
lt_status lt_tensor_full(int ndim, const int64_t *sizes, double value, lt_dtype dtype, lt_device device, lt_tensor **out);
/* 1-D [start, end) by step, as torch.arange: ceil((end - start) / step) elements. */
lt_status lt_tensor_arange(double start, double end, double step, lt_dtype dtype, lt_device device, lt_tensor **out);
/* A tensor of the given shape from n = numel doubles in row-major order. */
lt_status lt_tensor_from_f64(const double *values, int ndim, const int64_t *sizes, lt_dtype dtype, lt_device device, lt_tensor **out);
/* Copies t's numel elements in row-major order into dst as doubles (NaNs
   canonical: see lt_canonical_nans). */
lt_status lt_tensor_to_f64(const lt_tensor *t, double *dst, int64_t n);
/* The single element of a numel-1 tensor (a NaN canonical). */
lt_status lt_tensor_item(const lt_tensor *t, double *value);
/* Replaces every NaN of v[0..n) by the canonical quiet NaN (0x7ff8...). The
   C functions that hand doubles to Lua call it: LuaJIT keeps its other
   values inside NaN bit patterns, so a NaN with the sign bit and payload
   bits set (uninitialised memory, a bf16 NaN widened, a CPU propagating a
   NaN's payload) would read in Lua as nil, a table or a dangling pointer
   (lj_obj.h, "NaN-tagging"). */
void lt_canonical_nans(double *v, int64_t n);

/* ---- views: share storage, never copy ---------------------------------- */

/* New shape with the same numel; one size may be -1. Fails when the strides
   do not allow it (a transposed tensor): use reshape. */
lt_status lt_tensor_view(lt_tensor *t, int ndim, const int64_t *sizes, lt_tensor **out);
/* A view when the strides allow it, else a contiguous copy. */
lt_status lt_tensor_reshape(lt_tensor *t, int ndim, const int64_t *sizes, lt_tensor **out);
lt_status lt_tensor_transpose(lt_tensor *t, int dim0, int dim1, lt_tensor **out);
/* dims is a permutation of 0..ndim-1: result dim i is input dim dims[i]. */
lt_status lt_tensor_permute(lt_tensor *t, int ndim, const int64_t *dims, lt_tensor **out);
/* Elements start .. start+length-1 along dim (start 0-based). */
lt_status lt_tensor_narrow(lt_tensor *t, int dim, int64_t start, int64_t length, lt_tensor **out);
/* n (1..4) equal views of t along dim (0-based) into outs[0..n-1]
   (torch.chunk for sizes that divide evenly), one autograd node whose
   backward assembles the pieces' gradients in one pass (none when they
   already lie side by side in one buffer). Errors: a dim out of range, a
   size n does not divide. */
lt_status lt_tensor_chunk(lt_tensor *t, int n, int dim, lt_tensor **outs);
/* Removes dim, keeping element index (0-based). */
lt_status lt_tensor_select(lt_tensor *t, int dim, int64_t index, lt_tensor **out);
/* Broadcasts size-1 dims to sizes (-1 keeps a size; new leading dims allowed). */
lt_status lt_tensor_expand(lt_tensor *t, int ndim, const int64_t *sizes, lt_tensor **out);
/* Removes dim when its size is 1 (a no-op view otherwise); dim = -1 removes every size-1 dim. */
lt_status lt_tensor_squeeze(lt_tensor *t, int dim, lt_tensor **out);
/* Inserts a size-1 dim at position dim (0..ndim). */
lt_status lt_tensor_unsqueeze(lt_tensor *t, int dim, lt_tensor **out);
/* t itself (retained) when contiguous, else a contiguous copy. */
lt_status lt_tensor_contiguous(lt_tensor *t, lt_tensor **out);

/* ---- copies and conversion -------------------------------------------- */

/* dst <- src, broadcasting src to dst's shape, converting dtype (round to
   nearest even into bf16/f16; NaN and Inf kept; float to int truncates
   toward zero) and moving between devices. */
lt_status lt_tensor_copy_(lt_tensor *dst, const lt_tensor *src);
/* A contiguous copy in dtype on device; t itself (retained) when nothing changes. */
lt_status lt_tensor_to(lt_tensor *t, lt_dtype dtype, lt_device device, lt_tensor **out);
lt_status lt_tensor_clone(const lt_tensor *t, lt_tensor **out);
lt_status lt_tensor_fill_(lt_tensor *t, double value);

/* ---- elementwise ops with NumPy broadcasting --------------------------- */

/* Float ops (exp, log, sqrt, rsqrt, tanh, sigmoid) on integer tensors give f32. */
lt_status lt_unary(lt_unary_op op, const lt_tensor *a, lt_tensor *out, lt_tensor **res);
/* Result dtype: lt_dtype_promote(a, b); bool for comparisons; f32 for DIV of integers. */
lt_status lt_binary(lt_binary_op op, const lt_tensor *a, const lt_tensor *b, lt_tensor *out, lt_tensor **res);
/* a op s (or s op a when reversed != 0). The scalar keeps a's dtype unless a is
   integer and s is not a whole number (then f32), as torch treats Python scalars. */
lt_status lt_binary_scalar(lt_binary_op op, const lt_tensor *a, double s, int reversed, lt_tensor *out, lt_tensor **res);
/* cond ? a : b, elementwise; cond is nonzero-tests of any dtype. */
lt_status lt_where(const lt_tensor *cond, const lt_tensor *a, const lt_tensor *b, lt_tensor *out, lt_tensor **res);
/* min(max(a, lo), hi); a bound is ignored when its has_ flag is 0. */
lt_status lt_clamp(const lt_tensor *a, double lo, int has_lo, double hi, int has_hi, lt_tensor *out, lt_tensor **res);

/* ---- reductions ---------------------------------------------------------- */

/* Reduces over the ndims dims listed (0-based, distinct); ndims = 0 reduces
   over every dim. Accumulates in f64. SUM of integers gives i64; ARGMAX/ARGMIN
   take one dim (or all, over the flattened tensor) and give i64 positions;
   VAR divides by (count - correction); STD is its square root, taken in f64. MEAN and VAR need a float dtype.
   MAX/MIN/ARG* of an empty extent fail; SUM gives 0, MEAN NaN. */
lt_status lt_reduce(lt_reduce_op op, const lt_tensor *a, int ndims, const int64_t *dims, int keepdim, int64_t correction, lt_tensor **res);

/* ---- matrix products ------------------------------------------------------ */

/* torch.matmul: 1-D x 1-D is a dot product, 2-D x 2-D a matrix product, and
   more dims are batches that broadcast. f32 and f64 through BLAS; bf16/f16
   operands are computed in f32 and rounded once. Transposed views are passed
   to BLAS without copies. */
lt_status lt_matmul(const lt_tensor *a, const lt_tensor *b, lt_tensor **res);

/* ---- indexing (index tensors hold 0-based i32 or i64 positions) ----------- */

/* out = t with dim restricted to the rows in index (1-D). */
lt_status lt_index_select(const lt_tensor *t, int dim, const lt_tensor *index, lt_tensor **res);
/* The rows of weight (V, C) for ids (1-D, i32/i64, 0-based): index_select
   on dim 0 whose errors (found now or, on CUDA, at the next read) name the
   embedding and the id's position. */
lt_status lt_embedding(const lt_tensor *weight, const lt_tensor *ids, lt_tensor **res);
/* out[i][j] = t[i][index[i][j]] (for dim 1), index has t's ndim. */
lt_status lt_gather(const lt_tensor *t, int dim, const lt_tensor *index, lt_tensor **res);
/* t[i][index[i][j]] += src[i][j] (for dim 1), in order, deterministic. */
lt_status lt_scatter_add_(lt_tensor *t, int dim, const lt_tensor *index, const lt_tensor *src);
/* t.select(dim, index[i]) += src.select(dim, i), in order, deterministic. */
lt_status lt_index_add_(lt_tensor *t, int dim, const lt_tensor *index, const lt_tensor *src);

/* ---- fused neural-network ops (host/autograd/{norm,softmax,attention,loss,linear,rope}.c), with gradients */

/* LayerNorm over the last dim: (x - mean) / sqrt(var + eps) * w + b, var
   biased (Ba et al. 2016, as torch.nn.functional.layer_norm); w and b are
   (C) or NULL. Statistics in f32 (f64 for f64 inputs). */
lt_status lt_layer_norm(const lt_tensor *x, const lt_tensor *w, const lt_tensor *b, double eps, lt_tensor **y);
/* RMSNorm over the last dim: x / sqrt(mean(x^2) + eps) * w (Zhang and Sennrich 2019). */
lt_status lt_rms_norm(const lt_tensor *x, const lt_tensor *w, double eps, lt_tensor **y);
/* h = x + res and y = layer_norm(h) (rms: rms_norm(h), b must be NULL) in one
   pass over the rows, as a pre-norm transformer block adds its residual and
   normalises: x and res of the same shape and dtype; h and y in x's dtype.
   Backward sends the gradient of h, plus the norm's, to both x and res. */
lt_status lt_add_norm(int rms, const lt_tensor *x, const lt_tensor *res, const lt_tensor *w, const lt_tensor *b,
                      double eps, lt_tensor **h, lt_tensor **y);
/* Softmax (log = 0) or log-softmax (log = 1) along dim; a row that is all
   -inf gives zeros (softmax) instead of NaN. */
lt_status lt_softmax(const lt_tensor *x, int dim, int log, lt_tensor **y);
/* softmax(scale * x) over the last dim; causal: x is (..., T, S) attention
   scores and query t sees keys up to t + S - T (a mask aligned at the end,
   as torch's is_causal for S == T), the others give 0 and get no gradient.
   One pass: the scaled, masked scores are never written. */
lt_status lt_scaled_softmax(const lt_tensor *x, double scale, int causal, lt_tensor **y);
/* Fused scaled-dot-product attention: softmax(scale q k^T (causal: query t
   sees keys up to t + S - T)) v without storing the (T, S) scores, forward
   and backward (FlashAttention's online softmax; kernels/attention_rows.h).
   q (B, NH, T, HS), k and v (B, NKV, S, HS) with NKV dividing NH (grouped-
   query attention), one float dtype; HS at most 256 (else an
   LT_ERR_UNSUPPORTED error: the caller composes it from matmuls). On CUDA,
   bf16/f16 with HS 32, 64 or 128 run on tensor cores, reading q, k and v where
   they are (kernels/cuda/attention_mma.cu, after FlashAttention-2:
   probabilities rounded to the input dtype before the products, sums in
   f32; the output then has the layout of lt_attention_library's); other
   inputs in f32 (f64 for f64) a row at a time. Deterministic: no atomics. */
lt_status lt_attention(const lt_tensor *q, const lt_tensor *k, const lt_tensor *v, double scale, int causal,
                       lt_tensor **out);
/* Scaled-dot-product attention by the device's vendor library (cuDNN's
   fused flash attention on CUDA; FlashAttention-2, Dao 2023), forward and
   backward: q (B, NH, T, HS), k and v (B, NKV, S, HS), bf16 or f16, NKV
   dividing NH, causal only with T == S. The result is (B, NH, T, HS) laid
   out as (B, T, NH, HS). LT_ERR_UNSUPPORTED (with the reason) where there is
   no library, for other dtypes or shapes, or when the library refuses the
   shape: the caller then uses lt_attention or composes matmuls. */
lt_status lt_attention_library(const lt_tensor *q, const lt_tensor *k, const lt_tensor *v, double scale, int causal,
                               lt_tensor **out);
/* The linear layer y = act(x w^T + b) (torch.nn.functional.linear): x (...,
   in), w (out, in), b (out) or NULL, one float dtype; y (..., out). act: 0
   none, 1 GELU (tanh approximation, as LT_UNARY_GELU). On CUDA the bias and
   the GELU run in cuBLASLt's epilogue (the pre-activation written for the
   backward); elsewhere, or without such an algorithm, as matmul, add, gelu.
   Backward: g = dy (act 0) or dy gelu'(pre); dx = g w, dw = g^T x, db = the
   sum of g over rows. Errors name mismatched shapes and dtypes. */
lt_status lt_linear(const lt_tensor *x, const lt_tensor *w, const lt_tensor *b, int act, lt_tensor **y);
/* GPT-2's MLP as one op: y = gelu(x w1^T + b1) w2^T + b2, GELU in its tanh
   approximation; x (..., in), w1 (hidden, in), b1 (hidden) or NULL, w2
   (out, hidden), b2 (out) or NULL, one float dtype, one device; y (...,
   out). The forward is two lt_linear products (pre-activation and GELU
   output kept for the backward); the backward computes g1 = (dy w2)
   gelu'(pre) and db1 inside that product where the backend can (cuBLASLt's
   DGELU_BGRAD epilogue, as NVIDIA Apex's FusedDenseGeluDense), else as a
   product and LT_BINARY_GELU_GRAD, the same arithmetic as two lt_linear
   calls. Errors name mismatched shapes and dtypes. */
lt_status lt_mlp(const lt_tensor *x, const lt_tensor *w1, const lt_tensor *b1, const lt_tensor *w2,
                 const lt_tensor *b2, lt_tensor **y);
/* Cross-entropy of logits (N, W) against i32/i64 targets (N), fused with
   log-softmax; rows whose target is ignore_index do not count. reduction:
   0 mean over counted rows (0 when none count), 1 sum, 2 none (per row).
   classes > 0: only the first classes columns are logits, the rest padding
   (as llm.c pads GPT-2's vocabulary) that get zero gradient; 0 takes all.
   Logits with unit-stride rows are read where they lie. *count receives the
   counted rows; with count NULL a GPU does not wait to count them (the mean
   divides on the device). Errors name a target outside [0, classes); on a
   GPU that error comes at the next read from the device. */
lt_status lt_cross_entropy(const lt_tensor *logits, const lt_tensor *targets, int64_t ignore_index, int reduction,
                           int64_t classes, lt_tensor **loss, int64_t *count);
/* A model's head and its loss in one op: cross_entropy(x w^T, targets) for
   x (..., in) with rows, w (V, in) (no bias), targets (...) with x's leading
   dims (or flat, one per row); ignore_index, classes (of w's rows) and count
   as lt_cross_entropy's; reduction 0 mean, 1 sum. The logits (N, V) are
   never returned: when a gradient is needed the forward overwrites them
   with the gradient of the summed row losses, softmax - onehot (one kernel
   with the loss on a GPU: llm.c's fused classifier), and the backward
   scales the products (that w, that^T x) by 1 / count (mean) and the loss's
   gradient. Errors: devices, dtypes (x's and w's float dtype), shapes,
   reduction, classes, and those of lt_cross_entropy. */
lt_status lt_linear_cross_entropy(const lt_tensor *x, const lt_tensor *w, const lt_tensor *targets,
                                  int64_t ignore_index, int reduction, int64_t classes, lt_tensor **loss,
                                  int64_t *count);
/* Rotary position embeddings on x (..., T, D), Llama's half-split convention,
   angle (start + t) * base^(-2i/D) (Su et al. 2021). */
lt_status lt_rope(const lt_tensor *x, double base, int64_t start, lt_tensor **y);
/* How RoPE's frequencies are scaled for contexts past the trained one, as
   transformers' rope_scaling: LT_ROPE_LINEAR divides every frequency by
   factor (positions interpolated, Chen et al. 2023); LT_ROPE_LLAMA3 keeps the
   frequencies whose wavelength is under original_max / high_freq_factor,
   divides those over original_max / low_freq_factor by factor, and blends
   linearly between (Llama 3.1's _compute_llama3_parameters). */
enum { LT_ROPE_PLAIN = 0, LT_ROPE_LINEAR = 1, LT_ROPE_LLAMA3 = 2 };
typedef struct lt_rope_scaling {
  int kind;
  double factor, low_freq_factor, high_freq_factor, original_max;
} lt_rope_scaling;
/* lt_rope with the frequencies scaled (sc NULL: lt_rope). Errors: those of
   lt_rope, a factor <= 0, llama3's high_freq_factor <= low_freq_factor or
   original_max <= 0. */
lt_status lt_rope_scaled(const lt_tensor *x, double base, int64_t start, const lt_rope_scaling *sc, lt_tensor **y);

/* ---- random numbers: Philox4x32-10 (Salmon et al., SC'11, Random123) ----- */

/* A generator is (seed, offset): a draw of n elements uses the counters
   offset .. offset + ceil(n/4) - 1 under key seed, element i taking word
   i % 4 of counter offset + i / 4, and then advances offset past them, so a
   CUDA kernel computing element i alone draws the same number. */
lt_status lt_generator_new(uint64_t seed, lt_generator **out);
void lt_generator_release(lt_generator *g);
void lt_generator_get_state(const lt_generator *g, uint64_t *seed, uint64_t *offset);
void lt_generator_set_state(lt_generator *g, uint64_t seed, uint64_t offset);
/* Uniform in [lo, hi): u = (word >> 8) * 2^-24 for 24-bit floats, word * 2^-32
   for f64, then lo + (hi - lo) * u. */
lt_status lt_tensor_uniform_(lt_tensor *t, lt_generator *g, double lo, double hi);
/* Normal(mean, std) by Box-Muller (in f64) on word pairs (0,1) and (2,3). */
lt_status lt_tensor_normal_(lt_tensor *t, lt_generator *g, double mean, double std);
/* The raw block function: 4 words of output for counter ctr and key key. */
void lt_philox4x32_10(const uint32_t *ctr, const uint32_t *key, uint32_t *out);

/* ---- safetensors files (host/io/safetensors.c) ----------------------------- */

typedef struct lt_safetensors lt_safetensors;
/* Maps and validates a file (header length, JSON, dtypes, shapes, offsets
   that tile the data area); a bad file fails naming it and the tensor. */
lt_status lt_safetensors_open(const char *path, lt_safetensors **out);
/* The same over caller memory (kept by the caller while open); label names it in messages. */
lt_status lt_safetensors_open_memory(const void *data, size_t len, const char *label, lt_safetensors **out);
void lt_safetensors_close(lt_safetensors *f);
int64_t lt_safetensors_count(const lt_safetensors *f);
/* Name i (0-based, in header order), or NULL. */
const char *lt_safetensors_name(const lt_safetensors *f, int64_t i);
/* The __metadata__ object as JSON text ("{}" when absent). */
const char *lt_safetensors_metadata(const lt_safetensors *f);
/* A new CPU tensor holding a copy of the named tensor. */
lt_status lt_safetensors_get(const lt_safetensors *f, const char *name, lt_tensor **out);
/* Writes n named tensors (any device; copied to the host) and optional
   metadata (a JSON object of strings, or NULL) to a temporary file, fsyncs
   it and renames it to path. */
lt_status lt_safetensors_save(const char *path, int64_t n, const char *const *names, lt_tensor *const *tensors,
                              const char *metadata_json);

/* ---- GPT-2 byte-level BPE (host/io/tokenizer.c) ---------------------------- */

typedef struct lt_tokenizer lt_tokenizer;
/* Loads a tiktoken vocabulary ("base64 rank" lines, e.g. gpt2.tiktoken). */
lt_status lt_tokenizer_load_tiktoken(const char *path, lt_tokenizer **out);
/* The SHA-256 of a vocabulary file as 64 lowercase hex digits and a NUL
   (errors name the file: missing, unreadable, over 1 GiB). */
lt_status lt_tokenizer_file_sha256(const char *path, char hex[65]);
/* Loads GPT-2's encoder.json (and checks vocab.bpe's merges when given). */
lt_status lt_tokenizer_load_gpt2(const char *encoder_json, const char *vocab_bpe, lt_tokenizer **out);
/* The same from memory (label names the source in messages): fuzz targets. */
lt_status lt_tokenizer_parse_tiktoken(const char *data, size_t len, const char *label, lt_tokenizer **out);
lt_status lt_tokenizer_parse_gpt2(const char *json, size_t json_len, const char *bpe, size_t bpe_len,
                                  const char *label, lt_tokenizer **out);
void lt_tokenizer_free(lt_tokenizer *t);
/* Ranks plus <|endoftext|> (50257 for GPT-2). */
int64_t lt_tokenizer_vocab_size(const lt_tokenizer *t);
/* The id of <|endoftext|> (the first id after the ranks: 50256 for GPT-2). */
int32_t lt_tokenizer_eot(const lt_tokenizer *t);
/* Encodes len bytes of UTF-8 into *ids (n of them; free with lt_free).
   <|endoftext|> in the text is the special id when allow_special, else plain
   text. Invalid UTF-8 is replaced by U+FFFD per maximal subpart when
   replace_invalid, else an error giving its byte offset. */
lt_status lt_tokenizer_encode(const lt_tokenizer *t, const char *text, size_t len, int allow_special,
                              int replace_invalid, int32_t **ids, int64_t *n);
/* Encodes ndocs texts on all threads into one array (each followed by
   <|endoftext|> when append_eot); doc_ends[d] (if given) receives the end of
   document d in it. A failure names the document (1-based). */
lt_status lt_tokenizer_encode_many(const lt_tokenizer *t, int64_t ndocs, const char *const *texts,
                                   const size_t *lens, int allow_special, int replace_invalid, int append_eot,
                                   int32_t **ids, int64_t *n, int64_t *doc_ends);
/* The bytes of the ids (not necessarily valid UTF-8 when cut mid-character);
   free with lt_free. An id outside the vocabulary is an error with its position. */
lt_status lt_tokenizer_decode(const lt_tokenizer *t, const int32_t *ids, int64_t n, char **bytes, size_t *len);
/* Frees memory the tokenizer returned. */
void lt_free(void *p);

/* ---- token shards and the batch loader (host/io/loader.c) --------------------- */

/* Checks a shard image: llm.c's 256-int32 header (magic 20240520 version 1
   with uint16 tokens, or 20240801 version 7 with uint32) and a token count
   that matches len exactly. label names the file in messages. */
lt_status lt_shard_parse_header(const void *data, size_t len, const char *label, int64_t *ntokens, int *token_bytes);
/* Writes n token ids (each in [0, vocab_size)) as a shard, uint16 when the
   vocabulary fits, atomically (temporary file, fsync, rename). */
lt_status lt_shard_write(const char *path, const int32_t *ids, int64_t n, int64_t vocab_size);
/* Reads every token of a shard into a new 1-D i32 CPU tensor (checked as
   lt_shard_parse_header does; errors name the file). */
lt_status lt_shard_read(const char *path, lt_tensor **out);

typedef struct lt_loader lt_loader;
/* Opens shards as batches of B windows of T+1 tokens (x, y (B, T) i32).
   shuffle: order windows by (seed, epoch), else in file order. rank of
   world takes every world-th window of the first world * floor(windows /
   world) of each epoch's order (the rest are dropped, as torch's
   DistributedSampler with drop_last), so every rank reads the same number
   of windows per epoch and all change epoch at the same step; fewer
   windows than ranks is an error. max_epochs 0 runs forever, else the
   loader ends (x = y = NULL) after that many epochs (a last short batch is
   dropped). prefetch batches are prepared ahead on a background thread. */
lt_status lt_loader_open(int npaths, const char *const *paths, int64_t B, int64_t T, int shuffle, uint64_t seed,
                         int rank, int world, int64_t max_epochs, int prefetch, lt_loader **out);
/* The next batch (new references), or x = y = NULL at the end. */
lt_status lt_loader_next(lt_loader *l, lt_tensor **x, lt_tensor **y);
/* The position after the batches handed out: epoch and index in the rank's stream. */
void lt_loader_get_state(const lt_loader *l, int64_t *epoch, int64_t *index);
/* Continues from a position got from lt_loader_get_state. */
lt_status lt_loader_set_state(lt_loader *l, int64_t epoch, int64_t index);
int64_t lt_loader_num_windows(const lt_loader *l);
int64_t lt_loader_num_tokens(const lt_loader *l);
/* Full batches in one epoch of this rank's stream. */
int64_t lt_loader_batches_per_epoch(const lt_loader *l);
/* Windows this rank reads per epoch: floor(windows / world), the same on every rank. */
int64_t lt_loader_windows_per_epoch(const lt_loader *l);
void lt_loader_close(lt_loader *l);

/* ---- memory --------------------------------------------------------------- */

/* Bytes in live CPU tensors, bytes held (live plus cached), peak of live. */
void lt_cpu_memory_stats(int64_t *allocated, int64_t *reserved, int64_t *peak);
/* The peak of live CPU bytes starts again from what is live now. */
void lt_cpu_reset_peak(void);
/* ---- autograd (host/autograd/engine.c) --------------------------------------------- */

/* Grad mode: while on (the default), ops on tensors that require grad are
   recorded for backward. lt.no_grad turns it off around a function. */
void lt_set_grad_enabled(int on);
int lt_grad_enabled(void);
/* Marks a leaf float tensor as a parameter whose gradient backward computes. */
lt_status lt_tensor_requires_grad_(lt_tensor *t, int on);
int lt_tensor_requires_grad(const lt_tensor *t);
/* Leaves are tensors no recorded op produced. */
int lt_tensor_is_leaf(const lt_tensor *t);
/* The accumulated gradient (a new reference), or NULL. */
lt_tensor *lt_tensor_grad(const lt_tensor *t);
/* Replaces the gradient (NULL clears it); it must match t's shape, dtype, device. */
lt_status lt_tensor_set_grad(lt_tensor *t, lt_tensor *grad);
/* A tensor sharing t's data with no autograd history. */
lt_status lt_tensor_detach(lt_tensor *t, lt_tensor **out);
/* The name of the op that produced t ("MulBackward"), or NULL for leaves. */
const char *lt_tensor_grad_fn(const lt_tensor *t);
/* Keeps the gradient of a non-leaf in its .grad after backward. */
lt_status lt_tensor_retain_grad(lt_tensor *t);
/* Gives a leaf a hook id (0: none): backward reports its completed gradient
   to the hooks with it. Ids of leaves freed since come back from
   lt_autograd_take_dead_hooks. */
lt_status lt_tensor_set_hook_id(lt_tensor *t, int64_t id);
int64_t lt_tensor_hook_id(const lt_tensor *t);
int lt_autograd_take_dead_hooks(int64_t *ids, int max);
/* Records a custom function (at most 4 inputs and 4 outputs): the outputs
   get a node whose backward calls the backward hooks' custom(id, ...).
   Ids of such nodes freed since the last call come back from
   lt_autograd_take_dead_custom (up to max), so the caller can drop its state. */
lt_status lt_autograd_record_custom(int ninputs, lt_tensor *const *inputs, int noutputs,
                                    lt_tensor *const *outputs, int64_t id);
int lt_autograd_take_dead_custom(int64_t *ids, int max);

/* ---- optimizers (host/ops/optim.c; kernels/<backend>/optim) ----------------------- */

/* One AdamW step (Loshchilov and Hutter 2019, decoupled weight decay; the
   formulas of torch.optim.AdamW) over n parameters in one fused call. All
   tensors are contiguous and on one device; grads[i] has params[i]'s shape
   and dtype; exp_avg and exp_avg_sq are f32 (f64 for f64 parameters);
   masters[i] is the f32 master copy of a bf16/f16 parameter, which the step
   updates and rounds into the parameter (masters may be NULL when no
   parameter is 16-bit). step is this update's 1-based count (for the bias
   corrections 1 - beta^step). grad_scale (in [0, FLT_MAX]; 1 for none)
   multiplies each gradient as the step reads it, in the compute type (f32,
   f64 for f64 parameters), and leaves the gradients as they are: a global-
   norm clip's factor taken into the update, as llm.c's AdamW takes its
   grad_scale, instead of a pass over every gradient. Errors name the
   parameter by position: a missing gradient or state, shapes, dtypes,
   devices, bad settings. */
lt_status lt_adamw_step(int n, lt_tensor *const *params, lt_tensor *const *grads, lt_tensor *const *masters,
                        lt_tensor *const *exp_avg, lt_tensor *const *exp_avg_sq, double lr, double beta1,
                        double beta2, double eps, double weight_decay, int64_t step, double grad_scale);
/* One SGD step as torch.optim.SGD: weight decay added to the gradient,
   momentum with dampening (buffers as exp_avg above; NULL without momentum),
   Nesterov; first_step starts each buffer at the gradient. grad_scale as
   lt_adamw_step's (applied before the weight decay is added). */
lt_status lt_sgd_step(int n, lt_tensor *const *params, lt_tensor *const *grads, lt_tensor *const *masters,
                      lt_tensor *const *momentum_buffers, double lr, double momentum, double dampening,
                      double weight_decay, int nesterov, int first_step, double grad_scale);
/* The sum of squares of every element of n float tensors on one device,
   accumulated in f64 (the square of the global gradient norm). */
lt_status lt_grad_sum_squares(int n, lt_tensor *const *grads, double *out);

/* Returns cached CPU blocks to the system. */
void lt_cpu_empty_cache(void);
/* Bytes of tensor memory and headers allocated (any device) since the last
   call, which it resets. The Lua layer reports them to LuaJIT's collector,
   which otherwise sees only an 8-byte pointer per tensor and would let
   garbage tensors pile up. */
int64_t lt_take_alloc_pressure(void);
/* ---- durable files and preemption (host/io/fsio.c; lt.ckpt) ----------------------- */

/* Writes len bytes to path atomically: a temporary file beside it, fsync,
   rename, fsync of the directory. On failure the old file is untouched. */
lt_status lt_write_file_atomic(const char *path, const char *data, int64_t len);
/* fsync of a directory (so renames in it are durable). */
lt_status lt_fsync_dir(const char *path);
/* mkdir -p; an existing non-directory on the path is an error. */
lt_status lt_mkdir_p(const char *path);
/* rename(2), with the paths in the error. */
lt_status lt_rename(const char *from, const char *to);
/* rm -rf of path (not following symbolic links); absent is not an error. */
lt_status lt_remove_tree(const char *path);
/* The names in a directory (not . and ..), each NUL-terminated, back to
   back in *names (len bytes in all; free with lt_free). */
lt_status lt_dir_entries(const char *path, char **names, int64_t *len);
/* Whether a process with this id exists (kill(pid, 0)). */
int lt_process_alive(int pid);
/* 0: absent, 1: a file (or other non-directory), 2: a directory. */
int lt_path_kind(const char *path);
/* Catch SIGTERM and SIGUSR1 (on = 1) into a flag, or restore the previous
   handlers (on = 0). lt_preempt_signal() is the last such signal caught
   since lt_preempt_clear(), 0 for none. */
void lt_preempt_watch(int on);
int lt_preempt_signal(void);
void lt_preempt_clear(void);
/* ---- checksums (host/io/checksum.c; lt.ckpt) ------------------------------------------ */

/* CRC-32C (Castagnoli) of len bytes, continuing from crc (0 to start; the
   result of the bytes before): lt_crc32c(0, "123456789", 9) == 0xE3069283. */
uint32_t lt_crc32c(uint32_t crc, const void *data, int64_t len);
/* 1 when lt_crc32c uses the CPU's crc32 instruction (x86-64 SSE4.2), else 0;
   lt_crc32c_portable is the table-driven code it uses otherwise. */
int lt_crc32c_hardware(void);
uint32_t lt_crc32c_portable(uint32_t crc, const void *data, int64_t len);
/* The CRC-32C of A followed by B, from crc1 of A, crc2 of B and B's length. */
uint32_t lt_crc32c_combine(uint32_t crc1, uint32_t crc2, int64_t len2);
/* The CRC-32C of the whole file at path and its size in bytes, read in
   pieces by up to 8 threads for a large file. Errors name the file (and the
   byte offset of a failed read). */
lt_status lt_file_crc32c(const char *path, uint32_t *crc, int64_t *bytes);
/* ---- process groups and collectives (host/comm/comm.c) ------------------------------------

   One interface over MPI (CPU tensors, under mpirun) and a single process
   (every collective the identity); semantics as torch.distributed. Tensors
   are contiguous CPU tensors (f32, f64, bf16, f16 reduced in f32, i32, i64,
   u8). Each collective checks with the group that every rank passes the same
   op, dtype and size and calls it from the same place (the call site set by
   lt_comm_set_site; LUTRA_COMM_CHECK=0 skips the check) and fails on every
   rank naming the rank that differs (for call sites, every rank's). With
   work != NULL it returns a handle to lt_work_wait on; with NULL it
   completes before returning. A collective not complete after
   LUTRA_COMM_TIMEOUT seconds (default 600) prints rank, op, group, call
   number, size, call site and the ranks that never arrived, and aborts the
   job. */
typedef struct lt_comm lt_comm;
typedef struct lt_work lt_work;
typedef enum lt_comm_op { LT_COMM_SUM = 0, LT_COMM_AVG = 1, LT_COMM_MAX = 2, LT_COMM_MIN = 3 } lt_comm_op;
/* MPI_Init_thread under mpirun (OMPI_COMM_WORLD_SIZE > 1), else a single
   process; an error when mpirun started several ranks of a build without MPI. */
lt_status lt_dist_init(void);
int lt_dist_initialised(void);
int lt_dist_rank(void);
int lt_dist_world_size(void);
int lt_dist_local_rank(void);
/* MPI_Abort of the whole job (or _exit alone). */
void lt_dist_abort(int code);
void lt_dist_finalize(void);
void lt_comm_set_timeout(double seconds);
/* The call site (e.g. Lua's "file:line") the next collective on any group
   checks against the other ranks' and reports, with context (e.g. the
   callers, "file:line < file:line", shown in messages only; may be NULL).
   That collective takes it (site NULL or "": none, not checked). */
void lt_comm_set_site(const char *site, const char *context);
lt_comm *lt_comm_world(void);
/* MPI_Comm_split: ranks with the same color form a group, ordered by key. */
lt_status lt_comm_split(lt_comm *parent, int color, int key, lt_comm **out);
void lt_comm_free(lt_comm *c);
int lt_comm_rank(const lt_comm *c);
int lt_comm_size(const lt_comm *c);
int lt_comm_id(const lt_comm *c);
lt_status lt_comm_barrier(lt_comm *c);
/* A rank whose arguments to a collective on c were refused before it could
   take part tells the group so (in the place of the call's agreement
   exchange), so the others fail naming it instead of waiting or reporting a
   mismatch with its next call. Returns LT_OK; the caller raises its own error. */
lt_status lt_comm_refuse(lt_comm *c);
/* in place over the group */
lt_status lt_comm_all_reduce(lt_comm *c, lt_tensor *t, lt_comm_op op, lt_work **work);
lt_status lt_comm_broadcast(lt_comm *c, lt_tensor *t, int root, lt_work **work);
/* counts[r] (size entries) = the dim-0 rows rank r passes to all_gather;
   out then holds their sum of rows, in rank order */
lt_status lt_comm_all_gather_rows(lt_comm *c, const lt_tensor *t, int64_t *counts);
lt_status lt_comm_all_gather(lt_comm *c, lt_tensor *out, const lt_tensor *t, const int64_t *counts, lt_work **work);
/* rank r gets chunk r of t's dim-0 rows (lt_comm_chunk's split) reduced over the group */
lt_status lt_comm_reduce_scatter(lt_comm *c, lt_tensor *out, lt_tensor *t, lt_comm_op op, lt_work **work);
/* rows split into size chunks, the first rows % size one longer (torch.tensor_split) */
void lt_comm_chunk(int64_t rows, int size, int rank, int64_t *start, int64_t *len);
lt_status lt_comm_send(lt_comm *c, const lt_tensor *t, int dst);
lt_status lt_comm_recv(lt_comm *c, lt_tensor *t, int src);
/* Asynchronous point to point without a header: the transfer starts, *work
   completes it (t must stay alive and, for isend, unchanged until then).
   t: contiguous (else LT_ERR_ARG), f32, f64, bf16, f16, i32, i64 or u8; on
   the CPU through MPI (an implementation without point to point, NCCL's for
   CUDA tensors, refuses: LT_ERR_UNSUPPORTED); sizes are t's bytes. Messages
   between two ranks match by tag (0 <= tag < 2^20). Fails (LT_ERR_ARG) for
   a peer that is not another rank of c, an empty tensor, a tag out of range
   or a message over 2 GiB; an irecv's wait fails (LT_ERR_SHAPE) naming both
   sizes when the message's bytes differ from t's. The watchdog covers the
   wait (the peer named). MPI moves the data only inside its calls. */
lt_status lt_comm_isend(lt_comm *c, const lt_tensor *t, int dst, int tag, lt_work **work);
lt_status lt_comm_irecv(lt_comm *c, lt_tensor *t, int src, int tag, lt_work **work);
lt_status lt_work_wait(lt_work *w);
/* One poll: 1 when complete (MPI moves data only inside its calls, so
   polling in-flight work during backward makes it progress). */
int lt_work_test(lt_work *w);
void lt_work_free(lt_work *w);
/* LT_FFI_END */

/*
 * Backward, outside the FFI part: it calls back into Lua (gradient-ready hooks,
 * custom functions), which LuaJIT allows only from a classic lua_CFunction
 * (bindings/autograd.c), never from a function called through the FFI.
 */
typedef struct lt_backward_hooks {
  /* a hooked leaf's gradient is complete (grad is its .grad) */
  lt_status (*leaf_ready)(void *ctx, int64_t hook_id, lt_tensor *grad);
  /* a custom function's backward: grad_inputs[i] receive new references or NULL */
  lt_status (*custom)(void *ctx, int64_t id, int noutputs, lt_tensor *const *grad_outputs, int ninputs,
                      lt_tensor **grad_inputs);
  void *ctx;
} lt_backward_hooks;

/* Runs backward from root with gradient grad (NULL: 1 for a one-element
   root), accumulating into the .grad of leaves. Frees the graph's saved
   tensors unless retain_graph. Errors: root does not require grad; a
   non-scalar root without grad; grad of another shape, or on another device
   (its dtype is converted, as torch); a second backward through a freed graph; a
   saved tensor modified in place; a hook's error. */
lt_status lt_autograd_backward(lt_tensor *root, lt_tensor *grad, int retain_graph,
                               const lt_backward_hooks *hooks);

#ifdef __cplusplus
}
#endif

#endif
