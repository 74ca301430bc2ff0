/*
 * test_tensor.c: the tensor core through its C API: views share storage and
 * compute the right strides, reference counts free storages, errors name
 * the op and shapes, the caching allocator reuses blocks, and kernels on
 * sizes large enough for the threaded paths agree with naive loops.
 */
#include "check.h"
#include "lutra.h"
#include "core/tensor-impl.h"

#include <omp.h>
#include <stdlib.h>

static lt_tensor *arange(int64_t n, lt_dtype dt) {
  lt_tensor *t = NULL;
  lt_tensor_arange(0, (double)n, 1, dt, LT_DEVICE_CPU, &t);
  return t;
}

static lt_tensor *reshaped(lt_tensor *t, int ndim, const int64_t *sizes) {
  lt_tensor *r = NULL;
  lt_tensor_view(t, ndim, sizes, &r);
  lt_tensor_release(t);
  return r;
}

static double at(lt_tensor *t, int64_t flat) {
  int64_t n = lt_tensor_numel(t);
  double *v = malloc(sizeof(double) * (size_t)n);
  lt_tensor_to_f64(t, v, n);
  double x = v[flat];
  free(v);
  return x;
}

TEST(views_share_storage_and_strides) {
  lt_tensor *t = reshaped(arange(24, LT_DTYPE_F32), 3, (int64_t[]){2, 3, 4});
  lt_tensor *tr, *n, *s, *e, *u, *sq, *p;
  CHECK_OK(lt_tensor_transpose(t, 0, 2, &tr));
  CHECK(lt_tensor_size(tr, 0) == 4 && lt_tensor_stride(tr, 0) == 1 && lt_tensor_stride(tr, 2) == 12);
  CHECK(lt_tensor_same_storage(t, tr));
  CHECK(!lt_tensor_is_contiguous(tr));
  CHECK_OK(lt_tensor_narrow(t, 2, 1, 2, &n));
  CHECK(lt_tensor_offset(n) == 1 && lt_tensor_size(n, 2) == 2);
  CHECK_NEAR(at(n, 0), 1, 0);
  CHECK_NEAR(at(n, 2), 5, 0);
  CHECK_OK(lt_tensor_select(t, 1, 2, &s));
  CHECK(lt_tensor_ndim(s) == 2 && lt_tensor_offset(s) == 8);
  CHECK_NEAR(at(s, 4), 20, 0);
  CHECK_OK(lt_tensor_unsqueeze(t, 1, &u));
  CHECK(lt_tensor_ndim(u) == 4 && lt_tensor_size(u, 1) == 1);
  CHECK_OK(lt_tensor_squeeze(u, -1, &sq));
  CHECK(lt_tensor_ndim(sq) == 3);
  CHECK_OK(lt_tensor_expand(s, 3, (int64_t[]){5, 2, 4}, &e));
  CHECK(lt_tensor_stride(e, 0) == 0 && lt_tensor_numel(e) == 40);
  CHECK_OK(lt_tensor_permute(t, 3, (int64_t[]){2, 0, 1}, &p));
  CHECK(lt_tensor_size(p, 0) == 4 && lt_tensor_stride(p, 1) == 12);
  /* writing through a view changes the base */
  CHECK_OK(lt_tensor_fill_(n, -1));
  CHECK_NEAR(at(t, 1), -1, 0);
  CHECK_NEAR(at(t, 0), 0, 0);
  lt_tensor *views[] = {tr, n, s, e, u, sq, p};
  for (int i = 0; i < 7; i++)
    lt_tensor_release(views[i]);
  lt_tensor_release(t);
}

