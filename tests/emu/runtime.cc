/*
 * runtime.cc: the CUDA emulator's scheduler and the part of the CUDA runtime
 * API that lutra calls (host/backend-cuda.c, host/matmul-cuda.c,
 * host/comm-nccl.c, kernels/cuda), for a build of lutra whose "device" is
 * this process (make emu; tests/emu/README.md).
 *
 * Scheduler: a launch runs its blocks one after another (first to last, or
 * last to first every other launch); the threads of a block are fibers
 * (stacks made once, switched by a few instructions that swap the
 * callee-saved registers: x86-64 only, as lutra's CI), run in index order
 * in every other block and in reverse order in the others. A thread runs
 * until it finishes, waits at __syncthreads, or shuffles; when no thread can
 * run, the scheduler releases a warp whose lanes all reached their shuffle,
 * else the block when every thread waits at the same barrier, else the
 * launch fails with what the threads were doing (a barrier some threads
 * skip or exit before, two different barriers, a shuffle that names an
 * exited lane).
 *
 * Runtime: one device, "lutra CUDA emulator"; device memory is host memory
 * (aligned to 256 bytes, as cudaMalloc's; new blocks and tensors filled
 * with 0xff bytes, as a GPU leaves garbage) counted against a capacity
 * (LUTRA_EMU_MEMORY_MB, 4096 by default) so that running out is an error as
 * on a GPU. Streams and events exist, but every call completes before it
 * returns (every other recorded event still says "not ready" to its first
 * two queries, so the host's code for work in flight runs too). The launch
 * configuration is checked against the driver's limits (CUDA C++
 * Programming Guide, "Compute Capabilities": 1024 threads per block, block
 * z <= 64, grid y and z <= 65535, 48 KiB of dynamic shared memory without
 * opting in).
 */
#include "cuda_emu.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

#include <map>
#include <mutex>
#include <string>

lt_emu_thread *lt_emu_self;
uint3 lt_emu_block_idx;
dim3 lt_emu_block_dim, lt_emu_grid_dim;

namespace {

enum { MAX_THREADS = 1024, STACK_BYTES = 256 << 10 };

enum fiber_state { RUNNABLE, AT_BARRIER, AT_SHUFFLE, DONE };

struct fiber {
  lt_emu_thread t;
  void *sp; /* the fiber's saved stack pointer while it is switched out */
  char *stack;
  bool booted;
  fiber_state state;
  unsigned shuffle_mask, shuffle_src;
  uint64_t shuffle_value, shuffle_result;
  const char *barrier_file; /* where the thread called __syncthreads */
  int barrier_line;
};

fiber fibers[MAX_THREADS];
unsigned long long block_serial; /* counts blocks run: shared memory is fresh garbage in each */
void *scheduler_sp;
fiber *current;
const std::function<void()> *body;
std::mutex launch_lock;

/* the error of the last launch or call, until cudaGetLastError reads and clears it (a GPU's
   launch failures stay: the emulator's do not) */
cudaError_t last_error = cudaSuccess;
std::string fault_message;

void fault(const char *fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  fault_message = buf;
  last_error = cudaErrorLaunchFailure;
}

} // namespace

#if !defined(__x86_64__)
#error "the CUDA emulator's fiber switch is written for x86-64 (tests/emu/runtime.cc)"
#endif

/* lt_emu_switch(&save, to): saves the callee-saved registers on this stack,
   stores the stack pointer in save, and continues on the stack to (System V
   x86-64: rbx, rbp, r12-r15 are callee-saved; a switch is a call). */
extern "C" void lt_emu_switch(void **save, void *to);
__asm__(".text\n"
        ".globl lt_emu_switch\n"
        ".type lt_emu_switch, @function\n"
        "lt_emu_switch:\n"
        "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
        "  movq %rsp, (%rdi)\n"
        "  movq %rsi, %rsp\n"
        "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
        "  ret\n"
        ".size lt_emu_switch, .-lt_emu_switch\n");

