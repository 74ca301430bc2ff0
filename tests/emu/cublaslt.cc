/*
 * cublaslt.cc: the CUDA emulator's cuBLASLt, the thirteen calls
 * host/cuda/cublaslt.c makes, computed on the CPU by OpenBLAS in the compute
 * type (f32 accumulation, TF32-rounded inputs when asked, or f64) from what
 * the descriptors say, as NVIDIA's documentation (cublasLt.h) defines
 * them: D = alpha op(A) op(B) + beta C, column-major, op N or T, strided
 * batches; epilogues BIAS (a vector of D's row count, added to every
 * column), GELU_AUX and GELU_AUX_BIAS (the GELU's input written to the aux
 * matrix, leading dimension divisible by 8 and at least D's rows; GELU in
 * its tanh form, which is an assumption here that tests/gpu checks against
 * the real library), BGRADB (the sum of op(B) over k, one value per
 * column of D, in D's type), DGELU (D times the tanh GELU's derivative at
 * the aux matrix's value) and DGELU_BGRAD (that, and the bias vector
 * receiving the sum of each row of the result: the documentation says the
 * bias gradient has D's row count; that it sums after the GELU's gradient
 * is what a layer's bias gradient needs, checked by tests/gpu).
 *
 * It is as strict as the documentation: attribute sizes must match the
 * documented types, dimensions must agree, leading dimensions must cover
 * their rows, types must fit the compute type, and a pointer passed to
 * cublasLtMatmul must have the alignment the heuristic was promised
 * (CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_*_BYTES, and the bias and aux pointers'
 * alignment when the heuristic ran). Each refusal says why on stderr.
 * LUTRA_EMU_REFUSE_EPILOGUES=heuristic|matmul refuses every epilogue there.
 * cublasLtMatmul checks its arguments and reads alpha, beta and the
 * descriptors when called; the product runs in the stream's order
 * (emu_queue.h).
 */
#include <cblas.h>
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <vector>

#include "emu_queue.h"

namespace {

struct layout {
  cudaDataType_t type;
  uint64_t rows, cols;
  int64_t ld;
  int32_t batch;
  int64_t stride;
};

struct desc {
  cublasComputeType_t compute;
  cudaDataType_t scale;
  int32_t transa, transb;
  uint32_t epilogue;
  const void *bias;
  void *aux;
  int64_t aux_ld;
};

struct pref {
  uint64_t workspace;
  uint32_t align[4]; /* A, B, C, D */
};

/* what the heuristic promised, kept in the algo's opaque bytes */
struct algo_state {
  uint32_t align[4];
  uint32_t align_bias, align_aux;
  uint64_t workspace; /* the bytes it asked for */
};
static_assert(sizeof(algo_state) <= sizeof(cublasLtMatmulAlgo_t), "the algo's opaque bytes hold its state");

layout *L(cublasLtMatrixLayout_t p) { return (layout *)(void *)p; }
desc *D(cublasLtMatmulDesc_t p) { return (desc *)(void *)p; }
pref *P(cublasLtMatmulPreference_t p) { return (pref *)(void *)p; }

cublasStatus_t refuse(cublasStatus_t s, const char *fmt, const char *what) {
  fprintf(stderr, "emulated cuBLASLt: ");
  fprintf(stderr, fmt, what);
  fputc('\n', stderr);
  return s;
}

template <typename T> bool set(void *field, const void *buf, size_t size) {
  if (size != sizeof(T))
    return false;
  memcpy(field, buf, sizeof(T));
  return true;
}

uint32_t alignment(const void *p) {
  uintptr_t a = (uintptr_t)p;
  uint32_t al = 256;
  while (al > 1 && a % al)
    al >>= 1;
  return al;
}

size_t type_size(cudaDataType_t t) {
  switch (t) {
  case CUDA_R_64F: return 8;
  case CUDA_R_32F: return 4;
  case CUDA_R_16BF:
  case CUDA_R_16F: return 2;
  default: return 0;
  }
}

double load(cudaDataType_t t, const void *p, int64_t i) {
  switch (t) {
  case CUDA_R_64F: return ((const double *)p)[i];
  case CUDA_R_32F: return ((const float *)p)[i];
  case CUDA_R_16BF: return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
  default: return __half2float(((const __half *)p)[i]);
  }
}

void store(cudaDataType_t t, void *p, int64_t i, double v) {
  switch (t) {
  case CUDA_R_64F: ((double *)p)[i] = v; break;
  case CUDA_R_32F: ((float *)p)[i] = (float)v; break;
  case CUDA_R_16BF: ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn((float)v); break;
  default: ((__half *)p)[i] = __float2half_rn((float)v); break;
  }
}

/* f32 rounded to TF32 (10 mantissa bits, to nearest even), as the tensor
   cores read f32 inputs under CUBLAS_COMPUTE_32F_FAST_TF32 */
float to_tf32(float v) {
  uint32_t u;
  memcpy(&u, &v, sizeof u);
  if ((u & 0x7f800000u) != 0x7f800000u) /* (inf and NaN stay) */
    u = (u + 0xfffu + ((u >> 13) & 1u)) & ~0x1fffu;
  memcpy(&v, &u, sizeof v);
  return v;
}

double gelu_tanh(double x) { return 0.5 * x * (1 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))); }

