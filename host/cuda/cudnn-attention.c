/*
 * cuda/cudnn-attention.c: scaled-dot-product attention on the GPU through cuDNN's
 * fused flash-attention engines (FlashAttention-2, Dao 2023): the plans of
 * the graphs cuda/cudnn-graph.c describes, and their execution on the
 * device's compute stream. Plans (the finalized execution plans and their
 * workspace sizes) are cached per device, shape, strides and dtype, and so
 * are refusals: a shape cuDNN does not take costs one attempt, and the
 * caller falls back to lutra's kernels with the reason. Without cuDNN 9's
 * headers, every entry point says so.
 */
#ifdef LT_WITH_CUDA

#include "cuda/backend.h"
#include "base/status.h"

#if !__has_include(<cudnn_graph.h>)
/* Built where cuDNN 9's headers are missing: attention falls back to lutra's
   kernels, saying why once. */
static lt_status no_cudnn(void) {
  return lt_fail(LT_ERR_UNSUPPORTED, "scaled_dot_product_attention: lutra was built without cuDNN 9's headers "
                                     "(cudnn_graph.h)");
}
lt_status lt_cudnn_sdpa_prepare(const lt_sdpa_desc *d, int backward) {
  (void)d, (void)backward;
  return no_cudnn();
}
lt_status lt_cudnn_sdpa_fwd(const lt_sdpa_desc *d) {
  (void)d;
  return no_cudnn();
}
lt_status lt_cudnn_sdpa_bwd(const lt_sdpa_desc *d) {
  (void)d;
  return no_cudnn();
}
void lt_cuda_set_deterministic(int on) { (void)on; }
int lt_cuda_deterministic(void) { return 0; }
int64_t lt_cudnn_version(void) { return 0; }
lt_status lt_cudnn_sdpa_check_graph(const lt_sdpa_desc *d, int backward) {
  (void)d, (void)backward;
  return no_cudnn();
}
lt_status lt_cudnn_sdpa_check_plan(const lt_sdpa_desc *d, int backward, const char *device_json, int64_t *workspace) {
  (void)d, (void)backward, (void)device_json, (void)workspace;
  return no_cudnn();
}
lt_status lt_cudnn_device_properties(int device_index, char *buf, int64_t cap, int64_t *len) {
  (void)device_index, (void)buf, (void)cap, (void)len;
  return no_cudnn();
}
#else

#include "cuda/cudnn-graph.h"

#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { MAX_PLANS = 256 };

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int deterministic;

void lt_cuda_set_deterministic(int on) { __atomic_store_n(&deterministic, on != 0, __ATOMIC_RELAXED); }
int lt_cuda_deterministic(void) { return __atomic_load_n(&deterministic, __ATOMIC_RELAXED); }

int64_t lt_cudnn_version(void) {
  pthread_mutex_lock(&lock);
  lt_status st = lt_cudnn_open();
  pthread_mutex_unlock(&lock);
  return st == LT_OK ? (int64_t)lt_cudnn_loaded_version() : 0;
}

/* ---- plans: an operation graph, the heuristics' engine configs, the first plan that builds ---- */

typedef struct plan_key {
  int backward, dtype, causal, deterministic;
  int64_t B, NH, NKV, T, S, HS;
  int64_t strides[8][4];
} plan_key;

typedef struct plan {
  plan_key key;
  builder *b;                 /* every descriptor, alive as long as the plan */
  cudnnBackendDescriptor_t x; /* NULL when cuDNN refused the graph: why says why */
  int dead;                   /* cuDNN would not execute it: refused as well */
  int compiled;               /* (planned for a device property descriptor) an engine compiled its
                                 kernels, which only a driver could then load */
  int64_t workspace;
  char why[300];
} plan;

typedef struct device_state {
  cudnnHandle_t handle;
  plan **plans;
  int nplans, cap;
} device_state;

static device_state devices[LT_CUDA_MAX_DEVICES];

