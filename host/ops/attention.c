/*
 * ops/attention.c: the dispatch of scaled-dot-product attention: the
 * checks, lutra's fused row kernels (kernels/attention_rows.h) on
 * contiguous f32/f64 rows, and attention on 16-bit operands where they lie
 * (lt_sdpa_desc), by lutra's attention_half kernels (CUDA's tensor cores)
 * or by the device's vendor library (cuDNN), forward and backward. The
 * differentiable entry points are host/autograd/attention.c.
 */
#include "core/iter.h"
#include "ops/nn.h"
#include "../../kernels/attention_rows.h"

#include <string.h>

lt_status lt_op_attention_check(const char *op, const lt_tensor *q, const lt_tensor *k, const lt_tensor *v,
                                double scale, const lt_backend_i **be) {
  const lt_tensor *ins[3] = {q, k, v};
  static const char *const names[3] = {"q", "k", "v"};
  LT_TRY(lt_same_device_named(op, 3, ins, names, be));
  for (int j = 0; j < 3; j++)
    LT_TRY(lt_nn_need_float(op, ins[j]));
  char b1[200], b2[200], b3[200];
  if (q->ndim != 4 || k->ndim != 4 || v->ndim != 4 || k->sizes[0] != q->sizes[0] || v->sizes[0] != q->sizes[0] ||
      k->sizes[3] != q->sizes[3] || v->sizes[3] != q->sizes[3] || v->sizes[1] != k->sizes[1] ||
      v->sizes[2] != k->sizes[2] || k->sizes[1] == 0 || q->sizes[1] % k->sizes[1] != 0)
    return lt_fail(LT_ERR_SHAPE,
                   "%s: expects q (B, NH, T, HS), k and v (B, NKV, S, HS) of the same batch B, with NKV dividing NH; "
                   "got %s, %s, %s", op,
                   lt_tensor_shape_str(q, b1), lt_tensor_shape_str(k, b2), lt_tensor_shape_str(v, b3));
  if (q->dtype != k->dtype || q->dtype != v->dtype)
    return lt_fail(LT_ERR_DTYPE, "%s: q, k and v are %s, %s and %s; convert them to one dtype", op,
                   lt_dtype_name(q->dtype), lt_dtype_name(k->dtype), lt_dtype_name(v->dtype));
  return lt_nn_check_scale(op, scale, lt_nn_compute_dtype(q->dtype));
}

lt_status lt_op_attention_route(const char *op, const lt_backend_i *be, const lt_tensor *q, const lt_tensor *k,
                                int *half) {
  int64_t HS = q->sizes[3];
  *half = 0;
  if (HS > LT_ATTN_MAX_HS)
    return lt_fail(LT_ERR_UNSUPPORTED, "%s: head size %lld is over the fused kernel's %d", op, (long long)HS,
                   LT_ATTN_MAX_HS);
  if (be->attention_half_fwd && be->attention_half(q->dtype, HS) && lt_tensor_numel(q) > 0 &&
      lt_tensor_numel(k) > 0) {
    *half = 1; /* (16-bit operands where they are: tensor cores) */
    return LT_OK;
  }
  if (!be->attention_fwd || !be->attention_bwd)
    return lt_fail(LT_ERR_UNSUPPORTED, "%s: not implemented on the %s backend", op, be->name);
  return LT_OK;
}

lt_status lt_op_attention_fwd(lt_dtype cd, const lt_tensor *q, const lt_tensor *k, const lt_tensor *v, double scale,
                              int causal, lt_tensor **o, lt_tensor **lse) {
  int64_t B = q->sizes[0], NH = q->sizes[1], T = q->sizes[2], HS = q->sizes[3], NKV = k->sizes[1], S = k->sizes[2];
  int64_t rows = B * NH * T;
  *o = *lse = NULL;
  lt_status st = lt_tensor_empty_like(q, cd, o);
  if (st == LT_OK)
    st = lt_tensor_empty(1, &rows, cd, q->storage->device, lse);
  if (st == LT_OK)
    st = q->storage->backend->attention_fwd(cd, lt_tensor_ptr(q), lt_tensor_ptr(k), lt_tensor_ptr(v),
                                            lt_tensor_ptr(*o), lt_tensor_ptr(*lse), B, NH, NKV, T, S, HS, scale,
                                            causal != 0);
  if (st != LT_OK) {
    lt_tensor_release(*o);
    lt_tensor_release(*lse);
    *o = *lse = NULL;
  }
  return st;
}