/* LUTRA_EMU_REFUSE_EPILOGUES=heuristic or =matmul: epilogues are refused
   (NOT_SUPPORTED) by the heuristic or by cublasLtMatmul, as a real
   cuBLASLt may for some shapes, so lutra's composing fallbacks run */
bool refuses_epilogues_at(const char *where) {
  const char *e = getenv("LUTRA_EMU_REFUSE_EPILOGUES");
  return e && !strcmp(e, where);
}

bool adds_bias(uint32_t e) { return e == CUBLASLT_EPILOGUE_BIAS || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS; }
bool writes_aux(uint32_t e) { return e == CUBLASLT_EPILOGUE_GELU_AUX || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS; }
bool reads_aux(uint32_t e) { return e == CUBLASLT_EPILOGUE_DGELU || e == CUBLASLT_EPILOGUE_DGELU_BGRAD; }
bool bias_grad(uint32_t e) { return e == CUBLASLT_EPILOGUE_BGRADB || e == CUBLASLT_EPILOGUE_DGELU_BGRAD; }
bool uses_bias(uint32_t e) { return adds_bias(e) || bias_grad(e); }
bool uses_aux(uint32_t e) { return writes_aux(e) || reads_aux(e); }

/* The tanh GELU's derivative at x (what DGELU multiplies by) */
double gelu_tanh_grad(double x) {
  double c = 0.7978845608028654, t = tanh(c * (x + 0.044715 * x * x * x));
  return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * c * (1 + 3 * 0.044715 * x * x);
}

/* The checks the heuristic and the product share: NULL when the problem is
   one cuBLASLt takes, else why not. m, n, k from the layouts. */
