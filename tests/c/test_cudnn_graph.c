/*
 * test_cudnn_graph.c: the cuDNN attention graphs of host/attention-cudnn.c,
 * built and finalized without a GPU (cuDNN 9.8+ finalizes an operation
 * graph without a device): every descriptor, attribute and op that lutra
 * makes is one cuDNN takes. Causal and not, grouped-query heads, GPT-2's
 * layouts (q, k, v cut from one qkv tensor; the output and gradients laid
 * out (B, T, heads, HS)). Skipped without CUDA or when cuDNN cannot be
 * loaded; what runs on a GPU (heuristics, plans, results) is for
 * tests/gpu/checks.lua.
 */
#include "check.h"

#ifdef LT_WITH_CUDA
#include "backend-cuda.h"

#include <string.h>

/* GPT-2's layout: q, k, v heads of a (B, T, 3, NH, HS) tensor; o, dout,
   dq in (B, T, NH, HS); dk, dv in (B, S, NKV, HS) */
static lt_sdpa_desc desc(int64_t B, int64_t NH, int64_t NKV, int64_t T, int64_t S, int64_t HS, int causal) {
  lt_sdpa_desc d;
  memset(&d, 0, sizeof d);
  d.device = LT_DEVICE_CUDA, d.dtype = LT_DTYPE_BF16;
  d.B = B, d.NH = NH, d.NKV = NKV, d.T = T, d.S = S, d.HS = HS, d.scale = 0.125, d.causal = causal;
  int64_t C = NH * HS;
  int64_t qkv[4] = {T * 3 * C, HS, 3 * C, 1}, o[4] = {T * C, HS, C, 1}, kv[4] = {S * NKV * HS, HS, NKV * HS, 1};
  int64_t packed_kv[4] = {NKV * S * HS, S * HS, HS, 1};
  memcpy(d.sq, qkv, sizeof qkv);
  memcpy(d.sk, NKV == NH && T == S ? qkv : packed_kv, sizeof qkv);
  memcpy(d.sv, NKV == NH && T == S ? qkv : packed_kv, sizeof qkv);
  memcpy(d.so, o, sizeof o), memcpy(d.sdo, o, sizeof o), memcpy(d.sdq, o, sizeof o);
  memcpy(d.sdk, kv, sizeof kv), memcpy(d.sdv, kv, sizeof kv);
  return d;
}

static int usable = -1;
static int cudnn_usable(void) {
  if (usable < 0) {
    lt_sdpa_desc d = desc(1, 2, 2, 8, 8, 64, 0);
    lt_status st = lt_cudnn_sdpa_check_graph(&d, 0);
    usable = !(st == LT_ERR_UNSUPPORTED && strstr(lt_last_error(), "could not be loaded"));
    if (!usable)
      fprintf(stderr, "  skipped: %s\n", lt_last_error());
  }
  return usable;
}

/* forward, backward, deterministic backward */
static void both(lt_sdpa_desc d) {
  for (int backward = 0; backward < 3; backward++) {
    lt_status st = lt_cudnn_sdpa_check_graph(&d, backward);
    CHECK_MSG(st == LT_OK, "graph %d of B=%lld NH=%lld NKV=%lld T=%lld S=%lld HS=%lld causal=%d: %s", backward, (long long)d.B, (long long)d.NH, (long long)d.NKV, (long long)d.T,
              (long long)d.S, (long long)d.HS, d.causal, lt_last_error());
  }
}

TEST(gpt2_causal_graphs) {
  if (cudnn_usable())
    both(desc(8, 12, 12, 1024, 1024, 64, 1));
}

TEST(graphs_without_a_mask_grouped_query_and_f16) {
  if (!cudnn_usable())
    return;
  both(desc(2, 8, 8, 256, 256, 128, 0));
  both(desc(2, 8, 2, 512, 512, 64, 1));
  both(desc(2, 4, 4, 64, 320, 64, 0));
  lt_sdpa_desc h = desc(1, 4, 4, 128, 128, 64, 1);
  h.dtype = LT_DTYPE_F16;
  both(h);
}
#endif

RUN_TESTS()
