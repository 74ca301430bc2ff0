/*
 * autograd/engine.c: the autograd engine: grad mode, per-tensor metadata, nodes and
 * their lifetimes, and lt_autograd_backward, which runs the recorded nodes
 * from the root towards the leaves.
 *
 * Order: a node runs once every node that feeds it a gradient has run
 * (dependency counts over the part of the graph reachable from the root);
 * among ready nodes a leaf's accumulation runs first, then the most recently
 * created node, so the order, and with it every floating-point sum, is the
 * same on every run. Gradients
 * arriving at one node output are summed out of place in arrival order.
 *
 * Relies on the ops (the public ones of autograd/<family>.c, whose backward
 * rules run with grad mode off, and so record nothing) for the arithmetic.
 * A tensor's metadata carries its destructor (lt_ag_meta_free), which
 * core's lt_tensor_release calls without knowing autograd.
 */
#include "autograd/autograd.h"

#include <stdlib.h>
#include <string.h>

_Thread_local int lt_grad_mode = 1;
static uint64_t next_seq = 1;
static uint64_t next_stamp = 1;

void lt_set_grad_enabled(int on) { lt_grad_mode = on != 0; }
int lt_grad_enabled(void) { return lt_grad_mode; }

/* ---- metadata ---------------------------------------------------------------- */

static lt_autograd_meta *meta_get(lt_tensor *t) {
  if (!t->autograd) {
    lt_autograd_meta *m = calloc(1, sizeof *m);
    if (!m)
      return NULL;
    m->free = lt_ag_meta_free;
    t->autograd = m;
  }
  return lt_meta(t);
}

void lt_ag_meta_free(lt_tensor *t) {
  lt_autograd_meta *m = lt_meta(t);
  if (m->hook_id)
    lt_ag_hook_dead(m->hook_id);
  if (m->grad_fn) {
    for (int k = 0; k < LT_NODE_MAX_OUTPUTS; k++)
      if (m->grad_fn->retain[k] == t)
        m->grad_fn->retain[k] = NULL;
    lt_node_release(m->grad_fn);
  }
  lt_tensor_release(m->grad);
  free(m);
  t->autograd = NULL;
}

int lt_tensor_requires_grad(const lt_tensor *t) { return lt_requires_grad(t); }

int lt_tensor_is_leaf(const lt_tensor *t) {
  return !t || !t->autograd || lt_meta(t)->grad_fn == NULL;
}

lt_status lt_tensor_requires_grad_(lt_tensor *t, int on) {
  LT_TRY(lt_check_tensor_header("requires_grad_", t, 1));
  if (!lt_tensor_is_leaf(t))
    return lt_fail(LT_ERR_ARG, "requires_grad_: only leaf tensors can change it; this one comes from %s "
                   "(use detach() for a leaf copy)", lt_meta(t)->grad_fn->ops->name);
  if (on && !lt_dtype_is_float(t->dtype))
    return lt_fail(LT_ERR_DTYPE, "requires_grad_: only float tensors can require gradients, got %s",
                   lt_dtype_name(t->dtype));
  if (!on && !t->autograd)
    return LT_OK;
  lt_autograd_meta *m = meta_get(t);
  if (!m)
    return lt_fail(LT_ERR_OOM, "requires_grad_: out of host memory");
  m->requires_grad = on != 0;
  return LT_OK;
}

lt_tensor *lt_tensor_grad(const lt_tensor *t) {
  if (!t || !t->autograd || !lt_meta(t)->grad)
    return NULL;
  lt_tensor_retain(lt_meta(t)->grad);
  return lt_meta(t)->grad;
}

