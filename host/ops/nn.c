/*
 * nn.c: the fused neural-network ops (layer_norm, rms_norm, each also with
 * the residual add fused in, softmax and log_softmax, cross_entropy, rope)
 * with their autograd nodes. Each
 * computes in f32 (f64 for f64 inputs: gradient checks) on contiguous rows
 * through the backend's row kernels (which read and write bf16/f16 rows as
 * they are where the backend has native_half_rows; elsewhere the rows are
 * converted), saves what its backward needs (mean and reciprocal std, the
 * softmax output, the logsumexp) and returns results in the input's dtype;
 * the loss and the statistics stay in f32.
 */
#include "autograd/autograd.h"
#include "core/iter.h"
#include "ops/loss.h"
#include "../../kernels/attention_rows.h"

#include <float.h>
#include <math.h>
#include <string.h>

/* The dtype row kernels run in for inputs of dtype d. */
static lt_dtype compute_dtype(lt_dtype d) { return d == LT_DTYPE_F64 ? LT_DTYPE_F64 : LT_DTYPE_F32; }

/* The dtype the backend's row kernels (norms, softmax, cross-entropy) read
   and write for inputs of dtype d: bf16/f16 as they are where the backend
   has native_half_rows, else the compute dtype. Their statistics (mean,
   rstd, log-sum-exp, per-row losses) are in compute_dtype(d). */
static lt_dtype row_dtype(const lt_backend_i *be, lt_dtype d) {
  if ((d == LT_DTYPE_BF16 || d == LT_DTYPE_F16) && be->native_half_rows)
    return d;
  return compute_dtype(d);
}

/* t as a contiguous tensor of dtype cd (t itself, retained, when it is one). */
static lt_status as_compute(const lt_tensor *t, lt_dtype cd, lt_tensor **out) {
  lt_status st;
  LT_NO_GRAD({
    lt_tensor *c = NULL;
    st = lt_tensor_to((lt_tensor *)t, cd, t->storage->device, &c);
    if (st == LT_OK) {
      st = lt_tensor_contiguous(c, out);
      lt_tensor_release(c);
    }
  });
  return st;
}

/* r converted to dtype d (consumes r). */
static lt_status to_dtype(lt_tensor *r, lt_dtype d, lt_tensor **out) {
  if (r->dtype == d) {
    *out = r;
    return LT_OK;
  }
  lt_status st;
  LT_NO_GRAD(st = lt_tensor_to(r, d, r->storage->device, out));
  lt_tensor_release(r);
  return st;
}

/* a scale that is finite in the dtype the kernels compute in */
static lt_status check_scale(const char *op, double scale, lt_dtype cd) {
  if (isfinite(scale) && !(cd == LT_DTYPE_F32 && fabs(scale) > FLT_MAX))
    return LT_OK;
  char v[40];
  if (isnan(scale))
    snprintf(v, sizeof v, "nan");
  else
    snprintf(v, sizeof v, "%g", scale);
  return lt_fail(LT_ERR_ARG, "%s: the scale must be finite (in %s), got %s", op, lt_dtype_name(cd), v);
}

static lt_status need_float(const char *op, const lt_tensor *t) {
  if (!lt_dtype_is_float(t->dtype))
    return lt_fail(LT_ERR_DTYPE, "%s: needs a float tensor, got %s", op, lt_dtype_name(t->dtype));
  return LT_OK;
}

#define RELEASE_ALL(...)                                         \
  do {                                                           \
    lt_tensor *rel_[] = {__VA_ARGS__};                           \
    for (size_t k_ = 0; k_ < sizeof rel_ / sizeof rel_[0]; k_++) \
      lt_tensor_release(rel_[k_]);                               \
  } while (0)

/* ---- fused attention --------------------------------------------------------------------- */

/* Hands dq, dk and dv (consumed) to the inputs that take a gradient, each
   in its input's dtype; returns st, or the first failure. */
static lt_status give_qkv_grads(lt_node *n, lt_status st, lt_tensor *dq, lt_tensor *dk, lt_tensor *dv,
                                lt_tensor **gi) {
  lt_tensor *outs[3] = {dq, dk, dv};
  for (int j = 0; j < 3; j++) {
    if (st == LT_OK && n->next[j].node) {
      st = to_dtype(outs[j], n->in[j].dtype, &gi[j]);
      outs[j] = NULL;
    }
    lt_tensor_release(outs[j]);
  }
  return st;
}

/* i[0..5] = B, NH, NKV, T, S, HS; i[6] causal; f[0] scale. Saved: q, k, v,
   o (compute dtype, contiguous) and lse. */
