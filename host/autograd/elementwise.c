/*
 * autograd/elementwise.c: the public elementwise ops lt_unary, lt_binary,
 * lt_binary_scalar, lt_where and lt_clamp: autograd's in-place check (as the
 * write guard of their dispatch, ops/elementwise.c), the dispatch, and for a
 * new result the node it records, with the backward rules (formulas as
 * PyTorch's derivatives.yaml; backward runs with grad mode off, composing
 * the same ops).
 */
#include "autograd/grad-ops.h"

#include <math.h>

static lt_status unary_backward(lt_node *n, lt_tensor *const *go, lt_tensor **gi) {
  scratch S = {0}, *s = &S;
  lt_tensor *g = go[0], *x = NULL, *y = NULL, *r = NULL;
  switch ((lt_unary_op)n->i[0]) {
  case LT_UNARY_NEG: r = un(s, LT_UNARY_NEG, g); break;
  case LT_UNARY_ABS: x = saved(s, n, 0); r = bin(s, LT_BINARY_MUL, g, un(s, LT_UNARY_SIGN, x)); break;
  case LT_UNARY_EXP: y = saved(s, n, 0); r = bin(s, LT_BINARY_MUL, g, y); break;
  case LT_UNARY_LOG: x = saved(s, n, 0); r = bin(s, LT_BINARY_DIV, g, x); break;
  case LT_UNARY_SQRT: y = saved(s, n, 0); r = bin(s, LT_BINARY_DIV, sc(s, LT_BINARY_MUL, g, 0.5), y); break;
  case LT_UNARY_RSQRT: /* -1/2 x^(-3/2) = -1/2 y^3 */
    y = saved(s, n, 0);
    r = bin(s, LT_BINARY_MUL, sc(s, LT_BINARY_MUL, g, -0.5), bin(s, LT_BINARY_MUL, y, bin(s, LT_BINARY_MUL, y, y)));
    break;
  case LT_UNARY_TANH: /* 1 - y^2 */
    y = saved(s, n, 0);
    r = bin(s, LT_BINARY_MUL, g, sc(s, LT_BINARY_SUB, bin(s, LT_BINARY_MUL, y, y), 1.0));
    r = un(s, LT_UNARY_NEG, r); /* g * (y^2 - 1) negated */
    break;
  case LT_UNARY_SIGMOID: /* y (1 - y) */
    y = saved(s, n, 0);
    r = bin(s, LT_BINARY_MUL, g, bin(s, LT_BINARY_MUL, y, un(s, LT_UNARY_NEG, sc(s, LT_BINARY_SUB, y, 1.0))));
    break;
  case LT_UNARY_SIGN: r = zero_like(s, g); r = expand(s, r, &n->in[0]); break;
  case LT_UNARY_GELU: x = saved(s, n, 0); r = bin(s, LT_BINARY_GELU_GRAD, x, g); break;
  case LT_UNARY_SILU: x = saved(s, n, 0); r = bin(s, LT_BINARY_SILU_GRAD, x, g); break;
  default: s->st = lt_fail(LT_ERR_INTERNAL, "unary backward: unknown op"); break;
  }
  give(&gi[0], fit(s, n, 0, r));
  return finish(s, gi, 1);
}

static const lt_node_ops unary_ops[LT_UNARY_COUNT] = {
    {"NegBackward", unary_backward, NULL},     {"AbsBackward", unary_backward, NULL},
    {"ExpBackward", unary_backward, NULL},     {"LogBackward", unary_backward, NULL},
    {"SqrtBackward", unary_backward, NULL},    {"RsqrtBackward", unary_backward, NULL},
    {"TanhBackward", unary_backward, NULL},    {"SigmoidBackward", unary_backward, NULL},
    {"SignBackward", unary_backward, NULL},    {"GeluBackward", unary_backward, NULL},
    {"SiluBackward", unary_backward, NULL},
};

static lt_status record_unary(lt_unary_op op, const lt_tensor *a, lt_tensor *r) {
  if (!lt_ag_needed(1, &a) || !lt_dtype_is_float(r->dtype))
    return LT_OK;
  lt_node *n;
  LT_TRY(lt_ag_node_new(&unary_ops[op], 1, &a, &n));
  n->i[0] = op;
  lt_status st = LT_OK;
  if (op == LT_UNARY_ABS || op == LT_UNARY_LOG || op == LT_UNARY_GELU || op == LT_UNARY_SILU)
    st = lt_ag_save(n, a);
  else if (op == LT_UNARY_EXP || op == LT_UNARY_SQRT || op == LT_UNARY_RSQRT || op == LT_UNARY_TANH ||
           op == LT_UNARY_SIGMOID)
    st = lt_ag_save(n, r);
  if (st == LT_OK)
    st = lt_ag_attach(n, r, 0);
  lt_node_release(n);
  return st;
}