TEST(view_rules) {
  lt_tensor *t = reshaped(arange(24, LT_DTYPE_F32), 3, (int64_t[]){2, 3, 4}), *v, *tr;
  CHECK_OK(lt_tensor_view(t, 2, (int64_t[]){6, -1}, &v));
  CHECK(lt_tensor_size(v, 1) == 4);
  lt_tensor_release(v);
  CHECK_OK(lt_tensor_transpose(t, 1, 2, &tr)); /* (2, 4, 3) with strides (12, 1, 4) */
  /* merging dim 0 alone with a split is fine; flattening the transposed dims is not */
  CHECK_OK(lt_tensor_view(tr, 4, (int64_t[]){2, 1, 4, 3}, &v));
  lt_tensor_release(v);
  CHECK(lt_tensor_view(tr, 1, (int64_t[]){24}, &v) == LT_ERR_SHAPE);
  CHECK(strstr(lt_last_error(), "view") && strstr(lt_last_error(), "[2, 4, 3]"));
  CHECK_OK(lt_tensor_reshape(tr, 1, (int64_t[]){24}, &v)); /* copies */
  CHECK(!lt_tensor_same_storage(v, tr));
  CHECK_NEAR(at(v, 1), 4, 0);
  lt_tensor_release(v);
  CHECK(lt_tensor_view(t, 2, (int64_t[]){5, -1}, &v) == LT_ERR_SHAPE);
  CHECK(lt_tensor_view(t, 2, (int64_t[]){-1, -1}, &v) == LT_ERR_SHAPE);
  lt_tensor_release(tr);
  lt_tensor_release(t);
}

TEST(errors_name_op_and_shapes) {
  lt_tensor *a, *b, *r;
  CHECK_OK(lt_tensor_full(2, (int64_t[]){2, 3}, 1, LT_DTYPE_F32, LT_DEVICE_CPU, &a));
  CHECK_OK(lt_tensor_full(2, (int64_t[]){4, 5}, 1, LT_DTYPE_F32, LT_DEVICE_CPU, &b));
  CHECK(lt_matmul(a, b, &r) == LT_ERR_SHAPE);
  CHECK(strstr(lt_last_error(), "matmul") && strstr(lt_last_error(), "[2, 3]") &&
        strstr(lt_last_error(), "[4, 5]"));
  CHECK(lt_binary(LT_BINARY_ADD, a, b, NULL, &r) == LT_ERR_SHAPE);
  CHECK(strstr(lt_last_error(), "add"));
  CHECK(lt_tensor_transpose(a, 0, 2, &r) == LT_ERR_ARG);
  CHECK(lt_tensor_empty(1, (int64_t[]){-1}, LT_DTYPE_F32, LT_DEVICE_CPU, &r) == LT_ERR_SHAPE);
  CHECK(lt_tensor_empty(9, (int64_t[]){1, 1, 1, 1, 1, 1, 1, 1, 1}, LT_DTYPE_F32, LT_DEVICE_CPU, &r) ==
        LT_ERR_SHAPE);
  if (lt_cuda_device_count(NULL) == 0) /* without a device (or CUDA), a cuda tensor is refused */
    CHECK(lt_tensor_empty(1, (int64_t[]){1}, LT_DTYPE_F32, LT_DEVICE_CUDA, &r) == LT_ERR_DEVICE);
  CHECK(lt_tensor_empty(1, (int64_t[]){1}, LT_DTYPE_F32, LT_DEVICE_CUDA + 15, &r) == LT_ERR_DEVICE);
  CHECK(lt_tensor_narrow(a, 1, 2, 2, &r) == LT_ERR_ARG);
  CHECK(lt_tensor_select(a, 0, 2, &r) == LT_ERR_ARG);
  lt_dtype d;
  CHECK(lt_dtype_parse("float128", &d) == LT_ERR_DTYPE && strstr(lt_last_error(), "float128"));
  lt_tensor *idx;
  CHECK_OK(lt_tensor_from_f64((double[]){0, 7}, 1, (int64_t[]){2}, LT_DTYPE_I64, LT_DEVICE_CPU, &idx));
  CHECK(lt_index_select(a, 1, idx, &r) == LT_ERR_ARG);
  CHECK_MSG(strstr(lt_last_error(), "index 7") != NULL, "%s", lt_last_error());
  lt_tensor_release(idx);
  lt_tensor_release(a);
  lt_tensor_release(b);
}

