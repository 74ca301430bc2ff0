/*
 * runtime.cc: the part of the CUDA runtime API that lutra calls
 * (host/cuda/backend.c, host/cuda/cublaslt.c, host/comm/nccl.c,
 * kernels/cuda), for a build of lutra whose "device" is this process (make
 * emu; tests/emu/README.md); kernel launches run on scheduler.cc.
 *
 * One device, "lutra CUDA emulator"; device memory is host memory
 * (aligned to 256 bytes, as cudaMalloc's; new blocks and tensors filled
 * with 0xff bytes, as a GPU leaves garbage) counted against a capacity
 * (LUTRA_EMU_MEMORY_MB, 4096 by default) so that running out is an error as
 * on a GPU. Streams are queues (emu_queue.h): launches, copies, memsets,
 * cuBLASLt's products and NCCL's collectives run in stream order when the
 * host waits for them (or another stream waits through an event), not
 * when they are queued, so host code that reads a result before waiting,
 * a stream that does not wait for another's work, or a pinned buffer
 * changed under a queued copy goes wrong here as it can on a GPU; a
 * kernel's fault is returned where the host waits. LUTRA_EMU_SYNC=1 runs
 * each piece of work when it is queued. Under ThreadSanitizer (make
 * emu-tsan, LT_EMU_TSAN) streams are contexts of the race detector ordered
 * only as on a GPU.
 */
#include "emu_runtime.h"

#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif
#if LT_EMU_TSAN
#include <sanitizer/tsan_interface.h>
#endif

#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>

using namespace emu;

/* ---- the runtime API ------------------------------------------------------ */

namespace emu {

/* a GPU queues about a thousand launches before the host waits at one
   (LUTRA_EMU_QUEUE_LIMIT changes it: a step's whole queue, to time the host alone) */
size_t queue_limit() {
  static size_t limit;
  if (!limit) {
    const char *e = getenv("LUTRA_EMU_QUEUE_LIMIT");
    long v = e ? strtol(e, NULL, 10) : 0;
    limit = v > 0 ? (size_t)v : 1024;
  }
  return limit;
}

} // namespace emu

