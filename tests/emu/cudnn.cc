/*
 * cudnn.cc: the CUDA emulator's cuDNN: the cuDNN 9 graph ("backend") API
 * calls host/cuda/cudnn-attention.c makes, with descriptors kept as the
 * documentation (cuDNN's "Backend Descriptor Types") defines them and
 * operation graphs interpreted on the CPU: pointwise ops (with
 * broadcasting), matrix products over the last two dimensions (batch
 * dimensions broadcast, or grouped: an operand with fewer batch entries
 * serves each group of the result's in turn, as grouped-query attention
 * reads K and V), reductions onto a tensor whose dimensions divide the
 * input's, and reshapes that permute dimensions by their strides. Every
 * tensor of the graph, virtual or not, holds values rounded to its data
 * type (so P in bf16 before P V, as the fused kernels keep it); products
 * and sums accumulate in f32 or wider.
 *
 * It is as strict as the documentation where lutra could go wrong:
 * attributes must belong to the descriptor and have the documented type,
 * a descriptor takes no attribute once finalized, finalizing checks what
 * is required (every tensor attribute, an operation's inputs and outputs
 * and that their dimensions agree, a graph whose virtual tensors each come
 * from one operation, unique ids), the heuristics fill descriptors the
 * caller made, and cudnnBackendExecute checks the variant pack against the
 * graph (every non-virtual tensor's id and pointer, device memory covering
 * each tensor's strided extent at the alignment promised, a workspace of
 * the plan's size) and reads by-value scalars when called; the graph runs
 * in the handle's stream order (emu_queue.h). A refusal returns cuDNN's
 * status and leaves its reason for cudnnGetLastErrorString.
 *
 * What it does not model: which graphs the real engines fuse (cuDNN's
 * heuristics may refuse a graph this accepts; tests/c/test_cudnn_graph.c
 * checks the graphs against the real cuDNN without a GPU), their speed,
 * and their accumulation order. LUTRA_EMU_CUDNN_VERSION=N (default: the
 * headers' CUDNN_VERSION) sets what cudnnGetVersion says, for lutra's
 * version-dependent paths.
 */
#if __has_include(<cudnn_graph.h>) /* (without cuDNN's headers lutra's attention falls back by itself) */
#include <cblas.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cudnn_graph.h>

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "emu_queue.h"

