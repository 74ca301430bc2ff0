/*
 * runtime.cc: the CUDA emulator's scheduler and the part of the CUDA runtime
 * API that lutra calls (host/cuda/backend.c, host/cuda/cublaslt.c,
 * host/comm/nccl.c, kernels/cuda), for a build of lutra whose "device" is
 * this process (make emu; tests/emu/README.md).
 *
 * Scheduler: a launch runs its blocks one after another (first to last, or
 * last to first every other launch); the threads of a block are fibers
 * (stacks made once, switched by a few instructions that swap the
 * callee-saved registers: x86-64 only, as lutra's CI), run in index order
 * in every other block and in reverse order in the others; in about half
 * the blocks one warp runs at a time (focus_warp). A thread runs
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
 * on a GPU. Streams are queues (emu_queue.h): launches, copies, memsets,
 * cuBLASLt's products and NCCL's collectives run in stream order when the
 * host waits for them (or another stream waits through an event), not
 * when they are queued, so host code that reads a result before waiting,
 * a stream that does not wait for another's work, or a pinned buffer
 * changed under a queued copy goes wrong here as it can on a GPU; a
 * kernel's fault is returned where the host waits. LUTRA_EMU_SYNC=1 runs
 * each piece of work when it is queued. Under ThreadSanitizer (make
 * emu-tsan, LT_EMU_TSAN) block threads, blocks and streams are contexts of
 * the race detector ordered only as on a GPU. The launch
 * configuration is checked against the driver's limits (CUDA C++
 * Programming Guide, "Compute Capabilities": 1024 threads per block, block
 * z <= 64, grid y and z <= 65535, 48 KiB of dynamic shared memory without
 * opting in).
 */
#include "cuda_emu.h"

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

lt_emu_thread *lt_emu_self;
unsigned lt_emu_set;
unsigned lt_emu_async_eager;
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
  const void *exchange_in; /* a warp exchange (lt_emu_warp_exchange) when exchange_bytes > 0 */
  void *exchange_out;
  size_t exchange_bytes;
  const char *barrier_file; /* where the thread called __syncthreads */
  int barrier_line;
  unsigned barriers; /* passed in this block */
  void *tsan;        /* ThreadSanitizer's context for it (make emu-tsan) */
};

/* Under ThreadSanitizer (make emu-tsan, LT_EMU_TSAN) every other block runs
   on a second set of fibers, each a context of its own for the race
   detector, with the block's shared memory in a second copy
   (rewrite_launches.py): two blocks in a row are then two sets of threads
   with nothing ordering them, as on a GPU, so a global-memory access one
   makes and the other conflicts with is reported. Kernels of different
   streams run on different fibers too (STREAM_SLOTS), so that a thread's
   program order does not order two streams' work. */
#if LT_EMU_TSAN
enum { SETS = 2, STREAM_SLOTS = 8 };
#else
enum { SETS = 1, STREAM_SLOTS = 1 };
#endif
fiber fiber_sets[STREAM_SLOTS][SETS][MAX_THREADS];
fiber *fibers = fiber_sets[0][0]; /* the running block's set */
unsigned stream_slot;             /* the fibers of the stream whose work runs */
unsigned long long block_serial; /* counts blocks run: shared memory is fresh garbage in each */
void *scheduler_sp;
fiber *current;
const std::function<void()> *body;
/* one launch runs at a time: a spinlock of the compiler's atomics, which
   this uninstrumented file keeps from ThreadSanitizer (a mutex would order
   every launch after the one before, whatever its stream) */
struct spinlock {
  bool held = false;
  void lock() {
    while (__atomic_exchange_n(&held, true, __ATOMIC_ACQUIRE))
      sched_yield();
  }
  void unlock() { __atomic_store_n(&held, false, __ATOMIC_RELEASE); }
};
spinlock launch_lock;

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
}

/* a kernel's fault, for the next wait for its stream to return (as a GPU
   reports a kernel's failure where the host waits: the emulator's is not
   sticky) */
