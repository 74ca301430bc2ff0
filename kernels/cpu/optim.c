/*
 * optim.c: fused optimizer updates on the CPU, one call for a whole group
 * of parameters, with PyTorch's formulas (torch.optim.AdamW and SGD, the
 * single-tensor forms), each gradient read times the step's grad_scale
 * (a global-norm clip's factor; 1 for none):
 *
 *   AdamW (Loshchilov and Hutter 2019):  p *= 1 - lr wd;  m = lerp(m, g, 1 - b1);
 *     v = b2 v + (1 - b2) g^2;  p -= (lr / bc1) m / (sqrt(v) / sqrt(bc2) + eps)
 *   SGD:  d = g + wd p;  b = d on the first step, else momentum b + (1 - dampening) d;
 *     d = d + momentum b (Nesterov) or b;  p -= lr d
 *
 * 16-bit parameters update their f32 master copy and take its rounding;
 * f32 parameters compute in f32 and f64 ones in f64. The gradient sum of
 * squares accumulates in f64 over fixed blocks combined in order, so it does
 * not depend on the thread count.
 */
#include "cpu.h"
#include "half.h"

#include <math.h>
#include <omp.h>

enum { BLOCK = 65536 };

static inline float load16(const uint16_t *p, lt_dtype dt, int64_t i) {
  return dt == LT_DTYPE_BF16 ? lt_bf16_to_f32(p[i]) : lt_f16_to_f32(p[i]);
}

static inline uint16_t store16(float x, lt_dtype dt) {
  return dt == LT_DTYPE_BF16 ? lt_f32_to_bf16(x) : lt_f32_to_f16(x);
}

#define ADAMW_BODY(T, SQRT, P_LOAD, G_LOAD, P_STORE)                                              \
  {                                                                                                \
    T lr = (T)h->lr, b1 = (T)h->beta1, b2 = (T)h->beta2, eps = (T)h->eps;                          \
    T decay = (T)(1.0 - h->lr * h->weight_decay), step_size = (T)(h->lr / h->bias_correction1);    \
    T bc2_sqrt = (T)sqrt(h->bias_correction2), w1 = 1 - b1, gs = (T)h->grad_scale;                 \
    (void)lr;                                                                                      \
    _Pragma("omp parallel for schedule(static) if (t->numel >= LT_CPU_PARALLEL_MIN)")              \
    for (int64_t i = 0; i < t->numel; i++) {                                                       \
      T g = G_LOAD(i) * gs, p = P_LOAD(i);                                                         \
      p *= decay;                                                                                  \
      T mi = LT_LERP(T, m[i], g, w1); /* (torch.lerp: shared/scalar.h) */                           \
      T vi = b2 * v[i] + (1 - b2) * g * g;                                                         \
      m[i] = mi;                                                                                   \
      v[i] = vi;                                                                                   \
      p -= step_size * mi / (SQRT(vi) / bc2_sqrt + eps);                                           \
      P_STORE(i, p);                                                                               \
    }                                                                                              \
  }

static void adamw_one(const lt_optim_tensor *t, const lt_adamw_hparams *h) {
  if (t->dtype == LT_DTYPE_F64) {
    double *pp = t->param, *m = t->m, *v = t->v;
    const double *gp = t->grad;
#define PL(i) pp[i]
#define GL(i) gp[i]
#define PS(i, x) pp[i] = (x)
    ADAMW_BODY(double, sqrt, PL, GL, PS)
#undef PL
#undef GL
#undef PS
  } else if (t->dtype == LT_DTYPE_F32) {
    float *pp = t->param, *m = t->m, *v = t->v;
    const float *gp = t->grad;
#define PL(i) pp[i]
#define GL(i) gp[i]
#define PS(i, x) pp[i] = (x)
    ADAMW_BODY(float, sqrtf, PL, GL, PS)
#undef PL
#undef GL
#undef PS
  } else {
    uint16_t *p16 = t->param;
    const uint16_t *g16 = t->grad;
    float *master = t->master, *m = t->m, *v = t->v;
    lt_dtype dt = t->dtype;
#define PL(i) master[i]
#define GL(i) load16(g16, dt, i)
#define PS(i, x) (master[i] = (x), p16[i] = store16(x, dt))
    ADAMW_BODY(float, sqrtf, PL, GL, PS)
#undef PL
#undef GL
#undef PS
  }
}

lt_status lt_cpu_adamw(int n, const lt_optim_tensor *ts, const lt_adamw_hparams *h) {
  for (int k = 0; k < n; k++)
    adamw_one(&ts[k], h);
  return LT_OK;
}

#define SGD_BODY(T, P_LOAD, G_LOAD, P_STORE)                                                       \
  {                                                                                                \
    T lr = (T)h->lr, mom = (T)h->momentum, damp = (T)(1.0 - h->dampening), wd = (T)h->weight_decay; \
    T gs = (T)h->grad_scale;                                                                       \
    _Pragma("omp parallel for schedule(static) if (t->numel >= LT_CPU_PARALLEL_MIN)")              \
    for (int64_t i = 0; i < t->numel; i++) {                                                       \
      T p = P_LOAD(i), d = G_LOAD(i) * gs;                                                         \
      if (wd != 0)                                                                                 \
        d += wd * p;                                                                               \
      if (buf) {                                                                                   \
        T b = h->first_step ? d : mom * buf[i] + damp * d;                                         \
        buf[i] = b;                                                                                \
        d = h->nesterov ? d + mom * b : b;                                                         \
      }                                                                                            \
      p -= lr * d;                                                                                 \
      P_STORE(i, p);                                                                               \
    }                                                                                              \
  }

