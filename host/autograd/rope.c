/*
 * autograd/rope.c: lt_rope, the differentiable rotary position embedding
 * over (..., T, D), with its backward rule (the inverse rotation of the
 * gradient). The rows are converted to the dtype the kernel reads, rotated
 * by the dispatch (ops/rope.c) and returned in x's dtype.
 */
#include "autograd/nn.h"

/* x rotated (inverse: back) from position start, in x's dtype. */
static lt_status rope_run(const lt_tensor *x, double base, int64_t start, int inverse, const lt_rope_scaling *sc,
                         lt_tensor **res) {
  lt_dtype cd = lt_nn_row_dtype(x->storage->backend, x->dtype);
  lt_tensor *xc = NULL, *y = NULL;
  lt_status st = lt_nn_as_compute(x, cd, &xc);
  if (st == LT_OK)
    st = lt_op_rope(xc, base, start, inverse, sc, &y);
  lt_tensor_release(xc);
  if (st != LT_OK)
    return st;
  return lt_nn_to_dtype(y, x->dtype, res);
}

/* f[0] base, f[1..3] the scaling's factor, low and high frequency factors, i[0] start, i[1] the scaling's
   kind, i[2] its original_max (a whole number of positions). */
static lt_status rope_backward(lt_node *n, lt_tensor *const *go, lt_tensor **gi) {
  lt_rope_scaling sc = {(int)n->i[1], n->f[1], n->f[2], n->f[3], (double)n->i[2]};
  return rope_run(go[0], n->f[0], n->i[0], 1, &sc, &gi[0]);
}

static const lt_node_ops rope_ops = {"RopeBackward", rope_backward, NULL};

lt_status lt_rope(const lt_tensor *x, double base, int64_t start, lt_tensor **res) {
  return lt_rope_scaled(x, base, start, NULL, res);
}

lt_status lt_rope_scaled(const lt_tensor *x, double base, int64_t start, const lt_rope_scaling *scaling,
                         lt_tensor **res) {
  LT_OP_SCOPE("rope");
  lt_rope_scaling sc = {LT_ROPE_PLAIN, 1, 1, 1, 1};
  if (scaling)
    sc = *scaling;
  LT_TRY(lt_op_rope_check(x, base, start, &sc));
  if (sc.kind == LT_ROPE_LLAMA3 && sc.original_max != (double)(int64_t)sc.original_max)
    return lt_fail(LT_ERR_ARG, "rope: llama3 scaling's original_max must be a whole number, got %g", sc.original_max);
  lt_tensor *r;
  LT_TRY(rope_run(x, base, start, 0, &sc, &r));
  if (lt_ag_needed(1, &x)) {
    lt_node *n;
    lt_status st = lt_ag_node_new(&rope_ops, 1, &x, &n);
    if (st == LT_OK) {
      n->f[0] = base;
      n->f[1] = sc.factor;
      n->f[2] = sc.low_freq_factor;
      n->f[3] = sc.high_freq_factor;
      n->i[0] = start;
      n->i[1] = sc.kind;
      n->i[2] = (int64_t)sc.original_max;
      st = lt_ag_attach(n, r, 0);
      lt_node_release(n);
    }
    if (st != LT_OK) {
      lt_tensor_release(r);
      return st;
    }
  }
  *res = r;
  return LT_OK;
}
