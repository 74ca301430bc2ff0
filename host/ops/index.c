/*
 * ops/index.c: the indexing dispatch: lt_op_index_select (and
 * lt_op_embedding), lt_op_index_add_, lt_op_gather and lt_op_scatter_add_
 * (what embeddings and cross-entropy need), and the index reports a backend
 * finishes later. Index tensors hold 0-based i32 or i64 positions;
 * out-of-range ones are reported with their position and the op does
 * nothing. No autograd (autograd/index.c records).
 */
#include "core/iter.h"
#include "ops/ops.h"

#include <stdlib.h>
#include <string.h>

static lt_status check_index_dtype(const char *op, const lt_tensor *index) {
  if (index->dtype != LT_DTYPE_I32 && index->dtype != LT_DTYPE_I64)
    return lt_fail(LT_ERR_DTYPE, "%s: the index must be i32 or i64, got %s", op,
                   lt_dtype_name(index->dtype));
  return LT_OK;
}

static lt_status check_dim(const char *op, const lt_tensor *t, int dim) {
  if (dim < 0 || dim >= t->ndim) {
    char b[200];
    return lt_fail(LT_ERR_ARG, "%s: dim %d is out of range for a %d-dim tensor of shape %s", op,
                   dim + 1, t->ndim, lt_tensor_shape_str(t, b));
  }
  return LT_OK;
}

static lt_index_report index_report(const char *op, lt_report_kind kind, const lt_tensor *index, int dim,
                                    const lt_tensor *t) {
  lt_index_report r;
  memset(&r, 0, sizeof r);
  r.kind = kind;
  r.op = op;
  r.dim = dim;
  r.limit = t->sizes[dim];
  lt_tensor_shape_str(t, r.shape);
  r.index = (lt_tensor *)index;
  return r;
}

/* Reports the first out-of-range index in row-major order (the kernel found
   one; its own position follows its iteration order). */
static lt_status bad_index(const char *op, lt_report_kind kind, const lt_tensor *index, int dim, const lt_tensor *t) {
  int64_t n = lt_tensor_numel(index), pos = -1, limit = t->sizes[dim];
  double v = 0, *vals = malloc(sizeof(double) * (size_t)(n > 0 ? n : 1));
  lt_status st = vals ? lt_tensor_to_f64(index, vals, n) : lt_fail(LT_ERR_OOM, "%s: out of host memory", op);
  for (int64_t i = 0; st == LT_OK && i < n && pos < 0; i++)
    if (vals[i] < 0 || vals[i] >= (double)limit) {
      pos = i;
      v = vals[i];
    }
  free(vals);
  if (st != LT_OK) /* (the read reported an earlier op's deferred check, or memory ran out) */
    return st;
  lt_index_report r = index_report(op, kind, index, dim, t);
  return lt_index_report_fail(&r, pos, (int64_t)v);
}

/* After an index kernel of a backend that checks later (*bad ==
   LT_BAD_LATER): hands it the report, with a reference to the index. */
lt_status lt_index_defer(const lt_backend_i *be, const lt_index_report *r) {
  lt_index_report own = *r;
  lt_tensor_retain(own.index);
  own.release = lt_tensor_release; /* (the backend lets go of it, knowing nothing of tensors) */
  lt_status st = be->defer_index_report(&own);
  if (st != LT_OK)
    lt_tensor_release(own.index);
  return st;
}

/* The status of a 1-D index kernel: a bad position found now, one to be
   found later, or none. */
static lt_status index_checked(const lt_backend_i *be, lt_status st, int64_t bad, const char *op,
                               lt_report_kind kind, const lt_tensor *index, int dim, const lt_tensor *t) {
  if (st == LT_OK && bad == LT_BAD_LATER) {
    lt_index_report r = index_report(op, kind, index, dim, t);
    return lt_index_defer(be, &r);
  }
  if (st != LT_OK && bad >= 0)
    return bad_index(op, kind, index, dim, t);
  return st;
}

/* The index itself, or a copy when it lives in the storage an in-place op
   writes (its values would change under the kernel after being checked). */
static lt_status index_apart(const lt_tensor *t, const lt_tensor *index, lt_tensor **idx) {
  if (index->storage == t->storage)
    return lt_op_tensor_clone(index, idx);
  lt_tensor_retain((lt_tensor *)index);
  *idx = (lt_tensor *)index;
  return LT_OK;
}

