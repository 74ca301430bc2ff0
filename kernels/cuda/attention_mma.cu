/*
 * attention_mma.cu: fused scaled-dot-product attention on tensor cores for
 * bf16/f16 rows of head size 32, 64 or 128, forward and backward, after
 * FlashAttention-2 (Dao 2023): a block of 4 warps takes 64 query rows (16 a
 * warp) and walks the visible keys in tiles of 64 (32 for head size 128)
 * with the online softmax, each tile copied into shared memory by cp.async
 * while the block computes on the one before (two buffers); the warps read
 * their B fragments from the tiles with ldmatrix (.trans where the product
 * needs a tile's transpose, so no transposed copy is stored);
 * the products run as mma.m16n8k16 (ptx.cuh) with f32 accumulators, and a
 * score tile's accumulators become the next product's A fragments in
 * registers (the probabilities rounded to the input type, as FlashAttention
 * does). Backward recomputes the probabilities from the log-sum-exp:
 * D = rowsum(dO * O), then one kernel sums dq over the key tiles of its
 * query rows and another dk and dv over the query tiles (and the query
 * heads of a K/V head) of its key rows, so each sum runs in a fixed order:
 * deterministic, no atomics. Masking, the empty row (zeros, lse = -inf) and
 * NaN follow kernels/attention_rows.h, which the CPU runs and these are
 * checked against, with two differences the composed path shares: a
 * masked pair inside a loaded tile enters the products with weight 0, so an
 * Inf or NaN in its q, k or v row spreads NaN to the rows that share the
 * tile (the row algorithms skip masked pairs), and a +inf score gives NaN; in f16 the rounded dS can overflow under
 * large loss scales (as FlashAttention-2's). Operands as lt_sdpa_desc
 * describes them (any strides in elements, the last 1, the others multiples
 * of 8, 16-byte aligned: the heads of a GPT-2 block cut from its qkv tensor
 * are read where they are), lse and D f32 (B, NH, T) contiguous.
 */
#include "common.cuh"
#include "mma.cuh"
#include "ptx.cuh" /* (the CUDA emulator's build finds tests/emu/kernels/ptx.cuh) */

