/*
 * tensor.c: tensor and storage objects (reference counts, accessors),
 * creation, and views that share storage (view, reshape, transpose, permute,
 * narrow, select, expand, squeeze, unsqueeze).
 *
 * Relies on the backend vtable for memory (lt_backend_for) and on ops.c for
 * the copies that reshape and contiguous fall back to.
 */
#include "autograd/autograd.h"
#include "autograd/grad-ops.h"
#include "base/status.h"
#include "core/tensor-impl.h"

#include <inttypes.h>
#include <math.h>
#include <string.h>

/* ---- reference counts ---------------------------------------------------- */

static int64_t alloc_pressure; /* bytes allocated since lt_take_alloc_pressure */

int64_t lt_take_alloc_pressure(void) {
  return __atomic_exchange_n(&alloc_pressure, 0, __ATOMIC_RELAXED);
}

void lt_storage_release(lt_storage *s) {
  if (!s)
    return;
  if (__atomic_sub_fetch(&s->refcount, 1, __ATOMIC_ACQ_REL) == 0) {
    if (s->data)
      s->backend->free(s->device, s->data, s->nbytes);
    free(s);
  }
}

lt_status lt_check_tensor_header(const char *op, const lt_tensor *t, int pos) {
  if (!t)
    return lt_fail(LT_ERR_ARG, "%s: argument %d is nil, expected a tensor", op, pos);
  if (!t->storage)
    return lt_fail(LT_ERR_ARG, "%s: argument %d is a tensor that was freed with :free()", op, pos);
  return LT_OK;
}

lt_status lt_check_tensor(const char *op, const lt_tensor *t, int pos) {
  if (!t)
    return lt_fail(LT_ERR_ARG, "%s: argument %d is nil, expected a tensor", op, pos);
  if (!t->storage)
    return lt_fail(LT_ERR_ARG, "%s: argument %d is a tensor that was freed with :free()", op, pos);
  if (!t->storage->data && t->storage->nbytes > 0)
    return lt_fail(LT_ERR_ARG,
                   "%s: argument %d has no data: its memory was dropped (t:drop_data_()); a ZeRO-3 parameter "
                   "is gathered only around its module's forward and backward: opt:unshard() gathers them all",
                   op, pos);
  return LT_OK;
}

/* ---- dropped data (sharded parameters) --------------------------------------------- */

static lt_status check_whole_storage(const char *op, const lt_tensor *t) {
  if (!t || !t->storage)
    return lt_check_tensor(op, t, 1);
  if (t->offset != 0 || !lt_tensor_is_contiguous(t) ||
      (size_t)lt_tensor_numel(t) * (size_t)lt_dtype_size(t->dtype) != t->storage->nbytes) {
    char b[200];
    return lt_fail(LT_ERR_ARG, "%s: the tensor (shape %s) must span its whole storage: a parameter, not a view", op,
                   lt_tensor_shape_str(t, b));
  }
  return LT_OK;
}

int lt_tensor_has_data(const lt_tensor *t) {
  return t && t->storage && (t->storage->data || t->storage->nbytes == 0);
}

lt_status lt_tensor_drop_data(lt_tensor *t) {
  LT_TRY(check_whole_storage("drop_data", t));
  lt_storage *s = t->storage;
  if (s->data)
    s->backend->free(s->device, s->data, s->nbytes);
  s->data = NULL;
  return LT_OK;
}

