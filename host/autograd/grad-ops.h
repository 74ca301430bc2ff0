/*
 * autograd/grad-ops.h: what the backward rules of the op families
 * (autograd/elementwise.c, reduce.c, matmul.c, view.c, copy.c, index.c)
 * share: a scratch list of the temporaries of one backward, released
 * together, and the forward ops they compose, each a no-op once an earlier
 * step failed (the first error is kept). Backward runs with grad mode off,
 * so the public ops called here record nothing.
 */
#ifndef LUTRA_GRAD_OPS_H
#define LUTRA_GRAD_OPS_H

#include "autograd/autograd.h"

typedef struct {
  lt_tensor *t[48];
  int n;
  lt_status st;
} scratch;

static inline lt_tensor *keep(scratch *s, lt_status st, lt_tensor *t) {
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

static inline lt_tensor *un(scratch *s, lt_unary_op op, lt_tensor *a) {
  lt_tensor *r = NULL;
  if (!OK1(a))
    return NULL;
  return KEEP(s, lt_unary(op, a, NULL, &r), r);
}

static inline lt_tensor *bin(scratch *s, lt_binary_op op, lt_tensor *a, lt_tensor *b) {
  lt_tensor *r = NULL;
  if (!OK2(a, b))
    return NULL;
  return KEEP(s, lt_binary(op, a, b, NULL, &r), r);
}

static inline lt_tensor *sc(scratch *s, lt_binary_op op, lt_tensor *a, double v) {
  lt_tensor *r = NULL;
  if (!OK1(a))
    return NULL;
  return KEEP(s, lt_binary_scalar(op, a, v, 0, NULL, &r), r);
}

static inline lt_tensor *where(scratch *s, lt_tensor *c, lt_tensor *a, lt_tensor *b) {
  lt_tensor *r = NULL;
  if (!OK2(c, a) || !b)
    return NULL;
  return KEEP(s, lt_where(c, a, b, NULL, &r), r);
}

static inline lt_tensor *zero_like(scratch *s, lt_tensor *a) {
  lt_tensor *r = NULL;
  if (!OK1(a))
    return NULL;
  return KEEP(s, lt_tensor_full(0, NULL, 0, a->dtype, a->storage->device, &r), r);
}

static inline lt_tensor *zeros_of(scratch *s, const lt_shape_info *in, lt_tensor *like) {
  lt_tensor *r = NULL;
  if (!OK1(like))
    return NULL;
  return KEEP(s, lt_tensor_full(in->ndim, in->sizes, 0, in->dtype, like->storage->device, &r), r);
}

static inline lt_tensor *reshape(scratch *s, lt_tensor *a, int ndim, const int64_t *sizes) {
  lt_tensor *r = NULL;
  if (!OK1(a))
    return NULL;
  return KEEP(s, lt_tensor_reshape(a, ndim, sizes, &r), r);
}

static inline lt_tensor *expand(scratch *s, lt_tensor *a, const lt_shape_info *in) {
  lt_tensor *r = NULL;
  if (!OK1(a))
    return NULL;
  return KEEP(s, lt_tensor_expand(a, in->ndim, in->sizes, &r), r);
}

static inline lt_tensor *saved(scratch *s, lt_node *n, int k) {
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
static inline lt_tensor *fit(scratch *s, lt_node *n, int k, lt_tensor *g) {
  lt_tensor *r = NULL;
  if (!OK1(g))
    return NULL;
  return KEEP(s, lt_ag_sum_to(g, &n->in[k], &r), r);
}

/* Hands t to the engine (a new reference) or leaves NULL. */
static inline void give(lt_tensor **slot, lt_tensor *t) {
  if (t)
    lt_tensor_retain(t);
  *slot = t;
}

static inline lt_status finish(scratch *s, lt_tensor **gin, int n) {
  if (s->st != LT_OK)
    for (int k = 0; k < n; k++) {
      lt_tensor_release(gin[k]);
      gin[k] = NULL;
    }
  for (int k = 0; k < s->n; k++)
    lt_tensor_release(s->t[k]);
  return s->st;
}

#endif