namespace {

const int WARPS = 4, THREADS = 32 * WARPS;
const int BQ = 16 * WARPS; /* query rows of a forward or dq block */
/* keys of a tile (forward, dq) and queries of a tile (dk/dv): fewer for wide heads, so the tiles fit
   in 48 KiB of shared memory and the accumulators in registers */
template <int D> struct tile {
  static const int ROWS = D <= 64 ? 64 : 32;
};
const int PAD = 8;         /* 16-bit elements after each shared row (bank spread; rows stay 16-byte aligned) */
const float LOG2E = 1.4426950408889634f, LN2 = 0.6931471805599453f;

/* a call's operands (16-bit, as bits) and their (batch, head, row) strides in elements */
struct attn_args {
  const uint16_t *q, *k, *v, *o, *dout;
  uint16_t *out, *dq, *dk, *dv; /* (out: the forward's o) */
  float *lse, *D;
  int64_t NH, NKV, T, S;
  int64_t sq[3], sk[3], sv[3], so[3], sdo[3], sdq[3], sdk[3], sdv[3];
  float scale;
  int causal;
};

/* the first element of head h of batch b of an operand with strides st */
template <typename P> __device__ __forceinline__ P head(P p, const int64_t *st, int64_t b, int64_t h) {
  return p + b * st[0] + h * st[1];
}

/* the 32-bit word at a 16-bit row's even column c */
__device__ __forceinline__ uint32_t word(const uint16_t *row, int c) { return *(const uint32_t *)(row + c); }

/* a[4]: the A fragment of rows r0.. r0+15 and columns c0..c0+15 of a row-major 16-bit matrix (ld elements
   a row) in global memory; rows at or past n read zeros */
__device__ __forceinline__ void load_a(uint32_t a[4], const uint16_t *m, int64_t ld, int64_t r0, int64_t n, int c0,
                                       int g, int t) {
  for (int r = 0; r < 4; r++) {
    int64_t row = r0 + g + 8 * (r % 2);
    a[r] = row < n ? word(m + row * ld, c0 + 2 * t + 8 * (r / 2)) : 0u;
  }
}

/* Starts copying rows r0..r0 + ROWS - 1 of a (rows, D) global matrix (rows ld elements apart) into the
   shared tile s (ROWS x (D + PAD)), rows at or past n as zeros: 16-byte cp.async copies that land by the
   wait for the group the caller's next commit closes. Neighbouring threads take neighbouring 16 bytes of a
   row (global reads coalesced; for head sizes 64 and 128 the 8 copies of a quarter warp fill one shared
   row: no bank conflict); a thread's copies are STEP rows apart, unrolled. */
template <int D, int ROWS>
__device__ __forceinline__ void load_tile_async(uint16_t *s, const uint16_t *m, int64_t ld, int64_t r0, int64_t n) {
  const int PER_ROW = D / 8, STEP = THREADS / PER_ROW;
  static_assert(THREADS % PER_ROW == 0 && ROWS % STEP == 0, "a tile is whole passes of the block");
  const int r = threadIdx.x / PER_ROW, c = threadIdx.x % PER_ROW * 8;
  const uint16_t *src = m + c;
  uint16_t *dst = s + r * (D + PAD) + c;
#pragma unroll
  for (int j = 0; j < ROWS / STEP; j++) {
    const int64_t row = r0 + r + j * STEP;
    const bool in = row < n;
    lt_cp_async16(dst + j * STEP * (D + PAD), in ? src + row * ld : m, in);
  }
}

/* b[0..1] and b[2..3]: the B fragments (k0..k0+15) of the 8-column blocks n0.. and n0 + 8.. of the matrix
   whose column n is row n of the shared tile s (k along the row, rows ld apart): one ldmatrix of the four
   8x8 pieces (n0, k0), (n0, k0 + 8), (n0 + 8, k0), (n0 + 8, k0 + 8). Rows (D + PAD) * 2 bytes apart fall in
   distinct 16-byte bank groups. */
__device__ __forceinline__ void load_b_rows(uint32_t b[4], const uint16_t *s, int ld, int n0, int k0, int lane) {
  int piece = lane / 8;
  lt_ldmatrix_x4<false>(b, s + (n0 + 8 * (piece / 2) + lane % 8) * ld + k0 + 8 * (piece % 2));
}

/* b[0..1] and b[2..3]: the B fragments (rows k0..k0+15) of the 8-column blocks n0.. and n0 + 8.. of the
   matrix stored as the shared tile s (row k, ld apart): ldmatrix .trans of the pieces (k0, n0),
   (k0 + 8, n0), (k0, n0 + 8), (k0 + 8, n0 + 8), so no transposed copy of the tile is needed. */
__device__ __forceinline__ void load_b_cols(uint32_t b[4], const uint16_t *s, int ld, int k0, int n0, int lane) {
  int piece = lane / 8;
  lt_ldmatrix_x4<true>(b, s + (k0 + 8 * (piece % 2) + lane % 8) * ld + n0 + 8 * (piece / 2));
}

/* the A fragment of a 16-column slice (columns 16 ks..) of a warp's score tile held as C fragments x[n][i] */
template <typename H> __device__ __forceinline__ void scores_as_a(uint32_t a[4], const float (*x)[4], int ks) {
  a[0] = lt_pack2<H>(x[2 * ks][0], x[2 * ks][1]);
  a[1] = lt_pack2<H>(x[2 * ks][2], x[2 * ks][3]);
  a[2] = lt_pack2<H>(x[2 * ks + 1][0], x[2 * ks + 1][1]);
  a[3] = lt_pack2<H>(x[2 * ks + 1][2], x[2 * ks + 1][3]);
}

/* x (16 x N scores, C fragments) += A (16 x D: a[kk] the A fragment of columns 16 kk..) times the
   transpose of the shared tile s (N rows of D, ld apart) */
template <typename H, int D, int N>
__device__ __forceinline__ void rows_times_tile_t(float (*x)[4], const uint32_t (*a)[4], const uint16_t *s, int ld,
                                                  int lane) {
  for (int kk = 0; kk < D / 16; kk++)
    for (int n = 0; n < N / 8; n += 2) {
      uint32_t bf[4];
      load_b_rows(bf, s, ld, 8 * n, 16 * kk, lane);
      lt_mma16816<H>(x[n], a[kk], bf);
      lt_mma16816<H>(x[n + 1], a[kk], bf + 2);
    }
}

/* acc (16 x D, C fragments) += x (16 x N scores as C fragments, rounded to H) times the shared tile s
   (N rows of D, ld apart) */
template <typename H, int D, int N>
__device__ __forceinline__ void scores_times_tile(float (*acc)[4], const float (*x)[4], const uint16_t *s, int ld,
                                                  int lane) {
  for (int kc = 0; kc < N / 16; kc++) {
    uint32_t a[4];
    scores_as_a<H>(a, x, kc);
    for (int nd = 0; nd < D / 8; nd += 2) {
      uint32_t bf[4];
      load_b_cols(bf, s, ld, 16 * kc, 8 * nd, lane);
      lt_mma16816<H>(acc[nd], a, bf);
      lt_mma16816<H>(acc[nd + 1], a, bf + 2);
    }
  }
}

/* Starts loading key tile kt (keys kt BK..) of K and V into the buffers ks and vs when it is one of the
   tiles, and commits the copies' group (an empty one past the last tile). A block's loop is
   begin_kv_tile, then compute: one barrier a tile. */
template <int D, int BK>
__device__ __forceinline__ void start_kv_tile(uint16_t *ks, uint16_t *vs, const uint16_t *kb, const uint16_t *vb,
                                              const attn_args &a, int kt, int tiles) {
  if (kt < tiles) {
    load_tile_async<D, BK>(ks, kb, a.sk[2], (int64_t)kt * BK, a.S);
    load_tile_async<D, BK>(vs, vb, a.sv[2], (int64_t)kt * BK, a.S);
  }
  lt_cp_async_commit();
}

/* The top of a block's pass over key tile kt: waits for the tile's copies, __syncthreads (every thread's
   have landed, and tile kt - 1 is read by all, so its buffers ks_next and vs_next are free), then starts
   tile kt + 1 into them, to load while tile kt is used. */
template <int D, int BK>
__device__ __forceinline__ void begin_kv_tile(uint16_t *ks_next, uint16_t *vs_next, const uint16_t *kb,
                                              const uint16_t *vb, const attn_args &a, int kt, int tiles) {
  lt_cp_async_wait<0>();
  __syncthreads();
  start_kv_tile<D, BK>(ks_next, vs_next, kb, vb, a, kt + 1, tiles);
}

/* may query i of T see key j of S */
__device__ __forceinline__ bool visible(int64_t i, int64_t j, int64_t T, int64_t S, int causal) {
  return i < T && j < S && (!causal || j <= i + S - T);
}

/* does each of the 16 queries r0.. (all below T) see each key of [k0, k0 + n)? (then the tile needs no mask) */
__device__ __forceinline__ bool every_key_seen(int64_t r0, int64_t k0, int n, int64_t T, int64_t S, int causal) {
  return r0 + 16 <= T && k0 + n <= S && (!causal || k0 + n - 1 <= r0 + S - T);
}

/* the keys [0, end) that some query of [q0, q0 + BQ) sees */
__device__ __forceinline__ int64_t keys_end(int64_t q0, int64_t T, int64_t S, int causal) {
  if (!causal)
    return S;
  int64_t last = (q0 + BQ < T ? q0 + BQ : T) - 1, end = last + S - T + 1;
  return end < 0 ? 0 : (end > S ? S : end);
}

/* the sum over the 4 lanes that share a fragment row */
__device__ __forceinline__ float row_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}
__device__ __forceinline__ float row_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