lt_status lt_tensor_restore_data(lt_tensor *t, const lt_tensor *src) {
  LT_TRY(check_whole_storage("restore_data", t));
  LT_TRY(lt_check_tensor("restore_data", src, 2));
  if (lt_tensor_numel(src) != lt_tensor_numel(t)) {
    char b1[200], b2[200];
    return lt_fail(LT_ERR_SHAPE, "restore_data: the source has %lld elements (shape %s), the tensor %lld (shape %s)",
                   (long long)lt_tensor_numel(src), lt_tensor_shape_str(src, b1), (long long)lt_tensor_numel(t),
                   lt_tensor_shape_str(t, b2));
  }
  lt_storage *s = t->storage;
  if (!s->data && s->nbytes > 0) {
    __atomic_add_fetch(&alloc_pressure, (int64_t)s->nbytes, __ATOMIC_RELAXED);
    lt_status st = s->backend->alloc(s->device, s->nbytes, &s->data);
    if (st != LT_OK) {
      s->data = NULL;
      return lt_fail_prefix(st, "restore_data");
    }
  }
  uint64_t version = s->version;
  int64_t strides[LT_MAX_DIMS];
  lt_contiguous_strides(src->ndim, src->sizes, strides);
  lt_tensor *flat = lt_tensor_wrap(s, 0, src->ndim, src->sizes, strides, t->dtype);
  lt_status st = LT_OK;
  if (!flat)
    st = lt_fail(LT_ERR_OOM, "restore_data: out of host memory");
  else
    LT_NO_GRAD(st = lt_tensor_copy_(flat, src));
  lt_tensor_release(flat);
  s->version = version;
  return st;
}

void lt_tensor_free_data(lt_tensor *t) {
  if (!t || !t->storage || __atomic_load_n(&t->refcount, __ATOMIC_ACQUIRE) != 1)
    return; /* nil, already freed, or still held elsewhere (then its owner frees it) */
  lt_storage_release(t->storage);
  t->storage = NULL;
  t->ndim = 0;
}

void lt_tensor_retain(lt_tensor *t) {
  if (t)
    __atomic_add_fetch(&t->refcount, 1, __ATOMIC_RELAXED);
}

void lt_tensor_release(lt_tensor *t) {
  if (!t)
    return;
  if (__atomic_sub_fetch(&t->refcount, 1, __ATOMIC_ACQ_REL) == 0) {
    if (t->autograd)
      (*(lt_meta_free_fn *)t->autograd)(t);
    lt_storage_release(t->storage);
    free(t);
  }
}

lt_tensor *lt_tensor_wrap(lt_storage *s, int64_t offset, int ndim, const int64_t *sizes,
                          const int64_t *strides, lt_dtype dtype) {
  lt_tensor *t = malloc(sizeof *t);
  if (!t)
    return NULL;
  __atomic_add_fetch(&alloc_pressure, (int64_t)sizeof *t, __ATOMIC_RELAXED);
  t->refcount = 1;
  t->storage = s;
  __atomic_add_fetch(&s->refcount, 1, __ATOMIC_RELAXED);
  t->offset = offset;
  t->ndim = ndim;
  t->dtype = dtype;
  for (int i = 0; i < ndim; i++) {
    t->sizes[i] = sizes[i];
    t->strides[i] = strides[i];
  }
  t->autograd = NULL;
  return t;
}

/* ---- accessors ------------------------------------------------------------- */

/* Accessors answer for nil and freed tensors too (as a 0-dim f32 on no
   device) so that a bad argument reaches an op's check instead of crashing. */
int lt_tensor_ndim(const lt_tensor *t) { return t ? t->ndim : 0; }
int64_t lt_tensor_size(const lt_tensor *t, int dim) {
  return (t && dim >= 0 && dim < t->ndim) ? t->sizes[dim] : 1;
}
int64_t lt_tensor_stride(const lt_tensor *t, int dim) {
  return (t && dim >= 0 && dim < t->ndim) ? t->strides[dim] : 1;
}
int64_t lt_tensor_offset(const lt_tensor *t) { return t ? t->offset : 0; }
lt_dtype lt_tensor_dtype(const lt_tensor *t) { return t ? t->dtype : LT_DTYPE_F32; }
lt_device lt_tensor_device(const lt_tensor *t) { return t && t->storage ? t->storage->device : -1; }

