/*
 * cuda/cudnn-graph.c: the descriptors of lutra's attention graphs in cuDNN's
 * graph ("backend") API, from C (cuda/cudnn-graph.h): the forward graph is
 * S = scale * Q K^T, the causal mask, softmax (its log-sum-exp kept as the
 * stats), O = P V; the backward graph recomputes P from the stats and
 * writes dQ, dK and dV. The op sequence is the one NVIDIA's cudnn-frontend
 * builds for its SDPA nodes (the "composite" form, which cuDNN 9 fuses into
 * one kernel on Hopper). And opening cuDNN, at the first attention call (as
 * cuBLASLt in cuda/cublaslt.c). Plans and execution are
 * cuda/cudnn-attention.c's.
 */
#if defined(LT_WITH_CUDA) && __has_include(<cudnn_graph.h>)

#include "cuda/cudnn-graph.h"
#include "base/status.h"

#include <dlfcn.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

struct lt_dnn_funcs lt_dnn;

static size_t version; /* of the cuDNN loaded, as cudnnGetVersion gives it (9.19.0: 91900) */

size_t lt_cudnn_loaded_version(void) { return version; }

/* Opens cuDNN 9 once; its failure is kept and repeated to every caller. */
lt_status lt_cudnn_open(void) {
  static int tried;
  static char why[400];
  if (tried)
    return why[0] ? lt_fail(LT_ERR_UNSUPPORTED, "%s", why) : LT_OK;
  tried = 1;
  void *h = NULL;
  const char *names[] = {LT_CUDA_LIBDIR "/libcudnn.so.9", "libcudnn.so.9", LT_CUDA_LIBDIR "/libcudnn_graph.so.9",
                         "libcudnn_graph.so.9"};
  for (size_t i = 0; i < sizeof names / sizeof names[0] && !h; i++)
    h = lt_cuda_library(names[i], NULL); /* (cuda/libraries.c; the emulator's is linked into lutra) */
  if (!h) {
    snprintf(why, sizeof why, "cuDNN 9 could not be loaded (libcudnn.so.9, also tried %s): %s", LT_CUDA_LIBDIR,
             dlerror());
    return lt_fail(LT_ERR_UNSUPPORTED, "%s", why);
  }
#define X(f)                                                                                \
  if (!(lt_dnn.f = (__typeof__(f) *)dlsym(h, #f))) {                                         \
    snprintf(why, sizeof why, "cuDNN (libcudnn.so.9) lacks %s: an older cuDNN than 9?", #f); \
    dlclose(h);                                                                             \
    return lt_fail(LT_ERR_UNSUPPORTED, "%s", why);                                          \
  }
  DNN_FUNCS(X)
#undef X
  size_t v = lt_dnn.cudnnGetVersion();
  version = v;
  /* cudnn-frontend refuses 9.10.0 and 9.10.1 for this graph (known bugs) */
  if (v < 90000 || (v >= 91000 && v < 91002)) {
    snprintf(why, sizeof why, "cuDNN %zu.%zu.%zu is loaded; lutra's attention needs cuDNN 9 (not 9.10.0-9.10.1)",
             v / 10000, v / 100 % 100, v % 100);
    dlclose(h);
    return lt_fail(LT_ERR_UNSUPPORTED, "%s", why);
  }
  return LT_OK;
}

/* ---- descriptors ---------------------------------------------------------------------- */

/* A tensor descriptor: dims and strides (4 of each), a unique id. Virtual
   tensors live inside the fused kernel; by-value ones are host scalars
   handed over with the variant pack. */
static cudnnBackendDescriptor_t tensor(builder *b, int64_t uid, cudnnDataType_t dt, const int64_t *dims,
                                       const int64_t *strides, int is_virtual, int by_value) {
  cudnnBackendDescriptor_t t = make(b, CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  int64_t align = 16;
  bool virt = is_virtual != 0, byval = by_value != 0;
  SET(b, t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
  SET(b, t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt);
  SET(b, t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims);
  SET(b, t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides);
  SET(b, t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align);
  if (is_virtual)
    SET(b, t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &virt);
  if (by_value)
    SET(b, t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &byval);
  finalize(b, t, "a tensor descriptor");
  return t;
}

/* ---- the ops of the graphs -------------------------------------------------------------- */

static void add_op(graph *g, cudnnBackendDescriptor_t op) {
  if (g->b->failed)
    return;
  if (g->nops == (int)(sizeof g->ops / sizeof g->ops[0])) {
    g->b->failed = 1;
    snprintf(g->b->why, sizeof g->b->why, "too many ops in one attention graph");
    return;
  }
  g->ops[g->nops++] = op;
}

/* y = mode(x, in1, in2) computed in prec; axis >= 0 for GEN_INDEX. in1 and
   in2 may be NULL. */
static void pointwise(graph *g, cudnnPointwiseMode_t mode, cudnnDataType_t prec, int64_t axis,
                      cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t in1, cudnnBackendDescriptor_t in2,
                      cudnnBackendDescriptor_t y) {
  builder *b = g->b;
  cudnnBackendDescriptor_t pw = make(b, CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
  SET(b, pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
  SET(b, pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec);
  if (axis >= 0)
    SET(b, pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis);
  finalize(b, pw, "a pointwise descriptor");
  cudnnBackendDescriptor_t op = make(b, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
  float one = 1.0f;
  SET(b, op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &pw);
  SET(b, op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
  if (in1)
    SET(b, op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &in1);
  if (in2)
    SET(b, op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &in2);
  SET(b, op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
  SET(b, op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, CUDNN_TYPE_FLOAT, 1, &one);
  SET(b, op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, CUDNN_TYPE_FLOAT, 1, &one);
  finalize(b, op, "a pointwise operation");
  add_op(g, op);
}

/* c = a b over the last two dims (batch dims broadcast), accumulated in f32 */
static void matmul(graph *g, cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t bm, cudnnBackendDescriptor_t c) {
  builder *b = g->b;
  cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
  cudnnBackendDescriptor_t md = make(b, CUDNN_BACKEND_MATMUL_DESCRIPTOR);
  SET(b, md, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f32);
  finalize(b, md, "a matmul descriptor");
  cudnnBackendDescriptor_t op = make(b, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
  SET(b, op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &a);
  SET(b, op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &bm);
  SET(b, op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &c);
  SET(b, op, CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &md);
  finalize(b, op, "a matmul operation");
  add_op(g, op);
}

/* y = x reduced (max or sum) over the dims where y has size 1 */
static void reduction(graph *g, cudnnReduceTensorOp_t red, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
  builder *b = g->b;
  cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
  bool no = false;
  cudnnBackendDescriptor_t rd = make(b, CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
  SET(b, rd, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f32);
  SET(b, rd, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &red);
  set_lenient(b, rd, ATTR_REDUCTION_IS_DETERMINISTIC, CUDNN_TYPE_BOOLEAN, &no);
  finalize(b, rd, "a reduction descriptor");
  cudnnBackendDescriptor_t op = make(b, CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
  SET(b, op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &rd);
  SET(b, op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
  SET(b, op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
  finalize(b, op, "a reduction operation");
  add_op(g, op);
}

/* y: x's data under y's dims and strides (a transposed view) */
static void reshape(graph *g, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
  builder *b = g->b;
  cudnnBackendDescriptor_t op = make(b, CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
  SET(b, op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
  SET(b, op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
  finalize(b, op, "a reshape operation");
  add_op(g, op);
}

/* ---- the attention graphs ------------------------------------------------------------------ */

typedef struct dims4 {
  int64_t d[4], s[4];
} dims4;

static dims4 shape(int64_t a, int64_t b, int64_t c, int64_t d, const int64_t *strides) {
  dims4 r = {{a, b, c, d}, {0}};
  if (strides)
    memcpy(r.s, strides, sizeof r.s);
  else { /* packed */
    r.s[3] = 1, r.s[2] = d, r.s[1] = c * d, r.s[0] = b * c * d;
  }
  return r;
}

/* dims 2 and 3 swapped: K as K^T over the same memory */
static dims4 swap23(dims4 x) {
  int64_t t = x.d[2];
  x.d[2] = x.d[3], x.d[3] = t;
  t = x.s[2];
  x.s[2] = x.s[3], x.s[3] = t;
  return x;
}

static cudnnBackendDescriptor_t real(builder *b, int64_t uid, cudnnDataType_t dt, dims4 x) {
  return tensor(b, uid, dt, x.d, x.s, 0, 0);
}

static cudnnBackendDescriptor_t scalar(builder *b, int64_t uid, cudnnDataType_t dt) {
  const int64_t ones[4] = {1, 1, 1, 1};
  return tensor(b, uid, dt, ones, ones, 0, 1);
}

typedef struct virt {
  builder *b;
  int64_t next;
} virt;

static cudnnBackendDescriptor_t vt(virt *v, cudnnDataType_t dt, dims4 x) {
  return tensor(v->b, ID_VIRTUAL + v->next++, dt, x.d, x.s, 1, 0);
}

/* masked = causal ? (row >= col ? s : -inf) : s, for (b, h, t, s) scores */
static cudnnBackendDescriptor_t causal_mask(graph *g, virt *v, cudnnBackendDescriptor_t s, dims4 scores,
                                            cudnnBackendDescriptor_t neg_inf) {
  cudnnBackendDescriptor_t row = vt(v, CUDNN_DATA_INT32, scores), col = vt(v, CUDNN_DATA_INT32, scores);
  cudnnBackendDescriptor_t keep = vt(v, CUDNN_DATA_BOOLEAN, scores), out = vt(v, CUDNN_DATA_FLOAT, scores);
  pointwise(g, CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_FLOAT, 2, s, NULL, NULL, row);
  pointwise(g, CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_FLOAT, 3, s, NULL, NULL, col);
  pointwise(g, CUDNN_POINTWISE_CMP_GE, CUDNN_DATA_BOOLEAN, -1, row, col, NULL, keep);
  pointwise(g, CUDNN_POINTWISE_BINARY_SELECT, CUDNN_DATA_FLOAT, -1, s, neg_inf, keep, out);
  return out;
}

static cudnnDataType_t io_type(lt_dtype dt) { return dt == LT_DTYPE_BF16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF; }

/* The forward: S = scale Q K^T, masked, stats = max + log(sum exp(S - max)),
   O = (exp(S - max) / sum) V (cudnn-frontend's composite SDPA node). */
void lt_cudnn_forward_graph(graph *g, const lt_sdpa_desc *d) {
  builder *b = g->b;
  virt v = {b, 0};
  cudnnDataType_t io = io_type(d->dtype), f32 = CUDNN_DATA_FLOAT;
  int64_t B = d->B, H = d->NH, T = d->T, S = d->S, HS = d->HS;
  dims4 scores = shape(B, H, T, S, NULL), rows = shape(B, H, T, 1, NULL);
  cudnnBackendDescriptor_t q = real(b, ID_Q, io, shape(B, H, T, HS, d->sq));
  cudnnBackendDescriptor_t kt = real(b, ID_K, io, swap23(shape(B, d->NKV, S, HS, d->sk)));
  cudnnBackendDescriptor_t vv = real(b, ID_V, io, shape(B, d->NKV, S, HS, d->sv));
  cudnnBackendDescriptor_t o = real(b, ID_O, io, shape(B, H, T, HS, d->so));
  cudnnBackendDescriptor_t stats = real(b, ID_STATS, f32, rows);
  cudnnBackendDescriptor_t scale = scalar(b, ID_SCALE, f32);
  cudnnBackendDescriptor_t s = vt(&v, f32, scores), ss = vt(&v, f32, scores);
  matmul(g, q, kt, s);
  pointwise(g, CUDNN_POINTWISE_MUL, f32, -1, s, scale, NULL, ss);
  if (d->causal)
    ss = causal_mask(g, &v, ss, scores, scalar(b, ID_NEG_INF, f32));
  cudnnBackendDescriptor_t mx = vt(&v, f32, rows), sub = vt(&v, f32, scores), ex = vt(&v, f32, scores);
  cudnnBackendDescriptor_t sum = vt(&v, f32, rows), lg = vt(&v, f32, rows), p = vt(&v, io, scores);
  reduction(g, CUDNN_REDUCE_TENSOR_MAX, ss, mx);
  pointwise(g, CUDNN_POINTWISE_SUB, f32, -1, ss, mx, NULL, sub);
  pointwise(g, CUDNN_POINTWISE_EXP, f32, -1, sub, NULL, NULL, ex);
  reduction(g, CUDNN_REDUCE_TENSOR_ADD, ex, sum);
  pointwise(g, CUDNN_POINTWISE_LOG, f32, -1, sum, NULL, NULL, lg);
  pointwise(g, CUDNN_POINTWISE_ADD, f32, -1, mx, lg, NULL, stats);
  pointwise(g, CUDNN_POINTWISE_DIV, f32, -1, ex, sum, NULL, p);
  matmul(g, p, vv, o);
}

/* The backward (cudnn-frontend's composite SDPA backward node): D =
   rowsum(dO o O) into softmax_sum, P = exp(scale Q K^T - stats) (masked),
   dV = P^T dO, dS = scale P o (dO V^T - D), dK = dS^T Q, dQ = dS K through
   an f32 accumulator (atomic adds), or straight into dQ when deterministic
   (the frontend's deterministic graph). With fewer K/V heads, dK and dV are
   summed over each group of query heads. */
void lt_cudnn_backward_graph(graph *g, const lt_sdpa_desc *d, int det) {
  builder *b = g->b;
  virt v = {b, 0};
  cudnnDataType_t io = io_type(d->dtype), f32 = CUDNN_DATA_FLOAT;
  int64_t B = d->B, H = d->NH, KV = d->NKV, T = d->T, S = d->S, HS = d->HS;
  int gqa = KV != H;
  dims4 scores = shape(B, H, T, S, NULL), rows = shape(B, H, T, 1, NULL);
  int64_t tr_strides[4] = {H * T * S, T * S, 1, S};
  dims4 scores_t = shape(B, H, S, T, tr_strides);
  dims4 kshape = shape(B, KV, S, HS, d->sk);
  cudnnBackendDescriptor_t q = real(b, ID_Q, io, shape(B, H, T, HS, d->sq));
  cudnnBackendDescriptor_t kt = real(b, ID_K, io, swap23(kshape));
  cudnnBackendDescriptor_t vtr = real(b, ID_V, io, swap23(shape(B, KV, S, HS, d->sv)));
  cudnnBackendDescriptor_t o = real(b, ID_O, io, shape(B, H, T, HS, d->so));
  cudnnBackendDescriptor_t dout = real(b, ID_DO, io, shape(B, H, T, HS, d->sdo));
  cudnnBackendDescriptor_t stats = real(b, ID_STATS, f32, rows);
  cudnnBackendDescriptor_t dq = real(b, ID_DQ, io, shape(B, H, T, HS, d->sdq));
  cudnnBackendDescriptor_t dk = real(b, ID_DK, io, shape(B, KV, S, HS, d->sdk));
  cudnnBackendDescriptor_t dv = real(b, ID_DV, io, shape(B, KV, S, HS, d->sdv));
  cudnnBackendDescriptor_t scale = scalar(b, ID_SCALE, f32), one = scalar(b, ID_ONE, f32);
  cudnnBackendDescriptor_t softmax_sum = real(b, ID_SOFTMAX_SUM, f32, rows);
  cudnnBackendDescriptor_t dq_accum = det ? NULL : real(b, ID_DQ_ACCUM, f32, shape(B, H, T, HS, NULL));
  /* D */
  int64_t doo_strides[4] = {H * T * HS, T * HS, H * HS, 1};
  cudnnBackendDescriptor_t doo = vt(&v, f32, shape(B, H, T, HS, doo_strides)), dsum = vt(&v, f32, rows);
  pointwise(g, CUDNN_POINTWISE_MUL, f32, -1, dout, o, NULL, doo);
  reduction(g, CUDNN_REDUCE_TENSOR_ADD, doo, dsum);
  pointwise(g, CUDNN_POINTWISE_MUL, f32, -1, dsum, one, NULL, softmax_sum);
  /* P */
  cudnnBackendDescriptor_t s = vt(&v, f32, scores), ss = vt(&v, f32, scores), sm = vt(&v, f32, scores);
  matmul(g, q, kt, s);
  pointwise(g, CUDNN_POINTWISE_MUL, f32, -1, s, scale, NULL, ss);
  pointwise(g, CUDNN_POINTWISE_SUB, f32, -1, ss, stats, NULL, sm);
  if (d->causal)
    sm = causal_mask(g, &v, sm, scores, scalar(b, ID_NEG_INF, f32));
  cudnnBackendDescriptor_t p = vt(&v, f32, scores), pt = vt(&v, io, scores_t);
  pointwise(g, CUDNN_POINTWISE_EXP, f32, -1, sm, NULL, NULL, p);
  reshape(g, p, pt);
  /* dV */
  dims4 full = shape(B, H, S, HS, NULL);
  cudnnBackendDescriptor_t dv_full = gqa ? vt(&v, io, full) : dv;
  matmul(g, pt, dout, dv_full);
  if (gqa)
    reduction(g, CUDNN_REDUCE_TENSOR_ADD, dv_full, dv);
  /* dS */
  cudnnBackendDescriptor_t dp = vt(&v, f32, scores), dpd = vt(&v, f32, scores), dpp = vt(&v, f32, scores);
  cudnnBackendDescriptor_t ds = vt(&v, f32, scores), dst = vt(&v, io, scores_t);
  matmul(g, dout, vtr, dp);
  pointwise(g, CUDNN_POINTWISE_SUB, f32, -1, dp, softmax_sum, NULL, dpd);
  pointwise(g, CUDNN_POINTWISE_MUL, f32, -1, dpd, p, NULL, dpp);
  pointwise(g, CUDNN_POINTWISE_MUL, f32, -1, dpp, scale, NULL, ds);
  reshape(g, ds, dst);
  /* dK */
  cudnnBackendDescriptor_t dk_full = gqa ? vt(&v, io, full) : dk;
  matmul(g, dst, q, dk_full);
  if (gqa)
    reduction(g, CUDNN_REDUCE_TENSOR_ADD, dk_full, dk);
  /* dQ */
  cudnnBackendDescriptor_t k = vt(&v, f32, kshape); /* (the frontend leaves it the intermediate type) */
  reshape(g, kt, k);
  if (det) {
    matmul(g, ds, k, dq);
  } else {
    matmul(g, ds, k, dq_accum);
    pointwise(g, CUDNN_POINTWISE_IDENTITY, f32, -1, dq_accum, NULL, NULL, dq);
  }
}

#endif /* LT_WITH_CUDA and cudnn_graph.h */
