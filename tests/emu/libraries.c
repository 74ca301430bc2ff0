/*
 * tests/emu/libraries.c: the CUDA emulator's answers to host/cuda/libraries.h,
 * linked in place of host/cuda/libraries.c when EMU=1 (make emu): the
 * emulator's cuBLASLt, cuDNN and NCCL (cublaslt.cc, cudnn.cc, nccl.cc) are
 * linked into lutra, so every library is lutra itself (dlopen(NULL)); its
 * faults are not sticky, which the note says; and the caching allocator's
 * device spans go to the emulator's checks (runtime.cc's lt_emu_device_span:
 * garbage in fresh blocks, poison under AddressSanitizer).
 */
#include "cuda/libraries.h"

#include <dlfcn.h>

/* runtime.cc */
void lt_emu_device_span(void *p, size_t used, size_t block, cudaStream_t stream);

void *lt_cuda_library(const char *path, const char **name) {
  (void)path;
  if (name)
    *name = "the CUDA emulator";
  return dlopen(NULL, RTLD_NOW);
}

const char *lt_cuda_fault_note(void) {
  return "; on a GPU this loses the CUDA context (the emulator's faults are not sticky)";
}

void lt_cuda_device_span(void *p, size_t used, size_t block, cudaStream_t stream) {
  lt_emu_device_span(p, used, block, stream);
}
