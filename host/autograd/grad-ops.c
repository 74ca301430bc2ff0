/*
 * autograd/grad-ops.c: the backward functions of the tensor core's differentiable ops
 * (elementwise, reductions, matmul, views, dtype conversion, indexing) and
 * the lt_ag_record_* calls the forward ops make to put a node on the tape.
 * Formulas follow PyTorch's derivatives.yaml; backward runs with grad mode
 * off, composing the same forward ops.
 */
#include "autograd/autograd.h"
#include "autograd/grad-ops.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- scratch: temporaries of one backward, released together ------------------ */

typedef struct {
  lt_tensor *t[48];
  int n;
  lt_status st;
} scratch;

static lt_tensor *keep(scratch *s, lt_status st, lt_tensor *t) {
  if (st != LT_OK) {
    if (s->st == LT_OK)
      s->st = st;
    return NULL;
  }
  LT_ASSERT(s->n < 48, "scratch full");
  s->t[s->n++] = t;
  return t;
}

/* KEEP(s, call, r): runs call (which writes r) and only then keeps r; the
   order of evaluation of plain function arguments is unspecified in C. */
#define KEEP(sc_, call, var)               \
  __extension__({                          \
    lt_status keep_st_ = (call);           \
    keep((sc_), keep_st_, (var));          \
  })

#define OK1(a) (s->st == LT_OK && (a))
#define OK2(a, b) (s->st == LT_OK && (a) && (b))

static lt_tensor *un(scratch *s, lt_unary_op op, lt_tensor *a) {
  lt_tensor *r = NULL;
  if (!OK1(a))
    return NULL;
  return KEEP(s, lt_unary(op, a, NULL, &r), r);
}

static lt_tensor *bin(scratch *s, lt_binary_op op, lt_tensor *a, lt_tensor *b) {
  lt_tensor *r = NULL;
  if (!OK2(a, b))
    return NULL;
  return KEEP(s, lt_binary(op, a, b, NULL, &r), r);
}

static lt_tensor *sc(scratch *s, lt_binary_op op, lt_tensor *a, double v) {
  lt_tensor *r = NULL;
  if (!OK1(a))
    return NULL;
  return KEEP(s, lt_binary_scalar(op, a, v, 0, NULL, &r), r);
}

static lt_tensor *where(scratch *s, lt_tensor *c, lt_tensor *a, lt_tensor *b) {
  lt_tensor *r = NULL;
  if (!OK2(c, a) || !b)
    return NULL;
  return KEEP(s, lt_where(c, a, b, NULL, &r), r);
}

static lt_tensor *zero_like(scratch *s, lt_tensor *a) {
  lt_tensor *r = NULL;
  if (!OK1(a))
    return NULL;
  return KEEP(s, lt_tensor_full(0, NULL, 0, a->dtype, a->storage->device, &r), r);
}

static lt_tensor *zeros_of(scratch *s, const lt_shape_info *in, lt_tensor *like) {
  lt_tensor *r = NULL;
  if (!OK1(like))
    return NULL;
  return KEEP(s, lt_tensor_full(in->ndim, in->sizes, 0, in->dtype, like->storage->device, &r), r);
}

static lt_tensor *reshape(scratch *s, lt_tensor *a, int ndim, const int64_t *sizes) {
  lt_tensor *r = NULL;
  if (!OK1(a))
    return NULL;
  return KEEP(s, lt_tensor_reshape(a, ndim, sizes, &r), r);
}

static lt_tensor *expand(scratch *s, lt_tensor *a, const lt_shape_info *in) {
  lt_tensor *r = NULL;
  if (!OK1(a))
    return NULL;
  return KEEP(s, lt_tensor_expand(a, in->ndim, in->sizes, &r), r);
}

static lt_tensor *saved(scratch *s, lt_node *n, int k) {
  lt_tensor *t = NULL;
  if (s->st != LT_OK)
    return NULL;
  lt_status st = lt_ag_saved(n, k, &t);
  if (st != LT_OK) {
    s->st = st;
    return NULL;
  }
  return t; /* owned by the node */
}

/* g summed to input k's shape and dtype (broadcast dims reduced). */
static lt_tensor *fit(scratch *s, lt_node *n, int k, lt_tensor *g) {
  lt_tensor *r = NULL;
  if (!OK1(g))
    return NULL;
  return KEEP(s, lt_ag_sum_to(g, &n->in[k], &r), r);
}

