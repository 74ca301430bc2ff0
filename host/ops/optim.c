/*
 * optim.c: the optimizer dispatcher: checks a group of parameters with
 * their gradients, master copies and state (shapes, dtypes, devices,
 * contiguity), describes them to the backend's fused kernel in one call, and
 * bumps the parameters' versions (autograd then refuses graphs that saved
 * the old values). Formulas and their sources are in kernels/cpu/optim.c.
 */
#include "base/status.h"
#include "core/iter.h"
#include "ops/ops.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static int is_half(lt_dtype d) { return d == LT_DTYPE_BF16 || d == LT_DTYPE_F16; }

/* The dtype of a parameter's optimizer state. */
static lt_dtype state_dtype(lt_dtype d) { return d == LT_DTYPE_F64 ? LT_DTYPE_F64 : LT_DTYPE_F32; }

/* Checks that s (the optimizer's `what` for parameter i) fits parameter p. */
static lt_status check_state(const char *op, const char *what, int i, const lt_tensor *p, const lt_tensor *s,
                             lt_dtype want) {
  char b1[200], b2[200];
  if (!s)
    return lt_fail(LT_ERR_ARG, "%s: parameter %d has no %s", op, i + 1, what);
  LT_TRY(lt_check_tensor(op, s, i + 1));
  if (lt_tensor_numel(s) != lt_tensor_numel(p))
    return lt_fail(LT_ERR_SHAPE, "%s: the %s of parameter %d has shape %s, the parameter %s", op, what, i + 1,
                   lt_tensor_shape_str(s, b1), lt_tensor_shape_str(p, b2));
  if (s->dtype != want)
    return lt_fail(LT_ERR_DTYPE, "%s: the %s of parameter %d is %s, expected %s", op, what, i + 1,
                   lt_dtype_name(s->dtype), lt_dtype_name(want));
  if (s->storage->device != p->storage->device)
    return lt_fail(LT_ERR_DEVICE, "%s: the %s of parameter %d is on %s, the parameter on %s", op, what, i + 1,
                   lt_device_name(s->storage->device, b1), lt_device_name(p->storage->device, b2));
  if (!lt_tensor_is_contiguous(s))
    return lt_fail(LT_ERR_ARG, "%s: the %s of parameter %d is not contiguous", op, what, i + 1);
  return LT_OK;
}

/*
 * Fills ts[i] for a group; grads that are not contiguous get contiguous
 * copies, returned in tmp[i] for the caller to release. need_m / need_v say
 * which state tensors the optimizer uses.
 */
static lt_status describe(const char *op, int n, lt_tensor *const *params, lt_tensor *const *grads,
                          lt_tensor *const *masters, lt_tensor *const *ms, lt_tensor *const *vs, int need_m,
                          int need_v, lt_optim_tensor *ts, lt_tensor **tmp, const lt_backend_i **be) {
  char b1[200], b2[200];
  for (int i = 0; i < n; i++) {
    lt_tensor *p = params[i], *g = grads[i];
    LT_TRY(lt_check_tensor(op, p, i + 1));
    if (!g)
      return lt_fail(LT_ERR_ARG, "%s: parameter %d (shape %s) has no gradient", op, i + 1,
                     lt_tensor_shape_str(p, b1));
    LT_TRY(lt_check_tensor(op, g, i + 1));
    if (!lt_dtype_is_float(p->dtype))
      return lt_fail(LT_ERR_DTYPE, "%s: parameter %d is %s; optimizers update float tensors", op, i + 1,
                     lt_dtype_name(p->dtype));
    if (!lt_tensor_is_contiguous(p))
      return lt_fail(LT_ERR_ARG, "%s: parameter %d (shape %s) is not contiguous", op, i + 1,
                     lt_tensor_shape_str(p, b1));
    if (p->storage->device != params[0]->storage->device)
      return lt_fail(LT_ERR_DEVICE, "%s: parameters 1 and %d are on different devices (%s and %s); a group lives on one device",
                     op, i + 1, lt_device_name(params[0]->storage->device, b1), lt_device_name(p->storage->device, b2));
    if (lt_tensor_numel(g) != lt_tensor_numel(p) || g->ndim != p->ndim)
      return lt_fail(LT_ERR_SHAPE, "%s: the gradient of parameter %d has shape %s, the parameter %s", op, i + 1,
                     lt_tensor_shape_str(g, b1), lt_tensor_shape_str(p, b2));
    if (g->dtype != p->dtype)
      return lt_fail(LT_ERR_DTYPE, "%s: the gradient of parameter %d is %s, the parameter %s", op, i + 1,
                     lt_dtype_name(g->dtype), lt_dtype_name(p->dtype));
    if (g->storage->device != p->storage->device)
      return lt_fail(LT_ERR_DEVICE, "%s: the gradient of parameter %d is on %s, the parameter on %s", op, i + 1,
                     lt_device_name(g->storage->device, b1), lt_device_name(p->storage->device, b2));
    if (!lt_tensor_is_contiguous(g)) {
      LT_TRY(lt_op_tensor_contiguous((lt_tensor *)g, &tmp[i])); /* (the kernels read gradients flat) */
      g = tmp[i];
    }
    memset(&ts[i], 0, sizeof ts[i]);
    ts[i].param = lt_tensor_ptr(p);
    ts[i].grad = lt_tensor_ptr(g);
    ts[i].numel = lt_tensor_numel(p);
    ts[i].dtype = p->dtype;
    if (is_half(p->dtype)) {
      LT_TRY(check_state(op, "master copy", i, p, masters ? masters[i] : NULL, LT_DTYPE_F32));
      ts[i].master = lt_tensor_ptr(masters[i]);
    }
    if (need_m) {
      LT_TRY(check_state(op, need_v ? "first moment" : "momentum buffer", i, p, ms ? ms[i] : NULL,
                         state_dtype(p->dtype)));
      ts[i].m = lt_tensor_ptr(ms[i]);
    }
    if (need_v) {
      LT_TRY(check_state(op, "second moment", i, p, vs ? vs[i] : NULL, state_dtype(p->dtype)));
      ts[i].v = lt_tensor_ptr(vs[i]);
    }
  }
  *be = n > 0 ? params[0]->storage->backend : NULL;
  return LT_OK;
}