TEST(allocator_reuses_blocks) {
  int64_t live0, res0, peak0, live1, res1, peak1;
  lt_tensor *t;
  int64_t n = 1 << 20;
  CHECK_OK(lt_tensor_empty(1, &n, LT_DTYPE_F32, LT_DEVICE_CPU, &t));
  void *p = lt_tensor_data(t);
  lt_cpu_memory_stats(&live0, &res0, &peak0);
  CHECK(live0 >= 4 << 20);
  lt_tensor_release(t);
  lt_cpu_memory_stats(&live1, &res1, &peak1);
  CHECK(live1 == live0 - (4 << 20));
  CHECK(peak1 >= live0);
  CHECK_OK(lt_tensor_empty(1, &n, LT_DTYPE_F32, LT_DEVICE_CPU, &t));
  if (getenv("LUTRA_CPU_CACHE_MB") == NULL)
    CHECK(lt_tensor_data(t) == p); /* the cached block comes back */
  lt_tensor_release(t);
  lt_cpu_empty_cache();
  lt_cpu_memory_stats(&live1, &res1, &peak1);
  CHECK(res1 == live1);
}

/* Large enough for the threaded paths; compared with plain loops. */
TEST(threaded_elementwise_and_copy) {
  const int64_t R = 300, Cn = 517;
  lt_tensor *a = reshaped(arange(R * Cn, LT_DTYPE_F32), 2, (int64_t[]){R, Cn}), *b, *bt, *r, *c;
  lt_generator *g;
  CHECK_OK(lt_generator_new(3, &g));
  CHECK_OK(lt_tensor_empty(2, (int64_t[]){Cn, R}, LT_DTYPE_F32, LT_DEVICE_CPU, &b));
  CHECK_OK(lt_tensor_normal_(b, g, 0, 1));
  CHECK_OK(lt_tensor_transpose(b, 0, 1, &bt));
  CHECK_OK(lt_binary(LT_BINARY_MUL, a, bt, NULL, &r));
  const float *pa = lt_tensor_data(a), *pb = lt_tensor_data(b), *pr = lt_tensor_data(r);
  int bad = 0;
  for (int64_t i = 0; i < R; i++)
    for (int64_t j = 0; j < Cn; j++)
      bad += pr[i * Cn + j] != pa[i * Cn + j] * pb[j * R + i];
  CHECK_MSG(bad == 0, "%d wrong", bad);
  CHECK_OK(lt_tensor_to(bt, LT_DTYPE_BF16, LT_DEVICE_CPU, &c));
  const uint16_t *pc = lt_tensor_data(c);
  bad = 0;
  for (int64_t i = 0; i < R; i++)
    for (int64_t j = 0; j < Cn; j++) {
      float x = pb[j * R + i];
      uint32_t u;
      memcpy(&u, &x, 4);
      uint16_t want = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
      bad += pc[i * Cn + j] != want;
    }
  CHECK_MSG(bad == 0, "%d wrong", bad);
  lt_tensor_release(a);
  lt_tensor_release(b);
  lt_tensor_release(bt);
  lt_tensor_release(r);
  lt_tensor_release(c);
  lt_generator_release(g);
}

