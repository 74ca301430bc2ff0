/*
 * cudnn_selftest.cc: the CUDA emulator's cuDNN (cudnn.cc) against what it
 * claims: a small graph of each kind of op computes what the documentation
 * says (checked against values worked out here), and each mistake its
 * checks name is refused with cuDNN's status: an attribute set after
 * finalizing or of the wrong type, a tensor without a required attribute,
 * two tensors with one id, a virtual tensor nothing produces, a plan
 * without an engine config, and variant packs that miss a tensor, name one
 * the graph lacks, point outside device memory or below the promised
 * alignment. Prints "cudnn selftest: N passed, M failed" (tests/run.sh).
 */
#include <cuda_runtime.h>
#include <stdio.h>

#if !__has_include(<cudnn_graph.h>)
int main(void) { /* (no cuDNN headers: no stand-in to test) */
  printf("skipped: no cudnn_graph.h\ncudnn selftest: 0 passed, 0 failed\n");
  return 0;
}
#else
#include <cudnn_graph.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

#include <vector>

static int passed, failed;

static void expect(bool ok, const char *what) {
  if (ok) {
    passed++;
  } else {
    failed++;
    char why[300] = "";
    cudnnGetLastErrorString(why, sizeof why);
    printf("FAIL: %s (%s)\n", what, why);
  }
}

static std::vector<cudnnBackendDescriptor_t> made;

static cudnnBackendDescriptor_t make(cudnnBackendDescriptorType_t t) {
  cudnnBackendDescriptor_t d = nullptr;
  cudnnBackendCreateDescriptor(t, &d);
  made.push_back(d);
  return d;
}

static cudnnStatus_t set(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t n, cudnnBackendAttributeType_t t,
                         int64_t count, const void *v) {
  return cudnnBackendSetAttribute(d, n, t, count, v);
}