namespace {

std::mutex memory_lock;
std::map<void *, size_t> device_blocks;
size_t device_used;

size_t device_capacity() {
  static size_t bytes;
  if (!bytes) {
    const char *e = getenv("LUTRA_EMU_MEMORY_MB");
    char *end = NULL;
    long mb = e ? strtol(e, &end, 10) : 4096;
    if (e && (end == e || *end || mb <= 0)) {
      fprintf(stderr, "lutra CUDA emulator: LUTRA_EMU_MEMORY_MB=%s is not a positive number of MiB; using 4096\n", e);
      mb = 4096;
    }
    bytes = (size_t)mb << 20;
  }
  return bytes;
}

int current_device;

/* A stream: its queued work in order, each piece numbered from one count
   shared by all streams (emu_queue.h). */
struct emu_stream;
struct queued {
  unsigned long long serial;
  std::unique_ptr<std::function<void()>> work; /* (on the heap: a stream's context under
                                                 ThreadSanitizer touches no queue memory) */
  emu_stream *after; /* a wait: runs when after has done through after_serial */
  unsigned long long after_serial;
  std::unique_ptr<char> token; /* make emu-tsan: released by the host when queued */
};
struct emu_stream {
  unsigned flags;
  std::deque<queued> pending;
  unsigned long long queued_through, done_through;
  void *tsan;      /* make emu-tsan: the context its work runs in */
  unsigned slot;   /* make emu-tsan: its set of fibers */
  char *stack;     /* make emu-tsan: the stack its work runs on */
  void *sp;        /* its saved stack pointer */
  char done_token; /* released after each piece of its work */
};
emu_stream default_stream;
unsigned long long serials;
std::recursive_mutex queue_lock;

/* An event is the point of its stream's queue where it was last recorded:
   complete once the stream has done the work before it. */
struct emu_event {
  unsigned flags;
  emu_stream *stream;
  unsigned long long serial;
  int queries; /* "not ready" answers since the record */
  /* a timing event's record queues a piece that stamps the host's clock in
     milliseconds when it runs (-1 before): cudaEventElapsedTime reads it */
  std::shared_ptr<double> stamp;
};


bool run_at_once() {
  static int sync = -1;
  if (sync < 0) {
    const char *e = getenv("LUTRA_EMU_SYNC");
    sync = e && *e && strcmp(e, "0") != 0;
  }
  return sync;
}

emu_stream *stream_of(cudaStream_t s) { return s ? (emu_stream *)s : &default_stream; }

void run_through(emu_stream *s, unsigned long long serial);

/* Does a piece of s's work; under ThreadSanitizer in s's context (after
   what the host did before queueing it and what it waits for, before what
   waits for s), on s's own stack (so that its frames share no memory with
   the host's or another stream's). */
void do_work(emu_stream *s, queued &q) {
#if LT_EMU_TSAN
  if (q.token)
    __tsan_acquire(q.token.get());
  if (q.after)
    __tsan_acquire(&q.after->done_token);
#endif
  stream_slot = s->slot;
  if (q.work && *q.work)
    (*q.work)();
  q.work.reset(); /* (its captures freed here, in the context that used them) */
#if LT_EMU_TSAN
  __tsan_release(&s->done_token);
#endif
}

#if LT_EMU_TSAN
enum { STREAM_STACK_BYTES = 8 << 20 };
emu_stream *stream_running;
queued *stream_job;
void *host_sp;
void *scheduler_tsan_host; /* the host's context, which a stream's work switches back to */

[[noreturn]] void stream_entry() {
  for (;;) {
    emu_stream *s = stream_running;
    do_work(s, *stream_job);
    __tsan_switch_to_fiber(scheduler_tsan_host, __tsan_switch_to_fiber_no_sync);
    lt_emu_switch(&s->sp, host_sp);
  }
}
#endif

/* Runs a piece of s's work: what it waits for on other streams, then its own. */
void run_piece(emu_stream *s, queued &q) {
  if (q.after)
    run_through(q.after, q.after_serial);
#if LT_EMU_TSAN
  if (!s->stack) {
    s->stack = new_stack(STREAM_STACK_BYTES);
    if (!s->stack) {
      fprintf(stderr, "lutra CUDA emulator: no memory for a stream's stack\n");
      abort();
    }
    s->sp = first_frame((void **)(s->stack + STREAM_STACK_BYTES), stream_entry);
  }
  stream_running = s;
  stream_job = &q;
  scheduler_tsan_host = __tsan_get_current_fiber();
  __tsan_switch_to_fiber(s->tsan, __tsan_switch_to_fiber_no_sync);
  lt_emu_switch(&host_sp, s->sp);
#else
  do_work(s, q);
#endif
}

/* Runs s's queued work through serial (and what it waits for on other
   streams), each piece where it lies in the queue. */
void run_through(emu_stream *s, unsigned long long serial) {
  std::lock_guard<std::recursive_mutex> guard(queue_lock);
  while (s->done_through < serial && !s->pending.empty()) {
    run_piece(s, s->pending.front());
    s->done_through = s->pending.front().serial;
    s->pending.pop_front();
  }
}

/* run_through for the host, which waits (counted for LUTRA_EMU_STATS;
   traced as why, unless NULL) */
void host_waits(emu_stream *s, unsigned long long serial, const char *why = "host waits") {
  std::lock_guard<std::recursive_mutex> guard(queue_lock);
  if (why)
    lt_emu_trace((cudaStream_t)s, "%s", why);
  if (s->done_through < serial && !s->pending.empty()) {
    double t0 = now();
    run_through(s, serial);
    stats.running += now() - t0;
    stats.waits++;
  }
  /* the host goes on after what it waited for, also when another stream's
     wait ran it earlier */
  tsan_acquire(&s->done_token);
}

void run_all(emu_stream *s) { host_waits(s, s->queued_through); }

} // namespace