static lt_status attention_backward(lt_node *n, lt_tensor *const *go, lt_tensor **gi) {
  lt_tensor *q, *k, *v, *o, *lse;
  LT_TRY(lt_ag_saved(n, 0, &q));
  LT_TRY(lt_ag_saved(n, 1, &k));
  LT_TRY(lt_ag_saved(n, 2, &v));
  LT_TRY(lt_ag_saved(n, 3, &o));
  LT_TRY(lt_ag_saved(n, 4, &lse));
  lt_dtype cd = q->dtype;
  lt_tensor *dout = NULL, *D = NULL, *dq = NULL, *dk = NULL, *dv = NULL;
  lt_status st = as_compute(go[0], cd, &dout);
  if (st == LT_OK)
    st = lt_tensor_empty_like(lse, cd, &D);
  if (st == LT_OK)
    st = lt_tensor_empty_like(q, cd, &dq);
  if (st == LT_OK)
    st = lt_tensor_empty_like(k, cd, &dk);
  if (st == LT_OK)
    st = lt_tensor_empty_like(v, cd, &dv);
  if (st == LT_OK)
    st = q->storage->backend->attention_bwd(cd, lt_tensor_ptr(q), lt_tensor_ptr(k), lt_tensor_ptr(v),
                                            lt_tensor_ptr(o), lt_tensor_ptr(dout), lt_tensor_ptr(lse),
                                            lt_tensor_ptr(D), lt_tensor_ptr(dq), lt_tensor_ptr(dk), lt_tensor_ptr(dv),
                                            n->i[0], n->i[1], n->i[2], n->i[3], n->i[4], n->i[5], n->f[0],
                                            (int)n->i[6]);
  st = give_qkv_grads(n, st, dq, dk, dv, gi);
  RELEASE_ALL(dout, D);
  return st;
}

static const lt_node_ops attention_ops = {"AttentionBackward", attention_backward, NULL};

/* The checks every attention entry makes: one device, float dtypes, the
   shapes (B, NH, T, HS) and (B, NKV, S, HS) with NKV dividing NH, one dtype,
   a finite scale. */
static lt_status attention_args(const char *op, const lt_tensor *q, const lt_tensor *k, const lt_tensor *v,
                                double scale, const lt_backend_i **be) {
  const lt_tensor *ins[3] = {q, k, v};
  static const char *const names[3] = {"q", "k", "v"};
  LT_TRY(lt_same_device_named(op, 3, ins, names, be));
  for (int j = 0; j < 3; j++)
    LT_TRY(need_float(op, ins[j]));
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
  return check_scale(op, scale, compute_dtype(q->dtype));
}

static lt_status strided_attention(const lt_tensor *q, const lt_tensor *k, const lt_tensor *v, double scale,
                                   int causal, int lutra, lt_tensor **res);

lt_status lt_attention(const lt_tensor *q, const lt_tensor *k, const lt_tensor *v, double scale, int causal,
                       lt_tensor **res) {
  LT_OP_SCOPE("attention");
  const char *op = "scaled_dot_product_attention";
  const lt_tensor *ins[3] = {q, k, v};
  const lt_backend_i *be;
  LT_TRY(attention_args(op, q, k, v, scale, &be));
  int64_t B = q->sizes[0], NH = q->sizes[1], T = q->sizes[2], HS = q->sizes[3], NKV = k->sizes[1], S = k->sizes[2];
  if (HS > LT_ATTN_MAX_HS)
    return lt_fail(LT_ERR_UNSUPPORTED, "%s: head size %lld is over the fused kernel's %d", op, (long long)HS,
                   LT_ATTN_MAX_HS);
  if (be->attention_half_fwd && be->attention_half(q->dtype, HS) && lt_tensor_numel(q) > 0 && lt_tensor_numel(k) > 0)
    return strided_attention(q, k, v, scale, causal, 1, res); /* (16-bit operands where they are: tensor cores) */
  if (!be->attention_fwd || !be->attention_bwd)
    return lt_fail(LT_ERR_UNSUPPORTED, "%s: not implemented on the %s backend", op, be->name);
  lt_dtype cd = compute_dtype(q->dtype);
  lt_tensor *qc = NULL, *kc = NULL, *vc = NULL, *o = NULL, *lse = NULL, *r = NULL;
  int64_t rows = B * NH * T;
  lt_status st = as_compute(q, cd, &qc);
  if (st == LT_OK)
    st = as_compute(k, cd, &kc);
  if (st == LT_OK)
    st = as_compute(v, cd, &vc);
  if (st == LT_OK)
    st = lt_tensor_empty_like(qc, cd, &o);
  if (st == LT_OK)
    st = lt_tensor_empty(1, &rows, cd, q->storage->device, &lse);
  if (st == LT_OK)
    st = be->attention_fwd(cd, lt_tensor_ptr(qc), lt_tensor_ptr(kc), lt_tensor_ptr(vc), lt_tensor_ptr(o),
                           lt_tensor_ptr(lse), B, NH, NKV, T, S, HS, scale, causal != 0);
  if (st == LT_OK) {
    lt_tensor_retain(o);
    st = to_dtype(o, q->dtype, &r);
  }
  if (st == LT_OK && lt_ag_needed(3, ins)) {
    lt_node *n;
    st = lt_ag_node_new(&attention_ops, 3, ins, &n);
    if (st == LT_OK) {
      int64_t dims[6] = {B, NH, NKV, T, S, HS};
      for (int j = 0; j < 6; j++)
        n->i[j] = dims[j];
      n->i[6] = causal != 0;
      n->f[0] = scale;
      lt_tensor *save[5] = {qc, kc, vc, o, lse};
      for (int j = 0; j < 5 && st == LT_OK; j++)
        st = lt_ag_save(n, save[j]);
      if (st == LT_OK)
        st = lt_ag_attach(n, r, 0);
      lt_node_release(n);
    }
  }
  RELEASE_ALL(qc, kc, vc, o, lse);
  if (st != LT_OK) {
    lt_tensor_release(r);
    return st;
  }
  *res = r;
  return LT_OK;
}