cudaError_t async_error = cudaSuccess;

/* what LUTRA_EMU_STATS=1 prints at exit */
struct {
  unsigned long long launches, queued, waits, full, deepest;
  double running; /* seconds running queued work */
} stats;

double now() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

size_t queue_limit();

void print_stats() {
  fprintf(stderr,
          "lutra CUDA emulator: %llu pieces of work queued (%llu kernel launches), run at %llu waits of the host "
          "and %llu times for a full queue (limit %zu); deepest queue %llu; %.2f s running them\n",
          stats.queued, stats.launches, stats.waits, stats.full, queue_limit(), stats.deepest, stats.running);
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

/* What ThreadSanitizer is told (make emu-tsan): each switch is to another
   context with no ordering implied; a launch orders the host's work before
   it before every thread (begun) and every thread before the host's
   work after it (done); a __syncthreads orders the block's threads
   before it before them all after it (one token per set and per parity of
   the barrier's count, so a thread running on to the next barrier adds
   nothing to what the others acquire at this one); a block orders its
   threads before those of the next block on the same set (set_done: the
   next block reuses the set's copy of shared memory, as a GPU reuses an
   SM's), not before the other set's. Shuffles and atomics order nothing
   (CUDA's do not order memory either: __syncwarp and fences do). Each
   stream's queued work runs in a context of the stream's own, ordered
   after the host's work before it was queued, and before what waits for
   the stream (run_piece), so races between streams, and between the host
   and queued work, are reported too. */
struct launch_tokens {
  char begun, done, barrier[SETS][2], set_done[SETS];
};
launch_tokens *tokens; /* the running launch's (new for each: launches on two streams share none) */
#if LT_EMU_TSAN
void *scheduler_tsan, *scheduler_tsan_host;
void tsan_to(fiber *f) { __tsan_switch_to_fiber(f ? f->tsan : scheduler_tsan, __tsan_switch_to_fiber_no_sync); }
void tsan_release(void *token) { __tsan_release(token); }
void tsan_acquire(void *token) { __tsan_acquire(token); }
#else
void tsan_to(fiber *) {}
void tsan_release(void *) {}
void tsan_acquire(void *) {}
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

/* In about half the blocks (schedule_bit) only one warp runs at a time, each
   until its threads wait at a barrier or have exited (a schedule a GPU may
   choose): a warp then gets ahead of the others by whole stretches of code,
   so a warp that overwrites what another still reads (a missing barrier
   between warps) is caught without the race detector. focus_warp is the
   warp that runs, -1 when all do (the threads then move in step, a pass at
   a time). */
long focus_warp = -1;

/* Bit b of the running block's schedule (cp.async copies eager or lazy, one
   warp at a time or all in step): bits of the block count's Fibonacci hash,
   so that launches that repeat with any short period still meet every
   schedule, and consecutive blocks mix them. */
unsigned schedule_bit(unsigned b) { return (unsigned)((block_serial * 0x9E3779B97F4A7C15ull) >> (63 - b)) & 1; }

/* The next runnable thread after index i in this block's order, or -1. */
long next_runnable(long i) {
  long step = descending ? -1 : 1, lo = 0, hi = (long)block_threads;
  if (focus_warp >= 0) { /* (the warp's threads only) */
    lo = focus_warp * 32;
    hi = hi < lo + 32 ? hi : lo + 32;
    i = i < lo - 1 ? lo - 1 : i > hi ? hi : i;
  }
  for (i += step; i >= lo && i < hi; i += step)
    if (fibers[i].state == RUNNABLE)
      return i;
  return -1;
}

/* with one warp at a time, the next warp (in this block's order) with a runnable thread, or -1 */
long next_focus(void) {
  long warps = ((long)block_threads + 31) / 32;
  for (long k = 1; k <= warps; k++) {
    long w = descending ? (focus_warp - k + warps) % warps : (focus_warp + k) % warps;
    for (long i = w * 32; i < (long)block_threads && i < (w + 1) * 32; i++)
      if (fibers[i].state == RUNNABLE)
        return w;
  }
  return -1;
}

/* Switches from f to the next runnable thread of the block, or back to the
   scheduler after the last (one pass: each thread that could run has run
   once, with one switch per thread). */
void yield_to_scheduler(fiber *f) {
  tsan_release(&tokens->done); /* (at every switch: a launch that faults ends with threads mid-way) */
  long i = next_runnable((long)f->t.linear);
  void *fake = NULL;
  if (i < 0) {
    switch_begin(&fake, scheduler_stack, scheduler_stack_bytes);
    tsan_to(NULL);
    lt_emu_switch(&f->sp, scheduler_sp);
  } else {
    current = &fibers[i];
    lt_emu_self = &fibers[i].t;
    switch_begin(&fake, fibers[i].stack, STACK_BYTES);
    tsan_to(&fibers[i]);
    lt_emu_switch(&f->sp, fibers[i].sp);
  }
  switch_end(fake);
}

[[noreturn]] void fiber_entry() {
  switch_end(NULL);
  for (;;) {
    fiber *f = current;
    tsan_acquire(&tokens->begun);
    tsan_acquire(&tokens->set_done[lt_emu_set]);
    (*body)();
    tsan_release(&tokens->set_done[lt_emu_set]);
    f->state = DONE;
    yield_to_scheduler(f);
  }
}

/* A fresh stack whose first switch "returns" into fiber_entry. */
/* A stack of bytes (reserved, not committed), or NULL. */
char *new_stack(size_t bytes) {
  void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED)
    return NULL;
  mprotect(p, 4096, PROT_NONE); /* a guard page: an overflow faults instead of corrupting */
  return (char *)p;
}