namespace {

std::mutex lock;
std::string last_error;

/* the status, with its reason kept for cudnnGetLastErrorString */
cudnnStatus_t refuse(cudnnStatus_t s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
cudnnStatus_t refuse(cudnnStatus_t s, const char *fmt, ...) {
  char buf[400];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  last_error = std::string("emulated cuDNN: ") + buf;
  return s;
}

struct handle_state {
  cudaStream_t stream = 0;
};
std::set<handle_state *> handles;

enum { MAX_DIMS = 8 };

struct tensor_info {
  int64_t uid = 0, align = 0;
  cudnnDataType_t type = CUDNN_DATA_FLOAT;
  int nd = 0;
  int64_t dims[MAX_DIMS] = {0}, strides[MAX_DIMS] = {0};
  bool is_virtual = false, by_value = false;
  int64_t count() const {
    int64_t n = 1;
    for (int i = 0; i < nd; i++)
      n *= dims[i];
    return n;
  }
};

enum op_kind { OP_POINTWISE, OP_MATMUL, OP_REDUCTION, OP_RESHAPE };

/* an operation of a compiled graph: tensors by their index in the program */
struct op_info {
  op_kind kind;
  int mode = 0; /* cudnnPointwiseMode_t or cudnnReduceTensorOp_t */
  int64_t axis = -1;
  double alpha1 = 1, alpha2 = 1;
  int in[3] = {-1, -1, -1};
  int nin = 0, out = -1;
  int perm[MAX_DIMS] = {0}; /* reshape: y's dim j is x's dim perm[j] (-1: size 1); flat: the same element order */
  bool flat = false;
};

/* a finalized operation graph, compiled: its tensors and its ops in an
   order where each op's inputs come before it */
struct program {
  std::vector<tensor_info> tensors;
  std::vector<op_info> ops;
};

struct attr {
  cudnnBackendAttributeType_t type;
  int64_t count;
  std::vector<unsigned char> bytes;
};

struct desc {
  cudnnBackendDescriptorType_t type;
  bool finalized = false;
  std::map<int, attr> attrs;
  tensor_info tensor;                /* a tensor */
  op_info op;                        /* an operation (tensor indices unset: desc pointers below) */
  std::vector<desc *> op_tensors;    /* an operation's tensors: inputs, then the output */
  std::shared_ptr<program> prog;     /* a graph, an engine config made from it, a plan */
  int64_t workspace = 0;             /* an engine config or plan */
};

std::set<desc *> descs;

desc *live(cudnnBackendDescriptor_t d) {
  desc *p = (desc *)d;
  return descs.count(p) ? p : nullptr;
}

size_t attr_size(cudnnBackendAttributeType_t t) {
  switch (t) {
  case CUDNN_TYPE_HANDLE: return sizeof(cudnnHandle_t);
  case CUDNN_TYPE_DATA_TYPE: return sizeof(cudnnDataType_t);
  case CUDNN_TYPE_BOOLEAN: return sizeof(bool);
  case CUDNN_TYPE_INT64: return sizeof(int64_t);
  case CUDNN_TYPE_FLOAT: return sizeof(float);
  case CUDNN_TYPE_DOUBLE: return sizeof(double);
  case CUDNN_TYPE_VOID_PTR: return sizeof(void *);
  case CUDNN_TYPE_POINTWISE_MODE: return sizeof(cudnnPointwiseMode_t);
  case CUDNN_TYPE_HEUR_MODE: return sizeof(cudnnBackendHeurMode_t);
  case CUDNN_TYPE_BACKEND_DESCRIPTOR: return sizeof(cudnnBackendDescriptor_t);
  case CUDNN_TYPE_REDUCTION_OPERATOR_TYPE: return sizeof(cudnnReduceTensorOp_t);
  default: return 0;
  }
}

/* the attributes lutra may set, by descriptor type: name, type (FLOAT also
   takes DOUBLE), most elements */
struct spec {
  cudnnBackendDescriptorType_t desc;
  int name;
  cudnnBackendAttributeType_t type;
  int64_t most;
};
const spec specs[] = {
    {CUDNN_BACKEND_TENSOR_DESCRIPTOR, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1},
    {CUDNN_BACKEND_TENSOR_DESCRIPTOR, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1},
    {CUDNN_BACKEND_TENSOR_DESCRIPTOR, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, MAX_DIMS},
    {CUDNN_BACKEND_TENSOR_DESCRIPTOR, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, MAX_DIMS},
    {CUDNN_BACKEND_TENSOR_DESCRIPTOR, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1},
    {CUDNN_BACKEND_TENSOR_DESCRIPTOR, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1},
    {CUDNN_BACKEND_TENSOR_DESCRIPTOR, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1},
    {CUDNN_BACKEND_POINTWISE_DESCRIPTOR, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1},
    {CUDNN_BACKEND_POINTWISE_DESCRIPTOR, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1},
    {CUDNN_BACKEND_POINTWISE_DESCRIPTOR, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1},
    {CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR,
     CUDNN_TYPE_BACKEND_DESCRIPTOR, 1},
    {CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR,
     1},
    {CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR,
     1},
    {CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR,
     1},
    {CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR,
     1},
    {CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, CUDNN_TYPE_FLOAT, 1},
    {CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, CUDNN_TYPE_FLOAT, 1},
    {CUDNN_BACKEND_MATMUL_DESCRIPTOR, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1},
    {CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1},
    {CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1},
    {CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1},
    {CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1},
    {CUDNN_BACKEND_REDUCTION_DESCRIPTOR, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1},
    {CUDNN_BACKEND_REDUCTION_DESCRIPTOR, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1},
    {CUDNN_BACKEND_REDUCTION_DESCRIPTOR, CUDNN_ATTR_REDUCTION_IS_DETERMINISTIC, CUDNN_TYPE_BOOLEAN, 1},
    {CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR,
     1},
    {CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR,
     1},
    {CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR,
     1},
    {CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1},
    {CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1},
    {CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1},
    {CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1 << 20},
    {CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1},
    {CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1},
    {CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1},
    {CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1},
    {CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, 1 << 20},
    {CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, 1 << 20},
    {CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1},
};

const spec *find_spec(cudnnBackendDescriptorType_t d, int name) {
  for (const spec &s : specs)
    if (s.desc == d && s.name == name)
      return &s;
  return nullptr;
}

/* ---- reading attributes ------------------------------------------------------------------ */

const attr *get(const desc *d, int name) {
  auto it = d->attrs.find(name);
  return it == d->attrs.end() ? nullptr : &it->second;
}

template <typename T> bool get1(const desc *d, int name, T *out) {
  const attr *a = get(d, name);
  if (!a || a->count < 1)
    return false;
  memcpy(out, a->bytes.data(), sizeof(T));
  return true;
}

/* a descriptor-valued attribute: the live descriptor of the wanted type, or null */
desc *get_desc(const desc *d, int name, cudnnBackendDescriptorType_t type) {
  void *p = nullptr;
  if (!get1(d, name, &p))
    return nullptr;
  desc *x = live(p);
  return x && x->type == type ? x : nullptr;
}

double get_scalar(const desc *d, int name, double otherwise) {
  const attr *a = get(d, name);
  if (!a)
    return otherwise;
  if (a->type == CUDNN_TYPE_DOUBLE) {
    double v;
    memcpy(&v, a->bytes.data(), sizeof v);
    return v;
  }
  float v;
  memcpy(&v, a->bytes.data(), sizeof v);
  return v;
}

size_t type_size(cudnnDataType_t t) {
  switch (t) {
  case CUDNN_DATA_DOUBLE:
  case CUDNN_DATA_INT64: return 8;
  case CUDNN_DATA_FLOAT:
  case CUDNN_DATA_INT32: return 4;
  case CUDNN_DATA_HALF:
  case CUDNN_DATA_BFLOAT16: return 2;
  case CUDNN_DATA_BOOLEAN:
  case CUDNN_DATA_INT8: return 1;
  default: return 0;
  }
}


/* v as the type holds it */
float round_to(cudnnDataType_t t, double v) {
  switch (t) {
  case CUDNN_DATA_HALF: return __half2float(__float2half_rn((float)v));
  case CUDNN_DATA_BFLOAT16: return __bfloat162float(__float2bfloat16_rn((float)v));
  case CUDNN_DATA_INT32:
  case CUDNN_DATA_INT64:
  case CUDNN_DATA_INT8: return (float)trunc(v);
  case CUDNN_DATA_BOOLEAN: return v != 0;
  default: return (float)v;
  }
}

double load(cudnnDataType_t t, const void *p, int64_t i) {
  switch (t) {
  case CUDNN_DATA_DOUBLE: return ((const double *)p)[i];
  case CUDNN_DATA_FLOAT: return ((const float *)p)[i];
  case CUDNN_DATA_HALF: return __half2float(((const __half *)p)[i]);
  case CUDNN_DATA_BFLOAT16: return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
  case CUDNN_DATA_INT32: return ((const int32_t *)p)[i];
  case CUDNN_DATA_INT64: return (double)((const int64_t *)p)[i];
  case CUDNN_DATA_INT8: return ((const int8_t *)p)[i];
  default: return ((const unsigned char *)p)[i] != 0;
  }
}

void store(cudnnDataType_t t, void *p, int64_t i, float v) {
  switch (t) {
  case CUDNN_DATA_DOUBLE: ((double *)p)[i] = v; break;
  case CUDNN_DATA_FLOAT: ((float *)p)[i] = v; break;
  case CUDNN_DATA_HALF: ((__half *)p)[i] = __float2half_rn(v); break;
  case CUDNN_DATA_BFLOAT16: ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(v); break;
  case CUDNN_DATA_INT32: ((int32_t *)p)[i] = (int32_t)v; break;
  case CUDNN_DATA_INT64: ((int64_t *)p)[i] = (int64_t)v; break;
  case CUDNN_DATA_INT8: ((int8_t *)p)[i] = (int8_t)v; break;
  default: ((unsigned char *)p)[i] = v != 0; break;
  }
}

std::string dims_text(const tensor_info &t) {
  std::string s = "(";
  for (int i = 0; i < t.nd; i++)
    s += std::to_string(t.dims[i]) + (i + 1 < t.nd ? ", " : ")");
  return s;
}

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

/* ---- running a program -------------------------------------------------------------------- */

/* the index counter over dims, one step; false after the last */
bool next_index(int64_t *idx, const int64_t *dims, int nd) {
  for (int i = nd - 1; i >= 0; i--) {
    if (++idx[i] < dims[i])
      return true;
    idx[i] = 0;
  }
  return false;
}

/* packed strides of t, 0 where a dimension of 1 broadcasts */
void packed_strides(const tensor_info &t, int64_t *out) {
  int64_t s = 1;
  for (int i = t.nd - 1; i >= 0; i--) {
    out[i] = t.dims[i] == 1 ? 0 : s;
    s *= t.dims[i];
  }
}

double pointwise_value(int mode, double x, double b, double t) {
  switch (mode) {
  case CUDNN_POINTWISE_ADD: return x + b;
  case CUDNN_POINTWISE_SUB: return x - b;
  case CUDNN_POINTWISE_MUL: return x * b;
  case CUDNN_POINTWISE_DIV: return x / b;
  case CUDNN_POINTWISE_MAX: return x > b ? x : b;
  case CUDNN_POINTWISE_MIN: return x < b ? x : b;
  case CUDNN_POINTWISE_CMP_EQ: return x == b;
  case CUDNN_POINTWISE_CMP_NEQ: return x != b;
  case CUDNN_POINTWISE_CMP_GT: return x > b;
  case CUDNN_POINTWISE_CMP_GE: return x >= b;
  case CUDNN_POINTWISE_CMP_LT: return x < b;
  case CUDNN_POINTWISE_CMP_LE: return x <= b;
  case CUDNN_POINTWISE_BINARY_SELECT: return t != 0 ? x : b; /* the documentation: y = t ? x : b */
  case CUDNN_POINTWISE_IDENTITY: return x;
  case CUDNN_POINTWISE_EXP: return exp(x);
  case CUDNN_POINTWISE_LOG: return log(x);
  case CUDNN_POINTWISE_NEG: return -x;
  case CUDNN_POINTWISE_SQRT: return sqrt(x);
  case CUDNN_POINTWISE_RECIPROCAL: return 1 / x;
  case CUDNN_POINTWISE_ABS: return fabs(x);
  default: return NAN;
  }
}

struct run_state {
  std::shared_ptr<program> prog;
  std::vector<void *> ptrs;     /* by tensor: device memory (null for virtual and by-value tensors) */
  std::vector<double> scalars;  /* by tensor: by-value values, read at cudnnBackendExecute */
  std::vector<std::vector<float>> values;
};

const std::vector<float> &value_of(run_state &rs, int i) {
  std::vector<float> &v = rs.values[i];
  if (!v.empty())
    return v;
  const tensor_info &t = rs.prog->tensors[i];
  v.resize(t.count());
  if (t.by_value) {
    v[0] = round_to(t.type, rs.scalars[i]);
    return v;
  }
  int64_t idx[MAX_DIMS] = {0}, n = 0;
  do {
    int64_t off = 0;
    for (int k = 0; k < t.nd; k++)
      off += idx[k] * t.strides[k];
    v[n++] = (float)load(t.type, rs.ptrs[i], off);
  } while (next_index(idx, t.dims, t.nd));
  return v;
}

void run_pointwise(run_state &rs, const op_info &op, std::vector<float> &y, const tensor_info &Y) {
  const std::vector<float> *in[3] = {nullptr, nullptr, nullptr};
  int64_t st[3][MAX_DIMS] = {{0}};
  for (int k = 0; k < op.nin; k++) {
    in[k] = &value_of(rs, op.in[k]);
    packed_strides(rs.prog->tensors[op.in[k]], st[k]);
  }
  int64_t idx[MAX_DIMS] = {0}, n = 0;
  do {
    double v[3] = {0, 0, 0};
    for (int k = 0; k < op.nin; k++) {
      int64_t off = 0;
      for (int d = 0; d < Y.nd; d++)
        off += idx[d] * st[k][d];
      v[k] = (*in[k])[off];
    }
    double r = op.mode == CUDNN_POINTWISE_GEN_INDEX ? (double)idx[op.axis]
                                                     : pointwise_value(op.mode, op.alpha1 * v[0], op.alpha2 * v[1], v[2]);
    y[n++] = round_to(Y.type, r);
  } while (next_index(idx, Y.dims, Y.nd));
}

/* C = A B per batch entry, in f32 (OpenBLAS) as the engines accumulate */
void run_matmul(run_state &rs, const op_info &op, std::vector<float> &c, const tensor_info &C) {
  const tensor_info &A = rs.prog->tensors[op.in[0]], &B = rs.prog->tensors[op.in[1]];
  const std::vector<float> &a = value_of(rs, op.in[0]), &b = value_of(rs, op.in[1]);
  int n = C.nd;
  int64_t M = C.dims[n - 2], N = C.dims[n - 1], K = A.dims[n - 1];
  int64_t batch_dims[MAX_DIMS] = {0}, idx[MAX_DIMS] = {0}, entry = 0;
  for (int i = 0; i < n - 2; i++)
    batch_dims[i] = C.dims[i];
  std::vector<float> out((size_t)(M * N));
  do {
    /* an operand's batch entry: the result's, divided by its group size */
    int64_t ea = 0, eb = 0;
    for (int i = 0; i < n - 2; i++) {
      ea = ea * A.dims[i] + idx[i] / (C.dims[i] / A.dims[i]);
      eb = eb * B.dims[i] + idx[i] / (C.dims[i] / B.dims[i]);
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)M, (int)N, (int)K, 1.0f, a.data() + ea * M * K,
                (int)K, b.data() + eb * K * N, (int)N, 0.0f, out.data(), (int)N);
    for (int64_t e = 0; e < M * N; e++)
      c[entry * M * N + e] = round_to(C.type, out[e]);
    entry++;
  } while (n > 2 && next_index(idx, batch_dims, n - 2));
}

void run_reduction(run_state &rs, const op_info &op, std::vector<float> &y, const tensor_info &Y) {
  const tensor_info &X = rs.prog->tensors[op.in[0]];
  const std::vector<float> &x = value_of(rs, op.in[0]);
  double init = op.mode == CUDNN_REDUCE_TENSOR_MAX ? -INFINITY : op.mode == CUDNN_REDUCE_TENSOR_MIN ? INFINITY : 0;
  std::vector<double> acc(y.size(), init);
  int64_t ys[MAX_DIMS], idx[MAX_DIMS] = {0}, n = 0;
  packed_strides(Y, ys);
  do {
    int64_t off = 0;
    for (int d = 0; d < X.nd; d++)
      off += idx[d] / (X.dims[d] / Y.dims[d]) * ys[d];
    double v = x[n++];
    double &a = acc[off];
    if (op.mode == CUDNN_REDUCE_TENSOR_ADD)
      a += v;
    else if (op.mode == CUDNN_REDUCE_TENSOR_MAX)
      a = v > a || v != v ? v : a;
    else
      a = v < a || v != v ? v : a;
  } while (next_index(idx, X.dims, X.nd));
  for (size_t i = 0; i < y.size(); i++)
    y[i] = round_to(Y.type, acc[i]);
}

void run_reshape(run_state &rs, const op_info &op, std::vector<float> &y, const tensor_info &Y) {
  const tensor_info &X = rs.prog->tensors[op.in[0]];
  const std::vector<float> &x = value_of(rs, op.in[0]);
  if (op.flat) {
    for (size_t i = 0; i < y.size(); i++)
      y[i] = round_to(Y.type, x[i]);
    return;
  }
  int64_t xs[MAX_DIMS], idx[MAX_DIMS] = {0}, n = 0;
  packed_strides(X, xs);
  do {
    int64_t off = 0;
    for (int j = 0; j < Y.nd; j++)
      if (op.perm[j] >= 0)
        off += idx[j] * xs[op.perm[j]];
    y[n++] = round_to(Y.type, x[off]);
  } while (next_index(idx, Y.dims, Y.nd));
}

void run_program(run_state &rs) {
  const program &p = *rs.prog;
  std::vector<int> uses(p.tensors.size());
  for (const op_info &op : p.ops)
    for (int k = 0; k < op.nin; k++)
      uses[op.in[k]]++;
  for (const op_info &op : p.ops) {
    const tensor_info &Y = p.tensors[op.out];
    std::vector<float> y((size_t)Y.count());
    switch (op.kind) {
    case OP_POINTWISE: run_pointwise(rs, op, y, Y); break;
    case OP_MATMUL: run_matmul(rs, op, y, Y); break;
    case OP_REDUCTION: run_reduction(rs, op, y, Y); break;
    case OP_RESHAPE: run_reshape(rs, op, y, Y); break;
    }
    if (!Y.is_virtual) { /* written where the variant pack says */
      int64_t idx[MAX_DIMS] = {0}, n = 0;
      do {
        int64_t off = 0;
        for (int k = 0; k < Y.nd; k++)
          off += idx[k] * Y.strides[k];
        store(Y.type, rs.ptrs[op.out], off, y[n++]);
      } while (next_index(idx, Y.dims, Y.nd));
    }
    rs.values[op.out] = std::move(y);
    for (int k = 0; k < op.nin; k++) /* (a tensor no later op reads is let go) */
      if (--uses[op.in[k]] == 0)
        std::vector<float>().swap(rs.values[op.in[k]]);
  }
}

int64_t plan_workspace(const program &p) { return 4096 + 64 * (int64_t)p.ops.size(); }

uint64_t alignment_of(const void *p) {
  uint64_t a = (uintptr_t)p, al = 256;
  while (al > 1 && a % al)
    al >>= 1;
  return al;
}

} // namespace