const char *problem(const desc *d, const layout *a, const layout *b, const layout *c, const layout *dd, uint64_t *m,
                    uint64_t *n, uint64_t *k) {
  if (a->type != b->type || c->type != dd->type || a->type != c->type)
    return "A, B, C and D must have one type here (lutra never mixes them)";
  if (d->compute == CUBLAS_COMPUTE_64F) {
    if (a->type != CUDA_R_64F || d->scale != CUDA_R_64F)
      return "CUBLAS_COMPUTE_64F takes f64 matrices and an f64 scale type";
  } else if (d->compute == CUBLAS_COMPUTE_32F || d->compute == CUBLAS_COMPUTE_32F_FAST_TF32) {
    if (d->scale != CUDA_R_32F || !(a->type == CUDA_R_32F || a->type == CUDA_R_16BF || a->type == CUDA_R_16F))
      return "CUBLAS_COMPUTE_32F takes f32, bf16 or f16 matrices and an f32 scale type";
    if (d->compute == CUBLAS_COMPUTE_32F_FAST_TF32 && a->type != CUDA_R_32F)
      return "TF32 is for f32 matrices";
  } else
    return "a compute type lutra does not use";
  *m = d->transa == CUBLAS_OP_N ? a->rows : a->cols;
  *k = d->transa == CUBLAS_OP_N ? a->cols : a->rows;
  uint64_t kb = d->transb == CUBLAS_OP_N ? b->rows : b->cols;
  *n = d->transb == CUBLAS_OP_N ? b->cols : b->rows;
  if (kb != *k)
    return "op(A) and op(B) disagree on k";
  if (c->rows != *m || c->cols != *n || dd->rows != *m || dd->cols != *n)
    return "C and D must be m x n";
  const layout *all[4] = {a, b, c, dd};
  for (int i = 0; i < 4; i++) {
    if (all[i]->ld < (int64_t)(all[i]->rows ? all[i]->rows : 1))
      return "a leading dimension smaller than the rows";
    if (all[i]->batch != a->batch)
      return "the layouts' batch counts differ";
  }
  if (d->epilogue != CUBLASLT_EPILOGUE_DEFAULT && a->batch > 1)
    return "lutra passes epilogues for single products only";
  if (uses_aux(d->epilogue) && (d->aux_ld % 8 || d->aux_ld < (int64_t)*m))
    return "the aux leading dimension must be divisible by 8 and at least D's rows";
  if (d->epilogue != CUBLASLT_EPILOGUE_DEFAULT && !uses_bias(d->epilogue) && !uses_aux(d->epilogue))
    return "an epilogue lutra does not use";
  return NULL;
}

/* D = alpha op(A) op(B) + beta C and the epilogue, now (cublasLtMatmul
   has checked the arguments) */
void product(const desc *d, const layout *a, const layout *b, const layout *c, const layout *o, uint64_t m,
             uint64_t n, uint64_t k, double al, double be, const void *A, const void *B, const void *C, void *Dp) {
  size_t es = type_size(a->type);
  cudaDataType_t t = a->type;
  for (int32_t bi = 0; bi < a->batch; bi++) {
    const char *pa = (const char *)A + (size_t)(bi * a->stride) * es;
    const char *pb = (const char *)B + (size_t)(bi * b->stride) * es;
    const char *pc = (const char *)C + (size_t)(bi * c->stride) * es;
    char *pd = (char *)Dp + (size_t)(bi * o->stride) * es;
    /* op(A) (m x k) and op(B) (k x n), column-major; the product by OpenBLAS
       in the compute type: f64 for COMPUTE_64F, else f32 accumulation (inputs
       rounded to TF32 first for COMPUTE_32F_FAST_TF32) */
    bool f64 = d->compute == CUBLAS_COMPUTE_64F, tf32 = d->compute == CUBLAS_COMPUTE_32F_FAST_TF32;
    std::vector<double> x((size_t)(m * k)), y((size_t)(k * n)), out((size_t)(m * n));
    for (uint64_t q = 0; q < k; q++)
      for (uint64_t i = 0; i < m; i++)
        x[(size_t)(i + q * m)] = load(t, pa, (int64_t)(d->transa == CUBLAS_OP_N ? i + q * a->ld : q + i * a->ld));
    for (uint64_t j = 0; j < n; j++)
      for (uint64_t q = 0; q < k; q++)
        y[(size_t)(q + j * k)] = load(t, pb, (int64_t)(d->transb == CUBLAS_OP_N ? q + j * b->ld : j + q * b->ld));
    if (m && n && k && f64)
      cblas_dgemm(CblasColMajor, CblasNoTrans, CblasNoTrans, (int)m, (int)n, (int)k, al, x.data(), (int)m, y.data(),
                  (int)k, 0.0, out.data(), (int)m);
    else if (m && n && k) {
      std::vector<float> xf(x.begin(), x.end()), yf(y.begin(), y.end()), of((size_t)(m * n));
      if (tf32) {
        for (float &v : xf)
          v = to_tf32(v);
        for (float &v : yf)
          v = to_tf32(v);
      }
      cblas_sgemm(CblasColMajor, CblasNoTrans, CblasNoTrans, (int)m, (int)n, (int)k, (float)al, xf.data(), (int)m,
                  yf.data(), (int)k, 0.0f, of.data(), (int)m);
      out.assign(of.begin(), of.end());
    }
    if (be != 0)
      for (uint64_t j = 0; j < n; j++)
        for (uint64_t i = 0; i < m; i++)
          out[(size_t)(i + j * m)] += be * load(t, pc, (int64_t)(i + j * c->ld));
    if (d->epilogue == CUBLASLT_EPILOGUE_BGRADB)
      for (uint64_t j = 0; j < n; j++) {
        double sum = 0;
        for (uint64_t q = 0; q < k; q++)
          sum += y[(size_t)(q + j * k)];
        store(t, (void *)d->bias, (int64_t)j, sum);
      }
    std::vector<double> row_sums(d->epilogue == CUBLASLT_EPILOGUE_DGELU_BGRAD ? m : 0);
    for (uint64_t j = 0; j < n; j++)
      for (uint64_t i = 0; i < m; i++) {
        double v = out[(size_t)(i + j * m)];
        if (adds_bias(d->epilogue))
          v += load(t, d->bias, (int64_t)i);
        if (writes_aux(d->epilogue)) {
          store(t, d->aux, (int64_t)(i + j * d->aux_ld), v);
          v = gelu_tanh(v);
        }
        if (reads_aux(d->epilogue))
          v *= gelu_tanh_grad(load(t, d->aux, (int64_t)(i + j * d->aux_ld)));
        if (!row_sums.empty())
          row_sums[i] += v;
        store(t, pd, (int64_t)(i + j * o->ld), v);
      }
    for (uint64_t i = 0; i < row_sums.size(); i++) /* DGELU_BGRAD: per row of D, after the GELU's gradient */
      store(t, (void *)d->bias, (int64_t)i, row_sums[i]);
  }
}

} // namespace

