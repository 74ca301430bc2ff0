/*
 * autograd/attention.c: lt_attention (lutra's fused scaled-dot-product
 * attention) and lt_attention_library (the device's vendor library: cuDNN),
 * the differentiable entry points, with their backward rules. lt_attention
 * runs the row kernels on f32/f64 copies, or, where the backend has 16-bit
 * kernels for the dtype and head size, reads q, k and v where they are as
 * the library does (ops/attention.c); the library's backward falls back to
 * lutra's kernels where the library refuses it.
 */
#include "autograd/nn.h"

#include <string.h>

/* Hands dq, dk and dv (consumed) to the inputs that take a gradient, each
   in its input's dtype; returns st, or the first failure. */
static lt_status give_qkv_grads(lt_node *n, lt_status st, lt_tensor *dq, lt_tensor *dk, lt_tensor *dv,
                                lt_tensor **gi) {
  lt_tensor *outs[3] = {dq, dk, dv};
  for (int j = 0; j < 3; j++) {
    if (st == LT_OK && n->next[j].node) {
      st = lt_nn_to_dtype(outs[j], n->in[j].dtype, &gi[j]);
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
  lt_tensor *dout = NULL, *dq = NULL, *dk = NULL, *dv = NULL;
  lt_status st = lt_nn_as_compute(go[0], q->dtype, &dout);
  if (st == LT_OK)
    st = lt_op_attention_bwd(q, k, v, o, dout, lse, n->f[0], (int)n->i[6], &dq, &dk, &dv);
  st = give_qkv_grads(n, st, dq, dk, dv, gi);
  lt_tensor_release(dout);
  return st;
}

static const lt_node_ops attention_ops = {"AttentionBackward", attention_backward, NULL};

static lt_status strided_attention(const lt_tensor *q, const lt_tensor *k, const lt_tensor *v, double scale,
                                   int causal, int lutra, lt_tensor **res);

lt_status lt_attention(const lt_tensor *q, const lt_tensor *k, const lt_tensor *v, double scale, int causal,
                       lt_tensor **res) {
  LT_OP_SCOPE("attention");
  const char *op = "scaled_dot_product_attention";
  const lt_tensor *ins[3] = {q, k, v};
  const lt_backend_i *be;
  int half;
  LT_TRY(lt_op_attention_check(op, q, k, v, scale, &be));
  LT_TRY(lt_op_attention_route(op, be, q, k, &half));
  if (half)
    return strided_attention(q, k, v, scale, causal, 1, res); /* (16-bit operands where they are: tensor cores) */
  lt_dtype cd = lt_nn_compute_dtype(q->dtype);
  lt_tensor *qc = NULL, *kc = NULL, *vc = NULL, *o = NULL, *lse = NULL, *r = NULL;
  lt_status st = lt_nn_as_compute(q, cd, &qc);
  if (st == LT_OK)
    st = lt_nn_as_compute(k, cd, &kc);
  if (st == LT_OK)
    st = lt_nn_as_compute(v, cd, &vc);
  if (st == LT_OK)
    st = lt_op_attention_fwd(cd, qc, kc, vc, scale, causal, &o, &lse);
  if (st == LT_OK) {
    lt_tensor_retain(o);
    st = lt_nn_to_dtype(o, q->dtype, &r);
  }
  if (st == LT_OK && lt_ag_needed(3, ins)) {
    lt_node *n;
    st = lt_ag_node_new(&attention_ops, 3, ins, &n);
    if (st == LT_OK) {
      int64_t dims[6] = {q->sizes[0], q->sizes[1], k->sizes[1], q->sizes[2], k->sizes[2], q->sizes[3]};
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
  LT_RELEASE_ALL(qc, kc, vc, o, lse);
  if (st != LT_OK) {
    lt_tensor_release(r);
    return st;
  }
  *res = r;
  return LT_OK;
}

/* ---- attention on operands where they are: the library's, or lutra's 16-bit kernels ---- */

/* t itself (retained) when a library can read it, else a copy (a fresh
   contiguous tensor: aligned, also where t was contiguous at an odd offset). */
static lt_status library_operand(const lt_tensor *t, lt_tensor **out) {
  if (lt_op_sdpa_layout(t)) {
    lt_tensor_retain((lt_tensor *)t);
    *out = (lt_tensor *)t;
    return LT_OK;
  }
  lt_status st;
  LT_NO_GRAD(st = lt_tensor_clone(t, out));
  return st;
}

/* The library backward's stand-in: lutra's fused attention backward
   (kernels/attention_rows.h; its log-sum-exp is the library's stats) on
   compute-dtype copies, the results written into dq, dk, dv as laid out. */
static lt_status backward_by_rows(const lt_tensor *q, const lt_tensor *k, const lt_tensor *v, const lt_tensor *o,
                                  const lt_tensor *dout, const lt_tensor *stats, double scale, int causal,
                                  lt_tensor *dq, lt_tensor *dk, lt_tensor *dv) {
  lt_dtype cd = lt_nn_compute_dtype(q->dtype);
  const lt_tensor *ins[5] = {q, k, v, o, dout};
  lt_tensor *c[5] = {NULL}, *g[3] = {NULL};
  lt_status st = LT_OK;
  for (int j = 0; j < 5 && st == LT_OK; j++)
    st = lt_nn_as_compute(ins[j], cd, &c[j]);
  if (st == LT_OK)
    st = lt_op_attention_bwd(c[0], c[1], c[2], c[3], c[4], stats, scale, causal, &g[0], &g[1], &g[2]);
  lt_tensor *outs[3] = {dq, dk, dv};
  for (int j = 0; j < 3 && st == LT_OK; j++)
    LT_NO_GRAD(st = lt_tensor_copy_(outs[j], g[j]));
  LT_RELEASE_ALL(c[0], c[1], c[2], c[3], c[4], g[0], g[1], g[2]);
  return st;
}

/* Saved: q, k, v (as the kernels read them), o, stats; i[0] causal, i[1] 1 for lutra's
   attention_half kernels, 0 for the library's; i[2] deterministic; f[0] scale. */
static lt_status sdpa_backward(lt_node *n, lt_tensor *const *go, lt_tensor **gi) {
  lt_tensor *q, *k, *v, *o, *stats;
  LT_TRY(lt_ag_saved(n, 0, &q));
  LT_TRY(lt_ag_saved(n, 1, &k));
  LT_TRY(lt_ag_saved(n, 2, &v));
  LT_TRY(lt_ag_saved(n, 3, &o));
  LT_TRY(lt_ag_saved(n, 4, &stats));
  lt_device dev = q->storage->device;
  double scale = n->f[0];
  int causal = (int)n->i[0], by_rows = 0;
  lt_tensor *g = NULL, *dout = NULL, *dq = NULL, *dk = NULL, *dv = NULL;
  lt_status st;
  /* dout in o's layout, the one the backward was prepared for */
  LT_NO_GRAD({
    st = lt_tensor_to(go[0], q->dtype, dev, &g);
    if (st == LT_OK && memcmp(g->strides, o->strides, sizeof o->strides[0] * 4) == 0 && lt_op_sdpa_layout(g)) {
      dout = g;
      g = NULL;
    }
    if (st == LT_OK && !dout &&
        (st = lt_op_sdpa_empty(q->sizes[0], q->sizes[1], q->sizes[2], q->sizes[3], q->dtype, dev, &dout)) == LT_OK)
      st = lt_tensor_copy_(dout, g);
  });
  if (st == LT_OK)
    st = lt_op_sdpa_bwd(q, k, v, o, stats, dout, scale, causal, (int)n->i[1], (int)n->i[2], &dq, &dk, &dv, &by_rows);
  if (by_rows) /* the library would not run its backward after all: lutra's row kernels */
    st = backward_by_rows(q, k, v, o, dout, stats, scale, causal, dq, dk, dv);
  st = give_qkv_grads(n, st, dq, dk, dv, gi);
  LT_RELEASE_ALL(g, dout);
  return st;
}

static const lt_node_ops sdpa_ops = {"LibraryAttentionBackward", sdpa_backward, NULL};
static const lt_node_ops half_attention_ops = {"AttentionBackward", sdpa_backward, NULL};

lt_status lt_attention_library(const lt_tensor *q, const lt_tensor *k, const lt_tensor *v, double scale, int causal,
                               lt_tensor **res) {
  LT_OP_SCOPE("scaled_dot_product_attention");
  return strided_attention(q, k, v, scale, causal, 0, res);
}

/* Attention on operands where they are (lt_op_sdpa_fwd): the vendor
   library's (lutra = 0: lt_attention_library) or lutra's attention_half
   kernels (lutra = 1: lt_attention's 16-bit path, which the caller checked
   the backend takes). o comes in the heads-interleaved layout, whose
   transpose back to (B, T, NH, HS) needs no copy. */
static lt_status strided_attention(const lt_tensor *q, const lt_tensor *k, const lt_tensor *v, double scale,
                                   int causal, int lutra, lt_tensor **res) {
  const char *op = "scaled_dot_product_attention";
  const lt_tensor *ins[3] = {q, k, v};
  const lt_backend_i *be;
  LT_TRY(lt_op_attention_check(op, q, k, v, scale, &be));
  /* (lutra: lt_attention checked that the backend takes the dtype and head size, and no dim is empty) */
  if (!lutra)
    LT_TRY(lt_op_sdpa_check(op, be, q, k, causal));
  lt_tensor *qc = NULL, *kc = NULL, *vc = NULL, *o = NULL, *stats = NULL;
  lt_status st = library_operand(q, &qc);
  if (st == LT_OK)
    st = library_operand(k, &kc);
  if (st == LT_OK)
    st = library_operand(v, &vc);
  int need_grad = lt_ag_needed(3, ins), deterministic = 0;
  if (st == LT_OK)
    st = lt_op_sdpa_fwd(be, qc, kc, vc, scale, causal, lutra, need_grad, &deterministic, &o, &stats);
  if (st == LT_OK && need_grad) {
    lt_node *n;
    st = lt_ag_node_new(lutra ? &half_attention_ops : &sdpa_ops, 3, ins, &n);
    if (st == LT_OK) {
      n->i[0] = causal != 0;
      n->i[1] = lutra;
      n->i[2] = deterministic;
      n->f[0] = scale;
      lt_tensor *save[5] = {qc, kc, vc, o, stats};
      for (int j = 0; j < 5 && st == LT_OK; j++)
        st = lt_ag_save(n, save[j]);
      if (st == LT_OK)
        st = lt_ag_attach(n, o, 0);
      lt_node_release(n);
    }
  }
  LT_RELEASE_ALL(qc, kc, vc, stats);
  if (st != LT_OK) {
    lt_tensor_release(o);
    return st;
  }
  *res = o;
  return LT_OK;
}
