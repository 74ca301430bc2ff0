/*
 * cuda/profile.c: where a CUDA device's time goes (lt.cuda.profile_start and
 * lt.cuda.profile_stop). While profiling, each piece of work lutra queues on
 * the device's compute stream (a kernel, a cuBLASLt product, cuDNN's
 * attention, a copy) is followed by a timing event named for it; stopping
 * waits for the device and gives, per name, the calls and the time from the
 * event before each piece to the piece's own event (cudaEventElapsedTime).
 * That time is the piece's run time while the device has work queued ahead
 * of it (the host issues faster than the device runs); when the device
 * waits for the host, the wait counts to the next piece. A name is the one
 * the launch's check gives (a few cover two kernels: "layer_norm backward";
 * every contiguous elementwise op is "fast_kernel"); work left unnamed (the
 * index checks' small fills and copies, the gradient norm's read, a
 * library's own fills) counts to the next named piece. Times from events,
 * as torch.profiler's CUDA times without CUPTI.
 */
#include "lutra.h"
#include "base/status.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef LT_WITH_CUDA
#include "cuda/backend.h"

#include <pthread.h>

enum { MAX_MARKS = (1 << 16) + 1 }; /* the start, then 65536 pieces */

static pthread_mutex_t plock = PTHREAD_MUTEX_INITIALIZER;
static int active;          /* read without the lock by lt_cuda_profiling */
static int pdevice;         /* the device being profiled */
static cudaStream_t pstream; /* its compute stream */
static cudaEvent_t events[MAX_MARKS];
static int nmade;            /* events created so far (kept for the next profile) */
static int made_on;          /* the device they belong to */
static char labels[MAX_MARKS][sizeof(((lt_cuda_profile_row *)0)->name)];
static int nmarks;
static int64_t dropped;
static cudaError_t failed; /* a failed record: reported by stop */
static char phase[24];     /* lt_cuda_profile_phase: the prefix of the names that follow */

int lt_cuda_profiling(void) { return __atomic_load_n(&active, __ATOMIC_RELAXED); }

/* Records mark nmarks (the lock held). */
static void record(const char *what) {
  if (nmarks == MAX_MARKS) {
    dropped++;
    return;
  }
  cudaError_t e = cudaSuccess;
  if (nmarks == nmade && (e = cudaEventCreate(&events[nmade])) == cudaSuccess)
    nmade++;
  if (e == cudaSuccess)
    e = cudaEventRecord(events[nmarks], pstream);
  if (e != cudaSuccess) {
    failed = e;
    __atomic_store_n(&active, 0, __ATOMIC_RELAXED);
    return;
  }
  if (phase[0])
    snprintf(labels[nmarks], sizeof labels[nmarks], "%s: %s", phase, what);
  else
    snprintf(labels[nmarks], sizeof labels[nmarks], "%s", what);
  nmarks++;
}

void lt_cuda_profile_mark(const char *what) {
  if (!lt_cuda_profiling())
    return;
  int device = -1;
  cudaGetDevice(&device);
  pthread_mutex_lock(&plock);
  if (active && device == pdevice)
    record(what);
  pthread_mutex_unlock(&plock);
}

lt_status lt_cuda_profile_start(int device_index) {
  lt_cuda_ctx *c;
  lt_status got = lt_cuda_ctx_get(LT_DEVICE_CUDA + device_index, &c);
  if (got != LT_OK) {
    char why[512];
    snprintf(why, sizeof why, "%s", lt_last_error());
    return lt_fail(got, "cuda.profile_start: %s", why);
  }
  pthread_mutex_lock(&plock);
  lt_status st = LT_OK;
  if (active) {
    st = lt_fail(LT_ERR_ARG, "cuda.profile_start: cuda:%d is being profiled already (call profile_stop first)",
                 pdevice);
  } else {
    if (nmade > 0 && made_on != device_index) { /* an event is recorded on its own device only */
      for (int i = 0; i < nmade; i++)
        cudaEventDestroy(events[i]);
      nmade = 0;
    }
    made_on = device_index;
    pdevice = device_index;
    pstream = c->compute;
    nmarks = 0;
    dropped = 0;
    failed = cudaSuccess;
    phase[0] = 0;
    record("(start)");
    if (failed != cudaSuccess) {
      st = lt_cuda_error("cuda.profile_start: a timing event", device_index, failed);
      failed = cudaSuccess; /* (reported here: stop says no profile runs) */
    } else
      __atomic_store_n(&active, 1, __ATOMIC_RELAXED);
  }
  pthread_mutex_unlock(&plock);
  return st;
}