/* Hands t to the engine (a new reference) or leaves NULL. */
static void give(lt_tensor **slot, lt_tensor *t) {
  if (t)
    lt_tensor_retain(t);
  *slot = t;
}

static lt_status finish(scratch *s, lt_tensor **gin, int n) {
  if (s->st != LT_OK)
    for (int k = 0; k < n; k++) {
      lt_tensor_release(gin[k]);
      gin[k] = NULL;
    }
  for (int k = 0; k < s->n; k++)
    lt_tensor_release(s->t[k]);
  return s->st;
}

/* ---- elementwise ------------------------------------------------------------------ */

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

lt_status lt_ag_record_unary(lt_unary_op op, const lt_tensor *a, lt_tensor *r) {
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

lt_status lt_ag_record_binary(lt_binary_op op, const lt_tensor *a, const lt_tensor *b, lt_tensor *r) {
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

lt_status lt_ag_record_scalar(lt_binary_op op, const lt_tensor *a, double v, int reversed, lt_tensor *r) {
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

lt_status lt_ag_record_where(const lt_tensor *c, const lt_tensor *a, const lt_tensor *b, lt_tensor *r) {
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

lt_status lt_ag_record_clamp(const lt_tensor *a, double lo, int has_lo, double hi, int has_hi, lt_tensor *r) {
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

/* ---- reductions ------------------------------------------------------------------- */

/* The input's shape with the reduced dims (bits of mask) set to 1. */
static void keep_shape(const lt_node *n, int64_t *sizes) {
  for (int d = 0; d < n->in[0].ndim; d++)
    sizes[d] = (n->i[1] >> d) & 1 ? 1 : n->in[0].sizes[d];
}

static lt_status reduce_backward(lt_node *n, lt_tensor *const *go, lt_tensor **gi) {
  scratch S = {0}, *s = &S;
  const lt_shape_info *in = &n->in[0];
  int64_t ks[LT_MAX_DIMS];
  keep_shape(n, ks);
  lt_tensor *gk = reshape(s, go[0], in->ndim, ks); /* keepdim form */
  lt_tensor *ge = expand(s, gk, in), *r = NULL;
  double count = n->f[0];
  switch ((lt_reduce_op)n->i[0]) {
  case LT_REDUCE_SUM: r = ge; break;
  case LT_REDUCE_MEAN: r = sc(s, LT_BINARY_DIV, ge, count); break;
  case LT_REDUCE_MAX:
  case LT_REDUCE_MIN: {
    if (n->nsaved == 1) { /* one dim: all of it to the position max/min returned, as torch.max(x, dim) */
      lt_tensor *idx = saved(s, n, 0), *z = zeros_of(s, in, go[0]);
      if (OK2(idx, z)) {
        lt_tensor *gk2 = gk;
        if (OK1(gk2) && gk2->dtype != z->dtype) {
          lt_tensor *c = NULL;
          gk2 = KEEP(s, lt_tensor_to(gk2, z->dtype, gk2->storage->device, &c), c);
        }
        if (OK1(gk2))
          s->st = lt_scatter_add_(z, (int)n->i[3], idx, gk2);
      }
      r = z;
      break;
    }
    /* several dims: shared evenly among the elements equal to the result (NaN included) */
    lt_tensor *x = saved(s, n, 0), *y = saved(s, n, 1);
    lt_tensor *ye = expand(s, reshape(s, y, in->ndim, ks), in);
    lt_tensor *nan_both = bin(s, LT_BINARY_MUL, bin(s, LT_BINARY_NE, x, x), bin(s, LT_BINARY_NE, ye, ye));
    lt_tensor *mask = bin(s, LT_BINARY_MAXIMUM, bin(s, LT_BINARY_EQ, x, ye), nan_both);
    lt_tensor *cnt = NULL;
    if (OK1(mask)) {
      int64_t dims[LT_MAX_DIMS];
      int nd = 0;
      for (int d = 0; d < in->ndim; d++)
        if ((n->i[1] >> d) & 1)
          dims[nd++] = d;
      lt_tensor *m = NULL, *c = NULL;
      lt_status st = lt_tensor_to(mask, in->dtype, mask->storage->device, &m);
      keep(s, st, m);
      if (OK1(m)) {
        st = lt_reduce(LT_REDUCE_SUM, m, nd, dims, 1, 0, &c);
        cnt = keep(s, st, c);
      }
    }
    r = where(s, mask, bin(s, LT_BINARY_DIV, ge, cnt), zero_like(s, go[0]));
    break;
  }
  case LT_REDUCE_VAR:
  case LT_REDUCE_STD: {
    lt_tensor *x = saved(s, n, 0), *mk = saved(s, n, 1);
    lt_tensor *dev = bin(s, LT_BINARY_SUB, x, expand(s, mk, in));
    double denom = count - (double)n->i[2];
    if (n->i[0] == LT_REDUCE_VAR) {
      r = bin(s, LT_BINARY_MUL, ge, sc(s, LT_BINARY_MUL, dev, 2.0 / denom));
    } else {
      lt_tensor *y = saved(s, n, 2);
      lt_tensor *ye = expand(s, reshape(s, y, in->ndim, ks), in);
      r = bin(s, LT_BINARY_DIV, bin(s, LT_BINARY_MUL, ge, sc(s, LT_BINARY_DIV, dev, denom)), ye);
      r = where(s, sc(s, LT_BINARY_EQ, ye, 0), zero_like(s, go[0]), r); /* a constant row: 0, as torch */
    }
    break;
  }
  default: s->st = lt_fail(LT_ERR_INTERNAL, "reduce backward: op has no gradient"); break;
  }
  give(&gi[0], fit(s, n, 0, r));
  return finish(s, gi, 1);
}

static const lt_node_ops reduce_ops[LT_REDUCE_COUNT] = {
    {"SumBackward", reduce_backward, NULL}, {"MeanBackward", reduce_backward, NULL},
    {"MaxBackward", reduce_backward, NULL}, {"MinBackward", reduce_backward, NULL},
    {"ArgmaxBackward", reduce_backward, NULL}, {"ArgminBackward", reduce_backward, NULL},
    {"VarBackward", reduce_backward, NULL}, {"StdBackward", reduce_backward, NULL},
};

lt_status lt_ag_record_reduce(lt_reduce_op op, const lt_tensor *a, int ndims, const int64_t *dims,
                              int64_t correction, lt_tensor *r) {
  if (!lt_ag_needed(1, &a) || !lt_dtype_is_float(r->dtype) || op == LT_REDUCE_ARGMAX ||
      op == LT_REDUCE_ARGMIN)
    return LT_OK;
  lt_node *n;
  LT_TRY(lt_ag_node_new(&reduce_ops[op], 1, &a, &n));
  int64_t mask = 0;
  double count = 1;
  for (int k = 0; k < ndims; k++)
    mask |= (int64_t)1 << dims[k];
  if (ndims == 0)
    mask = ((int64_t)1 << a->ndim) - 1;
  for (int d = 0; d < a->ndim; d++)
    if ((mask >> d) & 1)
      count *= (double)a->sizes[d];
  n->i[0] = op;
  n->i[1] = mask;
  n->i[2] = correction;
  n->f[0] = count;
  lt_status st = LT_OK;
  if ((op == LT_REDUCE_MAX || op == LT_REDUCE_MIN) && ndims == 1) {
    lt_tensor *idx = NULL; /* the positions max/min(x, dim) reports */
    LT_NO_GRAD(st = lt_reduce(op == LT_REDUCE_MAX ? LT_REDUCE_ARGMAX : LT_REDUCE_ARGMIN, a, 1, dims, 1, 0, &idx));
    if (st == LT_OK)
      st = lt_ag_save(n, idx);
    lt_tensor_release(idx);
    n->i[3] = dims[0];
  } else if (op == LT_REDUCE_MAX || op == LT_REDUCE_MIN) {
    st = lt_ag_save(n, a);
    if (st == LT_OK)
      st = lt_ag_save(n, r);
  } else if (op == LT_REDUCE_VAR || op == LT_REDUCE_STD) {
    lt_tensor *mean = NULL;
    int64_t dl[LT_MAX_DIMS];
    int nd = 0;
    for (int d = 0; d < a->ndim; d++)
      if ((mask >> d) & 1)
        dl[nd++] = d;
    LT_NO_GRAD(st = lt_reduce(LT_REDUCE_MEAN, a, nd, dl, 1, 0, &mean));
    if (st == LT_OK)
      st = lt_ag_save(n, a);
    if (st == LT_OK)
      st = lt_ag_save(n, mean);
    if (st == LT_OK && op == LT_REDUCE_STD)
      st = lt_ag_save(n, r);
    lt_tensor_release(mean);
  }
  if (st == LT_OK)
    st = lt_ag_attach(n, r, 0);
  lt_node_release(n);
  return st;
}

/* ---- matmul ------------------------------------------------------------------------- */

static lt_tensor *tr(scratch *s, lt_tensor *a) {
  lt_tensor *r = NULL;
  if (!OK1(a))
    return NULL;
  return KEEP(s, lt_tensor_transpose(a, a->ndim - 2, a->ndim - 1, &r), r);
}

static lt_tensor *mm(scratch *s, lt_tensor *a, lt_tensor *b) {
  lt_tensor *r = NULL;
  if (!OK2(a, b))
    return NULL;
  return KEEP(s, lt_matmul(a, b, &r), r);
}

/* t with a size-1 dim inserted at d (negative counts from the end). */
static lt_tensor *unsq(scratch *s, lt_tensor *a, int d) {
  lt_tensor *r = NULL;
  if (!OK1(a))
    return NULL;
  return KEEP(s, lt_tensor_unsqueeze(a, d < 0 ? a->ndim + 1 + d : d, &r), r);
}

/* Sums a (batch..., r, c) gradient down to the shape of operand k (which
   was 1-D when `vec`, and then reshapes to it). */
static lt_tensor *fit_matmul(scratch *s, lt_node *n, int k, lt_tensor *g) {
  if (!OK1(g))
    return NULL;
  const lt_shape_info *in = &n->in[k];
  lt_shape_info promoted = *in;
  if (in->ndim == 1) { /* as matmul saw it: a (1, k), b (k, 1) */
    promoted.ndim = 2;
    promoted.sizes[0] = k == 0 ? 1 : in->sizes[0];
    promoted.sizes[1] = k == 0 ? in->sizes[0] : 1;
  }
  lt_tensor *r = NULL;
  r = KEEP(s, lt_ag_sum_to(g, &promoted, &r), r);
  return reshape(s, r, in->ndim, in->sizes);
}

static lt_status matmul_backward(lt_node *n, lt_tensor *const *go, lt_tensor **gi) {
  scratch S = {0}, *s = &S;
  lt_tensor *a = saved(s, n, 0), *b = saved(s, n, 1), *g = go[0];
  int a1 = n->in[0].ndim == 1, b1 = n->in[1].ndim == 1;
  lt_tensor *A = a1 ? unsq(s, a, 0) : a, *B = b1 ? unsq(s, b, 1) : b, *G = g;
  if (a1)
    G = unsq(s, G, b1 ? 0 : -2);
  if (b1)
    G = unsq(s, G, -1);
  lt_tensor *ga = NULL, *gb = NULL;
  if (n->next[0].node)
    ga = fit_matmul(s, n, 0, mm(s, G, tr(s, B)));
  if (n->next[1].node) {
    if (OK2(A, G) && A->ndim > 2 && B->ndim == 2) {
      /* a matrix shared by a batch (a Linear layer): one (k, M) x (M, n)
         product over the flattened batch instead of a batch of products and
         a sum over it */
      int64_t k = A->sizes[A->ndim - 1], nn = G->sizes[G->ndim - 1];
      lt_tensor *A2 = reshape(s, A, 2, (int64_t[]){-1, k}), *G2 = reshape(s, G, 2, (int64_t[]){-1, nn});
      if (!b1 && OK1(B) && B->strides[0] == 1 && B->strides[1] == B->sizes[0] && B->sizes[0] > 1) {
        /* b is the transpose of a contiguous (n, k) weight (x @ W^T): its
           gradient is made as (n, k) and handed back transposed, so that
           W's gradient arrives contiguous instead of needing a strided
           transpose of the whole matrix (the tied output head: 25 MB) */
        gb = tr(s, mm(s, tr(s, G2), A2));
      } else {
        gb = fit_matmul(s, n, 1, mm(s, tr(s, A2), G2));
      }
    } else {
      gb = fit_matmul(s, n, 1, mm(s, tr(s, A), G));
    }
  }
  give(&gi[0], ga);
  give(&gi[1], gb);
  return finish(s, gi, 2);
}

static const lt_node_ops matmul_ops = {"MatmulBackward", matmul_backward, NULL};

lt_status lt_ag_record_matmul(const lt_tensor *a, const lt_tensor *b, lt_tensor *r) {
  const lt_tensor *ins[2] = {a, b};
  if (!lt_ag_needed(2, ins))
    return LT_OK;
  lt_node *n;
  LT_TRY(lt_ag_node_new(&matmul_ops, 2, ins, &n));
  lt_status st = lt_ag_save(n, a);
  if (st == LT_OK)
    st = lt_ag_save(n, b);
  if (st == LT_OK)
    st = lt_ag_attach(n, r, 0);
  lt_node_release(n);
  return st;
}

/* ---- views and conversions ---------------------------------------------------------- */

static lt_status view_backward(lt_node *n, lt_tensor *const *go, lt_tensor **gi) {
  scratch S = {0}, *s = &S;
  const lt_shape_info *in = &n->in[0];
  lt_tensor *g = go[0], *r = NULL;
  switch ((lt_view_kind)n->i[0]) {
  case LT_VIEW_RESHAPE: r = reshape(s, g, in->ndim, in->sizes); break;
  case LT_VIEW_TRANSPOSE: {
    lt_tensor *t = NULL;
    r = OK1(g) ? KEEP(s, lt_tensor_transpose(g, (int)n->i[1], (int)n->i[2], &t), t) : NULL;
    break;
  }
  case LT_VIEW_PERMUTE: {
    int64_t inv[LT_MAX_DIMS];
    for (int d = 0; d < in->ndim; d++)
      inv[n->i[1 + d]] = d;
    lt_tensor *t = NULL;
    r = OK1(g) ? KEEP(s, lt_tensor_permute(g, in->ndim, inv, &t), t) : NULL;
    break;
  }
  case LT_VIEW_NARROW:
  case LT_VIEW_SELECT: {
    lt_tensor *z = zeros_of(s, in, g), *part = NULL;
    if (OK1(z)) {
      lt_status st = n->i[0] == LT_VIEW_NARROW ? lt_tensor_narrow(z, (int)n->i[1], n->i[2], n->i[3], &part)
                                               : lt_tensor_select(z, (int)n->i[1], n->i[2], &part);
      keep(s, st, part);
      if (OK1(part))
        s->st = lt_tensor_copy_(part, g);
    }
    r = z;
    break;
  }
  case LT_VIEW_EXPAND: r = g; break; /* fit() sums the broadcast dims */
  case LT_VIEW_IDENTITY: r = g; break;
  case LT_VIEW_CONVERT: r = g; break; /* fit() converts back to the input's dtype */
  }
  give(&gi[0], fit(s, n, 0, r));
  return finish(s, gi, 1);
}

static const lt_node_ops view_ops[] = {
    [LT_VIEW_RESHAPE] = {"ViewBackward", view_backward, NULL},
    [LT_VIEW_TRANSPOSE] = {"TransposeBackward", view_backward, NULL},
    [LT_VIEW_PERMUTE] = {"PermuteBackward", view_backward, NULL},
    [LT_VIEW_NARROW] = {"NarrowBackward", view_backward, NULL},
    [LT_VIEW_SELECT] = {"SelectBackward", view_backward, NULL},
    [LT_VIEW_EXPAND] = {"ExpandBackward", view_backward, NULL},
    [LT_VIEW_IDENTITY] = {"CloneBackward", view_backward, NULL},
    [LT_VIEW_CONVERT] = {"ToBackward", view_backward, NULL},
};

lt_status lt_ag_record_view(lt_view_kind kind, const lt_tensor *a, lt_tensor *r, const int64_t *args,
                            int nargs) {
  if (r == a || !lt_ag_needed(1, &a) || !lt_dtype_is_float(r->dtype))
    return LT_OK;
  lt_node *n;
  LT_TRY(lt_ag_node_new(&view_ops[kind], 1, &a, &n));
  n->i[0] = kind;
  for (int k = 0; k < nargs; k++)
    n->i[1 + k] = args[k];
  lt_status st = lt_ag_attach(n, r, 0);
  lt_node_release(n);
  return st;
}

/* ---- indexing ------------------------------------------------------------------------- */

static lt_status index_backward(lt_node *n, lt_tensor *const *go, lt_tensor **gi) {
  scratch S = {0}, *s = &S;
  lt_tensor *idx = saved(s, n, 0), *z = zeros_of(s, &n->in[0], go[0]);
  if (OK2(idx, z)) {
    lt_tensor *g = go[0];
    if (g->dtype != z->dtype) {
      lt_tensor *c = NULL;
      g = KEEP(s, lt_tensor_to(g, z->dtype, g->storage->device, &c), c);
    }
    if (OK1(g))
      s->st = n->i[0] ? lt_scatter_add_(z, (int)n->i[1], idx, g) : lt_index_add_(z, (int)n->i[1], idx, g);
  }
  give(&gi[0], z);
  return finish(s, gi, 2);
}

static const lt_node_ops index_select_ops = {"IndexSelectBackward", index_backward, NULL};
static const lt_node_ops gather_ops = {"GatherBackward", index_backward, NULL};

lt_status lt_ag_record_index(int gather, const lt_tensor *t, int dim, const lt_tensor *index, lt_tensor *r) {
  const lt_tensor *ins[2] = {t, index};
  if (!lt_ag_needed(1, &t))
    return LT_OK;
  lt_node *n;
  LT_TRY(lt_ag_node_new(gather ? &gather_ops : &index_select_ops, 2, ins, &n));
  n->i[0] = gather;
  n->i[1] = dim;
  lt_status st = lt_ag_save(n, index);
  if (st == LT_OK)
    st = lt_ag_attach(n, r, 0);
  lt_node_release(n);
  return st;
}

/* ---- custom functions ------------------------------------------------------------------- */

/* Ids of freed custom nodes and hooked leaves, until the Lua side collects them. */
typedef struct {
  int64_t *ids;
  int n, cap;
} id_queue;
static id_queue dead_custom, dead_hooks;

static void queue_push(id_queue *q, int64_t id) {
  if (q->n == q->cap) {
    int cap = q->cap ? 2 * q->cap : 256;
    int64_t *grown = realloc(q->ids, sizeof(int64_t) * (size_t)cap);
    if (!grown)
      return; /* the Lua side then keeps a little state longer */
    q->ids = grown;
    q->cap = cap;
  }
  q->ids[q->n++] = id;
}

static int queue_take(id_queue *q, int64_t *ids, int max) {
  int n = q->n < max ? q->n : max;
  if (n > 0)
    memcpy(ids, q->ids + (q->n - n), sizeof(int64_t) * (size_t)n);
  q->n -= n;
  return n;
}

void lt_ag_hook_dead(int64_t id) { queue_push(&dead_hooks, id); }
int lt_autograd_take_dead_hooks(int64_t *ids, int max) { return queue_take(&dead_hooks, ids, max); }

static lt_status custom_backward(lt_node *n, lt_tensor *const *go, lt_tensor **gi) {
  const lt_backward_hooks *h = lt_ag_current_hooks();
  if (!h || !h->custom)
    return lt_fail(LT_ERR_INTERNAL, "backward: a custom function needs the Lua backward hooks");
  return h->custom(h->ctx, (int64_t)(intptr_t)n->user, n->noutputs, go, n->ninputs, gi);
}

static void custom_release(lt_node *n) { queue_push(&dead_custom, (int64_t)(intptr_t)n->user); }

static const lt_node_ops custom_ops = {"CustomFunctionBackward", custom_backward, custom_release};

lt_status lt_autograd_record_custom(int ninputs, lt_tensor *const *inputs, int noutputs,
                                    lt_tensor *const *outputs, int64_t id) {
  if (ninputs > LT_CUSTOM_MAX_INPUTS || noutputs > LT_NODE_MAX_OUTPUTS || noutputs < 1)
    return lt_fail(LT_ERR_ARG, "autograd.Function: at most %d tensor inputs and 1..%d outputs",
                   LT_CUSTOM_MAX_INPUTS, LT_NODE_MAX_OUTPUTS);
  if (!lt_ag_needed(ninputs, (const lt_tensor *const *)inputs))
    return LT_OK;
  lt_node *n;
  LT_TRY(lt_ag_node_new(&custom_ops, ninputs, (const lt_tensor *const *)inputs, &n));
  n->user = (void *)(intptr_t)id;
  lt_status st = LT_OK;
  for (int k = 0; k < noutputs && st == LT_OK; k++) {
    if (!lt_dtype_is_float(outputs[k]->dtype))
      st = lt_fail(LT_ERR_DTYPE, "autograd.Function: output %d is %s; outputs must be float tensors", k + 1,
                   lt_dtype_name(outputs[k]->dtype));
    else
      st = lt_ag_attach(n, outputs[k], k);
  }
  lt_node_release(n);
  return st;
}

int lt_autograd_take_dead_custom(int64_t *ids, int max) { return queue_take(&dead_custom, ids, max); }
