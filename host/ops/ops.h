/*
 * ops/ops.h: the forward dispatch of the tensor ops, without autograd.
 *
 * Every differentiable public op lt_X of lutra.h (defined in host/autograd/,
 * where it records its node) has here its dispatch lt_op_X, same arguments
 * and same errors: the argument checks (shapes, dtypes, devices), the
 * output, the iteration and the backend's kernel, and nothing of autograd
 * (no node recorded, no in-place check, grad mode not read). Ops that need
 * another op call its lt_op_ form, never the public one.
 *
 * In-place ops (an `out`, copy_, fill_, index_add_, ...) come also as
 * lt_op_X_guarded, which takes a write guard: called with the op's name,
 * the tensor written and the inputs once the arguments are checked and
 * before anything is written, its error is the op's (autograd passes
 * lt_ag_check_inplace, so its refusal comes where it always did).
 */
#ifndef LUTRA_OPS_H
#define LUTRA_OPS_H

#include "base/status.h"
#include "core/tensor-impl.h"

/* Called before an in-place op writes into out (NULL: no guard). */
typedef lt_status (*lt_write_guard)(const char *op, const lt_tensor *out, int n, const lt_tensor *const *inputs);

/* ---- elementwise (ops/elementwise.c) ------------------------------------ */

/* lt_unary, lt_binary, lt_binary_scalar, lt_where, lt_clamp (lutra.h):
   result dtypes by torch's promotion; out (else NULL) must have the
   broadcast shape, a dtype the result may be written into, and must not be
   expanded; its storage's version is bumped. */
lt_status lt_op_unary(lt_unary_op op, const lt_tensor *a, lt_tensor *out, lt_tensor **res);
lt_status lt_op_binary(lt_binary_op op, const lt_tensor *a, const lt_tensor *b, lt_tensor *out, lt_tensor **res);
lt_status lt_op_binary_scalar(lt_binary_op op, const lt_tensor *a, double s, int reversed, lt_tensor *out,
                              lt_tensor **res);
lt_status lt_op_where(const lt_tensor *cond, const lt_tensor *a, const lt_tensor *b, lt_tensor *out,
                      lt_tensor **res);
lt_status lt_op_clamp(const lt_tensor *a, double lo, int has_lo, double hi, int has_hi, lt_tensor *out,
                      lt_tensor **res);
lt_status lt_op_unary_guarded(lt_unary_op op, const lt_tensor *a, lt_tensor *out, lt_tensor **res,
                              lt_write_guard guard);
lt_status lt_op_binary_guarded(lt_binary_op op, const lt_tensor *a, const lt_tensor *b, lt_tensor *out,
                               lt_tensor **res, lt_write_guard guard);
lt_status lt_op_binary_scalar_guarded(lt_binary_op op, const lt_tensor *a, double s, int reversed, lt_tensor *out,
                                      lt_tensor **res, lt_write_guard guard);
lt_status lt_op_where_guarded(const lt_tensor *cond, const lt_tensor *a, const lt_tensor *b, lt_tensor *out,
                              lt_tensor **res, lt_write_guard guard);
lt_status lt_op_clamp_guarded(const lt_tensor *a, double lo, int has_lo, double hi, int has_hi, lt_tensor *out,
                              lt_tensor **res, lt_write_guard guard);

/* ---- copies (ops/copy.c) -------------------------------------------------- */

/* dst <- src: src broadcast to dst's shape, converted to dst's dtype, moved
   between devices; bumps dst's version. */
lt_status lt_op_tensor_copy_(lt_tensor *dst, const lt_tensor *src);
lt_status lt_op_tensor_copy_guarded(lt_tensor *dst, const lt_tensor *src, lt_write_guard guard);
/* A contiguous copy of t (same dtype and device). */
lt_status lt_op_tensor_clone(const lt_tensor *t, lt_tensor **out);
/* A contiguous copy in dtype on device; t itself (retained) when nothing changes. */
lt_status lt_op_tensor_to(lt_tensor *t, lt_dtype dtype, lt_device device, lt_tensor **out);
/* Every element of t set to value; bumps t's version. */
lt_status lt_op_tensor_fill_(lt_tensor *t, double value);
lt_status lt_op_tensor_fill_guarded(lt_tensor *t, double value, lt_write_guard guard);
/* When out shares storage with in but is not the same view, *safe is a copy
   of in; otherwise in itself (retained). */