void lt_cuda_profile_phase(const char *name) {
  pthread_mutex_lock(&plock);
  snprintf(phase, sizeof phase, "%s", name ? name : "");
  pthread_mutex_unlock(&plock);
}

static int by_time(const void *a, const void *b) {
  double x = ((const lt_cuda_profile_row *)a)->ms, y = ((const lt_cuda_profile_row *)b)->ms;
  return x < y ? 1 : x > y ? -1 : 0;
}

lt_status lt_cuda_profile_stop(lt_cuda_profile_row **rows, int *nrows, double *total_ms, int64_t *ndropped) {
  *rows = NULL;
  *nrows = 0;
  *total_ms = 0;
  *ndropped = 0;
  pthread_mutex_lock(&plock);
  int was = active;
  __atomic_store_n(&active, 0, __ATOMIC_RELAXED);
  int n = nmarks;
  nmarks = 0;
  lt_status st = LT_OK;
  if (!was && failed == cudaSuccess)
    st = lt_fail(LT_ERR_ARG, "cuda.profile_stop: no profile is running (call profile_start first)");
  else if (failed != cudaSuccess)
    st = lt_cuda_error("cuda.profile_stop: a timing event failed while profiling", pdevice, failed);
  cudaError_t e = cudaSuccess;
  if (st == LT_OK && (e = cudaEventSynchronize(events[n - 1])) != cudaSuccess)
    st = lt_cuda_error("cuda.profile_stop: the profiled work", pdevice, e);
  lt_cuda_profile_row *out = NULL;
  int nout = 0;
  if (st == LT_OK && n > 1 && !(out = calloc((size_t)n - 1, sizeof *out)))
    st = lt_fail(LT_ERR_OOM, "cuda.profile_stop: out of host memory for %d rows", n - 1);
  for (int i = 1; st == LT_OK && i < n; i++) {
    float ms = 0;
    if ((e = cudaEventElapsedTime(&ms, events[i - 1], events[i])) != cudaSuccess) {
      st = lt_cuda_error("cuda.profile_stop: the time between two events", pdevice, e);
      break;
    }
    int r = 0;
    while (r < nout && strcmp(out[r].name, labels[i]) != 0)
      r++;
    if (r == nout)
      memcpy(out[nout++].name, labels[i], sizeof out[r].name);
    out[r].calls++;
    out[r].ms += ms;
  }
  float all = 0;
  if (st == LT_OK && n > 1 && (e = cudaEventElapsedTime(&all, events[0], events[n - 1])) != cudaSuccess)
    st = lt_cuda_error("cuda.profile_stop: the profile's span", pdevice, e);
  *ndropped = dropped;
  failed = cudaSuccess;
  pthread_mutex_unlock(&plock);
  if (st != LT_OK) {
    free(out);
    return st;
  }
  if (nout > 0)
    qsort(out, (size_t)nout, sizeof *out, by_time);
  *rows = out;
  *nrows = nout;
  *total_ms = all;
  return LT_OK;
}

#else /* no CUDA in this build */

int lt_cuda_profiling(void) { return 0; }
void lt_cuda_profile_mark(const char *what) { (void)what; }
void lt_cuda_profile_phase(const char *name) { (void)name; }
lt_status lt_cuda_profile_start(int device_index) {
  return lt_fail(LT_ERR_DEVICE, "cuda.profile_start: cuda:%d: this build has no CUDA", device_index);
}
lt_status lt_cuda_profile_stop(lt_cuda_profile_row **rows, int *nrows, double *total_ms, int64_t *ndropped) {
  *rows = NULL;
  *nrows = 0;
  *total_ms = 0;
  *ndropped = 0;
  return lt_fail(LT_ERR_ARG, "cuda.profile_stop: no profile is running (this build has no CUDA)");
}

#endif

void lt_cuda_profile_free(lt_cuda_profile_row *rows) { free(rows); }
