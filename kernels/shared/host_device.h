/*
 * shared/host_device.h: the qualifiers of a function both devices compile
 * from one source (the headers of kernels/shared): under nvcc `__host__ __device__`
 * and forced inline, as the CUDA kernels' own helpers are; in C (the CPU
 * kernels) and in the CUDA emulator's host C++ a plain static inline.
 */
#ifndef LUTRA_KERNELS_HOST_DEVICE_H
#define LUTRA_KERNELS_HOST_DEVICE_H

#ifdef __CUDACC__
#define LT_HOST_DEVICE __host__ __device__
#define LT_SHARED_INLINE static __forceinline__ LT_HOST_DEVICE
#else
#define LT_HOST_DEVICE
#define LT_SHARED_INLINE static inline
#endif

#endif