/* grid (B * NH, query blocks), the last query block first: under a causal mask the late rows see the
   most keys, so the longest blocks start in the first wave and the last wave is short ones */
template <typename H, int D>
__global__ void __launch_bounds__(THREADS)
    attention_mma_fwd_kernel(const attn_args a) {
  const int BK = tile<D>::ROWS;
  __shared__ __align__(16) uint16_t ks[2][BK * (D + PAD)], vs[2][BK * (D + PAD)]; /* (double buffered) */
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int64_t NH = a.NH, T = a.T, S = a.S;
  const int causal = a.causal;
  const int64_t bh = blockIdx.x, b = bh / NH, h = bh % NH, kvh = h / (NH / a.NKV);
  const int64_t q0 = (int64_t)(gridDim.y - 1 - blockIdx.y) * BQ, r0 = q0 + 16 * warp; /* (late rows first) */
  const uint16_t *qb = head(a.q, a.sq, b, h), *kb = head(a.k, a.sk, b, kvh), *vb = head(a.v, a.sv, b, kvh);
  const float sl2 = a.scale * LOG2E; /* scores in base 2 */
  uint32_t qa[D / 16][4];
  for (int kk = 0; kk < D / 16; kk++)
    load_a(qa[kk], qb, a.sq[2], r0, T, 16 * kk, g, t);
  float acc[D / 8][4] = {};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f}; /* rows g and g + 8: running max (base 2), partial sum */
  const int tiles = (int)((keys_end(q0, T, S, causal) + BK - 1) / BK);
  start_kv_tile<D, BK>(ks[0], vs[0], kb, vb, a, 0, tiles);
  for (int kt = 0; kt < tiles; kt++) {
    const int cur = kt % 2;
    const int64_t k0 = (int64_t)kt * BK;
    begin_kv_tile<D, BK>(ks[1 - cur], vs[1 - cur], kb, vb, a, kt, tiles);
    float s[BK / 8][4] = {};
    rows_times_tile_t<H, D, BK>(s, qa, ks[cur], D + PAD, lane);
    float mx[2] = {m[0], m[1]};
    for (int n = 0; n < BK / 8; n++)
      for (int i = 0; i < 4; i++)
        s[n][i] *= sl2;
    if (!every_key_seen(r0, k0, BK, T, S, causal)) /* (the mask only on tiles that need it: one branch) */
      for (int n = 0; n < BK / 8; n++)
        for (int i = 0; i < 4; i++)
          if (!visible(r0 + g + 8 * (i / 2), k0 + 8 * n + 2 * t + i % 2, T, S, causal))
            s[n][i] = -INFINITY;
    for (int n = 0; n < BK / 8; n++)
      for (int i = 0; i < 4; i++)
        mx[i / 2] = fmaxf(mx[i / 2], s[n][i]);
    float base[2], sum[2] = {0.f, 0.f};
    for (int r = 0; r < 2; r++) {
      mx[r] = row_max(mx[r]);
      base[r] = mx[r] == -INFINITY ? 0.f : mx[r]; /* (no visible key yet: every p is 0) */
      float alpha = exp2f(m[r] - base[r]);        /* (0 for the first visible keys) */
      l[r] *= alpha;
      for (int nd = 0; nd < D / 8; nd++) {
        acc[nd][2 * r] *= alpha;
        acc[nd][2 * r + 1] *= alpha;
      }
      m[r] = mx[r];
    }
    for (int n = 0; n < BK / 8; n++)
      for (int i = 0; i < 4; i++) {
        s[n][i] = exp2f(s[n][i] - base[i / 2]);
        sum[i / 2] += s[n][i];
      }
    l[0] += sum[0];
    l[1] += sum[1];
    scores_times_tile<H, D, BK>(acc, s, vs[cur], D + PAD, lane);
  }
  for (int r = 0; r < 2; r++) {
    float sum = row_sum(l[r]);
    int64_t row = r0 + g + 8 * r;
    if (row >= T)
      continue;
    /* no visible key: zeros and -inf; a NaN score made the sum NaN: NaN, as attention_rows.h */
    float inv = sum > 0.f || sum != sum ? 1.f / sum : 0.f;
    uint16_t *orow = head(a.out, a.so, b, h) + row * a.so[2];
    for (int nd = 0; nd < D / 8; nd++)
      *(uint32_t *)(orow + 8 * nd + 2 * t) = lt_pack2<H>(acc[nd][2 * r] * inv, acc[nd][2 * r + 1] * inv);
    if (t == 0)
      a.lse[bh * T + row] = sum > 0.f ? m[r] * LN2 + logf(sum) : (sum != sum ? NAN : -INFINITY);
  }
}

