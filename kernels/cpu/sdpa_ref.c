/*
 * sdpa_ref.c: the CPU backend's answer to the library-attention interface
 * (lt_sdpa_desc, kernels/kernel.h), which cuDNN serves on a GPU: plain
 * attention over strided bf16/f16 operands computed in f64, one query row
 * at a time. It is the reference that lt_attention_library's layouts,
 * strides, saved stats and gradients are tested against where there is no
 * GPU; F.scaled_dot_product_attention never sends CPU tensors here (the
 * OpenBLAS products are faster).
 *
 * Forward: s_j = scale q.k_j over the visible keys (causal: j <= t),
 * stats = logsumexp_j s_j, o = sum_j exp(s_j - stats) v_j. Backward (the
 * FlashAttention-2 recomputation, Dao 2023): p_j = exp(s_j - stats),
 * D = dO.O, dS_j = scale p_j (dO.v_j - D); dq = sum_j dS_j k_j,
 * dk_j += dS_j q, dv_j += p_j dO (summed over a K/V head's query heads).
 */
#include "cpu.h"
#include "half.h"

#include <math.h>
#include <stdlib.h>

static double load(const lt_sdpa_desc *d, const void *base, const int64_t *st, int64_t b, int64_t h, int64_t t,
                   int64_t e) {
  uint16_t v = ((const uint16_t *)base)[b * st[0] + h * st[1] + t * st[2] + e * st[3]];
  return d->dtype == LT_DTYPE_BF16 ? lt_bf16_to_f32(v) : lt_f16_to_f32(v);
}

static void store(const lt_sdpa_desc *d, void *base, const int64_t *st, int64_t b, int64_t h, int64_t t, int64_t e,
                  double x) {
  ((uint16_t *)base)[b * st[0] + h * st[1] + t * st[2] + e * st[3]] =
      d->dtype == LT_DTYPE_BF16 ? lt_f32_to_bf16((float)x) : lt_f32_to_f16((float)x);
}

int lt_cpu_sdpa_supports(const lt_sdpa_desc *d) {
  return (d->dtype == LT_DTYPE_BF16 || d->dtype == LT_DTYPE_F16) && (!d->causal || d->T == d->S);
}

/* the scaled scores of query row (b, h, t) into s; returns how many keys it sees */
static int64_t scores(const lt_sdpa_desc *d, int64_t b, int64_t h, int64_t t, double *s) {
  int64_t hk = h / (d->NH / d->NKV), L = d->causal ? t + 1 : d->S;
  for (int64_t j = 0; j < L; j++) {
    double acc = 0;
    for (int64_t e = 0; e < d->HS; e++)
      acc += load(d, d->q, d->sq, b, h, t, e) * load(d, d->k, d->sk, b, hk, j, e);
    s[j] = d->scale * acc;
  }
  return L;
}

lt_status lt_cpu_sdpa_fwd(const lt_sdpa_desc *d) {
  if (!lt_cpu_sdpa_supports(d))
    return LT_ERR_UNSUPPORTED;
  double *s = malloc(sizeof *s * (size_t)(d->S + d->HS));
  if (!s)
    return LT_ERR_OOM;
  double *o = s + d->S;
  float *stats = d->stats;
  for (int64_t b = 0; b < d->B; b++)
    for (int64_t h = 0; h < d->NH; h++)
      for (int64_t t = 0; t < d->T; t++) {
        int64_t hk = h / (d->NH / d->NKV), L = scores(d, b, h, t, s);
        double m = -INFINITY, sum = 0;
        for (int64_t j = 0; j < L; j++)
          m = s[j] > m ? s[j] : m;
        for (int64_t j = 0; j < L; j++)
          sum += exp(s[j] - m);
        double lse = m + log(sum);
        for (int64_t e = 0; e < d->HS; e++)
          o[e] = 0;
        for (int64_t j = 0; j < L; j++) {
          double p = exp(s[j] - lse);
          for (int64_t e = 0; e < d->HS; e++)
            o[e] += p * load(d, d->v, d->sv, b, hk, j, e);
        }
        for (int64_t e = 0; e < d->HS; e++)
          store(d, d->o, d->so, b, h, t, e, o[e]);
        stats[(b * d->NH + h) * d->T + t] = (float)lse;
      }
  free(s);
  return LT_OK;
}

lt_status lt_cpu_sdpa_bwd(const lt_sdpa_desc *d) {
  if (!lt_cpu_sdpa_supports(d))
    return LT_ERR_UNSUPPORTED;
  size_t kv = (size_t)(d->B * d->NKV * d->S * d->HS);
  double *s = malloc(sizeof *s * (size_t)(d->S + d->HS));
  double *dk = calloc(2 * kv + 1, sizeof *dk);
  if (!s || !dk) {
    free(s);
    free(dk);
    return LT_ERR_OOM;
  }
  double *dv = dk + kv, *dq = s + d->S;
  const float *stats = d->stats;
  for (int64_t b = 0; b < d->B; b++)
    for (int64_t h = 0; h < d->NH; h++)
      for (int64_t t = 0; t < d->T; t++) {
        int64_t hk = h / (d->NH / d->NKV), L = scores(d, b, h, t, s);
        double lse = stats[(b * d->NH + h) * d->T + t], D = 0;
        for (int64_t e = 0; e < d->HS; e++) {
          D += load(d, d->dout, d->sdo, b, h, t, e) * load(d, d->o, d->so, b, h, t, e);
          dq[e] = 0;
        }
        for (int64_t j = 0; j < L; j++) {
          double p = exp(s[j] - lse), dp = 0;
          double *dkj = dk + ((b * d->NKV + hk) * d->S + j) * d->HS, *dvj = dv + ((b * d->NKV + hk) * d->S + j) * d->HS;
          for (int64_t e = 0; e < d->HS; e++)
            dp += load(d, d->dout, d->sdo, b, h, t, e) * load(d, d->v, d->sv, b, hk, j, e);
          double ds = d->scale * p * (dp - D);
          for (int64_t e = 0; e < d->HS; e++) {
            dq[e] += ds * load(d, d->k, d->sk, b, hk, j, e);
            dkj[e] += ds * load(d, d->q, d->sq, b, h, t, e);
            dvj[e] += p * load(d, d->dout, d->sdo, b, h, t, e);
          }
        }
        for (int64_t e = 0; e < d->HS; e++)
          store(d, d->dq, d->sdq, b, h, t, e, dq[e]);
      }
  for (int64_t b = 0; b < d->B; b++)
    for (int64_t h = 0; h < d->NKV; h++)
      for (int64_t j = 0; j < d->S; j++)
        for (int64_t e = 0; e < d->HS; e++) {
          size_t i = (size_t)(((b * d->NKV + h) * d->S + j) * d->HS + e);
          store(d, d->dk, d->sdk, b, h, j, e, dk[i]);
          store(d, d->dv, d->sdv, b, h, j, e, dv[i]);
        }
  free(s);
  free(dk);
  return LT_OK;
}