TEST(reductions_do_not_depend_on_threads) {
  lt_generator *g;
  lt_tensor *x;
  CHECK_OK(lt_generator_new(11, &g));
  CHECK_OK(lt_tensor_empty(2, (int64_t[]){3, 400000}, LT_DTYPE_F32, LT_DEVICE_CPU, &x));
  CHECK_OK(lt_tensor_normal_(x, g, 0.5, 2));
  double sums[2][3], total[2], vars[2];
  int nthreads[2] = {1, 2};
  int saved = omp_get_max_threads();
  for (int k = 0; k < 2; k++) {
    omp_set_num_threads(nthreads[k]);
    lt_tensor *s, *all, *v;
    CHECK_OK(lt_reduce(LT_REDUCE_SUM, x, 1, (int64_t[]){1}, 0, 0, &s));
    CHECK_OK(lt_reduce(LT_REDUCE_SUM, x, 0, NULL, 0, 0, &all));
    CHECK_OK(lt_reduce(LT_REDUCE_VAR, x, 0, NULL, 0, 1, &v));
    for (int i = 0; i < 3; i++)
      sums[k][i] = ((float *)lt_tensor_data(s))[i];
    total[k] = *(float *)lt_tensor_data(all);
    vars[k] = *(float *)lt_tensor_data(v);
    lt_tensor_release(s);
    lt_tensor_release(all);
    lt_tensor_release(v);
  }
  omp_set_num_threads(saved);
  for (int i = 0; i < 3; i++)
    CHECK(sums[0][i] == sums[1][i]);
  CHECK(total[0] == total[1]);
  CHECK(vars[0] == vars[1]);
  /* against a plain f64 loop */
  const float *p = lt_tensor_data(x);
  double ref = 0, ref_sq = 0;
  for (int64_t i = 0; i < 1200000; i++)
    ref += p[i];
  double mean = ref / 1200000;
  for (int64_t i = 0; i < 1200000; i++)
    ref_sq += (p[i] - mean) * (p[i] - mean);
  CHECK_NEAR(total[0], ref, fabs(ref) * 1e-6 + 1e-3);
  CHECK_NEAR(vars[0], ref_sq / (1200000 - 1), 1e-5 * vars[0]);
  CHECK_NEAR(vars[0], 4.0, 0.05); /* normal(0.5, 2) */
  lt_tensor_release(x);
  lt_generator_release(g);
}

/* Batched, broadcast and transposed products against a triple loop in f64. */
TEST(matmul_against_naive) {
  lt_generator *g;
  CHECK_OK(lt_generator_new(5, &g));
  lt_tensor *a, *b, *bt, *c;
  const int64_t B = 3, M = 37, K = 65, N = 29;
  CHECK_OK(lt_tensor_empty(3, (int64_t[]){B, M, K}, LT_DTYPE_F64, LT_DEVICE_CPU, &a));
  CHECK_OK(lt_tensor_empty(2, (int64_t[]){N, K}, LT_DTYPE_F64, LT_DEVICE_CPU, &b));
  CHECK_OK(lt_tensor_normal_(a, g, 0, 1));
  CHECK_OK(lt_tensor_normal_(b, g, 0, 1));
  CHECK_OK(lt_tensor_transpose(b, 0, 1, &bt)); /* (K, N), column-major */
  CHECK_OK(lt_matmul(a, bt, &c));
  CHECK(lt_tensor_ndim(c) == 3 && lt_tensor_size(c, 0) == B && lt_tensor_size(c, 2) == N);
  const double *pa = lt_tensor_data(a), *pb = lt_tensor_data(b), *pc = lt_tensor_data(c);
  double maxerr = 0;
  for (int64_t z = 0; z < B; z++)
    for (int64_t i = 0; i < M; i++)
      for (int64_t j = 0; j < N; j++) {
        double s = 0;
        for (int64_t k = 0; k < K; k++)
          s += pa[(z * M + i) * K + k] * pb[j * K + k];
        double e = fabs(s - pc[(z * M + i) * N + j]);
        if (e > maxerr)
          maxerr = e;
      }
  CHECK_MSG(maxerr < 1e-12, "max error %g", maxerr);
  lt_tensor_release(a);
  lt_tensor_release(b);
  lt_tensor_release(bt);
  lt_tensor_release(c);
  lt_generator_release(g);
}