/* Runs fn over a described group, then releases copies and bumps versions. */
typedef lt_status (*group_fn)(const lt_backend_i *be, int n, const lt_optim_tensor *ts, const void *h);

static lt_status run_group(const char *op, int n, lt_tensor *const *params, lt_tensor *const *grads,
                           lt_tensor *const *masters, lt_tensor *const *ms, lt_tensor *const *vs, int need_m,
                           int need_v, group_fn fn, const void *h) {
  if (n < 0)
    return lt_fail(LT_ERR_ARG, "%s: negative number of parameters (%d)", op, n);
  if (n == 0)
    return LT_OK;
  if (!params || !grads)
    return lt_fail(LT_ERR_ARG, "%s: missing parameter or gradient list", op);
  LT_OP_SCOPE(op);
  LT_TRY(lt_check_interrupt(op));
  lt_optim_tensor *ts = calloc((size_t)n, sizeof *ts);
  lt_tensor **tmp = calloc((size_t)n, sizeof *tmp);
  lt_status st = ts && tmp ? LT_OK : lt_fail(LT_ERR_OOM, "%s: out of host memory for %d parameters", op, n);
  const lt_backend_i *be = NULL;
  if (st == LT_OK)
    st = describe(op, n, params, grads, masters, ms, vs, need_m, need_v, ts, tmp, &be);
  if (st == LT_OK)
    st = fn(be, n, ts, h);
  if (st == LT_OK)
    for (int i = 0; i < n; i++)
      lt_bump_version(params[i]); /* (autograd then refuses graphs that saved the old values) */
  for (int i = 0; tmp && i < n; i++)
    lt_tensor_release(tmp[i]);
  free(tmp);
  free(ts);
  return st;
}

/* A gradient scale must be a number in [0, FLT_MAX]: the kernels apply it in
   f32 to f32 and 16-bit parameters (and a NaN fails every comparison). */
static lt_status check_grad_scale(const char *op, double grad_scale) {
  if (!(grad_scale >= 0 && grad_scale <= FLT_MAX))
    return lt_fail(LT_ERR_ARG, "%s: grad_scale must be a number in [0, %g] (f32's largest), got %g", op,
                   (double)FLT_MAX, grad_scale);
  return LT_OK;
}

static lt_status adamw_fn(const lt_backend_i *be, int n, const lt_optim_tensor *ts, const void *h) {
  if (!be->adamw)
    return lt_fail(LT_ERR_UNSUPPORTED, "adamw: not implemented on the %s backend", be->name);
  return be->adamw(n, ts, h);
}

static lt_status sgd_fn(const lt_backend_i *be, int n, const lt_optim_tensor *ts, const void *h) {
  if (!be->sgd)
    return lt_fail(LT_ERR_UNSUPPORTED, "sgd: not implemented on the %s backend", be->name);
  return be->sgd(n, ts, h);
}

