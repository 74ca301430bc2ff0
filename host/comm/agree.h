/*
 * comm/agree.h: the agreement exchange of comm/agree.c, for comm/comm.c:
 * the op codes a call is agreed under and the two calls.
 */
#ifndef LUTRA_COMM_AGREE_H
#define LUTRA_COMM_AGREE_H

#include "comm/comm-impl.h"

/* op codes; all_reduce and reduce_scatter send code * 16 + the reduction */
enum {
  LT_AGREE_ALL_REDUCE = 1,
  LT_AGREE_BROADCAST,
  LT_AGREE_ALL_GATHER,
  LT_AGREE_REDUCE_SCATTER,
  LT_AGREE_BARRIER,
  LT_AGREE_SPLIT,
  LT_AGREE_BCAST_BYTES
};
enum { LT_AGREE_REFUSED = 0x7fff }; /* a rank that refused its arguments (lt_comm_refuse) */

/* Every rank of the group gives (op code, dtype, count, root, call number
   seq, call site); all must agree on the op and dtype, on the count unless
   counts_may_differ, on root (for all_gather and reduce_scatter: the
   elements of a row) and on the call site where every rank knows it.
   all_counts (c->size entries, may be NULL) gets every rank's count; the
   site becomes c->last_site. Errors (the same on every rank): LT_ERR_ARG for
   another op, reduction, root or call site, or a rank that refused;
   LT_ERR_DTYPE; LT_ERR_SHAPE for counts and rows; LT_ERR_IO when the
   exchange failed. */
lt_status lt_comm_agree(lt_comm *c, uint64_t seq, const char *op, int opcode, lt_dtype dt, int64_t count, int root,
                        int counts_may_differ, int64_t *all_counts, const lt_comm_site *site);
/* This rank's side of a refused call's agreement exchange (takes the pending
   call site and counts a call on c). */
lt_status lt_comm_announce_refusal(lt_comm *c);

#endif
