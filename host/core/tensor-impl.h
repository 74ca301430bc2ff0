/*
 * core/tensor-impl.h: layouts the FFI never sees: storages, tensors, the backend
 * vtable, and the strided-iteration descriptors that the host hands to kernels.
 *
 * Relies on lutra.h for the public enums. Kernels include this header (and
 * iter layouts) but allocate nothing and keep no state.
 */
#ifndef LUTRA_TENSOR_IMPL_H
#define LUTRA_TENSOR_IMPL_H

#include "lutra.h"
#include "backend/index-report.h"

#include <stdbool.h>

struct lt_backend_i;

/* A reference-counted block of memory on one device. */
typedef struct lt_storage {
  int64_t refcount;
  uint64_t version; /* bumped by every in-place write: autograd checks saved tensors */
  void *data;
  size_t nbytes;
  lt_device device;
  const struct lt_backend_i *backend;
} lt_storage;

/* A view: shape, strides (in elements) and offset into a storage. */
struct lt_tensor {
  int64_t refcount;
  lt_storage *storage;
  int64_t offset;
  int ndim;
  lt_dtype dtype;
  int64_t sizes[LT_MAX_DIMS];
  int64_t strides[LT_MAX_DIMS];
  void *autograd; /* autograd's metadata, NULL for none; it starts with an lt_meta_free_fn */
};

/* How lt_tensor_release frees t's metadata: the first member of what
   t->autograd points at (autograd/autograd.h's lt_autograd_meta). */
typedef void (*lt_meta_free_fn)(lt_tensor *t);

/* The arithmetic type an elementwise op or conversion runs in. */
typedef enum lt_compute {
  LT_COMPUTE_F32 = 0, /* f32, bf16, f16 (and small integers into floats) */
  LT_COMPUTE_F64 = 1,
  LT_COMPUTE_I64 = 2, /* integers and bool */
} lt_compute;

/*
 * An elementwise iteration over up to 4 operands (operand 0 is the output),
 * all of the same logical shape after broadcasting. The host has already
 * dropped size-1 dims, merged dims that are contiguous in every operand and
 * ordered them so the last dim is the innermost. Strides are in elements.
 */
enum { LT_ITER_MAX_OPS = 4 };
typedef struct lt_iter {
  int ndim;
  int nops;
  int64_t numel;
  int64_t shape[LT_MAX_DIMS];
  char *data[LT_ITER_MAX_OPS];
  int64_t strides[LT_ITER_MAX_OPS][LT_MAX_DIMS];
  lt_dtype dtypes[LT_ITER_MAX_OPS];
} lt_iter;

/*
 * A reduction: the output has nkeep dims (out_strides), the input the same
 * nkeep dims (in_keep_strides) followed by nred reduced dims. Sizes of 0 are
 * possible on both sides.
 */
typedef struct lt_reduce_iter {
  int nkeep, nred;
  int64_t keep_shape[LT_MAX_DIMS];
  int64_t red_shape[LT_MAX_DIMS];
  int64_t out_strides[LT_MAX_DIMS];
  int64_t in_keep_strides[LT_MAX_DIMS];
  int64_t in_red_strides[LT_MAX_DIMS];
  int64_t out_numel, red_numel;
  char *out;
  const char *in;
  lt_dtype out_dtype, in_dtype;
} lt_reduce_iter;

/* BGRAD_A: the product also writes bias[i] = the sum over k of A[i, k]
   (A's row sums, m of them: a linear layer's bias gradient when A = g^T).
   DGELU: c = (a b) * gelu'(aux), aux (m x n) read, not written (the
   backward of a GELU whose input aux holds: cuBLASLt's
   CUBLASLT_EPILOGUE_DGELU); DGELU_BGRAD also writes bias[j] = the sum over
   rows of that c (n of them: the bias gradient of the layer before the GELU) */
typedef enum {
  LT_EPILOGUE_NONE = 0, LT_EPILOGUE_BIAS, LT_EPILOGUE_GELU, LT_EPILOGUE_GELU_BIAS, LT_EPILOGUE_BGRAD_A,
  LT_EPILOGUE_DGELU, LT_EPILOGUE_DGELU_BGRAD
} lt_epilogue;

