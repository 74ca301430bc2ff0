/*
 * ops/random.c: generators (seed, offset) and the uniform/normal fills that
 * draw from them through the backend's Philox kernels. A draw of n elements
 * consumes ceil(n / 4) counters whatever the device, so CPU and CUDA stay in
 * step for the same seed. The public fills (autograd/random.c) add
 * autograd's in-place check through the write guard.
 */
#include "core/iter.h"
#include "ops/ops.h"

#include <stdlib.h>

struct lt_generator {
  uint64_t seed, offset;
};

lt_status lt_generator_new(uint64_t seed, lt_generator **out) {
  lt_generator *g = malloc(sizeof *g);
  if (!g)
    return lt_fail(LT_ERR_OOM, "generator: out of host memory");
  g->seed = seed;
  g->offset = 0;
  *out = g;
  return LT_OK;
}

void lt_generator_release(lt_generator *g) { free(g); }

void lt_generator_get_state(const lt_generator *g, uint64_t *seed, uint64_t *offset) {
  *seed = g->seed;
  *offset = g->offset;
}

void lt_generator_set_state(lt_generator *g, uint64_t seed, uint64_t offset) {
  g->seed = seed;
  g->offset = offset;
}

typedef enum { UNIFORM, NORMAL } dist;

static lt_status draw(const char *op, lt_tensor *t, lt_generator *g, dist kind, double p1, double p2,
                      lt_write_guard guard) {
  const lt_backend_i *be;
  LT_OP_SCOPE(op);
  LT_TRY(lt_same_device(op, 1, (const lt_tensor *const *)&t, &be));
  if (!lt_dtype_is_float(t->dtype))
    return lt_fail(LT_ERR_DTYPE, "%s: needs a float tensor, got %s", op, lt_dtype_name(t->dtype));
  if (!g)
    return lt_fail(LT_ERR_ARG, "%s: no generator given", op);
  if (kind == UNIFORM && !(p1 <= p2))
    return lt_fail(LT_ERR_ARG, "%s: needs lo <= hi, got %g and %g", op, p1, p2);
  if (kind == NORMAL && !(p2 >= 0))
    return lt_fail(LT_ERR_ARG, "%s: needs std >= 0, got %g", op, p2);
  for (int d = 0; d < t->ndim && lt_tensor_numel(t) > 0; d++)
    if (t->strides[d] == 0 && t->sizes[d] > 1)
      return lt_fail(LT_ERR_ARG, "%s: cannot write into an expanded tensor; clone() it first", op);
  if (guard)
    LT_TRY(guard(op, t, 0, NULL));
  if ((kind == UNIFORM && !be->uniform) || (kind == NORMAL && !be->normal))
    return lt_fail(LT_ERR_UNSUPPORTED, "%s: not implemented on the %s backend", op, be->name);
  int64_t n = lt_tensor_numel(t);
  lt_tensor *dst = t;
  int direct = lt_tensor_is_contiguous(t);
  if (!direct)
    LT_TRY(lt_tensor_empty_like(t, t->dtype, &dst));
  lt_status st = kind == UNIFORM
                     ? be->uniform(lt_tensor_ptr(dst), t->dtype, n, g->seed, g->offset, p1, p2)
                     : be->normal(lt_tensor_ptr(dst), t->dtype, n, g->seed, g->offset, p1, p2);
  if (st == LT_OK) {
    g->offset += (uint64_t)(n + 3) / 4;
    lt_bump_version(t);
  }
  if (!direct) {
    if (st == LT_OK)
      st = lt_op_tensor_copy_(t, dst);
    lt_tensor_release(dst);
  }
  return st;
}

lt_status lt_op_tensor_uniform_guarded(lt_tensor *t, lt_generator *g, double lo, double hi, lt_write_guard guard) {
  return draw("uniform_", t, g, UNIFORM, lo, hi, guard);
}

lt_status lt_op_tensor_normal_guarded(lt_tensor *t, lt_generator *g, double mean, double std, lt_write_guard guard) {
  return draw("normal_", t, g, NORMAL, mean, std, guard);
}

lt_status lt_op_tensor_uniform_(lt_tensor *t, lt_generator *g, double lo, double hi) {
  return draw("uniform_", t, g, UNIFORM, lo, hi, NULL);
}

lt_status lt_op_tensor_normal_(lt_tensor *t, lt_generator *g, double mean, double std) {
  return draw("normal_", t, g, NORMAL, mean, std, NULL);
}