/* ---- attention by a vendor library (cuDNN) ------------------------------------------------ */

/* An uninitialised (B, H, L, HS) tensor laid out as (B, L, H, HS): a
   position's heads side by side, so the model's transpose back to
   (B, L, H*HS) is contiguous and costs no copy. */
static lt_status empty_heads_interleaved(int64_t B, int64_t H, int64_t L, int64_t HS, lt_dtype dt, lt_device dev,
                                         lt_tensor **out) {
  int64_t phys[4] = {B, L, H, HS};
  lt_tensor *p = NULL;
  LT_TRY(lt_tensor_empty(4, phys, dt, dev, &p));
  int64_t sizes[4] = {B, H, L, HS}, strides[4] = {L * H * HS, HS, H * HS, 1};
  *out = lt_tensor_wrap(p->storage, 0, 4, sizes, strides, dt);
  lt_tensor_release(p);
  return *out ? LT_OK : lt_fail(LT_ERR_OOM, "scaled_dot_product_attention: out of host memory");
}

/* Whether a library can read t where it is: the last stride 1, the others
   positive multiples of 8 elements and the address 16-byte aligned (what
   cuDNN's flash attention asks of 16-bit operands). */
static int library_layout(const lt_tensor *t) {
  if (t->strides[3] != 1 || (uintptr_t)lt_tensor_ptr(t) % 16)
    return 0;
  for (int d = 0; d < 3; d++)
    if (t->sizes[d] > 1 && (t->strides[d] <= 0 || t->strides[d] % 8))
      return 0;
  return 1;
}

/* t itself (retained) when a library can read it, else a copy (a fresh
   contiguous tensor: aligned, also where t was contiguous at an odd offset). */
static lt_status library_operand(const lt_tensor *t, lt_tensor **out) {
  if (library_layout(t)) {
    lt_tensor_retain((lt_tensor *)t);
    *out = (lt_tensor *)t;
    return LT_OK;
  }
  lt_status st;
  LT_NO_GRAD(st = lt_tensor_clone(t, out));
  return st;
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
   layout empty_heads_interleaved makes; the gradients too, or q's layout
   when q, k and v came from one qkv tensor). */
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

/* The library backward's stand-in: lutra's fused attention backward
   (kernels/attention_rows.h; its log-sum-exp is the library's stats) on
   compute-dtype copies, the results written into dq, dk, dv as laid out. */