extern "C" {

size_t cudnnGetVersion(void) { return (size_t)emulated_version(); }

const char *cudnnGetErrorString(cudnnStatus_t s) {
  switch (s) {
  case CUDNN_STATUS_SUCCESS: return "CUDNN_STATUS_SUCCESS";
  case CUDNN_STATUS_BAD_PARAM: return "CUDNN_STATUS_BAD_PARAM";
  case CUDNN_STATUS_BAD_PARAM_NULL_POINTER: return "CUDNN_STATUS_BAD_PARAM_NULL_POINTER";
  case CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER: return "CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER";
  case CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED: return "CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED";
  case CUDNN_STATUS_BAD_PARAM_OUT_OF_BOUND: return "CUDNN_STATUS_BAD_PARAM_OUT_OF_BOUND";
  case CUDNN_STATUS_BAD_PARAM_SIZE_INSUFFICIENT: return "CUDNN_STATUS_BAD_PARAM_SIZE_INSUFFICIENT";
  case CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH: return "CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH";
  case CUDNN_STATUS_BAD_PARAM_DUPLICATED_ENTRIES: return "CUDNN_STATUS_BAD_PARAM_DUPLICATED_ENTRIES";
  case CUDNN_STATUS_BAD_PARAM_ATTRIBUTE_TYPE: return "CUDNN_STATUS_BAD_PARAM_ATTRIBUTE_TYPE";
  case CUDNN_STATUS_BAD_PARAM_DESCRIPTOR_TYPE: return "CUDNN_STATUS_BAD_PARAM_DESCRIPTOR_TYPE";
  case CUDNN_STATUS_NOT_SUPPORTED: return "CUDNN_STATUS_NOT_SUPPORTED";
  case CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE: return "CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE";
  case CUDNN_STATUS_NOT_INITIALIZED: return "CUDNN_STATUS_NOT_INITIALIZED";
  case CUDNN_STATUS_EXECUTION_FAILED: return "CUDNN_STATUS_EXECUTION_FAILED";
  default: return "CUDNN_STATUS (another)";
  }
}

void cudnnGetLastErrorString(char *message, size_t max_size) {
  std::lock_guard<std::mutex> g(lock);
  if (message && max_size)
    snprintf(message, max_size, "%s", last_error.c_str());
  last_error.clear();
}

cudnnStatus_t cudnnCreate(cudnnHandle_t *handle) {
  std::lock_guard<std::mutex> g(lock);
  if (!handle)
    return refuse(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, "cudnnCreate without a place for the handle");
  handle_state *h = new handle_state;
  handles.insert(h);
  *handle = (cudnnHandle_t)(void *)h;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetStream(cudnnHandle_t handle, cudaStream_t stream) {
  std::lock_guard<std::mutex> g(lock);
  handle_state *h = (handle_state *)(void *)handle;
  if (!handles.count(h))
    return refuse(CUDNN_STATUS_BAD_PARAM, "cudnnSetStream on a handle cudnnCreate did not make");
  h->stream = stream;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendCreateDescriptor(cudnnBackendDescriptorType_t type, cudnnBackendDescriptor_t *out) {
  std::lock_guard<std::mutex> g(lock);
  if (!out)
    return refuse(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, "cudnnBackendCreateDescriptor without a place for it");
  desc *d = new desc;
  d->type = type;
  descs.insert(d);
  *out = d;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendDestroyDescriptor(cudnnBackendDescriptor_t p) {
  std::lock_guard<std::mutex> g(lock);
  desc *d = live(p);
  if (!d)
    return refuse(CUDNN_STATUS_BAD_PARAM, "destroying a descriptor that is not (or no longer) there");
  descs.erase(d);
  delete d;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendSetAttribute(cudnnBackendDescriptor_t p, cudnnBackendAttributeName_t name,
                                       cudnnBackendAttributeType_t type, int64_t count, const void *values) {
  std::lock_guard<std::mutex> g(lock);
  desc *d = live(p);
  if (!d)
    return refuse(CUDNN_STATUS_BAD_PARAM, "setting attribute %d of a descriptor that is not there", (int)name);
  if (d->finalized)
    return refuse(CUDNN_STATUS_BAD_PARAM, "setting attribute %d of a finalized descriptor", (int)name);
  const spec *s = find_spec(d->type, name);
  if (!s)
    return refuse(CUDNN_STATUS_NOT_SUPPORTED, "attribute %d does not belong to descriptor type %d (or is not "
                  "emulated)", (int)name, (int)d->type);
  bool type_ok = type == s->type || (s->type == CUDNN_TYPE_FLOAT && type == CUDNN_TYPE_DOUBLE);
  if (!type_ok)
    return refuse(CUDNN_STATUS_BAD_PARAM_ATTRIBUTE_TYPE, "attribute %d takes type %d, not %d", (int)name,
                  (int)s->type, (int)type);
  if (count < 1 || count > s->most || !values)
    return refuse(CUDNN_STATUS_BAD_PARAM, "attribute %d: %lld elements (1 to %lld)", (int)name, (long long)count,
                  (long long)s->most);
  size_t es = attr_size(type);
  attr a{type, count, std::vector<unsigned char>((const unsigned char *)values,
                                                 (const unsigned char *)values + es * (size_t)count)};
  d->attrs[name] = std::move(a);
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendFinalize(cudnnBackendDescriptor_t p) {
  std::lock_guard<std::mutex> g(lock);
  desc *d = live(p);
  if (!d)
    return refuse(CUDNN_STATUS_BAD_PARAM, "finalizing a descriptor that is not there");
  if (d->finalized)
    return refuse(CUDNN_STATUS_BAD_PARAM, "finalizing a descriptor twice");
  cudnnStatus_t s = finalize(d);
  d->finalized = s == CUDNN_STATUS_SUCCESS;
  return s;
}

cudnnStatus_t cudnnBackendGetAttribute(cudnnBackendDescriptor_t p, cudnnBackendAttributeName_t name,
                                       cudnnBackendAttributeType_t type, int64_t requested, int64_t *count,
                                       void *values) {
  std::lock_guard<std::mutex> g(lock);
  desc *d = live(p);
  if (!d || !d->finalized)
    return refuse(CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED, "reading attribute %d of a descriptor that is not there or "
                  "not finalized", (int)name);
  if (d->type == CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR && name == CUDNN_ATTR_ENGINEHEUR_RESULTS) {
    if (type != CUDNN_TYPE_BACKEND_DESCRIPTOR)
      return refuse(CUDNN_STATUS_BAD_PARAM_ATTRIBUTE_TYPE, "the heuristics' results are descriptors");
    const int64_t offered = 1; /* one engine config (the interpreter) */
    if (count)
      *count = requested < offered ? requested : offered;
    if (requested == 0 || !values) {
      if (count)
        *count = offered;
      return CUDNN_STATUS_SUCCESS;
    }
    for (int64_t i = 0; i < requested && i < offered; i++) {
      desc *cfg = live(((void **)values)[i]);
      if (!cfg || cfg->type != CUDNN_BACKEND_ENGINECFG_DESCRIPTOR || cfg->finalized)
        return refuse(CUDNN_STATUS_BAD_PARAM, "the heuristics fill engine config descriptors the caller made and "
                      "did not finalize");
      cfg->prog = d->prog;
      cfg->workspace = plan_workspace(*d->prog);
      cfg->finalized = true;
    }
    return CUDNN_STATUS_SUCCESS;
  }
  if (d->type == CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR && name == CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE) {
    if (type != CUDNN_TYPE_INT64 || requested < 1 || !values)
      return refuse(CUDNN_STATUS_BAD_PARAM, "the workspace size is one INT64");
    memcpy(values, &d->workspace, sizeof(int64_t));
    if (count)
      *count = 1;
    return CUDNN_STATUS_SUCCESS;
  }
  return refuse(CUDNN_STATUS_NOT_SUPPORTED, "reading attribute %d is not emulated", (int)name);
}

cudnnStatus_t cudnnBackendExecute(cudnnHandle_t handle, cudnnBackendDescriptor_t plan_p,
                                  cudnnBackendDescriptor_t pack_p) {
  std::lock_guard<std::mutex> g(lock);
  handle_state *h = (handle_state *)(void *)handle;
  desc *plan = live(plan_p), *pack = live(pack_p);
  if (!handles.count(h))
    return refuse(CUDNN_STATUS_BAD_PARAM, "cudnnBackendExecute on a handle cudnnCreate did not make");
  if (!plan || plan->type != CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR || !plan->finalized)
    return refuse(CUDNN_STATUS_BAD_PARAM, "cudnnBackendExecute needs a finalized execution plan");
  if (!pack || pack->type != CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR || !pack->finalized)
    return refuse(CUDNN_STATUS_BAD_PARAM, "cudnnBackendExecute needs a finalized variant pack");
  const attr *ids = get(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS), *ptrs = get(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS);
  void *workspace = nullptr;
  get1(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, &workspace);
  if (plan->workspace > 0 && !lt_emu_device_range(workspace, (size_t)plan->workspace))
    return refuse(CUDNN_STATUS_BAD_PARAM, "the variant pack's workspace is not %lld bytes of device memory",
                  (long long)plan->workspace);
  std::map<int64_t, void *> bound;
  for (int64_t i = 0; i < ids->count; i++) {
    int64_t uid;
    void *ptr;
    memcpy(&uid, ids->bytes.data() + i * sizeof uid, sizeof uid);
    memcpy(&ptr, ptrs->bytes.data() + i * sizeof ptr, sizeof ptr);
    if (bound.count(uid))
      return refuse(CUDNN_STATUS_BAD_PARAM_DUPLICATED_ENTRIES, "the variant pack names tensor %lld twice",
                    (long long)uid);
    bound[uid] = ptr;
  }
  run_state rs;
  rs.prog = plan->prog;
  const program &p = *rs.prog;
  rs.ptrs.assign(p.tensors.size(), nullptr);
  rs.scalars.assign(p.tensors.size(), 0);
  rs.values.resize(p.tensors.size());
  size_t named = 0;
  for (size_t i = 0; i < p.tensors.size(); i++) {
    const tensor_info &t = p.tensors[i];
    if (t.is_virtual)
      continue;
    auto it = bound.find(t.uid);
    if (it == bound.end() || !it->second)
      return refuse(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, "the variant pack has no pointer for tensor %lld",
                    (long long)t.uid);
    named++;
    if (t.by_value) { /* a host scalar, read now */
      rs.scalars[i] = load(t.type, it->second, 0);
      continue;
    }
    int64_t last = 0;
    for (int k = 0; k < t.nd; k++)
      last += (t.dims[k] - 1) * t.strides[k];
    size_t bytes = (size_t)(last + 1) * type_size(t.type);
    if (!lt_emu_device_range(it->second, bytes))
      return refuse(CUDNN_STATUS_BAD_PARAM_OUT_OF_BOUND, "tensor %lld %s: its %zu bytes at %p are not inside one "
                    "device allocation", (long long)t.uid, dims_text(t).c_str(), bytes, it->second);
    if (alignment_of(it->second) < (uint64_t)t.align)
      return refuse(CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER, "tensor %lld at %p is less aligned than its %lld "
                    "bytes", (long long)t.uid, it->second, (long long)t.align);
    rs.ptrs[i] = it->second;
  }
  if (named != bound.size())
    return refuse(CUDNN_STATUS_BAD_PARAM, "the variant pack names %zu tensors the graph does not have",
                  bound.size() - named);
  int64_t ws = plan->workspace;
  lt_emu_trace(h->stream, "cudnn graph of %zu ops", p.ops.size());
  lt_emu_enqueue(h->stream, [rs, workspace, ws]() mutable {
    if (ws > 0)
      memset(workspace, 0xff, (size_t)ws); /* (the engine's scratch) */
    run_program(rs);
  });
  return CUDNN_STATUS_SUCCESS;
}

} // extern "C"

#endif /* cudnn_graph.h */