static cudnnBackendDescriptor_t tensor(int64_t uid, int64_t d0, int64_t d1, const int64_t *strides, bool virt,
                                       bool byval = false, int64_t align = 4) {
  cudnnBackendDescriptor_t t = make(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  int64_t dims[4] = {1, 1, d0, d1}, packed[4] = {d0 * d1, d0 * d1, d1, 1};
  cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
  set(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
  set(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f32);
  set(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims);
  set(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides ? strides : packed);
  set(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align);
  set(t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &virt);
  set(t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &byval);
  cudnnBackendFinalize(t);
  return t;
}

static cudnnBackendDescriptor_t op_of(cudnnBackendDescriptorType_t type, std::vector<std::pair<int, void *>> attrs) {
  cudnnBackendDescriptor_t op = make(type);
  for (auto &a : attrs)
    set(op, (cudnnBackendAttributeName_t)a.first, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &a.second);
  return op;
}

static cudnnBackendDescriptor_t pointwise(cudnnPointwiseMode_t mode, cudnnBackendDescriptor_t x,
                                          cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t y) {
  cudnnBackendDescriptor_t pw = make(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
  cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
  set(pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
  set(pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &f32);
  cudnnBackendFinalize(pw);
  std::vector<std::pair<int, void *>> a = {{CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw},
                                           {CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x},
                                           {CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y}};
  if (b)
    a.push_back({CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b});
  cudnnBackendDescriptor_t op = op_of(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, a);
  cudnnBackendFinalize(op);
  return op;
}

/* the graph of ops, heuristics, plan; the plan or null */
static cudnnBackendDescriptor_t plan_of(cudnnHandle_t h, std::vector<cudnnBackendDescriptor_t> ops, int64_t *ws) {
  cudnnBackendDescriptor_t g = make(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  set(g, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, (int64_t)ops.size(), ops.data());
  if (cudnnBackendFinalize(g) != CUDNN_STATUS_SUCCESS)
    return nullptr;
  cudnnBackendDescriptor_t heur = make(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
  cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
  set(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &g);
  set(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
  cudnnBackendFinalize(heur);
  cudnnBackendDescriptor_t cfg = make(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
  int64_t got = 0;
  cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &got, &cfg);
  cudnnBackendDescriptor_t plan = make(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
  set(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &h);
  set(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfg);
  if (cudnnBackendFinalize(plan) != CUDNN_STATUS_SUCCESS)
    return nullptr;
  cudnnBackendGetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &got, ws);
  return plan;
}

static cudnnStatus_t execute(cudnnHandle_t h, cudnnBackendDescriptor_t plan, std::vector<int64_t> uids,
                             std::vector<void *> ptrs, void *ws) {
  cudnnBackendDescriptor_t pack = make(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  set(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, (int64_t)uids.size(), uids.data());
  set(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, (int64_t)ptrs.size(), ptrs.data());
  set(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws);
  cudnnBackendFinalize(pack);
  return cudnnBackendExecute(h, plan, pack);
}

int main(void) {
  cudnnHandle_t h;
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  expect(cudnnCreate(&h) == CUDNN_STATUS_SUCCESS && cudnnSetStream(h, s) == CUDNN_STATUS_SUCCESS, "a handle");

  /* Y = rowsum(exp(scale * A B^T)) over a transposed view: A (2, 3), B (2, 3)
     read as B^T (3, 2) by its strides; S (2, 2) virtual; the sum through a
     reshape that transposes S first, so row sums of S^T are column sums of S */
  int64_t bt_strides[4] = {6, 6, 1, 3}, st_strides[4] = {4, 4, 1, 2};
  cudnnBackendDescriptor_t A = tensor(1, 2, 3, nullptr, false), Bt = tensor(2, 3, 2, bt_strides, false);
  cudnnBackendDescriptor_t scale = tensor(3, 1, 1, nullptr, false, true), Y = tensor(4, 2, 1, nullptr, false);
  cudnnBackendDescriptor_t S = tensor(100, 2, 2, nullptr, true), SS = tensor(101, 2, 2, nullptr, true);
  cudnnBackendDescriptor_t E = tensor(102, 2, 2, nullptr, true), ET = tensor(103, 2, 2, st_strides, true);
  cudnnBackendDescriptor_t md = make(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
  cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
  set(md, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f32);
  cudnnBackendFinalize(md);
  cudnnBackendDescriptor_t mm = op_of(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR,
                                      {{CUDNN_ATTR_OPERATION_MATMUL_ADESC, A}, {CUDNN_ATTR_OPERATION_MATMUL_BDESC, Bt},
                                       {CUDNN_ATTR_OPERATION_MATMUL_CDESC, S}, {CUDNN_ATTR_OPERATION_MATMUL_DESC, md}});
  expect(cudnnBackendFinalize(mm) == CUDNN_STATUS_SUCCESS, "a matmul of (2, 3) and (3, 2)");
  cudnnBackendDescriptor_t mul = pointwise(CUDNN_POINTWISE_MUL, S, scale, SS);
  cudnnBackendDescriptor_t ex = pointwise(CUDNN_POINTWISE_EXP, SS, nullptr, E);
  cudnnBackendDescriptor_t rs = op_of(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR,
                                      {{CUDNN_ATTR_OPERATION_RESHAPE_XDESC, E}, {CUDNN_ATTR_OPERATION_RESHAPE_YDESC, ET}});
  expect(cudnnBackendFinalize(rs) == CUDNN_STATUS_SUCCESS, "a reshape that swaps dimensions with their strides");
  cudnnBackendDescriptor_t rd = make(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
  cudnnReduceTensorOp_t add = CUDNN_REDUCE_TENSOR_ADD;
  set(rd, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &add);
  set(rd, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f32);
  cudnnBackendFinalize(rd);
  cudnnBackendDescriptor_t red = op_of(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR,
                                       {{CUDNN_ATTR_OPERATION_REDUCTION_DESC, rd},
                                        {CUDNN_ATTR_OPERATION_REDUCTION_XDESC, ET},
                                        {CUDNN_ATTR_OPERATION_REDUCTION_YDESC, Y}});
  expect(cudnnBackendFinalize(red) == CUDNN_STATUS_SUCCESS, "a reduction of (2, 2) into (2, 1)");
  int64_t ws = -1;
  /* (ops out of order: the graph orders them by what they read) */
  cudnnBackendDescriptor_t plan = plan_of(h, {red, ex, rs, mm, mul}, &ws);
  expect(plan && ws >= 0, "a plan of the graph, its ops given out of order");

  float a[6] = {0.1f, 0.2f, 0.3f, -0.4f, 0.5f, 0.6f}, b[6] = {1, 0, -1, 0.5f, 0.25f, 2}, sc = 0.5f;
  float *da, *db, *dy;
  void *dws;
  /* (A at the end of a 256-byte allocation, so one past it runs out) */
  float *block;
  cudaMalloc((void **)&block, 256), cudaMalloc((void **)&db, sizeof b), cudaMalloc((void **)&dy, 8);
  da = block + 64 - 6;
  cudaMalloc(&dws, ws > 0 ? (size_t)ws : 1);
  cudaMemcpyAsync(da, a, sizeof a, cudaMemcpyHostToDevice, s), cudaMemcpyAsync(db, b, sizeof b, cudaMemcpyHostToDevice, s);
  expect(plan && execute(h, plan, {1, 2, 3, 4}, {da, db, &sc, dy}, dws) == CUDNN_STATUS_SUCCESS, "it executes");
  sc = 100; /* (a by-value scalar is read at the call) */
  float y[2] = {0, 0}, want[2];
  cudaMemcpyAsync(y, dy, sizeof y, cudaMemcpyDeviceToHost, s); /* (to pageable memory: waits for the stream) */
  for (int j = 0; j < 2; j++) { /* column sums of exp(0.5 A B^T): B^T's column j is B's row j */
    want[j] = 0;
    for (int i = 0; i < 2; i++) {
      double dot = 0;
      for (int k = 0; k < 3; k++)
        dot += a[i * 3 + k] * b[j * 3 + k];
      want[j] += (float)exp(0.5 * dot);
    }
  }
  char buf[200];
  snprintf(buf, sizeof buf, "the graph computes what the ops say (%g %g, want %g %g)", y[0], y[1], want[0], want[1]);
  expect(fabsf(y[0] - want[0]) < 1e-5f && fabsf(y[1] - want[1]) < 1e-5f, buf);

  /* the variant pack's mistakes */
  expect(plan && execute(h, plan, {1, 2, 3}, {da, db, &sc}, dws) == CUDNN_STATUS_BAD_PARAM_NULL_POINTER,
         "a variant pack without one of the graph's tensors is refused");
  expect(plan && execute(h, plan, {1, 2, 3, 4, 9}, {da, db, &sc, dy, dy}, dws) == CUDNN_STATUS_BAD_PARAM,
         "a variant pack naming a tensor the graph lacks is refused");
  expect(plan && execute(h, plan, {1, 2, 3, 4}, {a, db, &sc, dy}, dws) == CUDNN_STATUS_BAD_PARAM_OUT_OF_BOUND,
         "a tensor in host memory is refused");
  expect(plan && execute(h, plan, {1, 2, 3, 4}, {da + 1, db, &sc, dy}, dws) == CUDNN_STATUS_BAD_PARAM_OUT_OF_BOUND,
         "a tensor running past its allocation is refused");
  expect(plan && execute(h, plan, {1, 2, 3, 4}, {(char *)da + 2, db, &sc, dy}, dws) != CUDNN_STATUS_SUCCESS,
         "a tensor below its promised alignment is refused");
  expect(plan && (ws == 0 || execute(h, plan, {1, 2, 3, 4}, {da, db, &sc, dy}, nullptr) == CUDNN_STATUS_BAD_PARAM),
         "a missing workspace is refused");

  /* the descriptors' mistakes */
  int64_t uid = 7;
  expect(set(A, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid) == CUDNN_STATUS_BAD_PARAM,
         "an attribute set after finalizing is refused");
  cudnnBackendDescriptor_t t = make(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  expect(set(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_FLOAT, 1, &sc) == CUDNN_STATUS_BAD_PARAM_ATTRIBUTE_TYPE,
         "an attribute of the wrong type is refused");
  expect(set(t, CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &A) != CUDNN_STATUS_SUCCESS,
         "another descriptor type's attribute is refused");
  set(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
  expect(cudnnBackendFinalize(t) == CUDNN_STATUS_BAD_PARAM, "a tensor without its dimensions is refused");
  cudnnBackendDescriptor_t A2 = tensor(1, 2, 3, nullptr, false), Y2 = tensor(5, 2, 3, nullptr, false);
  cudnnBackendDescriptor_t dup = pointwise(CUDNN_POINTWISE_ADD, A, A2, Y2);
  int64_t unused = 0;
  expect(!plan_of(h, {dup}, &unused), "a graph with two tensors of one id is refused");
  cudnnBackendDescriptor_t V1 = tensor(110, 2, 3, nullptr, true), Y3 = tensor(6, 2, 3, nullptr, false);
  expect(!plan_of(h, {pointwise(CUDNN_POINTWISE_ADD, A, V1, Y3)}, &unused),
         "a graph reading a virtual tensor no op writes is refused");
  cudnnBackendDescriptor_t bare = make(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
  expect(cudnnBackendFinalize(bare) == CUDNN_STATUS_BAD_PARAM, "a plan without an engine config is refused");

  cudaStreamSynchronize(s);
  for (cudnnBackendDescriptor_t d : made)
    cudnnBackendDestroyDescriptor(d);
  printf("cudnn selftest: %d passed, %d failed\n", passed, failed);
  return failed != 0;
}
#endif
