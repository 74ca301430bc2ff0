/*
 * cpu/alloc.c: the CPU caching allocator. Freed blocks are kept on free lists
 * by size class and handed out again, so a training step that allocates the
 * same shapes every time makes no system calls and touches no new pages
 * (large malloc blocks would come back as fresh, faulting mmap pages).
 *
 * Size classes: multiples of 64 bytes up to 4 KiB, then four classes per power
 * of two. Cached bytes are capped (LUTRA_CPU_CACHE_MB, default 4096; 0 turns
 * caching off, which suits valgrind and AddressSanitizer runs).
 */
#include "cpu/alloc.h"
#include "base/size-class.h"
#include "base/status.h"

#include <pthread.h>
#include <stdlib.h>

enum { SMALL_LIMIT = 4096, SMALL_STEP = 64, NCLASSES = LT_SIZE_CLASSES(SMALL_STEP, SMALL_LIMIT) };

typedef struct block {
  struct block *next;
} block;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static block *free_lists[NCLASSES];
static int64_t live_bytes, cached_bytes, peak_bytes;
static int64_t cache_limit = -1;

static int size_class(size_t nbytes, size_t *rounded) {
  return lt_size_class(nbytes, SMALL_STEP, SMALL_LIMIT, rounded);
}

static int64_t get_cache_limit(void) {
  if (cache_limit < 0) {
    const char *env = getenv("LUTRA_CPU_CACHE_MB");
    cache_limit = (env ? atoll(env) : 4096) * (int64_t)1 << 20;
  }
  return cache_limit;
}

static void count_live(size_t rounded) { /* with the lock held */
  live_bytes += (int64_t)rounded;
  if (live_bytes > peak_bytes)
    peak_bytes = live_bytes;
}

void *lt_cpu_alloc(size_t nbytes) {
  size_t rounded;
  int c = size_class(nbytes, &rounded);
  void *p = NULL;
  pthread_mutex_lock(&lock);
  if (c < NCLASSES && free_lists[c]) { /* the steady state: one lock, no system call */
    block *b = free_lists[c];
    free_lists[c] = b->next;
    cached_bytes -= (int64_t)rounded;
    count_live(rounded);
    pthread_mutex_unlock(&lock);
    return b;
  }
  pthread_mutex_unlock(&lock);
  if (!(p = aligned_alloc(64, rounded))) {
    lt_cpu_empty_cache();
    p = aligned_alloc(64, rounded);
  }
  if (!p)
    return NULL;
  pthread_mutex_lock(&lock);
  count_live(rounded);
  pthread_mutex_unlock(&lock);
  return p;
}

void lt_cpu_free(void *ptr, size_t nbytes) {
  if (!ptr)
    return;
  size_t rounded;
  int c = size_class(nbytes, &rounded);
  int64_t limit = get_cache_limit();
  pthread_mutex_lock(&lock);
  live_bytes -= (int64_t)rounded;
  if (c < NCLASSES && cached_bytes + (int64_t)rounded <= limit) {
    block *b = ptr;
    b->next = free_lists[c];
    free_lists[c] = b;
    cached_bytes += (int64_t)rounded;
    ptr = NULL;
  }
  pthread_mutex_unlock(&lock);
  free(ptr);
}

void lt_cpu_empty_cache(void) {
  pthread_mutex_lock(&lock);
  for (int c = 0; c < NCLASSES; c++) {
    block *b = free_lists[c];
    while (b) {
      block *next = b->next;
      free(b);
      b = next;
    }
    free_lists[c] = NULL;
  }
  cached_bytes = 0;
  pthread_mutex_unlock(&lock);
}

void lt_cpu_reset_peak(void) {
  pthread_mutex_lock(&lock);
  peak_bytes = live_bytes;
  pthread_mutex_unlock(&lock);
}

void lt_cpu_memory_stats(int64_t *allocated, int64_t *reserved, int64_t *peak) {
  pthread_mutex_lock(&lock);
  if (allocated)
    *allocated = live_bytes;
  if (reserved)
    *reserved = live_bytes + cached_bytes;
  if (peak)
    *peak = peak_bytes;
  pthread_mutex_unlock(&lock);
}
