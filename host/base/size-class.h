/*
 * size-class.h: the size classes of lutra's caching allocators (CPU in
 * cpu/alloc.c, CUDA in cuda/backend.c): multiples of `step` up to `limit`
 * (both powers of two), then four classes per power of two, so a cached
 * block wastes at most a quarter of itself and a freed size maps back to
 * its class.
 */
#ifndef LUTRA_SIZE_CLASS_H
#define LUTRA_SIZE_CLASS_H

#include <stddef.h>

/* Number of classes for a given step and limit, up to 2^63 bytes. */
#define LT_SIZE_CLASSES(step, limit) ((int)((limit) / (step)) + 4 * 64)

/* Rounds nbytes up to its class's size (*rounded) and returns the class index. */
static inline int lt_size_class(size_t nbytes, size_t step, size_t limit, size_t *rounded) {
  if (nbytes <= limit) {
    size_t r = (nbytes + step - 1) / step;
    if (r == 0)
      r = 1;
    *rounded = r * step;
    return (int)r - 1;
  }
  int p = 63 - __builtin_clzll((unsigned long long)(nbytes - 1)); /* 2^p < nbytes <= 2^(p+1) */
  int limit_log2 = 63 - __builtin_clzll((unsigned long long)limit);
  size_t quarter = (size_t)1 << (p - 2), base = (size_t)1 << p; /* a quarter of (2^p, 2^(p+1)] */
  int q = (int)((nbytes - base + quarter - 1) / quarter); /* 1..4 */
  *rounded = base + (size_t)q * quarter;
  return (int)(limit / step) + 4 * (p - limit_log2) + (q - 1);
}

#endif
