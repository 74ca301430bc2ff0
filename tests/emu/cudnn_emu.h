/*
 * cudnn_emu.h: what the files of the CUDA emulator's cuDNN share: cudnn.cc
 * (the API: handles, descriptors and their attributes, execution),
 * cudnn_graph.cc (finalizing descriptors as the documentation defines them,
 * compiling operation graphs into programs) and cudnn_run.cc (running a
 * program on the CPU). Only with cuDNN's headers.
 */
#ifndef LUTRA_TESTS_EMU_CUDNN_EMU_H
#define LUTRA_TESTS_EMU_CUDNN_EMU_H

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cudnn_graph.h>

#include <stdint.h>
#include <string.h>

#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

namespace emu_cudnn {

/* the API's lock, and the last refusal's reason (cudnnGetLastErrorString) */
extern std::mutex lock;
extern std::string last_error;

/* the status, with its reason kept for cudnnGetLastErrorString */
cudnnStatus_t refuse(cudnnStatus_t s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

struct handle_state {
  cudaStream_t stream = 0;
};
extern std::set<handle_state *> handles; /* made by cudnnCreate */

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

extern std::set<desc *> descs; /* every live descriptor */
/* d as a live descriptor, or null */
desc *live(cudnnBackendDescriptor_t d);
/* the bytes of an attribute type's element (0: not one lutra sets) */
size_t attr_size(cudnnBackendAttributeType_t t);

/* the attributes lutra may set, by descriptor type: name, type (FLOAT also
   takes DOUBLE), most elements */
struct spec {
  cudnnBackendDescriptorType_t desc;
  int name;
  cudnnBackendAttributeType_t type;
  int64_t most;
};
/* the spec of attribute name of descriptor type d, or null */
const spec *find_spec(cudnnBackendDescriptorType_t d, int name);

/* ---- reading attributes (cudnn.cc) */
const attr *get(const desc *d, int name);
/* the first element of attribute name, into out; false when it is not set */
template <typename T> bool get1(const desc *d, int name, T *out) {
  const attr *a = get(d, name);
  if (!a || a->count < 1)
    return false;
  memcpy(out, a->bytes.data(), sizeof(T));
  return true;
}
/* a descriptor-valued attribute: the live descriptor of the wanted type, or null */
desc *get_desc(const desc *d, int name, cudnnBackendDescriptorType_t type);
/* a FLOAT or DOUBLE attribute's value, or otherwise when it is not set */
double get_scalar(const desc *d, int name, double otherwise);
/* the bytes of an element of data type t (0: not one the emulator takes) */
size_t type_size(cudnnDataType_t t);
/* v as the type holds it */
float round_to(cudnnDataType_t t, double v);
/* element i of typed memory p, and storing one */
double load(cudnnDataType_t t, const void *p, int64_t i);
void store(cudnnDataType_t t, void *p, int64_t i, float v);
/* "(2, 3, 4)" */
std::string dims_text(const tensor_info &t);

/* ---- finalizing (cudnn_graph.cc) */
/* checks and finalizes d as its type requires (a graph: compiled into its
   program); a refusal's status (refuse) when it is not complete or wrong */
cudnnStatus_t finalize(desc *d);
/* whether x broadcasts to y (each dimension equal or 1) */
bool broadcasts(const tensor_info &x, const tensor_info &y);
/* whether t's strides are the packed ones of its dimensions */
bool packed(const tensor_info &t);
/* what cudnnGetVersion says (LUTRA_EMU_CUDNN_VERSION, else the headers') */
int emulated_version();

/* ---- running (cudnn_run.cc) */
/* a program's execution: its tensors' memory and by-value scalars */
struct run_state {
  std::shared_ptr<program> prog;
  std::vector<void *> ptrs;     /* by tensor: device memory (null for virtual and by-value tensors) */
  std::vector<double> scalars;  /* by tensor: by-value values, read at cudnnBackendExecute */
  std::vector<std::vector<float>> values;
};
/* runs rs's program: every op in order, each result rounded to its tensor's
   type, the non-virtual ones stored where the variant pack said */
void run_program(run_state &rs);

} // namespace emu_cudnn

#endif