static void outer_inner(const lt_tensor *t, int dim, int64_t *outer, int64_t *inner) {
  *outer = 1;
  *inner = 1;
  for (int d = 0; d < dim; d++)
    *outer *= t->sizes[d];
  for (int d = dim + 1; d < t->ndim; d++)
    *inner *= t->sizes[d];
}

/* index_select under the name op (errors and deferred reports name it) */
static lt_status index_select_as(const char *op, lt_report_kind kind, const lt_tensor *t, int dim,
                                 const lt_tensor *index, lt_tensor **res) {
  const lt_tensor *ins[2] = {t, index};
  static const char *const embedding_names[2] = {"weight", "ids"}, *const select_names[2] = {"input", "index"};
  const lt_backend_i *be;
  LT_OP_SCOPE(op);
  LT_TRY(lt_same_device_named(op, 2, ins, kind == LT_REPORT_IDS ? embedding_names : select_names, &be));
  LT_TRY(check_dim(op, t, dim));
  LT_TRY(check_index_dtype(op, index));
  if (index->ndim != 1) {
    char b[200];
    return lt_fail(LT_ERR_SHAPE, "%s: the index must be 1-D, got shape %s", op, lt_tensor_shape_str(index, b));
  }
  if (!be->index_select)
    return lt_fail(LT_ERR_UNSUPPORTED, "%s: not implemented on the %s backend", op, be->name);
  int64_t sizes[LT_MAX_DIMS];
  memcpy(sizes, t->sizes, sizeof sizes);
  sizes[dim] = index->sizes[0];
  lt_tensor *src = NULL, *r = NULL;
  LT_TRY(lt_op_tensor_contiguous((lt_tensor *)t, &src));
  lt_status st = lt_tensor_empty(t->ndim, sizes, t->dtype, t->storage->device, &r);
  if (st == LT_OK) {
    lt_index_desc d = {0};
    outer_inner(t, dim, &d.outer, &d.inner);
    d.src_dim = t->sizes[dim];
    d.dst_dim = sizes[dim];
    d.nindex = index->sizes[0];
    d.index = lt_tensor_ptr(index);
    d.index_dtype = index->dtype;
    d.index_stride = index->strides[0];
    int64_t bad = -1;
    st = be->index_select(&d, lt_tensor_ptr(r), lt_tensor_ptr(src), lt_dtype_size(t->dtype), &bad);
    st = index_checked(be, st, bad, op, kind, index, dim, t);
  }
  lt_tensor_release(src);
  if (st != LT_OK) {
    lt_tensor_release(r);
    return st;
  }
  *res = r;
  return LT_OK;
}

lt_status lt_op_index_select(const lt_tensor *t, int dim, const lt_tensor *index, lt_tensor **res) {
  return index_select_as("index_select", LT_REPORT_INDEX, t, dim, index, res);
}

lt_status lt_op_embedding(const lt_tensor *weight, const lt_tensor *ids, lt_tensor **res) {
  LT_TRY(lt_check_tensor("embedding", weight, 1));
  if (weight->ndim != 2) {
    char b[200];
    return lt_fail(LT_ERR_SHAPE, "embedding: the weight must be (V, C), got shape %s", lt_tensor_shape_str(weight, b));
  }
  return index_select_as("embedding", LT_REPORT_IDS, weight, 0, ids, res);
}