namespace {

unsigned block_threads; /* the running block's thread count */

/* Under AddressSanitizer each switch of stacks is announced to it
   (sanitizer/common_interface_defs.h), so it checks each fiber's stack as a
   stack; elsewhere these do nothing. */
const void *scheduler_stack; /* the launching thread's stack (set by lt_emu_run) */
size_t scheduler_stack_bytes;
#if defined(__SANITIZE_ADDRESS__)
void switch_begin(void **fake, const void *bottom, size_t bytes) { __sanitizer_start_switch_fiber(fake, bottom, bytes); }
void switch_end(void *fake) { __sanitizer_finish_switch_fiber(fake, NULL, NULL); }
#else
void switch_begin(void **, const void *, size_t) {}
void switch_end(void *) {}
#endif

/* the calling thread's stack, for the switches back to the scheduler */
void launching_thread_stack(const void **bottom, size_t *bytes) {
  static thread_local const void *b;
  static thread_local size_t n;
  if (!b) {
    pthread_attr_t a;
    void *addr = NULL;
    size_t size = 0;
    if (pthread_getattr_np(pthread_self(), &a) == 0) {
      pthread_attr_getstack(&a, &addr, &size);
      pthread_attr_destroy(&a);
    }
    b = addr;
    n = size;
  }
  *bottom = b;
  *bytes = n;
}
void *scheduler_fake_stack;

/* Threads run in index order in every other block and in reverse order in
   the others, and every other launch runs its blocks last to first: code
   that reads what another thread or block writes without a barrier between
   (a race on a GPU) then sees both orders, and a check fails. */
bool descending;

/* The next runnable thread after index i in this block's order, or -1. */
long next_runnable(long i) {
  long step = descending ? -1 : 1;
  for (i += step; i >= 0 && i < (long)block_threads; i += step)
    if (fibers[i].state == RUNNABLE)
      return i;
  return -1;
}

/* Switches from f to the next runnable thread of the block, or back to the
   scheduler after the last (one pass: each thread that could run has run
   once, with one switch per thread). */
void yield_to_scheduler(fiber *f) {
  long i = next_runnable((long)f->t.linear);
  void *fake = NULL;
  if (i < 0) {
    switch_begin(&fake, scheduler_stack, scheduler_stack_bytes);
    lt_emu_switch(&f->sp, scheduler_sp);
  } else {
    current = &fibers[i];
    lt_emu_self = &fibers[i].t;
    switch_begin(&fake, fibers[i].stack, STACK_BYTES);
    lt_emu_switch(&f->sp, fibers[i].sp);
  }
  switch_end(fake);
}

[[noreturn]] void fiber_entry() {
  switch_end(NULL);
  for (;;) {
    fiber *f = current;
    (*body)();
    f->state = DONE;
    yield_to_scheduler(f);
  }
}

/* A fresh stack whose first switch "returns" into fiber_entry. */
bool boot(fiber *f) {
  if (!f->stack) {
    void *p = mmap(NULL, STACK_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
      return false;
    mprotect(p, 4096, PROT_NONE); /* a guard page: an overflow faults instead of corrupting */
    f->stack = (char *)p;
  }
#if defined(__SANITIZE_ADDRESS__)
  ASAN_UNPOISON_MEMORY_REGION(f->stack + 4096, STACK_BYTES - 4096); /* (frames a fault abandoned) */
#endif
  /* tops staggered by cache lines: stacks that all ended on a 256 KiB
     boundary would share the same cache sets, and switching thrashed them */
  size_t color = (size_t)(f - fibers) % 61 * 64;
  void **top = (void **)(f->stack + STACK_BYTES - color); /* 16-byte aligned */
  *--top = NULL;                                  /* fiber_entry's return address (it never returns) */
  *--top = (void *)fiber_entry;                   /* where lt_emu_switch's ret goes */
  for (int i = 0; i < 6; i++)
    *--top = NULL; /* rbp, rbx, r12-r15 */
  f->sp = top;
  f->booted = true;
  return true;
}

void resume(fiber *f) {
  current = f;
  lt_emu_self = &f->t;
  switch_begin(&scheduler_fake_stack, f->stack, STACK_BYTES);
  lt_emu_switch(&scheduler_sp, f->sp);
  switch_end(scheduler_fake_stack);
}

const char *state_name(fiber_state s) {
  switch (s) {
  case RUNNABLE: return "running";
  case AT_BARRIER: return "at __syncthreads";
  case AT_SHUFFLE: return "at a shuffle";
  default: return "exited";
  }
}

/* "thread 3 at __syncthreads, thread 40 exited" for the first threads in each state */
std::string describe(unsigned n) {
  std::string s;
  int shown[4] = {0, 0, 0, 0};
  for (unsigned i = 0; i < n; i++) {
    fiber_state st = fibers[i].state;
    if (shown[st]++)
      continue;
    char buf[96];
    snprintf(buf, sizeof buf, "%sthread (%u,%u,%u) %s", s.empty() ? "" : ", ", fibers[i].t.idx.x, fibers[i].t.idx.y,
             fibers[i].t.idx.z, state_name(st));
    s += buf;
  }
  return s;
}

/* Releases the warps whose shuffle can complete; false when none can. A lane
   named by a waiting lane's mask that has exited (or does not exist) is a fault. */
bool release_shuffles(unsigned n, const char *name, bool *failed) {
  bool released = false;
  for (unsigned base = 0; base < n; base += 32) {
    unsigned end = base + 32 < n ? base + 32 : n;
    unsigned mask = 0;
    bool any = false;
    for (unsigned i = base; i < end; i++)
      if (fibers[i].state == AT_SHUFFLE) {
        mask = fibers[i].shuffle_mask;
        any = true;
        break;
      }
    if (!any)
      continue;
    bool ready = true;
    for (unsigned lane = 0; lane < 32; lane++) {
      if (!(mask >> lane & 1))
        continue;
      unsigned i = base + lane;
      if (i >= end || fibers[i].state == DONE) {
        fault("%s: block (%u,%u,%u): a shuffle with mask 0x%08x names lane %u, which %s", name, lt_emu_block_idx.x,
              lt_emu_block_idx.y, lt_emu_block_idx.z, mask, lane, i >= end ? "the block does not have" : "has exited");
        *failed = true;
        return false;
      }
      if (fibers[i].state != AT_SHUFFLE) {
        ready = false;
        break;
      }
      if (fibers[i].shuffle_mask != mask) {
        fault("%s: block (%u,%u,%u): lanes of warp %u shuffle with different masks (0x%08x and 0x%08x)", name,
              lt_emu_block_idx.x, lt_emu_block_idx.y, lt_emu_block_idx.z, base / 32, mask, fibers[i].shuffle_mask);
        *failed = true;
        return false;
      }
    }
    if (!ready)
      continue;
    for (unsigned lane = 0; lane < 32; lane++)
      if ((mask >> lane & 1) && !(mask >> fibers[base + lane].shuffle_src & 1)) {
        fault("%s: block (%u,%u,%u): lane %u of warp %u reads lane %u, outside the shuffle's mask 0x%08x", name,
              lt_emu_block_idx.x, lt_emu_block_idx.y, lt_emu_block_idx.z, lane, base / 32,
              fibers[base + lane].shuffle_src, mask);
        *failed = true;
        return false;
      }
    for (unsigned lane = 0; lane < 32; lane++)
      if (mask >> lane & 1) {
        fiber *f = &fibers[base + lane];
        f->shuffle_result = fibers[base + f->shuffle_src].shuffle_value;
        f->state = RUNNABLE;
      }
    released = true;
  }
  return released;
}

/* Runs one block to the end; false (with the fault set) when it cannot finish. */
bool run_block(unsigned n, const char *name) {
  for (unsigned i = 0; i < n; i++) {
    fiber *f = &fibers[i];
    unsigned x = lt_emu_block_dim.x, y = lt_emu_block_dim.y;
    f->t.idx.x = i % x;
    f->t.idx.y = i / x % y;
    f->t.idx.z = i / (x * y);
    f->t.linear = i;
    f->t.warp = i / 32;
    f->t.lane = i % 32;
    f->state = RUNNABLE;
    if (!f->booted && !boot(f)) {
      fault("%s: no memory for the emulator's thread stacks", name);
      return false;
    }
  }
  block_threads = n;
  for (;;) {
    long first = next_runnable(descending ? (long)n : -1);
    if (first >= 0)
      resume(&fibers[first]); /* returns when the pass is over */
    bool failed = false;
    if (release_shuffles(n, name, &failed))
      continue;
    if (failed)
      return false;
    unsigned done = 0, barrier = 0;
    for (unsigned i = 0; i < n; i++) {
      done += fibers[i].state == DONE;
      barrier += fibers[i].state == AT_BARRIER;
    }
    if (done == n)
      return true;
    if (barrier + done == n && done == 0) {
      for (unsigned i = 0; i < n; i++)
        if (fibers[i].barrier_line != fibers[0].barrier_line ||
            strcmp(fibers[i].barrier_file, fibers[0].barrier_file)) {
          /* bar.sync is .aligned: every thread must reach the same one */
          fault("%s: block (%u,%u,%u): threads (%u,%u,%u) and (%u,%u,%u) wait at different __syncthreads (%s:%d "
                "and %s:%d)", name, lt_emu_block_idx.x, lt_emu_block_idx.y, lt_emu_block_idx.z, fibers[0].t.idx.x,
                fibers[0].t.idx.y, fibers[0].t.idx.z, fibers[i].t.idx.x, fibers[i].t.idx.y, fibers[i].t.idx.z,
                fibers[0].barrier_file, fibers[0].barrier_line, fibers[i].barrier_file, fibers[i].barrier_line);
          return false;
        }
      for (unsigned i = 0; i < n; i++)
        fibers[i].state = RUNNABLE;
      continue;
    }
    /* (a GPU releases a barrier that only exited threads hold up; the CUDA
       C++ guide makes a __syncthreads that not every thread reaches
       undefined, so lutra's kernels must not rely on it) */
    fault("%s: block (%u,%u,%u) cannot go on: %s%s", name, lt_emu_block_idx.x, lt_emu_block_idx.y, lt_emu_block_idx.z,
          describe(n).c_str(), done ? " (a __syncthreads that some threads exit before)" : "");
    return false;
  }
}

bool config_ok(const lt_emu_config &c, const char *name) {
  uint64_t threads = (uint64_t)c.block.x * c.block.y * c.block.z;
  const char *why = NULL;
  if (threads == 0 || c.grid.x == 0 || c.grid.y == 0 || c.grid.z == 0)
    why = "a zero-sized grid or block";
  else if (threads > MAX_THREADS || c.block.x > 1024 || c.block.y > 1024 || c.block.z > 64)
    why = "more than 1024 threads per block (or block.z > 64)";
  else if (c.grid.x > 2147483647u || c.grid.y > 65535 || c.grid.z > 65535)
    why = "a grid beyond 2^31-1 x 65535 x 65535";
  else if (c.smem > 48 * 1024)
    why = "more than 48 KiB of dynamic shared memory";
  if (!why)
    return true;
  fault("%s<<<(%u,%u,%u), (%u,%u,%u), %zu>>>: %s", name, c.grid.x, c.grid.y, c.grid.z, c.block.x, c.block.y,
        c.block.z, c.smem, why);
  last_error = cudaErrorInvalidConfiguration;
  return false;
}

} // namespace

void lt_emu_run(const lt_emu_config &c, const char *name, const std::function<void()> &fn) {
  std::lock_guard<std::mutex> guard(launch_lock);
  if (!config_ok(c, name))
    return;
  body = &fn;
  launching_thread_stack(&scheduler_stack, &scheduler_stack_bytes);
  lt_emu_grid_dim = c.grid;
  lt_emu_block_dim = c.block;
  unsigned n = c.block.x * c.block.y * c.block.z;
  static unsigned long long launches;
  bool backwards = launches++ % 2;
  for (unsigned z = 0; z < c.grid.z; z++)
    for (unsigned y = 0; y < c.grid.y; y++)
      for (unsigned x = 0; x < c.grid.x; x++) {
        lt_emu_block_idx.x = backwards ? c.grid.x - 1 - x : x;
        lt_emu_block_idx.y = backwards ? c.grid.y - 1 - y : y;
        lt_emu_block_idx.z = backwards ? c.grid.z - 1 - z : z;
        descending = (x + y + z + (backwards ? 1 : 0)) % 2; /* (a one-block launch sees both orders too) */
        block_serial++;
        if (!run_block(n, name)) {
          for (unsigned i = 0; i < n; i++) /* stopped mid-kernel: boot afresh next time */
            fibers[i].booted = false;
          return;
        }
      }
}

void lt_emu_syncthreads(const char *file, int line) {
  fiber *f = current;
  f->barrier_file = file;
  f->barrier_line = line;
  f->state = AT_BARRIER;
  yield_to_scheduler(f);
}

namespace {
struct shared_var {
  void *p;
  unsigned long long filled_in;
};
std::vector<shared_var> shared_vars;
} // namespace

void lt_emu_shared(void *p, size_t bytes) {
  for (shared_var &v : shared_vars)
    if (v.p == p) {
      if (v.filled_in != block_serial) {
        memset(p, 0xff, bytes);
        v.filled_in = block_serial;
      }
      return;
    }
  memset(p, 0xff, bytes);
  shared_vars.push_back(shared_var{p, block_serial});
}

uint64_t lt_emu_shuffle(unsigned mask, uint64_t bits, unsigned src_lane) {
  fiber *f = current;
  f->shuffle_mask = mask;
  f->shuffle_src = src_lane;
  f->shuffle_value = bits;
  f->state = AT_SHUFFLE;
  yield_to_scheduler(f);
  return f->shuffle_result;
}

/* ---- the runtime API ------------------------------------------------------ */

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

struct emu_stream {
  unsigned flags;
};
/* An event completes with the work before it (all of it is done when the
   record returns), but reports "not ready" to its first queries after
   every other record, so the host's paths for work still in flight run. */
struct emu_event {
  unsigned flags;
  int polls_left;
};
unsigned long long event_records;

} // namespace