/* D[r] = sum over query row r (of B * NH * T) of dout * o, in f32: a warp a row */
template <typename H>
__global__ void attention_mma_rowdot_kernel(const attn_args a, int64_t rows, int HS) {
  int64_t r = ((int64_t)blockIdx.x * THREADS + threadIdx.x) / 32;
  int lane = threadIdx.x % 32;
  if (r >= rows) /* (whole warps leave together) */
    return;
  int64_t i = r % a.T, b = r / a.T / a.NH, h = r / a.T % a.NH;
  const uint16_t *dor = head(a.dout, a.sdo, b, h) + i * a.sdo[2], *orow = head(a.o, a.so, b, h) + i * a.so[2];
  float s = 0.f;
  for (int d = lane; d < HS; d += 32)
    s += lt_half_bits_to_float<H>(dor[d]) * lt_half_bits_to_float<H>(orow[d]);
  for (int w = 16; w > 0; w /= 2)
    s += __shfl_xor_sync(0xffffffffu, s, w);
  if (lane == 0)
    a.D[r] = s;
}

/* dq = scale * sum over visible keys j of p_ij (dO_i . V_j - D_i) K_j; grid (B * NH, query blocks), the
   last first (as the forward) */
template <typename H, int D>
__global__ void __launch_bounds__(THREADS)
    attention_mma_dq_kernel(const attn_args a) {
  const int BK = tile<D>::ROWS;
  __shared__ __align__(16) uint16_t ks[2][BK * (D + PAD)], vs[2][BK * (D + PAD)]; /* (double buffered) */
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int64_t NH = a.NH, T = a.T, S = a.S;
  const int causal = a.causal;
  const float scale = a.scale;
  const float *lse = a.lse, *Dr = a.D;
  const int64_t bh = blockIdx.x, b = bh / NH, h = bh % NH, kvh = h / (NH / a.NKV);
  const int64_t q0 = (int64_t)(gridDim.y - 1 - blockIdx.y) * BQ, r0 = q0 + 16 * warp; /* (late rows first) */
  const uint16_t *kb = head(a.k, a.sk, b, kvh), *vb = head(a.v, a.sv, b, kvh);
  const float sl2 = scale * LOG2E;
  uint32_t qa[D / 16][4], da[D / 16][4];
  for (int kk = 0; kk < D / 16; kk++) {
    load_a(qa[kk], head(a.q, a.sq, b, h), a.sq[2], r0, T, 16 * kk, g, t);
    load_a(da[kk], head(a.dout, a.sdo, b, h), a.sdo[2], r0, T, 16 * kk, g, t);
  }
  float lse2[2], Drow[2]; /* rows g and g + 8: the log-sum-exp in base 2, D */
  for (int r = 0; r < 2; r++) {
    int64_t row = r0 + g + 8 * r;
    lse2[r] = row < T ? lse[bh * T + row] * LOG2E : -INFINITY;
    Drow[r] = row < T ? Dr[bh * T + row] : 0.f;
  }
  float acc[D / 8][4] = {};
  const int tiles = (int)((keys_end(q0, T, S, causal) + BK - 1) / BK);
  start_kv_tile<D, BK>(ks[0], vs[0], kb, vb, a, 0, tiles);
  for (int kt = 0; kt < tiles; kt++) {
    const int cur = kt % 2;
    const int64_t k0 = (int64_t)kt * BK;
    begin_kv_tile<D, BK>(ks[1 - cur], vs[1 - cur], kb, vb, a, kt, tiles);
    float s[BK / 8][4] = {}, dp[BK / 8][4] = {};
    rows_times_tile_t<H, D, BK>(s, qa, ks[cur], D + PAD, lane);
    rows_times_tile_t<H, D, BK>(dp, da, vs[cur], D + PAD, lane);
    for (int n = 0; n < BK / 8; n++)
      for (int i = 0; i < 4; i++)
        s[n][i] = lse2[i / 2] != -INFINITY ? exp2f(s[n][i] * sl2 - lse2[i / 2]) : 0.f; /* p */
    if (!every_key_seen(r0, k0, BK, T, S, causal))
      for (int n = 0; n < BK / 8; n++)
        for (int i = 0; i < 4; i++)
          if (!visible(r0 + g + 8 * (i / 2), k0 + 8 * n + 2 * t + i % 2, T, S, causal))
            s[n][i] = 0.f;
    for (int n = 0; n < BK / 8; n++)
      for (int i = 0; i < 4; i++) /* dS (0 where masked, also for a NaN D) */
        s[n][i] = s[n][i] != 0.f ? s[n][i] * (dp[n][i] - Drow[i / 2]) : 0.f;
    scores_times_tile<H, D, BK>(acc, s, ks[cur], D + PAD, lane);
  }
  for (int r = 0; r < 2; r++) {
    int64_t row = r0 + g + 8 * r;
    if (row >= T)
      continue;
    uint16_t *out = head(a.dq, a.sdq, b, h) + row * a.sdq[2];
    for (int nd = 0; nd < D / 8; nd++)
      *(uint32_t *)(out + 8 * nd + 2 * t) = lt_pack2<H>(acc[nd][2 * r] * scale, acc[nd][2 * r + 1] * scale);
  }
}

