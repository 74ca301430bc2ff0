/*
 * comm/nccl.c: the collectives of host/comm/comm.c for CUDA tensors, through
 * NCCL. Each group (lt_comm) gets one NCCL communicator per device, made on
 * its first CUDA collective: rank 0 of the group draws the unique id
 * (ncclGetUniqueId) and the group's MPI communicator broadcasts it (a single
 * process needs none), then ncclCommInitRank. Operations run on the
 * device's communication stream after the compute stream's work so far (an
 * event), and the compute stream waits for them with another event, so the
 * host never blocks: later kernels simply start after the transfer.
 * all_gather and reduce_scatter need equal chunks here (NCCL has no
 * v-forms): other sizes are an error naming the sizes. The front
 * (comm/comm.c) does the checks and the agreement first; this is the
 * lt_comm_impl of comm/comm-impl.h that lt_comm_nccl() gives (NULL in a
 * build without CUDA). No point-to-point yet (ncclSend/ncclRecv would
 * fit the same way): send and recv of CUDA tensors go by the group's
 * implementation, as before.
 *
 * NCCL is opened with dlopen at the first CUDA collective (as cuBLASLt is),
 * so lutra starts, and runs on the CPU, without it.
 *
 * Written against nccl.h 2.28 (ncclAvg needs 2.10); NOT YET RUN on a GPU.
 */
#ifdef LT_WITH_CUDA
#include "cuda/backend.h"
#include "comm/comm-impl.h"
#include "base/status.h"

#include <dlfcn.h>
#include <nccl.h>
#include <stdlib.h>
#include <string.h>

#define NCCL_FUNCS(X)                                                                                        \
  X(ncclGetUniqueId) X(ncclCommInitRank) X(ncclCommDestroy) X(ncclGetErrorString) X(ncclAllReduce)            \
  X(ncclBroadcast) X(ncclAllGather) X(ncclReduceScatter)

static struct {
#define X(f) __typeof__(f) *f;
  NCCL_FUNCS(X)
#undef X
} nccl;

#ifndef LT_CUDA_LIBDIR
#define LT_CUDA_LIBDIR "/usr/local/cuda/lib64"
#endif

