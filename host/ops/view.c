/*
 * ops/view.c: views without autograd (lt_op_tensor_view, _reshape,
 * _transpose, _permute, _narrow, _select, _expand, _squeeze, _unsqueeze,
 * _contiguous, _chunk): the geometry (sizes, strides and offset checked and
 * computed) and a new tensor object on the same storage. Only reshape (when
 * the strides allow no view) and contiguous copy. The public lt_tensor_view
 * etc. (autograd/view.c) call these and record.
 */
#include "ops/ops.h"

#include <inttypes.h>
#include <string.h>

static lt_status view_of(lt_tensor *t, int64_t offset, int ndim, const int64_t *sizes,
                         const int64_t *strides, lt_tensor **out) {
  /* every view op has checked t (check_dim or its own lt_check_tensor) */
  lt_tensor *v = lt_tensor_wrap(t->storage, offset, ndim, sizes, strides, t->dtype);
  if (!v)
    return lt_fail(LT_ERR_OOM, "view: out of host memory for a tensor header");
  *out = v;
  return LT_OK;
}

static lt_status check_dim(const char *op, const lt_tensor *t, int dim, int extra) {
  LT_TRY(lt_check_tensor(op, t, 1));
  if (dim < 0 || dim >= t->ndim + extra) {
    char b[200];
    return lt_fail(LT_ERR_ARG, "%s: dim %d is out of range for a %d-dim tensor of shape %s", op,
                   dim + 1, t->ndim, lt_tensor_shape_str(t, b));
  }
  return LT_OK;
}

/* Resolves one -1 in sizes against numel; checks the product. */
static lt_status infer_sizes(const char *op, const lt_tensor *t, int ndim, const int64_t *sizes,
                             int64_t *resolved) {
  LT_TRY(lt_check_tensor(op, t, 1));
  if (ndim < 0 || ndim > LT_MAX_DIMS)
    return lt_fail(LT_ERR_SHAPE, "%s: %d dims requested, at most %d are supported", op, ndim,
                   LT_MAX_DIMS);
  int64_t numel = lt_tensor_numel(t), known = 1;
  int infer = -1;
  char b1[200], b2[200];
  for (int i = 0; i < ndim; i++) {
    if (sizes[i] == -1) {
      if (infer >= 0)
        return lt_fail(LT_ERR_SHAPE, "%s: only one size may be -1 in %s", op,
                       lt_shape_str(ndim, sizes, b1));
      infer = i;
    } else if (sizes[i] < 0) {
      return lt_fail(LT_ERR_SHAPE, "%s: negative size in %s", op, lt_shape_str(ndim, sizes, b1));
    } else {
      if (sizes[i] > 0 && known > INT64_MAX / sizes[i])
        return lt_fail(LT_ERR_SHAPE, "%s: shape %s has too many elements", op,
                       lt_shape_str(ndim, sizes, b1));
      known *= sizes[i];
    }
    resolved[i] = sizes[i];
  }
  if (infer >= 0) {
    if (known == 0 || numel % known != 0)
      return lt_fail(LT_ERR_SHAPE, "%s: shape %s is invalid for a tensor of %" PRId64
                     " elements (shape %s)", op, lt_shape_str(ndim, sizes, b1), numel,
                     lt_tensor_shape_str(t, b2));
    resolved[infer] = numel / known;
    known *= resolved[infer];
  }
  if (known != numel)
    return lt_fail(LT_ERR_SHAPE, "%s: shape %s is invalid for a tensor of %" PRId64
                   " elements (shape %s)", op, lt_shape_str(ndim, sizes, b1), numel,
                   lt_tensor_shape_str(t, b2));
  return LT_OK;
}

/*
 * Strides for viewing t as new sizes without a copy, or 0 when impossible.
 * Walks groups of old dims that are contiguous among themselves and matches
 * them to runs of new dims with the same element count (as torch's
 * computeStride does).
 */