/* Starts loading query tile i0.. of head h of batch b for the dk/dv kernel: its Q and dO rows into qs and
   dos (cp.async, in the group the caller commits next); *lse2 and *d get the log-sum-exp (base 2) and D
   of its row threadIdx.x (when below BQK; -inf and 0 past T), for the caller to store into shared memory
   once the loads have had the tile's products to arrive. */
template <int D>
__device__ __forceinline__ void start_query_tile(uint16_t *qs, uint16_t *dos, const attn_args &a, int64_t b,
                                                 int64_t h, int64_t i0, float *lse2, float *d) {
  const int BQK = tile<D>::ROWS;
  const int64_t T = a.T, bh = b * a.NH + h, i = i0 + threadIdx.x;
  load_tile_async<D, BQK>(qs, head(a.q, a.sq, b, h), a.sq[2], i0, T);
  load_tile_async<D, BQK>(dos, head(a.dout, a.sdo, b, h), a.sdo[2], i0, T);
  static_assert(BQK <= THREADS, "a thread a row");
  *lse2 = threadIdx.x < BQK && i < T ? a.lse[bh * T + i] * LOG2E : -INFINITY;
  *d = threadIdx.x < BQK && i < T ? a.D[bh * T + i] : 0.f;
}

/* For key rows j of a K/V head, summed over the query heads that share it and their visible queries i:
   dv_j = sum p_ij dO_i, dk_j = scale * sum p_ij (dO_i . V_j - D_i) Q_i. A warp takes 16 keys; the
   query tiles are BQK rows (Q and dO in shared memory, the next tile loading while one is used).
   grid (B * NKV, key blocks): under a causal mask the first keys are seen by the most queries, so the
   longest blocks are the first launched */