lt_status lt_tensor_set_grad(lt_tensor *t, lt_tensor *grad) {
  LT_TRY(lt_check_tensor_header("set_grad", t, 1));
  if (grad) {
    LT_TRY(lt_check_tensor("set_grad", grad, 2));
    int same = grad->ndim == t->ndim && grad->dtype == t->dtype &&
               grad->storage->device == t->storage->device;
    for (int d = 0; same && d < t->ndim; d++)
      same = grad->sizes[d] == t->sizes[d];
    if (!same) {
      char b1[200], b2[200], d1[16], d2[16];
      return lt_fail(LT_ERR_SHAPE, "set_grad: the gradient (%s %s on %s) must match the tensor (%s %s on %s)",
                     lt_dtype_name(grad->dtype), lt_tensor_shape_str(grad, b1), lt_device_name(grad->storage->device, d1),
                     lt_dtype_name(t->dtype), lt_tensor_shape_str(t, b2), lt_device_name(t->storage->device, d2));
    }
  }
  if (!grad && !t->autograd)
    return LT_OK;
  lt_autograd_meta *m = meta_get(t);
  if (!m)
    return lt_fail(LT_ERR_OOM, "set_grad: out of host memory");
  if (grad && !lt_tensor_is_contiguous(grad)) { /* later gradients accumulate into it in place */
    lt_status st;
    LT_NO_GRAD(st = lt_tensor_clone(grad, &grad));
    LT_TRY(st);
  } else {
    lt_tensor_retain(grad);
  }
  lt_tensor_release(m->grad);
  m->grad = grad;
  return LT_OK;
}

lt_status lt_tensor_detach(lt_tensor *t, lt_tensor **out) {
  LT_TRY(lt_check_tensor_header("detach", t, 1));
  lt_tensor *d = lt_tensor_wrap(t->storage, t->offset, t->ndim, t->sizes, t->strides, t->dtype);
  if (!d)
    return lt_fail(LT_ERR_OOM, "detach: out of host memory");
  *out = d;
  return LT_OK;
}

const char *lt_tensor_grad_fn(const lt_tensor *t) {
  if (!t || !t->autograd || !lt_meta(t)->grad_fn)
    return NULL;
  return lt_meta(t)->grad_fn->ops->name;
}

lt_status lt_tensor_retain_grad(lt_tensor *t) {
  LT_TRY(lt_check_tensor_header("retain_grad", t, 1));
  if (!lt_requires_grad(t))
    return lt_fail(LT_ERR_ARG, "retain_grad: the tensor does not require grad");
  lt_autograd_meta *m = lt_meta(t);
  m->retains_grad = 1;
  if (m->grad_fn)
    m->grad_fn->retain[m->output_nr] = t;
  return LT_OK;
}

lt_status lt_tensor_set_hook_id(lt_tensor *t, int64_t id) {
  LT_TRY(lt_check_tensor_header("register_hook", t, 1));
  if (!lt_requires_grad(t) || !lt_tensor_is_leaf(t))
    return lt_fail(LT_ERR_ARG, "register_hook: gradient-ready hooks go on leaf tensors that require grad");
  lt_meta(t)->hook_id = id;
  return LT_OK;
}

int64_t lt_tensor_hook_id(const lt_tensor *t) { return t && t->autograd ? lt_meta(t)->hook_id : 0; }

/* ---- nodes --------------------------------------------------------------------- */

static const lt_node_ops accumulate_ops; /* below */

void lt_node_release(lt_node *n) {
  /* iterative: a long chain of nodes must not exhaust the C stack */
  lt_node *stack[64];
  int top = 0;
  lt_node **heap_stack = NULL;
  int heap_cap = 0, heap_top = 0;
  if (!n)
    return;
  stack[top++] = n;
  while (top > 0 || heap_top > 0) {
    lt_node *x = heap_top > 0 ? heap_stack[--heap_top] : stack[--top];
    if (__atomic_sub_fetch(&x->refcount, 1, __ATOMIC_ACQ_REL) != 0)
      continue;
    if (x->ops->release)
      x->ops->release(x);
    for (int k = 0; k < x->nsaved; k++)
      lt_tensor_release(x->saved[k]);
    for (int k = 0; k < LT_NODE_MAX_OUTPUTS; k++)
      lt_tensor_release(x->buf[k]);
    if (x->leaf) {
      lt_autograd_meta *m = lt_meta(x->leaf);
      if (m && m->accum == x)
        m->accum = NULL;
      lt_tensor_release(x->leaf);
    }
    for (int k = 0; k < x->ninputs; k++) {
      lt_node *c = x->next[k].node;
      if (!c)
        continue;
      if (top < 64) {
        stack[top++] = c;
      } else {
        if (heap_top == heap_cap) {
          heap_cap = heap_cap ? 2 * heap_cap : 256;
          lt_node **grown = realloc(heap_stack, sizeof(lt_node *) * (size_t)heap_cap);
          LT_ASSERT(grown != NULL, "out of memory releasing an autograd graph");
          heap_stack = grown;
        }
        heap_stack[heap_top++] = c;
      }
    }
    free(x);
  }
  free(heap_stack);
}

