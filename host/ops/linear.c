/*
 * ops/linear.c: the dispatch of the linear layer (y = act(x w^T + b), GELU
 * optionally fused), GPT-2's MLP and the head with its loss: their checks,
 * and the products with epilogues where the backend multiplies with them
 * (cuBLASLt on CUDA): the bias add and the GELU inside the forward product
 * (which also writes the pre-activation the backward needs), db inside dw's
 * product (BGRADB), and the GELU's gradient inside the product that makes
 * it (DGELU_BGRAD, as NVIDIA's Apex FusedDenseGeluDense does). Each returns
 * LT_ERR_UNSUPPORTED where the backend has no such epilogue: the
 * differentiable entry points (host/autograd/linear.c) then compose
 * products, adds and gelus.
 */
#include "core/iter.h"
#include "ops/nn.h"

#include <stdio.h>
#include <string.h>

/* Says once per process (per `noted`) that an epilogue was refused and
   what runs instead. */
static void note_composed(int *noted, const char *op, const char *what) {
  if (!__atomic_exchange_n(noted, 1, __ATOMIC_RELAXED))
    fprintf(stderr, "lutra: %s: %s; running it as %s (noted once)\n", op, lt_last_error(), what);
}

/* A layer's weight (out, in) taking `in` features, and its bias (out). `which`
   names the layer ("" or "projection "), `from` what gives `in`. */
static lt_status check_layer(const char *op, const char *which, const char *from, const lt_tensor *src, int64_t in,
                             const lt_tensor *w, const lt_tensor *b) {
  char b1[200], b2[200];
  if (w->ndim != 2)
    return lt_fail(LT_ERR_SHAPE, "%s: %sweight %s must be 2-D (out, in)", op, which, lt_tensor_shape_str(w, b1));
  if (w->sizes[1] != in)
    return lt_fail(LT_ERR_SHAPE, "%s: %s %s does not fit %sweight %s (out, in): its in must be %lld", op, from,
                   lt_tensor_shape_str(src, b1), which, lt_tensor_shape_str(w, b2), (long long)in);
  if (b && (b->ndim != 1 || b->sizes[0] != w->sizes[0]))
    return lt_fail(LT_ERR_SHAPE, "%s: %sbias %s must be (%lld)", op, which, lt_tensor_shape_str(b, b1),
                   (long long)w->sizes[0]);
  return LT_OK;
}

/* Every input of one float dtype (x's); names[j] says what ins[j] is. */
static lt_status check_dtypes(const char *op, int n, const lt_tensor *const *ins, const char *const *names) {
  if (!lt_dtype_is_float(ins[0]->dtype))
    return lt_fail(LT_ERR_DTYPE, "%s: the %s must be a float tensor, got %s", op, names[0],
                   lt_dtype_name(ins[0]->dtype));
  for (int j = 1; j < n; j++)
    if (!lt_dtype_is_float(ins[j]->dtype) || ins[j]->dtype != ins[0]->dtype)
      return lt_fail(LT_ERR_DTYPE, "%s: the input and the weights and biases must share one float dtype; the input is "
                     "%s, the %s %s", op, lt_dtype_name(ins[0]->dtype), names[j], lt_dtype_name(ins[j]->dtype));
  return LT_OK;
}

lt_status lt_op_linear_check(const char *op, const lt_tensor *x, const lt_tensor *w, const lt_tensor *b, int act,
                             const lt_backend_i **be) {
  const lt_tensor *ins[3] = {x, w, b};
  static const char *const names[3] = {"input", "weight", "bias"};
  int nin = b ? 3 : 2;
  LT_TRY(lt_same_device_named(op, nin, ins, names, be));
  if (act != 0 && act != 1)
    return lt_fail(LT_ERR_ARG, "%s: activation %d is not 0 (none) or 1 (gelu)", op, act);
  LT_TRY(check_dtypes(op, nin, ins, names));
  if (x->ndim < 1)
    return lt_fail(LT_ERR_SHAPE, "%s: the input is a scalar; it needs a last dim of in features", op);
  return check_layer(op, "", "input", x, x->sizes[x->ndim - 1], w, b);
}

lt_status lt_op_mlp_check(const char *op, const lt_tensor *x, const lt_tensor *w1, const lt_tensor *b1,
                          const lt_tensor *w2, const lt_tensor *b2, const lt_backend_i **be) {
  const lt_tensor *ins[5];
  const char *names[5];
  int nin = 0;
  names[nin] = "input", ins[nin++] = x;
  names[nin] = "first weight", ins[nin++] = w1;
  if (b1)
    names[nin] = "first bias", ins[nin++] = b1;
  names[nin] = "projection weight", ins[nin++] = w2;
  if (b2)
    names[nin] = "projection bias", ins[nin++] = b2;
  LT_TRY(lt_same_device_named(op, nin, ins, names, be));
  LT_TRY(check_dtypes(op, nin, ins, names));
  if (x->ndim < 1)
    return lt_fail(LT_ERR_SHAPE, "%s: the input is a scalar; it needs a last dim of in features", op);
  LT_TRY(check_layer(op, "", "input", x, x->sizes[x->ndim - 1], w1, b1));
  return check_layer(op, "projection ", "first weight", w1, w1->sizes[0], w2, b2);
}

