/*
 * selftest.cu: the CUDA emulator's own test (make test runs it): kernels
 * that break the rules the emulator claims to check, each of which must
 * fail its launch with the emulator's message, and correct kernels that
 * must pass (a block sum through shuffles and shared memory, a grid-stride
 * loop, the tensor-core product, ldmatrix and cp.async against their documented layouts and
 * ordering), and the host's mistakes with asynchrony (reading a result before
 * waiting, a stream that does not wait for another, a pinned buffer
 * changed under a queued copy), which must show. Built like kernels/cuda (launches rewritten by rewrite_launches.py,
 * cuda_emu.h included first) and linked with scheduler.cc and runtime.cc. Prints
 * "emu selftest: N passed, M failed".
 */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int passed, failed;

static void expect(bool ok, const char *what, const char *detail) {
  if (ok)
    passed++;
  else {
    failed++;
    printf("not ok - %s%s%s\n", what, detail ? ": " : "", detail ? detail : "");
  }
}

/* expects the last launch to have been refused (a bad configuration, at
   the launch) with a message containing needle */
static void expect_refused(const char *what, const char *needle) {
  cudaError_t e = cudaGetLastError();
  const char *msg = cudaGetErrorString(e);
  expect(e != cudaSuccess && strstr(msg, needle), what, msg);
}

/* expects the work queued on the default stream to fail when waited for,
   with a message containing needle (a kernel's fault shows where the host
   waits, as on a GPU) */
static void expect_fault(const char *what, const char *needle) {
  cudaError_t e = cudaStreamSynchronize(0);
  const char *msg = cudaGetErrorString(e);
  expect(e != cudaSuccess && strstr(msg, needle), what, msg);
  cudaGetLastError();
}

/* expects the launch to be accepted and to run without a fault */
static void expect_ok(const char *what) {
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess)
    e = cudaStreamSynchronize(0);
  expect(e == cudaSuccess, what, cudaGetErrorString(e));
}

__global__ void barrier_in_branch(int *out) {
  if (threadIdx.x < 16)
    __syncthreads(); /* half the block never gets here */
  out[threadIdx.x] = 1;
}

__global__ void two_barriers(int *out) {
  if (threadIdx.x % 2) { /* (different work around each, so the compiler keeps two barriers) */
    out[threadIdx.x] = 2;
    __syncthreads();
    out[threadIdx.x] += 3;
  } else {
    __syncthreads(); /* a different barrier instruction */
    out[threadIdx.x] = 5;
  }
}

__global__ void exit_before_barrier(int *out) {
  if (threadIdx.x == 3)
    return;
  __syncthreads();
  out[threadIdx.x] = 1;
}

__global__ void shuffle_with_exited_lane(float *out) {
  if (threadIdx.x == 31)
    return;
  out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, (float)threadIdx.x, 1);
}

/* thread 0 writes shared memory and the others read it without a barrier:
   in one of the two thread orders the readers run first */
__global__ void missing_barrier(int *out) {
  __shared__ int value;
  if (threadIdx.x == 0)
    value = 7;
  out[threadIdx.x] = threadIdx.x == 0 ? 7 : value;
  __syncthreads();
  if (threadIdx.x == 0)
    value = 0;
}

/* two warps: each reads the other warp's slot, meets its warp at a shuffle, then overwrites its own slot
   with no barrier between: a race that warps moving in step never show */
__global__ void warps_apart(int *out) {
  __shared__ int slot[64];
  unsigned i = threadIdx.x;
  slot[i] = (int)i;
  __syncthreads();
  int other = __shfl_xor_sync(0xffffffffu, slot[i ^ 32], 0);
  slot[i] = -1;
  out[i] = other;
}

