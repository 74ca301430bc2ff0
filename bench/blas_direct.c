/*
 * blas_direct.c: OpenBLAS's cblas_sgemm called straight from C, the yardstick
 * bench/ops.lua prints lutra's matrix products against. Prints one line
 * "n GFLOP/s" per size given (square f32, best of several runs).
 *
 *   build/bench/blas_direct 256 1024 2048
 */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
  for (int i = 1; i < argc; i++) {
    int n = atoi(argv[i]);
    float *a = malloc(sizeof(float) * n * n), *b = malloc(sizeof(float) * n * n),
          *c = malloc(sizeof(float) * n * n);
    for (long j = 0; j < (long)n * n; j++) {
      a[j] = (float)rand() / RAND_MAX - 0.5f;
      b[j] = (float)rand() / RAND_MAX - 0.5f;
    }
    double flops = 2.0 * n * n * n, best = 1e30;
    int reps = n <= 256 ? 200 : n <= 1024 ? 10 : 4;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1, a, n, b, n, 0, c, n);
    for (int r = 0; r < 3; r++) {
      double t0 = now();
      for (int k = 0; k < reps; k++)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1, a, n, b, n, 0, c, n);
      double t = (now() - t0) / reps;
      if (t < best)
        best = t;
    }
    printf("%d %.2f\n", n, flops / best * 1e-9);
    free(a);
    free(b);
    free(c);
  }
  return 0;
}