/* whether the epilogue takes a bias vector (read, or written by a BGRAD) */
static inline int lt_epilogue_has_bias(lt_epilogue e) {
  return e == LT_EPILOGUE_BIAS || e == LT_EPILOGUE_GELU_BIAS || e == LT_EPILOGUE_BGRAD_A || e == LT_EPILOGUE_DGELU_BGRAD;
}
/* whether it takes an aux matrix (written by GELU, read by DGELU) */
static inline int lt_epilogue_has_aux(lt_epilogue e) {
  return e == LT_EPILOGUE_GELU || e == LT_EPILOGUE_GELU_BIAS || e == LT_EPILOGUE_DGELU || e == LT_EPILOGUE_DGELU_BGRAD;
}

/*
 * A batch of matrix products C[b] = A[b] @ B[b], each operand given by its
 * base address, a batch stride per batch dim, and its row and column strides.
 */
typedef struct lt_matmul_desc {
  int64_t m, n, k;
  int nbatch_dims;
  int64_t batch_shape[LT_MAX_DIMS];
  int64_t a_batch_strides[LT_MAX_DIMS], b_batch_strides[LT_MAX_DIMS], c_batch_strides[LT_MAX_DIMS];
  int64_t a_rs, a_cs, b_rs, b_cs, c_rs; /* c is row-major: c_cs = 1 */
  const char *a, *b;
  char *c;
  lt_dtype dtype; /* f32 or f64; bf16 or f16 where the backend has native_half_matmul */
  /* epilogue (only to backends with matmul_epilogues, one 2-D product):
     c = act(a b + bias) with bias (n) of dtype; with GELU the
     pre-activation a b + bias is also written to aux (m x n, row stride
     aux_rs); with BGRAD_A, bias (m) receives a's row sums; with DGELU
     c = (a b) gelu'(aux), aux read, and with DGELU_BGRAD bias (n) receives
     c's column sums;
     LT_ERR_UNSUPPORTED when the backend has no algorithm for it */
  lt_epilogue epilogue;
  const char *bias;
  char *aux;
  int64_t aux_rs;
} lt_matmul_desc;

/*
 * Indexing: t viewed as (outer, dim, inner) around the indexed dim. Used for
 * index_select (index 1-D) and index_add.
 */
typedef struct lt_index_desc {
  int64_t outer, inner;
  int64_t src_dim, dst_dim;      /* sizes of the indexed dim in source/destination */
  int64_t nindex;
  const char *index;
  lt_dtype index_dtype;
  int64_t index_stride;
} lt_index_desc;

/*
 * One parameter of an optimizer step, all contiguous on one device: the
 * parameter and its gradient (same dtype); master is the f32 copy of a
 * 16-bit parameter (NULL otherwise); m and v are the optimizer's state
 * (f32, or f64 for f64 parameters; v unused by SGD, m NULL for SGD without
 * momentum).
 */
typedef struct lt_optim_tensor {
  void *param;
  const void *grad;
  void *master, *m, *v;
  int64_t numel;
  lt_dtype dtype;
} lt_optim_tensor;

/* AdamW's settings for one step; bias corrections are 1 - beta^step;
   grad_scale multiplies every gradient as it is read (1: none). */
typedef struct lt_adamw_hparams {
  double lr, beta1, beta2, eps, weight_decay, bias_correction1, bias_correction2, grad_scale;
} lt_adamw_hparams;

typedef struct lt_sgd_hparams {
  double lr, momentum, dampening, weight_decay, grad_scale;
  int nesterov, first_step; /* first_step: the momentum buffer starts as the gradient */
} lt_sgd_hparams;

/* Backend vtable: one static const table per backend; optional entries are NULL. */
/* Attention on operands where they are: by a vendor library (cuDNN's fused
   flash attention on CUDA) or lutra's attention_half kernels: 16-bit q (B,
   NH, T, HS), k and v (B, NKV, S, HS), o and dout (B, NH, T, HS), any
   strides in elements whose last is 1 (the others multiples of 8, 16-byte
   aligned); stats f32 (B, NH, T) contiguous, the log-sum-exp of each
   query's scaled, masked scores. The forward reads q, k, v and writes o
   and stats; the backward reads q, k, v, o, dout and stats and writes dq,
   dk, dv (strides as q's, k's, v's fields say). causal: query t sees keys
   up to t + S - T (the library: T == S only). */
