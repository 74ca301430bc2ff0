/*
 * test_cudnn_graph.c: the cuDNN attention graphs of host/cuda/cudnn-attention.c,
 * built and finalized without a GPU (cuDNN 9.8+ finalizes an operation
 * graph without a device): every descriptor, attribute and op that lutra
 * makes is one cuDNN takes. Causal and not, grouped-query heads, GPT-2's
 * layouts (q, k, v cut from one qkv tensor; the output and gradients laid
 * out (B, T, heads, HS)). Then, still without a GPU, the heuristics and
 * plans for an H200 (tests/ref/cudnn-device-h200.json, a cuDNN device
 * property description, written by hand: its keys are the ones cuDNN
 * 9.19's reader takes, its values the H200's published properties: sm_90,
 * 132 SMs, 227 KiB of shared memory per block, 50 MiB of L2, 141 GB; cuDNN
 * 9.11+ plans for a device it is not running on): an engine takes each
 * graph and compiles its kernels for sm_90
 * (loading them needs a driver: with CUDA's stub libcuda the plan stops
 * there, which counts), and a head size cuDNN has no engine for is
 * refused. Skipped without CUDA or when cuDNN cannot be loaded; results
 * are for tests/gpu/checks.lua on a GPU (and the emulator's stand-in).
 */
#include "check.h"

#ifdef LT_WITH_CUDA
#include "cuda/backend.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
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

/* the device description, and a driver library for cuDNN's kernel compiler:
   the machine's, else CUDA's stub (it compiles; loading the result fails) */
static char *h200_json(void) {
  static char buf[8192];
  FILE *f = fopen("tests/ref/cudnn-device-h200.json", "rb");
  CHECK_MSG(f != NULL, "tests/ref/cudnn-device-h200.json: cannot open it (run from the repository root)");
  if (!f)
    return NULL;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  if (!dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL) &&
      !dlopen(LT_CUDA_LIBDIR "/stubs/libcuda.so", RTLD_NOW | RTLD_GLOBAL)) {
    fprintf(stderr, "  skipped: neither libcuda.so.1 nor %s/stubs/libcuda.so loads\n", LT_CUDA_LIBDIR);
    return NULL;
  }
  return buf;
}

static void planned(lt_sdpa_desc d, const char *json) {
  for (int backward = 0; backward < 3; backward++) {
    int64_t ws = -2;
    lt_status st = lt_cudnn_sdpa_check_plan(&d, backward, json, &ws);
    CHECK_MSG(st == LT_OK && ws >= -1, "plan %d for an H200 of B=%lld NH=%lld NKV=%lld T=%lld S=%lld HS=%lld causal=%d: %s",
              backward, (long long)d.B, (long long)d.NH, (long long)d.NKV, (long long)d.T, (long long)d.S,
              (long long)d.HS, d.causal, st == LT_OK ? "no workspace size" : lt_last_error());
  }
}

TEST(plans_for_an_h200_without_a_gpu) {
  if (!cudnn_usable())
    return;
  if (lt_cudnn_version() < 91100) { /* (device descriptions in JSON: cuDNN 9.11 and later) */
    fprintf(stderr, "  skipped: cuDNN %lld reads no device description\n", (long long)lt_cudnn_version());
    return;
  }
  char *json = h200_json();
  if (!json)
    return;
  planned(desc(8, 12, 12, 1024, 1024, 64, 1), json); /* GPT-2 124M at B=8 */
  planned(desc(2, 8, 2, 512, 512, 64, 1), json);
  planned(desc(2, 8, 8, 256, 256, 128, 0), json);
  lt_sdpa_desc h = desc(1, 4, 4, 128, 128, 64, 1);
  h.dtype = LT_DTYPE_F16;
  planned(h, json);
  /* the check can fail: no engine for a head size of 20 */
  lt_sdpa_desc odd = desc(1, 4, 4, 128, 128, 20, 1);
  CHECK_MSG(lt_cudnn_sdpa_check_plan(&odd, 0, json, NULL) == LT_ERR_UNSUPPORTED,
            "a head size of 20 was planned (cuDNN's engines take multiples of 8)");
}
#endif

RUN_TESTS()
