/*
 * autograd/autograd.h: the autograd tape's layouts and the recording helpers
 * the public ops use.
 *
 * The public differentiable ops live beside their backward rules, one file
 * per family (autograd/elementwise.c, reduce.c, matmul.c, view.c, copy.c,
 * index.c, chunk.c, random.c, and the neural-network families norm.c,
 * softmax.c, loss.c, rope.c, attention.c, linear.c): each checks what
 * autograd refuses, calls its dispatch (lt_op_X of ops/ops.h; ops/nn.h for
 * the neural-network families) and records its node.
 *
 * A tensor that requires grad carries an lt_autograd_meta. An op whose
 * inputs require grad (while grad mode is on) makes an lt_node holding the
 * edges to its inputs' producers, the tensors its backward needs (saved as
 * detached aliases, with the storage version seen then), and its arguments;
 * its outputs point back at it through meta->grad_fn. Leaves get their
 * gradient through an AccumulateGrad node, one per leaf, that the leaf knows
 * weakly. lt_autograd_backward (autograd/engine.c) runs the nodes in reverse order.
 */
#ifndef LUTRA_AUTOGRAD_H
#define LUTRA_AUTOGRAD_H

#include "base/status.h"
#include "core/iter.h" /* (lt_bump_version) */
#include "core/tensor-impl.h"
#include "ops/ops.h"

enum { LT_NODE_MAX_INPUTS = 5, LT_CUSTOM_MAX_INPUTS = 4, LT_NODE_MAX_OUTPUTS = 4, LT_NODE_MAX_SAVED = 6 };

typedef struct lt_node lt_node;

typedef struct lt_edge {
  lt_node *node; /* NULL: this input takes no gradient */
  int slot;      /* which output of node the input was */
} lt_edge;

/* Computes grad_inputs[i] (new references, NULL for none) from the gradients
   of the node's outputs (NULL for an output that received none). */
typedef lt_status (*lt_backward_fn)(lt_node *n, lt_tensor *const *grad_outputs, lt_tensor **grad_inputs);

typedef struct lt_node_ops {
  const char *name;
  lt_backward_fn backward;
  void (*release)(lt_node *n); /* optional: frees what `user` holds */
} lt_node_ops;

typedef struct lt_shape_info {
  int ndim;
  int64_t sizes[LT_MAX_DIMS];
  lt_dtype dtype;
  lt_device device;
} lt_shape_info;

struct lt_node {
  int64_t refcount;
  const lt_node_ops *ops;
  uint64_t seq; /* creation order: later nodes run first */
  int ninputs, noutputs, nsaved;
  lt_edge next[LT_NODE_MAX_INPUTS];
  lt_shape_info in[LT_NODE_MAX_INPUTS];
  lt_shape_info out[LT_NODE_MAX_OUTPUTS];
  lt_tensor *saved[LT_NODE_MAX_SAVED];
  uint64_t saved_version[LT_NODE_MAX_SAVED];
  int released;              /* saved tensors dropped after a backward */
  double f[4];               /* op arguments */
  int64_t i[LT_MAX_DIMS + 4];
  lt_tensor *leaf;           /* AccumulateGrad: the leaf (a strong reference) */
  lt_tensor *retain[LT_NODE_MAX_OUTPUTS]; /* outputs that retain_grad (weak) */
  void *user;                /* custom functions: the Lua side's handle */
  void (*on_drop)(lt_node *n); /* optional: after a backward without retain_graph ran the node, frees what
                                  `user` kept for that backward (custom functions: their Lua context) */
  /* engine scratch, valid during one backward */
  uint64_t stamp;
  int64_t deps;
  lt_tensor *buf[LT_NODE_MAX_OUTPUTS];
};

typedef struct lt_autograd_meta {
  lt_meta_free_fn free; /* first: lt_tensor_release calls it (lt_ag_meta_free) */
  int requires_grad;
  int retains_grad;
  int64_t hook_id; /* gradient-ready hooks: the Lua side's id, 0 for none */
  int output_nr;
  lt_tensor *grad;
  lt_node *grad_fn; /* strong; NULL for leaves */
  lt_node *accum;   /* weak: the leaf's AccumulateGrad node while one lives */
} lt_autograd_meta;

static inline lt_autograd_meta *lt_meta(const lt_tensor *t) { return (lt_autograd_meta *)t->autograd; }

static inline int lt_requires_grad(const lt_tensor *t) {
  return t && t->autograd && lt_meta(t)->requires_grad;
}

/* Grad mode: on by default, off inside lt.no_grad and during backward. */
extern _Thread_local int lt_grad_mode;

/* Whether an op on these inputs must be recorded. */
int lt_ag_needed(int n, const lt_tensor *const *ts);

/* A node for an op over n inputs (edges and shapes taken from them). */
lt_status lt_ag_node_new(const lt_node_ops *ops, int n, const lt_tensor *const *inputs, lt_node **out);
/* Saves a detached alias of t in slot n->nsaved++. */
lt_status lt_ag_save(lt_node *n, const lt_tensor *t);
/* The saved tensor k, or an error if it changed in place since it was saved. */
lt_status lt_ag_saved(lt_node *n, int k, lt_tensor **t);
/* Makes out (output slot) a non-leaf produced by n; drops the caller's node
   reference when slot is the last output (pass last=1). */
lt_status lt_ag_attach(lt_node *n, lt_tensor *out, int slot);
void lt_node_release(lt_node *n);

/* Frees t's autograd metadata (lt_tensor_release calls it through meta->free). */
void lt_ag_meta_free(lt_tensor *t);

/* Rejects in-place writes into tensors that take part in autograd while
   grad mode is on (out, or any of the n inputs, requires grad). */
lt_status lt_ag_check_inplace(const char *op, const lt_tensor *out, int n, const lt_tensor *const *inputs);

/* Queues the hook id of a freed leaf for the Lua side to forget. */
void lt_ag_hook_dead(int64_t id);

/* The hooks of the backward running on this thread (NULL outside one). */
const lt_backward_hooks *lt_ag_current_hooks(void);

/* Runs the statements with grad mode off (composite ops use it so their
   internal steps record nothing; they record themselves once). */
#define LT_NO_GRAD(...)                \
  do {                                 \
    int lt_saved_mode_ = lt_grad_mode; \
    lt_grad_mode = 0;                  \
    __VA_ARGS__;                       \
    lt_grad_mode = lt_saved_mode_;     \
  } while (0)

/* A public op's end: *res = r when st (its recording's status) is OK, else
   r released and *res left as it was. */
static inline lt_status lt_ag_result(lt_status st, lt_tensor *r, lt_tensor **res) {
  if (st != LT_OK) {
    lt_tensor_release(r);
    return st;
  }
  *res = r;
  return LT_OK;
}

/* ---- helpers for backward functions ----------------------------------- */

/* Sums g over the broadcast dims so it has the shape in *s (and its dtype and device). */
lt_status lt_ag_sum_to(lt_tensor *g, const lt_shape_info *s, lt_tensor **out);

#endif