static lt_status sdpa_backward_by_kernel(const lt_sdpa_desc *d, const lt_tensor *q, const lt_tensor *k,
                                         const lt_tensor *v, const lt_tensor *o, const lt_tensor *dout,
                                         const lt_tensor *stats, lt_tensor *dq, lt_tensor *dk, lt_tensor *dv) {
  const lt_backend_i *be = q->storage->backend;
  if (!be->attention_bwd || d->HS > LT_ATTN_MAX_HS)
    return lt_fail(LT_ERR_UNSUPPORTED, "scaled_dot_product_attention: the library refused its backward and lutra's "
                   "kernel takes head sizes up to %d, not %lld", LT_ATTN_MAX_HS, (long long)d->HS);
  lt_dtype cd = compute_dtype(q->dtype);
  const lt_tensor *ins[5] = {q, k, v, o, dout};
  lt_tensor *c[5] = {NULL}, *D = NULL, *g[3] = {NULL};
  lt_status st = LT_OK;
  for (int j = 0; j < 5 && st == LT_OK; j++)
    st = as_compute(ins[j], cd, &c[j]);
  if (st == LT_OK)
    st = lt_tensor_empty_like(stats, cd, &D);
  for (int j = 0; j < 3 && st == LT_OK; j++)
    st = lt_tensor_empty_like(c[j], cd, &g[j]);
  if (st == LT_OK)
    st = be->attention_bwd(cd, lt_tensor_ptr(c[0]), lt_tensor_ptr(c[1]), lt_tensor_ptr(c[2]), lt_tensor_ptr(c[3]),
                           lt_tensor_ptr(c[4]), lt_tensor_ptr(stats), lt_tensor_ptr(D), lt_tensor_ptr(g[0]),
                           lt_tensor_ptr(g[1]), lt_tensor_ptr(g[2]), d->B, d->NH, d->NKV, d->T, d->S, d->HS, d->scale,
                           d->causal);
  lt_tensor *outs[3] = {dq, dk, dv};
  for (int j = 0; j < 3 && st == LT_OK; j++)
    LT_NO_GRAD(st = lt_tensor_copy_(outs[j], g[j]));
  RELEASE_ALL(c[0], c[1], c[2], c[3], c[4], D, g[0], g[1], g[2]);
  return st;
}

/* Saved: q, k, v (as the kernels read them), o, stats; i[0] causal, i[1] 1 for lutra's
   attention_half kernels, 0 for the library's; f[0] scale. */
static lt_status sdpa_backward(lt_node *n, lt_tensor *const *go, lt_tensor **gi) {
  lt_tensor *q, *k, *v, *o, *stats;
  LT_TRY(lt_ag_saved(n, 0, &q));
  LT_TRY(lt_ag_saved(n, 1, &k));
  LT_TRY(lt_ag_saved(n, 2, &v));
  LT_TRY(lt_ag_saved(n, 3, &o));
  LT_TRY(lt_ag_saved(n, 4, &stats));
  lt_sdpa_desc d;
  sdpa_desc_fill(&d, q, k, v, n->f[0], (int)n->i[0]);
  d.deterministic = (int)n->i[2]; /* (as the forward was prepared) */
  lt_device dev = q->storage->device;
  lt_tensor *g = NULL, *dout = NULL, *dq = NULL, *dk = NULL, *dv = NULL;
  lt_status st;
  /* dout in o's layout, the one the backward was prepared for */
  LT_NO_GRAD({
    st = lt_tensor_to(go[0], q->dtype, dev, &g);
    if (st == LT_OK && memcmp(g->strides, o->strides, sizeof o->strides[0] * 4) == 0 && library_layout(g)) {
      dout = g;
      g = NULL;
    }
    if (st == LT_OK && !dout && (st = empty_heads_interleaved(d.B, d.NH, d.T, d.HS, q->dtype, dev, &dout)) == LT_OK)
      st = lt_tensor_copy_(dout, g);
  });
  if (st == LT_OK && qkv_interleaved(q, k, v)) {
    st = qkv_gradients(&d, &dq, &dk, &dv);
  } else {
    if (st == LT_OK)
      st = empty_heads_interleaved(d.B, d.NH, d.T, d.HS, q->dtype, dev, &dq);
    if (st == LT_OK)
      st = empty_heads_interleaved(d.B, d.NKV, d.S, d.HS, q->dtype, dev, &dk);
    if (st == LT_OK)
      st = empty_heads_interleaved(d.B, d.NKV, d.S, d.HS, q->dtype, dev, &dv);
  }
  if (st == LT_OK) {
    d.o = lt_tensor_ptr(o), d.stats = lt_tensor_ptr(stats), d.dout = lt_tensor_ptr(dout);
    d.dq = lt_tensor_ptr(dq), d.dk = lt_tensor_ptr(dk), d.dv = lt_tensor_ptr(dv);
    const lt_backend_i *be = q->storage->backend;
    int half = be->attention_half_bwd && be->attention_half(d.dtype, d.HS);
    st = n->i[1] ? be->attention_half_bwd(&d) : be->sdpa_bwd(&d);
    if (st == LT_ERR_UNSUPPORTED && !n->i[1]) { /* the library would not run its backward after all: lutra's kernels */
      st = half ? be->attention_half_bwd(&d) : sdpa_backward_by_kernel(&d, q, k, v, o, dout, stats, dq, dk, dv);
    }
  }
  st = give_qkv_grads(n, st, dq, dk, dv, gi);
  RELEASE_ALL(g, dout);
  return st;
}

