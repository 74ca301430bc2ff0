/*
 * nccl_selftest.cc: the CUDA emulator's NCCL of several ranks
 * (nccl_ranks.cc) against what it claims, with forked processes as the
 * ranks (no MPI): reductions in rank order (an f32 sum whose order shows)
 * with bf16 rounded at each addition, ncclAvg as NCCL computes it (floats
 * pre-multiplied by 1/n, integers divided after), max and min, broadcast,
 * all_gather and reduce_scatter in several pieces (small slots), the result
 * landing in stream order (not before the host waits), every rank's result
 * bitwise the same; mismatched calls refused on every rank and the
 * communicator working after; a rank that ended, and one that never came to
 * ncclCommInitRank (LUTRA_EMU_NCCL_TIMEOUT=1), named in the others' errors;
 * nothing left in /dev/shm. Prints "nccl selftest: N passed, M failed"
 * (tests/run.sh).
 */
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <vector>

enum { N = 3 };
static int failed_here;

static void expect(int rank, bool ok, const char *what, const char *detail = "") {
  if (!ok) {
    failed_here++;
    printf("FAIL: rank %d: %s %s\n", rank, what, detail);
    fflush(stdout);
  }
}

static void *device(size_t bytes) {
  void *p = nullptr;
  cudaMalloc(&p, bytes);
  return p;
}

/* (a pageable source is read when the copy is queued) */
static void put(void *d, const void *src, size_t bytes, cudaStream_t s) {
  cudaMemcpyAsync(d, src, bytes, cudaMemcpyHostToDevice, s);
}

template <class T> static std::vector<T> run_and_read(void *d, size_t n, cudaStream_t s) {
  std::vector<T> out(n);
  cudaMemcpyAsync(out.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost, s); /* (pageable: waits) */
  return out;
}

/* one rank of the collectives' checks; returns its failures */
static int collectives(int rank, ncclUniqueId id) {
  ncclComm_t c;
  if (ncclCommInitRank(&c, N, id, rank) != ncclSuccess) {
    expect(rank, false, "ncclCommInitRank of 3 ranks");
    return failed_here;
  }
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  /* f32 sum in rank order: (1e8 + -1e8) + 1 = 1, where 1e8 + (-1e8 + 1) would be 0 */
  float mine[3] = {1e8f, -1e8f, 1.0f};
  float *f = (float *)device(4);
  put(f, &mine[rank], 4, s);
  expect(rank, ncclAllReduce(f, f, 1, ncclFloat32, ncclSum, c, s) == ncclSuccess, "f32 all_reduce");
  expect(rank, run_and_read<float>(f, 1, s)[0] == 1.0f, "the f32 sum in rank order");
  /* bf16: 1 + 2^-8 rounds to 1 (to even), twice: 1; rounded once the sum 1 + 2^-7 is a bf16 */
  __nv_bfloat16 b = __float2bfloat16(rank == 0 ? 1.0f : 1.0f / 256);
  __nv_bfloat16 *db = (__nv_bfloat16 *)device(2);
  put(db, &b, 2, s);
  ncclAllReduce(db, db, 1, ncclBfloat16, ncclSum, c, s);
  expect(rank, __bfloat162float(run_and_read<__nv_bfloat16>(db, 1, s)[0]) == 1.0f, "bf16 rounded at each addition");
  /* avg: f32 pre-multiplied by float(1/3), int32 (1 + 2 + 4) / 3 = 2 */
  float x = 0.1f * (rank + 1), third = (float)(1.0 / 3), want = 0;
  for (int q = 0; q < N; q++)
    want += (0.1f * (q + 1)) * third;
  put(f, &x, 4, s);
  ncclAllReduce(f, f, 1, ncclFloat32, ncclAvg, c, s);
  expect(rank, run_and_read<float>(f, 1, s)[0] == want, "f32 avg as NCCL's pre-multiplied sum");
  int iv = 1 << rank, *di = (int *)device(4);
  put(di, &iv, 4, s);
  ncclAllReduce(di, di, 1, ncclInt32, ncclAvg, c, s);
  expect(rank, run_and_read<int>(di, 1, s)[0] == 2, "int32 avg divided after the sum");
  put(di, &iv, 4, s);
  ncclAllReduce(di, di, 1, ncclInt32, ncclMax, c, s);
  expect(rank, run_and_read<int>(di, 1, s)[0] == 4, "int32 max");
  /* 1000 f32 in pieces of 512 (slots of 2048 bytes): sum, stream order */
  const size_t n = 1000;
  std::vector<float> v(n);
  for (size_t i = 0; i < n; i++)
    v[i] = (float)(rank * 1000 + i);
  float *dv = (float *)device(n * 4), *pinned = nullptr;
  cudaMallocHost((void **)&pinned, n * 4);
  pinned[0] = -1;
  put(dv, v.data(), n * 4, s);
  ncclAllReduce(dv, dv, n, ncclFloat32, ncclSum, c, s);
  cudaMemcpyAsync(pinned, dv, n * 4, cudaMemcpyDeviceToHost, s); /* (pinned: runs when the host waits) */
#if !LT_EMU_TSAN /* (a read the race detector rightly reports: the host does not wait) */
  expect(rank, pinned[0] == -1, "the result not there before the host waits (stream order)");
#endif
  cudaStreamSynchronize(s);
  bool ok = true;
  for (size_t i = 0; i < n; i++)
    ok = ok && pinned[i] == (float)(3000 + 3 * i);
  expect(rank, ok, "an all_reduce of 1000 f32 in pieces");
  /* broadcast from root 2 */
  put(dv, v.data(), n * 4, s);
  ncclBroadcast(dv, dv, n, ncclFloat32, 2, c, s);
  std::vector<float> got = run_and_read<float>(dv, n, s);
  expect(rank, got[0] == 2000.0f && got[n - 1] == 2999.0f, "broadcast from root 2");
  /* all_gather of 700 f32 a rank, reduce_scatter of 300 a rank (pieces of 170) */
  float *all = (float *)device(N * 700 * 4);
  put(dv, v.data(), 700 * 4, s);
  ncclAllGather(dv, all, 700, ncclFloat32, c, s);
  got = run_and_read<float>(all, N * 700, s);
  ok = true;
  for (int q = 0; q < N; q++)
    for (size_t i = 0; i < 700; i++)
      ok = ok && got[q * 700 + i] == (float)(q * 1000 + i);
  expect(rank, ok, "all_gather in rank order, in pieces");
  std::vector<float> whole(N * 300);
  for (size_t i = 0; i < whole.size(); i++)
    whole[i] = (float)(i * (rank + 1));
  put(all, whole.data(), whole.size() * 4, s);
  ncclReduceScatter(all, dv, 300, ncclFloat32, ncclSum, c, s);
  got = run_and_read<float>(dv, 300, s);
  ok = true;
  for (size_t i = 0; i < 300; i++)
    ok = ok && got[i] == (float)((rank * 300 + i) * 6);
  expect(rank, ok, "reduce_scatter: this rank's chunk of the sum, in pieces");
  /* mismatched counts: refused on every rank, naming both; the communicator carries on */
  ncclResult_t r = ncclAllReduce(dv, dv, rank == 1 ? 4 : 3, ncclFloat32, ncclSum, c, s);
  const char *msg = ncclGetErrorString(r);
  expect(rank, r == ncclInvalidUsage && strstr(msg, "calls differ") && strstr(msg, "rank 1 all_reduce of 4 float32"),
         "mismatched counts refused on every rank", msg);
  put(f, &mine[rank], 4, s);
  expect(rank, ncclAllReduce(f, f, 1, ncclFloat32, ncclSum, c, s) == ncclSuccess && run_and_read<float>(f, 1, s)[0] == 1,
         "a call after the refused one");
  cudaFreeHost(pinned);
  ncclCommDestroy(c);
  return failed_here;
}