lt_status lt_adamw_step(int n, lt_tensor *const *params, lt_tensor *const *grads, lt_tensor *const *masters,
                        lt_tensor *const *exp_avg, lt_tensor *const *exp_avg_sq, double lr, double beta1,
                        double beta2, double eps, double weight_decay, int64_t step, double grad_scale) {
  if (!(lr >= 0) || !(beta1 >= 0 && beta1 < 1) || !(beta2 >= 0 && beta2 < 1) || !(eps >= 0) ||
      !(weight_decay >= 0))
    return lt_fail(LT_ERR_ARG, "adamw: needs lr >= 0, betas in [0, 1), eps >= 0, weight_decay >= 0; got lr=%g "
                   "betas=(%g, %g) eps=%g weight_decay=%g", lr, beta1, beta2, eps, weight_decay);
  if (step < 1)
    return lt_fail(LT_ERR_ARG, "adamw: the step count starts at 1, got %lld", (long long)step);
  LT_TRY(check_grad_scale("adamw", grad_scale));
  lt_adamw_hparams h = {lr, beta1, beta2, eps, weight_decay, 1.0 - pow(beta1, (double)step),
                        1.0 - pow(beta2, (double)step), grad_scale};
  return run_group("adamw", n, params, grads, masters, exp_avg, exp_avg_sq, 1, 1, adamw_fn, &h);
}

lt_status lt_sgd_step(int n, lt_tensor *const *params, lt_tensor *const *grads, lt_tensor *const *masters,
                      lt_tensor *const *momentum_buffers, double lr, double momentum, double dampening,
                      double weight_decay, int nesterov, int first_step, double grad_scale) {
  if (!(lr >= 0) || !(momentum >= 0) || !(dampening >= 0 && dampening <= 1) || !(weight_decay >= 0))
    return lt_fail(LT_ERR_ARG, "sgd: needs lr >= 0, momentum >= 0, dampening in [0, 1], weight_decay >= 0; got "
                   "lr=%g momentum=%g dampening=%g weight_decay=%g", lr, momentum, dampening, weight_decay);
  if (nesterov && (momentum <= 0 || dampening != 0))
    return lt_fail(LT_ERR_ARG, "sgd: Nesterov momentum needs momentum > 0 and dampening 0");
  LT_TRY(check_grad_scale("sgd", grad_scale));
  lt_sgd_hparams h = {lr, momentum, dampening, weight_decay, grad_scale, nesterov != 0, first_step != 0};
  return run_group("sgd", n, params, grads, masters, momentum_buffers, NULL, momentum > 0, 0, sgd_fn, &h);
}

lt_status lt_grad_sum_squares(int n, lt_tensor *const *grads, double *out) {
  LT_OP_SCOPE("grad_norm");
  *out = 0;
  if (n < 0)
    return lt_fail(LT_ERR_ARG, "grad_norm: negative number of gradients (%d)", n);
  if (n == 0)
    return LT_OK;
  lt_optim_tensor *ts = calloc((size_t)n, sizeof *ts);
  lt_tensor **tmp = calloc((size_t)n, sizeof *tmp);
  double *parts = calloc((size_t)n, sizeof *parts);
  lt_status st = ts && tmp && parts ? LT_OK : lt_fail(LT_ERR_OOM, "grad_norm: out of host memory");
  char b1[200], b2[200];
  for (int i = 0; st == LT_OK && i < n; i++) {
    lt_tensor *g = grads[i];
    if ((st = lt_check_tensor("grad_norm", g, i + 1)) != LT_OK)
      break;
    if (!lt_dtype_is_float(g->dtype)) {
      st = lt_fail(LT_ERR_DTYPE, "grad_norm: gradient %d is %s", i + 1, lt_dtype_name(g->dtype));
      break;
    }
    if (g->storage->device != grads[0]->storage->device) {
      st = lt_fail(LT_ERR_DEVICE, "grad_norm: gradients 1 and %d are on %s and %s; call once per device", i + 1,
                   lt_device_name(grads[0]->storage->device, b1), lt_device_name(g->storage->device, b2));
      break;
    }
    if (!lt_tensor_is_contiguous(g)) {
      if ((st = lt_op_tensor_contiguous((lt_tensor *)g, &tmp[i])) != LT_OK)
        break;
      g = tmp[i];
    }
    ts[i].grad = lt_tensor_ptr(g);
    ts[i].numel = lt_tensor_numel(g);
    ts[i].dtype = g->dtype;
  }
  if (st == LT_OK) {
    const lt_backend_i *be = grads[0]->storage->backend;
    st = be->grad_sum_squares ? be->grad_sum_squares(n, ts, parts)
                              : lt_fail(LT_ERR_UNSUPPORTED, "grad_norm: not implemented on the %s backend", be->name);
  }
  if (st == LT_OK)
    for (int i = 0; i < n; i++)
      *out += parts[i];
  lt_canonical_nans(out, 1);
  for (int i = 0; tmp && i < n; i++)
    lt_tensor_release(tmp[i]);
  free(tmp);
  free(ts);
  free(parts);
  return st;
}