typedef struct lt_sdpa_desc {
  lt_device device;
  lt_dtype dtype;
  int64_t B, NH, NKV, T, S, HS;
  double scale;
  int causal;
  int deterministic; /* the backward without atomic adds: lt.cuda.deterministic as it was at the forward */
  const void *q, *k, *v, *dout;
  void *o, *stats, *dq, *dk, *dv;
  int64_t sq[4], sk[4], sv[4], so[4], sdo[4], sdq[4], sdk[4], sdv[4];
} lt_sdpa_desc;

/* An index check a backend finishes later: lt_index_report, LT_BAD_LATER
   and lt_index_report_fail are backend/index-report.h's. */
struct lt_backend_i;
/* Hands r to the backend (retaining r->index for it), after a kernel of it
   set *bad to LT_BAD_LATER. */
lt_status lt_index_defer(const struct lt_backend_i *be, const lt_index_report *r);

typedef struct lt_backend_i {
  const char *name;
  lt_status (*alloc)(lt_device device, size_t nbytes, void **ptr);
  void (*free)(lt_device device, void *ptr, size_t nbytes);
  /* copies between host memory and this device, contiguous bytes */
  lt_status (*copy_to_host)(lt_device device, void *dst, const void *src, size_t nbytes);
  lt_status (*copy_from_host)(lt_device device, void *dst, const void *src, size_t nbytes);
  lt_status (*synchronize)(lt_device device);
  /* elementwise: operand 0 is the output */
  lt_status (*copy)(const lt_iter *it);
  lt_status (*fill)(const lt_iter *it, double value);
  lt_status (*unary)(lt_unary_op op, lt_compute ck, const lt_iter *it);
  lt_status (*binary)(lt_binary_op op, lt_compute ck, const lt_iter *it);
  lt_status (*binary_scalar)(lt_binary_op op, lt_compute ck, const lt_iter *it, double s, int reversed);
  lt_status (*where)(lt_compute ck, const lt_iter *it);
  lt_status (*clamp)(lt_compute ck, const lt_iter *it, double lo, int has_lo, double hi, int has_hi);
  lt_status (*reduce)(lt_reduce_op op, const lt_reduce_iter *it, int64_t correction);
  lt_status (*matmul)(const lt_matmul_desc *d);
  int native_half_matmul; /* matmul takes bf16/f16 itself (f32 accumulation); else the host converts */
  /* matmul takes lt_matmul_desc's epilogues (bias, GELU with its aux) */
  int matmul_epilogues;
  /* the row kernels (norms, softmax, cross-entropy) take bf16/f16 rows
     themselves (computing in f32, statistics in f32); else the host
     converts the rows to f32 */
  int native_half_rows;
  /* takes a report (and its index reference) for the index kernel that just
     set *bad to LT_BAD_LATER; NULL for backends that check at once */
  lt_status (*defer_index_report)(const lt_index_report *r);
  /* index kernels return LT_OK (*bad LT_BAD_LATER: the check finishes later,
     see defer_index_report), or LT_ERR_ARG with *bad set to the position
     of the first out-of-range index */
  lt_status (*index_select)(const lt_index_desc *d, char *dst, const char *src, int64_t elsize, int64_t *bad);
  lt_status (*index_add)(const lt_index_desc *d, char *dst, const char *src, lt_dtype dtype, int64_t *bad);
  lt_status (*gather)(const lt_iter *it, int64_t dim_stride_t, int64_t dim_size, int64_t *bad);
  lt_status (*scatter_add)(const lt_iter *it, int64_t dim_stride_t, int64_t dim_size, int64_t *bad);
  lt_status (*uniform)(char *dst, lt_dtype dtype, int64_t n, uint64_t seed, uint64_t offset, double lo, double hi);
  /* fused nn kernels on contiguous rows of dtype dt (f32 or f64, see
     kernels/cpu/cpu.h; bf16/f16 with native_half_rows); statistics (mean,
     rstd, lse, per-row losses and gradient scales) are f64 for f64 rows,
     else f32 */
  /* norms; with res (else NULL) the input is h = x + res, written to h (the
     residual add fused in); backward adds dadd (else NULL) into dx */
  lt_status (*layer_norm_fwd)(lt_dtype dt, const void *x, const void *res, const void *w, const void *b, void *y,
                              void *h, void *mean, void *rstd, int64_t N, int64_t C, double eps);
  lt_status (*layer_norm_bwd)(lt_dtype dt, const void *dy, const void *x, const void *w, const void *mean,
                              const void *rstd, const void *dadd, void *dx, void *dw, void *db, int64_t N, int64_t C);
  lt_status (*rms_norm_fwd)(lt_dtype dt, const void *x, const void *res, const void *w, void *y, void *h, void *rstd,
                            int64_t N, int64_t C, double eps);
  lt_status (*rms_norm_bwd)(lt_dtype dt, const void *dy, const void *x, const void *w, const void *rstd,
                            const void *dadd, void *dx, void *dw, int64_t N, int64_t C);
  /* softmax of scale * x over rows of C; causal > 0: row r is query r % causal
     of causal queries, seeing the first r % causal + C - causal + 1 entries
     (the rest give 0); backward multiplies by scale */
  lt_status (*softmax_fwd)(lt_dtype dt, const void *x, void *y, int64_t N, int64_t C, int logsm, double scale,
                           int64_t causal);
  lt_status (*softmax_bwd)(lt_dtype dt, const void *y, const void *dy, void *dx, int64_t N, int64_t C,
                           int logsm, double scale);
  /* fused attention (kernels/attention_rows.h) on contiguous f32/f64 rows:
     q, o (B, NH, T, HS), k, v (B, NKV, S, HS), lse (B, NH, T); backward
     takes D (B, NH, T) scratch and writes dq, dk, dv */
  lt_status (*attention_fwd)(lt_dtype dt, const void *q, const void *k, const void *v, void *o, void *lse, int64_t B,
                             int64_t NH, int64_t NKV, int64_t T, int64_t S, int64_t HS, double scale, int causal);
  lt_status (*attention_bwd)(lt_dtype dt, const void *q, const void *k, const void *v, const void *o,
                             const void *dout, const void *lse, void *D, void *dq, void *dk, void *dv, int64_t B,
                             int64_t NH, int64_t NKV, int64_t T, int64_t S, int64_t HS, double scale, int causal);
  /* lutra's fused attention on 16-bit operands where they are (lt_sdpa_desc,
     as the library's below; NULL where the backend has none): whether it
     takes dtype dt and head size HS, the forward (writes o and stats) and
     the backward (CUDA: tensor cores, kernels/cuda/attention_mma.cu) */
  int (*attention_half)(lt_dtype dt, int64_t HS);
  lt_status (*attention_half_fwd)(const lt_sdpa_desc *d);
  lt_status (*attention_half_bwd)(const lt_sdpa_desc *d);
  /* library attention (lt_sdpa_desc; NULL where the backend has none).
     prepare checks that the library takes the shape (building what the
     calls need, the backward's too when backward is set): LT_ERR_UNSUPPORTED
     with the library's reason when it refuses, so the caller falls back */
  lt_status (*sdpa_prepare)(const lt_sdpa_desc *d, int backward);
  lt_status (*sdpa_fwd)(const lt_sdpa_desc *d);
  lt_status (*sdpa_bwd)(const lt_sdpa_desc *d);
  /* cross-entropy over logits rows ldx apart (V <= ldx); backward writes
     rows ldd apart, zeros in columns V..ldd-1 (padding past the classes),
     each row times its scale (scale NULL: 1) */
  lt_status (*cross_entropy_fwd)(lt_dtype dt, const void *x, int64_t ldx, const char *targets, lt_dtype tdt,
                                 int64_t N, int64_t V, int64_t ignore, void *loss, void *lse, int64_t *bad);
  lt_status (*cross_entropy_bwd)(lt_dtype dt, const void *x, int64_t ldx, const char *targets, lt_dtype tdt,
                                 int64_t N, int64_t V, int64_t ldd, int64_t ignore, const void *lse,
                                 const void *scale, void *dx);
  /* optional: the forward and, into dx (rows ldx apart; may be x itself),
     the backward with per-row scales, in one pass over each row; NULL: the
     two above */
  lt_status (*cross_entropy_fwd_bwd)(lt_dtype dt, const void *x, int64_t ldx, const char *targets, lt_dtype tdt,
                                     int64_t N, int64_t V, int64_t ignore, void *loss, void *lse, const void *scale,
                                     void *dx, int64_t *bad);
  lt_status (*rope)(lt_dtype dt, const void *x, void *y, int64_t R, int64_t Tn, int64_t D, double base,
                    int64_t start, int inverse);
  lt_status (*normal)(char *dst, lt_dtype dtype, int64_t n, uint64_t seed, uint64_t offset, double mean, double std);
  /* optimizers over n parameters in one call (kernels/<backend>/optim) */
  lt_status (*adamw)(int n, const lt_optim_tensor *ts, const lt_adamw_hparams *h);
  lt_status (*sgd)(int n, const lt_optim_tensor *ts, const lt_sgd_hparams *h);
  /* out[i] (host memory) = the sum of squares of ts[i].grad, accumulated in f64 */
  lt_status (*grad_sum_squares)(int n, const lt_optim_tensor *ts, double *out);
} lt_backend_i;

