/*
 * rope.cu: rotary position embeddings (Su et al. 2021) in the Hugging Face
 * half-split layout on the GPU, as kernels/cpu/rope.c: the angles in f64,
 * the rotation in the rows' compute type (rows.cuh); the backward is the
 * rotation by the opposite angle. A thread per rotated pair.
 */
#include "rows.cuh"

static const int THREADS = 256;

/* Rows of D elements as S computed in A; the angles in f64 (as the CPU's) */
template <typename S, typename A>
__global__ void rope_kernel(const S *x, S *y, int64_t R, int64_t Tn, int64_t D, double base, int64_t start,
                            double sign, lt_rope_scaling sc) {
  int64_t h = D / 2;
  LT_GRID_STRIDE(e, R * Tn * h) {
    int64_t i = e % h, rt = e / h, t = rt % Tn;
    double ang = lt_rope_angle(start + t, i, D, base, sc); /* (shared/scalar.h) */
    A c = (A)cos(ang), s = (A)(sign * sin(ang));
    const S *xr = x + rt * D;
    S *yr = y + rt * D;
    A a = lt_ld(xr, i), b = lt_ld(xr, i + h);
    lt_st(yr, i, a * c - b * s);
    lt_st(yr, i + h, b * c + a * s);
  }
}

/* ---- launchers ------------------------------------------------------------------ */

template <typename S, typename A>
static void rope_launch(const void *x, void *y, int64_t R, int64_t Tn, int64_t D, double base, int64_t start,
                        double sign, lt_rope_scaling sc, cudaStream_t cs) {
  rope_kernel<S, A><<<lt_cuda_blocks(R * Tn * (D / 2), THREADS), THREADS, 0, cs>>>((const S *)x, (S *)y, R, Tn, D,
                                                                                 base, start, sign, sc);
}

extern "C" lt_status lt_cuda_rope(lt_dtype dt, const void *x, void *y, int64_t R, int64_t Tn, int64_t D, double base,
                                  int64_t start, int inverse, const lt_rope_scaling *scaling, lt_cuda_stream s) {
  int64_t n = R * Tn * (D / 2);
  if (n == 0)
    return LT_OK;
  lt_rope_scaling sc = {LT_ROPE_PLAIN, 1, 1, 1, 1};
  if (scaling)
    sc = *scaling;
  DISPATCH_ROWS(dt, rope_launch, x, y, R, Tn, D, base, start, inverse ? -1.0 : 1.0, sc, (cudaStream_t)s);
  return lt_cuda_check_launch("rope_kernel");
}