template <typename H, int D>
__global__ void __launch_bounds__(THREADS)
    attention_mma_dkv_kernel(const attn_args a) {
  const int BQK = tile<D>::ROWS;
  __shared__ __align__(16) uint16_t qs[2][BQK * (D + PAD)], dos[2][BQK * (D + PAD)]; /* (double buffered) */
  __shared__ __align__(8) float lse2s[2][BQK], Ds[2][BQK]; /* (read in pairs) */
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int64_t NH = a.NH, NKV = a.NKV, T = a.T, S = a.S;
  const int causal = a.causal;
  const float scale = a.scale;
  const int64_t bg = blockIdx.x, b = bg / NKV, kvh = bg % NKV, rep = NH / NKV;
  const int64_t k0 = (int64_t)blockIdx.y * BQ, j0 = k0 + 16 * warp; /* (BQ keys a block, 16 a warp) */
  const float sl2 = scale * LOG2E;
  uint32_t ka[D / 16][4], va[D / 16][4];
  for (int kk = 0; kk < D / 16; kk++) {
    load_a(ka[kk], head(a.k, a.sk, b, kvh), a.sk[2], j0, S, 16 * kk, g, t);
    load_a(va[kk], head(a.v, a.sv, b, kvh), a.sv[2], j0, S, 16 * kk, g, t);
  }
  float dka[D / 8][4] = {}, dva[D / 8][4] = {};
  /* the first query that sees key k0 (none before it sees any key of the block) */
  int64_t qfirst = causal ? k0 - (S - T) : 0;
  qfirst = qfirst < 0 ? 0 : qfirst / BQK * BQK;
  /* the query tiles, head by head: tile j is queries qfirst + (j % per_head) BQK.. of query head
     kvh rep + j / per_head */
  const int64_t per_head = qfirst < T ? (T - qfirst + BQK - 1) / BQK : 0, tiles = rep * per_head;
  const int stat_row = threadIdx.x; /* (the row of lse2s and Ds this thread stores, when below BQK) */
  float next_lse2 = -INFINITY, next_D = 0.f;
  if (tiles > 0) {
    start_query_tile<D>(qs[0], dos[0], a, b, kvh * rep, qfirst, &next_lse2, &next_D);
    if (stat_row < BQK)
      lse2s[0][stat_row] = next_lse2, Ds[0][stat_row] = next_D;
  }
  lt_cp_async_commit();
  for (int64_t j = 0; j < tiles; j++) { /* (one barrier a tile, as in begin_kv_tile's loop) */
    const int cur = (int)(j % 2);
    const int64_t i0 = qfirst + j % per_head * BQK;
    lt_cp_async_wait<0>();
    __syncthreads();
    const bool more = j + 1 < tiles;
    if (more)
      start_query_tile<D>(qs[1 - cur], dos[1 - cur], a, b, kvh * rep + (j + 1) / per_head,
                          qfirst + (j + 1) % per_head * BQK, &next_lse2, &next_D);
    lt_cp_async_commit();
    const float *lse2c = lse2s[cur], *Dc = Ds[cur];
    float p[BQK / 8][4] = {}, dp[BQK / 8][4] = {}; /* transposed: rows are keys, columns queries */
    rows_times_tile_t<H, D, BQK>(p, ka, qs[cur], D + PAD, lane);
    rows_times_tile_t<H, D, BQK>(dp, va, dos[cur], D + PAD, lane);
    for (int n = 0; n < BQK / 8; n++) {
      const float2 l2 = *(const float2 *)(lse2c + 8 * n + 2 * t); /* (columns 8 n + 2 t and one more) */
      for (int i = 0; i < 4; i++) {
        const float lc = i % 2 ? l2.y : l2.x;
        p[n][i] = lc != -INFINITY ? exp2f(p[n][i] * sl2 - lc) : 0.f;
      }
    }
    /* (every query of the tile sees the warp's 16 keys when the first does and all are in range) */
    if (!(i0 + BQK <= T && j0 + 16 <= S && (!causal || j0 + 15 <= i0 + S - T)))
      for (int n = 0; n < BQK / 8; n++)
        for (int i = 0; i < 4; i++)
          if (!visible(i0 + 8 * n + 2 * t + i % 2, j0 + g + 8 * (i / 2), T, S, causal))
            p[n][i] = 0.f;
    for (int n = 0; n < BQK / 8; n++) {
      const float2 d2 = *(const float2 *)(Dc + 8 * n + 2 * t);
      for (int i = 0; i < 4; i++) /* dS, transposed (0 where masked) */
        dp[n][i] = p[n][i] != 0.f ? p[n][i] * (dp[n][i] - (i % 2 ? d2.y : d2.x)) : 0.f;
    }
    scores_times_tile<H, D, BQK>(dva, p, dos[cur], D + PAD, lane);
    scores_times_tile<H, D, BQK>(dka, dp, qs[cur], D + PAD, lane);
    if (more && stat_row < BQK) /* (the next tile's row statistics, loaded while this tile was used) */
      lse2s[1 - cur][stat_row] = next_lse2, Ds[1 - cur][stat_row] = next_D;
  }
  for (int r = 0; r < 2; r++) {
    int64_t key = j0 + g + 8 * r;
    if (key >= S)
      continue;
    uint16_t *dkr = head(a.dk, a.sdk, b, kvh) + key * a.sdk[2], *dvr = head(a.dv, a.sdv, b, kvh) + key * a.sdv[2];
    for (int nd = 0; nd < D / 8; nd++) {
      *(uint32_t *)(dkr + 8 * nd + 2 * t) = lt_pack2<H>(dka[nd][2 * r] * scale, dka[nd][2 * r + 1] * scale);
      *(uint32_t *)(dvr + 8 * nd + 2 * t) = lt_pack2<H>(dva[nd][2 * r], dva[nd][2 * r + 1]);
    }
  }
}