__global__ void block_sum(const float *x, float *out, int n) {
  __shared__ float partial[32];
  float v = 0;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    v += x[i];
  for (int o = 16; o > 0; o >>= 1)
    v += __shfl_xor_sync(0xffffffffu, v, o);
  if (threadIdx.x % 32 == 0)
    partial[threadIdx.x / 32] = v;
  __syncthreads();
  if (threadIdx.x < 32) {
    v = threadIdx.x < blockDim.x / 32 ? partial[threadIdx.x] : 0;
    for (int o = 16; o > 0; o >>= 1)
      v += __shfl_xor_sync(0xffffffffu, v, o);
    if (threadIdx.x == 0)
      out[blockIdx.x] = v;
  }
}

/* reads shared memory no thread wrote in this block */
__global__ void read_unwritten_shared(int *out) {
  __shared__ int fresh[4];
  out[blockIdx.x] = fresh[blockIdx.x % 4];
  __syncthreads();
  fresh[blockIdx.x % 4] = 5; /* (the next block must not see this) */
}

/* lanes read a lane outside the shuffle's (partial) mask */
__global__ void shuffle_outside_mask(float *out) {
  if (threadIdx.x < 16)
    out[threadIdx.x] = __shfl_xor_sync(0x0000ffffu, (float)threadIdx.x, 16);
}

__global__ void nothing(void) {}

/* one stream writes what another reads, with no event between */
__global__ void stream_writes(int *p) { p[0] = 5; }
__global__ void stream_reads(const int *p, int *out) { out[0] = p[0]; }

/* every block adds to one word without an atomic: lost updates on a GPU */
__global__ void every_block_adds(int *out) {
  if (threadIdx.x == 0)
    *out += 1;
}

#if LT_EMU_TSAN
/* Under ThreadSanitizer (make emu-tsan) the races above must be reported,
   and the correct kernels must not be: the sanitizers call this hook with
   each report's summary line. */
static int races;
extern "C" void __sanitizer_report_error_summary(const char *summary) {
  if (strstr(summary, "data race"))
    races++;
}
#endif

__global__ void set_value(int *p, int v) { *p = v; }
__global__ void copy_value(const int *from, int *to) { *to = *from; }

/* Work runs in stream order when the host waits for it, not before: each
   of the host's mistakes with asynchrony shows as on a GPU. */
