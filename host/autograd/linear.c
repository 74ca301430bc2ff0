/*
 * autograd/linear.c: lt_linear (y = act(x w^T + b), torch.nn.functional
 * .linear with GELU optionally fused), lt_mlp (GPT-2's MLP as one op, y =
 * gelu(x w1^T + b1) w2^T + b2) and lt_linear_cross_entropy (a model's head
 * with its loss as one op), the differentiable entry points, with their
 * backward rules. Where the backend multiplies with epilogues (cuBLASLt on
 * CUDA) the bias add and the GELU run inside the product, which also writes
 * the pre-activation the backward needs (ops/linear.c); elsewhere, or when
 * the backend has no algorithm for the epilogue, the op is a product, an
 * add and a gelu. The backward of a layer: g = dy (or dy gelu'(pre)), dx =
 * g w, dw = g^T x, db = the sum of g over rows, db computed inside dw's
 * product where the backend can (BGRADB). The MLP's backward also moves the
 * GELU's gradient into the product that makes it (DGELU_BGRAD: g1 = (dy w2)
 * gelu'(pre) and db1 in one pass, as NVIDIA's Apex FusedDenseGeluDense
 * does), saving the pass over the hidden activations that two linear ops
 * need. The head with its loss, cross_entropy(x w^T, targets), has a
 * forward that writes the logits' gradient over the logits (llm.c's fused
 * classifier), so that no second (N, V) buffer exists and the backward
 * reads the logits' gradient, not the logits.
 */
#include "autograd/nn.h"

#include <string.h>

/* x as (M, in) rows: a view when its layout allows, else a contiguous copy */
static lt_status rows_of(const lt_tensor *x, lt_tensor **out) {
  int64_t in = x->sizes[x->ndim - 1], M = 1;
  for (int d = 0; d < x->ndim - 1; d++)
    M *= x->sizes[d];
  int64_t sizes[2] = {M, in};
  lt_status st;
  LT_NO_GRAD(st = lt_tensor_reshape((lt_tensor *)x, 2, sizes, out));
  return st;
}

/* The same as a product, an add and a gelu (no autograd). */
static lt_status composed_forward(const lt_tensor *x2, const lt_tensor *w, const lt_tensor *b, int act,
                                  lt_tensor **y, lt_tensor **pre) {
  lt_status st;
  lt_tensor *wt = NULL, *p = NULL, *r = NULL;
  LT_NO_GRAD({
    st = lt_tensor_transpose((lt_tensor *)w, 0, 1, &wt);
    if (st == LT_OK)
      st = lt_matmul(x2, wt, &p);
    if (st == LT_OK && b)
      st = lt_binary(LT_BINARY_ADD, p, b, p, &r); /* in place: p is ours */
    lt_tensor_release(r);
    r = NULL;
    if (st == LT_OK && act)
      st = lt_unary(LT_UNARY_GELU, p, NULL, &r);
  });
  lt_tensor_release(wt);
  if (st != LT_OK) {
    lt_tensor_release(p);
    lt_tensor_release(r);
    return st;
  }
  if (act) {
    *y = r;
    *pre = p;
  } else {
    *y = p;
    *pre = NULL;
  }
  return LT_OK;
}

/* One layer's forward on rows: y2 (M, out) = act(x2 w^T + b) and, with act,
   pre = x2 w^T + b; in one product with the epilogue where the backend has
   one (ops/linear.c), else composed. */
static lt_status forward_rows(const lt_backend_i *be, const lt_tensor *x2, const lt_tensor *w, const lt_tensor *b,
                              int act, lt_tensor **y2, lt_tensor **pre) {
  lt_status st = lt_op_linear_fused(be, x2, w, b, act, y2, pre);
  if (st != LT_ERR_UNSUPPORTED)
    return st;
  return composed_forward(x2, w, b, act, y2, pre);
}

/* A layer's weight and bias gradients from g (M, out), the gradient after
   its activation, and its input rows x2 (M, in): dw = g^T x2 (need_dw),
   db = g's column sums (need_db, unless *db holds them already); both in
   one product where the backend can. */
