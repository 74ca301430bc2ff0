/*
 * comm/single.c: the collectives of a single process (no mpirun), and of a
 * group of one made from it: all_reduce and broadcast leave the tensor as it
 * is (the sum, average, max or min over one rank), all_gather copies the
 * tensor into the output, reduce_scatter copies the whole tensor into its
 * one chunk, a barrier has nothing to wait for. Nothing is agreed (one rank
 * cannot disagree) and nothing is ever in flight. There is no other rank to
 * send to or receive from: the front refuses every destination first.
 */
#include "comm/comm-impl.h"
#include "base/status.h"

#include <string.h>

static lt_status single_split(lt_comm *parent, int color, int key, lt_comm *child) {
  (void)parent, (void)color, (void)key;
  child->rank = 0;
  child->size = 1;
  return LT_OK;
}

static lt_status single_all_reduce(lt_work *w, lt_tensor *t, lt_comm_op op) {
  (void)w, (void)t, (void)op;
  return LT_OK;
}

static lt_status single_broadcast(lt_work *w, lt_tensor *t, int root) {
  (void)w, (void)t, (void)root;
  return LT_OK;
}

static lt_status single_all_gather(lt_work *w, lt_tensor *out, const lt_tensor *t, const int64_t *counts) {
  (void)w, (void)counts;
  memcpy(lt_tensor_data(out), lt_tensor_data(t), (size_t)(lt_tensor_numel(t) * lt_dtype_size(t->dtype)));
  return LT_OK;
}

static lt_status single_reduce_scatter(lt_work *w, lt_tensor *out, lt_tensor *t, lt_comm_op op) {
  (void)w, (void)op;
  return lt_tensor_copy_(out, t);
}

/* (not reached: the front refuses every rank of a group of one as a peer) */
static lt_status single_send(lt_comm *c, const lt_tensor *t, int dst) {
  (void)c, (void)t;
  return lt_fail(LT_ERR_ARG, "send to rank %d: send/recv needs at least 2 ranks (this process runs alone)", dst);
}

static lt_status single_recv(lt_comm *c, lt_tensor *t, int src) {
  (void)c, (void)t;
  return lt_fail(LT_ERR_ARG, "recv from rank %d: send/recv needs at least 2 ranks (this process runs alone)", src);
}

const lt_comm_impl lt_comm_single_impl = {
    .name = "single process",
    .agrees = 0,
    .split = single_split,
    .all_reduce = single_all_reduce,
    .broadcast = single_broadcast,
    .all_gather = single_all_gather,
    .reduce_scatter = single_reduce_scatter,
    .send = single_send,
    .recv = single_recv,
};
