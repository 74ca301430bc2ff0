/*
 * cuda/libraries.h: what the CUDA backend takes from the installation it runs
 * on, in one place so that a build can link another: how the NVIDIA
 * libraries opened at first use (cuBLASLt, cuDNN, NCCL) are found, the note
 * that an error losing the CUDA context carries, and the allocator's notice
 * of the device memory it hands out. The product's answers are
 * cuda/libraries.c; the CUDA emulator's build (make emu) links
 * tests/emu/libraries.c instead, whose libraries are linked into lutra.
 * Only compiled with LT_WITH_CUDA.
 */
#ifndef LUTRA_CUDA_LIBRARIES_H
#define LUTRA_CUDA_LIBRARIES_H

#include <cuda_runtime_api.h>
#include <stddef.h>

/* where the CUDA toolkit's libraries are looked for when their name alone
   does not load (the Makefile passes $(CUDA_HOME)/lib64) */
#ifndef LT_CUDA_LIBDIR
#define LT_CUDA_LIBDIR "/usr/local/cuda/lib64"
#endif

/* The first attempt at a library: dlopen(path) (a soname such as
   "libnccl.so.2", or a full path), RTLD_NOW | RTLD_LOCAL. NULL when it does
   not load (dlerror() says why; callers then try LT_CUDA_LIBDIR). When name
   is not NULL, *name is what messages call the library loaded (path itself
   in the product). */
void *lt_cuda_library(const char *path, const char **name);

/* The end of the message of an error that loses the process's CUDA context
   (a kernel's fault: every later CUDA call fails the same way), beginning
   with "; ". */
const char *lt_cuda_fault_note(void);

/* The caching allocator hands the block p of block bytes to a tensor of used
   bytes (0: the block is back in the cache), in the order of stream. Nothing
   in the product; the emulator fills the bytes with garbage and, under
   AddressSanitizer, poisons the part no tensor owns. */
void lt_cuda_device_span(void *p, size_t used, size_t block, cudaStream_t stream);

#endif
