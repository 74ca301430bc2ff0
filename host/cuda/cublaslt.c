/*
 * cuda/cublaslt.c: matrix products on the GPU through cuBLASLt. lt_matmul_desc
 * describes row-major products C[b] = A[b] B[b]; cuBLASLt is column-major, so
 * each call computes C^T = B^T A^T, which reads our row-major C, A and B in
 * place (an operand whose columns are contiguous goes in transposed).
 *
 * f32 multiplies in f32 (TF32 only after lt.cuda.allow_tf32(true)), f64 in
 * f64, and bf16/f16 take f32 accumulation. A 2-D product may carry an
 * epilogue (lt_linear, lt_mlp): the bias add, and the GELU with its input
 * written to an aux matrix for the backward; in the backward the bias
 * gradient (BGRADB), and the GELU's gradient from that aux matrix with the
 * bias gradient of the layer before it (DGELU_BGRAD); a shape cuBLASLt has
 * no such algorithm for is remembered and refused (LT_ERR_UNSUPPORTED), and
 * the caller composes. The innermost batch dim is a
 * strided batch of one call; outer batch dims loop here. A plan (descriptors
 * and the heuristic's first algorithm) is cached per shape, strides,
 * alignment and dtype, so the heuristic runs once per shape. The workspace
 * is 32 MiB, the size NVIDIA's cuBLAS documentation recommends for Hopper.
 */
#ifdef LT_WITH_CUDA

#include "cuda/backend.h"
#include "base/status.h"

#define LT_STR2(x) #x
#define LT_STR(x) LT_STR2(x)

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* cuBLASLt is opened at the first CUDA use, not linked: the library is half
   a gigabyte, and mapping it would slow every start of lutra by 0.2 s. */
#define BLAS_FUNCS(X)                                                                                        \
  X(cublasLtCreate) X(cublasLtGetStatusString) X(cublasLtMatrixLayoutCreate) X(cublasLtMatrixLayoutSetAttribute) \
  X(cublasLtMatrixLayoutDestroy) X(cublasLtMatmulDescCreate) X(cublasLtMatmulDescSetAttribute)                  \
  X(cublasLtMatmulDescDestroy) X(cublasLtMatmulPreferenceCreate) X(cublasLtMatmulPreferenceSetAttribute)        \
  X(cublasLtMatmulPreferenceDestroy) X(cublasLtMatmulAlgoGetHeuristic) X(cublasLtMatmul)

static struct {
#define X(f) __typeof__(f) *f;
  BLAS_FUNCS(X)
#undef X
} blas;

