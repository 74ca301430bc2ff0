/*
 * ops/copy.c: copies and conversions without autograd: lt_op_tensor_copy_
 * (broadcast, dtype conversion, between devices through host staging),
 * lt_op_tensor_clone, lt_op_tensor_to, lt_op_tensor_fill_, lt_unalias; and
 * the public ops that are not differentiable: the f64 buffers
 * (lt_tensor_from_f64, lt_tensor_to_f64, lt_tensor_item, lt_canonical_nans)
 * and lt_tensor_restore_data (ZeRO-3's gathered parameters).
 */
#include "core/iter.h"
#include "ops/ops.h"

#include <math.h>
#include <string.h>

static lt_status no_kernel(const char *op, const lt_backend_i *be) {
  return lt_fail(LT_ERR_UNSUPPORTED, "%s: not implemented on the %s backend", op, be->name);
}

/* A result made, or released on failure. */
static lt_status finish(lt_status st, lt_tensor *r, lt_tensor **res) {
  if (st != LT_OK) {
    lt_tensor_release(r);
    return st;
  }
  *res = r;
  return LT_OK;
}

/* ---- copies ------------------------------------------------------------------ */

/* dst <- src on one device; src broadcasts to dst's shape. */
static lt_status copy_same_device(lt_tensor *dst, const lt_tensor *src) {
  const lt_backend_i *be = dst->storage->backend;
  if (!be->copy)
    return no_kernel("copy_", be);
  lt_tensor *s;
  LT_TRY(lt_unalias(dst, src, &s));
  lt_iter it;
  const lt_tensor *ops[2] = {dst, s};
  lt_iter_build(&it, 2, ops);
  lt_status st = be->copy(&it);
  lt_tensor_release(s);
  return st;
}

/* Copies between devices through contiguous host staging. */
static lt_status copy_across_devices(lt_tensor *dst, const lt_tensor *src) {
  const lt_backend_i *dbe = dst->storage->backend, *sbe = src->storage->backend;
  lt_status st;
  lt_tensor *src_c = NULL, *host = NULL, *dev = NULL;
  /* 1. src as a contiguous tensor on its own device */
  st = lt_op_tensor_contiguous((lt_tensor *)src, &src_c);
  /* 2. bring it to the host */
  if (st == LT_OK) {
    if (src->storage->device == LT_DEVICE_CPU) {
      host = src_c;
      src_c = NULL;
    } else if (!sbe->copy_to_host) {
      st = no_kernel("copy_ (to host)", sbe);
    } else if ((st = lt_tensor_empty(src->ndim, src->sizes, src->dtype, LT_DEVICE_CPU, &host)) == LT_OK) {
      st = sbe->copy_to_host(src->storage->device, lt_tensor_ptr(host), lt_tensor_ptr(src_c),
                             (size_t)(lt_tensor_numel(host) * lt_dtype_size(host->dtype)));
    }
  }
  /* 3. onto the destination */
  if (st == LT_OK) {
    if (dst->storage->device == LT_DEVICE_CPU) {
      st = copy_same_device(dst, host);
    } else if (!dbe->copy_from_host) {
      st = no_kernel("copy_ (from host)", dbe);
    } else {
      lt_tensor *staged = NULL; /* host data in dst's dtype and shape, contiguous */
      st = lt_tensor_empty(dst->ndim, dst->sizes, dst->dtype, LT_DEVICE_CPU, &staged);
      if (st == LT_OK)
        st = copy_same_device(staged, host);
      if (st == LT_OK && lt_tensor_is_contiguous(dst)) {
        st = dbe->copy_from_host(dst->storage->device, lt_tensor_ptr(dst), lt_tensor_ptr(staged),
                                 (size_t)(lt_tensor_numel(dst) * lt_dtype_size(dst->dtype)));
      } else if (st == LT_OK) {
        st = lt_tensor_empty(dst->ndim, dst->sizes, dst->dtype, dst->storage->device, &dev);
        if (st == LT_OK)
          st = dbe->copy_from_host(dst->storage->device, lt_tensor_ptr(dev), lt_tensor_ptr(staged),
                                   (size_t)(lt_tensor_numel(dst) * lt_dtype_size(dst->dtype)));
        if (st == LT_OK)
          st = copy_same_device(dst, dev);
      }
      lt_tensor_release(staged);
    }
  }
  lt_tensor_release(src_c);
  lt_tensor_release(host);
  lt_tensor_release(dev);
  return st;
}

