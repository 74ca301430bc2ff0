/*
 * core/tensor-impl.h: layouts the FFI never sees: storages and tensors, the
 * device-to-backend map, and the helpers the host's layers share on them.
 *
 * Relies on lutra.h for the public enums, on backend/backend.h for the
 * backend vtable a storage points to, and through it on kernels/kernel.h
 * for the descriptors the host builds for kernels (lt_iter, ...). Kernels
 * and backends do not include this header.
 */
#ifndef LUTRA_TENSOR_IMPL_H
#define LUTRA_TENSOR_IMPL_H

#include "backend/backend.h"
#include "lutra.h"

#include <stdbool.h>

/* A reference-counted block of memory on one device. */
typedef struct lt_storage {
  int64_t refcount;
  uint64_t version; /* bumped by every in-place write: autograd checks saved tensors */
  void *data;
  size_t nbytes;
  lt_device device;
  const struct lt_backend_i *backend;
} lt_storage;

/* A view: shape, strides (in elements) and offset into a storage. */
struct lt_tensor {
  int64_t refcount;
  lt_storage *storage;
  int64_t offset;
  int ndim;
  lt_dtype dtype;
  int64_t sizes[LT_MAX_DIMS];
  int64_t strides[LT_MAX_DIMS];
  void *autograd; /* autograd's metadata, NULL for none; it starts with an lt_meta_free_fn */
};

/* How lt_tensor_release frees t's metadata: the first member of what
   t->autograd points at (autograd/autograd.h's lt_autograd_meta). */
typedef void (*lt_meta_free_fn)(lt_tensor *t);

/* (An index check a backend finishes later: lt_index_report, LT_BAD_LATER
   and lt_index_report_fail are backend/index-report.h's.) */
/* Hands r to the backend (retaining r->index for it), after a kernel of it
   set *bad to LT_BAD_LATER. */
lt_status lt_index_defer(const struct lt_backend_i *be, const lt_index_report *r);

/* The backend serving a device, or NULL when it is absent in this build. */
const lt_backend_i *lt_backend_for(lt_device device);

/* Fails when t is NULL (nil from Lua), was freed with lt_tensor_free_data or
   its data was dropped (lt_tensor_drop_data);
   pos is the argument's 1-based position for the message. */
lt_status lt_check_tensor(const char *op, const lt_tensor *t, int pos);
/* As lt_check_tensor, but a tensor whose data was dropped (lt_tensor_drop_data)
   passes: for operations on its autograd metadata only. */
lt_status lt_check_tensor_header(const char *op, const lt_tensor *t, int pos);

static inline char *lt_tensor_ptr(const lt_tensor *t) {
  return (char *)t->storage->data + t->offset * lt_dtype_size(t->dtype);
}

/* Allocates a tensor object (refcount 1) viewing storage s (retained). */
lt_tensor *lt_tensor_wrap(lt_storage *s, int64_t offset, int ndim, const int64_t *sizes,
                          const int64_t *strides, lt_dtype dtype);
void lt_storage_release(lt_storage *s);
/* A contiguous, uninitialised tensor with t's shape, dtype and device. */
lt_status lt_tensor_empty_like(const lt_tensor *t, lt_dtype dtype, lt_tensor **out);
/* lt_tensor_empty whose errors (a bad shape, a device not there, out of
   memory) name op instead of "empty" */
lt_status lt_tensor_empty_as(const char *op, int ndim, const int64_t *sizes, lt_dtype dtype, lt_device device,
                             lt_tensor **out);

/* Writes "[2, 3]" into buf (at least 200 bytes) and returns buf. */
const char *lt_shape_str(int ndim, const int64_t *sizes, char *buf);

/* Contiguous strides for sizes; returns numel. */
int64_t lt_contiguous_strides(int ndim, const int64_t *sizes, int64_t *strides);

/* Fails unless t spans its whole storage (offset 0, contiguous): a
   parameter whose data may be dropped and restored, not a view. */
lt_status lt_check_whole_storage(const char *op, const lt_tensor *t);
/* Allocates s's data again after lt_tensor_drop_data (a no-op when it has
   data); errors name op. */
lt_status lt_storage_realloc(const char *op, lt_storage *s);
/* Checks a requested shape (at most LT_MAX_DIMS dims, no negative size, a
   numel that fits) and gives its numel; errors name op. */
lt_status lt_check_shape(const char *op, int ndim, const int64_t *sizes, int64_t *numel);

#endif