/* The stack pointer of a stack ending at top (16-byte aligned) whose first
   switch "returns" into entry. */
void *first_frame(void **top, void (*entry)()) {
  *--top = NULL;           /* entry's return address (it never returns) */
  *--top = (void *)entry;  /* where lt_emu_switch's ret goes */
  for (int i = 0; i < 6; i++)
    *--top = NULL; /* rbp, rbx, r12-r15 */
  return top;
}

bool boot(fiber *f) {
  if (!f->stack && !(f->stack = new_stack(STACK_BYTES)))
    return false;
#if defined(__SANITIZE_ADDRESS__)
  ASAN_UNPOISON_MEMORY_REGION(f->stack + 4096, STACK_BYTES - 4096); /* (frames a fault abandoned) */
#endif
  /* tops staggered by cache lines: stacks that all ended on a 256 KiB
     boundary would share the same cache sets, and switching thrashed them */
  size_t color = (size_t)(f - fibers) % 61 * 64;
  f->sp = first_frame((void **)(f->stack + STACK_BYTES - color), fiber_entry);
  f->booted = true;
#if LT_EMU_TSAN
  if (f->tsan) /* (a fresh context: the one a fault abandoned holds stale frames) */
    __tsan_destroy_fiber(f->tsan);
  f->tsan = __tsan_create_fiber(0);
#endif
  return true;
}