static plan_key key_of(const lt_sdpa_desc *d, int backward) {
  plan_key k;
  memset(&k, 0, sizeof k); /* padding too: keys compare with memcmp */
  k.backward = backward, k.dtype = d->dtype, k.causal = d->causal;
  k.deterministic = backward && d->deterministic;
  k.B = d->B, k.NH = d->NH, k.NKV = d->NKV, k.T = d->T, k.S = d->S, k.HS = d->HS;
  const int64_t *s[8] = {d->sq, d->sk, d->sv, d->so, d->sdo, d->sdq, d->sdk, d->sdv};
  for (int i = 0; i < 8; i++)
    memcpy(k.strides[i], s[i], sizeof k.strides[i]);
  return k;
}

/* Builds the plan of p->key's graph into p (p->x NULL and p->why set when
   cuDNN refuses it): for handle's device, or, handle NULL, for the device
   devprop describes (a device property descriptor: cuDNN 9.8 and later
   plan without the device). */
static void build_plan(cudnnHandle_t handle, cudnnBackendDescriptor_t devprop, const lt_sdpa_desc *d, plan *p) {
  builder *b = p->b;
  graph g = {b, {0}, 0};
  if (p->key.backward)
    lt_cudnn_backward_graph(&g, d, p->key.deterministic);
  else
    lt_cudnn_forward_graph(&g, d);
  cudnnBackendDescriptor_t og = make(b, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  if (handle)
    set_lenient(b, og, ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, &handle);
  SET(b, og, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, g.nops, g.ops);
  finalize(b, og, "the operation graph");
  /* engine configs from heuristics mode A, then the fallback list; a mode
     that offers nothing is skipped */
  cudnnBackendDescriptor_t cfgs[32];
  int ncfg = 0;
  cudnnBackendHeurMode_t modes[2] = {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK};
  for (int m = 0; m < 2 && !b->failed; m++) {
    cudnnBackendDescriptor_t heur = make(b, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    SET(b, heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &og);
    SET(b, heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &modes[m]);
    if (devprop)
      SET(b, heur, CUDNN_ATTR_ENGINEHEUR_DEVICEPROP, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &devprop);
    if (b->failed)
      break;
    cudnnStatus_t st = lt_dnn.cudnnBackendFinalize(heur);
    int64_t count = 0;
    if (st == CUDNN_STATUS_SUCCESS)
      st = lt_dnn.cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count,
                                        NULL);
    if (st != CUDNN_STATUS_SUCCESS) {
      note_why(b, "the engine heuristics", st);
      continue;
    }
    if (count > 32 - ncfg)
      count = 32 - ncfg;
    if (count <= 0)
      continue;
    int first = b->n;
    for (int64_t i = 0; i < count; i++)
      make(b, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    int64_t got = 0;
    if (b->failed)
      break;
    st = lt_dnn.cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got,
                                      &b->descs[first]);
    if (st != CUDNN_STATUS_SUCCESS)
      note_why(b, "the engine heuristics' results", st);
    else
      for (int64_t i = 0; i < got && i < count; i++)
        cfgs[ncfg++] = b->descs[first + i];
  }
  for (int i = 0; i < ncfg && !b->failed && !p->x; i++) {
    cudnnBackendDescriptor_t x = NULL;
    if (lt_dnn.cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &x) != CUDNN_STATUS_SUCCESS)
      break;
    /* the plan's handle: required before cuDNN 9.8 (cudnn-frontend refuses a
       plan without it), deprecated since */
    if (handle)
      set_lenient(b, x, ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, &handle);
    cudnnStatus_t st = devprop ? lt_dnn.cudnnBackendSetAttribute(x, CUDNN_ATTR_EXECUTION_PLAN_DEVICEPROP,
                                                              CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &devprop)
                               : CUDNN_STATUS_SUCCESS;
    if (st == CUDNN_STATUS_SUCCESS)
      st = lt_dnn.cudnnBackendSetAttribute(x, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                                        &cfgs[i]);
    if (st == CUDNN_STATUS_SUCCESS)
      st = lt_dnn.cudnnBackendFinalize(x);
    int64_t ws = 0, n = 0;
    if (st == CUDNN_STATUS_SUCCESS)
      st = lt_dnn.cudnnBackendGetAttribute(x, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &n, &ws);
    if (st == CUDNN_STATUS_SUCCESS && b->n < MAX_DESCS) {
      b->descs[b->n++] = x;
      p->x = x;
      p->workspace = ws;
    } else {
      note_why(b, "no engine config built a plan", st);
      lt_dnn.cudnnBackendDestroyDescriptor(x);
      if (devprop && !handle && st == CUDNN_STATUS_EXECUTION_FAILED_CUDA_DRIVER)
        p->compiled = 1;
    }
  }
  if (!p->x) {
    snprintf(p->why, sizeof p->why, "%s", b->why[0] ? b->why : "cuDNN offered no engine for this graph");
    builder_free(b); /* a refusal keeps only its reason */
  }
}