lt_status lt_op_attention_bwd(const lt_tensor *q, const lt_tensor *k, const lt_tensor *v, const lt_tensor *o,
                              const lt_tensor *dout, const lt_tensor *lse, double scale, int causal, lt_tensor **dq,
                              lt_tensor **dk, lt_tensor **dv) {
  lt_dtype cd = q->dtype;
  lt_tensor *D = NULL;
  *dq = *dk = *dv = NULL;
  lt_status st = lt_tensor_empty_like(lse, cd, &D);
  if (st == LT_OK)
    st = lt_tensor_empty_like(q, cd, dq);
  if (st == LT_OK)
    st = lt_tensor_empty_like(k, cd, dk);
  if (st == LT_OK)
    st = lt_tensor_empty_like(v, cd, dv);
  if (st == LT_OK)
    st = q->storage->backend->attention_bwd(cd, lt_tensor_ptr(q), lt_tensor_ptr(k), lt_tensor_ptr(v),
                                            lt_tensor_ptr(o), lt_tensor_ptr(dout), lt_tensor_ptr(lse),
                                            lt_tensor_ptr(D), lt_tensor_ptr(*dq), lt_tensor_ptr(*dk),
                                            lt_tensor_ptr(*dv), q->sizes[0], q->sizes[1], k->sizes[1], q->sizes[2],
                                            k->sizes[2], q->sizes[3], scale, causal != 0);
  lt_tensor_release(D);
  if (st != LT_OK) {
    lt_tensor_release(*dq);
    lt_tensor_release(*dk);
    lt_tensor_release(*dv);
    *dq = *dk = *dv = NULL;
  }
  return st;
}

/* ---- attention on operands where they are (lt_sdpa_desc) --------------------------------- */

lt_status lt_op_sdpa_empty(int64_t B, int64_t H, int64_t L, int64_t HS, lt_dtype dt, lt_device dev, lt_tensor **out) {
  int64_t phys[4] = {B, L, H, HS};
  lt_tensor *p = NULL;
  LT_TRY(lt_tensor_empty(4, phys, dt, dev, &p));
  int64_t sizes[4] = {B, H, L, HS}, strides[4] = {L * H * HS, HS, H * HS, 1};
  *out = lt_tensor_wrap(p->storage, 0, 4, sizes, strides, dt);
  lt_tensor_release(p);
  return *out ? LT_OK : lt_fail(LT_ERR_OOM, "scaled_dot_product_attention: out of host memory");
}

int lt_op_sdpa_layout(const lt_tensor *t) {
  if (t->strides[3] != 1 || (uintptr_t)lt_tensor_ptr(t) % 16)
    return 0;
  for (int d = 0; d < 3; d++)
    if (t->sizes[d] > 1 && (t->strides[d] <= 0 || t->strides[d] % 8))
      return 0;
  return 1;
}

lt_status lt_op_sdpa_check(const char *op, const lt_backend_i *be, const lt_tensor *q, const lt_tensor *k,
                           int causal) {
  int64_t T = q->sizes[2], S = k->sizes[2], HS = q->sizes[3];
  if (!be->sdpa_fwd)
    return lt_fail(LT_ERR_UNSUPPORTED, "%s: no attention library on the %s backend", op, be->name);
  if (q->dtype != LT_DTYPE_BF16 && q->dtype != LT_DTYPE_F16)
    return lt_fail(LT_ERR_UNSUPPORTED, "%s: the attention library takes bf16 or f16, not %s", op,
                   lt_dtype_name(q->dtype));
  if (causal && T != S)
    return lt_fail(LT_ERR_UNSUPPORTED, "%s: the attention library's causal mask needs as many queries as keys (%lld, %lld)",
                   op, (long long)T, (long long)S);
  if (HS % 8 || lt_tensor_numel(q) == 0 || lt_tensor_numel(k) == 0)
    return lt_fail(LT_ERR_UNSUPPORTED, "%s: the attention library needs a head size that is a multiple of 8 and no empty dim",
                   op);
  return LT_OK;
}

