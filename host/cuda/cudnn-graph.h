/*
 * cuda/cudnn-graph.h: cuDNN's graph ("backend") API as lutra's attention
 * uses it, shared by cuda/cudnn-graph.c (opening cuDNN, the descriptors of
 * the forward and backward attention graphs) and cuda/cudnn-attention.c
 * (plans, their cache and execution): cuDNN's functions (opened at the first
 * attention call, not linked), descriptor builders that remember the first
 * failure, and the graphs' tensor ids. Only compiled with LT_WITH_CUDA and
 * cuDNN 9's headers.
 */
#ifndef LUTRA_CUDA_CUDNN_GRAPH_H
#define LUTRA_CUDA_CUDNN_GRAPH_H

#include "cuda/backend.h"

#include <cudnn_graph.h>
#include <stdio.h>

#define DNN_FUNCS(X)                                                                                            \
  X(cudnnGetVersion) X(cudnnCreate) X(cudnnSetStream) X(cudnnGetErrorString) X(cudnnGetLastErrorString)        \
  X(cudnnBackendCreateDescriptor) X(cudnnBackendDestroyDescriptor) X(cudnnBackendSetAttribute)                 \
  X(cudnnBackendGetAttribute) X(cudnnBackendFinalize) X(cudnnBackendExecute)

/* cuDNN's functions, set by lt_cudnn_open */
extern struct lt_dnn_funcs {
#define X(f) __typeof__(f) *f;
  DNN_FUNCS(X)
#undef X
} lt_dnn;

/* Opens cuDNN 9 once (by cuda/libraries.h's lt_cuda_library, then in
   LT_CUDA_LIBDIR); its failure (LT_ERR_UNSUPPORTED: not found, lacking a
   function, a version lutra's graphs cannot use) is kept and repeated to
   every caller. Not thread-safe: callers hold their lock. */
lt_status lt_cudnn_open(void);
/* The version of the cuDNN loaded, as cudnnGetVersion gives it (9.19.0:
   91900); 0 before lt_cudnn_open has loaded it. */
size_t lt_cudnn_loaded_version(void);

/* ---- building graphs: descriptors that remember the first failure ------------------------ */

enum { MAX_DESCS = 256 };

typedef struct builder {
  cudnnBackendDescriptor_t descs[MAX_DESCS]; /* everything created, destroyed at the end */
  int n;
  int failed;
  char why[300];
} builder;

static inline void fail_with(builder *b, const char *what, cudnnStatus_t s) {
  if (b->failed)
    return;
  b->failed = 1;
  char last[200] = "";
  lt_dnn.cudnnGetLastErrorString(last, sizeof last);
  snprintf(b->why, sizeof b->why, "%s: %s%s%s", what, lt_dnn.cudnnGetErrorString(s), last[0] ? ": " : "", last);
}

/* Keeps the first reason a step that may fail without failing the graph
   did (an engine config that does not build, a heuristics mode with no
   results), for the message when nothing works. */
static inline void note_why(builder *b, const char *what, cudnnStatus_t s) {
  if (b->why[0])
    return;
  char last[200] = "";
  lt_dnn.cudnnGetLastErrorString(last, sizeof last);
  snprintf(b->why, sizeof b->why, "%s: %s%s%s", what, lt_dnn.cudnnGetErrorString(s), last[0] ? ": " : "", last);
}

static inline cudnnBackendDescriptor_t make(builder *b, cudnnBackendDescriptorType_t type) {
  if (b->failed)
    return NULL;
  if (b->n == MAX_DESCS) {
    b->failed = 1;
    snprintf(b->why, sizeof b->why, "more than %d cuDNN descriptors in one graph", MAX_DESCS);
    return NULL;
  }
  cudnnBackendDescriptor_t d = NULL;
  cudnnStatus_t s = lt_dnn.cudnnBackendCreateDescriptor(type, &d);
  if (s != CUDNN_STATUS_SUCCESS) {
    fail_with(b, "creating a descriptor", s);
    return NULL;
  }
  b->descs[b->n++] = d;
  return d;
}

static inline void set(builder *b, cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
                       cudnnBackendAttributeType_t type, int64_t count, const void *value, const char *what) {
  if (b->failed)
    return;
  cudnnStatus_t s = lt_dnn.cudnnBackendSetAttribute(d, name, type, count, value);
  if (s != CUDNN_STATUS_SUCCESS)
    fail_with(b, what, s);
}

#define SET(b, d, name, type, count, value) set((b), (d), (name), (type), (count), (value), #name)

static inline void finalize(builder *b, cudnnBackendDescriptor_t d, const char *what) {
  if (b->failed)
    return;
  cudnnStatus_t s = lt_dnn.cudnnBackendFinalize(d);
  if (s != CUDNN_STATUS_SUCCESS)
    fail_with(b, what, s);
}

static inline void builder_free(builder *b) {
  while (b->n > 0)
    lt_dnn.cudnnBackendDestroyDescriptor(b->descs[--b->n]);
}

/* Sets an attribute that some cuDNN 9 releases want and others deprecate or
   lack: its failure is not the graph's. */
static inline void set_lenient(builder *b, cudnnBackendDescriptor_t d, int name,
                               cudnnBackendAttributeType_t type, const void *value) {
  if (b->failed)
    return;
  if (lt_dnn.cudnnBackendSetAttribute(d, (cudnnBackendAttributeName_t)name, type, 1, value) != CUDNN_STATUS_SUCCESS) {
    char drained[200]; /* so a later failure's message is its own */
    lt_dnn.cudnnGetLastErrorString(drained, sizeof drained);
  }
}
/* (attributes set leniently: the handles before cuDNN 9.8, the reductions' determinism) */
enum { ATTR_OPERATIONGRAPH_HANDLE = 800, ATTR_EXECUTION_PLAN_HANDLE = 400, ATTR_REDUCTION_IS_DETERMINISTIC = 1602 };

/* an attention graph being built: its ops in order, its descriptors in b */
typedef struct graph {
  builder *b;
  cudnnBackendDescriptor_t ops[40];
  int nops;
} graph;

/* Tensor ids. Inputs and outputs are below 100 (the variant pack names
   them), virtual tensors above. */
enum {
  ID_Q = 1, ID_K, ID_V, ID_O, ID_STATS, ID_SCALE, ID_NEG_INF, ID_DO, ID_DQ, ID_DK, ID_DV, ID_ONE, ID_SOFTMAX_SUM,
  ID_DQ_ACCUM,
  ID_VIRTUAL = 100
};

/* The descriptors of d's attention graph, its ops added to g (g->b keeps
   them and the first failure): the forward S = scale Q K^T, the causal mask,
   softmax with its log-sum-exp kept as the stats, O = P V; the backward
   recomputes P from the stats and writes dQ, dK and dV (det: without atomic
   adds, the deterministic graph). Tensor ids as above. */
void lt_cudnn_forward_graph(graph *g, const lt_sdpa_desc *d);
void lt_cudnn_backward_graph(graph *g, const lt_sdpa_desc *d, int det);

#endif
