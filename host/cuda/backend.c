/*
 * cuda/backend.c: the CUDA backend's vtable. Per device: a compute stream
 * and a communication stream (the distributed issue's collectives), a
 * cuBLASLt handle and workspace, and a stream-ordered caching allocator on
 * plain cudaMalloc blocks. Kernels are in kernels/cuda/; matrix products go
 * to cuBLASLt (cuda/cublaslt.c).
 *
 * Every kernel runs on the device's compute stream, so a freed block can be
 * handed to the next allocation at once: stream order puts the new user's
 * kernels after the old user's. The host waits only where it reads values
 * (copies to the host, item()) and for uploads over 1 MiB (smaller ones,
 * a batch of ids, go through pinned slots without waiting).
 */
#ifdef LT_WITH_CUDA

#include "cuda/backend.h"
#include "base/size-class.h"
#include "base/status.h"
#include "backend/index-report.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static lt_cuda_ctx ctxs[LT_CUDA_MAX_DEVICES];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

/* size classes (size-class.h): 512-byte steps to 32 KiB, then four per power of two */
enum { SMALL_LIMIT = 32768, SMALL_STEP = 512, NCLASSES = LT_SIZE_CLASSES(SMALL_STEP, SMALL_LIMIT) };

static int size_class(size_t nbytes, size_t *rounded) {
  return lt_size_class(nbytes, SMALL_STEP, SMALL_LIMIT, rounded);
}

const char *lt_cuda_error_note(int e) {
  switch (e) {
  /* the errors cudaError_t's documentation says leave the process "in an
     inconsistent state": any further CUDA work returns the same error */
  case cudaErrorIllegalAddress:
  case cudaErrorLaunchTimeout:
  case cudaErrorAssert:
  case cudaErrorHardwareStackError:
  case cudaErrorIllegalInstruction:
  case cudaErrorMisalignedAddress:
  case cudaErrorInvalidAddressSpace:
  case cudaErrorInvalidPc:
  case cudaErrorLaunchFailure:
    return lt_cuda_fault_note(); /* (cuda/libraries.c; the emulator's are not sticky) */
  default:
    return "";
  }
}

lt_status lt_cuda_error_at(const char *file, int line, const char *what, int device_index, cudaError_t e) {
  cudaGetLastError(); /* clear a non-sticky error so later calls can work */
  return lt_fail(e == cudaErrorMemoryAllocation ? LT_ERR_OOM : LT_ERR_DEVICE, "cuda:%d: %s: %s (%s) [%s:%d]%s",
                 device_index, what, cudaGetErrorString(e), cudaGetErrorName(e), file, line,
                 lt_cuda_error_note(e));
}

lt_status lt_cuda_ctx_get(lt_device device, lt_cuda_ctx **out) {
  int index = device - LT_DEVICE_CUDA;
  if (index < 0 || index >= LT_CUDA_MAX_DEVICES)
    return lt_fail(LT_ERR_DEVICE, "cuda:%d: device index out of range (at most %d devices)", index,
                   LT_CUDA_MAX_DEVICES);
  lt_cuda_ctx *c = &ctxs[index];
  if (__atomic_load_n(&c->ready, __ATOMIC_ACQUIRE)) {
    cudaSetDevice(index);
    *out = c;
    return LT_OK;
  }
  pthread_mutex_lock(&lock);
  lt_status st = LT_OK;
  if (!c->ready) {
    const char *why = "";
    int n = lt_cuda_device_count(&why);
    cudaError_t e;
    if (index >= n) {
      st = n == 0 ? lt_fail(LT_ERR_DEVICE, "cuda:%d: no CUDA device (%s)", index, why)
                  : lt_fail(LT_ERR_DEVICE, "cuda:%d: no such device (%d found: cuda:0..cuda:%d)", index, n, n - 1);
    } else if ((e = cudaSetDevice(index)) != cudaSuccess ||
               (e = cudaStreamCreateWithFlags(&c->compute, cudaStreamNonBlocking)) != cudaSuccess ||
               (e = cudaStreamCreateWithFlags(&c->comm, cudaStreamNonBlocking)) != cudaSuccess ||
               (e = cudaMalloc((void **)&c->bad, 2 * (LT_CUDA_CHECKS + 1) * sizeof *c->bad)) != cudaSuccess ||
               (e = cudaMallocHost((void **)&c->bad_host, 2 * (LT_CUDA_CHECKS + 1) * sizeof *c->bad_host)) !=
                   cudaSuccess) {
      st = lt_cuda_error("initialising the device", index, e);
    } else {
      c->index = index;
      c->free_lists = calloc(NCLASSES, sizeof *c->free_lists);
      if (!c->free_lists)
        st = lt_fail(LT_ERR_OOM, "cuda:%d: out of host memory for the allocator", index);
      else if ((st = lt_cuda_blas_init(c)) == LT_OK) {
        if (!lt_cuda_kernel_hooks.error_note) /* (once, before any kernel runs: kernels/cuda/cuda.h) */
          lt_cuda_kernel_hooks = (lt_cuda_hooks){lt_cuda_error_note, lt_cuda_profiling, lt_cuda_profile_mark};
        __atomic_store_n(&c->ready, 1, __ATOMIC_RELEASE);
      }
    }
  }
  pthread_mutex_unlock(&lock);
  if (st == LT_OK) {
    cudaSetDevice(index);
    *out = c;
  }
  return st;
}