lt_status lt_unalias(const lt_tensor *out, const lt_tensor *in, lt_tensor **safe);

/* ---- views (ops/view.c): share t's storage, never copy, except reshape and
   contiguous; errors as lutra.h's lt_tensor_view etc. ----------------------- */

lt_status lt_op_tensor_view(lt_tensor *t, int ndim, const int64_t *sizes, lt_tensor **out);
lt_status lt_op_tensor_reshape(lt_tensor *t, int ndim, const int64_t *sizes, lt_tensor **out);
lt_status lt_op_tensor_transpose(lt_tensor *t, int dim0, int dim1, lt_tensor **out);
lt_status lt_op_tensor_permute(lt_tensor *t, int ndim, const int64_t *dims, lt_tensor **out);
lt_status lt_op_tensor_narrow(lt_tensor *t, int dim, int64_t start, int64_t length, lt_tensor **out);
lt_status lt_op_tensor_select(lt_tensor *t, int dim, int64_t index, lt_tensor **out);
lt_status lt_op_tensor_expand(lt_tensor *t, int ndim, const int64_t *sizes, lt_tensor **out);
lt_status lt_op_tensor_squeeze(lt_tensor *t, int dim, lt_tensor **out);
lt_status lt_op_tensor_unsqueeze(lt_tensor *t, int dim, lt_tensor **out);
lt_status lt_op_tensor_contiguous(lt_tensor *t, lt_tensor **out);
/* n (1..LT_CHUNK_MAX) equal narrow views of t along dim into outs[0..n-1];
   on failure none is left in outs. */
enum { LT_CHUNK_MAX = 4 };
lt_status lt_op_tensor_chunk(lt_tensor *t, int n, int dim, lt_tensor **outs);

/* ---- reductions, matrix products (ops/reduce.c, ops/matmul.c) ------------ */

lt_status lt_op_reduce(lt_reduce_op op, const lt_tensor *a, int ndims, const int64_t *dims, int keepdim,
                       int64_t correction, lt_tensor **res);
lt_status lt_op_matmul(const lt_tensor *a, const lt_tensor *b, lt_tensor **res);

/* ---- indexing (ops/index.c) ----------------------------------------------- */

lt_status lt_op_index_select(const lt_tensor *t, int dim, const lt_tensor *index, lt_tensor **res);
/* weight (V, C) rows at ids (1-D): index_select on dim 0 whose errors name
   the embedding, its weight and ids */
lt_status lt_op_embedding(const lt_tensor *weight, const lt_tensor *ids, lt_tensor **res);
lt_status lt_op_gather(const lt_tensor *t, int dim, const lt_tensor *index, lt_tensor **res);
lt_status lt_op_index_add_(lt_tensor *t, int dim, const lt_tensor *index, const lt_tensor *src);
lt_status lt_op_index_add_guarded(lt_tensor *t, int dim, const lt_tensor *index, const lt_tensor *src,
                                  lt_write_guard guard);
lt_status lt_op_scatter_add_(lt_tensor *t, int dim, const lt_tensor *index, const lt_tensor *src);
lt_status lt_op_scatter_add_guarded(lt_tensor *t, int dim, const lt_tensor *index, const lt_tensor *src,
                                    lt_write_guard guard);

/* ---- random fills (ops/random.c) ------------------------------------------ */

/* t filled from g's stream (uniform in [lo, hi), normal(mean, std)); g advances */
lt_status lt_op_tensor_uniform_(lt_tensor *t, lt_generator *g, double lo, double hi);
lt_status lt_op_tensor_normal_(lt_tensor *t, lt_generator *g, double mean, double std);
lt_status lt_op_tensor_uniform_guarded(lt_tensor *t, lt_generator *g, double lo, double hi, lt_write_guard guard);
lt_status lt_op_tensor_normal_guarded(lt_tensor *t, lt_generator *g, double mean, double std, lt_write_guard guard);

#endif
