/*
 * emu_queue.h: the CUDA emulator's stream queues (runtime.cc), for the
 * parts of the emulator that stand in for work the device does in stream
 * order: kernel launches (cuda_emu.h), cuBLASLt's products (cublaslt.cc),
 * cuDNN's graphs (cudnn.cc), NCCL's collectives (nccl.cc) and CUB's sort.
 */
#ifndef LUTRA_TESTS_EMU_EMU_QUEUE_H
#define LUTRA_TESTS_EMU_EMU_QUEUE_H

#include <cuda_runtime.h>

#include <functional>

/* Appends work to stream's queue (stream 0: the default stream). It runs
   after the stream's earlier work, when the host waits for the stream, an
   event recorded after it, or a copy to pageable memory queued after it
   (cudaStreamSynchronize, cudaEventSynchronize, cudaEventQuery after a few
   "not ready" answers, cudaMemcpyAsync to pageable memory, cudaFree), or
   when another stream's work waits for it through an event; not before.
   So host code that reads a result before waiting for it, or changes a
   pinned buffer that queued work still reads, sees the wrong data here as
   it can on a GPU. With LUTRA_EMU_SYNC=1 in the environment, work runs
   when it is queued (a fault then shows at its launch). */
void lt_emu_enqueue(cudaStream_t stream, std::function<void()> work);

/* Runs stream's work queued so far (and what it waits for through events)
   as the host waiting for it does, traced as why ("host waits ..."), for a
   stand-in whose work must meet other processes when it is called: the
   emulated NCCL's ranks exchange at the call (nccl_ranks.cc). A kernel's
   fault stays for the next wait or cudaGetLastError to return. */
void lt_emu_host_waits(cudaStream_t stream, const char *why);

/* With LUTRA_EMU_TRACE=FILE in the environment, appends one line to FILE
   for each piece of work as it is queued (printf's format: what and how
   big, e.g. "kernel name grid block smem" or "memcpy D2H bytes"), after
   the stream's number (0 the default stream, then in order of creation), and
   a line "host waits" where the host waits for a stream or an event. For
   reading what a training step launches and where the host stops for the
   device (tests/emu/README.md). Does nothing without the variable. */
void lt_emu_trace(cudaStream_t stream, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Whether [p, p + bytes) lies inside one block cudaMalloc handed out: for
   the library stand-ins' checks of the pointers they are given. */
extern "C" int lt_emu_device_range(const void *p, size_t bytes);

#endif
