/*
 * cudnn_graph.cc: the CUDA emulator's cuDNN (cudnn.cc), finalizing: each
 * descriptor type's checks as cuDNN's documentation ("Backend Descriptor
 * Types") defines them (every tensor attribute, an operation's inputs and
 * outputs and that their dimensions agree, a graph whose virtual tensors
 * each come from one operation, unique ids, the handles required below
 * cuDNN 9.8), and an operation graph compiled into a program (cudnn_emu.h)
 * that cudnn_run.cc runs.
 */
#if __has_include(<cudnn_graph.h>)
#include "cudnn_emu.h"

#include <stdio.h>
#include <stdlib.h>

namespace emu_cudnn {

/* ---- finalizing, by descriptor type ------------------------------------------------------ */

cudnnStatus_t finalize_tensor(desc *d) {
  tensor_info &t = d->tensor;
  const attr *dims = get(d, CUDNN_ATTR_TENSOR_DIMENSIONS), *strides = get(d, CUDNN_ATTR_TENSOR_STRIDES);
  if (!get1(d, CUDNN_ATTR_TENSOR_UNIQUE_ID, &t.uid) || !get1(d, CUDNN_ATTR_TENSOR_DATA_TYPE, &t.type) || !dims ||
      !strides || !get1(d, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, &t.align))
    return refuse(CUDNN_STATUS_BAD_PARAM, "a tensor needs its unique id, data type, dimensions, strides and byte "
                                          "alignment");
  if (dims->count != strides->count || dims->count < 1)
    return refuse(CUDNN_STATUS_BAD_PARAM, "tensor %lld: %lld dimensions and %lld strides", (long long)t.uid,
                  (long long)dims->count, (long long)strides->count);
  t.nd = (int)dims->count;
  memcpy(t.dims, dims->bytes.data(), t.nd * sizeof(int64_t));
  memcpy(t.strides, strides->bytes.data(), t.nd * sizeof(int64_t));
  for (int i = 0; i < t.nd; i++)
    if (t.dims[i] < 1 || t.strides[i] < 0)
      return refuse(CUDNN_STATUS_BAD_PARAM, "tensor %lld: dimension %d is %lld with stride %lld", (long long)t.uid, i,
                    (long long)t.dims[i], (long long)t.strides[i]);
  if (!type_size(t.type))
    return refuse(CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE, "tensor %lld: data type %d", (long long)t.uid, (int)t.type);
  if (t.align < 1 || (t.align & (t.align - 1)))
    return refuse(CUDNN_STATUS_BAD_PARAM, "tensor %lld: byte alignment %lld is not a power of two", (long long)t.uid,
                  (long long)t.align);
  get1(d, CUDNN_ATTR_TENSOR_IS_VIRTUAL, &t.is_virtual);
  get1(d, CUDNN_ATTR_TENSOR_IS_BY_VALUE, &t.by_value);
  if (t.is_virtual && t.by_value)
    return refuse(CUDNN_STATUS_BAD_PARAM, "tensor %lld is both virtual and by value", (long long)t.uid);
  if (t.by_value && t.count() != 1)
    return refuse(CUDNN_STATUS_BAD_PARAM, "by-value tensor %lld is not a scalar: %s", (long long)t.uid,
                  dims_text(t).c_str());
  return CUDNN_STATUS_SUCCESS;
}

int pointwise_arity(int mode) {
  switch (mode) {
  case CUDNN_POINTWISE_ADD:
  case CUDNN_POINTWISE_SUB:
  case CUDNN_POINTWISE_MUL:
  case CUDNN_POINTWISE_DIV:
  case CUDNN_POINTWISE_MAX:
  case CUDNN_POINTWISE_MIN:
  case CUDNN_POINTWISE_CMP_EQ:
  case CUDNN_POINTWISE_CMP_NEQ:
  case CUDNN_POINTWISE_CMP_GT:
  case CUDNN_POINTWISE_CMP_GE:
  case CUDNN_POINTWISE_CMP_LT:
  case CUDNN_POINTWISE_CMP_LE: return 2;
  case CUDNN_POINTWISE_BINARY_SELECT: return 3;
  case CUDNN_POINTWISE_IDENTITY:
  case CUDNN_POINTWISE_EXP:
  case CUDNN_POINTWISE_LOG:
  case CUDNN_POINTWISE_NEG:
  case CUDNN_POINTWISE_SQRT:
  case CUDNN_POINTWISE_RECIPROCAL:
  case CUDNN_POINTWISE_ABS:
  case CUDNN_POINTWISE_GEN_INDEX: return 1;
  default: return 0; /* not interpreted here */
  }
}

/* x broadcasts to y: the same rank, each dimension y's or 1 */
bool broadcasts(const tensor_info &x, const tensor_info &y) {
  if (x.nd != y.nd)
    return false;
  for (int i = 0; i < x.nd; i++)
    if (x.dims[i] != y.dims[i] && x.dims[i] != 1)
      return false;
  return true;
}

/* a tensor-valued attribute of an operation: finalized, or the reason */
desc *op_tensor(desc *d, int name, const char *what, cudnnStatus_t *st) {
  desc *t = get_desc(d, name, CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  if (!t) {
    *st = refuse(CUDNN_STATUS_BAD_PARAM, "an operation lacks its %s tensor", what);
    return nullptr;
  }
  if (!t->finalized) {
    *st = refuse(CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED, "an operation's %s tensor (%lld) is not finalized", what,
                 (long long)t->tensor.uid);
    return nullptr;
  }
  return t;
}

cudnnStatus_t finalize_pointwise_op(desc *d) {
  cudnnStatus_t st = CUDNN_STATUS_SUCCESS;
  desc *pw = get_desc(d, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
  if (!pw || !pw->finalized)
    return refuse(CUDNN_STATUS_BAD_PARAM, "a pointwise operation needs a finalized pointwise descriptor");
  op_info &op = d->op;
  op.kind = OP_POINTWISE;
  get1(pw, CUDNN_ATTR_POINTWISE_MODE, &op.mode);
  get1(pw, CUDNN_ATTR_POINTWISE_AXIS, &op.axis);
  int arity = pointwise_arity(op.mode);
  desc *x = op_tensor(d, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, "x", &st);
  desc *y = x ? op_tensor(d, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, "y", &st) : nullptr;
  desc *b = y && arity >= 2 ? op_tensor(d, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, "b", &st) : nullptr;
  desc *t = b && arity == 3 ? op_tensor(d, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, "t", &st) : nullptr;
  if (!y || (arity >= 2 && !b) || (arity == 3 && !t))
    return st;
  op.alpha1 = get_scalar(d, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, 1);
  op.alpha2 = get_scalar(d, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, 1);
  d->op_tensors = {x};
  if (b)
    d->op_tensors.push_back(b);
  if (t)
    d->op_tensors.push_back(t);
  for (desc *in : d->op_tensors)
    if (!broadcasts(in->tensor, y->tensor))
      return refuse(CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH, "pointwise mode %d: input %s does not broadcast to %s",
                    op.mode, dims_text(in->tensor).c_str(), dims_text(y->tensor).c_str());
  if (op.mode == CUDNN_POINTWISE_GEN_INDEX && (op.axis < 0 || op.axis >= y->tensor.nd))
    return refuse(CUDNN_STATUS_BAD_PARAM, "GEN_INDEX needs an axis within the output's %d dimensions", y->tensor.nd);
  op.nin = (int)d->op_tensors.size();
  d->op_tensors.push_back(y);
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t finalize_matmul_op(desc *d) {
  cudnnStatus_t st = CUDNN_STATUS_SUCCESS;
  desc *md = get_desc(d, CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_BACKEND_MATMUL_DESCRIPTOR);
  if (!md || !md->finalized)
    return refuse(CUDNN_STATUS_BAD_PARAM, "a matmul operation needs a finalized matmul descriptor");
  desc *a = op_tensor(d, CUDNN_ATTR_OPERATION_MATMUL_ADESC, "A", &st);
  desc *b = a ? op_tensor(d, CUDNN_ATTR_OPERATION_MATMUL_BDESC, "B", &st) : nullptr;
  desc *c = b ? op_tensor(d, CUDNN_ATTR_OPERATION_MATMUL_CDESC, "C", &st) : nullptr;
  if (!c)
    return st;
  const tensor_info &A = a->tensor, &B = b->tensor, &C = c->tensor;
  int n = C.nd;
  if (n < 2 || A.nd != n || B.nd != n || A.dims[n - 2] != C.dims[n - 2] || B.dims[n - 1] != C.dims[n - 1] ||
      A.dims[n - 1] != B.dims[n - 2])
    return refuse(CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH, "matmul of %s and %s into %s", dims_text(A).c_str(),
                  dims_text(B).c_str(), dims_text(C).c_str());
  for (int i = 0; i < n - 2; i++)
    if (C.dims[i] % A.dims[i] || C.dims[i] % B.dims[i])
      return refuse(CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH, "matmul of %s and %s into %s: batch dimension %d",
                    dims_text(A).c_str(), dims_text(B).c_str(), dims_text(C).c_str(), i);
  d->op.kind = OP_MATMUL;
  d->op.nin = 2;
  d->op_tensors = {a, b, c};
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t finalize_reduction_op(desc *d) {
  cudnnStatus_t st = CUDNN_STATUS_SUCCESS;
  desc *rd = get_desc(d, CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
  if (!rd || !rd->finalized)
    return refuse(CUDNN_STATUS_BAD_PARAM, "a reduction operation needs a finalized reduction descriptor");
  desc *x = op_tensor(d, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, "x", &st);
  desc *y = x ? op_tensor(d, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, "y", &st) : nullptr;
  if (!y)
    return st;
  const tensor_info &X = x->tensor, &Y = y->tensor;
  bool ok = X.nd == Y.nd;
  for (int i = 0; ok && i < X.nd; i++)
    ok = X.dims[i] % Y.dims[i] == 0;
  if (!ok)
    return refuse(CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH, "reduction of %s into %s", dims_text(X).c_str(),
                  dims_text(Y).c_str());
  d->op.kind = OP_REDUCTION;
  get1(rd, CUDNN_ATTR_REDUCTION_OPERATOR, &d->op.mode);
  d->op.nin = 1;
  d->op_tensors = {x, y};
  return CUDNN_STATUS_SUCCESS;
}

bool packed(const tensor_info &t) {
  int64_t s = 1;
  for (int i = t.nd - 1; i >= 0; i--) {
    if (t.dims[i] > 1 && t.strides[i] != s)
      return false;
    s *= t.dims[i];
  }
  return true;
}

/* a reshape is interpreted when it permutes dimensions (y's dims, size 1
   aside, are x's with the same strides) or both are packed in order */
cudnnStatus_t finalize_reshape_op(desc *d) {
  cudnnStatus_t st = CUDNN_STATUS_SUCCESS;
  desc *x = op_tensor(d, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, "x", &st);
  desc *y = x ? op_tensor(d, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, "y", &st) : nullptr;
  if (!y)
    return st;
  const tensor_info &X = x->tensor, &Y = y->tensor;
  if (X.count() != Y.count())
    return refuse(CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH, "reshape of %s into %s", dims_text(X).c_str(),
                  dims_text(Y).c_str());
  op_info &op = d->op;
  op.kind = OP_RESHAPE;
  op.nin = 1;
  bool used[MAX_DIMS] = {false}, perm_ok = true;
  for (int j = 0; j < Y.nd && perm_ok; j++) {
    op.perm[j] = -1;
    if (Y.dims[j] == 1)
      continue;
    for (int i = 0; i < X.nd && op.perm[j] < 0; i++)
      if (!used[i] && X.dims[i] == Y.dims[j] && X.strides[i] == Y.strides[j])
        used[i] = true, op.perm[j] = i;
    perm_ok = op.perm[j] >= 0;
  }
  op.flat = !perm_ok && packed(X) && packed(Y);
  if (!perm_ok && !op.flat)
    return refuse(CUDNN_STATUS_NOT_SUPPORTED, "a reshape of %s into %s that neither permutes dimensions by their "
                  "strides nor keeps a packed order", dims_text(X).c_str(), dims_text(Y).c_str());
  d->op_tensors = {x, y};
  return CUDNN_STATUS_SUCCESS;
}

bool is_operation(cudnnBackendDescriptorType_t t) {
  return t == CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR || t == CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR ||
         t == CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR || t == CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR;
}

int emulated_version() {
  static int v;
  if (!v) {
    const char *e = getenv("LUTRA_EMU_CUDNN_VERSION");
    v = e && atoi(e) > 0 ? atoi(e) : CUDNN_VERSION;
  }
  return v;
}

/* compiles the graph's ops into a program: tensors numbered, ops ordered
   so that each runs after what produces its inputs */
cudnnStatus_t finalize_graph(desc *d) {
  const attr *ops = get(d, CUDNN_ATTR_OPERATIONGRAPH_OPS);
  if (!ops || ops->count < 1)
    return refuse(CUDNN_STATUS_BAD_PARAM, "an operation graph needs its operations");
  void *h = nullptr;
  bool has_handle = get1(d, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, &h);
  if (has_handle ? !handles.count((handle_state *)h) : emulated_version() < 90800)
    return refuse(CUDNN_STATUS_BAD_PARAM, "the operation graph needs a handle cudnnCreate made (optional from "
                  "cuDNN 9.8)");
  std::vector<desc *> list(ops->count);
  memcpy(list.data(), ops->bytes.data(), ops->count * sizeof(void *));
  auto prog = std::make_shared<program>();
  std::map<desc *, int> index;
  std::map<int64_t, desc *> by_uid;
  std::vector<int> producer;
  for (desc *op : list) {
    if (!live(op) || !is_operation(op->type) || !op->finalized)
      return refuse(CUDNN_STATUS_BAD_PARAM, "an operation graph's op is not a finalized operation descriptor");
    for (size_t k = 0; k < op->op_tensors.size(); k++) {
      desc *t = op->op_tensors[k];
      if (!index.count(t)) {
        auto other = by_uid.find(t->tensor.uid);
        if (other != by_uid.end())
          return refuse(CUDNN_STATUS_BAD_PARAM_DUPLICATED_ENTRIES, "two tensors of the graph have unique id %lld",
                        (long long)t->tensor.uid);
        by_uid[t->tensor.uid] = t;
        index[t] = (int)prog->tensors.size();
        prog->tensors.push_back(t->tensor);
        producer.push_back(-1);
      }
    }
  }
  std::vector<op_info> unordered;
  for (size_t o = 0; o < list.size(); o++) {
    op_info op = list[o]->op;
    const std::vector<desc *> &ts = list[o]->op_tensors;
    for (int k = 0; k < op.nin; k++)
      op.in[k] = index[ts[k]];
    op.out = index[ts.back()];
    const tensor_info &out = prog->tensors[op.out];
    if (producer[op.out] >= 0)
      return refuse(CUDNN_STATUS_BAD_PARAM, "tensor %lld is the output of two operations", (long long)out.uid);
    if (out.by_value)
      return refuse(CUDNN_STATUS_BAD_PARAM, "tensor %lld is by value and an operation's output", (long long)out.uid);
    producer[op.out] = (int)o;
    unordered.push_back(op);
  }
  for (size_t i = 0; i < prog->tensors.size(); i++)
    if (prog->tensors[i].is_virtual && producer[i] < 0)
      return refuse(CUDNN_STATUS_BAD_PARAM, "virtual tensor %lld is no operation's output",
                    (long long)prog->tensors[i].uid);
  std::vector<bool> ready(prog->tensors.size()), done(unordered.size());
  for (size_t i = 0; i < ready.size(); i++)
    ready[i] = producer[i] < 0;
  for (size_t placed = 0; placed < unordered.size();) {
    size_t before = placed;
    for (size_t o = 0; o < unordered.size(); o++) {
      bool can = !done[o];
      for (int k = 0; can && k < unordered[o].nin; k++)
        can = ready[unordered[o].in[k]];
      if (can) {
        done[o] = true, ready[unordered[o].out] = true, placed++;
        prog->ops.push_back(unordered[o]);
      }
    }
    if (placed == before)
      return refuse(CUDNN_STATUS_BAD_PARAM, "the operation graph has a cycle");
  }
  d->prog = prog;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t finalize(desc *d) {
  switch (d->type) {
  case CUDNN_BACKEND_TENSOR_DESCRIPTOR: return finalize_tensor(d);
  case CUDNN_BACKEND_POINTWISE_DESCRIPTOR: {
    int mode = -1;
    cudnnDataType_t prec;
    if (!get1(d, CUDNN_ATTR_POINTWISE_MODE, &mode) || !get1(d, CUDNN_ATTR_POINTWISE_MATH_PREC, &prec))
      return refuse(CUDNN_STATUS_BAD_PARAM, "a pointwise descriptor needs its mode and math precision");
    if (!pointwise_arity(mode))
      return refuse(CUDNN_STATUS_NOT_SUPPORTED, "pointwise mode %d is not emulated", mode);
    return CUDNN_STATUS_SUCCESS;
  }
  case CUDNN_BACKEND_MATMUL_DESCRIPTOR: {
    cudnnDataType_t comp;
    if (!get1(d, CUDNN_ATTR_MATMUL_COMP_TYPE, &comp))
      return refuse(CUDNN_STATUS_BAD_PARAM, "a matmul descriptor needs its compute type");
    return CUDNN_STATUS_SUCCESS;
  }
  case CUDNN_BACKEND_REDUCTION_DESCRIPTOR: {
    int red = -1;
    cudnnDataType_t comp;
    if (!get1(d, CUDNN_ATTR_REDUCTION_OPERATOR, &red) || !get1(d, CUDNN_ATTR_REDUCTION_COMP_TYPE, &comp))
      return refuse(CUDNN_STATUS_BAD_PARAM, "a reduction descriptor needs its operator and compute type");
    if (red != CUDNN_REDUCE_TENSOR_ADD && red != CUDNN_REDUCE_TENSOR_MAX && red != CUDNN_REDUCE_TENSOR_MIN)
      return refuse(CUDNN_STATUS_NOT_SUPPORTED, "reduction operator %d is not emulated", red);
    return CUDNN_STATUS_SUCCESS;
  }
  case CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR: return finalize_pointwise_op(d);
  case CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR: return finalize_matmul_op(d);
  case CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR: return finalize_reduction_op(d);
  case CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR: return finalize_reshape_op(d);
  case CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR: return finalize_graph(d);
  case CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR: {
    desc *g = get_desc(d, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    cudnnBackendHeurMode_t mode;
    if (!g || !g->finalized || !get1(d, CUDNN_ATTR_ENGINEHEUR_MODE, &mode))
      return refuse(CUDNN_STATUS_BAD_PARAM, "the heuristics need a finalized operation graph and a mode");
    d->prog = g->prog;
    return CUDNN_STATUS_SUCCESS;
  }
  case CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR: {
    desc *cfg = get_desc(d, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    if (!cfg || !cfg->finalized || !cfg->prog)
      return refuse(CUDNN_STATUS_BAD_PARAM, "an execution plan needs an engine config from the heuristics");
    void *h = nullptr;
    bool has_handle = get1(d, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, &h);
    if (has_handle ? !handles.count((handle_state *)h) : emulated_version() < 90800)
      return refuse(CUDNN_STATUS_BAD_PARAM, "the execution plan needs a handle cudnnCreate made (required here "
                    "below cuDNN 9.8, as cudnn-frontend's plan builder requires one)");
    d->prog = cfg->prog;
    d->workspace = cfg->workspace;
    return CUDNN_STATUS_SUCCESS;
  }
  case CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR: {
    const attr *ids = get(d, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS), *ptrs = get(d, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS);
    if (!ids || !ptrs || ids->count != ptrs->count)
      return refuse(CUDNN_STATUS_BAD_PARAM, "a variant pack needs as many unique ids as data pointers");
    return CUDNN_STATUS_SUCCESS;
  }
  default: return refuse(CUDNN_STATUS_NOT_SUPPORTED, "descriptor type %d is not emulated", (int)d->type);
  }
}

} // namespace emu_cudnn

#endif /* cudnn_graph.h */