/* ---- the caching allocator -------------------------------------------------- */

typedef struct lt_cuda_block {
  void *ptr;
  struct lt_cuda_block *next;
} cblock;

/* Returns every cached block of c to the driver (with the lock held), once
   the compute stream's work is done; keeps them if that wait fails. */
static void release_cached(lt_cuda_ctx *c) {
  if (!c->free_lists)
    return;
  /* the blocks' last users must be done; if the wait fails they may not be
     (a fault loses the context: the next call reports it), so keep them */
  if (cudaStreamSynchronize(c->compute) != cudaSuccess)
    return;
  for (int k = 0; k < NCLASSES; k++) {
    while (c->free_lists[k]) {
      cblock *b = c->free_lists[k];
      c->free_lists[k] = b->next;
      cudaFree(b->ptr);
      free(b);
    }
  }
  c->reserved = c->allocated;
}

static void stats_line(const lt_cuda_ctx *c, char *buf, size_t n) {
  size_t free_b = 0, total_b = 0;
  cudaMemGetInfo(&free_b, &total_b);
  snprintf(buf, n,
           "%.1f MiB in tensors, %.1f MiB reserved, peak %.1f MiB; the device has %.1f MiB free of %.1f MiB",
           c->allocated / 1048576.0, c->reserved / 1048576.0, c->peak / 1048576.0, free_b / 1048576.0,
           total_b / 1048576.0);
}

static lt_status cuda_alloc(lt_device device, size_t nbytes, void **ptr) {
  lt_cuda_ctx *c;
  LT_TRY(lt_cuda_ctx_get(device, &c));
  size_t rounded;
  int k = size_class(nbytes, &rounded);
  pthread_mutex_lock(&lock);
  cblock *b = c->free_lists[k];
  if (b) {
    c->free_lists[k] = b->next;
    *ptr = b->ptr;
    free(b);
  } else {
    cudaError_t e = cudaMalloc(ptr, rounded);
    if (e == cudaErrorMemoryAllocation) { /* give the cache back and try once more */
      cudaGetLastError();
      release_cached(c);
      e = cudaMalloc(ptr, rounded);
    }
    if (e != cudaSuccess) {
      pthread_mutex_unlock(&lock);
      *ptr = NULL;
      if (e != cudaErrorMemoryAllocation) { /* not the memory: a lost context, a bad device */
        char what[80];
        snprintf(what, sizeof what, "allocating %zu bytes", nbytes);
        return lt_cuda_error(what, c->index, e);
      }
      char line[300];
      cudaGetLastError();
      stats_line(c, line, sizeof line);
      return lt_fail(LT_ERR_OOM, "cuda:%d: out of memory allocating %zu bytes (%.1f MiB): %s", c->index, nbytes,
                     nbytes / 1048576.0, line);
    }
    c->reserved += rounded;
    if (c->reserved > c->peak_reserved)
      c->peak_reserved = c->reserved;
  }
  c->allocated += rounded;
  if (c->allocated > c->peak)
    c->peak = c->allocated;
  c->nalloc++;
  pthread_mutex_unlock(&lock);
  lt_cuda_device_span(*ptr, nbytes, rounded, c->compute);
  return LT_OK;
}

static void cuda_free(lt_device device, void *ptr, size_t nbytes) {
  int index = device - LT_DEVICE_CUDA;
  if (!ptr || index < 0 || index >= LT_CUDA_MAX_DEVICES)
    return;
  lt_cuda_ctx *c = &ctxs[index];
  size_t rounded;
  int k = size_class(nbytes, &rounded);
  cblock *b = malloc(sizeof *b);
  lt_cuda_device_span(ptr, 0, rounded, c->compute);
  pthread_mutex_lock(&lock);
  c->allocated -= rounded;
  if (b) {
    b->ptr = ptr;
    b->next = c->free_lists[k];
    c->free_lists[k] = b;
  } else { /* no host memory for the list node: give the block back */
    cudaFree(ptr);
    c->reserved -= rounded;
  }
  pthread_mutex_unlock(&lock);
}

