/*
 * test_cuda_errors.c: the messages of CUDA errors (host/cuda/backend.c's
 * lt_cuda_error_at, with host/cuda/libraries.c's note), without a GPU: an
 * error that loses the process's CUDA context (an illegal address, a
 * kernel's fault or assert) says so and how to find the kernel; an
 * ordinary one (a bad argument) does not; running out of memory is
 * LT_ERR_OOM. Nothing to check without CUDA.
 */
#include "check.h"

#ifdef LT_WITH_CUDA
#include "cuda/backend.h"

TEST(sticky_errors_say_the_context_is_lost) {
  const cudaError_t sticky[] = {cudaErrorIllegalAddress, cudaErrorLaunchFailure, cudaErrorAssert,
                                cudaErrorMisalignedAddress, cudaErrorIllegalInstruction};
  for (size_t i = 0; i < sizeof sticky / sizeof *sticky; i++) {
    lt_status st = lt_cuda_error("waiting for the compute stream", 0, sticky[i]);
    CHECK(st == LT_ERR_DEVICE);
    const char *msg = lt_last_error();
    CHECK_MSG(strstr(msg, "cuda:0: waiting for the compute stream: ") == msg, "%s", msg);
    CHECK_MSG(strstr(msg, cudaGetErrorName(sticky[i])) != NULL, "%s", msg);
    /* the note of the build's cuda/libraries.c (the emulator's: tests/emu/libraries.c) ends the message */
    const char *note = lt_cuda_fault_note();
    CHECK_MSG(strlen(msg) >= strlen(note) && strcmp(msg + strlen(msg) - strlen(note), note) == 0, "%s", msg);
#ifdef LT_CUDA_EMU /* (the Makefile tells the C tests of an emulator build, EMU=1) */
    CHECK_MSG(strstr(msg, "on a GPU this loses the CUDA context") != NULL, "%s", msg);
#else
    CHECK_MSG(strstr(msg, "CUDA context is lost") && strstr(msg, "CUDA_LAUNCH_BLOCKING=1"), "%s", msg);
#endif
  }
}

TEST(other_errors_carry_no_note) {
  lt_status st = lt_cuda_error("copying to the host", 1, cudaErrorInvalidValue);
  CHECK(st == LT_ERR_DEVICE);
  CHECK_MSG(strstr(lt_last_error(), "context") == NULL, "%s", lt_last_error());
  CHECK_MSG(strstr(lt_last_error(), "cuda:1: copying to the host: ") == lt_last_error(), "%s", lt_last_error());
  CHECK(lt_cuda_error("allocating", 0, cudaErrorMemoryAllocation) == LT_ERR_OOM);
  CHECK(lt_cuda_error_note(cudaSuccess)[0] == '\0');
}
#endif

RUN_TESTS()