static void check_asynchrony(int *d) {
  const char *sync = getenv("LUTRA_EMU_SYNC");
  if (sync && *sync && strcmp(sync, "0") != 0) {
    printf("skip - asynchrony (LUTRA_EMU_SYNC runs work as it is queued)\n");
    return;
  }
  cudaStream_t a, b;
  cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking);
  cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking);
  int *pinned = NULL;
  cudaMallocHost((void **)&pinned, 4 * sizeof(int));

  set_value<<<1, 1, 0, a>>>(d, 42);
  cudaMemcpyAsync(pinned, d, sizeof(int), cudaMemcpyDeviceToHost, a);
  expect(pinned[0] != 42, "pinned memory read before waiting does not hold the queued copy's result", NULL);
  cudaStreamSynchronize(a);
  expect(pinned[0] == 42, "pinned memory holds the copy's result after cudaStreamSynchronize", NULL);

  int got = 0;
  set_value<<<1, 1, 0, a>>>(d, 7);
  cudaMemcpyAsync(&got, d, sizeof(int), cudaMemcpyDeviceToHost, a);
  expect(got == 7, "a copy to pageable memory waits for the stream's work before it", NULL);

  set_value<<<1, 1, 0, a>>>(d, 1);
  copy_value<<<1, 1, 0, b>>>(d, d + 1); /* no wait for stream a */
  cudaStreamSynchronize(b);
  cudaMemcpyAsync(&got, d + 1, sizeof(int), cudaMemcpyDeviceToHost, b);
  expect(got == 7, "a stream that does not wait for another's event reads the value before that stream's work",
         NULL);
  cudaEvent_t e;
  cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
  set_value<<<1, 1, 0, a>>>(d, 2);
  cudaEventRecord(e, a);
  cudaStreamWaitEvent(b, e, 0);
  cudaEventDestroy(e); /* (legal: the wait keeps its point) */
  copy_value<<<1, 1, 0, b>>>(d, d + 1);
  cudaMemcpyAsync(&got, d + 1, sizeof(int), cudaMemcpyDeviceToHost, b);
  expect(got == 2, "a stream waiting for another's event reads that stream's result", NULL);

  pinned[1] = 5;
  cudaMemcpyAsync(d + 2, &pinned[1], sizeof(int), cudaMemcpyHostToDevice, a);
  pinned[1] = 6; /* the host's mistake: the copy has not read it yet */
  cudaMemcpyAsync(&got, d + 2, sizeof(int), cudaMemcpyDeviceToHost, a);
  expect(got == 6, "a pinned source changed before its queued copy ran is copied as changed", NULL);
  int pageable = 5;
  cudaMemcpyAsync(d + 2, &pageable, sizeof(int), cudaMemcpyHostToDevice, a);
  pageable = 6;
  cudaMemcpyAsync(&got, d + 2, sizeof(int), cudaMemcpyDeviceToHost, a);
  expect(got == 5, "a pageable source is read when the copy is queued", NULL);

  cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
  set_value<<<1, 1, 0, a>>>(d, 3);
  cudaEventRecord(e, a);
  bool early = cudaEventQuery(e) == cudaErrorNotReady && cudaEventQuery(e) == cudaErrorNotReady;
  expect(early && cudaEventQuery(e) == cudaSuccess, "an event with work before it is not ready twice, then ready",
         NULL);
  cudaMemcpyAsync(&got, d, sizeof(int), cudaMemcpyDeviceToHost, b);
  expect(got == 3, "an event that reported ready had its work done", NULL);
  cudaEventRecord(e, a);
  expect(cudaEventQuery(e) == cudaSuccess, "an event recorded after all the work is ready at once", NULL);
  cudaEventDestroy(e);

  barrier_in_branch<<<1, 32, 0, a>>>(d + 3);
  expect(cudaGetLastError() == cudaSuccess, "a kernel that will fault is accepted at its launch", NULL);
  cudaError_t err = cudaStreamSynchronize(a);
  expect(err == cudaErrorLaunchFailure, "its fault is returned where the host waits for its stream",
         cudaGetErrorString(err));
  expect(cudaStreamSynchronize(a) == cudaSuccess && cudaGetLastError() == cudaSuccess,
         "and only once (not again by the next wait or cudaGetLastError)", NULL);
  cudaFreeHost(pinned);
}

/* one warp: C (16x8) = A (16x16) B (16x8) of bf16 bits through the emulated mma.m16n8k16, each lane
   loading its fragments as the PTX ISA's layout puts them (written here in its word form: A's register r
   of lane l holds the pair at row l/4 + 8 (r%2), columns 2 (l%4 + 4 (r/2)); B's holds the pair at rows
   2 (l%4 + 4 r), column l/4; C's value i is row l/4 + 8 (i/2), column 2 (l%4) + i%2) */
__global__ void mma_product(const uint16_t *A, const uint16_t *B, float *C) {
  unsigned l = threadIdx.x;
  uint32_t a[4], b[2];
  float c[4] = {0, 0, 0, 0};
  for (unsigned r = 0; r < 4; r++) {
    unsigned row = l / 4 + 8 * (r % 2), col = 2 * (l % 4 + 4 * (r / 2));
    a[r] = A[row * 16 + col] | (uint32_t)A[row * 16 + col + 1] << 16;
  }
  for (unsigned r = 0; r < 2; r++) {
    unsigned k = 2 * (l % 4 + 4 * r), n = l / 4;
    b[r] = B[k * 8 + n] | (uint32_t)B[(k + 1) * 8 + n] << 16;
  }
  lt_emu_mma16816<__nv_bfloat16>(c, a, b);
  for (unsigned i = 0; i < 4; i++)
    C[(l / 4 + 8 * (i / 2)) * 8 + 2 * (l % 4) + i % 2] = c[i];
}

