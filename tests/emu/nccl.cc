/*
 * nccl.cc: the CUDA emulator's NCCL, the eight calls host/comm/nccl.c makes,
 * for a job of one rank (a communicator of more ranks is refused: the
 * emulator has one device in one process). With one rank every collective
 * is a copy from the send buffer to the receive buffer (NCCL's semantics,
 * nccl.h: all_reduce of count elements, broadcast from root 0, all_gather of
 * sendcount, reduce_scatter of recvcount; in place when the buffers are the
 * same), done in the stream's order (emu_queue.h). Data types and
 * reduction operations are checked as NCCL does, when the call is made.
 */
#include <nccl.h>

#include "emu_queue.h"

#include <stdio.h>
#include <string.h>

struct ncclComm {
  int nranks, rank;
};

namespace {

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

/* the collective's copy, checked now and done in stream's order (emu_queue.h) */
ncclResult_t copy(const char *what, const void *send, void *recv, size_t count, ncclDataType_t t, ncclComm_t comm,
                  cudaStream_t stream) {
  size_t es = type_size(t);
  if (!comm || !es) {
    fprintf(stderr, "emulated NCCL: %s with %s\n", what, comm ? "an unknown data type" : "no communicator");
    return ncclInvalidArgument;
  }
  if (count && (!send || !recv)) {
    fprintf(stderr, "emulated NCCL: %s with a NULL buffer\n", what);
    return ncclInvalidArgument;
  }
  if (count && send != recv) {
    lt_emu_trace(stream, "nccl %s %zu", what, count * es);
    lt_emu_enqueue(stream, [=] { memmove(recv, send, count * es); });
  }
  return ncclSuccess;
}

bool op_ok(ncclRedOp_t op) { return (int)op >= 0 && (int)op < (int)ncclNumOps; }

} // namespace

extern "C" {

const char *ncclGetErrorString(ncclResult_t r) {
  switch (r) {
  case ncclSuccess: return "no error";
  case ncclInvalidArgument: return "invalid argument (emulated NCCL)";
  case ncclInvalidUsage: return "invalid usage (emulated NCCL: one rank only)";
  default: return "an NCCL error (emulated NCCL)";
  }
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
  memset(id, 0, sizeof *id);
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank) {
  (void)id;
  if (nranks != 1 || rank != 0) {
    fprintf(stderr, "emulated NCCL: a communicator of %d ranks (rank %d); the emulator has one\n", nranks, rank);
    return ncclInvalidUsage;
  }
  *comm = new ncclComm();
  (*comm)->nranks = 1;
  (*comm)->rank = 0;
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  delete comm;
  return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t t, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
  if (!op_ok(op))
    return ncclInvalidArgument;
  return copy("all_reduce", send, recv, count, t, comm, stream);
}

ncclResult_t ncclBroadcast(const void *send, void *recv, size_t count, ncclDataType_t t, int root, ncclComm_t comm,
                           cudaStream_t stream) {
  if (root != 0) {
    fprintf(stderr, "emulated NCCL: broadcast from root %d of one rank\n", root);
    return ncclInvalidArgument;
  }
  return copy("broadcast", send, recv, count, t, comm, stream);
}

ncclResult_t ncclAllGather(const void *send, void *recv, size_t sendcount, ncclDataType_t t, ncclComm_t comm,
                           cudaStream_t stream) {
  return copy("all_gather", send, recv, sendcount, t, comm, stream);
}

ncclResult_t ncclReduceScatter(const void *send, void *recv, size_t recvcount, ncclDataType_t t, ncclRedOp_t op,
                               ncclComm_t comm, cudaStream_t stream) {
  if (!op_ok(op))
    return ncclInvalidArgument;
  return copy("reduce_scatter", send, recv, recvcount, t, comm, stream);
}

} // extern "C"