int64_t lt_tensor_numel(const lt_tensor *t) {
  if (!t)
    return 0;
  int64_t n = 1;
  for (int i = 0; i < t->ndim; i++)
    n *= t->sizes[i];
  return n;
}

int lt_tensor_is_contiguous(const lt_tensor *t) {
  if (!t)
    return 0;
  int64_t expected = 1;
  for (int i = t->ndim - 1; i >= 0; i--) {
    if (t->sizes[i] == 0)
      return 1;
    if (t->sizes[i] != 1 && t->strides[i] != expected)
      return 0;
    expected *= t->sizes[i];
  }
  return 1;
}

int lt_tensor_same_storage(const lt_tensor *a, const lt_tensor *b) {
  return a && b && a->storage && a->storage == b->storage;
}

void *lt_tensor_data(const lt_tensor *t) {
  if (!t || !t->storage || t->storage->device != LT_DEVICE_CPU || !t->storage->data)
    return NULL;
  return lt_tensor_ptr(t);
}

const char *lt_shape_str(int ndim, const int64_t *sizes, char *buf) {
  int n = 0;
  n += snprintf(buf + n, 200 - n, "[");
  for (int i = 0; i < ndim && n < 190; i++)
    n += snprintf(buf + n, 200 - n, i ? ", %" PRId64 : "%" PRId64, sizes[i]);
  snprintf(buf + n, 200 - n, "]");
  return buf;
}

const char *lt_tensor_shape_str(const lt_tensor *t, char *buf) {
  if (!t) {
    snprintf(buf, 200, "(nil)");
    return buf;
  }
  return lt_shape_str(t->ndim, t->sizes, buf);
}

int64_t lt_contiguous_strides(int ndim, const int64_t *sizes, int64_t *strides) {
  int64_t n = 1;
  for (int i = ndim - 1; i >= 0; i--) {
    strides[i] = n;
    n *= sizes[i];
  }
  return n;
}

/* ---- creation -------------------------------------------------------------- */

static lt_status check_shape(const char *op, int ndim, const int64_t *sizes, int64_t *numel) {
  if (ndim < 0 || ndim > LT_MAX_DIMS)
    return lt_fail(LT_ERR_SHAPE, "%s: %d dims requested, at most %d are supported", op, ndim,
                   LT_MAX_DIMS);
  int64_t n = 1;
  for (int i = 0; i < ndim; i++) {
    if (sizes[i] < 0) {
      char b[200];
      return lt_fail(LT_ERR_SHAPE, "%s: negative size %" PRId64 " in shape %s", op, sizes[i],
                     lt_shape_str(ndim, sizes, b));
    }
    if (sizes[i] > 0 && n > INT64_MAX / 16 / sizes[i]) {
      char b[200];
      return lt_fail(LT_ERR_SHAPE, "%s: shape %s has too many elements", op,
                     lt_shape_str(ndim, sizes, b));
    }
    n *= sizes[i];
  }
  *numel = n;
  return LT_OK;
}

lt_status lt_tensor_empty_as(const char *op, int ndim, const int64_t *sizes, lt_dtype dtype, lt_device device,
                             lt_tensor **out) {
  int64_t numel = 0;
  LT_TRY(check_shape(op, ndim, sizes, &numel));
  if ((unsigned)dtype >= LT_DTYPE_COUNT)
    return lt_fail(LT_ERR_DTYPE, "%s: invalid dtype code %d", op, (int)dtype);
  const lt_backend_i *be = lt_backend_for(device);
  if (!be) {
    char b[16];
    return lt_fail(LT_ERR_DEVICE, "%s: device %s is not available (%s)", op, lt_device_name(device, b),
                   device >= LT_DEVICE_CUDA ? "lutra was built without CUDA (CUDA=0)" : "unknown device");
  }
  lt_storage *s = malloc(sizeof *s);
  if (!s)
    return lt_fail(LT_ERR_OOM, "%s: out of host memory for a storage header", op);
  size_t nbytes = (size_t)numel * (size_t)lt_dtype_size(dtype);
  s->refcount = 0;
  s->version = 0;
  s->nbytes = nbytes;
  s->device = device;
  s->backend = be;
  s->data = NULL;
  __atomic_add_fetch(&alloc_pressure, (int64_t)(nbytes + sizeof *s), __ATOMIC_RELAXED);
  lt_status st = be->alloc(device, nbytes, &s->data);
  if (st != LT_OK) {
    free(s);
    return lt_fail_prefix(st, op);
  }
  int64_t strides[LT_MAX_DIMS];
  lt_contiguous_strides(ndim, sizes, strides);
  lt_tensor *t = lt_tensor_wrap(s, 0, ndim, sizes, strides, dtype);
  if (!t) {
    be->free(device, s->data, nbytes);
    free(s);
    return lt_fail(LT_ERR_OOM, "%s: out of host memory for a tensor header", op);
  }
  *out = t;
  return LT_OK;
}

