/*
 * cpu/backend.c: the CPU backend's vtable: memory from the caching allocator
 * (cpu/alloc.c) and the kernels in kernels/cpu/.
 */
#include "../../kernels/cpu/cpu.h"
#include "backend/backend.h"
#include "base/status.h"
#include "cpu/alloc.h"

#include <stdlib.h>
#include <string.h>

static lt_status cpu_alloc(lt_device device, size_t nbytes, void **ptr) {
  (void)device;
  *ptr = lt_cpu_alloc(nbytes);
  if (!*ptr) {
    int64_t live, reserved, peak;
    lt_cpu_memory_stats(&live, &reserved, &peak);
    return lt_fail(LT_ERR_OOM, "out of host memory allocating %zu bytes (%lld bytes in live tensors)",
                   nbytes, (long long)live);
  }
  return LT_OK;
}

static void cpu_free(lt_device device, void *ptr, size_t nbytes) {
  (void)device;
  lt_cpu_free(ptr, nbytes);
}

static lt_status cpu_copy_bytes(lt_device device, void *dst, const void *src, size_t nbytes) {
  (void)device;
  memcpy(dst, src, nbytes);
  return LT_OK;
}

static lt_status cpu_synchronize(lt_device device) {
  (void)device;
  return LT_OK;
}

/* library attention: the f64 reference (kernels/cpu/sdpa_ref.c) */
static lt_status cpu_sdpa_prepare(const lt_sdpa_desc *d, int backward) {
  (void)backward;
  if (!lt_cpu_sdpa_supports(d))
    return lt_fail(LT_ERR_UNSUPPORTED, "scaled_dot_product_attention: the CPU reference takes bf16/f16, and a causal "
                                       "mask only with as many queries as keys");
  return LT_OK;
}
static lt_status sdpa_status(lt_status st) {
  return st == LT_OK ? st : lt_fail(st, "scaled_dot_product_attention: %s", st == LT_ERR_OOM ? "out of host memory" : "unsupported operands");
}
static lt_status cpu_sdpa_fwd(const lt_sdpa_desc *d) { return sdpa_status(lt_cpu_sdpa_fwd(d)); }
/* LUTRA_TEST_LIBRARY_BWD_REFUSES set: plays a library that refuses its
   backward after its forward ran (a spec checks lutra's fallback) */
static lt_status cpu_sdpa_bwd(const lt_sdpa_desc *d) {
  if (getenv("LUTRA_TEST_LIBRARY_BWD_REFUSES"))
    return lt_fail(LT_ERR_UNSUPPORTED, "scaled_dot_product_attention: the reference refuses its backward "
                                       "(LUTRA_TEST_LIBRARY_BWD_REFUSES)");
  return sdpa_status(lt_cpu_sdpa_bwd(d));
}

/* the kernel's scratch from the caching allocator (none when there is no
   memory for it: the kernel then sums each tensor's blocks in turn, to the
   same result) */
static lt_status cpu_grad_sum_squares(int n, const lt_optim_tensor *ts, double *out) {
  size_t bytes = lt_cpu_sum_squares_scratch(n, ts);
  double *scratch = bytes ? lt_cpu_alloc(bytes) : NULL;
  lt_status st = lt_cpu_grad_sum_squares(n, ts, scratch, out);
  lt_cpu_free(scratch, bytes);
  return st;
}

const lt_backend_i lt_backend_cpu = {
    .name = "cpu",
    .alloc = cpu_alloc,
    .free = cpu_free,
    .copy_to_host = cpu_copy_bytes,
    .copy_from_host = cpu_copy_bytes,
    .synchronize = cpu_synchronize,
    .copy = lt_cpu_copy,
    .fill = lt_cpu_fill,
    .unary = lt_cpu_unary,
    .binary = lt_cpu_binary,
    .binary_scalar = lt_cpu_binary_scalar,
    .where = lt_cpu_where,
    .clamp = lt_cpu_clamp,
    .reduce = lt_cpu_reduce,
    .matmul = lt_cpu_matmul,
    .index_select = lt_cpu_index_select,
    .index_add = lt_cpu_index_add,
    .gather = lt_cpu_gather,
    .scatter_add = lt_cpu_scatter_add,
    .uniform = lt_cpu_uniform,
    .normal = lt_cpu_normal,
    .layer_norm_fwd = lt_cpu_layer_norm_fwd,
    .layer_norm_bwd = lt_cpu_layer_norm_bwd,
    .rms_norm_fwd = lt_cpu_rms_norm_fwd,
    .rms_norm_bwd = lt_cpu_rms_norm_bwd,
    .attention_fwd = lt_cpu_attention_fwd,
    .attention_bwd = lt_cpu_attention_bwd,
    .sdpa_prepare = cpu_sdpa_prepare,
    .sdpa_fwd = cpu_sdpa_fwd,
    .sdpa_bwd = cpu_sdpa_bwd,
    .softmax_fwd = lt_cpu_softmax_fwd,
    .softmax_bwd = lt_cpu_softmax_bwd,
    .cross_entropy_fwd = lt_cpu_cross_entropy_fwd,
    .cross_entropy_bwd = lt_cpu_cross_entropy_bwd,
    .rope = lt_cpu_rope,
    .adamw = lt_cpu_adamw,
    .sgd = lt_cpu_sgd,
    .grad_sum_squares = cpu_grad_sum_squares,
};
