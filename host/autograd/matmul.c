/*
 * autograd/matmul.c: the public lt_matmul: the dispatch (ops/matmul.c) and
 * its node, with the backward rule (a Linear layer's shared weight as one
 * product over the flattened batch).
 */
#include "autograd/grad-ops.h"

static lt_tensor *tr(scratch *s, lt_tensor *a) {
  lt_tensor *r = NULL;
  if (!OK1(a))
    return NULL;
  return KEEP(s, lt_tensor_transpose(a, a->ndim - 2, a->ndim - 1, &r), r);
}

static lt_tensor *mm(scratch *s, lt_tensor *a, lt_tensor *b) {
  lt_tensor *r = NULL;
  if (!OK2(a, b))
    return NULL;
  return KEEP(s, lt_matmul(a, b, &r), r);
}

/* t with a size-1 dim inserted at d (negative counts from the end). */
static lt_tensor *unsq(scratch *s, lt_tensor *a, int d) {
  lt_tensor *r = NULL;
  if (!OK1(a))
    return NULL;
  return KEEP(s, lt_tensor_unsqueeze(a, d < 0 ? a->ndim + 1 + d : d, &r), r);
}

/* Sums a (batch..., r, c) gradient down to the shape of operand k (which
   was 1-D when `vec`, and then reshapes to it). */
static lt_tensor *fit_matmul(scratch *s, lt_node *n, int k, lt_tensor *g) {
  if (!OK1(g))
    return NULL;
  const lt_shape_info *in = &n->in[k];
  lt_shape_info promoted = *in;
  if (in->ndim == 1) { /* as matmul saw it: a (1, k), b (k, 1) */
    promoted.ndim = 2;
    promoted.sizes[0] = k == 0 ? 1 : in->sizes[0];
    promoted.sizes[1] = k == 0 ? in->sizes[0] : 1;
  }
  lt_tensor *r = NULL;
  r = KEEP(s, lt_ag_sum_to(g, &promoted, &r), r);
  return reshape(s, r, in->ndim, in->sizes);
}

static lt_status matmul_backward(lt_node *n, lt_tensor *const *go, lt_tensor **gi) {
  scratch S = {0}, *s = &S;
  lt_tensor *a = saved(s, n, 0), *b = saved(s, n, 1), *g = go[0];
  int a1 = n->in[0].ndim == 1, b1 = n->in[1].ndim == 1;
  lt_tensor *A = a1 ? unsq(s, a, 0) : a, *B = b1 ? unsq(s, b, 1) : b, *G = g;
  if (a1)
    G = unsq(s, G, b1 ? 0 : -2);
  if (b1)
    G = unsq(s, G, -1);
  lt_tensor *ga = NULL, *gb = NULL;
  if (n->next[0].node)
    ga = fit_matmul(s, n, 0, mm(s, G, tr(s, B)));
  if (n->next[1].node) {
    if (OK2(A, G) && A->ndim > 2 && B->ndim == 2) {
      /* a matrix shared by a batch (a Linear layer): one (k, M) x (M, n)
         product over the flattened batch instead of a batch of products and
         a sum over it */
      int64_t k = A->sizes[A->ndim - 1], nn = G->sizes[G->ndim - 1];
      lt_tensor *A2 = reshape(s, A, 2, (int64_t[]){-1, k}), *G2 = reshape(s, G, 2, (int64_t[]){-1, nn});
      if (!b1 && OK1(B) && B->strides[0] == 1 && B->strides[1] == B->sizes[0] && B->sizes[0] > 1) {
        /* b is the transpose of a contiguous (n, k) weight (x @ W^T): its
           gradient is made as (n, k) and handed back transposed, so that
           W's gradient arrives contiguous instead of needing a strided
           transpose of the whole matrix (the tied output head: 25 MB) */
        gb = tr(s, mm(s, tr(s, G2), A2));
      } else {
        gb = fit_matmul(s, n, 1, mm(s, tr(s, A2), G2));
      }
    } else {
      gb = fit_matmul(s, n, 1, mm(s, tr(s, A), G));
    }
  }
  give(&gi[0], ga);
  give(&gi[1], gb);
  return finish(s, gi, 2);
}

static const lt_node_ops matmul_ops = {"MatmulBackward", matmul_backward, NULL};

static lt_status record_matmul(const lt_tensor *a, const lt_tensor *b, lt_tensor *r) {
  const lt_tensor *ins[2] = {a, b};
  if (!lt_ag_needed(2, ins))
    return LT_OK;
  lt_node *n;
  LT_TRY(lt_ag_node_new(&matmul_ops, 2, ins, &n));
  lt_status st = lt_ag_save(n, a);
  if (st == LT_OK)
    st = lt_ag_save(n, b);
  if (st == LT_OK)
    st = lt_ag_attach(n, r, 0);
  lt_node_release(n);
  return st;
}

lt_status lt_matmul(const lt_tensor *a, const lt_tensor *b, lt_tensor **res) {
  lt_tensor *r;
  LT_TRY(lt_op_matmul(a, b, &r));
  return lt_ag_result(record_matmul(a, b, r), r, res);
}