static const lt_node_ops sdpa_ops = {"LibraryAttentionBackward", sdpa_backward, NULL};
static const lt_node_ops half_attention_ops = {"AttentionBackward", sdpa_backward, NULL};

lt_status lt_attention_library(const lt_tensor *q, const lt_tensor *k, const lt_tensor *v, double scale, int causal,
                               lt_tensor **res) {
  LT_OP_SCOPE("scaled_dot_product_attention");
  return strided_attention(q, k, v, scale, causal, 0, res);
}

/* Attention on operands where they are (lt_sdpa_desc): the vendor library's
   (lutra = 0: lt_attention_library) or lutra's attention_half kernels
   (lutra = 1: lt_attention's 16-bit path, which the caller checked the
   backend takes). o comes in the heads-interleaved layout, whose transpose
   back to (B, T, NH, HS) needs no copy. */
static lt_status strided_attention(const lt_tensor *q, const lt_tensor *k, const lt_tensor *v, double scale,
                                   int causal, int lutra, lt_tensor **res) {
  const char *op = "scaled_dot_product_attention";
  const lt_tensor *ins[3] = {q, k, v};
  const lt_backend_i *be;
  LT_TRY(attention_args(op, q, k, v, scale, &be));
  int64_t T = q->sizes[2], S = k->sizes[2], HS = q->sizes[3];
  if (lutra)
    ; /* (lt_attention checked that the backend takes the dtype and head size, and no dim is empty) */
  else if (!be->sdpa_fwd)
    return lt_fail(LT_ERR_UNSUPPORTED, "%s: no attention library on the %s backend", op, be->name);
  else if (q->dtype != LT_DTYPE_BF16 && q->dtype != LT_DTYPE_F16)
    return lt_fail(LT_ERR_UNSUPPORTED, "%s: the attention library takes bf16 or f16, not %s", op,
                   lt_dtype_name(q->dtype));
  else if (causal && T != S)
    return lt_fail(LT_ERR_UNSUPPORTED, "%s: the attention library's causal mask needs as many queries as keys (%lld, %lld)",
                   op, (long long)T, (long long)S);
  else if (HS % 8 || lt_tensor_numel(q) == 0 || lt_tensor_numel(k) == 0)
    return lt_fail(LT_ERR_UNSUPPORTED, "%s: the attention library needs a head size that is a multiple of 8 and no empty dim",
                   op);
  lt_tensor *qc = NULL, *kc = NULL, *vc = NULL, *o = NULL, *stats = NULL;
  lt_status st = library_operand(q, &qc);
  if (st == LT_OK)
    st = library_operand(k, &kc);
  if (st == LT_OK)
    st = library_operand(v, &vc);
  int need_grad = lt_ag_needed(3, ins);
  lt_sdpa_desc d;
  if (st == LT_OK) {
    sdpa_desc_fill(&d, qc, kc, vc, scale, causal);
    if (!lutra)
      st = be->sdpa_prepare(&d, need_grad);
  }
  lt_device dev = q->storage->device;
  if (st == LT_OK)
    st = empty_heads_interleaved(d.B, d.NH, d.T, d.HS, q->dtype, dev, &o);
  if (st == LT_OK) {
    int64_t rows = d.B * d.NH * d.T;
    st = lt_tensor_empty(1, &rows, LT_DTYPE_F32, dev, &stats);
  }
  if (st == LT_OK) {
    d.o = lt_tensor_ptr(o), d.stats = lt_tensor_ptr(stats);
    st = lutra ? be->attention_half_fwd(&d) : be->sdpa_fwd(&d);
  }
  if (st == LT_OK && need_grad) {
    lt_node *n;
    st = lt_ag_node_new(lutra ? &half_attention_ops : &sdpa_ops, 3, ins, &n);
    if (st == LT_OK) {
      n->i[0] = causal != 0;
      n->i[1] = lutra;
      n->i[2] = d.deterministic;
      n->f[0] = scale;
      lt_tensor *save[5] = {qc, kc, vc, o, stats};
      for (int j = 0; j < 5 && st == LT_OK; j++)
        st = lt_ag_save(n, save[j]);
      if (st == LT_OK)
        st = lt_ag_attach(n, o, 0);
      lt_node_release(n);
    }
  }
  RELEASE_ALL(qc, kc, vc, stats);
  if (st != LT_OK) {
    lt_tensor_release(o);
    return st;
  }
  *res = o;
  return LT_OK;
}

