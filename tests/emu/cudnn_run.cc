/*
 * cudnn_run.cc: the CUDA emulator's cuDNN (cudnn.cc), running a compiled
 * graph on the CPU, in the handle's stream order: pointwise ops with
 * broadcasting, products over the last two dimensions (f32, OpenBLAS;
 * grouped batch entries for grouped-query K and V), reductions onto a
 * tensor whose dimensions divide the input's, reshapes that permute
 * dimensions by their strides; every tensor rounded to its data type.
 */
#if __has_include(<cudnn_graph.h>)
#include "cudnn_emu.h"

#include <cblas.h>
#include <math.h>

namespace emu_cudnn {

/* ---- running a program -------------------------------------------------------------------- */

/* the index counter over dims, one step; false after the last */
bool next_index(int64_t *idx, const int64_t *dims, int nd) {
  for (int i = nd - 1; i >= 0; i--) {
    if (++idx[i] < dims[i])
      return true;
    idx[i] = 0;
  }
  return false;
}

/* packed strides of t, 0 where a dimension of 1 broadcasts */
void packed_strides(const tensor_info &t, int64_t *out) {
  int64_t s = 1;
  for (int i = t.nd - 1; i >= 0; i--) {
    out[i] = t.dims[i] == 1 ? 0 : s;
    s *= t.dims[i];
  }
}

double pointwise_value(int mode, double x, double b, double t) {
  switch (mode) {
  case CUDNN_POINTWISE_ADD: return x + b;
  case CUDNN_POINTWISE_SUB: return x - b;
  case CUDNN_POINTWISE_MUL: return x * b;
  case CUDNN_POINTWISE_DIV: return x / b;
  case CUDNN_POINTWISE_MAX: return x > b ? x : b;
  case CUDNN_POINTWISE_MIN: return x < b ? x : b;
  case CUDNN_POINTWISE_CMP_EQ: return x == b;
  case CUDNN_POINTWISE_CMP_NEQ: return x != b;
  case CUDNN_POINTWISE_CMP_GT: return x > b;
  case CUDNN_POINTWISE_CMP_GE: return x >= b;
  case CUDNN_POINTWISE_CMP_LT: return x < b;
  case CUDNN_POINTWISE_CMP_LE: return x <= b;
  case CUDNN_POINTWISE_BINARY_SELECT: return t != 0 ? x : b; /* the documentation: y = t ? x : b */
  case CUDNN_POINTWISE_IDENTITY: return x;
  case CUDNN_POINTWISE_EXP: return exp(x);
  case CUDNN_POINTWISE_LOG: return log(x);
  case CUDNN_POINTWISE_NEG: return -x;
  case CUDNN_POINTWISE_SQRT: return sqrt(x);
  case CUDNN_POINTWISE_RECIPROCAL: return 1 / x;
  case CUDNN_POINTWISE_ABS: return fabs(x);
  default: return NAN;
  }
}


const std::vector<float> &value_of(run_state &rs, int i) {
  std::vector<float> &v = rs.values[i];
  if (!v.empty())
    return v;
  const tensor_info &t = rs.prog->tensors[i];
  v.resize(t.count());
  if (t.by_value) {
    v[0] = round_to(t.type, rs.scalars[i]);
    return v;
  }
  int64_t idx[MAX_DIMS] = {0}, n = 0;
  do {
    int64_t off = 0;
    for (int k = 0; k < t.nd; k++)
      off += idx[k] * t.strides[k];
    v[n++] = (float)load(t.type, rs.ptrs[i], off);
  } while (next_index(idx, t.dims, t.nd));
  return v;
}

void run_pointwise(run_state &rs, const op_info &op, std::vector<float> &y, const tensor_info &Y) {
  const std::vector<float> *in[3] = {nullptr, nullptr, nullptr};
  int64_t st[3][MAX_DIMS] = {{0}};
  for (int k = 0; k < op.nin; k++) {
    in[k] = &value_of(rs, op.in[k]);
    packed_strides(rs.prog->tensors[op.in[k]], st[k]);
  }
  int64_t idx[MAX_DIMS] = {0}, n = 0;
  do {
    double v[3] = {0, 0, 0};
    for (int k = 0; k < op.nin; k++) {
      int64_t off = 0;
      for (int d = 0; d < Y.nd; d++)
        off += idx[d] * st[k][d];
      v[k] = (*in[k])[off];
    }
    double r = op.mode == CUDNN_POINTWISE_GEN_INDEX ? (double)idx[op.axis]
                                                     : pointwise_value(op.mode, op.alpha1 * v[0], op.alpha2 * v[1], v[2]);
    y[n++] = round_to(Y.type, r);
  } while (next_index(idx, Y.dims, Y.nd));
}

/* C = A B per batch entry, in f32 (OpenBLAS) as the engines accumulate */
void run_matmul(run_state &rs, const op_info &op, std::vector<float> &c, const tensor_info &C) {
  const tensor_info &A = rs.prog->tensors[op.in[0]], &B = rs.prog->tensors[op.in[1]];
  const std::vector<float> &a = value_of(rs, op.in[0]), &b = value_of(rs, op.in[1]);
  int n = C.nd;
  int64_t M = C.dims[n - 2], N = C.dims[n - 1], K = A.dims[n - 1];
  int64_t batch_dims[MAX_DIMS] = {0}, idx[MAX_DIMS] = {0}, entry = 0;
  for (int i = 0; i < n - 2; i++)
    batch_dims[i] = C.dims[i];
  std::vector<float> out((size_t)(M * N));
  do {
    /* an operand's batch entry: the result's, divided by its group size */
    int64_t ea = 0, eb = 0;
    for (int i = 0; i < n - 2; i++) {
      ea = ea * A.dims[i] + idx[i] / (C.dims[i] / A.dims[i]);
      eb = eb * B.dims[i] + idx[i] / (C.dims[i] / B.dims[i]);
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)M, (int)N, (int)K, 1.0f, a.data() + ea * M * K,
                (int)K, b.data() + eb * K * N, (int)N, 0.0f, out.data(), (int)N);
    for (int64_t e = 0; e < M * N; e++)
      c[entry * M * N + e] = round_to(C.type, out[e]);
    entry++;
  } while (n > 2 && next_index(idx, batch_dims, n - 2));
}

