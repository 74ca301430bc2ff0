/*
 * autograd/index.c: the public indexing ops: lt_index_select, lt_embedding
 * and lt_gather (the dispatch of ops/index.c, then the node, with the
 * backward rule: an index_add_ or scatter_add_ into zeros), and the in-place
 * lt_index_add_ and lt_scatter_add_ (the dispatch with autograd's in-place
 * check; they record nothing).
 */
#include "autograd/grad-ops.h"

static lt_status index_backward(lt_node *n, lt_tensor *const *go, lt_tensor **gi) {
  scratch S = {0}, *s = &S;
  lt_tensor *idx = saved(s, n, 0), *z = zeros_of(s, &n->in[0], go[0]);
  if (OK2(idx, z)) {
    lt_tensor *g = go[0];
    if (g->dtype != z->dtype) {
      lt_tensor *c = NULL;
      g = KEEP(s, lt_tensor_to(g, z->dtype, g->storage->device, &c), c);
    }
    if (OK1(g))
      s->st = n->i[0] ? lt_scatter_add_(z, (int)n->i[1], idx, g) : lt_index_add_(z, (int)n->i[1], idx, g);
  }
  give(&gi[0], z);
  return finish(s, gi, 2);
}

static const lt_node_ops index_select_ops = {"IndexSelectBackward", index_backward, NULL};
static const lt_node_ops gather_ops = {"GatherBackward", index_backward, NULL};

static lt_status record_index(int gather, const lt_tensor *t, int dim, const lt_tensor *index, lt_tensor *r) {
  const lt_tensor *ins[2] = {t, index};
  if (!lt_ag_needed(1, &t))
    return LT_OK;
  lt_node *n;
  LT_TRY(lt_ag_node_new(gather ? &gather_ops : &index_select_ops, 2, ins, &n));
  n->i[0] = gather;
  n->i[1] = dim;
  lt_status st = lt_ag_save(n, index);
  if (st == LT_OK)
    st = lt_ag_attach(n, r, 0);
  lt_node_release(n);
  return st;
}

lt_status lt_index_select(const lt_tensor *t, int dim, const lt_tensor *index, lt_tensor **res) {
  lt_tensor *r;
  LT_TRY(lt_op_index_select(t, dim, index, &r));
  return lt_ag_result(record_index(0, t, dim, index, r), r, res);
}

lt_status lt_embedding(const lt_tensor *weight, const lt_tensor *ids, lt_tensor **res) {
  lt_tensor *r;
  LT_TRY(lt_op_embedding(weight, ids, &r));
  return lt_ag_result(record_index(0, weight, 0, ids, r), r, res);
}

lt_status lt_gather(const lt_tensor *t, int dim, const lt_tensor *index, lt_tensor **res) {
  lt_tensor *r;
  LT_TRY(lt_op_gather(t, dim, index, &r));
  return lt_ag_result(record_index(1, t, dim, index, r), r, res);
}

lt_status lt_index_add_(lt_tensor *t, int dim, const lt_tensor *index, const lt_tensor *src) {
  return lt_op_index_add_guarded(t, dim, index, src, lt_ag_check_inplace);
}

lt_status lt_scatter_add_(lt_tensor *t, int dim, const lt_tensor *index, const lt_tensor *src) {
  return lt_op_scatter_add_guarded(t, dim, index, src, lt_ag_check_inplace);
}