void lt_cuda_memory_stats(int device_index, int64_t *allocated, int64_t *reserved, int64_t *peak) {
  *allocated = *reserved = *peak = 0;
  if (device_index < 0 || device_index >= LT_CUDA_MAX_DEVICES)
    return;
  pthread_mutex_lock(&lock);
  lt_cuda_ctx *c = &ctxs[device_index];
  *allocated = (int64_t)c->allocated;
  *reserved = (int64_t)c->reserved;
  *peak = (int64_t)c->peak;
  pthread_mutex_unlock(&lock);
}

void lt_cuda_reset_peak(int device_index) {
  if (device_index < 0 || device_index >= LT_CUDA_MAX_DEVICES)
    return;
  pthread_mutex_lock(&lock);
  ctxs[device_index].peak = ctxs[device_index].allocated;
  pthread_mutex_unlock(&lock);
}

void lt_cuda_empty_cache(int device_index) {
  if (device_index < 0 || device_index >= LT_CUDA_MAX_DEVICES || !ctxs[device_index].ready)
    return;
  cudaSetDevice(device_index);
  pthread_mutex_lock(&lock);
  release_cached(&ctxs[device_index]);
  pthread_mutex_unlock(&lock);
}

/* ---- copies and synchronisation -------------------------------------------- */

static lt_status checks_poll(lt_cuda_ctx *c, int wait);

static lt_status cuda_copy_to_host(lt_device device, void *dst, const void *src, size_t nbytes) {
  lt_cuda_ctx *c;
  LT_TRY(lt_cuda_ctx_get(device, &c));
  cudaError_t e = cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToHost, c->compute);
  if (e == cudaSuccess) {
    lt_cuda_profile_mark("copy to the host");
    e = cudaStreamSynchronize(c->compute);
  }
  if (e != cudaSuccess)
    return lt_cuda_error("copy to the host", c->index, e);
  return checks_poll(c, 1);
}

/* A copy of at most LT_CUDA_STAGE_SLOT bytes (1 MiB: 131072 i64 ids) through the next pinned slot:
   the host copies into it and the device copies from it in stream order,
   so the host goes on at once (a batch upload does not wait for the step
   before it). The slot is reused after its copy's event completes (16
   copies later: long done). *done = 0 when the slots cannot be had. */
static lt_status staged_copy(lt_cuda_ctx *c, void *dst, const void *src, size_t nbytes, int *done) {
  *done = 0;
  cudaError_t e = cudaSuccess;
  if (!c->stage) {
    if (cudaMallocHost((void **)&c->stage, (size_t)LT_CUDA_STAGE_SLOTS * LT_CUDA_STAGE_SLOT) != cudaSuccess) {
      c->stage = NULL;
      cudaGetLastError();
      return LT_OK; /* (no pinned memory: the caller copies and waits) */
    }
    int made = 0;
    for (; made < LT_CUDA_STAGE_SLOTS && e == cudaSuccess; made++)
      e = cudaEventCreateWithFlags(&c->stage_done[made], cudaEventDisableTiming);
    if (e != cudaSuccess) { /* undone: the caller copies and waits */
      for (int k = 0; k < made - 1; k++)
        cudaEventDestroy(c->stage_done[k]);
      cudaFreeHost(c->stage);
      c->stage = NULL;
      cudaGetLastError();
      return LT_OK;
    }
  }
  int k = c->stage_next;
  char *slot = c->stage + (size_t)k * LT_CUDA_STAGE_SLOT;
  e = cudaEventSynchronize(c->stage_done[k]); /* (an event never recorded is complete) */
  if (e == cudaSuccess) {
    memcpy(slot, src, nbytes);
    e = cudaMemcpyAsync(dst, slot, nbytes, cudaMemcpyHostToDevice, c->compute);
    if (e == cudaSuccess)
      lt_cuda_profile_mark("copy from the host (pinned)");
  }
  if (e == cudaSuccess)
    e = cudaEventRecord(c->stage_done[k], c->compute);
  if (e != cudaSuccess)
    return lt_cuda_error("copy from the host", c->index, e);
  c->stage_next = (k + 1) % LT_CUDA_STAGE_SLOTS;
  *done = 1;
  return LT_OK;
}