static lt_status blas_open(void) {
  static void *lib;
  if (lib)
    return LT_OK;
  const char *name = "libcublasLt.so." LT_STR(CUBLAS_VER_MAJOR);
  void *h = lt_cuda_library(name, &name); /* (cuda/libraries.c; the emulator's is linked into lutra) */
  if (!h)
    h = dlopen(LT_CUDA_LIBDIR "/libcublasLt.so." LT_STR(CUBLAS_VER_MAJOR), RTLD_NOW | RTLD_LOCAL);
  if (!h)
    return lt_fail(LT_ERR_DEVICE, "cuBLASLt could not be loaded (%s, also tried %s): %s", name, LT_CUDA_LIBDIR,
                   dlerror());
#define X(f)                                                                                      \
  if (!(blas.f = (__typeof__(f) *)dlsym(h, #f))) {                                                 \
    dlclose(h);                                                                                   \
    return lt_fail(LT_ERR_DEVICE, "cuBLASLt (%s) lacks %s: a different CUDA version?", name, #f); \
  }
  BLAS_FUNCS(X)
#undef X
  lib = h;
  return LT_OK;
}

enum { WORKSPACE_BYTES = 32 << 20, MAX_PLANS = 1024 };

static int allow_tf32;

/* lt.cuda.allow_tf32(on): f32 products may round inputs to TF32 (10-bit mantissa). */
void lt_cuda_set_allow_tf32(int on) { allow_tf32 = on != 0; }

typedef struct plan_key {
  int dtype, tf32, op_x, op_y;
  int64_t rows_x, cols_x, ld_x, rows_y, cols_y, ld_y, n, m, ld_c;
  int64_t batch, stride_x, stride_y, stride_c;
  int align_x, align_y, align_c;
  int epilogue, align_bias, align_aux;
  int64_t ld_aux;
} plan_key;

typedef struct lt_cuda_plan {
  plan_key key;
  int refused; /* cuBLASLt had no algorithm for this epilogue: the caller composes */
  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t lx, ly, lc;
  cublasLtMatmulAlgo_t algo;
  size_t workspace;
} plan;

lt_status lt_cuda_blas_init(lt_cuda_ctx *c) {
  LT_TRY(blas_open());
  cublasStatus_t s = blas.cublasLtCreate(&c->blas);
  if (s != CUBLAS_STATUS_SUCCESS)
    return lt_fail(LT_ERR_DEVICE, "cuda:%d: cuBLASLt failed to start: %s", c->index, blas.cublasLtGetStatusString(s));
  cudaError_t e = cudaMalloc(&c->workspace, WORKSPACE_BYTES);
  if (e != cudaSuccess)
    return lt_cuda_error("allocating the cuBLASLt workspace", c->index, e);
  c->workspace_size = WORKSPACE_BYTES;
  return LT_OK;
}

/* The largest power of two (up to 256) dividing an address. */
static int alignment(const void *p) {
  uintptr_t a = (uintptr_t)p;
  int al = 256;
  while (al > 1 && a % (uintptr_t)al)
    al >>= 1;
  return al;
}

/* The alignment every call's pointer has: base plus any combination of
   the byte offsets whose bits are or-ed into offsets. */
static int call_alignment(const void *base, uintptr_t offsets) {
  int a = alignment(base);
  while (a > 1 && offsets % (uintptr_t)a)
    a >>= 1;
  return a;
}

/*
 * A row-major-strided matrix (R x Cc, strides rs and cs, one of them 1 as
 * matmul.c guarantees) as a column-major cuBLASLt operand whose op() is its
 * transpose (Cc x R). The stride of a size-1 dim is free, so it is chosen.
 */
typedef struct operand {
  cublasOperation_t op;
  int64_t rows, cols, ld; /* the stored column-major matrix */
} operand;

static operand transposed(int64_t R, int64_t Cc, int64_t rs, int64_t cs) {
  operand o;
  if (Cc == 1)
    cs = 1;
  if (R == 1 && cs != 1)
    rs = 1;
  if (cs == 1) { /* rows contiguous: column-major Cc x R with ld rs is already the transpose */
    o.op = CUBLAS_OP_N;
    o.rows = Cc;
    o.cols = R;
    o.ld = R == 1 ? Cc : rs;
  } else { /* columns contiguous (rs == 1): column-major R x Cc with ld cs, transposed by op */
    o.op = CUBLAS_OP_T;
    o.rows = R;
    o.cols = Cc;
    o.ld = cs;
  }
  return o;
}

static lt_status blas_fail(const lt_cuda_ctx *c, const char *what, cublasStatus_t s) {
  return lt_fail(LT_ERR_DEVICE, "cuda:%d: cuBLASLt %s: %s", c->index, what, blas.cublasLtGetStatusString(s));
}

static lt_status layout(const lt_cuda_ctx *c, cudaDataType_t ty, int64_t rows, int64_t cols, int64_t ld,
                        int64_t batch, int64_t stride, cublasLtMatrixLayout_t *out) {
  cublasStatus_t s = blas.cublasLtMatrixLayoutCreate(out, ty, (uint64_t)rows, (uint64_t)cols, ld);
  if (s == CUBLAS_STATUS_SUCCESS && batch > 1) {
    int32_t b = (int32_t)batch;
    s = blas.cublasLtMatrixLayoutSetAttribute(*out, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &b, sizeof b);
    if (s == CUBLAS_STATUS_SUCCESS)
      s = blas.cublasLtMatrixLayoutSetAttribute(*out, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride);
  }
  return s == CUBLAS_STATUS_SUCCESS ? LT_OK : blas_fail(c, "matrix layout", s);
}

static void plan_destroy(plan *p) {
  if (p->desc)
    blas.cublasLtMatmulDescDestroy(p->desc);
  if (p->lx)
    blas.cublasLtMatrixLayoutDestroy(p->lx);
  if (p->ly)
    blas.cublasLtMatrixLayoutDestroy(p->ly);
  if (p->lc)
    blas.cublasLtMatrixLayoutDestroy(p->lc);
}

static lt_status plan_build(lt_cuda_ctx *c, const plan_key *k, plan *p) {
  memset(p, 0, sizeof *p);
  p->key = *k;
  cudaDataType_t ty, scale_ty = CUDA_R_32F;
  cublasComputeType_t ct = k->tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  switch (k->dtype) {
  case LT_DTYPE_F64: ty = CUDA_R_64F; scale_ty = CUDA_R_64F; ct = CUBLAS_COMPUTE_64F; break;
  case LT_DTYPE_BF16: ty = CUDA_R_16BF; ct = CUBLAS_COMPUTE_32F; break;
  case LT_DTYPE_F16: ty = CUDA_R_16F; ct = CUBLAS_COMPUTE_32F; break;
  default: ty = CUDA_R_32F; break;
  }
  cublasStatus_t s = blas.cublasLtMatmulDescCreate(&p->desc, ct, scale_ty);
  if (s != CUBLAS_STATUS_SUCCESS)
    return blas_fail(c, "descriptor", s);
  cublasOperation_t ox = (cublasOperation_t)k->op_x, oy = (cublasOperation_t)k->op_y;
  blas.cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ox, sizeof ox);
  blas.cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &oy, sizeof oy);
  if (k->epilogue != LT_EPILOGUE_NONE) {
    /* bias per row of cuBLASLt's column-major D (n x m): per output feature;
       aux laid out as D; pointers of the key's alignment stand in for the
       heuristic (cuBLASLt reads their alignment, not their data) */
    /* (our A is cuBLASLt's B: BGRAD_A is its BGRADB, a sum over k per column
       of D; DGELU_BGRAD's bias gradient is per row of D: per our column) */
    cublasLtEpilogue_t e = k->epilogue == LT_EPILOGUE_BIAS         ? CUBLASLT_EPILOGUE_BIAS
                           : k->epilogue == LT_EPILOGUE_GELU       ? CUBLASLT_EPILOGUE_GELU_AUX
                           : k->epilogue == LT_EPILOGUE_GELU_BIAS  ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS
                           : k->epilogue == LT_EPILOGUE_DGELU      ? CUBLASLT_EPILOGUE_DGELU
                           : k->epilogue == LT_EPILOGUE_DGELU_BGRAD ? CUBLASLT_EPILOGUE_DGELU_BGRAD
                                                                   : CUBLASLT_EPILOGUE_BGRADB;
    const void *bias = (const void *)(uintptr_t)k->align_bias, *aux = (const void *)(uintptr_t)k->align_aux;
    s = blas.cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof e);
    if (s == CUBLAS_STATUS_SUCCESS && lt_epilogue_has_bias((lt_epilogue)k->epilogue))
      s = blas.cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias);
    if (s == CUBLAS_STATUS_SUCCESS && lt_epilogue_has_aux((lt_epilogue)k->epilogue)) {
      s = blas.cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux);
      if (s == CUBLAS_STATUS_SUCCESS)
        s = blas.cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &k->ld_aux,
                                                sizeof k->ld_aux);
    }
    if (s != CUBLAS_STATUS_SUCCESS)
      return lt_fail(LT_ERR_UNSUPPORTED, "cuda:%d: cuBLASLt epilogue: %s", c->index, blas.cublasLtGetStatusString(s));
  }
  lt_status st = layout(c, ty, k->rows_x, k->cols_x, k->ld_x, k->batch, k->stride_x, &p->lx);
  if (st == LT_OK)
    st = layout(c, ty, k->rows_y, k->cols_y, k->ld_y, k->batch, k->stride_y, &p->ly);
  if (st == LT_OK)
    st = layout(c, ty, k->n, k->m, k->ld_c, k->batch, k->stride_c, &p->lc);
  if (st != LT_OK)
    return st;
  cublasLtMatmulPreference_t pref;
  if ((s = blas.cublasLtMatmulPreferenceCreate(&pref)) != CUBLAS_STATUS_SUCCESS)
    return blas_fail(c, "preference", s);
  size_t ws = c->workspace_size;
  uint32_t ax = (uint32_t)k->align_x, ay = (uint32_t)k->align_y, ac = (uint32_t)k->align_c;
  blas.cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
  blas.cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &ax, sizeof ax);
  blas.cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &ay, sizeof ay);
  blas.cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &ac, sizeof ac);
  blas.cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &ac, sizeof ac);
  cublasLtMatmulHeuristicResult_t res;
  int found = 0;
  s = blas.cublasLtMatmulAlgoGetHeuristic(c->blas, p->desc, p->lx, p->ly, p->lc, p->lc, pref, 1, &res, &found);
  blas.cublasLtMatmulPreferenceDestroy(pref);
  int64_t inner = k->op_x == CUBLAS_OP_N ? k->cols_x : k->rows_x; /* op(X) is (n x k) */
  if (s != CUBLAS_STATUS_SUCCESS || found == 0)
    return lt_fail(LT_ERR_UNSUPPORTED,
                   "cuda:%d: cuBLASLt has no algorithm for a %s product of (%lld x %lld) and (%lld x %lld), batch %lld: %s",
                   c->index, lt_dtype_name((lt_dtype)k->dtype), (long long)k->m, (long long)inner, (long long)inner,
                   (long long)k->n, (long long)k->batch,
                   s != CUBLAS_STATUS_SUCCESS ? blas.cublasLtGetStatusString(s) : "none found");
  p->algo = res.algo;
  p->workspace = res.workspaceSize;
  return LT_OK;
}