static void shape_of(lt_shape_info *s, const lt_tensor *t) {
  s->ndim = t->ndim;
  memcpy(s->sizes, t->sizes, sizeof(int64_t) * (size_t)t->ndim);
  s->dtype = t->dtype;
  s->device = t->storage->device;
}

/* The leaf's AccumulateGrad node (one per leaf while it lives), new reference. */
static lt_status accumulator(lt_tensor *leaf, lt_node **out) {
  lt_autograd_meta *m = lt_meta(leaf);
  if (m->accum) {
    __atomic_add_fetch(&m->accum->refcount, 1, __ATOMIC_RELAXED);
    *out = m->accum;
    return LT_OK;
  }
  lt_node *n = calloc(1, sizeof *n);
  if (!n)
    return lt_fail(LT_ERR_OOM, "autograd: out of host memory");
  n->refcount = 1;
  n->ops = &accumulate_ops;
  n->seq = 0; /* leaves come last */
  n->noutputs = 1;
  shape_of(&n->out[0], leaf);
  lt_tensor_retain(leaf);
  n->leaf = leaf;
  m->accum = n;
  *out = n;
  return LT_OK;
}

int lt_ag_needed(int n, const lt_tensor *const *ts) {
  if (!lt_grad_mode)
    return 0;
  for (int i = 0; i < n; i++)
    if (lt_requires_grad(ts[i]))
      return 1;
  return 0;
}

lt_status lt_ag_node_new(const lt_node_ops *ops, int n, const lt_tensor *const *inputs, lt_node **out) {
  LT_ASSERT(n <= LT_NODE_MAX_INPUTS, "too many autograd inputs");
  lt_node *node = calloc(1, sizeof *node);
  if (!node)
    return lt_fail(LT_ERR_OOM, "autograd: out of host memory for a node");
  node->refcount = 1;
  node->ops = ops;
  node->seq = next_seq++;
  node->ninputs = n;
  for (int i = 0; i < n; i++) {
    const lt_tensor *t = inputs[i];
    if (!t)
      continue;
    shape_of(&node->in[i], t);
    if (!lt_requires_grad(t))
      continue;
    lt_autograd_meta *m = lt_meta(t);
    if (m->grad_fn) {
      __atomic_add_fetch(&m->grad_fn->refcount, 1, __ATOMIC_RELAXED);
      node->next[i].node = m->grad_fn;
      node->next[i].slot = m->output_nr;
    } else {
      lt_status st = accumulator((lt_tensor *)t, &node->next[i].node);
      if (st != LT_OK) {
        lt_node_release(node);
        return st;
      }
      node->next[i].slot = 0;
    }
  }
  *out = node;
  return LT_OK;
}

lt_status lt_ag_save(lt_node *n, const lt_tensor *t) {
  LT_ASSERT(n->nsaved < LT_NODE_MAX_SAVED, "too many saved tensors");
  /* a detached alias: saving an output with its grad_fn would be a cycle */
  lt_tensor *a = lt_tensor_wrap(t->storage, t->offset, t->ndim, t->sizes, t->strides, t->dtype);
  if (!a)
    return lt_fail(LT_ERR_OOM, "autograd: out of host memory saving a tensor");
  n->saved_version[n->nsaved] = t->storage->version;
  n->saved[n->nsaved++] = a;
  return LT_OK;
}

