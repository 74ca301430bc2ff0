/*
 * autograd/random.c: the public random fills lt_tensor_uniform_ and
 * lt_tensor_normal_: the draw (ops/random.c) with autograd's in-place check
 * (a tensor that requires grad is not filled while gradients are recorded).
 */
#include "autograd/autograd.h"

lt_status lt_tensor_uniform_(lt_tensor *t, lt_generator *g, double lo, double hi) {
  return lt_op_tensor_uniform_guarded(t, g, lo, hi, lt_ag_check_inplace);
}

lt_status lt_tensor_normal_(lt_tensor *t, lt_generator *g, double mean, double std) {
  return lt_op_tensor_normal_guarded(t, g, mean, std, lt_ag_check_inplace);
}