lt_status lt_tensor_empty(int ndim, const int64_t *sizes, lt_dtype dtype, lt_device device, lt_tensor **out) {
  return lt_tensor_empty_as("empty", ndim, sizes, dtype, device, out);
}

lt_status lt_tensor_empty_like(const lt_tensor *t, lt_dtype dtype, lt_tensor **out) {
  LT_TRY(lt_check_tensor("empty_like", t, 1));
  return lt_tensor_empty(t->ndim, t->sizes, dtype, t->storage->device, out);
}

lt_status lt_tensor_full(int ndim, const int64_t *sizes, double value, lt_dtype dtype,
                         lt_device device, lt_tensor **out) {
  lt_tensor *t;
  LT_TRY(lt_tensor_empty(ndim, sizes, dtype, device, &t));
  lt_status st = lt_tensor_fill_(t, value);
  if (st != LT_OK) {
    lt_tensor_release(t);
    return st;
  }
  *out = t;
  return LT_OK;
}

/* ---- views --------------------------------------------------------------- */

static lt_status view_of(lt_tensor *t, int64_t offset, int ndim, const int64_t *sizes,
                         const int64_t *strides, lt_tensor **out) {
  /* every view op has checked t (check_dim or its own lt_check_tensor) */
  lt_tensor *v = lt_tensor_wrap(t->storage, offset, ndim, sizes, strides, t->dtype);
  if (!v)
    return lt_fail(LT_ERR_OOM, "view: out of host memory for a tensor header");
  *out = v;
  return LT_OK;
}

