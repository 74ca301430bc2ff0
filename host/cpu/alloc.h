/*
 * cpu/alloc.h: the CPU caching allocator (cpu/alloc.c), behind the CPU
 * backend's alloc and free (cpu/backend.c) and its kernels' scratch.
 * lt_cpu_empty_cache and lt_cpu_memory_stats are public (lutra.h).
 */
#ifndef LUTRA_CPU_ALLOC_H
#define LUTRA_CPU_ALLOC_H

#include <stddef.h>

/* nbytes of host memory, 64-byte aligned, from the cache of its size class
   or the system; NULL when out of memory. */
void *lt_cpu_alloc(size_t nbytes);
/* Returns ptr (from lt_cpu_alloc with the same nbytes; NULL: nothing) to its
   class's cache, or to the system beyond the cache's cap. */
void lt_cpu_free(void *ptr, size_t nbytes);

#endif
