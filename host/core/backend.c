/*
 * backend.c: which backends this build has and which devices are present:
 * the device-to-backend map, CPU thread counts (OpenMP and OpenBLAS), and the
 * CUDA probe that `lutra --version` and lt.cuda report (core's lines of
 * lt_build_info: core/build-info.h).
 */
#include "base/status.h"
#include "core/build-info.h"
#include "core/tensor-impl.h"

#include <omp.h>
#include <time.h>
#include <stdio.h>
#include <string.h>

#ifdef LT_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

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

int lt_cuda_device_count(const char **why) {
#ifdef LT_WITH_CUDA
  int n = 0, driver = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    cudaDriverGetVersion(&driver);
    if (why) /* the runtime reports a missing libcuda as an old driver */
      *why = driver == 0 ? "no NVIDIA driver found" : cudaGetErrorString(err);
    cudaGetLastError(); /* clear the sticky error for later calls */
    return 0;
  }
  if (why)
    *why = n ? "" : "no CUDA device";
  return n;
#else
  if (why)
    *why = "CUDA not compiled in (built with CUDA=0)";
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
#ifdef LT_WITH_CUDA
  int rt = 0, drv = 0;
  cudaRuntimeGetVersion(&rt);
  cudaDriverGetVersion(&drv);
  const char *why = "";
  int count = lt_cuda_device_count(&why);
  char drvs[32] = "none";
  if (drv)
    snprintf(drvs, sizeof drvs, "%d.%d", drv / 1000, drv % 1000 / 10);
  n += snprintf(buf + n, sizeof buf - (size_t)n,
                "cuda: compiled in (runtime %d.%d, driver %s), %d device%s found%s%s\n", rt / 1000,
                rt % 1000 / 10, drvs, count, count == 1 ? "" : "s", count ? "" : ": ",
                count ? "" : why);
  for (int i = 0; i < count && n < (int)sizeof buf - 200; i++) {
    struct cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, i) == cudaSuccess)
      n += snprintf(buf + n, sizeof buf - (size_t)n, "  cuda:%d %s, sm_%d%d, %.1f GiB\n", i, prop.name,
                    prop.major, prop.minor, (double)prop.totalGlobalMem / (1 << 30));
  }
#else
  n += snprintf(buf + n, sizeof buf - (size_t)n, "cuda: not compiled in (CUDA=0)\n");
#endif
  if (n > 0 && buf[n - 1] == '\n')
    buf[n - 1] = 0;
  return buf;
}