static void strides_of(const lt_tensor *t, int64_t *s) {
  for (int d = 0; d < 4; d++)
    s[d] = t->strides[d];
}

/* Whether q, k and v are a GPT-2 block's heads cut in order from one
   (B, T, 3, NH, HS) tensor (qkv:chunk(3, 3) viewed as heads): their
   gradients then go side by side into one buffer of that layout, which
   chunk's backward passes on as qkv's gradient without a copy. */
static int qkv_interleaved(const lt_tensor *q, const lt_tensor *k, const lt_tensor *v) {
  int64_t NH = q->sizes[1], T = q->sizes[2], HS = q->sizes[3], C = NH * HS;
  if (k->storage != q->storage || v->storage != q->storage || k->sizes[1] != NH || k->sizes[2] != T)
    return 0;
  int64_t want[4] = {T * 3 * C, HS, 3 * C, 1};
  for (int d = 0; d < 4; d++)
    if (q->strides[d] != want[d] || k->strides[d] != want[d] || v->strides[d] != want[d])
      return 0;
  return k->offset == q->offset + C && v->offset == q->offset + 2 * C;
}

/* The descriptor of a call on q, k, v (o and dout get the interleaved
   layout lt_op_sdpa_empty makes; the gradients too, or q's layout when q,
   k and v came from one qkv tensor). */
static void sdpa_desc_fill(lt_sdpa_desc *d, const lt_tensor *q, const lt_tensor *k, const lt_tensor *v, double scale,
                           int causal) {
  memset(d, 0, sizeof *d);
  d->device = q->storage->device;
  d->dtype = q->dtype;
  d->B = q->sizes[0], d->NH = q->sizes[1], d->T = q->sizes[2], d->HS = q->sizes[3];
  d->NKV = k->sizes[1], d->S = k->sizes[2];
  d->scale = scale;
  d->causal = causal != 0;
  d->deterministic = lt_cuda_deterministic();
  d->q = lt_tensor_ptr(q), d->k = lt_tensor_ptr(k), d->v = lt_tensor_ptr(v);
  strides_of(q, d->sq), strides_of(k, d->sk), strides_of(v, d->sv);
  int64_t T = d->T, S = d->S, HS = d->HS, NH = d->NH, NKV = d->NKV;
  int64_t o[4] = {T * NH * HS, HS, NH * HS, 1}, kv[4] = {S * NKV * HS, HS, NKV * HS, 1};
  memcpy(d->so, o, sizeof o), memcpy(d->sdo, o, sizeof o), memcpy(d->sdq, o, sizeof o);
  memcpy(d->sdk, kv, sizeof kv), memcpy(d->sdv, kv, sizeof kv);
  if (qkv_interleaved(q, k, v))
    memcpy(d->sdq, d->sq, sizeof d->sq), memcpy(d->sdk, d->sq, sizeof d->sq), memcpy(d->sdv, d->sq, sizeof d->sq);
}

/* dq, dk and dv side by side in one (B, T, 3, NH, HS) buffer, as q, k and v were. */
static lt_status qkv_gradients(const lt_sdpa_desc *d, lt_tensor **dq, lt_tensor **dk, lt_tensor **dv) {
  int64_t C = d->NH * d->HS, sizes[3] = {d->B, d->T, 3 * C}, heads[4] = {d->B, d->NH, d->T, d->HS};
  lt_tensor *buf = NULL;
  LT_TRY(lt_tensor_empty(3, sizes, d->dtype, d->device, &buf));
  lt_tensor **out[3] = {dq, dk, dv};
  for (int j = 0; j < 3; j++)
    *out[j] = lt_tensor_wrap(buf->storage, j * C, 4, heads, d->sq, d->dtype);
  lt_tensor_release(buf);
  if (!*dq || !*dk || !*dv)
    return lt_fail(LT_ERR_OOM, "scaled_dot_product_attention: out of host memory");
  return LT_OK;
}