TEST(index_ops_threaded) {
  /* embedding-like lookup and its backward scatter, large enough for threads */
  const int64_t V = 50, C = 700, T = 300;
  lt_tensor *w = reshaped(arange(V * C, LT_DTYPE_F32), 2, (int64_t[]){V, C}), *ids, *out, *gw;
  double *idv = malloc(sizeof(double) * T);
  for (int64_t i = 0; i < T; i++)
    idv[i] = (double)((i * 7) % V);
  CHECK_OK(lt_tensor_from_f64(idv, 1, (int64_t[]){T}, LT_DTYPE_I32, LT_DEVICE_CPU, &ids));
  CHECK_OK(lt_index_select(w, 0, ids, &out));
  const float *po = lt_tensor_data(out);
  int bad = 0;
  for (int64_t i = 0; i < T; i++)
    for (int64_t j = 0; j < C; j++)
      bad += po[i * C + j] != (float)(idv[i] * C + j);
  CHECK(bad == 0);
  CHECK_OK(lt_tensor_full(2, (int64_t[]){V, C}, 0, LT_DTYPE_F32, LT_DEVICE_CPU, &gw));
  CHECK_OK(lt_index_add_(gw, 0, ids, out));
  const float *pg = lt_tensor_data(gw);
  bad = 0;
  for (int64_t v = 0; v < V; v++) {
    int64_t count = 0;
    for (int64_t i = 0; i < T; i++)
      count += (int64_t)idv[i] == v;
    for (int64_t j = 0; j < C; j++)
      bad += pg[v * C + j] != (float)(count * (v * C + j));
  }
  CHECK(bad == 0);
  free(idv);
  lt_tensor_release(w);
  lt_tensor_release(ids);
  lt_tensor_release(out);
  lt_tensor_release(gw);
}

TEST(nil_and_freed_tensors_are_refused) {
  lt_tensor *r = NULL, *t;
  CHECK(lt_unary(LT_UNARY_EXP, NULL, NULL, &r) == LT_ERR_ARG);
  CHECK(strstr(lt_last_error(), "nil") != NULL);
  CHECK(lt_tensor_view(NULL, 1, (int64_t[]){1}, &r) == LT_ERR_ARG);
  CHECK(lt_tensor_narrow(NULL, 0, 0, 1, &r) == LT_ERR_ARG);
  CHECK(lt_tensor_copy_(NULL, NULL) == LT_ERR_ARG);
  CHECK(lt_tensor_ndim(NULL) == 0 && lt_tensor_numel(NULL) == 0 && lt_tensor_data(NULL) == NULL);
  CHECK_OK(lt_tensor_full(1, (int64_t[]){4}, 1, LT_DTYPE_F32, LT_DEVICE_CPU, &t));
  lt_tensor *v;
  CHECK_OK(lt_tensor_view(t, 2, (int64_t[]){2, 2}, &v));
  lt_tensor_free_data(v); /* v is the only holder of its header: its storage reference goes */
  CHECK(lt_reduce(LT_REDUCE_SUM, v, 0, NULL, 0, 0, &r) == LT_ERR_ARG);
  CHECK(strstr(lt_last_error(), "freed") != NULL);
  double s = 0;
  lt_tensor *sum;
  CHECK_OK(lt_reduce(LT_REDUCE_SUM, t, 0, NULL, 0, 0, &sum)); /* t still owns the data */
  CHECK_OK(lt_tensor_item(sum, &s));
  CHECK_NEAR(s, 4, 0);
  lt_tensor_retain(t);
  lt_tensor_free_data(t); /* held twice: nothing is freed */
  CHECK_OK(lt_tensor_item(sum, &s));
  CHECK(lt_tensor_numel(t) == 4);
  lt_tensor_release(t);
  lt_tensor_release(t);
  lt_tensor_release(v);
  lt_tensor_release(sum);
}

TEST(overflowing_shapes) {
  lt_tensor *t, *r;
  CHECK_OK(lt_tensor_full(2, (int64_t[]){1, 1}, 0, LT_DTYPE_F32, LT_DEVICE_CPU, &t));
  CHECK(lt_tensor_expand(t, 2, (int64_t[]){1ll << 32, 1ll << 32}, &r) == LT_ERR_SHAPE);
  CHECK(lt_tensor_narrow(t, 0, INT64_MAX - 1, 2, &r) == LT_ERR_ARG);
  CHECK(lt_tensor_view(t, 3, (int64_t[]){1ll << 40, 1ll << 40, 0}, &r) == LT_ERR_SHAPE);
  lt_tensor_release(t);
}

RUN_TESTS()