/* half the warp shuffles while the other half multiplies */
__global__ void shuffle_meets_mma(float *out) {
  uint32_t a[4] = {0, 0, 0, 0}, b[2] = {0, 0};
  float c[4] = {0, 0, 0, 0};
  if (threadIdx.x < 16)
    out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.0f, 1);
  else
    lt_emu_mma16816<__nv_bfloat16>(c, a, b);
}

/* the bf16 bits of a small integer (exact) */
static uint16_t bf16_bits(int v) {
  float f = (float)v;
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return (uint16_t)(u >> 16);
}

static void check_mma(void) {
  uint16_t ha[256], hb[128];
  int ia[256], ib[128];
  for (int i = 0; i < 256; i++)
    ha[i] = bf16_bits(ia[i] = (i * 7 + 3) % 11 - 5);
  for (int i = 0; i < 128; i++)
    hb[i] = bf16_bits(ib[i] = (i * 5 + 1) % 9 - 4);
  uint16_t *da, *db;
  float *dc, hc[128];
  cudaMalloc((void **)&da, sizeof ha);
  cudaMalloc((void **)&db, sizeof hb);
  cudaMalloc((void **)&dc, sizeof hc);
  cudaMemcpyAsync(da, ha, sizeof ha, cudaMemcpyHostToDevice, 0);
  cudaMemcpyAsync(db, hb, sizeof hb, cudaMemcpyHostToDevice, 0);
  mma_product<<<1, 32>>>(da, db, dc);
  cudaMemcpyAsync(hc, dc, sizeof hc, cudaMemcpyDeviceToHost, 0);
  int wrong = 0;
  for (int m = 0; m < 16; m++)
    for (int n = 0; n < 8; n++) {
      int want = 0;
      for (int k = 0; k < 16; k++)
        want += ia[m * 16 + k] * ib[k * 8 + n];
      wrong += hc[m * 8 + n] != (float)want;
    }
  char buf[64];
  snprintf(buf, sizeof buf, "%d of 128 products wrong", wrong);
  expect(wrong == 0, "the tensor-core product mma.m16n8k16 multiplies fragments laid out as PTX documents them", buf);
  shuffle_meets_mma<<<1, 32>>>(dc);
  expect_fault("a warp whose lanes meet at a shuffle and a matrix product fails the launch", "different warp operations");
  cudaFree(da);
  cudaFree(db);
  cudaFree(dc);
}

/* one warp: ldmatrix .x4 of the 32x8 matrix M in shared memory (lane l gives the address of row l, which
   is row l % 8 of 8x8 matrix l / 8), without and with .trans; out gets each lane's four registers */
__global__ void ldmatrix_words(const uint16_t *M, uint32_t *out) {
  __shared__ __align__(16) uint16_t s[32 * 8];
  unsigned l = threadIdx.x;
  for (unsigned i = l; i < 256; i += 32)
    s[i] = M[i];
  __syncthreads();
  uint32_t r[4];
  lt_emu_ldmatrix_x4(r, s + 8 * l, false);
  for (unsigned m = 0; m < 4; m++)
    out[4 * l + m] = r[m];
  lt_emu_ldmatrix_x4(r, s + 8 * l, true);
  for (unsigned m = 0; m < 4; m++)
    out[128 + 4 * l + m] = r[m];
}

/* ldmatrix with lane 5's row address 2 bytes off (misaligned), or every lane's in global memory */
__global__ void ldmatrix_bad(uint16_t *global, int misaligned) {
  __shared__ __align__(16) uint16_t s[32 * 8 + 8];
  uint32_t r[4];
  unsigned l = threadIdx.x;
  lt_emu_ldmatrix_x4(r, misaligned ? s + 8 * l + (l == 5) : global + 8 * l, false);
  global[l] = (uint16_t)r[0];
}

/* one thread: cp.async copies land at the wait that covers their group, not before, in the emulator's
   lazy blocks (at their issue in its eager ones: out[7] says which); a partial copy ends in zeros; a
   copy not yet committed waits for a later wait. out[0..6] as commented (lazy). */
