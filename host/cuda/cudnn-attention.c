/*
 * cuda/cudnn-attention.c: scaled-dot-product attention on the GPU through cuDNN's
 * fused flash-attention engines (FlashAttention-2, Dao 2023), described with
 * the cuDNN graph ("backend") API from C: the forward graph is
 * S = scale * Q K^T, the causal mask, softmax (its log-sum-exp kept as the
 * stats), O = P V; the backward graph recomputes P from the stats and
 * writes dQ, dK and dV. The op sequence is the one NVIDIA's cudnn-frontend
 * builds for its SDPA nodes (the "composite" form, which cuDNN 9 fuses into
 * one kernel on Hopper).
 *
 * cuDNN is opened at the first attention call, not linked (as cuBLASLt in
 * cuda/cublaslt.c). Plans (the finalized execution plans and their workspace
 * sizes) are cached per device, shape, strides and dtype, and so are
 * refusals: a shape cuDNN does not take costs one attempt, and the caller
 * falls back to lutra's kernels with the reason.
 */
#ifdef LT_WITH_CUDA

#include "cuda/backend.h"
#include "base/status.h"

#if !__has_include(<cudnn_graph.h>)
/* Built where cuDNN 9's headers are missing: attention falls back to lutra's
   kernels, saying why once. */
static lt_status no_cudnn(void) {
  return lt_fail(LT_ERR_UNSUPPORTED, "scaled_dot_product_attention: lutra was built without cuDNN 9's headers "
                                     "(cudnn_graph.h)");
}
lt_status lt_cudnn_sdpa_prepare(const lt_sdpa_desc *d, int backward) {
  (void)d, (void)backward;
  return no_cudnn();
}
lt_status lt_cudnn_sdpa_fwd(const lt_sdpa_desc *d) {
  (void)d;
  return no_cudnn();
}
lt_status lt_cudnn_sdpa_bwd(const lt_sdpa_desc *d) {
  (void)d;
  return no_cudnn();
}
void lt_cuda_set_deterministic(int on) { (void)on; }
int lt_cuda_deterministic(void) { return 0; }
int64_t lt_cudnn_version(void) { return 0; }
lt_status lt_cudnn_sdpa_check_graph(const lt_sdpa_desc *d, int backward) {
  (void)d, (void)backward;
  return no_cudnn();
}
lt_status lt_cudnn_sdpa_check_plan(const lt_sdpa_desc *d, int backward, const char *device_json, int64_t *workspace) {
  (void)d, (void)backward, (void)device_json, (void)workspace;
  return no_cudnn();
}
lt_status lt_cudnn_device_properties(int device_index, char *buf, int64_t cap, int64_t *len) {
  (void)device_index, (void)buf, (void)cap, (void)len;
  return no_cudnn();
}
#else

#include <cudnn_graph.h>
#include <dlfcn.h>
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DNN_FUNCS(X)                                                                                            \
  X(cudnnGetVersion) X(cudnnCreate) X(cudnnSetStream) X(cudnnGetErrorString) X(cudnnGetLastErrorString)        \
  X(cudnnBackendCreateDescriptor) X(cudnnBackendDestroyDescriptor) X(cudnnBackendSetAttribute)                 \
  X(cudnnBackendGetAttribute) X(cudnnBackendFinalize) X(cudnnBackendExecute)

static struct {
#define X(f) __typeof__(f) *f;
  DNN_FUNCS(X)
#undef X
} dnn;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static size_t version; /* of the cuDNN loaded, as cudnnGetVersion gives it (9.19.0: 91900) */
static int deterministic;

void lt_cuda_set_deterministic(int on) { __atomic_store_n(&deterministic, on != 0, __ATOMIC_RELAXED); }
int lt_cuda_deterministic(void) { return __atomic_load_n(&deterministic, __ATOMIC_RELAXED); }

