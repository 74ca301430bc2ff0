/*
 * cuda/device.h: the CUDA probe for the layers above the backend, in every
 * build (no CUDA header needed): lt_cuda_device_count (lutra.h) and the CUDA
 * line of lutra's build information. cuda/device.c.
 */
#ifndef LUTRA_CUDA_DEVICE_H
#define LUTRA_CUDA_DEVICE_H

#include <stddef.h>

/* Writes lt_build_info's CUDA part into buf (at most cap bytes, NUL-ended):
   "cuda: compiled in (runtime R, driver D), N devices found[: why none]"
   and a line per device (name, sm_XY, memory), or "cuda: not compiled in
   (CUDA=0)", each line ending in a newline. Returns what snprintf would: the
   length it wanted. */
int lt_cuda_build_info(char *buf, size_t cap);

#endif
