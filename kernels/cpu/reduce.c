/*
 * reduce.c: sum, mean, max, min, argmax, argmin and var over the reduced dims
 * of an lt_reduce_iter. Floats accumulate in f64, integers in i64. The reduced
 * extent of each output is cut into fixed blocks whose partial results are
 * combined in order, so the result does not depend on the number of threads:
 * threads take outputs when there are many, blocks of one output when few.
 */
#include "cpu.h"

#include <math.h>
#include <omp.h>

enum { MAX_PARTIALS = 4096, MIN_BLOCK = 8192 };

typedef struct {
  double sum;   /* SUM/MEAN of floats; VAR: sum of squared deviations */
  int64_t isum; /* SUM of integers */
  double val;   /* MAX/MIN/ARG* of floats */
  int64_t ival; /* MAX/MIN/ARG* of integers */
  int64_t idx;  /* ARG*: flattened position in the reduced extent */
  int has;      /* whether val/ival hold an element yet */
} partial;

/* Loads reduced elements r0 .. r0+n-1 (flattened) of the input at base. */
static void load_range(const lt_reduce_iter *it, const char *base, int64_t r0, int64_t n,
                       lt_compute ck, void *buf) {
  int last = it->nred - 1;
  int64_t inner = it->red_shape[last], istride = it->in_red_strides[last];
  int64_t es = lt_dtype_size(it->in_dtype), kes = 8;
  int64_t row = r0 / inner, col = r0 % inner;
  while (n > 0) {
    int64_t off = 0, rr = row;
    for (int d = last - 1; d >= 0; d--) {
      off += (rr % it->red_shape[d]) * it->in_red_strides[d];
      rr /= it->red_shape[d];
    }
    int64_t take = inner - col < n ? inner - col : n;
    lt_cpu_load(ck, buf, base + (off + col * istride) * es, it->in_dtype, istride, take);
    buf = (char *)buf + take * kes;
    n -= take;
    col = 0;
    row++;
  }
}

static int is_max(lt_reduce_op op) { return op == LT_REDUCE_MAX || op == LT_REDUCE_ARGMAX; }

static void block_partial(lt_reduce_op op, const lt_reduce_iter *it, const char *base, int64_t r0,
                          int64_t n, lt_compute ck, double mean, partial *p) {
  union {
    double f[LT_CPU_CHUNK];
    int64_t i[LT_CPU_CHUNK];
  } buf;
  p->sum = 0;
  p->isum = 0;
  p->has = 0;
  p->idx = 0;
  p->val = 0;
  p->ival = 0;
  for (int64_t c = 0; c < n; c += LT_CPU_CHUNK) {
    int64_t m = n - c < LT_CPU_CHUNK ? n - c : LT_CPU_CHUNK;
    load_range(it, base, r0 + c, m, ck, &buf);
    switch (op) {
    case LT_REDUCE_SUM:
    case LT_REDUCE_MEAN:
      if (ck == LT_COMPUTE_I64)
        for (int64_t i = 0; i < m; i++)
          p->isum = (int64_t)((uint64_t)p->isum + (uint64_t)buf.i[i]);
      else
        for (int64_t i = 0; i < m; i++)
          p->sum += buf.f[i];
      break;
    case LT_REDUCE_VAR:
      for (int64_t i = 0; i < m; i++) {
        double d = buf.f[i] - mean;
        p->sum += d * d;
      }
      break;
    default: {
      int mx = is_max(op);
      if (ck == LT_COMPUTE_I64) {
        for (int64_t i = 0; i < m; i++) {
          int64_t x = buf.i[i];
          if (!p->has || (mx ? x > p->ival : x < p->ival)) {
            p->ival = x;
            p->idx = r0 + c + i;
            p->has = 1;
          }
        }
      } else {
        for (int64_t i = 0; i < m; i++) {
          double x = buf.f[i];
          if (p->has && isnan(p->val))
            break; /* the first NaN wins, as torch's max and argmax */
          if (!p->has || isnan(x) || (mx ? x > p->val : x < p->val)) {
            p->val = x;
            p->idx = r0 + c + i;
            p->has = 1;
          }
        }
      }
    }
    }
  }
}

static void combine(lt_reduce_op op, lt_compute ck, partial *acc, const partial *p) {
  switch (op) {
  case LT_REDUCE_SUM:
  case LT_REDUCE_MEAN:
  case LT_REDUCE_VAR:
    acc->sum += p->sum;
    acc->isum = (int64_t)((uint64_t)acc->isum + (uint64_t)p->isum);
    break;
  default: {
    if (!p->has)
      return;
    int mx = is_max(op);
    int take;
    if (!acc->has)
      take = 1;
    else if (ck == LT_COMPUTE_I64)
      take = mx ? p->ival > acc->ival : p->ival < acc->ival;
    else
      take = !isnan(acc->val) && (isnan(p->val) || (mx ? p->val > acc->val : p->val < acc->val));
    if (take)
      *acc = *p;
  }
  }
}

typedef struct {
  lt_reduce_op op;
  const lt_reduce_iter *it;
  lt_compute ck;
  int64_t block, nblocks;
} plan;

