/*
 * core/iter.h: building the iteration descriptors that kernels consume
 * (kernels/kernel.h, through core/tensor-impl.h), and what every op shares:
 * broadcasting, output preparation, devices, result types, the version bump
 * of in-place writes.
 * (The overlap check, lt_unalias, copies: it is in ops/ops.h.)
 */
#ifndef LUTRA_ITER_H
#define LUTRA_ITER_H

#include "base/status.h"
#include "core/tensor-impl.h"

/* ops[0] is the output; the inputs must broadcast to its shape. */
void lt_iter_build(lt_iter *it, int nops, const lt_tensor *const *ops);

/* The NumPy broadcast of n shapes; fails naming op and both shapes. */
lt_status lt_broadcast_shape(const char *op, int n, const lt_tensor *const *ts, int *ndim, int64_t *shape);

/* Uses out (checked: shape, device, not expanded) or allocates the result. */
lt_status lt_prepare_out(const char *op, int ndim, const int64_t *shape, lt_dtype dtype,
                         lt_device device, lt_tensor *out, lt_tensor **res);

/* All tensors on one device, and a backend for it; fails (LT_ERR_DEVICE)
   naming the first tensor and the first on another device, with both
   devices: by names[i] ("weight", "ids") where the array's order is not the
   caller's argument order, else by position (1-based, for ops whose tensors
   are their arguments in order). */
lt_status lt_same_device_named(const char *op, int n, const lt_tensor *const *ts, const char *const *names,
                               const lt_backend_i **be);
lt_status lt_same_device(const char *op, int n, const lt_tensor *const *ts, const lt_backend_i **be);

/* torch.result_type for tensor operands: 0-dim tensors take part only when
   their category (bool < integer < float) is above that of the others. */
lt_dtype lt_result_type(int n, const lt_tensor *const *ts);

/* Bumps the storage's version after an in-place write (autograd's saved
   tensors compare it). */
static inline void lt_bump_version(lt_tensor *t) {
  if (t && t->storage)
    t->storage->version++;
}

/* The compute kind for results of a dtype. */
static inline lt_compute lt_compute_for(lt_dtype d) {
  return d == LT_DTYPE_F64 ? LT_COMPUTE_F64 : lt_dtype_is_float(d) ? LT_COMPUTE_F32 : LT_COMPUTE_I64;
}

#endif
