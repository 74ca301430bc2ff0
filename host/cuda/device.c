/*
 * cuda/device.c: the CUDA probe (cuda/device.h): how many devices the CUDA
 * runtime sees, and why none (no driver, CUDA not compiled in), which the
 * backend asks before it starts a device and `lutra --version` and lt.cuda
 * report; and the CUDA part of the build information. A build without
 * CUDA (CUDA=0) finds no device.
 */
#include "cuda/device.h"
#include "lutra.h"

#include <stdio.h>

#ifdef LT_WITH_CUDA
#include <cuda_runtime_api.h>

int lt_cuda_device_count(const char **why) {
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
}

int lt_cuda_build_info(char *buf, size_t cap) {
  int n = 0;
  int rt = 0, drv = 0;
  cudaRuntimeGetVersion(&rt);
  cudaDriverGetVersion(&drv);
  const char *why = "";
  int count = lt_cuda_device_count(&why);
  char drvs[32] = "none";
  if (drv)
    snprintf(drvs, sizeof drvs, "%d.%d", drv / 1000, drv % 1000 / 10);
  n += snprintf(buf + n, cap - (size_t)n, "cuda: compiled in (runtime %d.%d, driver %s), %d device%s found%s%s\n",
                rt / 1000, rt % 1000 / 10, drvs, count, count == 1 ? "" : "s", count ? "" : ": ", count ? "" : why);
  for (int i = 0; i < count && n < (int)cap - 200; i++) {
    struct cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, i) == cudaSuccess)
      n += snprintf(buf + n, cap - (size_t)n, "  cuda:%d %s, sm_%d%d, %.1f GiB\n", i, prop.name, prop.major,
                    prop.minor, (double)prop.totalGlobalMem / (1 << 30));
  }
  return n;
}

#else /* no CUDA in this build */

int lt_cuda_device_count(const char **why) {
  if (why)
    *why = "CUDA not compiled in (built with CUDA=0)";
  return 0;
}

int lt_cuda_build_info(char *buf, size_t cap) { return snprintf(buf, cap, "cuda: not compiled in (CUDA=0)\n"); }

#endif