static lt_status cuda_copy_from_host(lt_device device, void *dst, const void *src, size_t nbytes) {
  lt_cuda_ctx *c;
  LT_TRY(lt_cuda_ctx_get(device, &c));
  if (nbytes <= LT_CUDA_STAGE_SLOT) {
    static pthread_mutex_t stage_lock = PTHREAD_MUTEX_INITIALIZER;
    int done = 0;
    pthread_mutex_lock(&stage_lock);
    lt_status st = staged_copy(c, dst, src, nbytes, &done);
    pthread_mutex_unlock(&stage_lock);
    if (st != LT_OK || done)
      return st;
  }
  cudaError_t e = cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyHostToDevice, c->compute);
  if (e == cudaSuccess) { /* the caller frees its buffer next */
    lt_cuda_profile_mark("copy from the host");
    e = cudaStreamSynchronize(c->compute);
  }
  return e == cudaSuccess ? LT_OK : lt_cuda_error("copy from the host", c->index, e);
}

static lt_status cuda_synchronize(lt_device device) {
  lt_cuda_ctx *c;
  LT_TRY(lt_cuda_ctx_get(device, &c));
  cudaError_t e = cudaStreamSynchronize(c->compute);
  return e == cudaSuccess ? checks_poll(c, 1) : lt_cuda_error("a kernel failed", c->index, e);
}

lt_status lt_cuda_synchronize(int device_index) {
  LT_OP_SCOPE("cuda synchronize");
  return cuda_synchronize(LT_DEVICE_CUDA + device_index);
}

/* ---- kernels: the descriptors carry device pointers; pick the stream ---------- */

/* The device of an iteration's output pointer (the current device: the host
   made it current when it allocated or checked operands). */
static lt_cuda_ctx *current_ctx(void) {
  int index = 0;
  cudaGetDevice(&index);
  return &ctxs[index];
}

#define STREAM (current_ctx()->compute)

static lt_status k_copy(const lt_iter *it) { return lt_cuda_copy(it, STREAM); }
static lt_status k_fill(const lt_iter *it, double v) { return lt_cuda_fill(it, v, STREAM); }
static lt_status k_unary(lt_unary_op op, lt_compute ck, const lt_iter *it) { return lt_cuda_unary(op, ck, it, STREAM); }
static lt_status k_binary(lt_binary_op op, lt_compute ck, const lt_iter *it) {
  return lt_cuda_binary(op, ck, it, STREAM);
}
static lt_status k_binary_scalar(lt_binary_op op, lt_compute ck, const lt_iter *it, double s, int reversed) {
  return lt_cuda_binary_scalar(op, ck, it, s, reversed, STREAM);
}
static lt_status k_where(lt_compute ck, const lt_iter *it) { return lt_cuda_where(ck, it, STREAM); }
static lt_status k_clamp(lt_compute ck, const lt_iter *it, double lo, int has_lo, double hi, int has_hi) {
  return lt_cuda_clamp(ck, it, lo, has_lo, hi, has_hi, STREAM);
}
static lt_status k_reduce(lt_reduce_op op, const lt_reduce_iter *it, int64_t correction) {
  return lt_cuda_reduce(op, it, correction, STREAM);
}
static lt_status k_uniform(char *dst, lt_dtype dt, int64_t n, uint64_t seed, uint64_t offset, double lo, double hi) {
  return lt_cuda_uniform(dst, dt, n, seed, offset, lo, hi, STREAM);
}
static lt_status k_normal(char *dst, lt_dtype dt, int64_t n, uint64_t seed, uint64_t offset, double mean,
                          double std) {
  return lt_cuda_normal(dst, dt, n, seed, offset, mean, std, STREAM);
}

/*
 * Index checks. Kernels write the first bad position into a device word
 * (all ones when none). index_select, index_add and cross-entropy (the
 * training step's) do not wait for it: the word and the bad index's value
 * are copied to pinned memory in stream order with an event, the host layer
 * hands over what the message needs (defer_index_report), and the verdict
 * is read at the next synchronisation (a copy to the host, synchronize) or
 * when a later check finds the event done; the error is raised there,
 * naming the op. gather and scatter_add (off the training path) wait at once.
 */
static const unsigned long long NO_BAD = ~0ULL;

static lt_status check_resolve(lt_cuda_ctx *c, int k, int wait, int *pending);

/* Reads the verdicts of finished checks, oldest first (all of them, waiting,
   when wait is set); returns the first error found. */
static lt_status checks_poll(lt_cuda_ctx *c, int wait) {
  lt_status first = LT_OK;
  char msg[700] = "";
  for (int i = 0; i < LT_CUDA_CHECKS; i++) {
    int k = (c->next_check + i) % LT_CUDA_CHECKS, pending = 0;
    if (!c->checks[k].state)
      continue;
    lt_status st = check_resolve(c, k, wait, &pending);
    if (pending)
      break; /* later checks were recorded later */
    if (first == LT_OK && st != LT_OK) { /* the oldest failure names the op (a bad id fails the backward too) */
      first = st;
      snprintf(msg, sizeof msg, "%s", lt_last_error());
    }
  }
  return first == LT_OK ? LT_OK : lt_fail(first, "%s", msg);
}