static void sgd_one(const lt_optim_tensor *t, const lt_sgd_hparams *h) {
  if (t->dtype == LT_DTYPE_F64) {
    double *pp = t->param, *buf = t->m;
    const double *gp = t->grad;
#define PL(i) pp[i]
#define GL(i) gp[i]
#define PS(i, x) pp[i] = (x)
    SGD_BODY(double, PL, GL, PS)
#undef PL
#undef GL
#undef PS
  } else if (t->dtype == LT_DTYPE_F32) {
    float *pp = t->param, *buf = t->m;
    const float *gp = t->grad;
#define PL(i) pp[i]
#define GL(i) gp[i]
#define PS(i, x) pp[i] = (x)
    SGD_BODY(float, PL, GL, PS)
#undef PL
#undef GL
#undef PS
  } else {
    uint16_t *p16 = t->param;
    const uint16_t *g16 = t->grad;
    float *master = t->master, *buf = t->m;
    lt_dtype dt = t->dtype;
#define PL(i) master[i]
#define GL(i) load16(g16, dt, i)
#define PS(i, x) (master[i] = (x), p16[i] = store16(x, dt))
    SGD_BODY(float, PL, GL, PS)
#undef PL
#undef GL
#undef PS
  }
}

lt_status lt_cpu_sgd(int n, const lt_optim_tensor *ts, const lt_sgd_hparams *h) {
  for (int k = 0; k < n; k++)
    sgd_one(&ts[k], h);
  return LT_OK;
}

/* The sum of squares of elements i0..i1 in f64, in LANES independent
   partial sums (element i to lane i mod LANES from i0, the lanes added in
   order at the end): one dependent chain of f64 adds would bound the loop
   at an add's latency per element; the order is fixed, so the sum does not
   depend on the thread count. */
enum { LANES = 8 };
#define SUM_SQUARES(LOAD)                                                     \
  {                                                                           \
    int64_t i = i0;                                                           \
    for (; i + LANES <= i1; i += LANES)                                       \
      for (int j = 0; j < LANES; j++) {                                       \
        double g = LOAD(i + j);                                               \
        lane[j] += g * g;                                                     \
      }                                                                       \
    for (; i < i1; i++) {                                                     \
      double g = LOAD(i);                                                     \
      lane[(i - i0) % LANES] += g * g;                                        \
    }                                                                         \
  }

static double block_sum_squares(const lt_optim_tensor *t, int64_t i0, int64_t i1) {
  double lane[LANES] = {0};
  const double *g64 = t->grad;
  const float *g32 = t->grad;
  switch (t->dtype) {
  case LT_DTYPE_F64:
#define L64(i) g64[i]
    SUM_SQUARES(L64)
#undef L64
    break;
  case LT_DTYPE_F32:
#define L32(i) (double)g32[i]
    SUM_SQUARES(L32)
#undef L32
    break;
  default:
#define L16(i) (double)load16(t->grad, t->dtype, i)
    SUM_SQUARES(L16)
#undef L16
  }
  double s = 0;
  for (int j = 0; j < LANES; j++)
    s += lane[j];
  return s;
}

/* one f64 partial per block of the largest tensor that has more than one */
size_t lt_cpu_sum_squares_scratch(int n, const lt_optim_tensor *ts) {
  int64_t most = 0;
  for (int k = 0; k < n; k++) {
    int64_t nblocks = (ts[k].numel + BLOCK - 1) / BLOCK;
    if (nblocks > 1 && nblocks > most)
      most = nblocks;
  }
  return (size_t)most * sizeof(double);
}

lt_status lt_cpu_grad_sum_squares(int n, const lt_optim_tensor *ts, double *scratch, double *out) {
  for (int k = 0; k < n; k++) {
    const lt_optim_tensor *t = &ts[k];
    int64_t nblocks = (t->numel + BLOCK - 1) / BLOCK;
    double total = 0;
    double *parts = nblocks > 1 ? scratch : NULL;
    if (!parts) { /* one block, or no scratch for partials: the same sums in the same order */
      for (int64_t b = 0; b < nblocks; b++)
        total += block_sum_squares(t, b * BLOCK, (b + 1) * BLOCK < t->numel ? (b + 1) * BLOCK : t->numel);
    } else {
#pragma omp parallel for schedule(static)
      for (int64_t b = 0; b < nblocks; b++) {
        int64_t i1 = (b + 1) * BLOCK < t->numel ? (b + 1) * BLOCK : t->numel;
        parts[b] = block_sum_squares(t, b * BLOCK, i1);
      }
      for (int64_t b = 0; b < nblocks; b++)
        total += parts[b];
    }
    out[k] = total;
  }
  return LT_OK;
}
