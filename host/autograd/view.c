/*
 * autograd/view.c: the public views lt_tensor_view, _reshape, _transpose,
 * _permute, _narrow, _select, _expand, _squeeze, _unsqueeze and
 * _contiguous: the view (ops/view.c) and, for a float tensor that requires
 * grad, its node, with the backward rule (the inverse view of the
 * gradient; narrow and select put it into zeros).
 */
#include "autograd/grad-ops.h"

typedef enum lt_view_kind {
  LT_VIEW_RESHAPE = 0, /* view, reshape, squeeze, unsqueeze */
  LT_VIEW_TRANSPOSE,   /* args: dim0, dim1 */
  LT_VIEW_PERMUTE,     /* args: the permutation */
  LT_VIEW_NARROW,      /* args: dim, start, length */
  LT_VIEW_SELECT,      /* args: dim, index */
  LT_VIEW_EXPAND,
} lt_view_kind;

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
};

static lt_status record_view(lt_view_kind kind, const lt_tensor *a, lt_tensor *r, const int64_t *args, int nargs) {
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

/* ---- the public views -------------------------------------------------------------- */

/* The view *r made by st's op of kind, recorded (released when that fails).
   (r by address: the op's call, an argument, must have written it before
   it is read, and C leaves the order of arguments open.) */
static lt_status recorded(lt_status st, lt_view_kind kind, lt_tensor *t, lt_tensor *const *r, lt_tensor **out,
                          const int64_t *args, int nargs) {
  LT_TRY(st);
  return lt_ag_result(record_view(kind, t, *r, args, nargs), *r, out);
}

lt_status lt_tensor_view(lt_tensor *t, int ndim, const int64_t *sizes, lt_tensor **out) {
  lt_tensor *r = NULL;
  return recorded(lt_op_tensor_view(t, ndim, sizes, &r), LT_VIEW_RESHAPE, t, &r, out, NULL, 0);
}

lt_status lt_tensor_reshape(lt_tensor *t, int ndim, const int64_t *sizes, lt_tensor **out) {
  lt_tensor *r = NULL;
  return recorded(lt_op_tensor_reshape(t, ndim, sizes, &r), LT_VIEW_RESHAPE, t, &r, out, NULL, 0);
}

lt_status lt_tensor_transpose(lt_tensor *t, int dim0, int dim1, lt_tensor **out) {
  lt_tensor *r = NULL;
  int64_t args[2] = {dim0, dim1};
  return recorded(lt_op_tensor_transpose(t, dim0, dim1, &r), LT_VIEW_TRANSPOSE, t, &r, out, args, 2);
}

lt_status lt_tensor_permute(lt_tensor *t, int ndim, const int64_t *dims, lt_tensor **out) {
  lt_tensor *r = NULL;
  return recorded(lt_op_tensor_permute(t, ndim, dims, &r), LT_VIEW_PERMUTE, t, &r, out, dims, ndim);
}

lt_status lt_tensor_narrow(lt_tensor *t, int dim, int64_t start, int64_t length, lt_tensor **out) {
  lt_tensor *r = NULL;
  int64_t args[3] = {dim, start, length};
  return recorded(lt_op_tensor_narrow(t, dim, start, length, &r), LT_VIEW_NARROW, t, &r, out, args, 3);
}

lt_status lt_tensor_select(lt_tensor *t, int dim, int64_t index, lt_tensor **out) {
  lt_tensor *r = NULL;
  int64_t args[2] = {dim, index};
  return recorded(lt_op_tensor_select(t, dim, index, &r), LT_VIEW_SELECT, t, &r, out, args, 2);
}

lt_status lt_tensor_expand(lt_tensor *t, int ndim, const int64_t *sizes, lt_tensor **out) {
  lt_tensor *r = NULL;
  return recorded(lt_op_tensor_expand(t, ndim, sizes, &r), LT_VIEW_EXPAND, t, &r, out, NULL, 0);
}

lt_status lt_tensor_squeeze(lt_tensor *t, int dim, lt_tensor **out) {
  lt_tensor *r = NULL;
  return recorded(lt_op_tensor_squeeze(t, dim, &r), LT_VIEW_RESHAPE, t, &r, out, NULL, 0);
}

lt_status lt_tensor_unsqueeze(lt_tensor *t, int dim, lt_tensor **out) {
  lt_tensor *r = NULL;
  return recorded(lt_op_tensor_unsqueeze(t, dim, &r), LT_VIEW_RESHAPE, t, &r, out, NULL, 0);
}

/* (a copy is a clone: CloneBackward) */
lt_status lt_tensor_contiguous(lt_tensor *t, lt_tensor **out) {
  LT_OP_SCOPE("contiguous");
  LT_TRY(lt_check_tensor("contiguous", t, 1));
  if (lt_tensor_is_contiguous(t)) {
    lt_tensor_retain(t);
    *out = t;
    return LT_OK;
  }
  return lt_tensor_clone(t, out);
}