lt_status lt_ag_saved(lt_node *n, int k, lt_tensor **t) {
  lt_tensor *s = n->saved[k];
  char b[200];
  if (s->storage->version != n->saved_version[k])
    return lt_fail(LT_ERR_ARG,
                   "backward: a tensor that %s saved for its gradient (shape %s) was modified "
                   "in place afterwards; compute it out of place instead",
                   n->ops->name, lt_tensor_shape_str(s, b));
  if (!lt_tensor_has_data(s))
    return lt_fail(LT_ERR_ARG,
                   "backward: a tensor that %s saved for its gradient (shape %s) has no data: it was freed or "
                   "its data dropped (drop_data_) before the backward", n->ops->name, lt_tensor_shape_str(s, b));
  *t = s;
  return LT_OK;
}

lt_status lt_ag_attach(lt_node *n, lt_tensor *out, int slot) {
  lt_autograd_meta *m = meta_get(out);
  if (!m)
    return lt_fail(LT_ERR_OOM, "autograd: out of host memory");
  m->requires_grad = 1;
  m->grad_fn = n;
  m->output_nr = slot;
  __atomic_add_fetch(&n->refcount, 1, __ATOMIC_RELAXED);
  if (slot + 1 > n->noutputs)
    n->noutputs = slot + 1;
  shape_of(&n->out[slot], out);
  return LT_OK;
}

lt_status lt_ag_check_inplace(const char *op, const lt_tensor *out, int n, const lt_tensor *const *inputs) {
  if (!lt_grad_mode || !out)
    return LT_OK;
  if (lt_requires_grad(out))
    return lt_fail(LT_ERR_ARG,
                   "%s: cannot modify a tensor that requires grad in place while gradients are recorded "
                   "(wrap the update in lt.no_grad, or use the out-of-place op)", op);
  for (int i = 0; i < n; i++)
    if (inputs[i] && lt_requires_grad(inputs[i]))
      return lt_fail(LT_ERR_ARG,
                     "%s: an in-place op cannot take an input that requires grad while gradients are "
                     "recorded (use the out-of-place op)", op);
  return LT_OK;
}

/* ---- AccumulateGrad ------------------------------------------------------------ */

/* Set by lt_autograd_backward for the nodes that call out (hooks, custom functions). */
static _Thread_local const lt_backward_hooks *current_hooks;

const lt_backward_hooks *lt_ag_current_hooks(void) { return current_hooks; }

static lt_status accumulate_backward(lt_node *n, lt_tensor *const *gout, lt_tensor **gin) {
  (void)gin;
  lt_tensor *leaf = n->leaf, *g = gout[0];
  if (!g)
    return LT_OK;
  lt_autograd_meta *m = lt_meta(leaf);
  if (!m->grad) {
    /* keep the engine's tensor when nothing else sees it, else a private copy */
    if (g->refcount == 1 && g->dtype == leaf->dtype && lt_tensor_is_contiguous(g) &&
        g->storage->refcount == 1) {
      lt_tensor_retain(g);
      m->grad = g;
    } else {
      lt_tensor *c;
      LT_TRY(lt_tensor_empty_like(leaf, leaf->dtype, &c));
      lt_status st = lt_tensor_copy_(c, g);
      if (st != LT_OK) {
        lt_tensor_release(c);
        return st;
      }
      m->grad = c;
    }
  } else {
    lt_tensor *r;
    LT_TRY(lt_binary(LT_BINARY_ADD, m->grad, g, m->grad, &r));
    lt_tensor_release(r);
  }
  if (m->hook_id && current_hooks && current_hooks->leaf_ready)
    return current_hooks->leaf_ready(current_hooks->ctx, m->hook_id, m->grad);
  return LT_OK;
}

static const lt_node_ops accumulate_ops = {"AccumulateGrad", accumulate_backward, NULL};

/* ---- the engine ------------------------------------------------------------------ */

typedef struct {
  lt_node **items;
  int64_t n, cap;
} node_vec;

static int vec_push(node_vec *v, lt_node *x) {
  if (v->n == v->cap) {
    int64_t cap = v->cap ? 2 * v->cap : 64;
    lt_node **grown = realloc(v->items, sizeof(lt_node *) * (size_t)cap);
    if (!grown)
      return 0;
    v->items = grown;
    v->cap = cap;
  }
  v->items[v->n++] = x;
  return 1;
}

