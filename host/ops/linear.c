/*
 * linear.c: the linear layer as one op, y = act(x w^T + b) (torch.nn.functional
 * .linear, with GELU optionally fused), and GPT-2's MLP as one op, y =
 * gelu(x w1^T + b1) w2^T + b2, forward and backward. Where the backend
 * multiplies with epilogues (cuBLASLt on CUDA) the bias add and the GELU run
 * inside the product, which also writes the pre-activation the backward
 * needs; elsewhere, or when the backend has no algorithm for the epilogue,
 * the op is a product, an add and a gelu. The backward of a layer: g = dy
 * (or dy gelu'(pre)), dx = g w, dw = g^T x, db = the sum of g over rows, db
 * computed inside dw's product where the backend can (BGRADB). The MLP's
 * backward also moves the GELU's gradient into the product that makes it
 * (DGELU_BGRAD: g1 = (dy w2) gelu'(pre) and db1 in one pass, as NVIDIA's
 * Apex FusedDenseGeluDense does), saving the pass over the hidden
 * activations that two linear ops need. And a model's head with its loss as
 * one op, cross_entropy(x w^T, targets), whose forward writes the logits'
 * gradient over the logits (llm.c's fused classifier), so that no second
 * (N, V) buffer exists and the backward reads the logits' gradient, not the
 * logits.
 */
#include "autograd/autograd.h"
#include "core/iter.h"
#include "autograd/nn.h"

#include <stdio.h>
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

/* Whether an (R, C) matrix has unit-stride rows that do not overlap: what
   cuBLASLt's epilogues are given here. */
static int unit_rows(const lt_tensor *t) {
  return t->strides[1] == 1 && (t->sizes[0] <= 1 || t->strides[0] >= t->sizes[1]);
}

/* Says once per process (per `noted`) that an epilogue was refused and
   what runs instead. */
static void note_composed(int *noted, const char *op, const char *what) {
  if (!__atomic_exchange_n(noted, 1, __ATOMIC_RELAXED))
    fprintf(stderr, "lutra: %s: %s; running it as %s (noted once)\n", op, lt_last_error(), what);
}

/* One product with the epilogue: c (M, out) = act(x2 w^T + b), aux = the
   pre-activation (GELU only). LT_ERR_UNSUPPORTED when the backend has no
   algorithm for it (the caller composes). */
