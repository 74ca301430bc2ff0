/*
 * hooks.cu: lt_cuda_kernel_hooks (cuda.h), the host's functions the CUDA
 * kernels call (the error note, the profiler's mark), empty until
 * host/cuda/backend.c installs them as it initialises a device. The
 * kernels call them through common.cuh's lt_cuda_note and lt_cuda_mark.
 */
#include "common.cuh" /* (cuda.h by way of common.cuh: the CUDA emulator finds CUDA's own cuda.h first) */

extern "C" {
lt_cuda_hooks lt_cuda_kernel_hooks = {NULL, NULL, NULL};
}