/* every stream lutra made, for what waits for the whole device (cudaFree) */
static std::vector<emu_stream *> streams;

void lt_emu_trace(cudaStream_t stream, const char *fmt, ...) {
  static FILE *f = [] {
    const char *path = getenv("LUTRA_EMU_TRACE");
    FILE *t = path && *path ? fopen(path, "w") : NULL;
    if (path && *path && !t)
      fprintf(stderr, "lutra CUDA emulator: cannot write the trace %s\n", path);
    return t;
  }();
  if (!f)
    return;
  std::lock_guard<std::recursive_mutex> guard(queue_lock);
  size_t id = 0; /* 0: the default stream, else 1 + the order of creation */
  for (size_t j = 0; stream && stream != (cudaStream_t)&default_stream && j < streams.size(); j++)
    if ((cudaStream_t)streams[j] == stream)
      id = j + 1;
  fprintf(f, "%zu ", id);
  va_list ap;
  va_start(ap, fmt);
  vfprintf(f, fmt, ap);
  va_end(ap);
  fputc('\n', f);
}

namespace {

void run_everything() {
  std::lock_guard<std::recursive_mutex> guard(queue_lock);
  run_all(&default_stream);
  for (emu_stream *s : streams)
    run_all(s);
}

void push(emu_stream *s, std::function<void()> work, emu_stream *after, unsigned long long after_serial) {
  std::lock_guard<std::recursive_mutex> guard(queue_lock);
  unsigned long long serial = ++serials;
  s->pending.push_back(queued{serial, std::unique_ptr<std::function<void()>>(new std::function<void()>(std::move(work))),
                              after, after_serial, nullptr});
#if LT_EMU_TSAN
  if (!s->tsan) /* (made by the host before the stream's first work: a context inherits its maker's past) */
    s->tsan = __tsan_create_fiber(0);
  s->pending.back().token.reset(new char());
  __tsan_release(s->pending.back().token.get());
#endif
  s->queued_through = serial;
  stats.queued++;
  stats.deepest = std::max<unsigned long long>(stats.deepest, s->pending.size());
  static bool report = getenv("LUTRA_EMU_STATS") && atexit(print_stats) == 0;
  (void)report;
  if (run_at_once())
    run_all(s);
  else if (s->pending.size() > queue_limit()) {
    stats.full++;
    double t0 = now();
    run_through(s, s->pending.front().serial);
    tsan_acquire(&s->done_token); /* (a host that found the queue full waited for its oldest work) */
    stats.running += now() - t0;
  }
}

/* the error of a kernel that failed in the work just waited for, once */
cudaError_t take_async_error() {
  cudaError_t e = async_error;
  async_error = cudaSuccess;
  if (e != cudaSuccess && last_error == e) /* (one fault is reported once) */
    last_error = cudaSuccess;
  return e;
}

/* pinned host memory (cudaMallocHost): queued copies read and write it
   when they run; pageable memory is read when the copy is queued, and a
   copy into it waits */
std::map<const char *, size_t> pinned;

/* whether [p, p + bytes) lies in one cudaMalloc block */
bool in_device(const void *p, size_t bytes) {
  if (!p)
    return false;
  std::lock_guard<std::mutex> guard(memory_lock);
  auto it = device_blocks.upper_bound((void *)p);
  if (it == device_blocks.begin())
    return false;
  --it;
  const char *end = (const char *)it->first + it->second;
  return (const char *)p < end && bytes <= (size_t)(end - (const char *)p);
}

bool is_device(const void *p) { return in_device(p, 1); }

bool is_pinned(const void *p) {
  std::lock_guard<std::recursive_mutex> guard(queue_lock);
  auto it = pinned.upper_bound((const char *)p);
  if (it == pinned.begin())
    return false;
  --it;
  return (const char *)p < it->first + it->second;
}

/* fills (and under AddressSanitizer poisons) a block as lt_emu_device_span says */
void span_now(void *p, size_t used, size_t block) {
#if defined(__SANITIZE_ADDRESS__)
  ASAN_UNPOISON_MEMORY_REGION(p, used);
  ASAN_POISON_MEMORY_REGION((char *)p + used, block - used);
#else
  (void)block;
#endif
  /* a new tensor's memory holds garbage, as on a GPU (cudaMalloc does not
     clear, and the cache hands back old data): all ones, NaN as a float;
     a freed block is scribbled too, so a read after the free sees garbage */
#if defined(__SANITIZE_ADDRESS__)
  if (used)
    memset(p, 0xff, used);
#else
  memset(p, 0xff, used ? used : block);
#endif
}

} // namespace