static int view_strides(const lt_tensor *t, int ndim, const int64_t *sizes, int64_t *strides) {
  int64_t numel = lt_tensor_numel(t);
  if (numel == 0 || t->ndim == 0) {
    lt_contiguous_strides(ndim, sizes, strides);
    return 1;
  }
  int view_d = ndim - 1;
  int64_t chunk_base_stride = t->strides[t->ndim - 1];
  int64_t tensor_numel = 1, view_numel = 1;
  for (int d = t->ndim - 1; d >= 0; d--) {
    tensor_numel *= t->sizes[d];
    if (d == 0 || (t->sizes[d - 1] != 1 && t->strides[d - 1] != tensor_numel * chunk_base_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || sizes[view_d] == 1)) {
        strides[view_d] = view_numel * chunk_base_stride;
        view_numel *= sizes[view_d];
        view_d--;
      }
      if (view_numel != tensor_numel)
        return 0;
      if (d > 0) {
        chunk_base_stride = t->strides[d - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  return view_d == -1;
}

lt_status lt_op_tensor_view(lt_tensor *t, int ndim, const int64_t *sizes, lt_tensor **out) {
  int64_t resolved[LT_MAX_DIMS], strides[LT_MAX_DIMS];
  LT_TRY(infer_sizes("view", t, ndim, sizes, resolved));
  if (!view_strides(t, ndim, resolved, strides)) {
    char b1[200], b2[200], b3[200];
    return lt_fail(LT_ERR_SHAPE,
                   "view: cannot view a tensor of shape %s with strides %s as %s without a copy "
                   "(it is not contiguous); use reshape, which copies, or contiguous() first",
                   lt_tensor_shape_str(t, b1), lt_shape_str(t->ndim, t->strides, b2),
                   lt_shape_str(ndim, resolved, b3));
  }
  return view_of(t, t->offset, ndim, resolved, strides, out);
}

lt_status lt_op_tensor_reshape(lt_tensor *t, int ndim, const int64_t *sizes, lt_tensor **out) {
  int64_t resolved[LT_MAX_DIMS], strides[LT_MAX_DIMS];
  LT_TRY(infer_sizes("reshape", t, ndim, sizes, resolved));
  if (view_strides(t, ndim, resolved, strides))
    return view_of(t, t->offset, ndim, resolved, strides, out);
  lt_tensor *c = NULL;
  lt_status st = lt_op_tensor_clone(t, &c);
  if (st == LT_OK)
    st = lt_op_tensor_view(c, ndim, resolved, out);
  lt_tensor_release(c);
  return st;
}

lt_status lt_op_tensor_transpose(lt_tensor *t, int dim0, int dim1, lt_tensor **out) {
  LT_TRY(check_dim("transpose", t, dim0, 0));
  LT_TRY(check_dim("transpose", t, dim1, 0));
  int64_t sizes[LT_MAX_DIMS], strides[LT_MAX_DIMS];
  memcpy(sizes, t->sizes, sizeof sizes);
  memcpy(strides, t->strides, sizeof strides);
  sizes[dim0] = t->sizes[dim1];
  sizes[dim1] = t->sizes[dim0];
  strides[dim0] = t->strides[dim1];
  strides[dim1] = t->strides[dim0];
  return view_of(t, t->offset, t->ndim, sizes, strides, out);
}

lt_status lt_op_tensor_permute(lt_tensor *t, int ndim, const int64_t *dims, lt_tensor **out) {
  char b[200];
  LT_TRY(lt_check_tensor("permute", t, 1));
  if (ndim != t->ndim)
    return lt_fail(LT_ERR_ARG, "permute: %d dims given for a %d-dim tensor of shape %s", ndim,
                   t->ndim, lt_tensor_shape_str(t, b));
  int seen[LT_MAX_DIMS] = {0};
  int64_t sizes[LT_MAX_DIMS], strides[LT_MAX_DIMS];
  for (int i = 0; i < ndim; i++) {
    if (dims[i] < 0 || dims[i] >= ndim || seen[dims[i]])
      return lt_fail(LT_ERR_ARG, "permute: dims %s are not a permutation of the %d dims of %s",
                     lt_shape_str(ndim, dims, b), ndim, lt_tensor_shape_str(t, (char[200]){0}));
    seen[dims[i]] = 1;
    sizes[i] = t->sizes[dims[i]];
    strides[i] = t->strides[dims[i]];
  }
  return view_of(t, t->offset, ndim, sizes, strides, out);
}

lt_status lt_op_tensor_narrow(lt_tensor *t, int dim, int64_t start, int64_t length, lt_tensor **out) {
  LT_TRY(check_dim("narrow", t, dim, 0));
  if (start < 0 || length < 0 || length > t->sizes[dim] || start > t->sizes[dim] - length) {
    char b[200];
    return lt_fail(LT_ERR_ARG,
                   "narrow: start %" PRId64 " with length %" PRId64 " is out of range for dim %d of size %"
                   PRId64 " (shape %s)", start + 1, length, dim + 1, t->sizes[dim],
                   lt_tensor_shape_str(t, b));
  }
  int64_t sizes[LT_MAX_DIMS];
  memcpy(sizes, t->sizes, sizeof sizes);
  sizes[dim] = length;
  return view_of(t, t->offset + start * t->strides[dim], t->ndim, sizes, t->strides, out);
}

lt_status lt_op_tensor_select(lt_tensor *t, int dim, int64_t index, lt_tensor **out) {
  LT_TRY(check_dim("select", t, dim, 0));
  if (index < 0 || index >= t->sizes[dim]) {
    char b[200];
    return lt_fail(LT_ERR_ARG, "select: index %" PRId64 " is out of range for dim %d of size %"
                   PRId64 " (shape %s)", index + 1, dim + 1, t->sizes[dim],
                   lt_tensor_shape_str(t, b));
  }
  int64_t sizes[LT_MAX_DIMS], strides[LT_MAX_DIMS];
  int n = 0;
  for (int i = 0; i < t->ndim; i++)
    if (i != dim) {
      sizes[n] = t->sizes[i];
      strides[n++] = t->strides[i];
    }
  return view_of(t, t->offset + index * t->strides[dim], n, sizes, strides, out);
}

lt_status lt_op_tensor_expand(lt_tensor *t, int ndim, const int64_t *sizes, lt_tensor **out) {
  char b1[200], b2[200];
  LT_TRY(lt_check_tensor("expand", t, 1));
  if (ndim < t->ndim || ndim > LT_MAX_DIMS)
    return lt_fail(LT_ERR_SHAPE, "expand: cannot expand shape %s to %s (fewer dims)",
                   lt_tensor_shape_str(t, b1), lt_shape_str(ndim, sizes, b2));
  int64_t nsizes[LT_MAX_DIMS], nstrides[LT_MAX_DIMS];
  int lead = ndim - t->ndim;
  for (int i = 0; i < ndim; i++) {
    int j = i - lead;
    int64_t have = j >= 0 ? t->sizes[j] : 1;
    int64_t want = sizes[i] == -1 ? have : sizes[i];
    if (sizes[i] == -1 && j < 0)
      return lt_fail(LT_ERR_SHAPE, "expand: -1 is not allowed for the new leading dim %d in %s",
                     i + 1, lt_shape_str(ndim, sizes, b1));
    if (want < 0 || (have != want && have != 1))
      return lt_fail(LT_ERR_SHAPE,
                     "expand: cannot expand shape %s to %s (dim %d: size %" PRId64 " to %" PRId64
                     "; only size-1 dims expand)", lt_tensor_shape_str(t, b1),
                     lt_shape_str(ndim, sizes, b2), i + 1, have, want);
    nsizes[i] = want;
    nstrides[i] = (j >= 0 && have == want) ? t->strides[j] : 0;
  }
  int64_t numel;
  LT_TRY(lt_check_shape("expand", ndim, nsizes, &numel));
  return view_of(t, t->offset, ndim, nsizes, nstrides, out);
}

lt_status lt_op_tensor_squeeze(lt_tensor *t, int dim, lt_tensor **out) {
  LT_TRY(lt_check_tensor("squeeze", t, 1));
  if (dim != -1)
    LT_TRY(check_dim("squeeze", t, dim, 0));
  int64_t sizes[LT_MAX_DIMS], strides[LT_MAX_DIMS];
  int n = 0;
  for (int i = 0; i < t->ndim; i++) {
    int drop = t->sizes[i] == 1 && (dim == -1 || dim == i);
    if (!drop) {
      sizes[n] = t->sizes[i];
      strides[n++] = t->strides[i];
    }
  }
  return view_of(t, t->offset, n, sizes, strides, out);
}

lt_status lt_op_tensor_unsqueeze(lt_tensor *t, int dim, lt_tensor **out) {
  LT_TRY(check_dim("unsqueeze", t, dim, 1));
  if (t->ndim >= LT_MAX_DIMS)
    return lt_fail(LT_ERR_SHAPE, "unsqueeze: a tensor already has the maximum of %d dims",
                   LT_MAX_DIMS);
  int64_t sizes[LT_MAX_DIMS], strides[LT_MAX_DIMS];
  int n = 0;
  for (int i = 0; i <= t->ndim; i++) {
    if (i == dim) {
      sizes[n] = 1;
      strides[n++] = i < t->ndim ? t->sizes[i] * t->strides[i] : 1;
    }
    if (i < t->ndim) {
      sizes[n] = t->sizes[i];
      strides[n++] = t->strides[i];
    }
  }
  return view_of(t, t->offset, n, sizes, strides, out);
}

lt_status lt_op_tensor_contiguous(lt_tensor *t, lt_tensor **out) {
  LT_OP_SCOPE("contiguous");
  LT_TRY(lt_check_tensor("contiguous", t, 1));
  if (lt_tensor_is_contiguous(t)) {
    lt_tensor_retain(t);
    *out = t;
    return LT_OK;
  }
  return lt_op_tensor_clone(t, out);
}


lt_status lt_op_tensor_chunk(lt_tensor *t, int n, int dim, lt_tensor **outs) {
  LT_TRY(lt_check_tensor("chunk", t, 1));
  char b[200];
  if (dim < 0 || dim >= t->ndim)
    return lt_fail(LT_ERR_ARG, "chunk: dim %d is out of range for shape %s", dim + 1, lt_tensor_shape_str(t, b));
  if (n < 1 || n > LT_CHUNK_MAX)
    return lt_fail(LT_ERR_ARG, "chunk: %d pieces; between 1 and %d are taken (narrow makes more)", n,
                   LT_CHUNK_MAX);
  if (t->sizes[dim] % n)
    return lt_fail(LT_ERR_SHAPE, "chunk: dim %d of shape %s does not split into %d equal pieces", dim + 1,
                   lt_tensor_shape_str(t, b), n);
  int64_t piece = t->sizes[dim] / n;
  lt_status st = LT_OK;
  int made = 0; /* views made so far */
  while (made < n && st == LT_OK)
    if ((st = lt_op_tensor_narrow(t, dim, made * piece, piece, &outs[made])) == LT_OK)
      made++;
  if (st != LT_OK)
    for (int j = 0; j < made; j++) {
      lt_tensor_release(outs[j]);
      outs[j] = NULL;
    }
  return st;
}
