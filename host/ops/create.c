/*
 * ops/create.c: tensors made with values: lt_tensor_full (and so zeros and
 * ones) and lt_tensor_arange; lt_tensor_from_f64 is with the f64 buffers in
 * ops/copy.c. None records anything: a new tensor is a leaf.
 */
#include "ops/ops.h"

#include <math.h>
#include <stdlib.h>

lt_status lt_tensor_full(int ndim, const int64_t *sizes, double value, lt_dtype dtype,
                         lt_device device, lt_tensor **out) {
  lt_tensor *t;
  LT_TRY(lt_tensor_empty(ndim, sizes, dtype, device, &t));
  lt_status st = lt_op_tensor_fill_(t, value);
  if (st != LT_OK) {
    lt_tensor_release(t);
    return st;
  }
  *out = t;
  return LT_OK;
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