static lt_status weight_grads(const lt_tensor *g, const lt_tensor *x2, int need_dw, int need_db, lt_tensor **dw,
                              lt_tensor **db) {
  lt_status st = LT_OK;
  lt_tensor *t = NULL;
  LT_NO_GRAD({
    if (need_dw && need_db && !*db) {
      lt_status fst = lt_op_linear_weight_grad_fused(g, x2, dw, db);
      if (fst != LT_OK && fst != LT_ERR_UNSUPPORTED)
        st = fst;
    }
    if (st == LT_OK && need_dw && !*dw && (st = lt_tensor_transpose((lt_tensor *)g, 0, 1, &t)) == LT_OK)
      st = lt_matmul(t, x2, dw);
    if (st == LT_OK && need_db && !*db) {
      int64_t rows = 0;
      st = lt_reduce(LT_REDUCE_SUM, g, 1, &rows, 0, 0, db);
    }
  });
  lt_tensor_release(t);
  return st;
}

/* The gradient reaching a layer's input from g (M, out): dh = g w (M, in);
   with pre (the input's own pre-activation, when a GELU made it) the
   gradient before that GELU, (g w) gelu'(pre), and then, where the backend
   does it in the same product, db = its column sums (want_db; *db stays
   NULL otherwise). */
static lt_status input_grad(const lt_tensor *g, const lt_tensor *w, const lt_tensor *pre, int want_db,
                            lt_tensor **dh, lt_tensor **db) {
  lt_status st = LT_OK;
  if (pre) {
    st = lt_op_gelu_input_grad_fused(g, w, pre, want_db, dh, db);
    if (st != LT_ERR_UNSUPPORTED)
      return st;
  }
  lt_tensor *p = NULL;
  LT_NO_GRAD({
    st = lt_matmul(g, w, pre ? &p : dh);
    if (st == LT_OK && pre)
      st = lt_binary(LT_BINARY_GELU_GRAD, pre, p, NULL, dh);
  });
  lt_tensor_release(p);
  return st;
}

/* The gradient of a node's output as rows (M, out) in the dtype of `like`;
   with unit-stride rows where the backend multiplies with epilogues (a
   sum's gradient is expanded: one copy of g beats composing the epilogues). */
static lt_status grad_rows(lt_tensor *go, int64_t M, int64_t out, const lt_tensor *like, lt_tensor **g) {
  int64_t sizes[2] = {M, out};
  lt_status st;
  LT_NO_GRAD({
    st = lt_tensor_reshape(go, 2, sizes, g);
    lt_tensor *c = NULL;
    if (st == LT_OK && (*g)->dtype != like->dtype)
      st = lt_tensor_to(*g, like->dtype, like->storage->device, &c);
    else if (st == LT_OK && like->storage->backend->matmul_epilogues && !lt_nn_unit_rows(*g))
      st = lt_tensor_contiguous(*g, &c);
    if (c) {
      lt_tensor_release(*g);
      *g = c;
    }
  });
  return st;
}

/* dx = rows (M, in) viewed as the node's input 0 */
static lt_status as_input(const lt_node *n, lt_tensor *rows, lt_tensor **dx) {
  lt_status st;
  LT_NO_GRAD(st = lt_tensor_reshape(rows, n->in[0].ndim, n->in[0].sizes, dx));
  return st;
}

/* i[0] act, i[1] has bias; saved: x2 (M, in), w, [pre]. */
static lt_status linear_backward(lt_node *n, lt_tensor *const *go, lt_tensor **gi) {
  int act = (int)n->i[0], has_b = (int)n->i[1];
  lt_tensor *x2, *w, *pre = NULL;
  LT_TRY(lt_ag_saved(n, 0, &x2));
  LT_TRY(lt_ag_saved(n, 1, &w));
  if (act)
    LT_TRY(lt_ag_saved(n, 2, &pre));
  lt_tensor *g = NULL, *gg = NULL, *d2 = NULL, *dx = NULL, *dw = NULL, *db = NULL;
  lt_status st = grad_rows(go[0], x2->sizes[0], w->sizes[0], x2, &g);
  if (st == LT_OK && act) { /* through the GELU: g gelu'(pre) */
    LT_NO_GRAD(st = lt_binary(LT_BINARY_GELU_GRAD, pre, g, NULL, &gg));
    lt_tensor_release(g);
    g = gg;
  }
  if (st == LT_OK && n->next[0].node && (st = input_grad(g, w, NULL, 0, &d2, NULL)) == LT_OK)
    st = as_input(n, d2, &dx);
  if (st == LT_OK)
    st = weight_grads(g, x2, n->next[1].node != NULL, has_b && n->next[2].node, &dw, &db);
  lt_tensor_release(g);
  lt_tensor_release(d2);
  if (st != LT_OK) {
    lt_tensor_release(dx);
    lt_tensor_release(dw);
    lt_tensor_release(db);
    return st;
  }
  gi[0] = dx;
  gi[1] = dw;
  if (has_b)
    gi[2] = db;
  return LT_OK;
}