unsigned blocks_of(int64_t n) { return (unsigned)((n + BQ - 1) / BQ); }

/* d's operands (o and lse written by the forward, read by the backward) as the kernels take them */
attn_args args_of(const lt_sdpa_desc *d, float *D) {
  attn_args a;
  a.q = (const uint16_t *)d->q, a.k = (const uint16_t *)d->k, a.v = (const uint16_t *)d->v;
  a.o = (const uint16_t *)d->o, a.dout = (const uint16_t *)d->dout;
  a.out = (uint16_t *)d->o, a.dq = (uint16_t *)d->dq, a.dk = (uint16_t *)d->dk, a.dv = (uint16_t *)d->dv;
  a.lse = (float *)d->stats, a.D = D;
  a.NH = d->NH, a.NKV = d->NKV, a.T = d->T, a.S = d->S;
  for (int j = 0; j < 3; j++) {
    a.sq[j] = d->sq[j], a.sk[j] = d->sk[j], a.sv[j] = d->sv[j], a.so[j] = d->so[j];
    a.sdo[j] = d->sdo[j], a.sdq[j] = d->sdq[j], a.sdk[j] = d->sdk[j], a.sdv[j] = d->sdv[j];
  }
  a.scale = (float)d->scale;
  a.causal = d->causal;
  return a;
}

