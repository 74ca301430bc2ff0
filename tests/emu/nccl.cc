/*
 * nccl.cc: the CUDA emulator's NCCL, the eight calls host/comm/nccl.c makes:
 * the API, its arguments checked as NCCL checks them (data types,
 * reduction operations, the root, buffers) when the call is made, and a
 * communicator of one rank, whose every collective is a copy from the send
 * buffer to the receive buffer (NCCL's semantics, nccl.h: all_reduce of
 * count elements, broadcast from root 0, all_gather of sendcount,
 * reduce_scatter of recvcount; in place when the buffers are the same)
 * done in the stream's order (emu_queue.h). A communicator of several ranks,
 * one process each, meets in shared memory: nccl_ranks.cc.
 */
#include "nccl_emu.h"

#include "emu_queue.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include <string>

namespace nccl_emu {

size_t type_size(ncclDataType_t t) {
  switch (t) {
  case ncclInt8:
  case ncclUint8: return 1;
  case ncclFloat16:
  case ncclBfloat16: return 2;
  case ncclInt32:
  case ncclUint32:
  case ncclFloat32: return 4;
  case ncclInt64:
  case ncclUint64:
  case ncclFloat64: return 8;
  default: return 0;
  }
}

const char *type_name(ncclDataType_t t) {
  switch (t) {
  case ncclInt8: return "int8";
  case ncclUint8: return "uint8";
  case ncclFloat16: return "float16";
  case ncclBfloat16: return "bfloat16";
  case ncclInt32: return "int32";
  case ncclUint32: return "uint32";
  case ncclFloat32: return "float32";
  case ncclInt64: return "int64";
  case ncclUint64: return "uint64";
  case ncclFloat64: return "float64";
  default: return "an unknown type";
  }
}

const char *op_name(ncclRedOp_t op) {
  switch (op) {
  case ncclSum: return "sum";
  case ncclProd: return "prod";
  case ncclMax: return "max";
  case ncclMin: return "min";
  case ncclAvg: return "avg";
  default: return "an unknown op";
  }
}

const char *kind_name(kind k) {
  switch (k) {
  case ALL_REDUCE: return "all_reduce";
  case BROADCAST: return "broadcast";
  case ALL_GATHER: return "all_gather";
  default: return "reduce_scatter";
  }
}

static ncclResult_t last_result = ncclSuccess;
static std::string last_message;

ncclResult_t fail(ncclResult_t r, const char *fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  fprintf(stderr, "emulated NCCL: %s\n", buf);
  last_result = r;
  last_message = std::string("emulated NCCL: ") + buf;
  return r;
}

const char *message_for(ncclResult_t r) { return r == last_result && !last_message.empty() ? last_message.c_str() : NULL; }

} // namespace nccl_emu

using namespace nccl_emu;

namespace {

/* the call's arguments, checked now; then one rank's copy, done in
   stream's order (emu_queue.h), or the ranks' exchange (nccl_ranks.cc) */
ncclResult_t run(kind k, const void *send, void *recv, size_t count, ncclDataType_t t, ncclRedOp_t op, int root,
                 ncclComm_t comm, cudaStream_t stream) {
  const char *what = kind_name(k);
  size_t es = type_size(t);
  if (!comm || !es)
    return fail(ncclInvalidArgument, "%s with %s", what, comm ? "an unknown data type" : "no communicator");
  if ((k == ALL_REDUCE || k == REDUCE_SCATTER) && !((int)op >= 0 && (int)op < (int)ncclNumOps))
    return fail(ncclInvalidArgument, "%s with an unknown reduction op %d", what, (int)op);
  if (k == BROADCAST && (root < 0 || root >= comm->nranks))
    return fail(ncclInvalidArgument, "broadcast from root %d of %d rank%s", root, comm->nranks,
                comm->nranks > 1 ? "s" : "");
  if (count && (!send || !recv))
    return fail(ncclInvalidArgument, "%s with a NULL buffer", what);
  if (comm->nranks > 1)
    return collective(k, send, recv, count, t, op, root, comm, stream);
  if (count && send != recv) {
    lt_emu_trace(stream, "nccl %s %zu", what, count * es);
    lt_emu_enqueue(stream, [=] { memmove(recv, send, count * es); });
  }
  return ncclSuccess;
}

} // namespace

extern "C" {

const char *ncclGetErrorString(ncclResult_t r) {
  if (const char *m = message_for(r)) /* (the last failure's own words) */
    return m;
  switch (r) {
  case ncclSuccess: return "no error";
  case ncclSystemError: return "system error (emulated NCCL)";
  case ncclInvalidArgument: return "invalid argument (emulated NCCL)";
  case ncclInvalidUsage: return "invalid usage (emulated NCCL)";
  case ncclRemoteError: return "remote error (emulated NCCL: a rank is missing)";
  default: return "an NCCL error (emulated NCCL)";
  }
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
  new_unique_id(id);
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank) {
  if (nranks < 1 || rank < 0 || rank >= nranks)
    return fail(ncclInvalidArgument, "ncclCommInitRank: rank %d of %d ranks", rank, nranks);
  ncclComm *c = new ncclComm();
  c->nranks = nranks;
  c->rank = rank;
  if (nranks > 1) {
    ncclResult_t r = join(c, id);
    if (r != ncclSuccess) {
      delete c;
      return r;
    }
  }
  *comm = c;
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (comm)
    leave(comm);
  delete comm;
  return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t t, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
  return run(ALL_REDUCE, send, recv, count, t, op, 0, comm, stream);
}

ncclResult_t ncclBroadcast(const void *send, void *recv, size_t count, ncclDataType_t t, int root, ncclComm_t comm,
                           cudaStream_t stream) {
  return run(BROADCAST, send, recv, count, t, ncclSum, root, comm, stream);
}

ncclResult_t ncclAllGather(const void *send, void *recv, size_t sendcount, ncclDataType_t t, ncclComm_t comm,
                           cudaStream_t stream) {
  return run(ALL_GATHER, send, recv, sendcount, t, ncclSum, 0, comm, stream);
}

ncclResult_t ncclReduceScatter(const void *send, void *recv, size_t recvcount, ncclDataType_t t, ncclRedOp_t op,
                               ncclComm_t comm, cudaStream_t stream) {
  return run(REDUCE_SCATTER, send, recv, recvcount, t, op, 0, comm, stream);
}

} // extern "C"
