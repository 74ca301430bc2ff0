/*
 * backend.c: which backends this build has and which devices are present:
 * the device-to-backend map, CPU thread counts (OpenMP and OpenBLAS), and the
 * core's lines of the build information `lutra --version` prints
 * (lt_build_info, assembled in host/app/build-info.c: core/build-info.h; the
 * CUDA probe's part is cuda/device.c's).
 */
#include "base/status.h"
#include "core/build-info.h"
#include "core/tensor-impl.h"
#include "cuda/device.h"

#include <omp.h>
#include <time.h>
#include <stdio.h>
#include <string.h>

/* OpenBLAS's own thread control (declared here to avoid its config header). */
void openblas_set_num_threads(int num_threads);

const lt_backend_i *lt_backend_for(lt_device device) {
  if (device == LT_DEVICE_CPU)
    return &lt_backend_cpu;
#ifdef LT_WITH_CUDA
  if (device >= LT_DEVICE_CUDA && device < LT_DEVICE_CUDA + 16)
    return &lt_backend_cuda; /* whether the device exists is checked at its first allocation */
#endif
  return NULL;
}

int lt_has_cuda(void) {
#ifdef LT_WITH_CUDA
  return 1;
#else
  return 0;
#endif
}

double lt_clock(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int lt_num_threads(void) { return omp_get_max_threads(); }

void lt_set_num_threads(int n) {
  if (n < 1)
    n = 1;
  if (n > 1024)
    n = 1024;
  omp_set_num_threads(n);
  openblas_set_num_threads(n);
}

/* OpenBLAS's description of itself ("OpenBLAS 0.3.21 DYNAMIC_ARCH ..."). */
char *openblas_get_config(void);

const char *lt_core_build_info(void) {
  static char buf[2048];
  int n = 0;
  n += snprintf(buf + n, sizeof buf - (size_t)n, "lutra %s\n", lt_version());
  n += snprintf(buf + n, sizeof buf - (size_t)n, "cpu: %s, %d threads\n", openblas_get_config(),
                lt_num_threads());
  n += lt_cuda_build_info(buf + n, sizeof buf - (size_t)n); /* (cuda/device.c) */
  if (n > 0 && buf[n - 1] == '\n')
    buf[n - 1] = 0;
  return buf;
}
