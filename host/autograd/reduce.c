/*
 * autograd/reduce.c: the public lt_reduce (sum, mean, max, min, argmax,
 * argmin, var, std): the dispatch (ops/reduce.c) and the node a float
 * result records, with its backward rule.
 */
#include "autograd/grad-ops.h"

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

static lt_status record_reduce(lt_reduce_op op, const lt_tensor *a, int ndims, const int64_t *dims,
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
    st = lt_op_reduce(op == LT_REDUCE_MAX ? LT_REDUCE_ARGMAX : LT_REDUCE_ARGMIN, a, 1, dims, 1, 0, &idx);
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
    st = lt_op_reduce(LT_REDUCE_MEAN, a, nd, dl, 1, 0, &mean);
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

lt_status lt_reduce(lt_reduce_op op, const lt_tensor *a, int ndims, const int64_t *dims, int keepdim,
                    int64_t correction, lt_tensor **res) {
  lt_tensor *r;
  LT_TRY(lt_op_reduce(op, a, ndims, dims, keepdim, correction, &r));
  return lt_ag_result(record_reduce(op, a, ndims, dims, correction, r), r, res);
}