void lt_emu_enqueue(cudaStream_t stream, std::function<void()> work) {
  push(stream_of(stream), std::move(work), NULL, 0);
}

void lt_emu_host_waits(cudaStream_t stream, const char *why) {
  emu_stream *s = stream_of(stream);
  host_waits(s, s->queued_through, why);
}

extern "C" {

/* host/cuda/backend.c's allocator hands out block (a size class) for used
   bytes (used 0: the block was freed), in the order of stream, the stream
   whose kernels use it: when the stream's earlier work has run, the bytes
   are filled with garbage and, under AddressSanitizer, the rest of the
   block is poisoned (all of it while the block waits in the cache), so a
   kernel reading past its tensor or a freed one is caught. */
void lt_emu_device_span(void *p, size_t used, size_t block, cudaStream_t stream) {
  push(stream_of(stream), [=] { span_now(p, used, block); }, NULL, 0);
}

int lt_emu_device_range(const void *p, size_t bytes) { return in_device(p, bytes); }

cudaError_t cudaGetLastError(void) {
  cudaError_t e = last_error;
  last_error = cudaSuccess;
  if (e == cudaErrorLaunchFailure) /* (one fault is reported once, here or at a wait) */
    async_error = cudaSuccess;
  return e;
}

cudaError_t cudaPeekAtLastError(void) { return last_error; }

const char *cudaGetErrorString(cudaError_t e) {
  switch (e) {
  case cudaSuccess: return "no error";
  case cudaErrorMemoryAllocation: return "out of memory";
  case cudaErrorInvalidValue: return "invalid argument";
  case cudaErrorInvalidDevice: return "invalid device ordinal";
  case cudaErrorInvalidConfiguration:
  case cudaErrorLaunchFailure: {
    static thread_local std::string s;
    s = (e == cudaErrorInvalidConfiguration ? "invalid configuration argument (emulator: " : "unspecified launch failure (emulator: ") + fault_message + ")";
    return s.c_str();
  }
  case cudaErrorNotReady: return "device not ready";
  case cudaErrorInvalidResourceHandle: return "invalid resource handle";
  default: return "unknown error (emulator)";
  }
}

const char *cudaGetErrorName(cudaError_t e) {
  switch (e) {
  case cudaSuccess: return "cudaSuccess";
  case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
  case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
  case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
  case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
  case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
  case cudaErrorNotReady: return "cudaErrorNotReady";
  case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
  default: return "cudaErrorUnknown";
  }
}

cudaError_t cudaGetDeviceCount(int *n) {
  *n = 1;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int d) {
  if (d != 0)
    return cudaErrorInvalidDevice;
  current_device = d;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int *d) {
  *d = current_device;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int d) {
  if (d != 0)
    return cudaErrorInvalidDevice;
  memset(p, 0, sizeof *p);
  snprintf(p->name, sizeof p->name, "lutra CUDA emulator (CPU)");
  p->major = 9;
  p->minor = 0;
  p->totalGlobalMem = device_capacity();
  p->multiProcessorCount = 132;
  p->warpSize = 32;
  p->maxThreadsPerBlock = 1024;
  p->sharedMemPerBlock = 48 * 1024;
  p->maxGridSize[0] = 2147483647;
  p->maxGridSize[1] = p->maxGridSize[2] = 65535;
  p->maxThreadsDim[0] = p->maxThreadsDim[1] = 1024;
  p->maxThreadsDim[2] = 64;
  return cudaSuccess;
}

cudaError_t cudaDriverGetVersion(int *v) {
  *v = CUDART_VERSION;
  return cudaSuccess;
}

cudaError_t cudaRuntimeGetVersion(int *v) {
  *v = CUDART_VERSION;
  return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total) {
  std::lock_guard<std::mutex> guard(memory_lock);
  *total = device_capacity();
  *free_bytes = *total - device_used;
  return cudaSuccess;
}

cudaError_t cudaMalloc(void **p, size_t bytes) {
  std::lock_guard<std::mutex> guard(memory_lock);
  *p = NULL;
  size_t rounded = (bytes + 255) / 256 * 256;
  if (rounded > device_capacity() - device_used)
    return last_error = cudaErrorMemoryAllocation;
  void *q = aligned_alloc(256, rounded ? rounded : 256);
  if (!q)
    return last_error = cudaErrorMemoryAllocation;
  memset(q, 0xff, rounded); /* not cleared on a GPU either */
  device_blocks[q] = rounded;
  device_used += rounded;
  *p = q;
  return cudaSuccess;
}

cudaError_t cudaFree(void *p) {
  if (!p)
    return cudaSuccess;
  run_everything(); /* (cudaFree waits for the device) */
  std::lock_guard<std::mutex> guard(memory_lock);
  auto it = device_blocks.find(p);
  if (it == device_blocks.end())
    return cudaErrorInvalidValue;
  device_used -= it->second;
  span_now(p, it->second, it->second);
  device_blocks.erase(it);
  free(p);
  return take_async_error();
}

cudaError_t cudaMallocHost(void **p, size_t bytes) {
  size_t rounded = (bytes + 255) / 256 * 256;
  *p = aligned_alloc(256, rounded ? rounded : 256);
  if (!*p)
    return cudaErrorMemoryAllocation;
  memset(*p, 0xff, rounded);
  std::lock_guard<std::recursive_mutex> guard(queue_lock);
  pinned[(const char *)*p] = rounded;
  return cudaSuccess;
}

cudaError_t cudaFreeHost(void *p) {
  if (!p)
    return cudaSuccess;
  run_everything(); /* (as cudaFree) */
  std::lock_guard<std::recursive_mutex> guard(queue_lock);
  if (!pinned.erase((const char *)p))
    return cudaErrorInvalidValue;
  free(p);
  return take_async_error();
}

/* As CUDA's: a copy between device memory and pinned host memory runs in
   stream order; one from pageable memory reads it now (the caller may
   reuse it at once) and lands in stream order; one to pageable memory
   waits for the stream's work before it and returns when done. */
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind, cudaStream_t s) {
  emu_stream *q = stream_of(s);
  if (!bytes)
    return cudaSuccess;
  if (!dst || !src)
    return last_error = cudaErrorInvalidValue;
  if (kind == cudaMemcpyDefault) /* (unified addressing: the pointers say) */
    kind = (enum cudaMemcpyKind)((is_device(src) ? 2 : 0) + (is_device(dst) ? 1 : 0)); /* H2H 0, H2D 1, D2H 2, D2D 3 */
  if (kind == cudaMemcpyHostToHost) { /* fully synchronous */
    run_all(q);
    memmove(dst, src, bytes);
    return take_async_error();
  }
  bool to_host = kind == cudaMemcpyDeviceToHost, from_host = kind == cudaMemcpyHostToDevice;
  static const char *kinds[4] = {"H2H", "H2D", "D2H", "D2D"};
  lt_emu_trace(s, "memcpy %s%s %zu", kinds[kind & 3], is_pinned(dst) || is_pinned(src) ? " pinned" : "", bytes);
  if (to_host && !is_pinned(dst)) {
    push(q, [=] { memmove(dst, src, bytes); }, NULL, 0);
    run_all(q);
    return take_async_error();
  }
  if (from_host && !is_pinned(src)) {
    std::shared_ptr<std::vector<char>> copy = std::make_shared<std::vector<char>>((const char *)src,
                                                                                  (const char *)src + bytes);
    push(q, [=] { memcpy(dst, copy->data(), bytes); }, NULL, 0);
    return cudaSuccess;
  }
  push(q, [=] { memmove(dst, src, bytes); }, NULL, 0);
  return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void *p, int v, size_t bytes, cudaStream_t s) {
  if (bytes) {
    lt_emu_trace(s, "memset %zu", bytes);
    push(stream_of(s), [=] { memset(p, v, bytes); }, NULL, 0);
  }
  return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags) {
  emu_stream *e = new emu_stream();
  e->flags = flags;
  std::lock_guard<std::recursive_mutex> guard(queue_lock);
  streams.push_back(e);
  e->slot = (unsigned)(streams.size() % STREAM_SLOTS); /* (the default stream has slot 0) */
  *s = (cudaStream_t)e;
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  run_all(stream_of(s));
  return take_async_error();
}

cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags) {
  (void)flags;
  if (!e)
    return cudaErrorInvalidValue;
  emu_event *v = (emu_event *)e;
  emu_stream *q = stream_of(s);
  std::lock_guard<std::recursive_mutex> guard(queue_lock);
  if (v->stream && v->stream != q && v->stream->done_through < v->serial)
    push(q, nullptr, v->stream, v->serial);
  return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags) {
  emu_event *v = new emu_event();
  v->flags = flags;
  *e = (cudaEvent_t)v;
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *e) { return cudaEventCreateWithFlags(e, cudaEventDefault); }

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  if (!e)
    return cudaErrorInvalidValue;
  emu_event *v = (emu_event *)e;
  std::lock_guard<std::recursive_mutex> guard(queue_lock);
  if (!(v->flags & cudaEventDisableTiming)) {
    auto stamp = std::make_shared<double>(-1.0);
    v->stamp = stamp;
    push(stream_of(s), [stamp] {
      struct timespec t;
      clock_gettime(CLOCK_MONOTONIC, &t);
      *stamp = t.tv_sec * 1e3 + t.tv_nsec / 1e6;
    }, NULL, 0);
  }
  v->stream = stream_of(s);
  v->serial = v->stream->queued_through;
  v->queries = 0;
  return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  if (!e)
    return cudaErrorInvalidValue;
  emu_event *v = (emu_event *)e;
  if (v->stream)
    host_waits(v->stream, v->serial);
  return take_async_error();
}