/* Whether a runs before b: a leaf's AccumulateGrad first, as soon as it is
   ready (as PyTorch's engine does: gradient-ready hooks then fire while
   backward goes on, which data parallelism and ZeRO need to overlap
   communication), then the most recent node. Accumulations are sinks, so
   this changes no other node's order and no result. */
static int runs_before(const lt_node *a, const lt_node *b) {
  int acc_a = a->ops == &accumulate_ops, acc_b = b->ops == &accumulate_ops;
  if (acc_a != acc_b)
    return acc_a;
  return a->seq > b->seq;
}

/* Max-heap on runs_before. */
static void heap_push(node_vec *h, lt_node *x) {
  int64_t i = h->n - 1;
  (void)x;
  while (i > 0) {
    int64_t p = (i - 1) / 2;
    if (!runs_before(h->items[i], h->items[p]))
      break;
    lt_node *t = h->items[p];
    h->items[p] = h->items[i];
    h->items[i] = t;
    i = p;
  }
}

static lt_node *heap_pop(node_vec *h) {
  lt_node *top = h->items[0];
  h->items[0] = h->items[--h->n];
  int64_t i = 0;
  for (;;) {
    int64_t l = 2 * i + 1, r = l + 1, m = i;
    if (l < h->n && runs_before(h->items[l], h->items[m]))
      m = l;
    if (r < h->n && runs_before(h->items[r], h->items[m]))
      m = r;
    if (m == i)
      break;
    lt_node *t = h->items[m];
    h->items[m] = h->items[i];
    h->items[i] = t;
    i = m;
  }
  return top;
}

/* Adds g into n->buf[slot] (out of place: g may be shared). */
static lt_status add_to_buffer(lt_node *n, int slot, lt_tensor *g) {
  if (!n->buf[slot]) {
    lt_tensor_retain(g);
    n->buf[slot] = g;
    return LT_OK;
  }
  lt_tensor *sum;
  LT_TRY(lt_binary(LT_BINARY_ADD, n->buf[slot], g, NULL, &sum));
  lt_tensor_release(n->buf[slot]);
  n->buf[slot] = sum;
  return LT_OK;
}

/* The stamps of the backward passes running now, outermost first: a
   backward run from inside another (lt.checkpoint's recompute, from a
   custom function's backward) must not reach a node of the outer one's
   graph, whose dependency count it would reset (a leaf used both inside
   and outside a checkpointed function: its gradient would be lost). */
enum { LT_BACKWARD_DEPTH = 16 };
static _Thread_local uint64_t active_stamps[LT_BACKWARD_DEPTH];
static _Thread_local int active_depth;

static int stamp_active(uint64_t s) {
  for (int i = 0; i < active_depth; i++)
    if (active_stamps[i] == s)
      return 1;
  return 0;
}

static void drop_saved(lt_node *n) {
  for (int k = 0; k < n->nsaved; k++) {
    lt_tensor_release(n->saved[k]);
    n->saved[k] = NULL;
  }
  n->nsaved = 0;
  n->released = 1;
  if (n->on_drop)
    n->on_drop(n);
}