extern const lt_backend_i lt_backend_cpu;
#ifdef LT_WITH_CUDA
extern const lt_backend_i lt_backend_cuda;
#endif

/* The backend serving a device, or NULL when it is absent in this build. */
const lt_backend_i *lt_backend_for(lt_device device);

/* Fails when t is NULL (nil from Lua), was freed with lt_tensor_free_data or
   its data was dropped (lt_tensor_drop_data);
   pos is the argument's 1-based position for the message. */
lt_status lt_check_tensor(const char *op, const lt_tensor *t, int pos);
/* As lt_check_tensor, but a tensor whose data was dropped (lt_tensor_drop_data)
   passes: for operations on its autograd metadata only. */
lt_status lt_check_tensor_header(const char *op, const lt_tensor *t, int pos);

static inline char *lt_tensor_ptr(const lt_tensor *t) {
  return (char *)t->storage->data + t->offset * lt_dtype_size(t->dtype);
}

/* Fails unless t spans its whole storage (offset 0, contiguous): a
   parameter whose data may be dropped and restored, not a view. */
lt_status lt_check_whole_storage(const char *op, const lt_tensor *t);
/* Allocates s's data again after lt_tensor_drop_data (a no-op when it has
   data); errors name op. */
lt_status lt_storage_realloc(const char *op, lt_storage *s);
/* Checks a requested shape (at most LT_MAX_DIMS dims, no negative size, a
   numel that fits) and gives its numel; errors name op. */