lt_status lt_op_linear_ce_check(const char *op, const lt_tensor *x, const lt_tensor *w, const lt_tensor *targets,
                                int reduction, int64_t classes, const lt_backend_i **be, int64_t *Np) {
  const lt_tensor *ins[3] = {x, w, targets};
  static const char *const names[3] = {"input", "weight", "targets"};
  char b1[200], b2[200];
  LT_TRY(lt_same_device_named(op, 3, ins, names, be));
  LT_TRY(check_dtypes(op, 2, ins, names));
  if (x->ndim < 2)
    return lt_fail(LT_ERR_SHAPE, "%s: the input %s needs rows: (N, in) or (B, T, in)", op, lt_tensor_shape_str(x, b1));
  LT_TRY(check_layer(op, "", "input", x, x->sizes[x->ndim - 1], w, NULL));
  if (reduction != 0 && reduction != 1)
    return lt_fail(LT_ERR_ARG, "%s: reduction must be mean or sum (for a loss per row: linear, then cross_entropy)",
                   op);
  int64_t N = 1;
  for (int d = 0; d < x->ndim - 1; d++)
    N *= x->sizes[d];
  int leading = targets->ndim == x->ndim - 1 &&
                memcmp(targets->sizes, x->sizes, sizeof(int64_t) * (size_t)targets->ndim) == 0;
  if (!leading && !(targets->ndim == 1 && targets->sizes[0] == N))
    return lt_fail(LT_ERR_SHAPE, "%s: targets %s must have the input's leading dims, or be one row of %lld (input %s)",
                   op, lt_tensor_shape_str(targets, b1), (long long)N, lt_tensor_shape_str(x, b2));
  if (classes < 0 || classes > w->sizes[0])
    return lt_fail(LT_ERR_ARG, "%s: classes %lld is outside [1, %lld] (the weight's rows; 0 takes them all)", op,
                   (long long)classes, (long long)w->sizes[0]);
  *Np = N;
  return LT_OK;
}

/* One product with the epilogue: c (M, out) = act(x2 w^T + b), aux = the
   pre-activation (GELU only). LT_ERR_UNSUPPORTED when the backend has no
   algorithm for it (the caller composes). */
static lt_status fused_forward(const lt_backend_i *be, const lt_tensor *x2, const lt_tensor *w, const lt_tensor *b,
                               int act, lt_tensor *c, lt_tensor *aux) {
  lt_matmul_desc d;
  memset(&d, 0, sizeof d);
  d.m = x2->sizes[0], d.k = x2->sizes[1], d.n = w->sizes[0];
  d.a = lt_tensor_ptr(x2), d.a_rs = x2->strides[0], d.a_cs = x2->strides[1];
  d.b = lt_tensor_ptr(w), d.b_rs = w->strides[1], d.b_cs = w->strides[0]; /* w^T: (in, out) */
  d.c = lt_tensor_ptr(c), d.c_rs = c->strides[0];
  d.dtype = x2->dtype;
  d.epilogue = act ? (b ? LT_EPILOGUE_GELU_BIAS : LT_EPILOGUE_GELU) : LT_EPILOGUE_BIAS;
  d.bias = b ? lt_tensor_ptr(b) : NULL;
  d.aux = aux ? lt_tensor_ptr(aux) : NULL;
  d.aux_rs = aux ? aux->strides[0] : 0;
  return be->matmul(&d);
}

lt_status lt_op_linear_fused(const lt_backend_i *be, const lt_tensor *x2, const lt_tensor *w, const lt_tensor *b,
                             int act, lt_tensor **y2, lt_tensor **pre) {
  static int noted;
  int64_t M = x2->sizes[0], in = w->sizes[1], out = w->sizes[0], ysizes[2] = {M, out};
  *y2 = *pre = NULL;
  if (!(be->matmul_epilogues && (b || act) && M > 0 && in > 0 && out > 0 && lt_nn_unit_rows(x2) &&
        lt_nn_unit_rows(w) && (!b || b->strides[0] == 1 || out <= 1)))
    return LT_ERR_UNSUPPORTED;
  lt_status st = lt_tensor_empty(2, ysizes, x2->dtype, x2->storage->device, y2);
  if (st == LT_OK && act)
    st = lt_tensor_empty(2, ysizes, x2->dtype, x2->storage->device, pre);
  if (st == LT_OK)
    st = fused_forward(be, x2, w, b, act, *y2, *pre);
  if (st == LT_OK)
    return LT_OK;
  lt_tensor_release(*y2);
  lt_tensor_release(*pre);
  *y2 = *pre = NULL;
  if (st == LT_ERR_UNSUPPORTED)
    note_composed(&noted, "linear", act ? "matmul, add, gelu" : "matmul, add");
  return st;
}