/* Pass over all blocks of one output, in order, on this thread or with threads
   computing the block partials (combined in the same order either way). */
static void reduce_blocks(const plan *pl, lt_reduce_op op, const char *base, double mean,
                          int parallel, partial *acc) {
  int64_t R = pl->it->red_numel;
  *acc = (partial){0};
  if (!parallel) {
    for (int64_t b = 0; b < pl->nblocks; b++) {
      partial p;
      int64_t r0 = b * pl->block, n = R - r0 < pl->block ? R - r0 : pl->block;
      block_partial(op, pl->it, base, r0, n, pl->ck, mean, &p);
      combine(op, pl->ck, acc, &p);
    }
    return;
  }
  static partial parts[MAX_PARTIALS]; /* only the calling thread gets here */
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < pl->nblocks; b++) {
    int64_t r0 = b * pl->block, n = R - r0 < pl->block ? R - r0 : pl->block;
    block_partial(op, pl->it, base, r0, n, pl->ck, mean, &parts[b]);
  }
  for (int64_t b = 0; b < pl->nblocks; b++)
    combine(op, pl->ck, acc, &parts[b]);
}

static void reduce_one(const plan *pl, int64_t o, int parallel, int64_t correction) {
  const lt_reduce_iter *it = pl->it;
  int64_t in_off = 0, out_off = 0, rem = o;
  for (int d = it->nkeep - 1; d >= 0; d--) {
    int64_t i = rem % it->keep_shape[d];
    rem /= it->keep_shape[d];
    in_off += i * it->in_keep_strides[d];
    out_off += i * it->out_strides[d];
  }
  const char *base = it->in + in_off * lt_dtype_size(it->in_dtype);
  char *dst = it->out + out_off * lt_dtype_size(it->out_dtype);
  int64_t R = it->red_numel;
  partial acc;
  double result = 0;
  int64_t iresult = 0;
  int integer_result = 0;
  switch (pl->op) {
  case LT_REDUCE_SUM:
    reduce_blocks(pl, LT_REDUCE_SUM, base, 0, parallel, &acc);
    if (pl->ck == LT_COMPUTE_I64) {
      iresult = acc.isum;
      integer_result = 1;
    } else {
      result = acc.sum;
    }
    break;
  case LT_REDUCE_MEAN:
    reduce_blocks(pl, LT_REDUCE_SUM, base, 0, parallel, &acc);
    result = acc.sum / (double)R;
    break;
  case LT_REDUCE_VAR:
  case LT_REDUCE_STD: {
    reduce_blocks(pl, LT_REDUCE_SUM, base, 0, parallel, &acc);
    double mean = acc.sum / (double)R;
    reduce_blocks(pl, LT_REDUCE_VAR, base, mean, parallel, &acc);
    double denom = (double)(R - correction);
    result = denom > 0 ? acc.sum / denom : NAN;
    if (pl->op == LT_REDUCE_STD)
      result = sqrt(result); /* before rounding to the output dtype, which may overflow */
    break;
  }
  case LT_REDUCE_MAX:
  case LT_REDUCE_MIN:
    reduce_blocks(pl, pl->op, base, 0, parallel, &acc);
    if (pl->ck == LT_COMPUTE_I64) {
      iresult = acc.ival;
      integer_result = 1;
    } else {
      result = acc.val;
    }
    break;
  case LT_REDUCE_ARGMAX:
  case LT_REDUCE_ARGMIN:
    reduce_blocks(pl, pl->op, base, 0, parallel, &acc);
    iresult = acc.idx;
    integer_result = 1;
    break;
  default:
    break;
  }
  if (integer_result)
    lt_cpu_store(LT_COMPUTE_I64, dst, it->out_dtype, 1, &iresult, 1);
  else
    lt_cpu_store(LT_COMPUTE_F64, dst, it->out_dtype, 1, &result, 1);
}

lt_status lt_cpu_reduce(lt_reduce_op op, const lt_reduce_iter *it, int64_t correction) {
  plan pl = {op, it, lt_dtype_is_float(it->in_dtype) ? LT_COMPUTE_F64 : LT_COMPUTE_I64, 0, 0};
  int64_t R = it->red_numel;
  pl.block = (R + MAX_PARTIALS - 1) / MAX_PARTIALS;
  if (pl.block < MIN_BLOCK)
    pl.block = MIN_BLOCK;
  pl.nblocks = R == 0 ? 0 : (R + pl.block - 1) / pl.block;
  int64_t total = it->out_numel * (R > 0 ? R : 1);
  int nthreads = omp_get_max_threads();
  if (total < LT_CPU_PARALLEL_MIN || nthreads == 1) {
    for (int64_t o = 0; o < it->out_numel; o++)
      reduce_one(&pl, o, 0, correction);
  } else if (it->out_numel >= nthreads) {
#pragma omp parallel for schedule(static)
    for (int64_t o = 0; o < it->out_numel; o++)
      reduce_one(&pl, o, 0, correction);
  } else {
    for (int64_t o = 0; o < it->out_numel; o++)
      reduce_one(&pl, o, 1, correction);
  }
  return LT_OK;
}
