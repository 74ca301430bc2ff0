/*
 * matmul.c: batched matrix products through OpenBLAS (cblas_sgemm and
 * cblas_dgemm). Each operand is passed to BLAS as it lies in memory: a unit
 * column stride is "no transpose" with the row stride as leading dimension, a
 * unit row stride is "transpose" with the column stride. The host guarantees
 * one of the two (copying otherwise) and a row-major output.
 */
#include "cpu.h"

#include <cblas.h>

static void operand(int64_t rows, int64_t cols, int64_t rs, int64_t cs, CBLAS_TRANSPOSE *trans,
                    int64_t *ld) {
  if (cs == 1 || cols == 1) {
    *trans = CblasNoTrans;
    *ld = rs > cols ? rs : cols;
    if (rows == 1)
      *ld = cols > 0 ? cols : 1;
  } else {
    *trans = CblasTrans;
    *ld = cs > rows ? cs : rows;
  }
  if (*ld < 1)
    *ld = 1;
}

lt_status lt_cpu_matmul(const lt_matmul_desc *d) {
  CBLAS_TRANSPOSE ta, tb;
  int64_t lda, ldb;
  operand(d->m, d->k, d->a_rs, d->a_cs, &ta, &lda);
  operand(d->k, d->n, d->b_rs, d->b_cs, &tb, &ldb);
  int64_t nbatch = 1;
  for (int i = 0; i < d->nbatch_dims; i++)
    nbatch *= d->batch_shape[i];
  int64_t es = lt_dtype_size(d->dtype);
  int64_t ldc = d->c_rs > d->n ? d->c_rs : (d->n > 0 ? d->n : 1);
  for (int64_t b = 0; b < nbatch; b++) {
    int64_t ao = 0, bo = 0, co = 0, rem = b;
    for (int i = d->nbatch_dims - 1; i >= 0; i--) {
      int64_t idx = rem % d->batch_shape[i];
      rem /= d->batch_shape[i];
      ao += idx * d->a_batch_strides[i];
      bo += idx * d->b_batch_strides[i];
      co += idx * d->c_batch_strides[i];
    }
    const char *A = d->a + ao * es, *B = d->b + bo * es;
    char *C = d->c + co * es;
    if (d->dtype == LT_DTYPE_F32)
      cblas_sgemm(CblasRowMajor, ta, tb, (blasint)d->m, (blasint)d->n, (blasint)d->k, 1.0f,
                  (const float *)A, (blasint)lda, (const float *)B, (blasint)ldb, 0.0f, (float *)C,
                  (blasint)ldc);
    else
      cblas_dgemm(CblasRowMajor, ta, tb, (blasint)d->m, (blasint)d->n, (blasint)d->k, 1.0,
                  (const double *)A, (blasint)lda, (const double *)B, (blasint)ldb, 0.0,
                  (double *)C, (blasint)ldc);
  }
  return LT_OK;
}