static lt_status fused_forward(const lt_backend_i *be, const lt_tensor *x2, const lt_tensor *w, const lt_tensor *b,
                               int act, lt_tensor *c, lt_tensor *aux) {
  lt_matmul_desc d;
  memset(&d, 0, sizeof d);
  d.m = x2->sizes[0], d.k = x2->sizes[1], d.n = w->sizes[0];
  d.a = lt_tensor_ptr(x2), d.a_rs = x2->strides[0], d.a_cs = x2->strides[1];
  d.b = lt_tensor_ptr(w), d.b_rs = w->strides[1], d.b_cs = w->strides[0]; /* w^T: (in, out) */
  d.c = lt_tensor_ptr(c), d.c_rs = c->strides[0];
  d.dtype = x2->dtype;
  d.epilogue = act ? (b ? LT_EPILOGUE_GELU_BIAS : LT_EPILOGUE_GELU) : LT_EPILOGUE_BIAS;
  d.bias = b ? lt_tensor_ptr(b) : NULL;
  d.aux = aux ? lt_tensor_ptr(aux) : NULL;
  d.aux_rs = aux ? aux->strides[0] : 0;
  return be->matmul(&d);
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
   one, else composed (said once). */
static lt_status forward_rows(const lt_backend_i *be, const lt_tensor *x2, const lt_tensor *w, const lt_tensor *b,
                              int act, lt_tensor **y2, lt_tensor **pre) {
  static int noted;
  int64_t M = x2->sizes[0], in = w->sizes[1], out = w->sizes[0], ysizes[2] = {M, out};
  *y2 = *pre = NULL;
  if (be->matmul_epilogues && (b || act) && M > 0 && in > 0 && out > 0 && unit_rows(x2) && unit_rows(w) &&
      (!b || b->strides[0] == 1 || out <= 1)) {
    lt_status st = lt_tensor_empty(2, ysizes, x2->dtype, x2->storage->device, y2);
    if (st == LT_OK && act)
      st = lt_tensor_empty(2, ysizes, x2->dtype, x2->storage->device, pre);
    if (st == LT_OK)
      st = fused_forward(be, x2, w, b, act, *y2, *pre);
    if (st == LT_OK)
      return LT_OK;
    lt_tensor_release(*y2);
    lt_tensor_release(*pre);
    *y2 = *pre = NULL;
    if (st != LT_ERR_UNSUPPORTED)
      return st;
    note_composed(&noted, "linear", act ? "matmul, add, gelu" : "matmul, add");
  }
  return composed_forward(x2, w, b, act, y2, pre);
}

/* dw = g^T x2 with db = the column sums of g in the same product (cuBLASLt's
   BGRADB epilogue); LT_ERR_UNSUPPORTED when the backend cannot (the caller
   multiplies and reduces). g (M, out) and x2 (M, in) have unit-stride rows. */
static lt_status fused_weight_grad(const lt_backend_i *be, const lt_tensor *g, const lt_tensor *x2, lt_tensor **dw,
                                   lt_tensor **db) {
  int64_t M = g->sizes[0], out = g->sizes[1], in = x2->sizes[1], wsizes[2] = {out, in};
  if (!be->matmul_epilogues || M == 0 || out == 0 || in == 0 || !unit_rows(g) || !unit_rows(x2))
    return LT_ERR_UNSUPPORTED;
  LT_TRY(lt_tensor_empty(2, wsizes, g->dtype, g->storage->device, dw));
  lt_status st = lt_tensor_empty(1, &out, g->dtype, g->storage->device, db);
  if (st == LT_OK) {
    lt_matmul_desc d;
    memset(&d, 0, sizeof d);
    d.m = out, d.k = M, d.n = in;
    d.a = lt_tensor_ptr(g), d.a_rs = 1, d.a_cs = g->strides[0]; /* g^T */
    d.b = lt_tensor_ptr(x2), d.b_rs = x2->strides[0], d.b_cs = 1;
    d.c = lt_tensor_ptr(*dw), d.c_rs = in;
    d.dtype = g->dtype;
    d.epilogue = LT_EPILOGUE_BGRAD_A;
    d.bias = lt_tensor_ptr(*db);
    st = be->matmul(&d);
  }
  if (st != LT_OK) {
    lt_tensor_release(*dw);
    lt_tensor_release(*db);
    *dw = *db = NULL;
  }
  return st;
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
      lt_status fst = fused_weight_grad(g->storage->backend, g, x2, dw, db);
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

/* dh = (g w) gelu'(pre) in one product, with db = dh's column sums when
   asked (cuBLASLt's DGELU / DGELU_BGRAD epilogues); LT_ERR_UNSUPPORTED when
   the backend refuses. g (M, out), w (out, in), pre (M, in), all with
   unit-stride rows, none empty. */
static lt_status fused_gelu_input_grad(const lt_backend_i *be, const lt_tensor *g, const lt_tensor *w,
                                       const lt_tensor *pre, int want_db, lt_tensor **dh, lt_tensor **db) {
  int64_t M = g->sizes[0], out = g->sizes[1], in = w->sizes[1], sizes[2] = {M, in};
  LT_TRY(lt_tensor_empty(2, sizes, g->dtype, g->storage->device, dh));
  lt_status st = want_db ? lt_tensor_empty(1, &in, g->dtype, g->storage->device, db) : LT_OK;
  if (st == LT_OK) {
    lt_matmul_desc d;
    memset(&d, 0, sizeof d);
    d.m = M, d.k = out, d.n = in;
    d.a = lt_tensor_ptr(g), d.a_rs = g->strides[0], d.a_cs = 1;
    d.b = lt_tensor_ptr(w), d.b_rs = w->strides[0], d.b_cs = 1;
    d.c = lt_tensor_ptr(*dh), d.c_rs = in;
    d.dtype = g->dtype;
    d.epilogue = want_db ? LT_EPILOGUE_DGELU_BGRAD : LT_EPILOGUE_DGELU;
    d.bias = want_db ? lt_tensor_ptr(*db) : NULL;
    d.aux = (char *)lt_tensor_ptr(pre), d.aux_rs = pre->strides[0]; /* (read only) */
    st = be->matmul(&d);
  }
  if (st != LT_OK) {
    lt_tensor_release(*dh);
    *dh = NULL;
    if (want_db) {
      lt_tensor_release(*db);
      *db = NULL;
    }
  }
  return st;
}

/* The gradient reaching a layer's input from g (M, out): dh = g w (M, in);
   with pre (the input's own pre-activation, when a GELU made it) the
   gradient before that GELU, (g w) gelu'(pre), and then, where the backend
   does it in the same product, db = its column sums (want_db; *db stays
   NULL otherwise). */
static lt_status input_grad(const lt_tensor *g, const lt_tensor *w, const lt_tensor *pre, int want_db,
                            lt_tensor **dh, lt_tensor **db) {
  static int noted;
  lt_status st = LT_OK;
  const lt_backend_i *be = g->storage->backend;
  if (pre && be->matmul_epilogues && g->sizes[0] > 0 && g->sizes[1] > 0 && w->sizes[1] > 0 && unit_rows(g) &&
      unit_rows(w) && unit_rows(pre)) {
    st = fused_gelu_input_grad(be, g, w, pre, want_db, dh, db);
    if (st != LT_ERR_UNSUPPORTED)
      return st;
    note_composed(&noted, "mlp backward", "matmul, gelu_grad");
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
    else if (st == LT_OK && like->storage->backend->matmul_epilogues && !unit_rows(*g))
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

/* A layer's weight (out, in) taking `in` features, and its bias (out). `which`
   names the layer ("" or "projection "), `from` what gives `in`. */
static lt_status check_layer(const char *op, const char *which, const char *from, const lt_tensor *src, int64_t in,
                             const lt_tensor *w, const lt_tensor *b) {
  char b1[200], b2[200];
  if (w->ndim != 2)
    return lt_fail(LT_ERR_SHAPE, "%s: %sweight %s must be 2-D (out, in)", op, which, lt_tensor_shape_str(w, b1));
  if (w->sizes[1] != in)
    return lt_fail(LT_ERR_SHAPE, "%s: %s %s does not fit %sweight %s (out, in): its in must be %lld", op, from,
                   lt_tensor_shape_str(src, b1), which, lt_tensor_shape_str(w, b2), (long long)in);
  if (b && (b->ndim != 1 || b->sizes[0] != w->sizes[0]))
    return lt_fail(LT_ERR_SHAPE, "%s: %sbias %s must be (%lld)", op, which, lt_tensor_shape_str(b, b1),
                   (long long)w->sizes[0]);
  return LT_OK;
}

/* Every input of one float dtype (x's); names[j] says what ins[j] is. */
static lt_status check_dtypes(const char *op, int n, const lt_tensor *const *ins, const char *const *names) {
  if (!lt_dtype_is_float(ins[0]->dtype))
    return lt_fail(LT_ERR_DTYPE, "%s: the %s must be a float tensor, got %s", op, names[0],
                   lt_dtype_name(ins[0]->dtype));
  for (int j = 1; j < n; j++)
    if (!lt_dtype_is_float(ins[j]->dtype) || ins[j]->dtype != ins[0]->dtype)
      return lt_fail(LT_ERR_DTYPE, "%s: the input and the weights and biases must share one float dtype; the input is "
                     "%s, the %s %s", op, lt_dtype_name(ins[0]->dtype), names[j], lt_dtype_name(ins[j]->dtype));
  return LT_OK;
}

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
  static const char *const names[3] = {"input", "weight", "bias"};
  int nin = b ? 3 : 2;
  const lt_backend_i *be;
  LT_OP_SCOPE(op);
  LT_TRY(lt_same_device_named(op, nin, ins, names, &be));
  if (act != 0 && act != 1)
    return lt_fail(LT_ERR_ARG, "%s: activation %d is not 0 (none) or 1 (gelu)", op, act);
  LT_TRY(check_dtypes(op, nin, ins, names));
  if (x->ndim < 1)
    return lt_fail(LT_ERR_SHAPE, "%s: the input is a scalar; it needs a last dim of in features", op);
  LT_TRY(check_layer(op, "", "input", x, x->sizes[x->ndim - 1], w, b));
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
  const char *names[5];
  int nin = 0;
  names[nin] = "input", ins[nin++] = x;
  names[nin] = "first weight", ins[nin++] = w1;
  if (b1)
    names[nin] = "first bias", ins[nin++] = b1;
  names[nin] = "projection weight", ins[nin++] = w2;
  if (b2)
    names[nin] = "projection bias", ins[nin++] = b2;
  const lt_backend_i *be;
  LT_OP_SCOPE(op);
  LT_TRY(lt_same_device_named(op, nin, ins, names, &be));
  LT_TRY(check_dtypes(op, nin, ins, names));
  if (x->ndim < 1)
    return lt_fail(LT_ERR_SHAPE, "%s: the input is a scalar; it needs a last dim of in features", op);
  LT_TRY(check_layer(op, "", "input", x, x->sizes[x->ndim - 1], w1, b1));
  LT_TRY(check_layer(op, "projection ", "first weight", w1, w1->sizes[0], w2, b2));
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
  static const char *const names[3] = {"input", "weight", "targets"};
  const lt_backend_i *be;
  char b1[200], b2[200];
  LT_OP_SCOPE(op);
  LT_TRY(lt_same_device_named(op, 3, ins, names, &be));
  LT_TRY(check_dtypes(op, 2, ins, names));
  if (x->ndim < 2)
    return lt_fail(LT_ERR_SHAPE, "%s: the input %s needs rows: (N, in) or (B, T, in)", op, lt_tensor_shape_str(x, b1));
  LT_TRY(check_layer(op, "", "input", x, x->sizes[x->ndim - 1], w, NULL));
  if (reduction != 0 && reduction != 1)
    return lt_fail(LT_ERR_ARG, "%s: reduction must be mean or sum (for a loss per row: linear, then cross_entropy)",
                   op);
  int64_t N = 1;
  for (int d = 0; d < x->ndim - 1; d++)
    N *= x->sizes[d];
  int leading = targets->ndim == x->ndim - 1 &&
                memcmp(targets->sizes, x->sizes, sizeof(int64_t) * (size_t)targets->ndim) == 0;
  if (!leading && !(targets->ndim == 1 && targets->sizes[0] == N))
    return lt_fail(LT_ERR_SHAPE, "%s: targets %s must have the input's leading dims, or be one row of %lld (input %s)",
                   op, lt_tensor_shape_str(targets, b1), (long long)N, lt_tensor_shape_str(x, b2));
  if (classes < 0 || classes > w->sizes[0])
    return lt_fail(LT_ERR_ARG, "%s: classes %lld is outside [1, %lld] (the weight's rows; 0 takes them all)", op,
                   (long long)classes, (long long)w->sizes[0]);
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