static lt_status nccl_open(void) {
  static void *lib;
  if (lib)
    return LT_OK;
  void *h = lt_cuda_library("libnccl.so.2", NULL); /* (cuda/libraries.c; the emulator's is linked into lutra) */
  if (!h)
    h = dlopen(LT_CUDA_LIBDIR "/libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
  if (!h)
    return lt_fail(LT_ERR_DEVICE, "NCCL could not be loaded (libnccl.so.2, also tried %s): %s", LT_CUDA_LIBDIR,
                   dlerror());
#define X(f)                                                                         \
  if (!(nccl.f = (__typeof__(f) *)dlsym(h, #f))) {                                    \
    dlclose(h);                                                                      \
    return lt_fail(LT_ERR_DEVICE, "NCCL lacks %s: a version older than 2.10?", #f); \
  }
  NCCL_FUNCS(X)
#undef X
  lib = h;
  return LT_OK;
}

static lt_status nccl_check(ncclResult_t r, const char *what, int device) {
  if (r == ncclSuccess)
    return LT_OK;
  return lt_fail(LT_ERR_DEVICE, "cuda:%d: %s: NCCL error %d (%s)", device, what, (int)r,
                 nccl.ncclGetErrorString ? nccl.ncclGetErrorString(r) : "?");
}

/* one communicator per (group, device) */
typedef struct nccl_entry {
  int group_id, device;
  ncclComm_t comm;
  struct nccl_entry *next;
} nccl_entry;
static nccl_entry *entries;

static lt_status comm_for(lt_comm *c, int device, ncclComm_t *out) {
  for (nccl_entry *e = entries; e; e = e->next)
    if (e->group_id == lt_comm_id(c) && e->device == device) {
      *out = e->comm;
      return LT_OK;
    }
  LT_TRY(nccl_open());
  ncclUniqueId id;
  memset(&id, 0, sizeof id);
  if (lt_comm_rank(c) == 0)
    LT_TRY(nccl_check(nccl.ncclGetUniqueId(&id), "ncclGetUniqueId", device));
  LT_TRY(lt_comm_bcast_bytes(c, &id, (int)sizeof id, 0));
  nccl_entry *e = calloc(1, sizeof *e);
  if (!e)
    return lt_fail(LT_ERR_OOM, "NCCL: out of memory");
  lt_cuda_ctx *ctx;
  lt_status st = lt_cuda_ctx_get(LT_DEVICE_CUDA + device, &ctx); /* makes the device current */
  if (st == LT_OK)
    st = nccl_check(nccl.ncclCommInitRank(&e->comm, lt_comm_size(c), id, lt_comm_rank(c)), "ncclCommInitRank",
                    device);
  if (st != LT_OK) {
    free(e);
    return st;
  }
  e->group_id = lt_comm_id(c);
  e->device = device;
  e->next = entries;
  entries = e;
  *out = e->comm;
  return LT_OK;
}

static int nccl_type(lt_dtype d, ncclDataType_t *out) {
  switch (d) {
  case LT_DTYPE_F32: *out = ncclFloat32; return 1;
  case LT_DTYPE_F64: *out = ncclFloat64; return 1;
  case LT_DTYPE_BF16: *out = ncclBfloat16; return 1;
  case LT_DTYPE_F16: *out = ncclFloat16; return 1;
  case LT_DTYPE_I32: *out = ncclInt32; return 1;
  case LT_DTYPE_I64: *out = ncclInt64; return 1;
  case LT_DTYPE_U8: *out = ncclUint8; return 1;
  default: return 0;
  }
}

static ncclRedOp_t nccl_op(lt_comm_op op) {
  switch (op) {
  case LT_COMM_AVG: return ncclAvg;
  case LT_COMM_MAX: return ncclMax;
  case LT_COMM_MIN: return ncclMin;
  default: return ncclSum;
  }
}

/* `waiter` runs nothing further until `done` has finished its work so far */
static lt_status stream_waits(lt_cuda_ctx *ctx, cudaStream_t waiter, cudaStream_t done) {
  cudaEvent_t ev;
  cudaError_t e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
  if (e == cudaSuccess)
    e = cudaEventRecord(ev, done);
  if (e == cudaSuccess)
    e = cudaStreamWaitEvent(waiter, ev, 0);
  cudaEventDestroy(ev);
  return e == cudaSuccess ? LT_OK : lt_cuda_error("collective: ordering the streams", ctx->index, e);
}

enum { LT_NCCL_ALL_REDUCE = 1, LT_NCCL_BROADCAST, LT_NCCL_ALL_GATHER, LT_NCCL_REDUCE_SCATTER };

/* One NCCL collective on CUDA tensors, ordered on the device's streams; in ==
   out for all_reduce and broadcast. */
static lt_status nccl_collective(lt_comm *c, int kind, lt_tensor *out, const lt_tensor *in, lt_comm_op op, int root) {
  int device = (int)(in->storage->device - LT_DEVICE_CUDA);
  if (out->storage->device != in->storage->device)
    return lt_fail(LT_ERR_DEVICE, "collective: input on cuda:%d, output on another device", device);
  ncclDataType_t dt;
  if (!nccl_type(in->dtype, &dt))
    return lt_fail(LT_ERR_DTYPE, "collective: NCCL has no %s", lt_dtype_name(in->dtype));
  lt_cuda_ctx *ctx;
  LT_TRY(lt_cuda_ctx_get(in->storage->device, &ctx));
  ncclComm_t comm = NULL;
  LT_TRY(comm_for(c, device, &comm));
  LT_TRY(stream_waits(ctx, ctx->comm, ctx->compute)); /* after the compute work so far */
  size_t n = (size_t)lt_tensor_numel(in);
  ncclResult_t r;
  const char *what;
  switch (kind) {
  case LT_NCCL_ALL_REDUCE:
    what = "ncclAllReduce";
    r = nccl.ncclAllReduce(lt_tensor_ptr(in), lt_tensor_ptr(out), n, dt, nccl_op(op), comm, ctx->comm);
    break;
  case LT_NCCL_BROADCAST:
    what = "ncclBroadcast";
    r = nccl.ncclBroadcast(lt_tensor_ptr(in), lt_tensor_ptr(out), n, dt, root, comm, ctx->comm);
    break;
  case LT_NCCL_ALL_GATHER: /* in: this rank's n elements; out: size x n */
    what = "ncclAllGather";
    r = nccl.ncclAllGather(lt_tensor_ptr(in), lt_tensor_ptr(out), n, dt, comm, ctx->comm);
    break;
  default: /* reduce_scatter: in: size x m elements; out: this rank's m */
    what = "ncclReduceScatter";
    r = nccl.ncclReduceScatter(lt_tensor_ptr(in), lt_tensor_ptr(out), (size_t)lt_tensor_numel(out), dt,
                               nccl_op(op), comm, ctx->comm);
    break;
  }
  LT_TRY(nccl_check(r, what, device));
  return stream_waits(ctx, ctx->compute, ctx->comm); /* later kernels after the transfer */
}

static lt_status nccl_all_reduce(lt_work *w, lt_tensor *t, lt_comm_op op) {
  return nccl_collective(w->comm, LT_NCCL_ALL_REDUCE, t, t, op, 0);
}

static lt_status nccl_broadcast(lt_work *w, lt_tensor *t, int root) {
  return nccl_collective(w->comm, LT_NCCL_BROADCAST, t, t, LT_COMM_SUM, root);
}

static lt_status nccl_all_gather(lt_work *w, lt_tensor *out, const lt_tensor *t, const int64_t *counts) {
  (void)counts; /* equal (check_all_gather) */
  return nccl_collective(w->comm, LT_NCCL_ALL_GATHER, out, t, LT_COMM_SUM, 0);
}

static lt_status nccl_reduce_scatter(lt_work *w, lt_tensor *out, lt_tensor *t, lt_comm_op op) {
  return nccl_collective(w->comm, LT_NCCL_REDUCE_SCATTER, out, t, op, 0);
}

static lt_status nccl_check_all_gather(const lt_comm *c, const int64_t *counts) {
  for (int r = 1; r < c->size; r++)
    if (counts[r] != counts[0])
      return lt_fail(LT_ERR_SHAPE, "all_gather of CUDA tensors: NCCL needs the same rows on every rank (rank 0 has %lld, rank %d %lld)",
                     (long long)counts[0], r, (long long)counts[r]);
  return LT_OK;
}

static lt_status nccl_check_reduce_scatter(const lt_comm *c, int64_t rows) {
  if (rows % c->size != 0)
    return lt_fail(LT_ERR_SHAPE, "reduce_scatter of CUDA tensors: NCCL needs rows divisible by the %d ranks, got %lld",
                   c->size, (long long)rows);
  return LT_OK;
}

static const lt_comm_impl nccl_impl = {
    .name = "NCCL",
    .agrees = 0, /* (the group's implementation agrees, before NCCL runs) */
    .check_all_gather = nccl_check_all_gather,
    .check_reduce_scatter = nccl_check_reduce_scatter,
    .all_reduce = nccl_all_reduce,
    .broadcast = nccl_broadcast,
    .all_gather = nccl_all_gather,
    .reduce_scatter = nccl_reduce_scatter,
};

const lt_comm_impl *lt_comm_nccl(void) { return &nccl_impl; }

#else /* a build without CUDA: no CUDA tensors to move */
#include "comm/comm-impl.h"

const lt_comm_impl *lt_comm_nccl(void) { return NULL; }
#endif
