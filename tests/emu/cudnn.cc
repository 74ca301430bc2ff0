/*
 * cudnn.cc: the CUDA emulator's cuDNN: the cuDNN 9 graph ("backend") API
 * calls host/cuda/cudnn-attention.c and cudnn-graph.c make, with descriptors kept as the
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
 *
 * This file holds the API, the descriptors and their attributes;
 * cudnn_graph.cc finalizes descriptors and compiles graphs, cudnn_run.cc
 * runs them (cudnn_emu.h: what they share).
 */
#if __has_include(<cudnn_graph.h>) /* (without cuDNN's headers lutra's attention falls back by itself) */
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
#include "cudnn_emu.h"

namespace emu_cudnn {

std::mutex lock;
std::string last_error;

cudnnStatus_t refuse(cudnnStatus_t s, const char *fmt, ...) {
  char buf[400];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  last_error = std::string("emulated cuDNN: ") + buf;
  return s;
}

std::set<handle_state *> handles;

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

} // namespace emu_cudnn

using namespace emu_cudnn;

namespace {

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