/* rank 2 ends after the rendezvous: the others' next call names it */
static int ended(int rank, ncclUniqueId id) {
  ncclComm_t c;
  if (ncclCommInitRank(&c, N, id, rank) != ncclSuccess) {
    expect(rank, false, "ncclCommInitRank of 3 ranks");
    return failed_here;
  }
  if (rank == 2)
    _exit(0);
  float *f = (float *)device(4);
  ncclResult_t r = ncclAllReduce(f, f, 1, ncclFloat32, ncclSum, c, 0);
  const char *msg = ncclGetErrorString(r);
  expect(rank, r == ncclRemoteError && strstr(msg, "all_reduce (call 0") && strstr(msg, "rank 2 (pid") &&
                   strstr(msg, "ended before arriving"),
         "a rank that ended is named", msg);
  r = ncclAllReduce(f, f, 1, ncclFloat32, ncclSum, c, 0);
  expect(rank, r == ncclRemoteError && strstr(ncclGetErrorString(r), "lost a rank earlier"), "later calls fail at once");
  return failed_here;
}

/* rank 2 never comes to ncclCommInitRank */
static int never(int rank, ncclUniqueId id) {
  if (rank == 2)
    return 0;
  ncclComm_t c;
  ncclResult_t r = ncclCommInitRank(&c, N, id, rank);
  const char *msg = ncclGetErrorString(r);
  expect(rank, r == ncclRemoteError && strstr(msg, "ncclCommInitRank on rank") && strstr(msg, "rank 2 never arrived"),
         "a rank that never joins is named", msg);
  return failed_here;
}

/* segments named by this process's unique ids */
static int leftovers() {
  char mine[64];
  int n = 0, len = snprintf(mine, sizeof mine, "lutra-emu-nccl-%d-", (int)getpid());
  DIR *d = opendir("/dev/shm");
  for (struct dirent *e; d && (e = readdir(d));)
    n += strncmp(e->d_name, mine, len) == 0;
  if (d)
    closedir(d);
  return n;
}

int main(void) {
  setenv("LUTRA_EMU_NCCL_SLOT_BYTES", "2048", 1);
  setenv("LUTRA_EMU_NCCL_TIMEOUT", "1", 1);
  int passed = 0, failed = 0;
  struct {
    const char *name;
    int (*rank)(int, ncclUniqueId);
  } cases[] = {{"collectives of 3 ranks", collectives},
               {"a rank that ended", ended},
               {"a rank that never joined", never}};
  for (auto &k : cases) {
    ncclUniqueId id;
    ncclGetUniqueId(&id);
    pid_t pids[N];
    for (int q = 0; q < N; q++) {
      fflush(stdout);
      if ((pids[q] = fork()) == 0)
        _exit(k.rank(q, id) ? 1 : 0);
    }
    bool ok = true;
    for (int q = 0; q < N; q++) {
      int st = 0;
      waitpid(pids[q], &st, 0);
      ok = ok && WIFEXITED(st) && WEXITSTATUS(st) == 0;
    }
    printf("%s - %s\n", ok ? "ok" : "not ok", k.name);
    (ok ? passed : failed)++;
  }
  bool clean = leftovers() == 0;
  printf("%s - nothing left in /dev/shm\n", clean ? "ok" : "not ok");
  (clean ? passed : failed)++;
  printf("nccl selftest: %d passed, %d failed\n", passed, failed);
  return failed != 0;
}