__global__ void async_copies(const uint32_t *src, uint32_t *out) {
  __shared__ __align__(16) uint32_t s[3][4];
  for (int j = 0; j < 3; j++)
    for (int i = 0; i < 4; i++)
      s[j][i] = 7;
  lt_emu_cp_async16(s[0], src, 16); /* group 0 */
  lt_emu_cp_async_commit();
  lt_emu_cp_async16(s[1], src + 4, 8); /* group 1: 8 bytes, then zeros */
  lt_emu_cp_async_commit();
  lt_emu_cp_async16(s[2], src, 16); /* not committed */
  out[0] = s[0][0];                 /* 7: no wait yet */
  lt_emu_cp_async_wait(1);          /* group 0 lands */
  out[1] = s[0][0];                 /* src[0] */
  out[2] = s[1][0];                 /* 7 */
  lt_emu_cp_async_wait(0);          /* group 1 lands */
  out[3] = s[1][1];                 /* src[5] */
  out[4] = s[1][2];                 /* 0 */
  out[5] = s[2][0];                 /* 7: its group is not committed */
  lt_emu_cp_async_commit();
  lt_emu_cp_async_wait(0);
  out[6] = s[2][3]; /* src[3] */
  out[7] = lt_emu_async_eager;
}

/* cp.async into global memory */
__global__ void async_to_global(uint32_t *global) { lt_emu_cp_async16(global + 4, global, 16); }

static void check_ldmatrix_and_cp_async(void) {
  uint16_t hm[256];
  uint32_t hout[256];
  for (int i = 0; i < 256; i++)
    hm[i] = (uint16_t)(i * 37 + 11);
  uint16_t *dm;
  uint32_t *dout;
  cudaMalloc((void **)&dm, sizeof hm);
  cudaMalloc((void **)&dout, sizeof hout);
  cudaMemcpyAsync(dm, hm, sizeof hm, cudaMemcpyHostToDevice, 0);
  ldmatrix_words<<<1, 32>>>(dm, dout);
  cudaMemcpyAsync(hout, dout, sizeof hout, cudaMemcpyDeviceToHost, 0);
  cudaStreamSynchronize(0);
  /* the PTX ISA's figure for one 8x8 matrix, in word form: lane l holds row l / 4, columns 2 (l % 4) and
     2 (l % 4) + 1; .trans reads the matrix column-major, so that pair is rows 2 (l % 4) and 2 (l % 4) + 1
     of column l / 4 as stored */
  int wrong = 0, wrong_t = 0;
  for (int l = 0; l < 32; l++)
    for (int m = 0; m < 4; m++) {
      int row = 8 * m + l / 4, col = 2 * (l % 4);
      uint32_t want = hm[row * 8 + col] | (uint32_t)hm[row * 8 + col + 1] << 16;
      int trow = 8 * m + 2 * (l % 4), tcol = l / 4;
      uint32_t want_t = hm[trow * 8 + tcol] | (uint32_t)hm[(trow + 1) * 8 + tcol] << 16;
      wrong += hout[4 * l + m] != want;
      wrong_t += hout[128 + 4 * l + m] != want_t;
    }
  char buf[96];
  snprintf(buf, sizeof buf, "%d of 128 words wrong", wrong);
  expect(wrong == 0, "ldmatrix .x4 gives each lane the pairs of the PTX ISA's fragment layout", buf);
  snprintf(buf, sizeof buf, "%d of 128 words wrong", wrong_t);
  expect(wrong_t == 0, "ldmatrix .x4 .trans gives each lane the transposed pairs", buf);
  ldmatrix_bad<<<1, 32>>>(dm, 1);
  expect_fault("ldmatrix with a misaligned row address fails the launch", "lane 5's row address");
  ldmatrix_bad<<<1, 32>>>(dm, 0);
  expect_fault("ldmatrix from global memory fails the launch", "not in shared memory");

  uint32_t hsrc[8] = {101, 102, 103, 104, 105, 106, 107, 108}, got[8];
  uint32_t *dsrc;
  cudaMalloc((void **)&dsrc, sizeof hsrc);
  cudaMemcpyAsync(dsrc, hsrc, sizeof hsrc, cudaMemcpyHostToDevice, 0);
  uint32_t lazy[7] = {7, 101, 7, 106, 0, 7, 104}, eager[7] = {101, 101, 105, 106, 0, 101, 104};
  int seen[2] = {0, 0}, wrong_async = 0;
  for (int launch = 0; launch < 16; launch++) { /* (each block draws its schedule) */
    async_copies<<<1, 1>>>(dsrc, dout);
    cudaMemcpyAsync(got, dout, sizeof got, cudaMemcpyDeviceToHost, 0);
    cudaStreamSynchronize(0);
    seen[got[7] & 1]++;
    if (memcmp(got, got[7] ? eager : lazy, sizeof lazy)) {
      wrong_async++;
      snprintf(buf, sizeof buf, "%s block got %u %u %u %u %u %u %u", got[7] ? "eager" : "lazy", got[0], got[1],
               got[2], got[3], got[4], got[5], got[6]);
    }
  }
  if (!wrong_async)
    snprintf(buf, sizeof buf, "%d lazy and %d eager blocks", seen[0], seen[1]);
  expect(!wrong_async && seen[0] && seen[1],
         "cp.async copies land at their issue or at the wait covering their group (blocks see both), "
         "zero-filled past the source bytes", buf);
  async_to_global<<<1, 1>>>(dsrc);
  expect_fault("cp.async into global memory fails the launch", "not in shared memory");
  cudaFree(dm);
  cudaFree(dout);
  cudaFree(dsrc);
}