static const lt_node_ops linear_ops = {"LinearBackward", linear_backward, NULL};
static const lt_node_ops linear_gelu_ops = {"LinearGeluBackward", linear_backward, NULL};

/* y2 (M, out) rows back as x's leading dims */
static lt_status as_output(const lt_tensor *x, lt_tensor *y2, lt_tensor **y) {
  int64_t sizes[LT_MAX_DIMS];
  memcpy(sizes, x->sizes, sizeof(int64_t) * (size_t)x->ndim);
  sizes[x->ndim - 1] = y2->sizes[1];
  lt_status st;
  LT_NO_GRAD(st = lt_tensor_view(y2, x->ndim, sizes, y));
  return st;
}

lt_status lt_linear(const lt_tensor *x, const lt_tensor *w, const lt_tensor *b, int act, lt_tensor **res) {
  const char *op = "linear";
  const lt_tensor *ins[3] = {x, w, b};
  int nin = b ? 3 : 2;
  const lt_backend_i *be;
  LT_OP_SCOPE(op);
  LT_TRY(lt_op_linear_check(op, x, w, b, act, &be));
  lt_tensor *x2 = NULL, *y2 = NULL, *pre = NULL, *y = NULL;
  lt_status st = rows_of(x, &x2);
  if (st == LT_OK)
    st = forward_rows(be, x2, w, b, act, &y2, &pre);
  if (st == LT_OK)
    st = as_output(x, y2, &y);
  if (st == LT_OK && lt_ag_needed(nin, ins)) {
    lt_node *n;
    st = lt_ag_node_new(act ? &linear_gelu_ops : &linear_ops, nin, ins, &n);
    if (st == LT_OK) {
      n->i[0] = act;
      n->i[1] = b != NULL;
      st = lt_ag_save(n, x2);
      if (st == LT_OK)
        st = lt_ag_save(n, w);
      if (st == LT_OK && act)
        st = lt_ag_save(n, pre);
      if (st == LT_OK)
        st = lt_ag_attach(n, y, 0);
      lt_node_release(n);
    }
  }
  lt_tensor_release(x2);
  lt_tensor_release(y2);
  lt_tensor_release(pre);
  if (st != LT_OK) {
    lt_tensor_release(y);
    return st;
  }
  *res = y;
  return LT_OK;
}

/* i[0] has b1, i[1] has b2; inputs x, w1, [b1], w2, [b2]; saved: x2 (M,
   in), w1, pre (M, hidden), h = gelu(pre), w2. */
static lt_status mlp_backward(lt_node *n, lt_tensor *const *go, lt_tensor **gi) {
  int has_b1 = (int)n->i[0], has_b2 = (int)n->i[1], iw2 = 2 + has_b1;
  lt_tensor *x2, *w1, *pre, *h, *w2;
  LT_TRY(lt_ag_saved(n, 0, &x2));
  LT_TRY(lt_ag_saved(n, 1, &w1));
  LT_TRY(lt_ag_saved(n, 2, &pre));
  LT_TRY(lt_ag_saved(n, 3, &h));
  LT_TRY(lt_ag_saved(n, 4, &w2));
  int need_x = n->next[0].node != NULL, need_w1 = n->next[1].node != NULL;
  int need_b1 = has_b1 && n->next[2].node, need_w2 = n->next[iw2].node != NULL;
  int need_b2 = has_b2 && n->next[iw2 + 1].node;
  lt_tensor *g2 = NULL, *g1 = NULL, *d2 = NULL, *dx = NULL, *dw1 = NULL, *db1 = NULL, *dw2 = NULL, *db2 = NULL;
  lt_status st = grad_rows(go[0], x2->sizes[0], w2->sizes[0], x2, &g2);
  if (st == LT_OK) /* the output layer: dw2 = g2^T h, db2 */
    st = weight_grads(g2, h, need_w2, need_b2, &dw2, &db2);
  if (st == LT_OK && (need_x || need_w1 || need_b1)) /* g1 = (g2 w2) gelu'(pre), with db1 where it can */
    st = input_grad(g2, w2, pre, need_b1, &g1, &db1);
  lt_tensor_release(g2);
  if (st == LT_OK && g1)
    st = weight_grads(g1, x2, need_w1, need_b1, &dw1, &db1);
  if (st == LT_OK && need_x && (st = input_grad(g1, w1, NULL, 0, &d2, NULL)) == LT_OK)
    st = as_input(n, d2, &dx);
  lt_tensor_release(g1);
  lt_tensor_release(d2);
  if (st != LT_OK) {
    lt_tensor *made[5] = {dx, dw1, db1, dw2, db2};
    for (int j = 0; j < 5; j++)
      lt_tensor_release(made[j]);
    return st;
  }
  gi[0] = dx;
  gi[1] = dw1;
  if (has_b1)
    gi[2] = db1;
  gi[iw2] = dw2;
  if (has_b2)
    gi[iw2 + 1] = db2;
  return LT_OK;
}