lt_status lt_op_index_add_guarded(lt_tensor *t, int dim, const lt_tensor *index, const lt_tensor *src,
                                  lt_write_guard guard) {
  const lt_tensor *ins[3] = {t, index, src};
  const lt_backend_i *be;
  char b1[200], b2[200];
  static const char *const names[3] = {"self", "index", "source"};
  LT_OP_SCOPE("index_add_");
  LT_TRY(lt_same_device_named("index_add_", 3, ins, names, &be));
  LT_TRY(check_dim("index_add_", t, dim));
  LT_TRY(check_index_dtype("index_add_", index));
  if (index->ndim != 1)
    return lt_fail(LT_ERR_SHAPE, "index_add_: the index must be 1-D, got shape %s",
                   lt_tensor_shape_str(index, b1));
  int ok = src->ndim == t->ndim;
  for (int d = 0; ok && d < t->ndim; d++)
    ok = src->sizes[d] == (d == dim ? index->sizes[0] : t->sizes[d]);
  if (!ok)
    return lt_fail(LT_ERR_SHAPE,
                   "index_add_: source shape %s does not match the target %s with dim %d sized "
                   "as the index (%lld)", lt_tensor_shape_str(src, b1), lt_tensor_shape_str(t, b2),
                   dim + 1, (long long)index->sizes[0]);
  if (src->dtype != t->dtype)
    return lt_fail(LT_ERR_DTYPE, "index_add_: source dtype %s differs from the target's %s",
                   lt_dtype_name(src->dtype), lt_dtype_name(t->dtype));
  if (!be->index_add)
    return lt_fail(LT_ERR_UNSUPPORTED, "index_add_: not implemented on the %s backend", be->name);
  if (guard)
    LT_TRY(guard("index_add_", t, 1, &src));
  for (int d = 0; d < t->ndim && lt_tensor_numel(t) > 0; d++)
    if (t->strides[d] == 0 && t->sizes[d] > 1)
      return lt_fail(LT_ERR_ARG, "index_add_: cannot write into an expanded tensor; clone() it first");
  lt_tensor *s = NULL, *dst = NULL, *idx = NULL;
  lt_status st = index_apart(t, index, &idx);
  if (st == LT_OK)
    st = lt_op_tensor_clone(src, &s); /* contiguous, and never aliasing t */
  if (st == LT_OK)
    st = lt_op_tensor_contiguous(t, &dst);
  if (st == LT_OK) {
    lt_index_desc d = {0};
    outer_inner(t, dim, &d.outer, &d.inner);
    d.src_dim = index->sizes[0];
    d.dst_dim = t->sizes[dim];
    d.nindex = index->sizes[0];
    d.index = lt_tensor_ptr(idx);
    d.index_dtype = idx->dtype;
    d.index_stride = idx->strides[0];
    int64_t bad = -1;
    st = be->index_add(&d, lt_tensor_ptr(dst), lt_tensor_ptr(s), t->dtype, &bad);
    st = index_checked(be, st, bad, "index_add_", LT_REPORT_INDEX, idx, dim, t);
    if (st == LT_OK && dst != t)
      st = lt_op_tensor_copy_(t, dst);
    if (st == LT_OK)
      lt_bump_version(t);
  }
  lt_tensor_release(s);
  lt_tensor_release(dst);
  lt_tensor_release(idx);
  return st;
}

lt_status lt_op_index_add_(lt_tensor *t, int dim, const lt_tensor *index, const lt_tensor *src) {
  return lt_op_index_add_guarded(t, dim, index, src, NULL);
}

/* Checks index against t for gather/scatter: same ndim, index no larger
   outside dim (and than other, when given). */
static lt_status check_gather_shapes(const char *op, const lt_tensor *t, int dim,
                                     const lt_tensor *index, const lt_tensor *other) {
  char b1[200], b2[200];
  if (index->ndim != t->ndim)
    return lt_fail(LT_ERR_SHAPE, "%s: the index (shape %s) must have as many dims as the tensor (shape %s)",
                   op, lt_tensor_shape_str(index, b1), lt_tensor_shape_str(t, b2));
  for (int d = 0; d < t->ndim; d++) {
    if (d != dim && index->sizes[d] > t->sizes[d])
      return lt_fail(LT_ERR_SHAPE, "%s: index shape %s is larger than the tensor's %s in dim %d",
                     op, lt_tensor_shape_str(index, b1), lt_tensor_shape_str(t, b2), d + 1);
    if (other && index->sizes[d] > other->sizes[d])
      return lt_fail(LT_ERR_SHAPE, "%s: index shape %s is larger than the source's %s in dim %d",
                     op, lt_tensor_shape_str(index, b1), lt_tensor_shape_str(other, b2), d + 1);
  }
  return LT_OK;
}

/* A header viewing t (or src) restricted to the index's shape; dim's stride
   zeroed when zero_dim (the kernel adds index * real stride). */