/* Check k's verdict: *pending when its copy has not arrived (without wait). */
static lt_status check_resolve(lt_cuda_ctx *c, int k, int wait, int *pending) {
  struct lt_cuda_check *ck = &c->checks[k];
  cudaError_t e = wait ? cudaEventSynchronize(ck->done) : cudaEventQuery(ck->done);
  if (e == cudaErrorNotReady) {
    *pending = 1;
    return LT_OK;
  }
  int had = ck->state == 2;
  lt_index_report rep = ck->report;
  ck->state = 0;
  if (e != cudaSuccess) {
    if (had)
      rep.release(rep.index);
    return lt_cuda_error("an index check", c->index, e);
  }
  unsigned long long pos = c->bad_host[2 * k], value = c->bad_host[2 * k + 1];
  lt_status st = LT_OK;
  if (pos != NO_BAD) {
    if (had) {
      lt_index_report_fail(&rep, (int64_t)pos, (int64_t)value);
      char msg[600];
      snprintf(msg, sizeof msg, "%s", lt_last_error());
      st = lt_fail(LT_ERR_ARG, "%s (found later: index checks on cuda:%d do not wait for the device, so what ran "
                   "after that op computed garbage)", msg, c->index);
    } else {
      st = lt_fail(LT_ERR_ARG, "cuda:%d: an index kernel found index %lld (element %lld) out of range", c->index,
                   (long long)value, (long long)pos + 1);
    }
  }
  if (had)
    rep.release(rep.index);
  return st;
}

/* Starts a check that finishes later: its device words, cleared. */
static lt_status check_begin(lt_cuda_ctx *c, unsigned long long **words) {
  LT_TRY(checks_poll(c, 0));
  int k = c->next_check, pending = 0;
  if (c->checks[k].state) /* the ring is full: the oldest check waits */
    LT_TRY(check_resolve(c, k, 1, &pending));
  cudaError_t e = cudaSuccess;
  if (!c->checks[k].done)
    e = cudaEventCreateWithFlags(&c->checks[k].done, cudaEventDisableTiming);
  if (e == cudaSuccess)
    e = cudaMemsetAsync(&c->bad[2 * k], 0xff, 2 * sizeof *c->bad, c->compute);
  if (e != cudaSuccess)
    return lt_cuda_error("index check", c->index, e);
  *words = &c->bad[2 * k];
  return LT_OK;
}

/* After the kernels: the bad index's value, the copy to the host, the
   event; *bad = LT_BAD_LATER asks the host layer for the report. */
static lt_status check_end(lt_cuda_ctx *c, lt_status st, const char *index, lt_dtype idt, int64_t stride,
                           int64_t *bad) {
  if (st != LT_OK)
    return st;
  int k = c->next_check;
  LT_TRY(lt_cuda_index_value(index, idt, stride, &c->bad[2 * k], c->compute));
  cudaError_t e = cudaMemcpyAsync(&c->bad_host[2 * k], &c->bad[2 * k], 2 * sizeof *c->bad, cudaMemcpyDeviceToHost,
                                  c->compute);
  if (e == cudaSuccess)
    e = cudaEventRecord(c->checks[k].done, c->compute);
  if (e != cudaSuccess)
    return lt_cuda_error("index check", c->index, e);
  c->checks[k].state = 1;
  c->last_check = k;
  c->next_check = (k + 1) % LT_CUDA_CHECKS;
  *bad = LT_BAD_LATER;
  return LT_OK;
}

static lt_status k_defer_index_report(const lt_index_report *r) {
  lt_cuda_ctx *c = current_ctx();
  struct lt_cuda_check *ck = &c->checks[c->last_check];
  if (ck->state != 1)
    return lt_fail(LT_ERR_INTERNAL, "cuda:%d: %s: no index check is waiting for its report", c->index, r->op);
  ck->report = *r;
  ck->state = 2;
  return LT_OK;
}

/* The checks that wait at once use the words after the ring. */
static lt_status bad_begin(lt_cuda_ctx *c) {
  cudaError_t e = cudaMemsetAsync(&c->bad[2 * LT_CUDA_CHECKS], 0xff, sizeof *c->bad, c->compute);
  return e == cudaSuccess ? LT_OK : lt_cuda_error("index check", c->index, e);
}