/* The device's state, cuDNN opened and its handle made on first use. */
static lt_status device_of(lt_device device, lt_cuda_ctx **cc, device_state **out) {
  LT_TRY(lt_cuda_ctx_get(device, cc)); /* (makes it current) */
  int index = (*cc)->index;
  LT_TRY(lt_cudnn_open());
  device_state *ds = &devices[index];
  if (!ds->handle) {
    cudnnStatus_t s = lt_dnn.cudnnCreate(&ds->handle);
    if (s != CUDNN_STATUS_SUCCESS) {
      ds->handle = NULL;
      return lt_fail(LT_ERR_UNSUPPORTED, "cuda:%d: cuDNN failed to start: %s", index, lt_dnn.cudnnGetErrorString(s));
    }
    s = lt_dnn.cudnnSetStream(ds->handle, (*cc)->compute);
    if (s != CUDNN_STATUS_SUCCESS) { /* (on another stream, reusing freed memory would race) */
      ds->handle = NULL;
      return lt_fail(LT_ERR_UNSUPPORTED, "cuda:%d: cuDNN would not take lutra's stream: %s", index,
                     lt_dnn.cudnnGetErrorString(s));
    }
  }
  *out = ds;
  return LT_OK;
}

static const char *describe(const lt_sdpa_desc *d, char *buf, size_t n) {
  snprintf(buf, n, "q (%lld, %lld, %lld, %lld), k/v heads %lld, keys %lld, %s%s", (long long)d->B, (long long)d->NH,
           (long long)d->T, (long long)d->HS, (long long)d->NKV, (long long)d->S, lt_dtype_name(d->dtype),
           d->causal ? ", causal" : "");
  return buf;
}

/* The plan of d's forward or backward graph (built and cached on first use). */
static lt_status plan_for(const lt_sdpa_desc *d, int backward, lt_cuda_ctx **cc, device_state **dso, plan **out) {
  device_state *ds = NULL;
  LT_TRY(device_of(d->device, cc, &ds));
  *dso = ds;
  char buf[200];
  if (backward && lt_cudnn_loaded_version() <= 91500 && d->S % 128)
    return lt_fail(LT_ERR_UNSUPPORTED, "scaled_dot_product_attention: cuDNN %zu.%zu's backward needs a key count "
                   "divisible by 128 (%s)", lt_cudnn_loaded_version() / 10000, lt_cudnn_loaded_version() / 100 % 100, describe(d, buf, sizeof buf));
  if (backward && d->T == 1 && d->S == 1)
    return lt_fail(LT_ERR_UNSUPPORTED, "scaled_dot_product_attention: cuDNN's backward does not take one query "
                   "over one key");
  plan_key k = key_of(d, backward);
  plan *p = NULL;
  for (int i = 0; i < ds->nplans && !p; i++)
    if (memcmp(&ds->plans[i]->key, &k, sizeof k) == 0)
      p = ds->plans[i];
  if (!p && ds->nplans == MAX_PLANS) { /* a workload of ever-new shapes: start over (as cuda/cublaslt.c) */
    for (int i = 0; i < ds->nplans; i++) {
      builder_free(ds->plans[i]->b);
      free(ds->plans[i]->b);
      free(ds->plans[i]);
    }
    ds->nplans = 0;
  }
  if (!p) {
    if (ds->nplans == ds->cap) {
      int cap = ds->cap ? 2 * ds->cap : 16;
      plan **np = realloc(ds->plans, (size_t)cap * sizeof *np);
      if (!np)
        return lt_fail(LT_ERR_OOM, "scaled_dot_product_attention: out of host memory for cuDNN plans");
      ds->plans = np, ds->cap = cap;
    }
    p = calloc(1, sizeof *p);
    if (p)
      p->b = calloc(1, sizeof *p->b);
    if (!p || !p->b) {
      free(p);
      return lt_fail(LT_ERR_OOM, "scaled_dot_product_attention: out of host memory for cuDNN plans");
    }
    p->key = k;
    build_plan(ds->handle, NULL, d, p);
    ds->plans[ds->nplans++] = p;
  }
  if (!p->x || p->dead) {
    return lt_fail(LT_ERR_UNSUPPORTED, "scaled_dot_product_attention: cuDNN refused the %s for %s (%s)",
                   backward ? "backward" : "forward", describe(d, buf, sizeof buf), p->why);
  }
  *out = p;
  return LT_OK;
}

