/*
 * kernel.h: the kernel interface: the descriptors the host builds and the
 * kernels of every device (kernels/cpu, kernels/cuda) compute on: the
 * compute kind, strided iterations (lt_iter, lt_reduce_iter), matrix
 * products with their epilogues, indexing, attention (lt_sdpa_desc) and
 * optimizer steps. This is all a kernel sees of the host: no tensor or
 * storage objects, no allocator, no backend; memory (scratch included)
 * comes from the caller.
 *
 * Relies on host/lutra.h for the public enums (lt_dtype, lt_status, the op
 * enums) and the host/base functions it declares (lt_dtype_size,
 * lt_dtype_is_float, lt_dtype_name); declares lt_fail, the error message
 * kernels leave for lt_last_error. Included by C and by CUDA C++ (nvcc, the
 * CUDA emulator).
 */
#ifndef LUTRA_KERNEL_H
#define LUTRA_KERNEL_H

#include "../host/lutra.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Records the message of a failure on this thread (lt_last_error) and
   returns st: host/base/status.c (declared in host/base/status.h as well). */
lt_status lt_fail(lt_status st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

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

#ifdef __cplusplus
}
#endif

#endif