static void restricted_view(lt_tensor *v, const lt_tensor *t, const lt_tensor *index, int dim, int zero_dim) {
  *v = *t;
  for (int d = 0; d < t->ndim; d++) {
    v->sizes[d] = index->sizes[d];
    if (zero_dim && d == dim)
      v->strides[d] = 0;
  }
}

lt_status lt_op_gather(const lt_tensor *t, int dim, const lt_tensor *index, lt_tensor **res) {
  const lt_tensor *ins[2] = {t, index};
  const lt_backend_i *be;
  static const char *const names[2] = {"input", "index"};
  LT_OP_SCOPE("gather");
  LT_TRY(lt_same_device_named("gather", 2, ins, names, &be));
  LT_TRY(check_dim("gather", t, dim));
  LT_TRY(check_index_dtype("gather", index));
  LT_TRY(check_gather_shapes("gather", t, dim, index, NULL));
  if (!be->gather)
    return lt_fail(LT_ERR_UNSUPPORTED, "gather: not implemented on the %s backend", be->name);
  lt_tensor *r;
  LT_TRY(lt_tensor_empty(index->ndim, index->sizes, t->dtype, t->storage->device, &r));
  lt_tensor tv;
  restricted_view(&tv, t, index, dim, 1);
  lt_iter it;
  const lt_tensor *ops[3] = {r, index, &tv};
  lt_iter_build(&it, 3, ops);
  int64_t bad = -1;
  lt_status st = be->gather(&it, t->strides[dim], t->sizes[dim], &bad);
  if (st != LT_OK) {
    lt_tensor_release(r);
    if (bad >= 0)
      return bad_index("gather", LT_REPORT_INDEX, index, dim, t);
    return st;
  }
  *res = r;
  return LT_OK;
}

lt_status lt_op_scatter_add_guarded(lt_tensor *t, int dim, const lt_tensor *index, const lt_tensor *src,
                                    lt_write_guard guard) {
  const lt_tensor *ins[3] = {t, index, src};
  const lt_backend_i *be;
  static const char *const names[3] = {"self", "index", "source"};
  LT_OP_SCOPE("scatter_add_");
  LT_TRY(lt_same_device_named("scatter_add_", 3, ins, names, &be));
  LT_TRY(check_dim("scatter_add_", t, dim));
  LT_TRY(check_index_dtype("scatter_add_", index));
  if (src->ndim != t->ndim) {
    char b1[200], b2[200];
    return lt_fail(LT_ERR_SHAPE, "scatter_add_: source shape %s and target shape %s differ in dims",
                   lt_tensor_shape_str(src, b1), lt_tensor_shape_str(t, b2));
  }
  LT_TRY(check_gather_shapes("scatter_add_", t, dim, index, src));
  if (!be->scatter_add)
    return lt_fail(LT_ERR_UNSUPPORTED, "scatter_add_: not implemented on the %s backend", be->name);
  if (guard)
    LT_TRY(guard("scatter_add_", t, 1, &src));
  for (int d = 0; d < t->ndim && lt_tensor_numel(t) > 0; d++)
    if (t->strides[d] == 0 && t->sizes[d] > 1)
      return lt_fail(LT_ERR_ARG, "scatter_add_: cannot write into an expanded tensor; clone() it first");
  lt_tensor *s, *idx = NULL;
  LT_TRY(lt_unalias(t, src, &s));
  lt_status st = index_apart(t, index, &idx);
  if (st != LT_OK) {
    lt_tensor_release(s);
    return st;
  }
  lt_tensor sv, tv;
  restricted_view(&sv, s, idx, dim, 0);
  restricted_view(&tv, t, idx, dim, 1);
  lt_iter it;
  const lt_tensor *ops[3] = {&sv, idx, &tv};
  lt_iter_build(&it, 3, ops);
  int64_t bad = -1;
  st = be->scatter_add(&it, t->strides[dim], t->sizes[dim], &bad);
  lt_tensor_release(s);
  lt_tensor_release(idx);
  if (st == LT_OK)
    lt_bump_version(t);
  if (st != LT_OK && bad >= 0)
    return bad_index("scatter_add_", LT_REPORT_INDEX, index, dim, t);
  return st;
}

lt_status lt_op_scatter_add_(lt_tensor *t, int dim, const lt_tensor *index, const lt_tensor *src) {
  return lt_op_scatter_add_guarded(t, dim, index, src, NULL);
}