static lt_status bad_end(lt_cuda_ctx *c, lt_status st, int64_t *bad) {
  if (st != LT_OK)
    return st;
  unsigned long long *word = &c->bad[2 * LT_CUDA_CHECKS], *host = &c->bad_host[2 * LT_CUDA_CHECKS];
  cudaError_t e = cudaMemcpyAsync(host, word, sizeof *word, cudaMemcpyDeviceToHost, c->compute);
  if (e == cudaSuccess)
    e = cudaStreamSynchronize(c->compute);
  if (e != cudaSuccess)
    return lt_cuda_error("index check", c->index, e);
  if (*host != NO_BAD) {
    *bad = (int64_t)*host;
    return LT_ERR_ARG;
  }
  return LT_OK;
}

static lt_status k_index_select(const lt_index_desc *d, char *dst, const char *src, int64_t elsize, int64_t *bad) {
  lt_cuda_ctx *c = current_ctx();
  unsigned long long *words;
  LT_TRY(check_begin(c, &words));
  return check_end(c, lt_cuda_index_select(d, dst, src, elsize, words, c->compute), d->index, d->index_dtype,
                   d->index_stride, bad);
}

static lt_status scratch(lt_cuda_ctx *c, size_t nbytes, void **out);

static lt_status k_index_add(const lt_index_desc *d, char *dst, const char *src, lt_dtype dt, int64_t *bad) {
  lt_cuda_ctx *c = current_ctx();
  size_t need = lt_cuda_index_add_scratch(d->nindex, d->dst_dim, d->outer);
  void *buf = NULL;
  if (need)
    LT_TRY(scratch(c, need, &buf));
  unsigned long long *words;
  LT_TRY(check_begin(c, &words));
  return check_end(c, lt_cuda_index_add(d, dst, src, dt, words, buf, need, c->compute), d->index, d->index_dtype,
                   d->index_stride, bad);
}

static lt_status k_gather(const lt_iter *it, int64_t dim_stride, int64_t dim_size, int64_t *bad) {
  lt_cuda_ctx *c = current_ctx();
  LT_TRY(bad_begin(c));
  return bad_end(c, lt_cuda_gather(it, dim_stride, dim_size, &c->bad[2 * LT_CUDA_CHECKS], c->compute), bad);
}

static lt_status k_scatter_add(const lt_iter *it, int64_t dim_stride, int64_t dim_size, int64_t *bad) {
  lt_cuda_ctx *c = current_ctx();
  LT_TRY(bad_begin(c));
  return bad_end(c, lt_cuda_scatter_add(it, dim_stride, dim_size, &c->bad[2 * LT_CUDA_CHECKS], c->compute), bad);
}