lt_status lt_op_tensor_copy_guarded(lt_tensor *dst, const lt_tensor *src, lt_write_guard guard) {
  LT_TRY(lt_check_tensor("copy_", dst, 1));
  LT_TRY(lt_check_tensor("copy_", src, 2));
  LT_OP_SCOPE("copy_");
  LT_TRY(lt_check_interrupt("copy_"));
  if (guard)
    LT_TRY(guard("copy_", dst, 1, &src));
  const lt_tensor *ins[2] = {dst, src};
  int ndim;
  int64_t shape[LT_MAX_DIMS];
  LT_TRY(lt_broadcast_shape("copy_", 2, ins, &ndim, shape));
  lt_tensor *chk;
  LT_TRY(lt_prepare_out("copy_", ndim, shape, dst->dtype, dst->storage->device, dst, &chk));
  lt_tensor_release(chk);
  lt_status st = dst->storage->device == src->storage->device ? copy_same_device(dst, src)
                                                               : copy_across_devices(dst, src);
  if (st == LT_OK)
    lt_bump_version(dst);
  return st;
}

lt_status lt_op_tensor_copy_(lt_tensor *dst, const lt_tensor *src) { return lt_op_tensor_copy_guarded(dst, src, NULL); }

lt_status lt_op_tensor_clone(const lt_tensor *t, lt_tensor **out) {
  LT_OP_SCOPE("clone");
  LT_TRY(lt_check_tensor("clone", t, 1));
  lt_tensor *r;
  LT_TRY(lt_tensor_empty_like(t, t->dtype, &r));
  return finish(copy_same_device(r, t), r, out);
}

lt_status lt_op_tensor_to(lt_tensor *t, lt_dtype dtype, lt_device device, lt_tensor **out) {
  LT_OP_SCOPE("to");
  LT_TRY(lt_check_tensor("to", t, 1));
  if (t->dtype == dtype && t->storage->device == device) {
    lt_tensor_retain(t);
    *out = t;
    return LT_OK;
  }
  lt_tensor *r;
  LT_TRY(lt_tensor_empty_as("to", t->ndim, t->sizes, dtype, device, &r));
  return finish(lt_op_tensor_copy_(r, t), r, out);
}

lt_status lt_op_tensor_fill_guarded(lt_tensor *t, double value, lt_write_guard guard) {
  LT_TRY(lt_check_tensor("fill_", t, 1));
  const lt_backend_i *be = t->storage->backend;
  LT_OP_SCOPE("fill_");
  LT_TRY(lt_check_interrupt("fill_"));
  if (guard)
    LT_TRY(guard("fill_", t, 0, NULL));
  if (!be->fill)
    return no_kernel("fill_", be);
  lt_iter it;
  const lt_tensor *ops[1] = {t};
  lt_iter_build(&it, 1, ops);
  lt_status st = be->fill(&it, value);
  if (st == LT_OK)
    lt_bump_version(t);
  return st;
}

lt_status lt_op_tensor_fill_(lt_tensor *t, double value) { return lt_op_tensor_fill_guarded(t, value, NULL); }

static int same_view(const lt_tensor *a, const lt_tensor *b) {
  if (a->offset != b->offset || a->ndim != b->ndim)
    return 0;
  for (int d = 0; d < a->ndim; d++)
    if (a->sizes[d] != b->sizes[d] || (a->sizes[d] > 1 && a->strides[d] != b->strides[d]))
      return 0;
  return 1;
}

lt_status lt_unalias(const lt_tensor *out, const lt_tensor *in, lt_tensor **safe) {
  if (out && out->storage == in->storage && !same_view(out, in))
    return lt_op_tensor_clone(in, safe);
  lt_tensor_retain((lt_tensor *)in);
  *safe = (lt_tensor *)in;
  return LT_OK;
}

/* ---- f64 buffers ------------------------------------------------------------- */