/* "not ready" while the work before the record has not run, for two
   queries; the third runs it (the GPU caught up) */
cudaError_t cudaEventQuery(cudaEvent_t e) {
  if (!e)
    return cudaErrorInvalidValue;
  emu_event *v = (emu_event *)e;
  std::lock_guard<std::recursive_mutex> guard(queue_lock);
  if (!v->stream)
    return cudaSuccess;
  if (v->stream->done_through >= v->serial) {
    host_waits(v->stream, v->serial, NULL); /* (nothing to run: the host's view of it, under ThreadSanitizer) */
    return cudaSuccess;
  }
  if (v->queries++ < 2)
    return cudaErrorNotReady;
  host_waits(v->stream, v->serial, "event query (the emulator runs the event's work; a GPU answers at once)");
  return take_async_error();
}

/* as the runtime: both events recorded with timing, and done */
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end) {
  if (!ms || !start || !end)
    return cudaErrorInvalidValue;
  emu_event *a = (emu_event *)start, *b = (emu_event *)end;
  std::lock_guard<std::recursive_mutex> guard(queue_lock);
  if (!a->stamp || !b->stamp)
    return cudaErrorInvalidResourceHandle;
  if (*a->stamp < 0 || *b->stamp < 0)
    return cudaErrorNotReady;
  *ms = (float)(*b->stamp - *a->stamp);
  return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t e) {
  delete (emu_event *)e; /* (a wait queued on it keeps its own copy of the point) */
  return cudaSuccess;
}

} // extern "C"
