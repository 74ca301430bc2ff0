/*
 * cuda/libraries.c: the product's answers to cuda/libraries.h: NVIDIA's
 * libraries are found by dlopen (by name, the callers then trying
 * LT_CUDA_LIBDIR), a kernel's fault is sticky (the note says so and how to
 * find the kernel), and device spans need no notice. The CUDA emulator links
 * tests/emu/libraries.c in place of this file.
 */
#ifdef LT_WITH_CUDA

#include "cuda/libraries.h"

#include <dlfcn.h>

void *lt_cuda_library(const char *path, const char **name) {
  if (name)
    *name = path;
  return dlopen(path, RTLD_NOW | RTLD_LOCAL);
}

const char *lt_cuda_fault_note(void) {
  return "; a kernel faulted and this process's CUDA context is lost: every later CUDA call fails the same "
         "way until lutra restarts (tensors on the CPU are intact; CUDA_LAUNCH_BLOCKING=1 names the kernel)";
}

void lt_cuda_device_span(void *p, size_t used, size_t block, cudaStream_t stream) {
  (void)p, (void)used, (void)block, (void)stream;
}

#endif
