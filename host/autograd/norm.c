/*
 * autograd/norm.c: lt_layer_norm, lt_rms_norm and lt_add_norm (the norm
 * with the residual add fused in), the differentiable entry points, with
 * their backward rule. Each checks its arguments (ops/norm.c), converts the
 * rows to the dtype the kernels read (f32 or f64, or bf16/f16 where the
 * backend has native_half_rows), runs the dispatch, records its node
 * (saving the norm's input as computed, the weight, mean and reciprocal
 * std) and returns results in the input's dtype; the statistics stay in
 * f32 (f64 for f64).
 */
#include "autograd/nn.h"

/* A norm node: inputs x, [res], [w], [b]; i[0] rms, i[1] has w, i[2] has b,
   i[3] fused (res given: the norm's input is h = x + res, output 1). Saved:
   the norm's input as computed (x or h, f32/f64 rows), [w], [mean], rstd. */
static lt_status norm_backward(lt_node *n, lt_tensor *const *go, lt_tensor **gi) {
  int rms = (int)n->i[0], has_w = (int)n->i[1], has_b = (int)n->i[2], fused = (int)n->i[3];
  int ix = 0, ir = fused ? 1 : -1, iw = has_w ? 1 + fused : -1, ib = has_b ? 2 + fused : -1;
  lt_tensor *x, *w = NULL, *mean = NULL, *rstd;
  LT_TRY(lt_ag_saved(n, 0, &x));
  int k = 1;
  if (has_w)
    LT_TRY(lt_ag_saved(n, k++, &w));
  if (!rms)
    LT_TRY(lt_ag_saved(n, k++, &mean));
  LT_TRY(lt_ag_saved(n, k, &rstd));
  lt_dtype cd = x->dtype;
  /* (h's own retained gradient is the total one too: the part through y included) */
  int need_dx = n->next[ix].node || (fused && (n->next[ir].node || n->retain[1]));
  lt_tensor *dy = NULL, *dadd = NULL, *dx = NULL, *dw = NULL, *db = NULL;
  lt_status st = LT_OK;
  if (go[0])
    st = lt_nn_as_compute(go[0], cd, &dy);
  if (st == LT_OK && fused && go[1])
    st = lt_nn_as_compute(go[1], cd, &dadd);
  if (st == LT_OK && !dy) { /* only h is used: its gradient is x's and res's */
    dx = dadd;
    dadd = NULL;
  } else if (st == LT_OK) {
    st = lt_op_norm_bwd(rms, dy, x, w, mean, rstd, dadd, need_dx, has_w && n->next[iw].node,
                        has_b && n->next[ib].node, &dx, &dw, &db);
  }
  LT_RELEASE_ALL(dy, dadd);
  if (!need_dx) {
    lt_tensor_release(dx);
    dx = NULL;
  }
  /* each gradient in its input's dtype and shape; x and res share dx */
  int slots[3] = {ix, iw, ib};
  lt_tensor *outs[3] = {dx, dw, db}, *conv[3] = {NULL, NULL, NULL};
  for (int j = 0; j < 3; j++) {
    if (st == LT_OK && outs[j]) {
      lt_tensor *r = NULL;
      st = lt_nn_to_dtype(outs[j], n->in[slots[j]].dtype, &r);
      outs[j] = NULL;
      if (st == LT_OK) {
        st = lt_tensor_reshape(r, n->in[slots[j]].ndim, n->in[slots[j]].sizes, &conv[j]);
        lt_tensor_release(r);
      }
    }
    lt_tensor_release(outs[j]);
  }
  if (st == LT_OK && conv[0] && fused && n->retain[1]) { /* h.grad after retain_grad: dL/dh, all of it */
    lt_tensor *c = NULL;
    st = lt_tensor_clone(conv[0], &c);
    if (st == LT_OK) {
      lt_autograd_meta *m = lt_meta(n->retain[1]);
      lt_tensor_release(m->grad);
      m->grad = c;
    }
  }
  if (st == LT_OK) {
    if (conv[0] && fused && n->next[ir].node) {
      lt_tensor_retain(conv[0]);
      gi[ir] = conv[0];
    }
    if (conv[0] && n->next[ix].node) {
      gi[ix] = conv[0];
      conv[0] = NULL;
    }
    if (iw >= 0) {
      gi[iw] = conv[1];
      conv[1] = NULL;
    }
    if (ib >= 0) {
      gi[ib] = conv[2];
      conv[2] = NULL;
    }
  }
  LT_RELEASE_ALL(conv[0], conv[1], conv[2]);
  return st;
}

static const lt_node_ops layer_norm_ops = {"LayerNormBackward", norm_backward, NULL};
static const lt_node_ops rms_norm_ops = {"RMSNormBackward", norm_backward, NULL};
static const lt_node_ops add_layer_norm_ops = {"AddLayerNormBackward", norm_backward, NULL};
static const lt_node_ops add_rms_norm_ops = {"AddRMSNormBackward", norm_backward, NULL};

/* h = x + res as stored in x's dtype (16-bit rows computed in f32 round h
   before the norm reads it, as the native 16-bit kernels do, and torch's x
   + res, then the norm), as rows of cd. */
