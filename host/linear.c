/*
 * linear.c: the linear layer as one op, y = act(x w^T + b) (torch.nn.functional
 * .linear, with GELU optionally fused), forward and backward. Where the
 * backend multiplies with epilogues (cuBLASLt on CUDA) the bias add and the
 * GELU run inside the product, which also writes the pre-activation the
 * backward needs; elsewhere, or when the backend has no algorithm for the
 * epilogue, the op is a product, an add and a gelu. The backward: g = dy
 * (or dy gelu'(pre)), dx = g w, dw = g^T x, db = the sum of g over rows,
 * db computed inside dw's product where the backend can (BGRADB).
 */
#include "autograd.h"
#include "iter.h"

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

/* dw = g^T x2 with db = the column sums of g in the same product (cuBLASLt's
   BGRADB epilogue); LT_ERR_UNSUPPORTED when the backend cannot (the caller
   multiplies and reduces). g (M, out) and x2 (M, in) have unit-stride rows. */
static lt_status fused_weight_grad(const lt_backend_i *be, const lt_tensor *g, const lt_tensor *x2, lt_tensor **dw,
                                   lt_tensor **db) {
  int64_t M = g->sizes[0], out = g->sizes[1], in = x2->sizes[1], wsizes[2] = {out, in};
  if (!be->matmul_epilogues || M == 0 || out == 0 || in == 0 || g->strides[1] != 1 || x2->strides[1] != 1 ||
      (M > 1 && (g->strides[0] < out || x2->strides[0] < in)))
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

/* i[0] act, i[1] has bias; saved: x2 (M, in), w, [pre]. */
static lt_status linear_backward(lt_node *n, lt_tensor *const *go, lt_tensor **gi) {
  int act = (int)n->i[0], has_b = (int)n->i[1];
  lt_tensor *x2, *w, *pre = NULL;
  LT_TRY(lt_ag_saved(n, 0, &x2));
  LT_TRY(lt_ag_saved(n, 1, &w));
  if (act)
    LT_TRY(lt_ag_saved(n, 2, &pre));
  int64_t M = x2->sizes[0], out = w->sizes[0], sizes[2] = {M, out};
  lt_tensor *g = NULL, *gg = NULL, *t = NULL, *dx = NULL, *dw = NULL, *db = NULL;
  lt_status st;
  LT_NO_GRAD({
    st = lt_tensor_reshape(go[0], 2, sizes, &g);
    if (st == LT_OK && g->dtype != x2->dtype) {
      lt_tensor *c = NULL;
      st = lt_tensor_to(g, x2->dtype, x2->storage->device, &c);
      lt_tensor_release(g);
      g = c;
    }
    if (st == LT_OK && act) { /* through the GELU: g gelu'(pre) */
      st = lt_binary(LT_BINARY_GELU_GRAD, pre, g, NULL, &gg);
      lt_tensor_release(g);
      g = gg;
      gg = NULL;
    }
    if (st == LT_OK && n->next[0].node) {
      lt_tensor *d2 = NULL;
      st = lt_matmul(g, w, &d2);
      if (st == LT_OK)
        st = lt_tensor_reshape(d2, n->in[0].ndim, n->in[0].sizes, &dx);
      lt_tensor_release(d2);
    }
    if (st == LT_OK && has_b && n->next[1].node && n->next[2].node) { /* both in one product where it can */
      lt_status fst = fused_weight_grad(g->storage->backend, g, x2, &dw, &db);
      if (fst != LT_OK && fst != LT_ERR_UNSUPPORTED)
        st = fst;
    }
    if (st == LT_OK && n->next[1].node && !dw && (st = lt_tensor_transpose(g, 0, 1, &t)) == LT_OK)
      st = lt_matmul(t, x2, &dw);
    if (st == LT_OK && has_b && n->next[2].node && !db) {
      int64_t rows = 0;
      st = lt_reduce(LT_REDUCE_SUM, g, 1, &rows, 0, 0, &db);
    }
  });
  lt_tensor_release(g);
  lt_tensor_release(t);
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

lt_status lt_linear(const lt_tensor *x, const lt_tensor *w, const lt_tensor *b, int act, lt_tensor **res) {
  const char *op = "linear";
  const lt_tensor *ins[3] = {x, w, b};
  int nin = b ? 3 : 2;
  const lt_backend_i *be;
  char b1[200], b2[200];
  LT_TRY(lt_same_device(op, nin, ins, &be));
  if (act != 0 && act != 1)
    return lt_fail(LT_ERR_ARG, "%s: activation %d is not 0 (none) or 1 (gelu)", op, act);
  for (int j = 0; j < nin; j++)
    if (!lt_dtype_is_float(ins[j]->dtype) || ins[j]->dtype != x->dtype)
      return lt_fail(LT_ERR_DTYPE, "%s: the input, weight and bias must share one float dtype; got %s, %s%s%s", op,
                     lt_dtype_name(x->dtype), lt_dtype_name(w->dtype), b ? " and " : "",
                     b ? lt_dtype_name(b->dtype) : "");
  if (w->ndim != 2 || x->ndim < 1 || x->sizes[x->ndim - 1] != w->sizes[1])
    return lt_fail(LT_ERR_SHAPE, "%s: input %s does not fit weight %s (out, in): the input's last dim must be in", op,
                   lt_tensor_shape_str(x, b1), lt_tensor_shape_str(w, b2));
  if (b && (b->ndim != 1 || b->sizes[0] != w->sizes[0]))
    return lt_fail(LT_ERR_SHAPE, "%s: bias %s must be (%lld)", op, lt_tensor_shape_str(b, b1),
                   (long long)w->sizes[0]);
  lt_tensor *x2 = NULL, *y2 = NULL, *pre = NULL, *y = NULL;
  lt_status st = rows_of(x, &x2);
  int64_t M = x2 ? x2->sizes[0] : 0, out = w->sizes[0], ysizes[2] = {M, out};
  int fused = 0;
  /* (one product with unit-stride rows: what cuBLASLt's epilogues are asked for) */
  int64_t in = w->sizes[1];
  int rows_ok = st == LT_OK && x2->strides[1] == 1 && (M <= 1 || x2->strides[0] >= in) && w->strides[1] == 1 &&
                (out <= 1 || w->strides[0] >= in) && (!b || b->strides[0] == 1 || out <= 1);
  if (st == LT_OK && be->matmul_epilogues && (b || act) && rows_ok && M > 0 && in > 0 && out > 0) {
    st = lt_tensor_empty(2, ysizes, x->dtype, x->storage->device, &y2);
    if (st == LT_OK && act)
      st = lt_tensor_empty(2, ysizes, x->dtype, x->storage->device, &pre);
    if (st == LT_OK) {
      st = fused_forward(be, x2, w, b, act, y2, pre);
      fused = st == LT_OK;
      if (st == LT_ERR_UNSUPPORTED) { /* no algorithm with this epilogue: compose (said once) */
        static int noted;
        if (!__atomic_exchange_n(&noted, 1, __ATOMIC_RELAXED))
          fprintf(stderr, "lutra: linear: %s; running it as matmul, add%s (noted once)\n", lt_last_error(),
                  act ? ", gelu" : "");
        lt_tensor_release(y2);
        lt_tensor_release(pre);
        y2 = pre = NULL;
        st = LT_OK;
      }
    }
  }
  if (st == LT_OK && !fused)
    st = composed_forward(x2, w, b, act, &y2, &pre);
  if (st == LT_OK) { /* back to x's leading dims */
    int64_t sizes[LT_MAX_DIMS];
    memcpy(sizes, x->sizes, sizeof(int64_t) * (size_t)x->ndim);
    sizes[x->ndim - 1] = out;
    LT_NO_GRAD(st = lt_tensor_view(y2, x->ndim, sizes, &y));
  }
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