static const lt_node_ops mlp_ops = {"MlpBackward", mlp_backward, NULL};

lt_status lt_mlp(const lt_tensor *x, const lt_tensor *w1, const lt_tensor *b1, const lt_tensor *w2,
                 const lt_tensor *b2, lt_tensor **res) {
  const char *op = "mlp";
  const lt_tensor *ins[5];
  int nin = 0;
  ins[nin++] = x;
  ins[nin++] = w1;
  if (b1)
    ins[nin++] = b1;
  ins[nin++] = w2;
  if (b2)
    ins[nin++] = b2;
  const lt_backend_i *be;
  LT_OP_SCOPE(op);
  LT_TRY(lt_op_mlp_check(op, x, w1, b1, w2, b2, &be));
  lt_tensor *x2 = NULL, *pre = NULL, *h = NULL, *y2 = NULL, *none = NULL, *y = NULL;
  lt_status st = rows_of(x, &x2);
  if (st == LT_OK)
    st = forward_rows(be, x2, w1, b1, 1, &h, &pre);
  if (st == LT_OK)
    st = forward_rows(be, h, w2, b2, 0, &y2, &none);
  if (st == LT_OK)
    st = as_output(x, y2, &y);
  if (st == LT_OK && lt_ag_needed(nin, ins)) {
    lt_node *n;
    st = lt_ag_node_new(&mlp_ops, nin, ins, &n);
    if (st == LT_OK) {
      n->i[0] = b1 != NULL;
      n->i[1] = b2 != NULL;
      const lt_tensor *keep[5] = {x2, w1, pre, h, w2};
      for (int j = 0; j < 5 && st == LT_OK; j++)
        st = lt_ag_save(n, keep[j]);
      if (st == LT_OK)
        st = lt_ag_attach(n, y, 0);
      lt_node_release(n);
    }
  }
  lt_tensor_release(x2);
  lt_tensor_release(pre);
  lt_tensor_release(h);
  lt_tensor_release(y2);
  if (st != LT_OK) {
    lt_tensor_release(y);
    return st;
  }
  *res = y;
  return LT_OK;
}

/* ---- the head and its loss as one op ------------------------------------------ */

/* d(loss)/d(x) and d(loss)/d(w) from g, the gradient of the summed row
   losses with respect to the logits: the products g w and g^T x2, then
   scaled by the loss's gradient go (0-dim) and, for the mean, 1 / count
   (so the scale passes over (N, C) and (V, C), not the logits, and g keeps
   its size in a 16-bit dtype). i[0] reduction, i[1] 1 / count saved (on the
   device), f[0] the count otherwise; saved: x2 (N, C), w (V, C), g (N, V),
   [1 / count]. */