lt_status lt_autograd_backward(lt_tensor *root, lt_tensor *grad, int retain_graph,
                               const lt_backward_hooks *hooks) {
  LT_TRY(lt_check_tensor("backward", root, 1));
  char b1[200], b2[200];
  if (!lt_requires_grad(root))
    return lt_fail(LT_ERR_ARG, "backward: the tensor does not require grad (no parameter that requires "
                   "grad took part in computing it, or it was computed under lt.no_grad)");
  lt_tensor *g0 = NULL;
  if (grad) {
    LT_TRY(lt_check_tensor("backward", grad, 2));
    int same = grad->ndim == root->ndim;
    for (int d = 0; same && d < root->ndim; d++)
      same = grad->sizes[d] == root->sizes[d];
    if (!same)
      return lt_fail(LT_ERR_SHAPE, "backward: the gradient has shape %s, the tensor %s",
                     lt_tensor_shape_str(grad, b1), lt_tensor_shape_str(root, b2));
    if (grad->storage->device != root->storage->device) { /* as torch: an error, not a copy */
      char d1[16], d2[16];
      return lt_fail(LT_ERR_DEVICE, "backward: the gradient is on %s, the tensor on %s; move it with :to()",
                     lt_device_name(grad->storage->device, d1), lt_device_name(root->storage->device, d2));
    }
    LT_TRY(lt_tensor_to(grad, root->dtype, root->storage->device, &g0));
  } else {
    if (lt_tensor_numel(root) != 1)
      return lt_fail(LT_ERR_SHAPE, "backward: the tensor has shape %s; backward() without a gradient "
                     "needs a single element (give backward(grad) a tensor of that shape)",
                     lt_tensor_shape_str(root, b1));
    LT_TRY(lt_tensor_full(root->ndim, root->sizes, 1, root->dtype, root->storage->device, &g0));
  }

  lt_autograd_meta *rm = lt_meta(root);
  lt_node *start = rm->grad_fn;
  int root_slot = rm->output_nr;
  if (!start) { /* a leaf: its gradient is the given one */
    lt_node *acc;
    lt_status st = accumulator(root, &acc);
    if (st == LT_OK) {
      const lt_backward_hooks *saved_hooks = current_hooks;
      current_hooks = hooks;
      int mode = lt_grad_mode;
      lt_grad_mode = 0;
      st = accumulate_backward(acc, &g0, NULL);
      lt_grad_mode = mode;
      current_hooks = saved_hooks;
      lt_node_release(acc);
    }
    lt_tensor_release(g0);
    return st;
  }

  /* 1. the nodes reachable from the root, with how many edges feed each */
  uint64_t stamp = next_stamp++;
  node_vec all = {0}, work = {0}, ready = {0}, ran = {0};
  lt_status st = LT_OK;
  if (active_depth >= LT_BACKWARD_DEPTH)
    return lt_fail(LT_ERR_ARG, "backward: more than %d backward passes run inside one another", LT_BACKWARD_DEPTH);
  active_stamps[active_depth++] = stamp;
  start->stamp = stamp;
  start->deps = 0;
  if (!vec_push(&all, start) || !vec_push(&work, start))
    st = lt_fail(LT_ERR_OOM, "backward: out of host memory");
  while (st == LT_OK && work.n > 0) {
    lt_node *x = work.items[--work.n];
    if (x->released) {
      st = lt_fail(LT_ERR_ARG,
                   "backward: going through %s a second time, but its saved tensors were freed by the "
                   "first backward; call backward with retain_graph=true the first time", x->ops->name);
      break;
    }
    for (int k = 0; k < x->ninputs; k++) {
      lt_node *c = x->next[k].node;
      if (!c)
        continue;
      if (c->stamp != stamp) {
        if (active_depth > 1 && stamp_active(c->stamp)) {
          st = lt_fail(LT_ERR_ARG, "backward: %s belongs to the graph of the backward this one runs inside (a tensor "
                       "used both inside and outside an lt.checkpoint function, e.g. a shared weight): not supported",
                       c->ops->name);
          break;
        }
        c->stamp = stamp;
        c->deps = 0;
        if (!vec_push(&all, c) || !vec_push(&work, c)) {
          st = lt_fail(LT_ERR_OOM, "backward: out of host memory");
          break;
        }
      }
      c->deps++;
    }
  }

  /* 2. run them, latest first among the ready ones */
  const lt_backward_hooks *saved_hooks = current_hooks;
  current_hooks = hooks;
  int mode = lt_grad_mode;
  lt_grad_mode = 0;
  if (st == LT_OK) {
    st = add_to_buffer(start, root_slot, g0);
    if (st == LT_OK && (!vec_push(&ready, start)))
      st = lt_fail(LT_ERR_OOM, "backward: out of host memory");
  }
  while (st == LT_OK && ready.n > 0) {
    lt_node *x = heap_pop(&ready);
    lt_tensor *gin[LT_NODE_MAX_INPUTS] = {NULL};
    /* outputs that retain their gradient get it now that it is complete */
    for (int k = 0; k < x->noutputs; k++)
      if (x->retain[k] && x->buf[k] && st == LT_OK) {
        lt_tensor *c;
        st = lt_tensor_clone(x->buf[k], &c);
        if (st == LT_OK) {
          lt_autograd_meta *m = lt_meta(x->retain[k]);
          lt_tensor_release(m->grad);
          m->grad = c;
        }
      }
    if (st == LT_OK)
      st = x->ops->backward(x, x->buf, gin);

    if (st != LT_OK && x->ops != &accumulate_ops)
      st = lt_fail_prefix(st, x->ops->name);
    for (int k = 0; k < LT_NODE_MAX_OUTPUTS; k++) {
      lt_tensor_release(x->buf[k]);
      x->buf[k] = NULL;
    }
    for (int k = 0; k < x->ninputs; k++) {
      lt_edge e = x->next[k];
      if (st == LT_OK && e.node && gin[k]) {
        const lt_shape_info *want = &e.node->out[e.slot];
        int ok = want->ndim == gin[k]->ndim;
        for (int d = 0; ok && d < want->ndim; d++)
          ok = want->sizes[d] == gin[k]->sizes[d];
        if (!ok)
          st = lt_fail(LT_ERR_INTERNAL, "backward: %s gave input %d a gradient of shape %s for a "
                       "tensor of shape %s", x->ops->name, k + 1, lt_tensor_shape_str(gin[k], b1),
                       lt_shape_str(want->ndim, want->sizes, b2));
        else if (gin[k]->storage->device != want->device) /* as torch: an error, not a copy */
          st = lt_fail(LT_ERR_DEVICE, "backward: %s gave input %d a gradient on %s for a tensor on %s",
                       x->ops->name, k + 1, lt_device_name(gin[k]->storage->device, b1),
                       lt_device_name(want->device, b2));
        else
          st = add_to_buffer(e.node, e.slot, gin[k]);
      }
      lt_tensor_release(gin[k]);
      if (e.node && --e.node->deps == 0 && st == LT_OK) {
        if (!vec_push(&ready, e.node))
          st = lt_fail(LT_ERR_OOM, "backward: out of host memory");
        else
          heap_push(&ready, e.node);
      }
    }
    if (!retain_graph && x->ops != &accumulate_ops && !vec_push(&ran, x) && st == LT_OK)
      st = lt_fail(LT_ERR_OOM, "backward: out of host memory");
  }
  /* saved tensors go only once the whole backward succeeded: after a failure
     the graph can run again */
  for (int64_t k = 0; st == LT_OK && k < ran.n; k++)
    drop_saved(ran.items[k]);
  free(ran.items);
  lt_grad_mode = mode;
  current_hooks = saved_hooks;
  /* on failure, drop what is still buffered */
  for (int64_t k = 0; k < all.n; k++)
    for (int j = 0; j < LT_NODE_MAX_OUTPUTS; j++) {
      lt_tensor_release(all.items[k]->buf[j]);
      all.items[k]->buf[j] = NULL;
    }
  free(all.items);
  free(work.items);
  free(ready.items);
  lt_tensor_release(g0);
  active_depth--;
  return st;
}

/* ---- shaping gradients ------------------------------------------------------------ */

lt_status lt_ag_sum_to(lt_tensor *g, const lt_shape_info *s, lt_tensor **out) {
  int64_t dims[LT_MAX_DIMS];
  int nd = 0, lead = g->ndim - s->ndim;
  for (int d = 0; d < g->ndim; d++) {
    int j = d - lead;
    if (j < 0 || (s->sizes[j] == 1 && g->sizes[d] != 1))
      dims[nd++] = d;
  }
  lt_tensor *r;
  if (nd == 0) {
    lt_tensor_retain(g);
    r = g;
  } else {
    lt_tensor *summed;
    LT_TRY(lt_reduce(LT_REDUCE_SUM, g, nd, dims, 1, 0, &summed));
    lt_status st = lt_tensor_reshape(summed, s->ndim, s->sizes, &r);
    lt_tensor_release(summed);
    LT_TRY(st);
  }
  if (r->dtype != s->dtype || r->storage->device != s->device) { /* (ToBackward: back where the input is) */
    lt_tensor *c;
    lt_status st = lt_tensor_to(r, s->dtype, s->device, &c);
    lt_tensor_release(r);
    LT_TRY(st);
    r = c;
  }
  *out = r;
  return LT_OK;
}