template <typename H, int D> lt_status fwd_run(const lt_sdpa_desc *d, cudaStream_t cs) {
  dim3 grid((unsigned)(d->B * d->NH), blocks_of(d->T));
  attention_mma_fwd_kernel<H, D><<<grid, THREADS, 0, cs>>>(args_of(d, NULL));
  return lt_cuda_check_launch("attention_mma_fwd_kernel");
}

template <typename H, int D> lt_status bwd_run(const lt_sdpa_desc *d, float *Dbuf, cudaStream_t cs) {
  attn_args a = args_of(d, Dbuf);
  int64_t rows = d->B * d->NH * d->T;
  if (rows > 0) {
    attention_mma_rowdot_kernel<H><<<(unsigned)((rows + WARPS - 1) / WARPS), THREADS, 0, cs>>>(a, rows, D);
    lt_status st = lt_cuda_check_launch("attention_mma_rowdot_kernel");
    if (st != LT_OK)
      return st;
    dim3 grid((unsigned)(d->B * d->NH), blocks_of(d->T));
    attention_mma_dq_kernel<H, D><<<grid, THREADS, 0, cs>>>(a);
    st = lt_cuda_check_launch("attention_mma_dq_kernel");
    if (st != LT_OK)
      return st;
  }
  if (d->B * d->NKV * d->S > 0) {
    dim3 grid((unsigned)(d->B * d->NKV), blocks_of(d->S));
    attention_mma_dkv_kernel<H, D><<<grid, THREADS, 0, cs>>>(a);
    return lt_cuda_check_launch("attention_mma_dkv_kernel");
  }
  return LT_OK;
}

} // namespace

extern "C" int lt_cuda_attention_mma_takes(lt_dtype dt, int64_t HS) {
  return (dt == LT_DTYPE_BF16 || dt == LT_DTYPE_F16) && (HS == 32 || HS == 64 || HS == 128);
}

#define LT_MMA_DISPATCH(d, CALL)                                                                               \
  do {                                                                                                       \
    if (!lt_cuda_attention_mma_takes((d)->dtype, (d)->HS))                                                   \
      return lt_fail(LT_ERR_UNSUPPORTED, "attention on tensor cores: %s head size %lld (takes bf16/f16, 32, 64 or 128)", \
                     lt_dtype_name((d)->dtype), (long long)(d)->HS);                                         \
    if ((d)->dtype == LT_DTYPE_BF16)                                                                         \
      return (d)->HS == 32 ? CALL(__nv_bfloat16, 32)                                                         \
                           : (d)->HS == 64 ? CALL(__nv_bfloat16, 64) : CALL(__nv_bfloat16, 128);             \
    return (d)->HS == 32 ? CALL(__half, 32) : (d)->HS == 64 ? CALL(__half, 64) : CALL(__half, 128);          \
  } while (0)

extern "C" lt_status lt_cuda_attention_mma_fwd(const lt_sdpa_desc *d, lt_cuda_stream s) {
  if (d->B * d->NH * d->T == 0)
    return LT_OK;
#define CALL(H, HD) fwd_run<H, HD>(d, (cudaStream_t)s)
  LT_MMA_DISPATCH(d, CALL);
#undef CALL
}

extern "C" lt_status lt_cuda_attention_mma_bwd(const lt_sdpa_desc *d, float *D, lt_cuda_stream s) {
#define CALL(H, HD) bwd_run<H, HD>(d, D, (cudaStream_t)s)
  LT_MMA_DISPATCH(d, CALL);
#undef CALL
}