/* Opens cuDNN 9 once; its failure is kept and repeated to every caller. */
static lt_status dnn_open(void) {
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
  if (!(dnn.f = (__typeof__(f) *)dlsym(h, #f))) {                                            \
    snprintf(why, sizeof why, "cuDNN (libcudnn.so.9) lacks %s: an older cuDNN than 9?", #f); \
    dlclose(h);                                                                             \
    return lt_fail(LT_ERR_UNSUPPORTED, "%s", why);                                          \
  }
  DNN_FUNCS(X)
#undef X
  size_t v = dnn.cudnnGetVersion();
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

int64_t lt_cudnn_version(void) {
  pthread_mutex_lock(&lock);
  lt_status st = dnn_open();
  pthread_mutex_unlock(&lock);
  return st == LT_OK ? (int64_t)version : 0;
}

/* ---- building graphs: descriptors that remember the first failure ------------------------ */

enum { MAX_DESCS = 256, MAX_PLANS = 256 };

typedef struct builder {
  cudnnBackendDescriptor_t descs[MAX_DESCS]; /* everything created, destroyed at the end */
  int n;
  int failed;
  char why[300];
} builder;

static void fail_with(builder *b, const char *what, cudnnStatus_t s) {
  if (b->failed)
    return;
  b->failed = 1;
  char last[200] = "";
  dnn.cudnnGetLastErrorString(last, sizeof last);
  snprintf(b->why, sizeof b->why, "%s: %s%s%s", what, dnn.cudnnGetErrorString(s), last[0] ? ": " : "", last);
}

/* Keeps the first reason a step that may fail without failing the graph
   did (an engine config that does not build, a heuristics mode with no
   results), for the message when nothing works. */
static void note_why(builder *b, const char *what, cudnnStatus_t s) {
  if (b->why[0])
    return;
  char last[200] = "";
  dnn.cudnnGetLastErrorString(last, sizeof last);
  snprintf(b->why, sizeof b->why, "%s: %s%s%s", what, dnn.cudnnGetErrorString(s), last[0] ? ": " : "", last);
}

static cudnnBackendDescriptor_t make(builder *b, cudnnBackendDescriptorType_t type) {
  if (b->failed)
    return NULL;
  if (b->n == MAX_DESCS) {
    b->failed = 1;
    snprintf(b->why, sizeof b->why, "more than %d cuDNN descriptors in one graph", MAX_DESCS);
    return NULL;
  }
  cudnnBackendDescriptor_t d = NULL;
  cudnnStatus_t s = dnn.cudnnBackendCreateDescriptor(type, &d);
  if (s != CUDNN_STATUS_SUCCESS) {
    fail_with(b, "creating a descriptor", s);
    return NULL;
  }
  b->descs[b->n++] = d;
  return d;
}

static void set(builder *b, cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
                cudnnBackendAttributeType_t type, int64_t count, const void *value, const char *what) {
  if (b->failed)
    return;
  cudnnStatus_t s = dnn.cudnnBackendSetAttribute(d, name, type, count, value);
  if (s != CUDNN_STATUS_SUCCESS)
    fail_with(b, what, s);
}

#define SET(b, d, name, type, count, value) set((b), (d), (name), (type), (count), (value), #name)

static void finalize(builder *b, cudnnBackendDescriptor_t d, const char *what) {
  if (b->failed)
    return;
  cudnnStatus_t s = dnn.cudnnBackendFinalize(d);
  if (s != CUDNN_STATUS_SUCCESS)
    fail_with(b, what, s);
}

static void builder_free(builder *b) {
  while (b->n > 0)
    dnn.cudnnBackendDestroyDescriptor(b->descs[--b->n]);
}

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

/* Sets an attribute that some cuDNN 9 releases want and others deprecate or
   lack: its failure is not the graph's. */
static void set_lenient(builder *b, cudnnBackendDescriptor_t d, int name, cudnnBackendAttributeType_t type,
                        const void *value) {
  if (b->failed)
    return;
  if (dnn.cudnnBackendSetAttribute(d, (cudnnBackendAttributeName_t)name, type, 1, value) != CUDNN_STATUS_SUCCESS) {
    char drained[200]; /* so a later failure's message is its own */
    dnn.cudnnGetLastErrorString(drained, sizeof drained);
  }
}
enum { ATTR_OPERATIONGRAPH_HANDLE = 800, ATTR_EXECUTION_PLAN_HANDLE = 400, ATTR_REDUCTION_IS_DETERMINISTIC = 1602 };

/* ---- the ops of the graphs -------------------------------------------------------------- */

typedef struct graph {
  builder *b;
  cudnnBackendDescriptor_t ops[40];
  int nops;
} graph;

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

/* Tensor ids. Inputs and outputs are below 100 (the variant pack names
   them), virtual tensors above. */
enum {
  ID_Q = 1, ID_K, ID_V, ID_O, ID_STATS, ID_SCALE, ID_NEG_INF, ID_DO, ID_DQ, ID_DK, ID_DV, ID_ONE, ID_SOFTMAX_SUM,
  ID_DQ_ACCUM,
  ID_VIRTUAL = 100
};

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
static void forward_graph(graph *g, const lt_sdpa_desc *d) {
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
static void backward_graph(graph *g, const lt_sdpa_desc *d, int det) {
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

/* ---- plans: an operation graph, the heuristics' engine configs, the first plan that builds ---- */

typedef struct plan_key {
  int backward, dtype, causal, deterministic;
  int64_t B, NH, NKV, T, S, HS;
  int64_t strides[8][4];
} plan_key;

typedef struct plan {
  plan_key key;
  builder *b;                 /* every descriptor, alive as long as the plan */
  cudnnBackendDescriptor_t x; /* NULL when cuDNN refused the graph: why says why */
  int dead;                   /* cuDNN would not execute it: refused as well */
  int compiled;               /* (planned for a device property descriptor) an engine compiled its
                                 kernels, which only a driver could then load */
  int64_t workspace;
  char why[300];
} plan;

typedef struct device_state {
  cudnnHandle_t handle;
  plan **plans;
  int nplans, cap;
} device_state;

static device_state devices[LT_CUDA_MAX_DEVICES];

static plan_key key_of(const lt_sdpa_desc *d, int backward) {
  plan_key k;
  memset(&k, 0, sizeof k); /* padding too: keys compare with memcmp */
  k.backward = backward, k.dtype = d->dtype, k.causal = d->causal;
  k.deterministic = backward && d->deterministic;
  k.B = d->B, k.NH = d->NH, k.NKV = d->NKV, k.T = d->T, k.S = d->S, k.HS = d->HS;
  const int64_t *s[8] = {d->sq, d->sk, d->sv, d->so, d->sdo, d->sdq, d->sdk, d->sdv};
  for (int i = 0; i < 8; i++)
    memcpy(k.strides[i], s[i], sizeof k.strides[i]);
  return k;
}

/* Builds the plan of p->key's graph into p (p->x NULL and p->why set when
   cuDNN refuses it): for handle's device, or, handle NULL, for the device
   devprop describes (a device property descriptor: cuDNN 9.8 and later
   plan without the device). */
static void build_plan(cudnnHandle_t handle, cudnnBackendDescriptor_t devprop, const lt_sdpa_desc *d, plan *p) {
  builder *b = p->b;
  graph g = {b, {0}, 0};
  if (p->key.backward)
    backward_graph(&g, d, p->key.deterministic);
  else
    forward_graph(&g, d);
  cudnnBackendDescriptor_t og = make(b, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  if (handle)
    set_lenient(b, og, ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, &handle);
  SET(b, og, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, g.nops, g.ops);
  finalize(b, og, "the operation graph");
  /* engine configs from heuristics mode A, then the fallback list; a mode
     that offers nothing is skipped */
  cudnnBackendDescriptor_t cfgs[32];
  int ncfg = 0;
  cudnnBackendHeurMode_t modes[2] = {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK};
  for (int m = 0; m < 2 && !b->failed; m++) {
    cudnnBackendDescriptor_t heur = make(b, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    SET(b, heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &og);
    SET(b, heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &modes[m]);
    if (devprop)
      SET(b, heur, CUDNN_ATTR_ENGINEHEUR_DEVICEPROP, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &devprop);
    if (b->failed)
      break;
    cudnnStatus_t st = dnn.cudnnBackendFinalize(heur);
    int64_t count = 0;
    if (st == CUDNN_STATUS_SUCCESS)
      st = dnn.cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count,
                                        NULL);
    if (st != CUDNN_STATUS_SUCCESS) {
      note_why(b, "the engine heuristics", st);
      continue;
    }
    if (count > 32 - ncfg)
      count = 32 - ncfg;
    if (count <= 0)
      continue;
    int first = b->n;
    for (int64_t i = 0; i < count; i++)
      make(b, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    int64_t got = 0;
    if (b->failed)
      break;
    st = dnn.cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got,
                                      &b->descs[first]);
    if (st != CUDNN_STATUS_SUCCESS)
      note_why(b, "the engine heuristics' results", st);
    else
      for (int64_t i = 0; i < got && i < count; i++)
        cfgs[ncfg++] = b->descs[first + i];
  }
  for (int i = 0; i < ncfg && !b->failed && !p->x; i++) {
    cudnnBackendDescriptor_t x = NULL;
    if (dnn.cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &x) != CUDNN_STATUS_SUCCESS)
      break;
    /* the plan's handle: required before cuDNN 9.8 (cudnn-frontend refuses a
       plan without it), deprecated since */
    if (handle)
      set_lenient(b, x, ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, &handle);
    cudnnStatus_t st = devprop ? dnn.cudnnBackendSetAttribute(x, CUDNN_ATTR_EXECUTION_PLAN_DEVICEPROP,
                                                              CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &devprop)
                               : CUDNN_STATUS_SUCCESS;
    if (st == CUDNN_STATUS_SUCCESS)
      st = dnn.cudnnBackendSetAttribute(x, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                                        &cfgs[i]);
    if (st == CUDNN_STATUS_SUCCESS)
      st = dnn.cudnnBackendFinalize(x);
    int64_t ws = 0, n = 0;
    if (st == CUDNN_STATUS_SUCCESS)
      st = dnn.cudnnBackendGetAttribute(x, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &n, &ws);
    if (st == CUDNN_STATUS_SUCCESS && b->n < MAX_DESCS) {
      b->descs[b->n++] = x;
      p->x = x;
      p->workspace = ws;
    } else {
      note_why(b, "no engine config built a plan", st);
      dnn.cudnnBackendDestroyDescriptor(x);
      if (devprop && !handle && st == CUDNN_STATUS_EXECUTION_FAILED_CUDA_DRIVER)
        p->compiled = 1;
    }
  }
  if (!p->x) {
    snprintf(p->why, sizeof p->why, "%s", b->why[0] ? b->why : "cuDNN offered no engine for this graph");
    builder_free(b); /* a refusal keeps only its reason */
  }
}

/* The device's state, cuDNN opened and its handle made on first use. */
static lt_status device_of(lt_device device, lt_cuda_ctx **cc, device_state **out) {
  LT_TRY(lt_cuda_ctx_get(device, cc)); /* (makes it current) */
  int index = (*cc)->index;
  LT_TRY(dnn_open());
  device_state *ds = &devices[index];
  if (!ds->handle) {
    cudnnStatus_t s = dnn.cudnnCreate(&ds->handle);
    if (s != CUDNN_STATUS_SUCCESS) {
      ds->handle = NULL;
      return lt_fail(LT_ERR_UNSUPPORTED, "cuda:%d: cuDNN failed to start: %s", index, dnn.cudnnGetErrorString(s));
    }
    s = dnn.cudnnSetStream(ds->handle, (*cc)->compute);
    if (s != CUDNN_STATUS_SUCCESS) { /* (on another stream, reusing freed memory would race) */
      ds->handle = NULL;
      return lt_fail(LT_ERR_UNSUPPORTED, "cuda:%d: cuDNN would not take lutra's stream: %s", index,
                     dnn.cudnnGetErrorString(s));
    }
  }
  *out = ds;
  return LT_OK;
}

static const char *describe(const lt_sdpa_desc *d, char *buf, size_t n) {
  snprintf(buf, n, "q (%lld, %lld, %lld, %lld), k/v heads %lld, keys %lld, %s%s", (long long)d->B, (long long)d->NH,
           (long long)d->T, (long long)d->HS, (long long)d->NKV, (long long)d->S, lt_dtype_name(d->dtype),
           d->causal ? ", causal" : "");
  return buf;
}

/* The plan of d's forward or backward graph (built and cached on first use). */
static lt_status plan_for(const lt_sdpa_desc *d, int backward, lt_cuda_ctx **cc, device_state **dso, plan **out) {
  device_state *ds = NULL;
  LT_TRY(device_of(d->device, cc, &ds));
  *dso = ds;
  char buf[200];
  if (backward && version <= 91500 && d->S % 128)
    return lt_fail(LT_ERR_UNSUPPORTED, "scaled_dot_product_attention: cuDNN %zu.%zu's backward needs a key count "
                   "divisible by 128 (%s)", version / 10000, version / 100 % 100, describe(d, buf, sizeof buf));
  if (backward && d->T == 1 && d->S == 1)
    return lt_fail(LT_ERR_UNSUPPORTED, "scaled_dot_product_attention: cuDNN's backward does not take one query "
                   "over one key");
  plan_key k = key_of(d, backward);
  plan *p = NULL;
  for (int i = 0; i < ds->nplans && !p; i++)
    if (memcmp(&ds->plans[i]->key, &k, sizeof k) == 0)
      p = ds->plans[i];
  if (!p && ds->nplans == MAX_PLANS) { /* a workload of ever-new shapes: start over (as cuda/cublaslt.c) */
    for (int i = 0; i < ds->nplans; i++) {
      builder_free(ds->plans[i]->b);
      free(ds->plans[i]->b);
      free(ds->plans[i]);
    }
    ds->nplans = 0;
  }
  if (!p) {
    if (ds->nplans == ds->cap) {
      int cap = ds->cap ? 2 * ds->cap : 16;
      plan **np = realloc(ds->plans, (size_t)cap * sizeof *np);
      if (!np)
        return lt_fail(LT_ERR_OOM, "scaled_dot_product_attention: out of host memory for cuDNN plans");
      ds->plans = np, ds->cap = cap;
    }
    p = calloc(1, sizeof *p);
    if (p)
      p->b = calloc(1, sizeof *p->b);
    if (!p || !p->b) {
      free(p);
      return lt_fail(LT_ERR_OOM, "scaled_dot_product_attention: out of host memory for cuDNN plans");
    }
    p->key = k;
    build_plan(ds->handle, NULL, d, p);
    ds->plans[ds->nplans++] = p;
  }
  if (!p->x || p->dead) {
    return lt_fail(LT_ERR_UNSUPPORTED, "scaled_dot_product_attention: cuDNN refused the %s for %s (%s)",
                   backward ? "backward" : "forward", describe(d, buf, sizeof buf), p->why);
  }
  *out = p;
  return LT_OK;
}

lt_status lt_cudnn_sdpa_prepare(const lt_sdpa_desc *d, int backward) {
  pthread_mutex_lock(&lock);
  lt_cuda_ctx *cc;
  device_state *ds;
  plan *p;
  lt_status st = plan_for(d, 0, &cc, &ds, &p);
  if (st == LT_OK && backward)
    st = plan_for(d, 1, &cc, &ds, &p);
  pthread_mutex_unlock(&lock);
  return st;
}

/* what masked scores become: -inf, or -FLT_MAX before cuDNN 9.10 (as cudnn-frontend) */
static float mask_value(void) { return version < 91000 ? -FLT_MAX : -INFINITY; }

typedef struct pack {
  int64_t uids[16];
  void *ptrs[16];
  int n;
} pack;

static void put(pack *vp, int64_t uid, const void *ptr) {
  vp->uids[vp->n] = uid;
  vp->ptrs[vp->n++] = (void *)ptr;
}

/* Runs plan p over the variant pack on the compute stream, with a workspace
   from the caching allocator (stream order makes its reuse safe). */
static lt_status execute(lt_cuda_ctx *cc, device_state *ds, plan *p, pack *vp) {
  lt_device dev = LT_DEVICE_CUDA + cc->index;
  void *ws = NULL;
  if (p->workspace > 0)
    LT_TRY(lt_backend_cuda.alloc(dev, (size_t)p->workspace, &ws));
  builder b = {0};
  cudnnBackendDescriptor_t varpack = make(&b, CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  SET(&b, varpack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws);
  SET(&b, varpack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, vp->n, vp->ptrs);
  SET(&b, varpack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, vp->n, vp->uids);
  finalize(&b, varpack, "the variant pack");
  if (!b.failed) {
    cudnnStatus_t s = dnn.cudnnBackendExecute(ds->handle, p->x, varpack);
    if (s != CUDNN_STATUS_SUCCESS)
      fail_with(&b, "cudnnBackendExecute", s);
  }
  builder_free(&b);
  if (ws)
    lt_backend_cuda.free(dev, ws, (size_t)p->workspace);
  if (b.failed) { /* nothing ran: the plan is refused from now on, and the caller falls back */
    snprintf(p->why, sizeof p->why, "%s", b.why);
    p->dead = 1;
    return lt_fail(LT_ERR_UNSUPPORTED, "cuda:%d: scaled_dot_product_attention: cuDNN would not run its plan: %s",
                   cc->index, b.why);
  }
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    return lt_cuda_error("cuDNN attention", cc->index, e);
  if (lt_cuda_profiling()) { /* lt.cuda.profile_start: named by pass and shape */
    char what[64];
    snprintf(what, sizeof what, "cuDNN attention %s %lldx%lldx%lldx%lld%s", p->key.backward ? "bwd" : "fwd",
             (long long)p->key.B, (long long)p->key.NH, (long long)p->key.T, (long long)p->key.HS,
             p->key.causal ? " causal" : "");
    lt_cuda_profile_mark(what);
  }
  return LT_OK;
}

lt_status lt_cudnn_sdpa_fwd(const lt_sdpa_desc *d) {
  pthread_mutex_lock(&lock);
  lt_cuda_ctx *cc;
  device_state *ds;
  plan *p;
  lt_status st = plan_for(d, 0, &cc, &ds, &p);
  if (st == LT_OK) {
    float scale = (float)d->scale, neg_inf = mask_value();
    pack vp = {{0}, {0}, 0};
    put(&vp, ID_Q, d->q), put(&vp, ID_K, d->k), put(&vp, ID_V, d->v), put(&vp, ID_O, d->o);
    put(&vp, ID_STATS, d->stats), put(&vp, ID_SCALE, &scale);
    if (d->causal)
      put(&vp, ID_NEG_INF, &neg_inf);
    st = execute(cc, ds, p, &vp);
  }
  pthread_mutex_unlock(&lock);
  return st;
}

lt_status lt_cudnn_sdpa_bwd(const lt_sdpa_desc *d) {
  pthread_mutex_lock(&lock);
  lt_cuda_ctx *cc;
  device_state *ds;
  plan *p;
  lt_status st = plan_for(d, 1, &cc, &ds, &p);
  void *softmax_sum = NULL, *dq_accum = NULL;
  size_t rows_bytes = (size_t)(d->B * d->NH * d->T) * 4, accum_bytes = rows_bytes * (size_t)d->HS;
  int det = st == LT_OK && p->key.deterministic;
  lt_device dev = LT_DEVICE_CUDA;
  if (st == LT_OK) {
    dev = LT_DEVICE_CUDA + cc->index;
    st = lt_backend_cuda.alloc(dev, rows_bytes, &softmax_sum);
  }
  if (st == LT_OK && !det)
    st = lt_backend_cuda.alloc(dev, accum_bytes, &dq_accum);
  if (st == LT_OK && !det && version < 90600) { /* older cuDNN adds into the accumulator */
    cudaError_t e = cudaMemsetAsync(dq_accum, 0, accum_bytes, cc->compute);
    if (e != cudaSuccess)
      st = lt_cuda_error("clearing cuDNN's dQ accumulator", cc->index, e);
  }
  if (st == LT_OK) {
    float scale = (float)d->scale, neg_inf = mask_value(), one = 1.0f;
    pack vp = {{0}, {0}, 0};
    put(&vp, ID_Q, d->q), put(&vp, ID_K, d->k), put(&vp, ID_V, d->v), put(&vp, ID_O, d->o);
    put(&vp, ID_DO, d->dout), put(&vp, ID_STATS, d->stats), put(&vp, ID_DQ, d->dq), put(&vp, ID_DK, d->dk);
    put(&vp, ID_DV, d->dv), put(&vp, ID_SCALE, &scale), put(&vp, ID_ONE, &one);
    put(&vp, ID_SOFTMAX_SUM, softmax_sum);
    if (!det)
      put(&vp, ID_DQ_ACCUM, dq_accum);
    if (d->causal)
      put(&vp, ID_NEG_INF, &neg_inf);
    st = execute(cc, ds, p, &vp);
  }
  if (softmax_sum)
    lt_backend_cuda.free(dev, softmax_sum, rows_bytes);
  if (dq_accum)
    lt_backend_cuda.free(dev, dq_accum, accum_bytes);
  pthread_mutex_unlock(&lock);
  return st;
}


/* Builds d's forward (backward 0), backward (1) or deterministic backward
   (2) operation graph and finalizes it, with no
   device (cuDNN 9.8 and later need none for that): whether cuDNN takes the
   descriptors this file makes. LT_ERR_UNSUPPORTED with cuDNN's reason when
   not (or when cuDNN cannot be loaded). For tests on machines without a GPU. */
lt_status lt_cudnn_sdpa_check_graph(const lt_sdpa_desc *d, int backward) {
  LT_TRY(dnn_open());
  builder b;
  memset(&b, 0, sizeof b);
  graph g = {&b, {0}, 0};
  if (backward)
    backward_graph(&g, d, backward == 2);
  else
    forward_graph(&g, d);
  cudnnBackendDescriptor_t og = make(&b, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  SET(&b, og, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, g.nops, g.ops);
  finalize(&b, og, "the operation graph");
  lt_status st = b.failed ? lt_fail(LT_ERR_UNSUPPORTED, "cuDNN refused the %s graph: %s",
                                    backward == 2 ? "deterministic backward" : backward ? "backward" : "forward", b.why)
                          : LT_OK;
  builder_free(&b);
  return st;
}

/* Builds d's forward (backward 0), backward (1) or deterministic backward
   (2) graph and its execution plan for the device a cuDNN device property
   descriptor describes (device_json: its JSON representation, as cuDNN 9.8+
   writes and reads it), with no device: heuristics, engine configs, a plan
   compiled for that device. LT_OK with the plan's workspace bytes in
   *workspace, or -1 there when an engine took the graph and compiled its
   kernels but the plan could not load them (CUDA's stub libcuda, or no
   driver); LT_ERR_UNSUPPORTED with cuDNN's reason when no engine takes
   the graph (or cuDNN cannot be loaded). For tests on machines without a
   GPU (tests/c/test_cudnn_graph.c). */
lt_status lt_cudnn_sdpa_check_plan(const lt_sdpa_desc *d, int backward, const char *device_json, int64_t *workspace) {
  LT_TRY(dnn_open());
  plan p;
  memset(&p, 0, sizeof p);
  p.b = calloc(1, sizeof *p.b);
  if (!p.b)
    return lt_fail(LT_ERR_OOM, "out of host memory");
  p.key = key_of(d, backward != 0);
  p.key.deterministic = backward == 2;
  cudnnBackendDescriptor_t devprop = make(p.b, CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR);
  SET(p.b, devprop, CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION, CUDNN_TYPE_CHAR, (int64_t)strlen(device_json),
      device_json);
  finalize(p.b, devprop, "the device properties");
  lt_status st;
  if (p.b->failed) {
    st = lt_fail(LT_ERR_UNSUPPORTED, "cuDNN refused the device properties: %s", p.b->why);
  } else {
    build_plan(NULL, devprop, d, &p);
    st = p.x || p.compiled
             ? LT_OK
             : lt_fail(LT_ERR_UNSUPPORTED, "cuDNN planned no %s for it: %s",
                       backward == 2 ? "deterministic backward" : backward ? "backward" : "forward", p.why);
    if (st == LT_OK && workspace)
      *workspace = p.x ? p.workspace : -1;
  }
  builder_free(p.b);
  free(p.b);
  return st;
}

lt_status lt_cudnn_device_properties(int device_index, char *buf, int64_t cap, int64_t *len) {
  lt_cuda_ctx *cc;
  device_state *ds;
  pthread_mutex_lock(&lock);
  lt_status st = device_of(LT_DEVICE_CUDA + device_index, &cc, &ds);
  pthread_mutex_unlock(&lock);
  LT_TRY(st);
  builder b;
  memset(&b, 0, sizeof b);
  int32_t id = device_index;
  cudnnBackendDescriptor_t dp = make(&b, CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR);
  SET(&b, dp, CUDNN_ATTR_DEVICEPROP_DEVICE_ID, CUDNN_TYPE_INT32, 1, &id);
  finalize(&b, dp, "the device properties");
  int64_t n = 0;
  if (!b.failed) {
    cudnnStatus_t s = dnn.cudnnBackendGetAttribute(dp, CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION, CUDNN_TYPE_CHAR, 0,
                                                  &n, NULL);
    if (s == CUDNN_STATUS_SUCCESS && n < cap)
      s = dnn.cudnnBackendGetAttribute(dp, CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION, CUDNN_TYPE_CHAR, n, &n, buf);
    if (s != CUDNN_STATUS_SUCCESS)
      fail_with(&b, "reading the device properties", s);
  }
  builder_free(&b);
  if (b.failed)
    return lt_fail(LT_ERR_UNSUPPORTED, "cuda:%d: cuDNN did not describe the device: %s", device_index, b.why);
  if (n >= cap)
    return lt_fail(LT_ERR_ARG, "cuDNN's device description takes %lld bytes, more than %lld", (long long)n,
                   (long long)cap);
  buf[n] = 0;
  *len = (int64_t)strlen(buf);
  return LT_OK;
}

#endif /* cudnn_graph.h */
#endif /* LT_WITH_CUDA */