/* ties between a and b split the gradient in halves, as torch.maximum */
static lt_tensor *pick(scratch *s, lt_tensor *g, lt_tensor *win, lt_tensor *tie) {
  lt_tensor *z = zero_like(s, g);
  return where(s, win, g, where(s, tie, sc(s, LT_BINARY_MUL, g, 0.5), z));
}

static lt_status binary_backward(lt_node *n, lt_tensor *const *go, lt_tensor **gi) {
  scratch S = {0}, *s = &S;
  lt_tensor *g = go[0], *ga = NULL, *gb = NULL;
  int need_a = n->next[0].node != NULL, need_b = n->next[1].node != NULL;
  switch ((lt_binary_op)n->i[0]) {
  case LT_BINARY_ADD: ga = g; gb = g; break;
  case LT_BINARY_SUB: ga = g; gb = need_b ? un(s, LT_UNARY_NEG, g) : NULL; break;
  case LT_BINARY_MUL: {
    lt_tensor *a = saved(s, n, 0), *b = saved(s, n, 1);
    ga = need_a ? bin(s, LT_BINARY_MUL, g, b) : NULL;
    gb = need_b ? bin(s, LT_BINARY_MUL, g, a) : NULL;
    break;
  }
  case LT_BINARY_DIV: {
    lt_tensor *a = saved(s, n, 0), *b = saved(s, n, 1);
    ga = need_a ? bin(s, LT_BINARY_DIV, g, b) : NULL;
    if (need_b) /* -g a / b^2 */
      gb = un(s, LT_UNARY_NEG, bin(s, LT_BINARY_DIV, bin(s, LT_BINARY_MUL, g, a), bin(s, LT_BINARY_MUL, b, b)));
    break;
  }
  case LT_BINARY_POW: {
    lt_tensor *a = saved(s, n, 0), *b = saved(s, n, 1), *y = saved(s, n, 2);
    if (need_a) /* g b a^(b-1), and 0 where b == 0 (a^0 is constant; 0 * 0^-1 would be NaN) */
      ga = where(s, sc(s, LT_BINARY_EQ, b, 0), zero_like(s, g),
                 bin(s, LT_BINARY_MUL, bin(s, LT_BINARY_MUL, g, b), bin(s, LT_BINARY_POW, a, sc(s, LT_BINARY_SUB, b, 1.0))));
    if (need_b) { /* g y log(a), 0 where a == 0 and b >= 0 */
      lt_tensor *t = bin(s, LT_BINARY_MUL, bin(s, LT_BINARY_MUL, g, y), un(s, LT_UNARY_LOG, a));
      lt_tensor *mask = bin(s, LT_BINARY_MUL, sc(s, LT_BINARY_EQ, a, 0), sc(s, LT_BINARY_GE, b, 0));
      gb = where(s, mask, zero_like(s, g), t);
    }
    break;
  }
  case LT_BINARY_MAXIMUM:
  case LT_BINARY_MINIMUM: {
    lt_tensor *a = saved(s, n, 0), *b = saved(s, n, 1);
    lt_binary_op beats = n->i[0] == LT_BINARY_MAXIMUM ? LT_BINARY_GT : LT_BINARY_LT;
    lt_tensor *tie = bin(s, LT_BINARY_EQ, a, b);
    ga = need_a ? pick(s, g, bin(s, beats, a, b), tie) : NULL;
    gb = need_b ? pick(s, g, bin(s, beats, b, a), tie) : NULL;
    break;
  }
  default: s->st = lt_fail(LT_ERR_INTERNAL, "binary backward: op has no gradient"); break;
  }
  give(&gi[0], need_a ? fit(s, n, 0, ga) : NULL);
  give(&gi[1], need_b ? fit(s, n, 1, gb) : NULL);
  return finish(s, gi, 2);
}

static const lt_node_ops binary_ops[LT_BINARY_COUNT] = {
    {"AddBackward", binary_backward, NULL},     {"SubBackward", binary_backward, NULL},
    {"MulBackward", binary_backward, NULL},     {"DivBackward", binary_backward, NULL},
    {"PowBackward", binary_backward, NULL},     {"MaximumBackward", binary_backward, NULL},
    {"MinimumBackward", binary_backward, NULL},
};

