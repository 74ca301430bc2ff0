/*
 * ops/matmul.c: the matrix-product dispatch lt_op_matmul, with torch.matmul's shape rules
 * (1-D operands promoted and the added dim removed, batch dims broadcast).
 * bf16/f16 operands go to backends with native_half_matmul as they are
 * (f32 accumulation there); elsewhere they are converted to f32, multiplied
 * and rounded once into the operands' dtype. No autograd (lt_matmul,
 * autograd/matmul.c, records).
 */
#include "core/iter.h"
#include "ops/ops.h"

#include <limits.h>
#include <string.h>

/* Whether the last two dims can go to BLAS as they lie (one unit stride). */
static int blas_ok(const lt_tensor *t) {
  int64_t rows = t->sizes[t->ndim - 2], cols = t->sizes[t->ndim - 1];
  int64_t rs = t->strides[t->ndim - 2], cs = t->strides[t->ndim - 1];
  if (rows > 1 && rs == 0)
    return 0;
  if (cols > 1 && cs == 0)
    return 0;
  if (cs == 1 || cols == 1)
    return rs >= cols || rows == 1;
  if (rs == 1 || rows == 1)
    return cs >= rows || cols == 1;
  return 0;
}

/*
 * A matrix shared by every batch (b's batch strides all 0, as for a Linear
 * layer's weight) against rows that are evenly spaced through a's batch dims
 * is one product with more rows: fold the batches into m, so BLAS gets one
 * (B*T, k) x (k, n) call instead of B calls of T rows.
 */
static void fold_batches(lt_matmul_desc *d) {
  if (d->nbatch_dims == 0 || d->a_cs != 1)
    return;
  int64_t rows = d->m, stride = d->a_rs;
  for (int i = d->nbatch_dims - 1; i >= 0; i--) {
    if (d->b_batch_strides[i] != 0 && d->batch_shape[i] != 1)
      return;
    if (d->batch_shape[i] != 1 && d->a_batch_strides[i] != rows * stride)
      return;
    rows *= d->batch_shape[i];
  }
  if (rows > INT_MAX)
    return;
  d->m = rows;
  d->nbatch_dims = 0;
}

static lt_status matmul_blas(const lt_tensor *a, const lt_tensor *b, lt_tensor **res) {
  char b1[200], b2[200];
  const lt_backend_i *be = a->storage->backend;
  lt_tensor *av = NULL, *bv = NULL, *r = NULL;
  lt_status st = LT_OK;
  int a1 = a->ndim == 1, b1d = b->ndim == 1;
  /* promote 1-D operands to matrices */
  if (a1)
    st = lt_op_tensor_unsqueeze((lt_tensor *)a, 0, &av);
  else
    lt_tensor_retain((lt_tensor *)a), av = (lt_tensor *)a;
  if (st == LT_OK && b1d)
    st = lt_op_tensor_unsqueeze((lt_tensor *)b, 1, &bv);
  else if (st == LT_OK)
    lt_tensor_retain((lt_tensor *)b), bv = (lt_tensor *)b;
  if (st != LT_OK)
    goto done;
  int64_t m = av->sizes[av->ndim - 2], k = av->sizes[av->ndim - 1];
  int64_t k2 = bv->sizes[bv->ndim - 2], n = bv->sizes[bv->ndim - 1];
  if (k != k2) {
    st = lt_fail(LT_ERR_SHAPE, "matmul: shapes %s and %s cannot be multiplied (%lld != %lld)",
                 lt_tensor_shape_str(a, b1), lt_tensor_shape_str(b, b2), (long long)k, (long long)k2);
    goto done;
  }
  if (m > INT_MAX || n > INT_MAX || k > INT_MAX) {
    st = lt_fail(LT_ERR_SHAPE, "matmul: dims of %s and %s exceed BLAS's 32-bit sizes",
                 lt_tensor_shape_str(a, b1), lt_tensor_shape_str(b, b2));
    goto done;
  }
  /* batch dims broadcast */
  int na = av->ndim - 2, nb = bv->ndim - 2, nbd = na > nb ? na : nb;
  lt_matmul_desc d;
  memset(&d, 0, sizeof d);
  for (int i = 0; i < nbd; i++) {
    int ia = i - (nbd - na), ib = i - (nbd - nb);
    int64_t sa = ia >= 0 ? av->sizes[ia] : 1, sb = ib >= 0 ? bv->sizes[ib] : 1;
    if (sa != sb && sa != 1 && sb != 1) {
      st = lt_fail(LT_ERR_SHAPE, "matmul: batch dims of %s and %s cannot be broadcast (%lld vs %lld)",
                   lt_tensor_shape_str(a, b1), lt_tensor_shape_str(b, b2), (long long)sa, (long long)sb);
      goto done;
    }
    d.batch_shape[i] = sa == 1 ? sb : sa; /* 1 broadcasts; 0 stays 0 */
    d.a_batch_strides[i] = (ia >= 0 && sa != 1) ? av->strides[ia] : 0;
    d.b_batch_strides[i] = (ib >= 0 && sb != 1) ? bv->strides[ib] : 0;
  }
  /* result shape, without the dims that 1-D operands added */
  int64_t rshape[LT_MAX_DIMS];
  int nr = 0;
  for (int i = 0; i < nbd; i++)
    rshape[nr++] = d.batch_shape[i];
  if (!a1)
    rshape[nr++] = m;
  if (!b1d)
    rshape[nr++] = n;
  if (nbd + 2 > LT_MAX_DIMS) {
    st = lt_fail(LT_ERR_SHAPE, "matmul: too many dims");
    goto done;
  }
  if ((st = lt_tensor_empty(nr, rshape, a->dtype, a->storage->device, &r)) != LT_OK)
    goto done;
  if (lt_tensor_numel(r) == 0)
    goto done;
  if (k == 0) {
    st = lt_op_tensor_fill_(r, 0);
    goto done;
  }
  if (!be->matmul) {
    st = lt_fail(LT_ERR_UNSUPPORTED, "matmul: not implemented on the %s backend", be->name);
    goto done;
  }
  /* operands BLAS cannot read in place are copied */
  if (!blas_ok(av)) {
    lt_tensor *c;
    if ((st = lt_op_tensor_clone(av, &c)) != LT_OK)
      goto done;
    lt_tensor_release(av);
    av = c;
    for (int i = 0; i < nbd; i++) {
      int ia = i - (nbd - na);
      d.a_batch_strides[i] = (ia >= 0 && av->sizes[ia] != 1) ? av->strides[ia] : 0;
    }
  }
  if (!blas_ok(bv)) {
    lt_tensor *c;
    if ((st = lt_op_tensor_clone(bv, &c)) != LT_OK)
      goto done;
    lt_tensor_release(bv);
    bv = c;
    for (int i = 0; i < nbd; i++) {
      int ib = i - (nbd - nb);
      d.b_batch_strides[i] = (ib >= 0 && bv->sizes[ib] != 1) ? bv->strides[ib] : 0;
    }
  }
  d.m = m;
  d.n = n;
  d.k = k;
  d.nbatch_dims = nbd;
  d.a_rs = av->strides[av->ndim - 2];
  d.a_cs = av->strides[av->ndim - 1];
  d.b_rs = bv->strides[bv->ndim - 2];
  d.b_cs = bv->strides[bv->ndim - 1];
  d.c_rs = n;
  lt_contiguous_strides(nbd, d.batch_shape, d.c_batch_strides);
  for (int i = 0; i < nbd; i++)
    d.c_batch_strides[i] *= m * n;
  d.a = lt_tensor_ptr(av);
  d.b = lt_tensor_ptr(bv);
  d.c = lt_tensor_ptr(r);
  d.dtype = a->dtype;
  fold_batches(&d);
  st = be->matmul(&d);
done:
  lt_tensor_release(av);
  lt_tensor_release(bv);
  if (st != LT_OK) {
    lt_tensor_release(r);
    return st;
  }
  *res = r;
  return LT_OK;
}