lt_status lt_op_linear_weight_grad_fused(const lt_tensor *g, const lt_tensor *x2, lt_tensor **dw, lt_tensor **db) {
  const lt_backend_i *be = g->storage->backend;
  int64_t M = g->sizes[0], out = g->sizes[1], in = x2->sizes[1], wsizes[2] = {out, in};
  if (!be->matmul_epilogues || M == 0 || out == 0 || in == 0 || !lt_nn_unit_rows(g) || !lt_nn_unit_rows(x2))
    return LT_ERR_UNSUPPORTED;
  LT_TRY(lt_tensor_empty(2, wsizes, g->dtype, g->storage->device, dw));
  lt_status st = lt_tensor_empty(1, &out, g->dtype, g->storage->device, db);
  if (st == LT_OK) {
    lt_matmul_desc d;
    memset(&d, 0, sizeof d);
    d.m = out, d.k = M, d.n = in;
    d.a = lt_tensor_ptr(g), d.a_rs = 1, d.a_cs = g->strides[0]; /* g^T */
    d.b = lt_tensor_ptr(x2), d.b_rs = x2->strides[0], d.b_cs = 1;
    d.c = lt_tensor_ptr(*dw), d.c_rs = in;
    d.dtype = g->dtype;
    d.epilogue = LT_EPILOGUE_BGRAD_A;
    d.bias = lt_tensor_ptr(*db);
    st = be->matmul(&d);
  }
  if (st != LT_OK) {
    lt_tensor_release(*dw);
    lt_tensor_release(*db);
    *dw = *db = NULL;
  }
  return st;
}

/* dh = (g w) gelu'(pre) in one product, with db = dh's column sums when
   asked (cuBLASLt's DGELU / DGELU_BGRAD epilogues); LT_ERR_UNSUPPORTED when
   the backend refuses. g (M, out), w (out, in), pre (M, in), all with
   unit-stride rows, none empty. */
static lt_status fused_gelu_input_grad(const lt_backend_i *be, const lt_tensor *g, const lt_tensor *w,
                                       const lt_tensor *pre, int want_db, lt_tensor **dh, lt_tensor **db) {
  int64_t M = g->sizes[0], out = g->sizes[1], in = w->sizes[1], sizes[2] = {M, in};
  LT_TRY(lt_tensor_empty(2, sizes, g->dtype, g->storage->device, dh));
  lt_status st = want_db ? lt_tensor_empty(1, &in, g->dtype, g->storage->device, db) : LT_OK;
  if (st == LT_OK) {
    lt_matmul_desc d;
    memset(&d, 0, sizeof d);
    d.m = M, d.k = out, d.n = in;
    d.a = lt_tensor_ptr(g), d.a_rs = g->strides[0], d.a_cs = 1;
    d.b = lt_tensor_ptr(w), d.b_rs = w->strides[0], d.b_cs = 1;
    d.c = lt_tensor_ptr(*dh), d.c_rs = in;
    d.dtype = g->dtype;
    d.epilogue = want_db ? LT_EPILOGUE_DGELU_BGRAD : LT_EPILOGUE_DGELU;
    d.bias = want_db ? lt_tensor_ptr(*db) : NULL;
    d.aux = (char *)lt_tensor_ptr(pre), d.aux_rs = pre->strides[0]; /* (read only) */
    st = be->matmul(&d);
  }
  if (st != LT_OK) {
    lt_tensor_release(*dh);
    *dh = NULL;
    if (want_db) {
      lt_tensor_release(*db);
      *db = NULL;
    }
  }
  return st;
}

lt_status lt_op_gelu_input_grad_fused(const lt_tensor *g, const lt_tensor *w, const lt_tensor *pre, int want_db,
                                      lt_tensor **dh, lt_tensor **db) {
  static int noted;
  const lt_backend_i *be = g->storage->backend;
  if (!(be->matmul_epilogues && g->sizes[0] > 0 && g->sizes[1] > 0 && w->sizes[1] > 0 && lt_nn_unit_rows(g) &&
        lt_nn_unit_rows(w) && lt_nn_unit_rows(pre)))
    return LT_ERR_UNSUPPORTED;
  lt_status st = fused_gelu_input_grad(be, g, w, pre, want_db, dh, db);
  if (st == LT_ERR_UNSUPPORTED)
    note_composed(&noted, "mlp backward", "matmul, gelu_grad");
  return st;
}