extern "C" {

/* host/backend-cuda.c's allocator hands out block (a size class) for used
   bytes: under AddressSanitizer the rest of the block is poisoned, and all
   of it while the block waits in the cache, so a kernel reading past its
   tensor or a freed one is caught (used 0: the block was freed). */
void lt_emu_device_span(void *p, size_t used, size_t block) {
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

cudaError_t cudaGetLastError(void) {
  cudaError_t e = last_error;
  last_error = cudaSuccess;
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
  std::lock_guard<std::mutex> guard(memory_lock);
  auto it = device_blocks.find(p);
  if (it == device_blocks.end())
    return cudaErrorInvalidValue;
  device_used -= it->second;
  lt_emu_device_span(p, it->second, it->second);
  device_blocks.erase(it);
  free(p);
  return cudaSuccess;
}

cudaError_t cudaMallocHost(void **p, size_t bytes) {
  size_t rounded = (bytes + 255) / 256 * 256;
  *p = aligned_alloc(256, rounded ? rounded : 256);
  return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}

cudaError_t cudaFreeHost(void *p) {
  free(p);
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind, cudaStream_t s) {
  (void)kind;
  (void)s;
  if (bytes)
    memmove(dst, src, bytes);
  return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void *p, int v, size_t bytes, cudaStream_t s) {
  (void)s;
  if (bytes)
    memset(p, v, bytes);
  return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags) {
  emu_stream *e = new emu_stream();
  e->flags = flags;
  *s = (cudaStream_t)e;
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  (void)s;
  return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags) {
  (void)s;
  (void)e;
  (void)flags;
  return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags) {
  emu_event *v = new emu_event();
  v->flags = flags;
  v->polls_left = 0;
  *e = (cudaEvent_t)v;
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  (void)s;
  if (!e)
    return cudaErrorInvalidValue;
  ((emu_event *)e)->polls_left = event_records++ % 2 ? 2 : 0;
  return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  if (!e)
    return cudaErrorInvalidValue;
  ((emu_event *)e)->polls_left = 0;
  return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t e) {
  if (!e)
    return cudaErrorInvalidValue;
  emu_event *v = (emu_event *)e;
  if (v->polls_left > 0) {
    v->polls_left--;
    return cudaErrorNotReady;
  }
  return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t e) {
  delete (emu_event *)e;
  return cudaSuccess;
}

} // extern "C"
