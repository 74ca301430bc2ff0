/*
 * cuda/backend.h: the CUDA backend's per-device state, shared by
 * cuda/backend.c (streams, allocator, vtable) and cuda/cublaslt.c (cuBLASLt).
 * Only compiled with LT_WITH_CUDA.
 */
#ifndef LUTRA_BACKEND_CUDA_H
#define LUTRA_BACKEND_CUDA_H

#include "../../kernels/cuda/cuda.h"
#include "backend/backend.h"

#include "cuda/libraries.h"

#include <cublasLt.h>
#include <cuda_runtime_api.h>

enum { LT_CUDA_MAX_DEVICES = 16, LT_CUDA_CHECKS = 32, LT_CUDA_STAGE_SLOTS = 16, LT_CUDA_STAGE_SLOT = 1 << 20 };

struct lt_cuda_block;
struct lt_cuda_plan;

typedef struct lt_cuda_ctx {
  int ready, index;
  cudaStream_t compute, comm;
  /* index checks: per check two words (the first bad position, its index
     value) on the device and pinned on the host; checks 0..LT_CUDA_CHECKS-1
     finish later (a ring, oldest first from next_check), the last one at once */
  unsigned long long *bad, *bad_host;
  struct lt_cuda_check {
    int state; /* 0 free, 1 in flight, 2 in flight with its report */
    cudaEvent_t done;
    lt_index_report report;
  } checks[LT_CUDA_CHECKS];
  int next_check, last_check;
  /* caching allocator (bytes are rounded to size classes) */
  struct lt_cuda_block **free_lists;
  size_t allocated, reserved, peak, peak_reserved;
  int64_t nalloc;
  /* cuBLASLt */
  cublasLtHandle_t blas;
  void *workspace;
  size_t workspace_size;
  struct lt_cuda_plan *plans; /* matmul plans cached by shape */
  int nplans, cap_plans;
  /* scratch for kernels that need temporary memory (used on the compute stream only) */
  void *scratch;
  size_t scratch_size;
  /* host-to-device staging: pinned slots reused once their copy's event is done */
  char *stage;
  cudaEvent_t stage_done[LT_CUDA_STAGE_SLOTS];
  int stage_next;
} lt_cuda_ctx;

/* The context of a cuda device, initialised on first use and made current.
   Errors: no such device (naming what was found), initialisation failures. */
lt_status lt_cuda_ctx_get(lt_device device, lt_cuda_ctx **out);
/* "" or, for a CUDA error that loses the process's context (an illegal
   address, a kernel's assert or fault: sticky, cudaError_t's documentation),
   a note that says so, to append to the error's message; the kernels get it
   through lt_cuda_kernel_hooks (kernels/cuda/cuda.h) */
const char *lt_cuda_error_note(int cuda_error);
/* A status for a failed CUDA call: "cuda:N: what: message (name) [file:line]". */
lt_status lt_cuda_error_at(const char *file, int line, const char *what, int device_index, cudaError_t e);
#define lt_cuda_error(what, device_index, e) lt_cuda_error_at(__FILE__, __LINE__, (what), (device_index), (e))

/* cuda/cublaslt.c */
lt_status lt_cuda_blas_init(lt_cuda_ctx *c);
lt_status lt_cuda_matmul(const lt_matmul_desc *d);

/* cuda/cudnn-attention.c: cuDNN's fused attention (lt_sdpa_desc, kernels/kernel.h);
   LT_ERR_UNSUPPORTED with cuDNN's reason when it refuses a graph */
lt_status lt_cudnn_sdpa_prepare(const lt_sdpa_desc *d, int backward);
lt_status lt_cudnn_sdpa_fwd(const lt_sdpa_desc *d);
lt_status lt_cudnn_sdpa_bwd(const lt_sdpa_desc *d);
/* the graph of d alone (forward 0, backward 1, deterministic backward 2),
   finalized without a device (tests without a GPU) */
lt_status lt_cudnn_sdpa_check_graph(const lt_sdpa_desc *d, int backward);
/* ... and its plan, compiled for the device a cuDNN device-property JSON
   describes (tests/ref/cudnn-device-h200.json), still without a device */
lt_status lt_cudnn_sdpa_check_plan(const lt_sdpa_desc *d, int backward, const char *device_json, int64_t *workspace);

#endif
