/*
 * nccl_emu.h: what the emulated NCCL's calls (nccl.cc: the API, the
 * arguments' checks, a communicator of one rank) and its ranks
 * (nccl_ranks.cc: a communicator of several processes meeting in POSIX
 * shared memory) share.
 */
#ifndef LUTRA_TESTS_EMU_NCCL_EMU_H
#define LUTRA_TESTS_EMU_NCCL_EMU_H

#include <cuda_runtime.h>
#include <nccl.h>

#include <stddef.h>

namespace nccl_emu {
struct segment; /* nccl_ranks.cc: the ranks' shared memory */
}

struct ncclComm {
  int nranks, rank;
  nccl_emu::segment *seg;   /* NULL: one rank */
  size_t slot_bytes;        /* each rank's part of the segment's exchange area */
  size_t map_bytes;         /* the segment's size */
  unsigned long long meets; /* the barriers this rank has passed */
  unsigned long long calls; /* the collectives called on it */
  bool broken;              /* a rank was missing: every later call fails at once */
};

namespace nccl_emu {

enum kind { ALL_REDUCE, BROADCAST, ALL_GATHER, REDUCE_SCATTER };
const char *kind_name(kind k);

/* bytes of an element of t (0: not an NCCL data type) */
size_t type_size(ncclDataType_t t);
const char *type_name(ncclDataType_t t);
const char *op_name(ncclRedOp_t op);

/* Prints "emulated NCCL: <message>" to stderr and keeps the message for
   ncclGetErrorString to give with r (lutra's error then carries it);
   returns r. */
ncclResult_t fail(ncclResult_t r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* the message of the last fail() with r, or NULL */
const char *message_for(ncclResult_t r);

/* A new unique id: the name of a shared-memory segment not yet made (this
   process, a counter, the clock) and the bytes of each rank's slot in it
   (LUTRA_EMU_NCCL_SLOT_BYTES, 1 MiB; at least 2048). */
void new_unique_id(ncclUniqueId *id);

/* ncclCommInitRank for nranks > 1: maps the id's segment and waits for
   every rank (LUTRA_EMU_NCCL_TIMEOUT seconds, 120), then unlinks its name
   (rank 0). Fills c's segment fields. */
ncclResult_t join(ncclComm *c, const ncclUniqueId &id);
/* unmaps c's segment (ncclCommDestroy; not collective, as NCCL's) */
void leave(ncclComm *c);

/* One collective of c's ranks (nranks > 1), arguments already checked:
   the host waits for stream's work so far, the ranks exchange now, and the
   result lands in recv in stream's order. count: all_reduce's and
   broadcast's elements, all_gather's sendcount, reduce_scatter's recvcount. */
ncclResult_t collective(kind k, const void *send, void *recv, size_t count, ncclDataType_t t, ncclRedOp_t op, int root,
                        ncclComm *c, cudaStream_t stream);

} // namespace nccl_emu

#endif