lt_status lt_cudnn_sdpa_prepare(const lt_sdpa_desc *d, int backward) {
  pthread_mutex_lock(&lock);
  lt_cuda_ctx *cc;
  device_state *ds;
  plan *p;
  lt_status st = plan_for(d, 0, &cc, &ds, &p);
  if (st == LT_OK && backward)
    st = plan_for(d, 1, &cc, &ds, &p);
  pthread_mutex_unlock(&lock);
  return st;
}

/* what masked scores become: -inf, or -FLT_MAX before cuDNN 9.10 (as cudnn-frontend) */
static float mask_value(void) { return lt_cudnn_loaded_version() < 91000 ? -FLT_MAX : -INFINITY; }

typedef struct pack {
  int64_t uids[16];
  void *ptrs[16];
  int n;
} pack;

static void put(pack *vp, int64_t uid, const void *ptr) {
  vp->uids[vp->n] = uid;
  vp->ptrs[vp->n++] = (void *)ptr;
}

/* Runs plan p over the variant pack on the compute stream, with a workspace
   from the caching allocator (stream order makes its reuse safe). */
static lt_status execute(lt_cuda_ctx *cc, device_state *ds, plan *p, pack *vp) {
  lt_device dev = LT_DEVICE_CUDA + cc->index;
  void *ws = NULL;
  if (p->workspace > 0)
    LT_TRY(lt_backend_cuda.alloc(dev, (size_t)p->workspace, &ws));
  builder b = {0};
  cudnnBackendDescriptor_t varpack = make(&b, CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  SET(&b, varpack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws);
  SET(&b, varpack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, vp->n, vp->ptrs);
  SET(&b, varpack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, vp->n, vp->uids);
  finalize(&b, varpack, "the variant pack");
  if (!b.failed) {
    cudnnStatus_t s = lt_dnn.cudnnBackendExecute(ds->handle, p->x, varpack);
    if (s != CUDNN_STATUS_SUCCESS)
      fail_with(&b, "cudnnBackendExecute", s);
  }
  builder_free(&b);
  if (ws)
    lt_backend_cuda.free(dev, ws, (size_t)p->workspace);
  if (b.failed) { /* nothing ran: the plan is refused from now on, and the caller falls back */
    snprintf(p->why, sizeof p->why, "%s", b.why);
    p->dead = 1;
    return lt_fail(LT_ERR_UNSUPPORTED, "cuda:%d: scaled_dot_product_attention: cuDNN would not run its plan: %s",
                   cc->index, b.why);
  }
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    return lt_cuda_error("cuDNN attention", cc->index, e);
  if (lt_cuda_profiling()) { /* lt.cuda.profile_start: named by pass and shape */
    char what[64];
    snprintf(what, sizeof what, "cuDNN attention %s %lldx%lldx%lldx%lld%s", p->key.backward ? "bwd" : "fwd",
             (long long)p->key.B, (long long)p->key.NH, (long long)p->key.T, (long long)p->key.HS,
             p->key.causal ? " causal" : "");
    lt_cuda_profile_mark(what);
  }
  return LT_OK;
}

lt_status lt_cudnn_sdpa_fwd(const lt_sdpa_desc *d) {
  pthread_mutex_lock(&lock);
  lt_cuda_ctx *cc;
  device_state *ds;
  plan *p;
  lt_status st = plan_for(d, 0, &cc, &ds, &p);
  if (st == LT_OK) {
    float scale = (float)d->scale, neg_inf = mask_value();
    pack vp = {{0}, {0}, 0};
    put(&vp, ID_Q, d->q), put(&vp, ID_K, d->k), put(&vp, ID_V, d->v), put(&vp, ID_O, d->o);
    put(&vp, ID_STATS, d->stats), put(&vp, ID_SCALE, &scale);
    if (d->causal)
      put(&vp, ID_NEG_INF, &neg_inf);
    st = execute(cc, ds, p, &vp);
  }
  pthread_mutex_unlock(&lock);
  return st;
}

lt_status lt_cudnn_sdpa_bwd(const lt_sdpa_desc *d) {
  pthread_mutex_lock(&lock);
  lt_cuda_ctx *cc;
  device_state *ds;
  plan *p;
  lt_status st = plan_for(d, 1, &cc, &ds, &p);
  void *softmax_sum = NULL, *dq_accum = NULL;
  size_t rows_bytes = (size_t)(d->B * d->NH * d->T) * 4, accum_bytes = rows_bytes * (size_t)d->HS;
  int det = st == LT_OK && p->key.deterministic;
  lt_device dev = LT_DEVICE_CUDA;
  if (st == LT_OK) {
    dev = LT_DEVICE_CUDA + cc->index;
    st = lt_backend_cuda.alloc(dev, rows_bytes, &softmax_sum);
  }
  if (st == LT_OK && !det)
    st = lt_backend_cuda.alloc(dev, accum_bytes, &dq_accum);
  if (st == LT_OK && !det && lt_cudnn_loaded_version() < 90600) { /* older cuDNN adds into the accumulator */
    cudaError_t e = cudaMemsetAsync(dq_accum, 0, accum_bytes, cc->compute);
    if (e != cudaSuccess)
      st = lt_cuda_error("clearing cuDNN's dQ accumulator", cc->index, e);
  }
  if (st == LT_OK) {
    float scale = (float)d->scale, neg_inf = mask_value(), one = 1.0f;
    pack vp = {{0}, {0}, 0};
    put(&vp, ID_Q, d->q), put(&vp, ID_K, d->k), put(&vp, ID_V, d->v), put(&vp, ID_O, d->o);
    put(&vp, ID_DO, d->dout), put(&vp, ID_STATS, d->stats), put(&vp, ID_DQ, d->dq), put(&vp, ID_DK, d->dk);
    put(&vp, ID_DV, d->dv), put(&vp, ID_SCALE, &scale), put(&vp, ID_ONE, &one);
    put(&vp, ID_SOFTMAX_SUM, softmax_sum);
    if (!det)
      put(&vp, ID_DQ_ACCUM, dq_accum);
    if (d->causal)
      put(&vp, ID_NEG_INF, &neg_inf);
    st = execute(cc, ds, p, &vp);
  }
  if (softmax_sum)
    lt_backend_cuda.free(dev, softmax_sum, rows_bytes);
  if (dq_accum)
    lt_backend_cuda.free(dev, dq_accum, accum_bytes);
  pthread_mutex_unlock(&lock);
  return st;
}


/* Builds d's forward (backward 0), backward (1) or deterministic backward
   (2) operation graph and finalizes it, with no
   device (cuDNN 9.8 and later need none for that): whether cuDNN takes the
   descriptors this file makes. LT_ERR_UNSUPPORTED with cuDNN's reason when
   not (or when cuDNN cannot be loaded). For tests on machines without a GPU. */
lt_status lt_cudnn_sdpa_check_graph(const lt_sdpa_desc *d, int backward) {
  LT_TRY(lt_cudnn_open());
  builder b;
  memset(&b, 0, sizeof b);
  graph g = {&b, {0}, 0};
  if (backward)
    lt_cudnn_backward_graph(&g, d, backward == 2);
  else
    lt_cudnn_forward_graph(&g, d);
  cudnnBackendDescriptor_t og = make(&b, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  SET(&b, og, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, g.nops, g.ops);
  finalize(&b, og, "the operation graph");
  lt_status st = b.failed ? lt_fail(LT_ERR_UNSUPPORTED, "cuDNN refused the %s graph: %s",
                                    backward == 2 ? "deterministic backward" : backward ? "backward" : "forward", b.why)
                          : LT_OK;
  builder_free(&b);
  return st;
}

/* Builds d's forward (backward 0), backward (1) or deterministic backward
   (2) graph and its execution plan for the device a cuDNN device property
   descriptor describes (device_json: its JSON representation, as cuDNN 9.8+
   writes and reads it), with no device: heuristics, engine configs, a plan
   compiled for that device. LT_OK with the plan's workspace bytes in
   *workspace, or -1 there when an engine took the graph and compiled its
   kernels but the plan could not load them (CUDA's stub libcuda, or no
   driver); LT_ERR_UNSUPPORTED with cuDNN's reason when no engine takes
   the graph (or cuDNN cannot be loaded). For tests on machines without a
   GPU (tests/c/test_cudnn_graph.c). */
lt_status lt_cudnn_sdpa_check_plan(const lt_sdpa_desc *d, int backward, const char *device_json, int64_t *workspace) {
  LT_TRY(lt_cudnn_open());
  plan p;
  memset(&p, 0, sizeof p);
  p.b = calloc(1, sizeof *p.b);
  if (!p.b)
    return lt_fail(LT_ERR_OOM, "out of host memory");
  p.key = key_of(d, backward != 0);
  p.key.deterministic = backward == 2;
  cudnnBackendDescriptor_t devprop = make(p.b, CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR);
  SET(p.b, devprop, CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION, CUDNN_TYPE_CHAR, (int64_t)strlen(device_json),
      device_json);
  finalize(p.b, devprop, "the device properties");
  lt_status st;
  if (p.b->failed) {
    st = lt_fail(LT_ERR_UNSUPPORTED, "cuDNN refused the device properties: %s", p.b->why);
  } else {
    build_plan(NULL, devprop, d, &p);
    st = p.x || p.compiled
             ? LT_OK
             : lt_fail(LT_ERR_UNSUPPORTED, "cuDNN planned no %s for it: %s",
                       backward == 2 ? "deterministic backward" : backward ? "backward" : "forward", p.why);
    if (st == LT_OK && workspace)
      *workspace = p.x ? p.workspace : -1;
  }
  builder_free(p.b);
  free(p.b);
  return st;
}

lt_status lt_cudnn_device_properties(int device_index, char *buf, int64_t cap, int64_t *len) {
  lt_cuda_ctx *cc;
  device_state *ds;
  pthread_mutex_lock(&lock);
  lt_status st = device_of(LT_DEVICE_CUDA + device_index, &cc, &ds);
  pthread_mutex_unlock(&lock);
  LT_TRY(st);
  builder b;
  memset(&b, 0, sizeof b);
  int32_t id = device_index;
  cudnnBackendDescriptor_t dp = make(&b, CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR);
  SET(&b, dp, CUDNN_ATTR_DEVICEPROP_DEVICE_ID, CUDNN_TYPE_INT32, 1, &id);
  finalize(&b, dp, "the device properties");
  int64_t n = 0;
  if (!b.failed) {
    cudnnStatus_t s = lt_dnn.cudnnBackendGetAttribute(dp, CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION, CUDNN_TYPE_CHAR, 0,
                                                  &n, NULL);
    if (s == CUDNN_STATUS_SUCCESS && n < cap)
      s = lt_dnn.cudnnBackendGetAttribute(dp, CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION, CUDNN_TYPE_CHAR, n, &n, buf);
    if (s != CUDNN_STATUS_SUCCESS)
      fail_with(&b, "reading the device properties", s);
  }
  builder_free(&b);
  if (b.failed)
    return lt_fail(LT_ERR_UNSUPPORTED, "cuda:%d: cuDNN did not describe the device: %s", device_index, b.why);
  if (n >= cap)
    return lt_fail(LT_ERR_ARG, "cuDNN's device description takes %lld bytes, more than %lld", (long long)n,
                   (long long)cap);
  buf[n] = 0;
  *len = (int64_t)strlen(buf);
  return LT_OK;
}

#endif /* cudnn_graph.h */
#endif /* LT_WITH_CUDA */