static lt_status plan_get(lt_cuda_ctx *c, const plan_key *k, plan **out) {
  for (int i = 0; i < c->nplans; i++)
    if (!memcmp(&c->plans[i].key, k, sizeof *k)) {
      if (c->plans[i].refused)
        return lt_fail(LT_ERR_UNSUPPORTED, "cuda:%d: cuBLASLt has no algorithm with this epilogue", c->index);
      *out = &c->plans[i];
      return LT_OK;
    }
  if (c->nplans == c->cap_plans) {
    if (c->cap_plans >= MAX_PLANS) { /* a workload of ever-new shapes: start over */
      for (int i = 0; i < c->nplans; i++)
        plan_destroy(&c->plans[i]);
      c->nplans = 0;
    } else {
      int cap = c->cap_plans ? c->cap_plans * 2 : 32;
      plan *np = realloc(c->plans, (size_t)cap * sizeof *np);
      if (!np)
        return lt_fail(LT_ERR_OOM, "cuda:%d: out of host memory for matmul plans", c->index);
      c->plans = np;
      c->cap_plans = cap;
    }
  }
  plan *p = &c->plans[c->nplans];
  lt_status st = plan_build(c, k, p);
  if (st != LT_OK) {
    plan_destroy(p);
    if (st != LT_ERR_UNSUPPORTED || k->epilogue == LT_EPILOGUE_NONE)
      return st;
    memset(p, 0, sizeof *p); /* an epilogue refused: remembered, so the next call composes at once */
    p->key = *k;
    p->refused = 1;
    c->nplans++;
    return st;
  }
  c->nplans++;
  *out = p;
  return LT_OK;
}

