/*
 * matmul.c: batched matrix products through OpenBLAS (cblas_sgemm and
 * cblas_dgemm). Each operand is passed to BLAS as it lies in memory: a unit
 * column stride is "no transpose" with the row stride as leading dimension, a
 * unit row stride is "transpose" with the column stride. The host guarantees
 * one of the two (copying otherwise) and a row-major output.
 *
 * A product with one row, (1, k) x (k, n) (a decoding step's x w^T), or one
 * column, (m, k) x (k, 1), is a matrix-vector product and goes to
 * cblas_sgemv / cblas_dgemv on the matrix as it lies: OpenBLAS 0.3.21's gemm
 * packs the whole matrix into its blocked layout on every call, which for a
 * single row costs more than the product (66% of GPT-2 124M's decoding time
 * on the CPU went to packing; with gemv its 128-token greedy decode went
 * from 11.7 to 24.2 tokens/s, medians of 3 interleaved rounds on 2 shared
 * cores).
 */
#include "cpu.h"

#include <cblas.h>
#include <string.h>

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

/*
 * One matrix-vector product standing for the (m, k) x (k, n) product with m
 * or n equal to 1, operands as operand() describes them (ta, lda, tb, ldb);
 * 0 when neither is 1 (the caller uses gemm).
 */
static int gemv(const lt_matmul_desc *d, CBLAS_TRANSPOSE ta, int64_t lda, CBLAS_TRANSPOSE tb, int64_t ldb,
                const char *A, const char *B, char *C, int64_t ldc) {
  const char *mat, *vec;
  CBLAS_TRANSPOSE t;
  int64_t rows, cols, ld, incx, incy;
  if (d->m == 1) {
    /* c (n) = b^T a: b stored (k, n) row-major (no transpose: gemv with
       transpose) or (n, k) (a Linear's weight: gemv without) */
    mat = B, vec = A, ld = ldb, incy = 1;
    incx = d->k > 1 ? d->a_cs : 1;
    if (tb == CblasNoTrans)
      t = CblasTrans, rows = d->k, cols = d->n;
    else
      t = CblasNoTrans, rows = d->n, cols = d->k;
  } else if (d->n == 1) {
    /* c (m, 1) = a b: a stored (m, k) or, transposed, (k, m) */
    mat = A, vec = B, ld = lda, incy = ldc;
    incx = d->k > 1 ? d->b_rs : 1;
    if (ta == CblasNoTrans)
      t = CblasNoTrans, rows = d->m, cols = d->k;
    else
      t = CblasTrans, rows = d->k, cols = d->m;
  } else
    return 0;
  if (incx < 1)
    return 0;
  /* beta = 0 leaves y to gemv's scaling, which some OpenBLAS versions do as
     y *= 0 (NaN stays NaN): y is a fresh buffer, so zero it first */
  int64_t es = lt_dtype_size(d->dtype), leny = d->m == 1 ? d->n : d->m;
  if (incy == 1)
    memset(C, 0, (size_t)(leny * es));
  else
    for (int64_t i = 0; i < leny; i++)
      memset(C + i * incy * es, 0, (size_t)es);
  if (d->dtype == LT_DTYPE_F32)
    cblas_sgemv(CblasRowMajor, t, (blasint)rows, (blasint)cols, 1.0f, (const float *)mat, (blasint)ld,
                (const float *)vec, (blasint)incx, 0.0f, (float *)C, (blasint)incy);
  else
    cblas_dgemv(CblasRowMajor, t, (blasint)rows, (blasint)cols, 1.0, (const double *)mat, (blasint)ld,
                (const double *)vec, (blasint)incx, 0.0, (double *)C, (blasint)incy);
  return 1;
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
    if (gemv(d, ta, lda, tb, ldb, A, B, C, ldc))
      continue;
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