void run_reduction(run_state &rs, const op_info &op, std::vector<float> &y, const tensor_info &Y) {
  const tensor_info &X = rs.prog->tensors[op.in[0]];
  const std::vector<float> &x = value_of(rs, op.in[0]);
  double init = op.mode == CUDNN_REDUCE_TENSOR_MAX ? -INFINITY : op.mode == CUDNN_REDUCE_TENSOR_MIN ? INFINITY : 0;
  std::vector<double> acc(y.size(), init);
  int64_t ys[MAX_DIMS], idx[MAX_DIMS] = {0}, n = 0;
  packed_strides(Y, ys);
  do {
    int64_t off = 0;
    for (int d = 0; d < X.nd; d++)
      off += idx[d] / (X.dims[d] / Y.dims[d]) * ys[d];
    double v = x[n++];
    double &a = acc[off];
    if (op.mode == CUDNN_REDUCE_TENSOR_ADD)
      a += v;
    else if (op.mode == CUDNN_REDUCE_TENSOR_MAX)
      a = v > a || v != v ? v : a;
    else
      a = v < a || v != v ? v : a;
  } while (next_index(idx, X.dims, X.nd));
  for (size_t i = 0; i < y.size(); i++)
    y[i] = round_to(Y.type, acc[i]);
}

void run_reshape(run_state &rs, const op_info &op, std::vector<float> &y, const tensor_info &Y) {
  const tensor_info &X = rs.prog->tensors[op.in[0]];
  const std::vector<float> &x = value_of(rs, op.in[0]);
  if (op.flat) {
    for (size_t i = 0; i < y.size(); i++)
      y[i] = round_to(Y.type, x[i]);
    return;
  }
  int64_t xs[MAX_DIMS], idx[MAX_DIMS] = {0}, n = 0;
  packed_strides(X, xs);
  do {
    int64_t off = 0;
    for (int j = 0; j < Y.nd; j++)
      if (op.perm[j] >= 0)
        off += idx[j] * xs[op.perm[j]];
    y[n++] = round_to(Y.type, x[off]);
  } while (next_index(idx, Y.dims, Y.nd));
}

void run_program(run_state &rs) {
  const program &p = *rs.prog;
  std::vector<int> uses(p.tensors.size());
  for (const op_info &op : p.ops)
    for (int k = 0; k < op.nin; k++)
      uses[op.in[k]]++;
  for (const op_info &op : p.ops) {
    const tensor_info &Y = p.tensors[op.out];
    std::vector<float> y((size_t)Y.count());
    switch (op.kind) {
    case OP_POINTWISE: run_pointwise(rs, op, y, Y); break;
    case OP_MATMUL: run_matmul(rs, op, y, Y); break;
    case OP_REDUCTION: run_reduction(rs, op, y, Y); break;
    case OP_RESHAPE: run_reshape(rs, op, y, Y); break;
    }
    if (!Y.is_virtual) { /* written where the variant pack says */
      int64_t idx[MAX_DIMS] = {0}, n = 0;
      do {
        int64_t off = 0;
        for (int k = 0; k < Y.nd; k++)
          off += idx[k] * Y.strides[k];
        store(Y.type, rs.ptrs[op.out], off, y[n++]);
      } while (next_index(idx, Y.dims, Y.nd));
    }
    rs.values[op.out] = std::move(y);
    for (int k = 0; k < op.nin; k++) /* (a tensor no later op reads is let go) */
      if (--uses[op.in[k]] == 0)
        std::vector<float>().swap(rs.values[op.in[k]]);
  }
}

} // namespace emu_cudnn

#endif /* cudnn_graph.h */