lt_status lt_cuda_matmul(const lt_matmul_desc *d) {
  int index = 0;
  cudaGetDevice(&index);
  lt_cuda_ctx *c;
  LT_TRY(lt_cuda_ctx_get(LT_DEVICE_CUDA + index, &c));
  int64_t es = lt_dtype_size(d->dtype);
  /* our B (k x n) as X with op(X) = B^T (n x k); our A (m x k) as Y with op(Y) = A^T (k x m) */
  operand x = transposed(d->k, d->n, d->b_rs, d->b_cs);
  operand y = transposed(d->m, d->k, d->a_rs, d->a_cs);
  int nb = d->nbatch_dims;
  int64_t batch = nb > 0 ? d->batch_shape[nb - 1] : 1;
  /* the innermost batch dim becomes one strided call unless an operand
     broadcasts along it (stride 0, which cuBLASLt may refuse): then it loops */
  int nloop = nb - 1;
  if (batch > 1 && (d->a_batch_strides[nb - 1] == 0 || d->b_batch_strides[nb - 1] == 0)) {
    nloop = nb;
    batch = 1;
  }
  plan_key k;
  memset(&k, 0, sizeof k);
  k.dtype = d->dtype;
  k.tf32 = d->dtype == LT_DTYPE_F32 && allow_tf32;
  k.op_x = x.op;
  k.op_y = y.op;
  k.rows_x = x.rows;
  k.cols_x = x.cols;
  k.ld_x = x.ld;
  k.rows_y = y.rows;
  k.cols_y = y.cols;
  k.ld_y = y.ld;
  k.n = d->n;
  k.m = d->m;
  k.ld_c = d->c_rs;
  k.batch = batch;
  if (batch > 1) {
    k.stride_x = d->b_batch_strides[nb - 1];
    k.stride_y = d->a_batch_strides[nb - 1];
    k.stride_c = d->c_batch_strides[nb - 1];
  }
  /* alignment of every call's pointers: the base's, and the outer batch strides' */
  int64_t outer = 1;
  uintptr_t ox = 0, oy = 0, oc = 0;
  for (int i = 0; i < nloop; i++) {
    outer *= d->batch_shape[i];
    ox |= (uintptr_t)(d->b_batch_strides[i] * es);
    oy |= (uintptr_t)(d->a_batch_strides[i] * es);
    oc |= (uintptr_t)(d->c_batch_strides[i] * es);
  }
  if (batch > 1) {
    ox |= (uintptr_t)(k.stride_x * es);
    oy |= (uintptr_t)(k.stride_y * es);
    oc |= (uintptr_t)(k.stride_c * es);
  }
  k.align_x = call_alignment(d->b, ox);
  k.align_y = call_alignment(d->a, oy);
  k.align_c = call_alignment(d->c, oc);
  if (d->epilogue != LT_EPILOGUE_NONE) {
    int with_bias = lt_epilogue_has_bias(d->epilogue), with_aux = lt_epilogue_has_aux(d->epilogue);
    if (nb > 0 || (with_bias && !d->bias) || (with_aux && (!d->aux || d->aux_rs % 8 || d->aux_rs < d->n)))
      return lt_fail(LT_ERR_UNSUPPORTED, "cuda:%d: cuBLASLt epilogues take one 2-D product with an aux row "
                     "stride divisible by 8", c->index);
    k.epilogue = d->epilogue;
    k.align_bias = with_bias ? alignment(d->bias) : 0;
    k.align_aux = with_aux ? call_alignment(d->aux, (uintptr_t)(d->aux_rs * es)) : 0;
    k.ld_aux = with_aux ? d->aux_rs : 0;
  }
  plan *p = NULL;
  LT_TRY(plan_get(c, &k, &p));
  if (d->epilogue != LT_EPILOGUE_NONE) { /* this call's vectors (the plan's descriptor is ours alone) */
    const void *bias = d->bias;
    void *aux = d->aux;
    if (k.align_bias)
      blas.cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias);
    if (k.align_aux)
      blas.cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux);
  }
  float one32 = 1.0f, zero32 = 0.0f;
  double one64 = 1.0, zero64 = 0.0;
  const void *alpha = d->dtype == LT_DTYPE_F64 ? (const void *)&one64 : (const void *)&one32;
  const void *beta = d->dtype == LT_DTYPE_F64 ? (const void *)&zero64 : (const void *)&zero32;
  for (int64_t o = 0; o < outer; o++) {
    int64_t offa = 0, offb = 0, offc = 0, rem = o;
    for (int i = nloop - 1; i >= 0; i--) {
      int64_t j = rem % d->batch_shape[i];
      rem /= d->batch_shape[i];
      offa += j * d->a_batch_strides[i];
      offb += j * d->b_batch_strides[i];
      offc += j * d->c_batch_strides[i];
    }
    const char *pb = d->b + offb * es, *pa = d->a + offa * es;
    char *pc = d->c + offc * es;
    cublasStatus_t s = blas.cublasLtMatmul(c->blas, p->desc, alpha, pb, p->lx, pa, p->ly, beta, pc, p->lc, pc, p->lc,
                                      &p->algo, c->workspace, p->workspace, c->compute);
    if (s != CUBLAS_STATUS_SUCCESS && d->epilogue != LT_EPILOGUE_NONE && o == 0) {
      p->refused = 1; /* (nothing ran: the caller composes, now and for this shape from now on) */
      return lt_fail(LT_ERR_UNSUPPORTED, "cuda:%d: cuBLASLt refused the epilogue: %s", c->index,
                     blas.cublasLtGetStatusString(s));
    }
    if (s != CUBLAS_STATUS_SUCCESS)
      return blas_fail(c, "matmul", s);
    if (lt_cuda_profiling()) { /* lt.cuda.profile_start: each call named by its shape */
      static const char *const epilogues[] = {"", " +bias", " gelu", " +bias gelu", " bgrad", " dgelu",
                                              " dgelu bgrad"};
      char what[64];
      snprintf(what, sizeof what, "cuBLASLt %s %lldx%lldx%lld%s", lt_dtype_name(d->dtype), (long long)d->m,
               (long long)d->n, (long long)d->k, epilogues[d->epilogue]);
      if (batch > 1) /* (one strided-batched call) */
        snprintf(what + strlen(what), sizeof what - strlen(what), " batch %lld", (long long)batch);
      lt_cuda_profile_mark(what);
    }
  }
  return LT_OK;
}

#endif
