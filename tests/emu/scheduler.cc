/*
 * scheduler.cc: the CUDA emulator's scheduler, which runs a kernel launch's
 * blocks and threads on the CPU (make emu; tests/emu/README.md); the
 * runtime API around it (memory, streams, events) is runtime.cc.
 *
 * A launch runs its blocks one after another (first to last, or
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
 * exited lane). Under ThreadSanitizer (make emu-tsan, LT_EMU_TSAN) block
 * threads and blocks are contexts of the race detector ordered only as on
 * a GPU. The launch configuration is checked against the driver's limits
 * (CUDA C++ Programming Guide, "Compute Capabilities": 1024 threads per
 * block, block z <= 64, grid y and z <= 65535, 48 KiB of dynamic shared
 * memory without opting in).
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

lt_emu_thread *lt_emu_self;
unsigned lt_emu_set;
unsigned lt_emu_async_eager;
uint3 lt_emu_block_idx;
dim3 lt_emu_block_dim, lt_emu_grid_dim;

namespace emu {

unsigned stream_slot;

/* the error of the last launch or call, until cudaGetLastError reads and clears it (a GPU's
   launch failures stay: the emulator's do not) */
cudaError_t last_error = cudaSuccess;
std::string fault_message;

/* a kernel's fault, for the next wait for its stream to return (as a GPU
   reports a kernel's failure where the host waits: the emulator's is not
   sticky) */
cudaError_t async_error = cudaSuccess;

run_stats stats;

double now() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void print_stats() {
  fprintf(stderr,
          "lutra CUDA emulator: %llu pieces of work queued (%llu kernel launches), run at %llu waits of the host "
          "and %llu times for a full queue (limit %zu); deepest queue %llu; %.2f s running them\n",
          stats.queued, stats.launches, stats.waits, stats.full, queue_limit(), stats.deepest, stats.running);
}

char *new_stack(size_t bytes) {
  void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED)
    return NULL;
  mprotect(p, 4096, PROT_NONE); /* a guard page: an overflow faults instead of corrupting */
  return (char *)p;
}

void *first_frame(void **top, void (*entry)()) {
  *--top = NULL;           /* entry's return address (it never returns) */
  *--top = (void *)entry;  /* where lt_emu_switch's ret goes */
  for (int i = 0; i < 6; i++)
    *--top = NULL; /* rbp, rbx, r12-r15 */
  return top;
}

#if LT_EMU_TSAN
void tsan_release(void *token) { __tsan_release(token); }
void tsan_acquire(void *token) { __tsan_acquire(token); }
#else
void tsan_release(void *) {}
void tsan_acquire(void *) {}
#endif

} // namespace emu

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

fiber fiber_sets[STREAM_SLOTS][SETS][MAX_THREADS];
fiber *fibers = fiber_sets[0][0]; /* the running block's set */
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

/* the message of a launch that fails (fault_message) */
void fault(const char *fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  fault_message = buf;
}

} // namespace

#if !defined(__x86_64__)
#error "the CUDA emulator's fiber switch is written for x86-64 (tests/emu/scheduler.cc)"
#endif

/* lt_emu_switch (emu_runtime.h) */
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
void *scheduler_tsan;
void tsan_to(fiber *f) { __tsan_switch_to_fiber(f ? f->tsan : scheduler_tsan, __tsan_switch_to_fiber_no_sync); }
#else
void tsan_to(fiber *) {}
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

