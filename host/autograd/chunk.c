/*
 * autograd/chunk.c: the public t:chunk(n, dim), n equal views along dim
 * (torch.chunk with a size that divides evenly; ops/view.c makes them), as
 * one autograd node. Its backward writes the
 * pieces' gradients into one tensor of t's shape in a single pass (narrow's
 * backward would zero and copy the whole tensor once per piece, and the
 * engine would then add the pieces up). When the gradients already lie side
 * by side in one contiguous buffer of t's shape (lt_attention_library writes
 * q, k and v's gradients so when they were cut from one qkv tensor) that
 * buffer is the gradient, and nothing is copied.
 */
#include "autograd/autograd.h"

#include <string.h>

/* The tensor of shape `in` whose chunks along dim are exactly the gs (views
   of one storage, side by side, contiguous together), or NULL. */
static lt_tensor *whole_of(lt_tensor *const *gs, int n, int dim, const lt_shape_info *in) {
  const lt_tensor *g0 = gs[0];
  if (!g0 || g0->dtype != in->dtype)
    return NULL;
  int64_t strides[LT_MAX_DIMS];
  lt_contiguous_strides(in->ndim, in->sizes, strides);
  int64_t piece = in->sizes[dim] / n;
  for (int j = 0; j < n; j++) {
    const lt_tensor *g = gs[j];
    if (!g || g->storage != g0->storage || g->dtype != g0->dtype || g->ndim != in->ndim ||
        g->offset != g0->offset + j * piece * strides[dim])
      return NULL;
    for (int d = 0; d < in->ndim; d++)
      if (g->sizes[d] != (d == dim ? piece : in->sizes[d]) || (g->sizes[d] > 1 && g->strides[d] != strides[d]))
        return NULL;
  }
  int64_t numel = 1;
  for (int d = 0; d < in->ndim; d++)
    numel *= in->sizes[d];
  if ((g0->offset + numel) * lt_dtype_size(g0->dtype) > (int64_t)g0->storage->nbytes)
    return NULL;
  return lt_tensor_wrap(g0->storage, g0->offset, in->ndim, in->sizes, strides, in->dtype);
}

/* i[0] dim, i[1] n */
static lt_status chunk_backward(lt_node *n, lt_tensor *const *go, lt_tensor **gi) {
  int dim = (int)n->i[0], pieces = (int)n->i[1];
  const lt_shape_info *in = &n->in[0];
  lt_tensor *whole = whole_of(go, pieces, dim, in);
  if (whole) {
    gi[0] = whole;
    return LT_OK;
  }
  lt_device dev = LT_DEVICE_CPU;
  for (int j = 0; j < pieces; j++)
    if (go[j])
      dev = go[j]->storage->device;
  lt_tensor *g = NULL;
  lt_status st;
  LT_NO_GRAD({
    st = lt_tensor_empty(in->ndim, in->sizes, in->dtype, dev, &g);
    int64_t piece = in->sizes[dim] / pieces;
    for (int j = 0; j < pieces && st == LT_OK; j++) {
      lt_tensor *slice = NULL;
      st = lt_tensor_narrow(g, dim, j * piece, piece, &slice);
      if (st == LT_OK)
        st = go[j] ? lt_tensor_copy_(slice, go[j]) : lt_tensor_fill_(slice, 0);
      lt_tensor_release(slice);
    }
  });
  if (st != LT_OK) {
    lt_tensor_release(g);
    return st;
  }
  gi[0] = g;
  return LT_OK;
}

static const lt_node_ops chunk_ops = {"ChunkBackward", chunk_backward, NULL};

_Static_assert((int)LT_CHUNK_MAX <= (int)LT_NODE_MAX_OUTPUTS, "a chunk's pieces are one node's outputs");

lt_status lt_tensor_chunk(lt_tensor *t, int n, int dim, lt_tensor **outs) {
  LT_TRY(lt_op_tensor_chunk(t, n, dim, outs));
  lt_status st = LT_OK;
  if (lt_ag_needed(1, (const lt_tensor *const *)&t) && lt_dtype_is_float(t->dtype)) {
    lt_node *node;
    st = lt_ag_node_new(&chunk_ops, 1, (const lt_tensor *const *)&t, &node);
    if (st == LT_OK) {
      node->i[0] = dim;
      node->i[1] = n;
      for (int j = 0; j < n && st == LT_OK; j++)
        st = lt_ag_attach(node, outs[j], j);
      lt_node_release(node);
    }
  }
  if (st != LT_OK) {
    for (int j = 0; j < n; j++) {
      lt_tensor_release(outs[j]);
      outs[j] = NULL;
    }
  }
  return st;
}
