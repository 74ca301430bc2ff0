/*
 * autograd/copy.c: the public copies: lt_tensor_copy_ and lt_tensor_fill_
 * (the dispatch of ops/copy.c with autograd's in-place check; they record
 * nothing), lt_tensor_clone and lt_tensor_to (the dispatch, then a
 * CloneBackward or ToBackward node whose backward hands the gradient back,
 * converted to the input's dtype and device).
 */
#include "autograd/grad-ops.h"

static lt_status copy_backward(lt_node *n, lt_tensor *const *go, lt_tensor **gi) {
  scratch S = {0}, *s = &S;
  give(&gi[0], fit(s, n, 0, go[0])); /* fit() converts back to the input's dtype */
  return finish(s, gi, 1);
}

static const lt_node_ops clone_ops = {"CloneBackward", copy_backward, NULL};
static const lt_node_ops to_ops = {"ToBackward", copy_backward, NULL};

static lt_status record_copy(const lt_node_ops *ops, const lt_tensor *a, lt_tensor *r) {
  if (r == a || !lt_ag_needed(1, &a) || !lt_dtype_is_float(r->dtype))
    return LT_OK;
  lt_node *n;
  LT_TRY(lt_ag_node_new(ops, 1, &a, &n));
  lt_status st = lt_ag_attach(n, r, 0);
  lt_node_release(n);
  return st;
}

lt_status lt_tensor_copy_(lt_tensor *dst, const lt_tensor *src) {
  return lt_op_tensor_copy_guarded(dst, src, lt_ag_check_inplace);
}

lt_status lt_tensor_fill_(lt_tensor *t, double value) { return lt_op_tensor_fill_guarded(t, value, lt_ag_check_inplace); }

lt_status lt_tensor_clone(const lt_tensor *t, lt_tensor **out) {
  lt_tensor *r;
  LT_TRY(lt_op_tensor_clone(t, &r));
  return lt_ag_result(record_copy(&clone_ops, t, r), r, out);
}

lt_status lt_tensor_to(lt_tensor *t, lt_dtype dtype, lt_device device, lt_tensor **out) {
  lt_tensor *r;
  LT_TRY(lt_op_tensor_to(t, dtype, device, &r));
  return lt_ag_result(record_copy(&to_ops, t, r), r, out);
}