static lt_status record_binary(lt_binary_op op, const lt_tensor *a, const lt_tensor *b, lt_tensor *r) {
  const lt_tensor *ins[2] = {a, b};
  if (!lt_ag_needed(2, ins) || !lt_dtype_is_float(r->dtype) || op > LT_BINARY_MINIMUM)
    return LT_OK;
  lt_node *n;
  LT_TRY(lt_ag_node_new(&binary_ops[op], 2, ins, &n));
  n->i[0] = op;
  lt_status st = LT_OK;
  if (op == LT_BINARY_MUL || op == LT_BINARY_DIV || op == LT_BINARY_POW || op == LT_BINARY_MAXIMUM ||
      op == LT_BINARY_MINIMUM) {
    st = lt_ag_save(n, a);
    if (st == LT_OK)
      st = lt_ag_save(n, b);
    if (st == LT_OK && op == LT_BINARY_POW)
      st = lt_ag_save(n, r);
  }
  if (st == LT_OK)
    st = lt_ag_attach(n, r, 0);
  lt_node_release(n);
  return st;
}

static lt_status scalar_backward(lt_node *n, lt_tensor *const *go, lt_tensor **gi) {
  scratch S = {0}, *s = &S;
  lt_tensor *g = go[0], *r = NULL;
  double v = n->f[0];
  int rev = (int)n->i[1];
  switch ((lt_binary_op)n->i[0]) {
  case LT_BINARY_ADD: r = g; break;
  case LT_BINARY_SUB: r = rev ? un(s, LT_UNARY_NEG, g) : g; break;
  case LT_BINARY_MUL: r = sc(s, LT_BINARY_MUL, g, v); break;
  case LT_BINARY_DIV:
    if (!rev) {
      r = sc(s, LT_BINARY_DIV, g, v);
    } else { /* d(v/a) = -v g / a^2 */
      lt_tensor *a = saved(s, n, 0);
      r = sc(s, LT_BINARY_MUL, bin(s, LT_BINARY_DIV, g, bin(s, LT_BINARY_MUL, a, a)), -v);
    }
    break;
  case LT_BINARY_POW:
    if (!rev && v == 0) { /* a^0 is constant */
      r = expand(s, zero_like(s, g), &n->in[0]);
    } else if (!rev) { /* v a^(v-1) */
      lt_tensor *a = saved(s, n, 0);
      r = sc(s, LT_BINARY_MUL, bin(s, LT_BINARY_MUL, g, sc(s, LT_BINARY_POW, a, v - 1)), v);
    } else { /* v^a log v */
      lt_tensor *y = saved(s, n, 0);
      r = sc(s, LT_BINARY_MUL, bin(s, LT_BINARY_MUL, g, y), log(v));
    }
    break;
  case LT_BINARY_MAXIMUM:
  case LT_BINARY_MINIMUM: {
    lt_tensor *a = saved(s, n, 0);
    lt_binary_op beats = n->i[0] == LT_BINARY_MAXIMUM ? LT_BINARY_GT : LT_BINARY_LT;
    r = pick(s, g, sc(s, beats, a, v), sc(s, LT_BINARY_EQ, a, v));
    break;
  }
  default: s->st = lt_fail(LT_ERR_INTERNAL, "scalar backward: op has no gradient"); break;
  }
  give(&gi[0], fit(s, n, 0, r));
  return finish(s, gi, 1);
}

static const lt_node_ops scalar_ops[LT_BINARY_COUNT] = {
    {"AddBackward", scalar_backward, NULL},     {"SubBackward", scalar_backward, NULL},
    {"MulBackward", scalar_backward, NULL},     {"DivBackward", scalar_backward, NULL},
    {"PowBackward", scalar_backward, NULL},     {"MaximumBackward", scalar_backward, NULL},
    {"MinimumBackward", scalar_backward, NULL},
};

static lt_status record_scalar(lt_binary_op op, const lt_tensor *a, double v, int reversed, lt_tensor *r) {
  if (!lt_ag_needed(1, &a) || !lt_dtype_is_float(r->dtype) || op > LT_BINARY_MINIMUM)
    return LT_OK;
  lt_node *n;
  LT_TRY(lt_ag_node_new(&scalar_ops[op], 1, &a, &n));
  n->i[0] = op;
  n->i[1] = reversed;
  n->f[0] = v;
  lt_status st = LT_OK;
  if (op == LT_BINARY_POW && reversed)
    st = lt_ag_save(n, r);
  else if (op == LT_BINARY_POW || op == LT_BINARY_MAXIMUM || op == LT_BINARY_MINIMUM ||
           (op == LT_BINARY_DIV && reversed))
    st = lt_ag_save(n, a);
  if (st == LT_OK)
    st = lt_ag_attach(n, r, 0);
  lt_node_release(n);
  return st;
}