lt_status lt_check_shape(const char *op, int ndim, const int64_t *sizes, int64_t *numel);

/* Allocates a tensor object (refcount 1) viewing storage s (retained). */
lt_tensor *lt_tensor_wrap(lt_storage *s, int64_t offset, int ndim, const int64_t *sizes,
                          const int64_t *strides, lt_dtype dtype);
void lt_storage_release(lt_storage *s);
/* A contiguous, uninitialised tensor with t's shape, dtype and device. */
lt_status lt_tensor_empty_like(const lt_tensor *t, lt_dtype dtype, lt_tensor **out);
/* lt_tensor_empty whose errors (a bad shape, a device not there, out of
   memory) name op instead of "empty" */
lt_status lt_tensor_empty_as(const char *op, int ndim, const int64_t *sizes, lt_dtype dtype, lt_device device,
                             lt_tensor **out);

/* Writes "[2, 3]" into buf (at least 200 bytes) and returns buf. */
const char *lt_shape_str(int ndim, const int64_t *sizes, char *buf);

/* Contiguous strides for sizes; returns numel. */
int64_t lt_contiguous_strides(int ndim, const int64_t *sizes, int64_t *strides);

/* CPU caching allocator. */
void *lt_cpu_alloc(size_t nbytes);
void lt_cpu_free(void *ptr, size_t nbytes);

#endif
