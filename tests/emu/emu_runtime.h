/*
 * emu_runtime.h: what the CUDA emulator's scheduler (scheduler.cc: fibers,
 * blocks, launches, shared memory, warp exchanges) and its runtime API
 * (runtime.cc: device memory, streams, events, errors) share: the error
 * state a launch leaves for cudaGetLastError and the next wait, the
 * statistics LUTRA_EMU_STATS=1 prints, the fibers' stacks and switch, and
 * what ThreadSanitizer is told (make emu-tsan).
 */
#ifndef LUTRA_TESTS_EMU_RUNTIME_H
#define LUTRA_TESTS_EMU_RUNTIME_H

#include "cuda_emu.h"

#include <string>

namespace emu {

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
/* the fibers of the stream whose work runs (one set without ThreadSanitizer) */
extern unsigned stream_slot;

/* the error of the last launch or call, until cudaGetLastError reads and clears it (a GPU's
   launch failures stay: the emulator's do not) */
extern cudaError_t last_error;
extern std::string fault_message;

/* a kernel's fault, for the next wait for its stream to return (as a GPU
   reports a kernel's failure where the host waits: the emulator's is not
   sticky) */
extern cudaError_t async_error;

/* what LUTRA_EMU_STATS=1 prints at exit (print_stats) */
struct run_stats {
  unsigned long long launches, queued, waits, full, deepest;
  double running; /* seconds running queued work */
};
extern run_stats stats;
void print_stats();
/* the host's clock, in seconds */
double now();
/* how many pieces of work a stream holds before the oldest runs (LUTRA_EMU_QUEUE_LIMIT; 1024) */
size_t queue_limit();

/* A stack of bytes (reserved, not committed, a guard page at its end), or NULL. */
char *new_stack(size_t bytes);
/* The stack pointer of a stack ending at top (16-byte aligned) whose first
   switch "returns" into entry. */
void *first_frame(void **top, void (*entry)());
/* make emu-tsan: a release or acquire of token for the race detector (nothing otherwise) */
void tsan_release(void *token);
void tsan_acquire(void *token);

} // namespace emu

/* lt_emu_switch(&save, to): saves the callee-saved registers on this stack,
   stores the stack pointer in save, and continues on the stack to (System V
   x86-64: rbx, rbp, r12-r15 are callee-saved; a switch is a call). */
extern "C" void lt_emu_switch(void **save, void *to);

#endif