lt_status lt_op_sdpa_fwd(const lt_backend_i *be, const lt_tensor *q, const lt_tensor *k, const lt_tensor *v,
                         double scale, int causal, int lutra, int backward, int *deterministic, lt_tensor **o,
                         lt_tensor **stats) {
  lt_sdpa_desc d;
  sdpa_desc_fill(&d, q, k, v, scale, causal);
  *o = *stats = NULL;
  lt_status st = lutra ? LT_OK : be->sdpa_prepare(&d, backward);
  lt_device dev = q->storage->device;
  if (st == LT_OK)
    st = lt_op_sdpa_empty(d.B, d.NH, d.T, d.HS, q->dtype, dev, o);
  if (st == LT_OK) {
    int64_t rows = d.B * d.NH * d.T;
    st = lt_tensor_empty(1, &rows, LT_DTYPE_F32, dev, stats);
  }
  if (st == LT_OK) {
    d.o = lt_tensor_ptr(*o), d.stats = lt_tensor_ptr(*stats);
    st = lutra ? be->attention_half_fwd(&d) : be->sdpa_fwd(&d);
  }
  *deterministic = d.deterministic;
  if (st != LT_OK) {
    lt_tensor_release(*o);
    lt_tensor_release(*stats);
    *o = *stats = NULL;
  }
  return st;
}

lt_status lt_op_sdpa_bwd(const lt_tensor *q, const lt_tensor *k, const lt_tensor *v, const lt_tensor *o,
                         const lt_tensor *stats, const lt_tensor *dout, double scale, int causal, int lutra,
                         int deterministic, lt_tensor **dq, lt_tensor **dk, lt_tensor **dv, int *by_rows) {
  lt_sdpa_desc d;
  sdpa_desc_fill(&d, q, k, v, scale, causal);
  d.deterministic = deterministic; /* (as the forward was prepared) */
  lt_device dev = q->storage->device;
  *dq = *dk = *dv = NULL;
  *by_rows = 0;
  lt_status st;
  if (qkv_interleaved(q, k, v)) {
    st = qkv_gradients(&d, dq, dk, dv);
  } else {
    st = lt_op_sdpa_empty(d.B, d.NH, d.T, d.HS, q->dtype, dev, dq);
    if (st == LT_OK)
      st = lt_op_sdpa_empty(d.B, d.NKV, d.S, d.HS, q->dtype, dev, dk);
    if (st == LT_OK)
      st = lt_op_sdpa_empty(d.B, d.NKV, d.S, d.HS, q->dtype, dev, dv);
  }
  if (st == LT_OK) {
    d.o = lt_tensor_ptr(o), d.stats = lt_tensor_ptr(stats), d.dout = lt_tensor_ptr(dout);
    d.dq = lt_tensor_ptr(*dq), d.dk = lt_tensor_ptr(*dk), d.dv = lt_tensor_ptr(*dv);
    const lt_backend_i *be = q->storage->backend;
    int half = be->attention_half_bwd && be->attention_half(d.dtype, d.HS);
    st = lutra ? be->attention_half_bwd(&d) : be->sdpa_bwd(&d);
    if (st == LT_ERR_UNSUPPORTED && !lutra) { /* the library would not run its backward after all: lutra's kernels */
      if (half)
        st = be->attention_half_bwd(&d);
      else if (!be->attention_bwd || d.HS > LT_ATTN_MAX_HS)
        st = lt_fail(LT_ERR_UNSUPPORTED, "scaled_dot_product_attention: the library refused its backward and lutra's "
                     "kernel takes head sizes up to %d, not %lld", LT_ATTN_MAX_HS, (long long)d.HS);
      else
        *by_rows = 1; /* (the row kernels on compute-dtype copies: the caller's) */
    }
  }
  if (st != LT_OK && !*by_rows) {
    lt_tensor_release(*dq);
    lt_tensor_release(*dk);
    lt_tensor_release(*dv);
    *dq = *dk = *dv = NULL;
  }
  return st;
}
