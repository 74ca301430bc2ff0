/*
 * comm/comm-impl.h: what host/comm/comm.c and host/comm/nccl.c share and nothing else
 * sees: the NCCL entry point for CUDA tensors and the byte broadcast NCCL's
 * unique id travels by.
 */
#ifndef LUTRA_COMM_IMPL_H
#define LUTRA_COMM_IMPL_H

#include "lutra.h"
#include "core/tensor-impl.h"

enum { LT_NCCL_ALL_REDUCE = 1, LT_NCCL_BROADCAST, LT_NCCL_ALL_GATHER, LT_NCCL_REDUCE_SCATTER };

/* Broadcasts n bytes from root over the group (nothing to do alone). */
lt_status lt_comm_bcast_bytes(lt_comm *c, void *buf, int n, int root);

#ifdef LT_WITH_CUDA
/* One NCCL collective on CUDA tensors (comm/nccl.c), ordered on the device's
   streams; in == out for all_reduce and broadcast. */
lt_status lt_nccl_collective(lt_comm *c, int kind, lt_tensor *out, const lt_tensor *in, lt_comm_op op, int root);
#endif

#endif