static lt_status where_backward(lt_node *n, lt_tensor *const *go, lt_tensor **gi) {
  scratch S = {0}, *s = &S;
  lt_tensor *g = go[0], *c = saved(s, n, 0), *z = zero_like(s, g);
  give(&gi[1], n->next[1].node ? fit(s, n, 1, where(s, c, g, z)) : NULL);
  give(&gi[2], n->next[2].node ? fit(s, n, 2, where(s, c, z, g)) : NULL);
  return finish(s, gi, 3);
}

static const lt_node_ops where_ops = {"WhereBackward", where_backward, NULL};

static lt_status record_where(const lt_tensor *c, const lt_tensor *a, const lt_tensor *b, lt_tensor *r) {
  const lt_tensor *ins[3] = {c, a, b};
  if (!lt_ag_needed(3, ins) || !lt_dtype_is_float(r->dtype))
    return LT_OK;
  lt_node *n;
  LT_TRY(lt_ag_node_new(&where_ops, 3, ins, &n));
  lt_status st = lt_ag_save(n, c);
  if (st == LT_OK)
    st = lt_ag_attach(n, r, 0);
  lt_node_release(n);
  return st;
}

static lt_status clamp_backward(lt_node *n, lt_tensor *const *go, lt_tensor **gi) {
  scratch S = {0}, *s = &S;
  lt_tensor *g = go[0], *x = saved(s, n, 0), *z = zero_like(s, g), *r = g;
  if (n->i[0])
    r = where(s, sc(s, LT_BINARY_LT, x, n->f[0]), z, r);
  if (n->i[1])
    r = where(s, sc(s, LT_BINARY_GT, x, n->f[1]), z, r);
  give(&gi[0], fit(s, n, 0, r));
  return finish(s, gi, 1);
}

static const lt_node_ops clamp_ops = {"ClampBackward", clamp_backward, NULL};

static lt_status record_clamp(const lt_tensor *a, double lo, int has_lo, double hi, int has_hi, lt_tensor *r) {
  if (!lt_ag_needed(1, &a) || !lt_dtype_is_float(r->dtype))
    return LT_OK;
  lt_node *n;
  LT_TRY(lt_ag_node_new(&clamp_ops, 1, &a, &n));
  n->f[0] = lo;
  n->f[1] = hi;
  n->i[0] = has_lo;
  n->i[1] = has_hi;
  lt_status st = lt_ag_save(n, a);
  if (st == LT_OK)
    st = lt_ag_attach(n, r, 0);
  lt_node_release(n);
  return st;
}

/* ---- the public ops ------------------------------------------------------------ */

lt_status lt_unary(lt_unary_op op, const lt_tensor *a, lt_tensor *out, lt_tensor **res) {
  lt_tensor *r;
  LT_TRY(lt_op_unary_guarded(op, a, out, &r, lt_ag_check_inplace));
  return lt_ag_result(out ? LT_OK : record_unary(op, a, r), r, res);
}

lt_status lt_binary(lt_binary_op op, const lt_tensor *a, const lt_tensor *b, lt_tensor *out, lt_tensor **res) {
  lt_tensor *r;
  LT_TRY(lt_op_binary_guarded(op, a, b, out, &r, lt_ag_check_inplace));
  return lt_ag_result(out ? LT_OK : record_binary(op, a, b, r), r, res);
}

lt_status lt_binary_scalar(lt_binary_op op, const lt_tensor *a, double s, int reversed, lt_tensor *out,
                           lt_tensor **res) {
  lt_tensor *r;
  LT_TRY(lt_op_binary_scalar_guarded(op, a, s, reversed, out, &r, lt_ag_check_inplace));
  return lt_ag_result(out ? LT_OK : record_scalar(op, a, s, reversed, r), r, res);
}

lt_status lt_where(const lt_tensor *cond, const lt_tensor *a, const lt_tensor *b, lt_tensor *out, lt_tensor **res) {
  lt_tensor *r;
  LT_TRY(lt_op_where_guarded(cond, a, b, out, &r, lt_ag_check_inplace));
  return lt_ag_result(out ? LT_OK : record_where(cond, a, b, r), r, res);
}

lt_status lt_clamp(const lt_tensor *a, double lo, int has_lo, double hi, int has_hi, lt_tensor *out,
                   lt_tensor **res) {
  lt_tensor *r;
  LT_TRY(lt_op_clamp_guarded(a, lo, has_lo, hi, has_hi, out, &r, lt_ag_check_inplace));
  return lt_ag_result(out ? LT_OK : record_clamp(a, lo, has_lo, hi, has_hi, r), r, res);
}