int main(void) {
  int *d = NULL;
  float *f = NULL, *sums = NULL;
  cudaMalloc((void **)&d, 1024 * sizeof(int));
  cudaMalloc((void **)&f, 4096 * sizeof(float));
  cudaMalloc((void **)&sums, 4 * sizeof(float));

  barrier_in_branch<<<1, 32>>>(d);
  expect_fault("a barrier that half the block skips fails the launch", "cannot go on");
  two_barriers<<<1, 32>>>(d);
  expect_fault("threads at two different barriers fail the launch", "different __syncthreads");
  exit_before_barrier<<<1, 32>>>(d);
  expect_fault("a barrier that a thread exits before fails the launch", "exit before");
  shuffle_with_exited_lane<<<1, 32>>>(f);
  expect_fault("a full-warp shuffle naming an exited lane fails the launch", "has exited");

  /* the same in blocks of four warps, which some launches run a warp at a time */
  int multi_wrong = 0;
  char multi_msg[200] = "";
  for (int launch = 0; launch < 8; launch++) {
    const char *needles[4] = {"cannot go on", "different __syncthreads", "exit before", "has exited"};
    for (int k = 0; k < 4; k++) {
      if (k == 0)
        barrier_in_branch<<<1, 128>>>(d);
      else if (k == 1)
        two_barriers<<<1, 128>>>(d);
      else if (k == 2)
        exit_before_barrier<<<1, 128>>>(d);
      else
        shuffle_with_exited_lane<<<1, 128>>>(f);
      cudaError_t e = cudaStreamSynchronize(0);
      const char *msg = cudaGetErrorString(e);
      if (e == cudaSuccess || !strstr(msg, needles[k])) {
        multi_wrong++;
        snprintf(multi_msg, sizeof multi_msg, "fault %d: %s", k, msg);
      }
      cudaGetLastError();
    }
  }
  expect(multi_wrong == 0, "those faults fail 4-warp launches too, whichever warps run first", multi_msg);

  shuffle_outside_mask<<<1, 32>>>(f);
  expect_fault("a shuffle reading a lane outside its mask fails the launch", "outside the shuffle's mask");

  nothing<<<0, 32>>>();
  expect_refused("a zero-sized grid is an invalid configuration", "zero-sized");
  nothing<<<1, 1025>>>();
  expect_refused("1025 threads per block is an invalid configuration", "1024 threads");
  nothing<<<dim3(1, 65536), 32>>>();
  expect_refused("grid y beyond 65535 is an invalid configuration", "65535");
  nothing<<<1, 32, 64 * 1024>>>();
  expect_refused("64 KiB of dynamic shared memory is an invalid configuration", "48 KiB");
  nothing<<<1, 32>>>();
  expect_ok("a correct launch after faults runs (the error was cleared)");
  check_mma();
  check_ldmatrix_and_cp_async();

  bool race_seen = false;
  for (int launch = 0; launch < 2; launch++) { /* the second runs its threads in the other order */
    for (int i = 0; i < 32; i++)
      d[i] = -1;
    missing_barrier<<<1, 32>>>(d);
    expect_ok("the racy kernel itself launches");
    for (int i = 1; i < 32; i++)
      race_seen = race_seen || d[i] != 7;
  }
  expect(race_seen, "a read of shared memory without a barrier sees a stale value in one thread order", NULL);
  bool warps_race_seen = false;
  for (int launch = 0; launch < 16; launch++) { /* (about half the blocks run a warp at a time) */
    warps_apart<<<1, 64>>>(d);
    expect_ok("the kernel whose warps race launches");
    for (int i = 0; i < 64; i++)
      warps_race_seen = warps_race_seen || d[i] != (i ^ 32);
  }
  expect(warps_race_seen, "a warp that overwrites what another warp reads, with no barrier between, shows in "
         "blocks that run a warp at a time", NULL);
#if LT_EMU_TSAN
  expect(races > 0, "ThreadSanitizer reports the read of shared memory without a barrier", NULL);
  int reported = races;
#endif

  for (int i = 0; i < 4096; i++)
    f[i] = (float)(i % 7);
  for (int launch = 0; launch < 2; launch++) {
    block_sum<<<4, 256>>>(f, sums, 4096);
    expect_ok("a block sum through shuffles and shared memory launches");
    double total = 0, want = 0;
    for (int b = 0; b < 4; b++)
      total += sums[b];
    for (int i = 0; i < 4096; i++)
      want += i % 7;
    char buf[96];
    snprintf(buf, sizeof buf, "got %g, want %g", total, want);
    expect(total == want, "a block sum through shuffles and shared memory is right in both orders", buf);
  }

#if LT_EMU_TSAN
  expect(races == reported, "ThreadSanitizer reports nothing in a correct block sum", NULL);
#endif
  check_asynchrony(d);
#if LT_EMU_TSAN
  expect(races > reported, "ThreadSanitizer reports the host's and the streams' mistakes with asynchrony", NULL);
  reported = races;
  every_block_adds<<<4, 32>>>(d);
  expect_ok("the kernel adding to one word from every block launches");
  expect(races > reported, "ThreadSanitizer reports blocks adding to one word without an atomic", NULL);
  reported = races;
  cudaStream_t s1, s2;
  cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking);
  cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking);
  stream_writes<<<1, 1, 0, s1>>>(d + 16);
  stream_reads<<<1, 1, 0, s2>>>(d + 16, d + 17);
  cudaStreamSynchronize(s2);
  cudaStreamSynchronize(s1);
  expect(races > reported, "ThreadSanitizer reports two streams' kernels touching one word with no event between",
         NULL);
#endif

  read_unwritten_shared<<<2, 1>>>(d);
  expect_ok("the kernel reading unwritten shared memory launches");
  expect(d[0] == -1 && d[1] == -1, "shared memory holds garbage (all ones) at the start of every block", NULL);

  unsigned char *fresh = NULL;
  cudaMalloc((void **)&fresh, 64);
  expect(fresh[0] == 0xff && fresh[63] == 0xff, "new device memory holds garbage (0xff), not zeros", NULL);
  void *huge = NULL;
  expect(cudaMalloc(&huge, (size_t)1 << 50) == cudaErrorMemoryAllocation && !huge,
         "an allocation beyond the capacity is cudaErrorMemoryAllocation", NULL);
  cudaGetLastError();

  printf("emu selftest: %d passed, %d failed\n", passed, failed);
  return failed != 0;
}