/* ---- cross_entropy --------------------------------------------------------------------- */

static lt_status ce_backward(lt_node *n, lt_tensor *const *go, lt_tensor **gi) {
  lt_tensor *x, *tgt, *lse;
  LT_TRY(lt_ag_saved(n, 0, &x));
  LT_TRY(lt_ag_saved(n, 1, &tgt));
  LT_TRY(lt_ag_saved(n, 2, &lse));
  int64_t N = x->sizes[0], W = x->sizes[1], V = n->i[3], ldx = N > 1 ? x->strides[0] : W;
  int reduction = (int)n->i[0];
  double count = n->f[0];
  lt_tensor *scale = NULL, *g = NULL, *dx = NULL;
  lt_status st;
  /* the gradient of each row's loss: g (reduction none) or g broadcast, / count for mean */
  LT_NO_GRAD({ /* (in the statistics' dtype: f32 for 16-bit logits) */
    st = lt_tensor_to(go[0], lse->dtype, x->storage->device, &g);
    if (st == LT_OK)
      st = lt_tensor_empty(1, &N, lse->dtype, x->storage->device, &scale);
    if (st == LT_OK)
      st = lt_tensor_copy_(scale, g); /* broadcasts a 0-dim g */
    if (st == LT_OK && reduction == 0 && n->i[2]) { /* 1 / count on the device */
      lt_tensor *inv = NULL, *r = NULL;
      st = lt_ag_saved(n, 3, &inv);
      if (st == LT_OK)
        st = lt_binary(LT_BINARY_MUL, scale, inv, scale, &r);
      lt_tensor_release(r);
    } else if (st == LT_OK && reduction == 0) {
      lt_tensor *r = NULL;
      st = lt_binary_scalar(LT_BINARY_MUL, scale, count > 0 ? 1.0 / count : 0.0, 0, scale, &r);
      lt_tensor_release(r);
    }
  });
  if (st == LT_OK)
    st = lt_tensor_empty_like(x, x->dtype, &dx);
  if (st == LT_OK)
    st = x->storage->backend->cross_entropy_bwd(x->dtype, lt_tensor_ptr(x), ldx, lt_tensor_ptr(tgt), tgt->dtype, N,
                                                V, W, n->i[1], lt_tensor_ptr(lse), lt_tensor_ptr(scale),
                                                lt_tensor_ptr(dx));
  if (st == LT_OK) {
    lt_tensor_retain(dx);
    st = to_dtype(dx, n->in[0].dtype, &gi[0]);
  }
  RELEASE_ALL(scale, g, dx);
  return st;
}

static const lt_node_ops ce_ops = {"CrossEntropyBackward", ce_backward, NULL};

/* 1 / max(the targets that are not ignore, 1), a 0-dim tensor of dtype cd
   computed where the targets are (no wait for the device). */
static lt_status inverse_count(const lt_tensor *targets, int64_t ignore, lt_dtype cd, lt_tensor **out) {
  lt_status st;
  lt_tensor *keep = NULL, *kf = NULL, *n = NULL, *n1 = NULL;
  LT_NO_GRAD({
    st = lt_binary_scalar(LT_BINARY_NE, targets, (double)ignore, 0, NULL, &keep);
    if (st == LT_OK)
      st = lt_tensor_to(keep, cd, targets->storage->device, &kf);
    if (st == LT_OK)
      st = lt_reduce(LT_REDUCE_SUM, kf, 0, NULL, 0, 0, &n);
    if (st == LT_OK)
      st = lt_clamp(n, 1, 1, 0, 0, NULL, &n1);
    if (st == LT_OK)
      st = lt_binary_scalar(LT_BINARY_DIV, n1, 1.0, 1, NULL, out);
  });
  RELEASE_ALL(keep, kf, n, n1);
  return st;
}

/* A target outside [0, V) found by a cross-entropy kernel: deferred to the
   next read (a GPU) or reported now, naming the row and the value */
