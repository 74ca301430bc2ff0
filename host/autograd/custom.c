/*
 * autograd/custom.c: custom functions (lt.autograd.Function): the node
 * whose backward calls the Lua side through the backward hooks, and the
 * queues of the ids of freed custom nodes and hooked leaves that the Lua
 * side collects.
 */
#include "autograd/autograd.h"

#include <stdlib.h>
#include <string.h>

/* Ids of freed custom nodes and hooked leaves, until the Lua side collects them. */
typedef struct {
  int64_t *ids;
  int n, cap;
} id_queue;
static id_queue dead_custom, dead_hooks;

static void queue_push(id_queue *q, int64_t id) {
  if (q->n == q->cap) {
    int cap = q->cap ? 2 * q->cap : 256;
    int64_t *grown = realloc(q->ids, sizeof(int64_t) * (size_t)cap);
    if (!grown)
      return; /* the Lua side then keeps a little state longer */
    q->ids = grown;
    q->cap = cap;
  }
  q->ids[q->n++] = id;
}

static int queue_take(id_queue *q, int64_t *ids, int max) {
  int n = q->n < max ? q->n : max;
  if (n > 0)
    memcpy(ids, q->ids + (q->n - n), sizeof(int64_t) * (size_t)n);
  q->n -= n;
  return n;
}

void lt_ag_hook_dead(int64_t id) { queue_push(&dead_hooks, id); }
int lt_autograd_take_dead_hooks(int64_t *ids, int max) { return queue_take(&dead_hooks, ids, max); }

static lt_status custom_backward(lt_node *n, lt_tensor *const *go, lt_tensor **gi) {
  const lt_backward_hooks *h = lt_ag_current_hooks();
  if (!h || !h->custom)
    return lt_fail(LT_ERR_INTERNAL, "backward: a custom function needs the Lua backward hooks");
  return h->custom(h->ctx, (int64_t)(intptr_t)n->user, n->noutputs, go, n->ninputs, gi);
}

/* The Lua context (the closures, ctx.saved) goes once the node cannot run
   again: after a backward that did not retain the graph, or when the node is
   freed, whichever comes first (user 0: already queued). */
static void custom_release(lt_node *n) {
  if (n->user)
    queue_push(&dead_custom, (int64_t)(intptr_t)n->user);
  n->user = NULL;
}

static const lt_node_ops custom_ops = {"CustomFunctionBackward", custom_backward, custom_release};

lt_status lt_autograd_record_custom(int ninputs, lt_tensor *const *inputs, int noutputs,
                                    lt_tensor *const *outputs, int64_t id) {
  if (ninputs > LT_CUSTOM_MAX_INPUTS || noutputs > LT_NODE_MAX_OUTPUTS || noutputs < 1)
    return lt_fail(LT_ERR_ARG, "autograd.Function: at most %d tensor inputs and 1..%d outputs",
                   LT_CUSTOM_MAX_INPUTS, LT_NODE_MAX_OUTPUTS);
  if (!lt_ag_needed(ninputs, (const lt_tensor *const *)inputs))
    return LT_OK;
  lt_node *n;
  LT_TRY(lt_ag_node_new(&custom_ops, ninputs, (const lt_tensor *const *)inputs, &n));
  n->user = (void *)(intptr_t)id;
  n->on_drop = custom_release;
  lt_status st = LT_OK;
  for (int k = 0; k < noutputs && st == LT_OK; k++) {
    if (!lt_dtype_is_float(outputs[k]->dtype))
      st = lt_fail(LT_ERR_DTYPE, "autograd.Function: output %d is %s; outputs must be float tensors", k + 1,
                   lt_dtype_name(outputs[k]->dtype));
    else
      st = lt_ag_attach(n, outputs[k], k);
  }
  lt_node_release(n);
  return st;
}

int lt_autograd_take_dead_custom(int64_t *ids, int max) { return queue_take(&dead_custom, ids, max); }