static lt_status k_layer_norm_fwd(lt_dtype dt, const void *x, const void *res, const void *w, const void *b, void *y,
                                  void *h, void *mean, void *rstd, int64_t N, int64_t C, double eps) {
  return lt_cuda_layer_norm_fwd(dt, x, res, w, b, y, h, mean, rstd, N, C, eps, STREAM);
}
/* scratch for a norm's weight gradients (partial sums) */
static lt_status norm_scratch(lt_cuda_ctx *c, int64_t N, int64_t C, void *dw, void *db, void **buf, size_t *bytes) {
  *buf = NULL;
  *bytes = (dw || db) && N > 0 ? lt_cuda_norm_dw_scratch(N, C) : 0;
  return *bytes ? scratch(c, *bytes, buf) : LT_OK;
}
static lt_status k_layer_norm_bwd(lt_dtype dt, const void *dy, const void *x, const void *w, const void *mean,
                                  const void *rstd, const void *dadd, void *dx, void *dw, void *db, int64_t N,
                                  int64_t C) {
  lt_cuda_ctx *c = current_ctx();
  void *buf;
  size_t bytes;
  LT_TRY(norm_scratch(c, N, C, dw, db, &buf, &bytes));
  return lt_cuda_layer_norm_bwd(dt, dy, x, w, mean, rstd, dadd, dx, dw, db, N, C, buf, bytes, c->compute);
}
static lt_status k_rms_norm_fwd(lt_dtype dt, const void *x, const void *res, const void *w, void *y, void *h,
                                void *rstd, int64_t N, int64_t C, double eps) {
  return lt_cuda_rms_norm_fwd(dt, x, res, w, y, h, rstd, N, C, eps, STREAM);
}
static lt_status k_rms_norm_bwd(lt_dtype dt, const void *dy, const void *x, const void *w, const void *rstd,
                                const void *dadd, void *dx, void *dw, int64_t N, int64_t C) {
  lt_cuda_ctx *c = current_ctx();
  void *buf;
  size_t bytes;
  LT_TRY(norm_scratch(c, N, C, dw, NULL, &buf, &bytes));
  return lt_cuda_rms_norm_bwd(dt, dy, x, w, rstd, dadd, dx, dw, N, C, buf, bytes, c->compute);
}
static lt_status k_attention_fwd(lt_dtype dt, const void *q, const void *k, const void *v, void *o, void *lse,
                                 int64_t B, int64_t NH, int64_t NKV, int64_t T, int64_t S, int64_t HS, double scale,
                                 int causal) {
  return lt_cuda_attention_fwd(dt, q, k, v, o, lse, B, NH, NKV, T, S, HS, scale, causal, STREAM);
}
static lt_status k_attention_bwd(lt_dtype dt, const void *q, const void *k, const void *v, const void *o,
                                 const void *dout, const void *lse, void *D, void *dq, void *dk, void *dv, int64_t B,
                                 int64_t NH, int64_t NKV, int64_t T, int64_t S, int64_t HS, double scale, int causal) {
  return lt_cuda_attention_bwd(dt, q, k, v, o, dout, lse, D, dq, dk, dv, B, NH, NKV, T, S, HS, scale, causal, STREAM);
}
static lt_status k_attention_half_fwd(const lt_sdpa_desc *d) { return lt_cuda_attention_mma_fwd(d, STREAM); }
static lt_status k_attention_half_bwd(const lt_sdpa_desc *d) {
  lt_cuda_ctx *c = current_ctx();
  void *D = NULL; /* rowsum(dout * o), f32 (B, NH, T) */
  size_t bytes = (size_t)(d->B * d->NH * d->T) * sizeof(float);
  if (bytes)
    LT_TRY(scratch(c, bytes, &D));
  return lt_cuda_attention_mma_bwd(d, (float *)D, c->compute);
}
static lt_status k_softmax_fwd(lt_dtype dt, const void *x, void *y, int64_t N, int64_t C, int logsm, double scale,
                               int64_t causal) {
  return lt_cuda_softmax_fwd(dt, x, y, N, C, logsm, scale, causal, STREAM);
}
static lt_status k_softmax_bwd(lt_dtype dt, const void *y, const void *dy, void *dx, int64_t N, int64_t C, int logsm,
                               double scale) {
  return lt_cuda_softmax_bwd(dt, y, dy, dx, N, C, logsm, scale, STREAM);
}
static lt_status k_ce_fwd(lt_dtype dt, const void *x, int64_t ldx, const char *targets, lt_dtype tdt, int64_t N,
                          int64_t V, int64_t ignore, void *loss, void *lse, int64_t *bad) {
  lt_cuda_ctx *c = current_ctx();
  unsigned long long *words;
  LT_TRY(check_begin(c, &words));
  return check_end(c,
                   lt_cuda_cross_entropy_fwd(dt, x, ldx, targets, tdt, N, V, ignore, loss, lse, words, c->compute),
                   targets, tdt, 1, bad);
}
static lt_status k_ce_fwd_bwd(lt_dtype dt, const void *x, int64_t ldx, const char *targets, lt_dtype tdt,
                              int64_t N, int64_t V, int64_t ignore, void *loss, void *lse, const void *scale,
                              void *dx, int64_t *bad) {
  lt_cuda_ctx *c = current_ctx();
  unsigned long long *words;
  LT_TRY(check_begin(c, &words));
  return check_end(c,
                   lt_cuda_cross_entropy_fwd_bwd(dt, x, ldx, targets, tdt, N, V, ignore, loss, lse, scale, dx, words,
                                                 c->compute),
                   targets, tdt, 1, bad);
}
static lt_status k_ce_bwd(lt_dtype dt, const void *x, int64_t ldx, const char *targets, lt_dtype tdt, int64_t N,
                          int64_t V, int64_t ldd, int64_t ignore, const void *lse, const void *scale, void *dx) {
  return lt_cuda_cross_entropy_bwd(dt, x, ldx, targets, tdt, N, V, ldd, ignore, lse, scale, dx, STREAM);
}
static lt_status k_rope(lt_dtype dt, const void *x, void *y, int64_t R, int64_t Tn, int64_t D, double base,
                        int64_t start, int inverse, const lt_rope_scaling *sc) {
  return lt_cuda_rope(dt, x, y, R, Tn, D, base, start, inverse, sc, STREAM);
}

/* At least nbytes of device scratch, grown when needed (the old block is
   freed after the stream has finished with it). */