static lt_status rounded_sum(const lt_tensor *xc, const lt_tensor *rc, lt_dtype d, lt_dtype cd, lt_tensor **out) {
  lt_status st;
  lt_tensor *sum = NULL, *h16 = NULL;
  LT_NO_GRAD({
    st = lt_binary(LT_BINARY_ADD, xc, rc, NULL, &sum);
    if (st == LT_OK)
      st = lt_tensor_to(sum, d, xc->storage->device, &h16);
    if (st == LT_OK)
      st = lt_nn_as_compute(h16, cd, out);
  });
  LT_RELEASE_ALL(sum, h16);
  return st;
}

static lt_status norm(int rms, const lt_tensor *x, const lt_tensor *res, const lt_tensor *w, const lt_tensor *b,
                      double eps, lt_tensor **out_y, lt_tensor **out_h) {
  const char *op = res ? (rms ? "add_rms_norm" : "add_layer_norm") : (rms ? "rms_norm" : "layer_norm");
  const lt_tensor *ins[4];
  int nin = 0;
  ins[nin++] = x;
  if (res)
    ins[nin++] = res;
  if (w)
    ins[nin++] = w;
  if (b)
    ins[nin++] = b;
  LT_OP_SCOPE(op);
  const lt_backend_i *be;
  lt_dtype cd;
  LT_TRY(lt_op_norm_check(op, rms, x, res, w, b, eps, &be, &cd));
  lt_tensor *xc = NULL, *rc = NULL, *hc = NULL, *wc = NULL, *bc = NULL, *y = NULL, *mean = NULL, *rstd = NULL;
  lt_tensor *ry = NULL, *rh = NULL;
  lt_status st = lt_nn_as_compute(x, cd, &xc);
  if (st == LT_OK && res)
    st = lt_nn_as_compute(res, cd, &rc);
  /* 16-bit rows computed in f32: the kernel normalises h rounded to x's dtype */
  int round_h = res && cd != x->dtype && (x->dtype == LT_DTYPE_BF16 || x->dtype == LT_DTYPE_F16);
  if (st == LT_OK && w)
    st = lt_nn_as_compute(w, cd, &wc);
  if (st == LT_OK && b)
    st = lt_nn_as_compute(b, cd, &bc);
  if (st == LT_OK && round_h) {
    st = rounded_sum(xc, rc, x->dtype, cd, &hc);
    if (st == LT_OK)
      st = lt_op_norm_fwd(rms, cd, hc, NULL, wc, bc, eps, NULL, &y, &mean, &rstd);
  } else if (st == LT_OK) {
    st = lt_op_norm_fwd(rms, cd, xc, rc, wc, bc, eps, &hc, &y, &mean, &rstd);
  }
  if (st == LT_OK) {
    lt_tensor_retain(y);
    st = lt_nn_to_dtype(y, x->dtype, &ry);
  }
  if (st == LT_OK && hc) {
    lt_tensor_retain(hc);
    st = lt_nn_to_dtype(hc, x->dtype, &rh);
  }
  if (st == LT_OK && lt_ag_needed(nin, ins)) {
    lt_node *n;
    st = lt_ag_node_new(res ? (rms ? &add_rms_norm_ops : &add_layer_norm_ops) : (rms ? &rms_norm_ops : &layer_norm_ops),
                        nin, ins, &n);
    if (st == LT_OK) {
      n->i[0] = rms;
      n->i[1] = w != NULL;
      n->i[2] = b != NULL;
      n->i[3] = res != NULL;
      st = lt_ag_save(n, hc ? hc : xc);
      if (st == LT_OK && w)
        st = lt_ag_save(n, wc);
      if (st == LT_OK && !rms)
        st = lt_ag_save(n, mean);
      if (st == LT_OK)
        st = lt_ag_save(n, rstd);
      if (st == LT_OK)
        st = lt_ag_attach(n, ry, 0);
      if (st == LT_OK && rh)
        st = lt_ag_attach(n, rh, 1);
      lt_node_release(n);
    }
  }
  LT_RELEASE_ALL(xc, rc, hc, wc, bc, y, mean, rstd);
  if (st != LT_OK) {
    lt_tensor_release(ry);
    lt_tensor_release(rh);
    return st;
  }
  *out_y = ry;
  if (out_h)
    *out_h = rh;
  return LT_OK;
}

lt_status lt_layer_norm(const lt_tensor *x, const lt_tensor *w, const lt_tensor *b, double eps, lt_tensor **y) {
  return norm(0, x, NULL, w, b, eps, y, NULL);
}

lt_status lt_rms_norm(const lt_tensor *x, const lt_tensor *w, double eps, lt_tensor **y) {
  return norm(1, x, NULL, w, NULL, eps, y, NULL);
}

lt_status lt_add_norm(int rms, const lt_tensor *x, const lt_tensor *res, const lt_tensor *w, const lt_tensor *b,
                      double eps, lt_tensor **h, lt_tensor **y) {
  if (!res)
    return lt_fail(LT_ERR_ARG, "%s: argument 2 is nil, expected the residual tensor",
                   rms ? "add_rms_norm" : "add_layer_norm");
  if (rms && b)
    return lt_fail(LT_ERR_ARG, "add_rms_norm: RMSNorm has no bias");
  return norm(rms, x, res, w, b, eps, y, h);
}
