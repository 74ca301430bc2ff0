/*
 * autograd/softmax.c: lt_softmax (softmax and log_softmax along a dim) and
 * lt_scaled_softmax (softmax(scale x) over the last dim, optionally with
 * the causal mask), the differentiable entry points, with their backward
 * rule. The dim is moved last (a view), the rows converted to the dtype the
 * kernels read, the dispatch (ops/softmax.c) run, its output saved for the
 * backward and returned in x's layout and dtype.
 */
#include "autograd/nn.h"

/* x with dim moved last (a view), or x itself. */
static lt_status dim_last(const lt_tensor *x, int dim, lt_tensor **out) {
  if (dim == x->ndim - 1) {
    lt_tensor_retain((lt_tensor *)x);
    *out = (lt_tensor *)x;
    return LT_OK;
  }
  lt_status st;
  LT_NO_GRAD(st = lt_tensor_transpose((lt_tensor *)x, dim, x->ndim - 1, out));
  return st;
}

/* Row kernel result (dim last, contiguous) back to x's layout and dtype. */
static lt_status dim_back(lt_tensor *r, int dim, int ndim, lt_dtype d, lt_tensor **out) {
  lt_tensor *t = NULL;
  lt_status st;
  if (dim == ndim - 1) {
    lt_tensor_retain(r);
    t = r;
    st = LT_OK;
  } else {
    LT_NO_GRAD(st = lt_tensor_transpose(r, dim, ndim - 1, &t));
  }
  if (st != LT_OK)
    return st;
  return lt_nn_to_dtype(t, d, out);
}

/* i[0] dim, i[1] log; f[0] scale. Saved: the output, dim last, contiguous. */
static lt_status softmax_backward(lt_node *n, lt_tensor *const *go, lt_tensor **gi) {
  lt_tensor *y;
  LT_TRY(lt_ag_saved(n, 0, &y));
  int dim = (int)n->i[0], logsm = (int)n->i[1], ndim = n->in[0].ndim;
  lt_tensor *gl = NULL, *dy = NULL, *dx = NULL;
  lt_status st = dim_last(go[0], dim, &gl);
  if (st == LT_OK)
    st = lt_nn_as_compute(gl, y->dtype, &dy);
  if (st == LT_OK)
    st = lt_op_softmax_bwd(y, dy, logsm, n->f[0], &dx);
  if (st == LT_OK)
    st = dim_back(dx, dim, ndim, n->in[0].dtype, &gi[0]);
  LT_RELEASE_ALL(gl, dy, dx);
  return st;
}

static const lt_node_ops softmax_ops = {"SoftmaxBackward", softmax_backward, NULL};
static const lt_node_ops log_softmax_ops = {"LogSoftmaxBackward", softmax_backward, NULL};

static lt_status softmax_any(const char *op, const lt_tensor *x, int dim, int log, double scale, int causal,
                              lt_tensor **res) {
  const lt_backend_i *be;
  lt_dtype cd;
  LT_OP_SCOPE(op);
  LT_TRY(lt_op_softmax_check(op, x, dim, scale, causal, &be, &cd));
  /* queries: the rows of one (queries, keys) matrix */
  int64_t causal_T = causal ? x->sizes[x->ndim - 2] : 0;
  lt_tensor *xl = NULL, *xc = NULL, *y = NULL, *r = NULL;
  lt_status st = dim_last(x, dim, &xl);
  if (st == LT_OK)
    st = lt_nn_as_compute(xl, cd, &xc);
  if (st == LT_OK)
    st = lt_op_softmax_fwd(cd, xc, log, scale, causal_T, &y);
  if (st == LT_OK)
    st = dim_back(y, dim, x->ndim, x->dtype, &r);
  if (st == LT_OK && lt_ag_needed(1, &x)) {
    lt_node *n;
    st = lt_ag_node_new(log ? &log_softmax_ops : &softmax_ops, 1, &x, &n);
    if (st == LT_OK) {
      n->i[0] = dim;
      n->i[1] = log;
      n->f[0] = scale;
      st = lt_ag_save(n, y);
      if (st == LT_OK)
        st = lt_ag_attach(n, r, 0);
      lt_node_release(n);
    }
  }
  LT_RELEASE_ALL(xl, xc, y);
  if (st != LT_OK) {
    lt_tensor_release(r);
    return st;
  }
  *res = r;
  return LT_OK;
}

lt_status lt_softmax(const lt_tensor *x, int dim, int log, lt_tensor **res) {
  return softmax_any(log ? "log_softmax" : "softmax", x, dim, log, 1.0, 0, res);
}

lt_status lt_scaled_softmax(const lt_tensor *x, double scale, int causal, lt_tensor **res) {
  if (x && x->storage && x->ndim == 0)
    return lt_fail(LT_ERR_SHAPE, "scaled_softmax: needs at least 1 dim");
  return softmax_any("scaled_softmax", x, x && x->storage ? x->ndim - 1 : 0, 0, scale, causal, res);
}