static lt_status ce_report(const lt_backend_i *be, lt_status st, int64_t bad, const char *op, int64_t V,
                           int64_t ignore_index, lt_tensor *tc) {
  lt_index_report rep;
  memset(&rep, 0, sizeof rep);
  rep.kind = LT_REPORT_TARGET, rep.op = op, rep.limit = V, rep.ignore = ignore_index, rep.index = tc;
  if (st == LT_OK && bad == LT_BAD_LATER)
    return lt_index_defer(be, &rep);
  if (st != LT_OK && bad >= 0) {
    double v = 0;
    lt_tensor *one = NULL;
    if (lt_tensor_narrow(tc, 0, bad, 1, &one) == LT_OK)
      lt_tensor_item(one, &v);
    lt_tensor_release(one);
    return lt_index_report_fail(&rep, bad, (int64_t)v);
  }
  return st;
}

/* c->counted on the host (a wait for a GPU; the read reports a bad target
   that an earlier kernel left for later), or 1 / count on the device for
   the mean (count_on_device) */
static lt_status ce_count(lt_ce_forward *c, const char *op, int64_t ignore_index, int reduction, int count_on_device) {
  if (count_on_device)
    return reduction == 0 ? inverse_count(c->tc, ignore_index, c->sd, &c->inv) : LT_OK;
  double *tv = malloc(sizeof(double) * (size_t)(c->N > 0 ? c->N : 1));
  lt_status st = tv ? lt_tensor_to_f64(c->tc, tv, c->N) : lt_fail(LT_ERR_OOM, "%s: out of host memory", op);
  for (int64_t k = 0; st == LT_OK && k < c->N; k++)
    c->counted += tv[k] != (double)ignore_index;
  free(tv);
  return st;
}

lt_status lt_ce_forward_run(const char *op, const lt_tensor *logits, const lt_tensor *targets, int64_t ignore_index,
                            int reduction, int64_t classes, int count_on_host, int grad_in_place, lt_ce_forward *c) {
  const lt_tensor *ins[2] = {logits, targets};
  static const char *const names[2] = {"logits", "targets"};
  const lt_backend_i *be;
  char b1[200], b2[200];
  memset(c, 0, sizeof *c);
  LT_OP_SCOPE(op);
  LT_TRY(lt_same_device_named(op, 2, ins, names, &be));
  LT_TRY(need_float(op, logits));
  if (targets->dtype != LT_DTYPE_I32 && targets->dtype != LT_DTYPE_I64)
    return lt_fail(LT_ERR_DTYPE, "%s: targets must be integer class ids (i32 or i64), got %s", op,
                   lt_dtype_name(targets->dtype));
  if (logits->ndim != 2 || targets->ndim != 1 || targets->sizes[0] != logits->sizes[0])
    return lt_fail(LT_ERR_SHAPE, "%s: expects logits (N, V) and targets (N), got %s and %s", op,
                   lt_tensor_shape_str(logits, b1), lt_tensor_shape_str(targets, b2));
  if (reduction < 0 || reduction > 2)
    return lt_fail(LT_ERR_ARG, "%s: reduction must be mean, sum or none", op);
  if (!be->cross_entropy_fwd)
    return lt_fail(LT_ERR_UNSUPPORTED, "%s: not implemented on the %s backend", op, be->name);
  int64_t N = logits->sizes[0], W = logits->sizes[1];
  if (classes < 0 || classes > W)
    return lt_fail(LT_ERR_ARG, "%s: classes %lld is outside [1, %lld] (the logits' last dim; 0 takes them all)", op,
                   (long long)classes, (long long)W);
  int64_t V = classes > 0 ? classes : W; /* the columns past V are padding: no logits, zero gradient */
  lt_dtype cd = row_dtype(be, logits->dtype), sd = compute_dtype(logits->dtype);
  c->N = N, c->W = W, c->V = V, c->cd = cd, c->sd = sd;
  lt_tensor *rows = NULL;
  lt_status st = LT_OK;
  /* rows read where they lie when they are unit-stride (a narrowed view of
     padded logits costs no copy), else a contiguous copy */
  if (logits->dtype == cd && (W <= 1 || logits->strides[1] == 1) && (N <= 1 || logits->strides[0] >= W)) {
    lt_tensor_retain((lt_tensor *)logits);
    c->xc = (lt_tensor *)logits;
  } else {
    st = as_compute(logits, cd, &c->xc);
  }
  c->ldx = N > 1 && c->xc ? c->xc->strides[0] : W;
  if (st == LT_OK)
    LT_NO_GRAD(st = lt_tensor_contiguous((lt_tensor *)targets, &c->tc));
  if (st == LT_OK)
    st = lt_tensor_empty(1, &N, sd, logits->storage->device, &rows);
  if (st == LT_OK)
    st = lt_tensor_empty(1, &N, sd, logits->storage->device, &c->lse);
  /* with grad_in_place, the rows' gradient d(row loss)/d(logits): scale NULL
     (1; the count and the loss's gradient are the caller's to apply) */
  int64_t bad = -1;
  void *x = c->xc ? lt_tensor_ptr(c->xc) : NULL, *t = c->tc ? lt_tensor_ptr(c->tc) : NULL;
  if (st == LT_OK && grad_in_place && be->cross_entropy_fwd_bwd) { /* one kernel: the loss and the gradient */
    st = be->cross_entropy_fwd_bwd(cd, x, c->ldx, t, c->tc->dtype, N, V, ignore_index, lt_tensor_ptr(rows),
                                   lt_tensor_ptr(c->lse), NULL, x, &bad);
    st = ce_report(be, st, bad, op, V, ignore_index, c->tc);
  } else if (st == LT_OK) {
    st = be->cross_entropy_fwd(cd, x, c->ldx, t, c->tc->dtype, N, V, ignore_index, lt_tensor_ptr(rows),
                               lt_tensor_ptr(c->lse), &bad);
    st = ce_report(be, st, bad, op, V, ignore_index, c->tc);
    if (st == LT_OK && grad_in_place) /* (each element read before it is written) */
      st = be->cross_entropy_bwd(cd, x, c->ldx, t, c->tc->dtype, N, V, c->ldx, ignore_index, lt_tensor_ptr(c->lse),
                                 NULL, x);
  }
  /* the counted tokens: on the host when asked for (a wait for a GPU, whose
     read reports a bad target at once), else 1 / count stays on the device
     for the mean */
  if (st == LT_OK)
    st = ce_count(c, op, ignore_index, reduction, !count_on_host && be->defer_index_report);
  if (st == LT_OK) {
    LT_NO_GRAD({
      if (reduction == 2) {
        lt_tensor_retain(rows);
        c->loss = rows;
      } else {
        lt_tensor *s = NULL;
        st = lt_reduce(LT_REDUCE_SUM, rows, 0, NULL, 0, 0, &s);
        if (st == LT_OK && reduction == 0 && c->inv) { /* (rows that do not count are 0) */
          st = lt_binary(LT_BINARY_MUL, s, c->inv, NULL, &c->loss);
          lt_tensor_release(s);
        } else if (st == LT_OK && reduction == 0) { /* mean over counted tokens; 0 when none count */
          st = lt_binary_scalar(LT_BINARY_MUL, s, c->counted ? 1.0 / (double)c->counted : 0.0, 0, NULL, &c->loss);
          lt_tensor_release(s);
        } else if (st == LT_OK) {
          c->loss = s;
        }
      }
    });
  }
  lt_tensor_release(rows);
  if (st != LT_OK)
    lt_ce_forward_release(c);
  return st;
}