/* A CPU f64 tensor header over caller memory, valid while the buffer is. */
static void wrap_f64(lt_tensor *t, lt_storage *s, const double *data, int ndim, const int64_t *sizes) {
  memset(s, 0, sizeof *s);
  s->refcount = 1;
  s->data = (void *)data;
  s->device = LT_DEVICE_CPU;
  s->backend = &lt_backend_cpu;
  memset(t, 0, sizeof *t);
  t->refcount = 1;
  t->storage = s;
  t->ndim = ndim;
  t->dtype = LT_DTYPE_F64;
  memcpy(t->sizes, sizes, sizeof(int64_t) * (size_t)ndim);
  s->nbytes = (size_t)lt_contiguous_strides(ndim, sizes, t->strides) * 8;
}

lt_status lt_tensor_from_f64(const double *values, int ndim, const int64_t *sizes, lt_dtype dtype,
                             lt_device device, lt_tensor **out) {
  LT_OP_SCOPE("tensor");
  lt_tensor *r;
  LT_TRY(lt_tensor_empty(ndim, sizes, dtype, device, &r));
  lt_tensor src;
  lt_storage s;
  wrap_f64(&src, &s, values, ndim, sizes);
  lt_status st = lt_op_tensor_copy_(r, &src);
  return finish(st, r, out);
}

void lt_canonical_nans(double *v, int64_t n) {
  for (int64_t i = 0; i < n; i++)
    if (v[i] != v[i])
      v[i] = NAN;
}

lt_status lt_tensor_to_f64(const lt_tensor *t, double *dst, int64_t n) {
  LT_OP_SCOPE("totable");
  LT_TRY(lt_check_tensor("to_f64", t, 1));
  int64_t numel = lt_tensor_numel(t);
  if (n < numel)
    return lt_fail(LT_ERR_ARG, "to_f64: buffer of %lld doubles for %lld elements", (long long)n,
                   (long long)numel);
  lt_tensor d;
  lt_storage s;
  wrap_f64(&d, &s, dst, t->ndim, t->sizes);
  lt_status st = lt_op_tensor_copy_(&d, t); /* reading values out is not an op to record */
  if (st == LT_OK && lt_dtype_is_float(t->dtype))
    lt_canonical_nans(dst, numel);
  return st;
}

lt_status lt_tensor_item(const lt_tensor *t, double *value) {
  LT_OP_SCOPE("item");
  LT_TRY(lt_check_tensor("item", t, 1));
  if (lt_tensor_numel(t) != 1) {
    char b[200];
    return lt_fail(LT_ERR_SHAPE, "item: the tensor has %lld elements (shape %s), item() needs exactly 1",
                   (long long)lt_tensor_numel(t), lt_tensor_shape_str(t, b));
  }
  return lt_tensor_to_f64(t, value, 1);
}

/* ---- dropped data (sharded parameters) ---------------------------------------- */

lt_status lt_tensor_restore_data(lt_tensor *t, const lt_tensor *src) {
  LT_TRY(lt_check_whole_storage("restore_data", t));
  LT_TRY(lt_check_tensor("restore_data", src, 2));
  if (lt_tensor_numel(src) != lt_tensor_numel(t)) {
    char b1[200], b2[200];
    return lt_fail(LT_ERR_SHAPE, "restore_data: the source has %lld elements (shape %s), the tensor %lld (shape %s)",
                   (long long)lt_tensor_numel(src), lt_tensor_shape_str(src, b1), (long long)lt_tensor_numel(t),
                   lt_tensor_shape_str(t, b2));
  }
  lt_storage *s = t->storage;
  LT_TRY(lt_storage_realloc("restore_data", s));
  uint64_t version = s->version;
  int64_t strides[LT_MAX_DIMS];
  lt_contiguous_strides(src->ndim, src->sizes, strides);
  lt_tensor *flat = lt_tensor_wrap(s, 0, src->ndim, src->sizes, strides, t->dtype);
  lt_status st = LT_OK;
  if (!flat)
    st = lt_fail(LT_ERR_OOM, "restore_data: out of host memory");
  else
    st = lt_op_tensor_copy_(flat, src);
  lt_tensor_release(flat);
  s->version = version;
  return st;
}