static lt_status lce_backward(lt_node *n, lt_tensor *const *go, lt_tensor **gi) {
  lt_tensor *x2, *w, *g, *inv = NULL;
  LT_TRY(lt_ag_saved(n, 0, &x2));
  LT_TRY(lt_ag_saved(n, 1, &w));
  LT_TRY(lt_ag_saved(n, 2, &g));
  if (n->i[1])
    LT_TRY(lt_ag_saved(n, 3, &inv));
  lt_tensor *scale = NULL, *d2 = NULL, *s2 = NULL, *dx = NULL, *dw1 = NULL, *dw = NULL;
  lt_status st;
  LT_NO_GRAD({
    if (n->i[0] != 0) { /* sum */
      lt_tensor_retain(go[0]);
      scale = go[0];
      st = LT_OK;
    } else if (inv) {
      st = lt_binary(LT_BINARY_MUL, go[0], inv, NULL, &scale);
    } else {
      st = lt_binary_scalar(LT_BINARY_MUL, go[0], n->f[0] > 0 ? 1.0 / n->f[0] : 0.0, 0, NULL, &scale);
    }
  });
  if (st == LT_OK && n->next[0].node && (st = input_grad(g, w, NULL, 0, &d2, NULL)) == LT_OK) {
    LT_NO_GRAD(st = lt_binary(LT_BINARY_MUL, d2, scale, NULL, &s2));
    if (st == LT_OK)
      st = as_input(n, s2, &dx);
  }
  if (st == LT_OK && n->next[1].node && (st = weight_grads(g, x2, 1, 0, &dw1, NULL)) == LT_OK)
    LT_NO_GRAD(st = lt_binary(LT_BINARY_MUL, dw1, scale, NULL, &dw));
  lt_tensor_release(scale);
  lt_tensor_release(d2);
  lt_tensor_release(s2);
  lt_tensor_release(dw1);
  if (st != LT_OK) {
    lt_tensor_release(dx);
    lt_tensor_release(dw);
    return st;
  }
  gi[0] = dx;
  gi[1] = dw;
  return LT_OK;
}

static const lt_node_ops lce_ops = {"LinearCrossEntropyBackward", lce_backward, NULL};

lt_status lt_linear_cross_entropy(const lt_tensor *x, const lt_tensor *w, const lt_tensor *targets,
                                  int64_t ignore_index, int reduction, int64_t classes, lt_tensor **loss,
                                  int64_t *count) {
  const char *op = "linear_cross_entropy";
  const lt_tensor *ins[3] = {x, w, targets};
  const lt_backend_i *be;
  int64_t N;
  LT_OP_SCOPE(op);
  LT_TRY(lt_op_linear_ce_check(op, x, w, targets, reduction, classes, &be, &N));
  int grad = lt_ag_needed(2, ins);
  lt_tensor *x2 = NULL, *t1 = NULL, *logits = NULL, *none = NULL, *g = NULL;
  lt_ce_forward c;
  memset(&c, 0, sizeof c);
  lt_status st = rows_of(x, &x2);
  if (st == LT_OK)
    LT_NO_GRAD(st = lt_tensor_reshape((lt_tensor *)targets, 1, &N, &t1));
  if (st == LT_OK) /* the logits (N, V): scratch that ends holding their gradient */
    LT_NO_GRAD(st = forward_rows(be, x2, w, NULL, 0, &logits, &none));
  if (st == LT_OK)
    st = lt_ce_forward_run(op, logits, t1, ignore_index, reduction, classes, count != NULL, grad, &c);
  lt_tensor_release(logits);
  lt_tensor_release(none);
  if (st == LT_OK && grad) /* (in x's dtype, as the products take it) */
    LT_NO_GRAD(st = lt_tensor_to(c.xc, x->dtype, x->storage->device, &g));
  if (st == LT_OK && grad) {
    lt_node *n;
    st = lt_ag_node_new(&lce_ops, 2, ins, &n);
    if (st == LT_OK) {
      n->i[0] = reduction;
      n->i[1] = c.inv != NULL;
      n->f[0] = (double)c.counted;
      st = lt_ag_save(n, x2);
      if (st == LT_OK)
        st = lt_ag_save(n, w);
      if (st == LT_OK)
        st = lt_ag_save(n, g);
      if (st == LT_OK && c.inv)
        st = lt_ag_save(n, c.inv);
      if (st == LT_OK)
        st = lt_ag_attach(n, c.loss, 0);
      lt_node_release(n);
    }
  }
  lt_tensor_release(x2);
  lt_tensor_release(t1);
  lt_tensor_release(g);
  if (st == LT_OK) {
    *loss = c.loss;
    c.loss = NULL;
    if (count)
      *count = c.counted;
  }
  lt_ce_forward_release(&c);
  return st;
}