void lt_ce_forward_release(lt_ce_forward *c) {
  RELEASE_ALL(c->xc, c->tc, c->lse, c->inv, c->loss);
  c->xc = c->tc = c->lse = c->inv = c->loss = NULL;
}

lt_status lt_cross_entropy(const lt_tensor *logits, const lt_tensor *targets, int64_t ignore_index,
                           int reduction, int64_t classes, lt_tensor **loss, int64_t *count) {
  const lt_tensor *ins[2] = {logits, targets};
  lt_ce_forward c;
  LT_TRY(lt_ce_forward_run("cross_entropy", logits, targets, ignore_index, reduction, classes, count != NULL, 0, &c));
  lt_status st = LT_OK;
  if (lt_ag_needed(1, &logits)) {
    lt_node *n;
    st = lt_ag_node_new(&ce_ops, 2, ins, &n);
    if (st == LT_OK) {
      n->i[0] = reduction;
      n->i[1] = ignore_index;
      n->i[2] = c.inv != NULL;
      n->i[3] = c.V;
      n->f[0] = (double)c.counted;
      st = lt_ag_save(n, c.xc);
      if (st == LT_OK)
        st = lt_ag_save(n, c.tc);
      if (st == LT_OK)
        st = lt_ag_save(n, c.lse);
      if (st == LT_OK && c.inv)
        st = lt_ag_save(n, c.inv);
      if (st == LT_OK)
        st = lt_ag_attach(n, c.loss, 0);
      lt_node_release(n);
    }
  }
  if (st == LT_OK) {
    *loss = c.loss;
    c.loss = NULL;
    if (count)
      *count = c.counted;
  }
  lt_ce_forward_release(&c);
  return st;
}