lt_status lt_op_matmul(const lt_tensor *a, const lt_tensor *b, lt_tensor **res) {
  const lt_tensor *ins[2] = {a, b};
  const lt_backend_i *be;
  char b1[200], b2[200];
  LT_OP_SCOPE("matmul");
  LT_TRY(lt_same_device("matmul", 2, ins, &be));
  if (a->ndim == 0 || b->ndim == 0)
    return lt_fail(LT_ERR_SHAPE, "matmul: operands need at least 1 dim, got shapes %s and %s",
                   lt_tensor_shape_str(a, b1), lt_tensor_shape_str(b, b2));
  if (a->dtype != b->dtype)
    return lt_fail(LT_ERR_DTYPE, "matmul: dtypes differ (%s %s and %s %s); convert one with :to()",
                   lt_dtype_name(a->dtype), lt_tensor_shape_str(a, b1), lt_dtype_name(b->dtype),
                   lt_tensor_shape_str(b, b2));
  switch (a->dtype) {
  case LT_DTYPE_F32:
  case LT_DTYPE_F64:
    return matmul_blas(a, b, res);
  case LT_DTYPE_BF16:
  case LT_DTYPE_F16: {
    if (be->native_half_matmul)
      return matmul_blas(a, b, res);
    lt_tensor *af = NULL, *bf = NULL, *rf = NULL;
    lt_status st = lt_op_tensor_to((lt_tensor *)a, LT_DTYPE_F32, a->storage->device, &af);
    if (st == LT_OK)
      st = lt_op_tensor_to((lt_tensor *)b, LT_DTYPE_F32, b->storage->device, &bf);
    if (st == LT_OK)
      st = matmul_blas(af, bf, &rf);
    if (st == LT_OK)
      st = lt_op_tensor_to(rf, a->dtype, a->storage->device, res);
    lt_tensor_release(af);
    lt_tensor_release(bf);
    lt_tensor_release(rf);
    return st;
  }
  default:
    return lt_fail(LT_ERR_DTYPE, "matmul: dtype %s is not supported (f32, f64, bf16, f16); operands %s and %s",
                   lt_dtype_name(a->dtype), lt_tensor_shape_str(a, b1), lt_tensor_shape_str(b, b2));
  }
}