extern "C" {

const char *cublasLtGetStatusString(cublasStatus_t s) {
  switch (s) {
  case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
  case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE (emulated cuBLASLt)";
  case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED (emulated cuBLASLt)";
  case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
  default: return "a cuBLAS status (emulated cuBLASLt)";
  }
}

cublasStatus_t cublasLtCreate(cublasLtHandle_t *h) {
  static int handle;
  *h = (cublasLtHandle_t)(void *)&handle;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *out, cudaDataType type, uint64_t rows,
                                          uint64_t cols, int64_t ld) {
  if (!type_size(type))
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "a matrix type lutra does not use%s", "");
  layout *l = new layout();
  l->type = type;
  l->rows = rows;
  l->cols = cols;
  l->ld = ld;
  l->batch = 1;
  l->stride = 0;
  *out = (cublasLtMatrixLayout_t)(void *)l;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t p, cublasLtMatrixLayoutAttribute_t attr,
                                                const void *buf, size_t size) {
  bool ok;
  switch (attr) {
  case CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT: ok = set<int32_t>(&L(p)->batch, buf, size); break;
  case CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET: ok = set<int64_t>(&L(p)->stride, buf, size); break;
  default: return refuse(CUBLAS_STATUS_INVALID_VALUE, "a layout attribute lutra does not use%s", "");
  }
  return ok ? CUBLAS_STATUS_SUCCESS
            : refuse(CUBLAS_STATUS_INVALID_VALUE, "a layout attribute of the wrong size%s", "");
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t p) {
  delete L(p);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *out, cublasComputeType_t compute,
                                        cudaDataType_t scale) {
  desc *d = new desc();
  d->compute = compute;
  d->scale = scale;
  d->transa = d->transb = CUBLAS_OP_N;
  d->epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  *out = (cublasLtMatmulDesc_t)(void *)d;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t p, cublasLtMatmulDescAttributes_t attr,
                                              const void *buf, size_t size) {
  desc *d = D(p);
  bool ok;
  switch (attr) {
  case CUBLASLT_MATMUL_DESC_TRANSA: ok = set<int32_t>(&d->transa, buf, size); break;
  case CUBLASLT_MATMUL_DESC_TRANSB: ok = set<int32_t>(&d->transb, buf, size); break;
  case CUBLASLT_MATMUL_DESC_EPILOGUE: ok = set<uint32_t>(&d->epilogue, buf, size); break;
  case CUBLASLT_MATMUL_DESC_BIAS_POINTER: ok = set<const void *>(&d->bias, buf, size); break;
  case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER: ok = set<void *>(&d->aux, buf, size); break;
  case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD: ok = set<int64_t>(&d->aux_ld, buf, size); break;
  default: return refuse(CUBLAS_STATUS_INVALID_VALUE, "a descriptor attribute lutra does not use%s", "");
  }
  if (ok && (attr == CUBLASLT_MATMUL_DESC_TRANSA || attr == CUBLASLT_MATMUL_DESC_TRANSB)) {
    int32_t t = attr == CUBLASLT_MATMUL_DESC_TRANSA ? d->transa : d->transb;
    if (t != CUBLAS_OP_N && t != CUBLAS_OP_T)
      return refuse(CUBLAS_STATUS_INVALID_VALUE, "a transpose other than N or T%s", "");
  }
  return ok ? CUBLAS_STATUS_SUCCESS
            : refuse(CUBLAS_STATUS_INVALID_VALUE, "a descriptor attribute of the wrong size%s", "");
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t p) {
  delete D(p);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *out) {
  pref *p = new pref();
  for (int i = 0; i < 4; i++)
    p->align[i] = 256; /* the documented default */
  *out = (cublasLtMatmulPreference_t)(void *)p;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p,
                                                    cublasLtMatmulPreferenceAttributes_t attr, const void *buf,
                                                    size_t size) {
  bool ok;
  switch (attr) {
  case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES: ok = set<uint64_t>(&P(p)->workspace, buf, size); break;
  case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES: ok = set<uint32_t>(&P(p)->align[0], buf, size); break;
  case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES: ok = set<uint32_t>(&P(p)->align[1], buf, size); break;
  case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES: ok = set<uint32_t>(&P(p)->align[2], buf, size); break;
  case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES: ok = set<uint32_t>(&P(p)->align[3], buf, size); break;
  default: return refuse(CUBLAS_STATUS_INVALID_VALUE, "a preference attribute lutra does not use%s", "");
  }
  return ok ? CUBLAS_STATUS_SUCCESS
            : refuse(CUBLAS_STATUS_INVALID_VALUE, "a preference attribute of the wrong size%s", "");
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) {
  delete P(p);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t h, cublasLtMatmulDesc_t op,
                                              cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                              cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t dd,
                                              cublasLtMatmulPreference_t pr, int requested,
                                              cublasLtMatmulHeuristicResult_t *results, int *found) {
  (void)h;
  *found = 0;
  if (requested < 1)
    return refuse(CUBLAS_STATUS_INVALID_VALUE, "requestedAlgoCount < 1%s", "");
  uint64_t m, n, k;
  const char *why = problem(D(op), L(a), L(b), L(c), L(dd), &m, &n, &k);
  if (why)
    return refuse(CUBLAS_STATUS_INVALID_VALUE, "the heuristic: %s", why);
  if (D(op)->epilogue != CUBLASLT_EPILOGUE_DEFAULT && refuses_epilogues_at("heuristic"))
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "the heuristic: %s", "epilogues refused (LUTRA_EMU_REFUSE_EPILOGUES)");
  memset(results, 0, sizeof *results);
  algo_state s;
  memset(&s, 0, sizeof s);
  for (int i = 0; i < 4; i++)
    s.align[i] = P(pr)->align[i];
  s.align_bias = uses_bias(D(op)->epilogue) ? alignment(D(op)->bias) : 0;
  s.align_aux = uses_aux(D(op)->epilogue) ? alignment(D(op)->aux) : 0;
  /* an algorithm that wants workspace, as many do: within the preference */
  s.workspace = std::min<uint64_t>(P(pr)->workspace, 1 << 20);
  memcpy(&results->algo, &s, sizeof s);
  results->workspaceSize = s.workspace;
  results->state = CUBLAS_STATUS_SUCCESS;
  results->wavesCount = 1.0f;
  *found = 1;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t op, const void *alpha, const void *A,
                              cublasLtMatrixLayout_t adesc, const void *B, cublasLtMatrixLayout_t bdesc,
                              const void *beta, const void *C, cublasLtMatrixLayout_t cdesc, void *Dp,
                              cublasLtMatrixLayout_t ddesc, const cublasLtMatmulAlgo_t *algo, void *workspace,
                              size_t workspace_bytes, cudaStream_t stream) {
  (void)h;
  const desc *d = D(op);
  const layout *a = L(adesc), *b = L(bdesc), *c = L(cdesc), *o = L(ddesc);
  uint64_t m, n, k;
  const char *why = problem(d, a, b, c, o, &m, &n, &k);
  if (why)
    return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmul: %s", why);
  if (!algo)
    return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmul without an algorithm%s", "");
  if (d->epilogue != CUBLASLT_EPILOGUE_DEFAULT && refuses_epilogues_at("matmul"))
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "cublasLtMatmul: %s", "epilogues refused (LUTRA_EMU_REFUSE_EPILOGUES)");
  algo_state s;
  memcpy(&s, algo, sizeof s);
  if (workspace_bytes < s.workspace || (workspace_bytes && !workspace))
    return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmul: less workspace than the algorithm asked for%s", "");
  size_t es = type_size(a->type);
  const void *ptrs[4] = {A, B, C, Dp};
  const layout *lays[4] = {a, b, c, o};
  const char *names[4] = {"A", "B", "C", "D"};
  for (int i = 0; i < 4; i++) {
    uint32_t need = s.align[i];
    /* every batch's matrix must be aligned too */
    uint32_t have = alignment(ptrs[i]);
    if (lays[i]->batch > 1)
      have = std::min(have, alignment((const void *)(uintptr_t)(lays[i]->stride * (int64_t)es)));
    if (have < need)
      return refuse(CUBLAS_STATUS_INVALID_VALUE,
                    "cublasLtMatmul: matrix %s is less aligned than the heuristic was told", names[i]);
  }
  if (s.align_bias && alignment(d->bias) < s.align_bias)
    return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmul: the bias is less aligned than at the heuristic%s", "");
  if (s.align_aux && alignment(d->aux) < s.align_aux)
    return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmul: the aux is less aligned than at the heuristic%s", "");
  if (uses_bias(d->epilogue) && !d->bias)
    return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmul: the epilogue needs a bias pointer%s", "");
  if (uses_aux(d->epilogue) && !d->aux)
    return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmul: the epilogue needs an aux pointer%s", "");
  double al = d->scale == CUDA_R_64F ? *(const double *)alpha : *(const float *)alpha;
  double be = d->scale == CUDA_R_64F ? *(const double *)beta : *(const float *)beta;
  /* alpha, beta and the descriptors are read now, the matrices when the
     product runs in the stream's order (emu_queue.h) */
  desc dc = *d;
  layout la = *a, lb = *b, lc = *c, lo = *o;
  lt_emu_trace(stream, "matmul %lld %lld %lld batch %d epilogue %d", (long long)m, (long long)n, (long long)k,
               lo.batch, (int)d->epilogue);
  lt_emu_enqueue(stream, [=] {
    if (workspace_bytes)
      memset(workspace, 0xff, workspace_bytes); /* (the algorithm's scratch) */
    product(&dc, &la, &lb, &lc, &lo, m, n, k, al, be, A, B, C, Dp);
  });
  return CUBLAS_STATUS_SUCCESS;
}

} // extern "C"