static lt_status scratch(lt_cuda_ctx *c, size_t nbytes, void **out) {
  if (c->scratch_size < nbytes) {
    if (c->scratch) {
      cudaError_t e = cudaStreamSynchronize(c->compute);
      if (e != cudaSuccess) /* (a kernel before failed: say so, keep the old block) */
        return lt_cuda_error("a kernel failed", c->index, e);
      cudaFree(c->scratch);
      c->scratch = NULL;
      c->scratch_size = 0;
    }
    cudaError_t e = cudaMalloc(&c->scratch, nbytes);
    if (e == cudaErrorMemoryAllocation) { /* give the cache back and try once more, as cuda_alloc does */
      cudaGetLastError();
      release_cached(c);
      e = cudaMalloc(&c->scratch, nbytes);
    }
    if (e != cudaSuccess) {
      c->scratch = NULL;
      return lt_cuda_error("allocating scratch memory", c->index, e);
    }
    c->scratch_size = nbytes;
  }
  *out = c->scratch;
  return LT_OK;
}

static lt_status k_adamw(int n, const lt_optim_tensor *ts, const lt_adamw_hparams *h) {
  return lt_cuda_adamw(n, ts, h, STREAM);
}
static lt_status k_sgd(int n, const lt_optim_tensor *ts, const lt_sgd_hparams *h) {
  return lt_cuda_sgd(n, ts, h, STREAM);
}
static lt_status k_grad_sum_squares(int n, const lt_optim_tensor *ts, double *out) {
  lt_cuda_ctx *c = current_ctx();
  void *buf = NULL;
  LT_TRY(scratch(c, lt_cuda_sum_squares_scratch(n, ts), &buf));
  return lt_cuda_grad_sum_squares(n, ts, buf, out, c->compute);
}

const lt_backend_i lt_backend_cuda = {
    .name = "cuda",
    .alloc = cuda_alloc,
    .free = cuda_free,
    .copy_to_host = cuda_copy_to_host,
    .copy_from_host = cuda_copy_from_host,
    .synchronize = cuda_synchronize,
    .copy = k_copy,
    .fill = k_fill,
    .unary = k_unary,
    .binary = k_binary,
    .binary_scalar = k_binary_scalar,
    .where = k_where,
    .clamp = k_clamp,
    .reduce = k_reduce,
    .matmul = lt_cuda_matmul,
    .native_half_matmul = 1,
    .native_half_rows = 1,
    .matmul_epilogues = 1,
    .defer_index_report = k_defer_index_report,
    .index_select = k_index_select,
    .index_add = k_index_add,
    .gather = k_gather,
    .scatter_add = k_scatter_add,
    .uniform = k_uniform,
    .normal = k_normal,
    .layer_norm_fwd = k_layer_norm_fwd,
    .layer_norm_bwd = k_layer_norm_bwd,
    .rms_norm_fwd = k_rms_norm_fwd,
    .rms_norm_bwd = k_rms_norm_bwd,
    .attention_fwd = k_attention_fwd,
    .attention_bwd = k_attention_bwd,
    .attention_half = lt_cuda_attention_mma_takes,
    .attention_half_fwd = k_attention_half_fwd,
    .attention_half_bwd = k_attention_half_bwd,
    .sdpa_prepare = lt_cudnn_sdpa_prepare,
    .sdpa_fwd = lt_cudnn_sdpa_fwd,
    .sdpa_bwd = lt_cudnn_sdpa_bwd,
    .softmax_fwd = k_softmax_fwd,
    .softmax_bwd = k_softmax_bwd,
    .cross_entropy_fwd = k_ce_fwd,
    .cross_entropy_bwd = k_ce_bwd,
    .cross_entropy_fwd_bwd = k_ce_fwd_bwd,
    .rope = k_rope,
    .adamw = k_adamw,
    .sgd = k_sgd,
    .grad_sum_squares = k_grad_sum_squares,
};

#else /* no CUDA in this build */

#include "base/status.h"

void lt_cuda_memory_stats(int device_index, int64_t *allocated, int64_t *reserved, int64_t *peak) {
  (void)device_index;
  *allocated = *reserved = *peak = 0;
}
void lt_cuda_reset_peak(int device_index) { (void)device_index; }
void lt_cuda_empty_cache(int device_index) { (void)device_index; }
lt_status lt_cuda_synchronize(int device_index) {
  (void)device_index;
  return LT_OK;
}
void lt_cuda_set_allow_tf32(int on) { (void)on; }
void lt_cuda_set_deterministic(int on) { (void)on; }
int lt_cuda_deterministic(void) { return 0; }
int64_t lt_cudnn_version(void) { return 0; }
lt_status lt_cudnn_device_properties(int device_index, char *buf, int64_t cap, int64_t *len) {
  (void)device_index, (void)buf, (void)cap, (void)len;
  return lt_fail(LT_ERR_DEVICE, "lutra was built without CUDA");
}

#endif