void resume(fiber *f) {
  current = f;
  lt_emu_self = &f->t;
  switch_begin(&scheduler_fake_stack, f->stack, STACK_BYTES);
  tsan_to(f);
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

/* memcpy that ThreadSanitizer does not see (it intercepts memcpy even in
   this uninstrumented file): for the emulator's own moves of a warp's data */
void copy_unseen(void *dst, const void *src, size_t bytes) {
  if (bytes % 4 == 0 && (uintptr_t)dst % 4 == 0 && (uintptr_t)src % 4 == 0)
    for (size_t j = 0; j < bytes / 4; j++)
      ((volatile uint32_t *)dst)[j] = ((const volatile uint32_t *)src)[j];
  else
    for (size_t j = 0; j < bytes; j++)
      ((volatile char *)dst)[j] = ((const volatile char *)src)[j];
}

/* Releases the warps whose shuffle can complete; false when none can. A lane
   named by a waiting lane's mask that has exited (or does not exist) is a fault. */
bool release_shuffles(unsigned n, const char *name, bool *failed) {
  bool released = false;
  /* (one warp at a time: only the warp that ran can have met) */
  unsigned from = focus_warp >= 0 ? (unsigned)focus_warp * 32 : 0, to = focus_warp >= 0 ? from + 32 : n;
  for (unsigned base = from; base < n && base < to; base += 32) {
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
    size_t bytes = fibers[base + (unsigned)__builtin_ctz(mask)].exchange_bytes; /* (0: a shuffle) */
    for (unsigned lane = 0; lane < 32; lane++)
      if ((mask >> lane & 1) && fibers[base + lane].exchange_bytes != bytes) {
        fault("%s: block (%u,%u,%u): lanes of warp %u meet at different warp operations (a shuffle and a matrix "
              "product, or products of different sizes)", name, lt_emu_block_idx.x, lt_emu_block_idx.y,
              lt_emu_block_idx.z, base / 32);
        *failed = true;
        return false;
      }
    if (bytes) {
      for (unsigned lane = 0; lane < 32; lane++)
        if (mask >> lane & 1) {
          fiber *f = &fibers[base + lane];
          for (unsigned src = 0; src < 32; src++)
            if (mask >> src & 1)
              copy_unseen((char *)f->exchange_out + src * bytes, fibers[base + src].exchange_in, bytes);
          f->state = RUNNABLE;
        }
      released = true;
      continue;
    }
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

/* the first fault a kernel's thread raised in the running block (lt_emu_kernel_fault) */
std::string kernel_fault;

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
    f->barriers = 0;
    f->exchange_bytes = 0;
    f->t.async_n = f->t.async_committed = 0;
    if (!f->booted && !boot(f)) {
      fault("%s: no memory for the emulator's thread stacks", name);
      return false;
    }
  }
  block_threads = n;
  bool one_warp = schedule_bit(1);
  focus_warp = one_warp ? (descending ? (long)(n - 1) / 32 : 0) : -1;
  for (;;) {
    long first = next_runnable(descending ? (long)n : -1);
    if (first < 0 && one_warp) { /* (the warp waits at a barrier or has exited: the next one runs) */
      long w = next_focus();
      if (w >= 0) {
        focus_warp = w;
        first = next_runnable(descending ? (long)n : -1);
      }
    }
    if (first >= 0)
      resume(&fibers[first]); /* returns when the pass is over */
    if (!kernel_fault.empty()) {
      fault("%s: block (%u,%u,%u): %s", name, lt_emu_block_idx.x, lt_emu_block_idx.y, lt_emu_block_idx.z,
            kernel_fault.c_str());
      kernel_fault.clear();
      return false;
    }
    bool failed = false;
    if (release_shuffles(n, name, &failed))
      continue;
    if (failed)
      return false;
    unsigned done = 0, barrier = 0, runnable = 0;
    for (unsigned i = 0; i < n; i++) {
      done += fibers[i].state == DONE;
      barrier += fibers[i].state == AT_BARRIER;
      runnable += fibers[i].state == RUNNABLE;
    }
    if (runnable) /* (warps other than the one that ran: one warp at a time) */
      continue;
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

} // namespace

bool lt_emu_config_ok(const lt_emu_config &c, const char *name) {
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

void lt_emu_run(const lt_emu_config &c, const char *name, const std::function<void()> &fn) {
  std::lock_guard<spinlock> guard(launch_lock);
  stats.launches++;
  body = &fn;
  launching_thread_stack(&scheduler_stack, &scheduler_stack_bytes);
#if LT_EMU_TSAN
  scheduler_tsan = __tsan_get_current_fiber();
#endif
  std::unique_ptr<launch_tokens> mine(new launch_tokens());
  tokens = mine.get();
  tsan_release(&tokens->begun);
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
        lt_emu_set = (unsigned)(block_serial % SETS);
        lt_emu_async_eager = schedule_bit(0);
        fibers = fiber_sets[stream_slot][lt_emu_set];
        if (!run_block(n, name)) {
          for (unsigned i = 0; i < n; i++) /* stopped mid-kernel: boot afresh next time */
            fibers[i].booted = false;
          last_error = async_error = cudaErrorLaunchFailure;
          tsan_acquire(&tokens->done);
          return;
        }
      }
  tsan_acquire(&tokens->done);
}

void lt_emu_syncthreads(const char *file, int line) {
  fiber *f = current;
  f->barrier_file = file;
  f->barrier_line = line;
  f->state = AT_BARRIER;
  char *token = &tokens->barrier[lt_emu_set][f->barriers++ % 2];
  tsan_release(token);
  yield_to_scheduler(f);
  tsan_acquire(token);
}

namespace {
struct shared_var {
  void *p;
  size_t bytes;
  unsigned long long filled_in;
};
std::vector<shared_var> shared_vars;

/* While one lives, the race detector (make emu-tsan) sees none of this
   fiber's accesses: the emulator's own work on a fiber (the garbage fill of
   shared memory, which stands for no thread's write, and its bookkeeping)
   is not the kernel's. */
#if LT_EMU_TSAN
extern "C" void AnnotateIgnoreReadsBegin(const char *file, int line);
extern "C" void AnnotateIgnoreReadsEnd(const char *file, int line);
extern "C" void AnnotateIgnoreWritesBegin(const char *file, int line);
extern "C" void AnnotateIgnoreWritesEnd(const char *file, int line);
struct unseen {
  unseen() {
    AnnotateIgnoreReadsBegin(__FILE__, __LINE__);
    AnnotateIgnoreWritesBegin(__FILE__, __LINE__);
  }
  ~unseen() {
    AnnotateIgnoreWritesEnd(__FILE__, __LINE__);
    AnnotateIgnoreReadsEnd(__FILE__, __LINE__);
  }
};
#else
struct unseen {
  unseen() {} /* (a constructor: no unused-variable warning) */
};
#endif
} // namespace

void lt_emu_shared(void *p, size_t bytes) {
  unseen quiet;
  for (shared_var &v : shared_vars)
    if (v.p == p) {
      if (v.filled_in != block_serial) {
        memset(p, 0xff, bytes);
        v.filled_in = block_serial;
      }
      return;
    }
  memset(p, 0xff, bytes);
  shared_vars.push_back(shared_var{p, bytes, block_serial});
}

bool lt_emu_in_shared(const void *p, size_t bytes) {
  uintptr_t a = (uintptr_t)p;
  for (const shared_var &v : shared_vars)
    if (a >= (uintptr_t)v.p && a + bytes <= (uintptr_t)v.p + v.bytes)
      return true;
  return false;
}

void lt_emu_kernel_fault(const char *what) {
  fiber *f = current;
  if (kernel_fault.empty()) {
    char buf[320];
    snprintf(buf, sizeof buf, "thread (%u,%u,%u): %s", f->t.idx.x, f->t.idx.y, f->t.idx.z, what);
    kernel_fault = buf;
  }
  f->state = DONE; /* (never resumed: the launch fails, and its threads boot afresh) */
  for (;;)
    yield_to_scheduler(f);
}

uint64_t lt_emu_shuffle(unsigned mask, uint64_t bits, unsigned src_lane) {
  fiber *f = current;
  f->shuffle_mask = mask;
  f->shuffle_src = src_lane;
  f->shuffle_value = bits;
  f->exchange_bytes = 0;
  f->state = AT_SHUFFLE;
  yield_to_scheduler(f);
  return f->shuffle_result;
}

void lt_emu_warp_exchange(unsigned mask, const void *mine, void *all, size_t bytes) {
  fiber *f = current;
  f->shuffle_mask = mask;
  f->shuffle_src = f->t.lane;
  f->exchange_in = mine;
  f->exchange_out = all;
  f->exchange_bytes = bytes;
  f->state = AT_SHUFFLE;
  yield_to_scheduler(f);
  f->exchange_bytes = 0;
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
