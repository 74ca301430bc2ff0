/*
 * core/tensor.c: tensor and storage objects (reference counts, accessors,
 * shape checks and strings), uninitialised creation (lt_tensor_empty), and
 * dropping a storage's data (ZeRO-3).
 *
 * Relies on the backend vtable for memory (lt_backend_for). Creation with
 * values is in ops/create.c, views in ops/view.c (recorded by
 * autograd/view.c). A tensor's autograd metadata is freed through the
 * function it starts with (lt_meta_free_fn): core knows nothing of autograd.
 */
#include "base/status.h"
#include "core/tensor-impl.h"

#include <inttypes.h>

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

lt_status lt_check_whole_storage(const char *op, const lt_tensor *t) {
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
  LT_TRY(lt_check_whole_storage("drop_data", t));
  lt_storage *s = t->storage;
  if (s->data)
    s->backend->free(s->device, s->data, s->nbytes);
  s->data = NULL;
  return LT_OK;
}

lt_status lt_storage_realloc(const char *op, lt_storage *s) {
  if (!s->data && s->nbytes > 0) {
    __atomic_add_fetch(&alloc_pressure, (int64_t)s->nbytes, __ATOMIC_RELAXED);
    lt_status st = s->backend->alloc(s->device, s->nbytes, &s->data);
    if (st != LT_OK) {
      s->data = NULL;
      return lt_fail_prefix(st, op);
    }
  }
  return LT_OK;
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

lt_status lt_check_shape(const char *op, int ndim, const int64_t *sizes, int64_t *numel) {
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
  LT_TRY(lt_check_shape(op, ndim, sizes, &numel));
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
