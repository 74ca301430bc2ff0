/*
 * autograd/grad-ops.h: what the forward ops call to record themselves on the autograd
 * tape (autograd/grad-ops.c). Each call is a no-op unless grad mode is on and an input
 * requires grad; r is the op's freshly made result.
 */
#ifndef LUTRA_GRAD_OPS_H
#define LUTRA_GRAD_OPS_H

#include "lutra.h"

typedef enum lt_view_kind {
  LT_VIEW_RESHAPE = 0, /* view, reshape, squeeze, unsqueeze, flatten */
  LT_VIEW_TRANSPOSE,   /* args: dim0, dim1 */
  LT_VIEW_PERMUTE,     /* args: the permutation */
  LT_VIEW_NARROW,      /* args: dim, start, length */
  LT_VIEW_SELECT,      /* args: dim, index */
  LT_VIEW_EXPAND,
  LT_VIEW_IDENTITY,    /* clone, contiguous */
  LT_VIEW_CONVERT,     /* to(dtype) */
} lt_view_kind;

lt_status lt_ag_record_unary(lt_unary_op op, const lt_tensor *a, lt_tensor *r);
lt_status lt_ag_record_binary(lt_binary_op op, const lt_tensor *a, const lt_tensor *b, lt_tensor *r);
lt_status lt_ag_record_scalar(lt_binary_op op, const lt_tensor *a, double v, int reversed, lt_tensor *r);
lt_status lt_ag_record_where(const lt_tensor *c, const lt_tensor *a, const lt_tensor *b, lt_tensor *r);
lt_status lt_ag_record_clamp(const lt_tensor *a, double lo, int has_lo, double hi, int has_hi, lt_tensor *r);
lt_status lt_ag_record_reduce(lt_reduce_op op, const lt_tensor *a, int ndims, const int64_t *dims,
                              int64_t correction, lt_tensor *r);
lt_status lt_ag_record_matmul(const lt_tensor *a, const lt_tensor *b, lt_tensor *r);
lt_status lt_ag_record_view(lt_view_kind kind, const lt_tensor *a, lt_tensor *r, const int64_t *args, int nargs);
lt_status lt_ag_record_index(int gather, const lt_tensor *t, int dim, const lt_tensor *index, lt_tensor *r);

#endif