/* Records a view op on the tape when st is OK (releasing *out if that fails). */
static lt_status recorded(lt_status st, lt_view_kind kind, lt_tensor *t, lt_tensor **out,
                          const int64_t *args, int nargs) {
  if (st != LT_OK)
    return st;
  st = lt_ag_record_view(kind, t, *out, args, nargs);
  if (st != LT_OK)
    lt_tensor_release(*out);
  return st;
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

lt_status lt_tensor_view(lt_tensor *t, int ndim, const int64_t *sizes, lt_tensor **out) {
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
  return recorded(view_of(t, t->offset, ndim, resolved, strides, out), LT_VIEW_RESHAPE, t, out, NULL, 0);
}

lt_status lt_tensor_reshape(lt_tensor *t, int ndim, const int64_t *sizes, lt_tensor **out) {
  int64_t resolved[LT_MAX_DIMS], strides[LT_MAX_DIMS];
  LT_TRY(infer_sizes("reshape", t, ndim, sizes, resolved));
  if (view_strides(t, ndim, resolved, strides))
    return recorded(view_of(t, t->offset, ndim, resolved, strides, out), LT_VIEW_RESHAPE, t, out, NULL, 0);
  lt_tensor *c = NULL;
  lt_status st;
  LT_NO_GRAD(st = lt_tensor_clone(t, &c); if (st == LT_OK) st = lt_tensor_view(c, ndim, resolved, out));
  lt_tensor_release(c);
  return recorded(st, LT_VIEW_RESHAPE, t, out, NULL, 0);
}

lt_status lt_tensor_transpose(lt_tensor *t, int dim0, int dim1, lt_tensor **out) {
  LT_TRY(check_dim("transpose", t, dim0, 0));
  LT_TRY(check_dim("transpose", t, dim1, 0));
  int64_t sizes[LT_MAX_DIMS], strides[LT_MAX_DIMS];
  memcpy(sizes, t->sizes, sizeof sizes);
  memcpy(strides, t->strides, sizeof strides);
  sizes[dim0] = t->sizes[dim1];
  sizes[dim1] = t->sizes[dim0];
  strides[dim0] = t->strides[dim1];
  strides[dim1] = t->strides[dim0];
  int64_t args[2] = {dim0, dim1};
  return recorded(view_of(t, t->offset, t->ndim, sizes, strides, out), LT_VIEW_TRANSPOSE, t, out, args, 2);
}

lt_status lt_tensor_permute(lt_tensor *t, int ndim, const int64_t *dims, lt_tensor **out) {
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
  return recorded(view_of(t, t->offset, ndim, sizes, strides, out), LT_VIEW_PERMUTE, t, out, dims, ndim);
}

lt_status lt_tensor_narrow(lt_tensor *t, int dim, int64_t start, int64_t length, lt_tensor **out) {
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
  int64_t args[3] = {dim, start, length};
  return recorded(view_of(t, t->offset + start * t->strides[dim], t->ndim, sizes, t->strides, out),
                  LT_VIEW_NARROW, t, out, args, 3);
}

lt_status lt_tensor_select(lt_tensor *t, int dim, int64_t index, lt_tensor **out) {
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
  int64_t args[2] = {dim, index};
  return recorded(view_of(t, t->offset + index * t->strides[dim], n, sizes, strides, out), LT_VIEW_SELECT,
                  t, out, args, 2);
}

lt_status lt_tensor_expand(lt_tensor *t, int ndim, const int64_t *sizes, lt_tensor **out) {
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
  LT_TRY(check_shape("expand", ndim, nsizes, &numel));
  return recorded(view_of(t, t->offset, ndim, nsizes, nstrides, out), LT_VIEW_EXPAND, t, out, NULL, 0);
}

lt_status lt_tensor_squeeze(lt_tensor *t, int dim, lt_tensor **out) {
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
  return recorded(view_of(t, t->offset, n, sizes, strides, out), LT_VIEW_RESHAPE, t, out, NULL, 0);
}

lt_status lt_tensor_unsqueeze(lt_tensor *t, int dim, lt_tensor **out) {
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
  return recorded(view_of(t, t->offset, n, sizes, strides, out), LT_VIEW_RESHAPE, t, out, NULL, 0);
}

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

lt_status lt_tensor_arange(double start, double end, double step, lt_dtype dtype, lt_device device,
                           lt_tensor **out) {
  if (step == 0 || step != step || start != start || end != end)
    return lt_fail(LT_ERR_ARG, "arange: step must be a nonzero number and bounds must not be NaN "
                   "(start %g, end %g, step %g)", start, end, step);
  double count = ceil((end - start) / step);
  if (count < 0)
    count = 0;
  if (count > 1e12)
    return lt_fail(LT_ERR_ARG, "arange: %g elements from start %g, end %g, step %g is too many",
                   count, start, end, step);
  int64_t n = (int64_t)count;
  double *vals = malloc(sizeof(double) * (size_t)(n > 0 ? n : 1));
  if (!vals)
    return lt_fail(LT_ERR_OOM, "arange: out of host memory for %lld values", (long long)n);
  for (int64_t i = 0; i < n; i++)
    vals[i] = start + (double)i * step;
  lt_status st = lt_tensor_from_f64(vals, 1, &n, dtype, device, out);
  free(vals);
  return st;
}
