/*
 * nccl_ranks.cc: the emulated NCCL's communicators of several ranks, each
 * rank a process with its own emulated device (as on a node with one GPU
 * per rank), all on one machine.
 *
 * The unique id names a POSIX shared-memory segment. ncclCommInitRank maps
 * it, records the rank's pid and waits for every rank (the rendezvous);
 * then rank 0 unlinks the name, so nothing stays in /dev/shm however the
 * job ends. The segment holds a barrier (each rank's count of barriers
 * passed, and a futex word every arrival bumps), each rank's description of
 * its current call, and an exchange area of one slot per rank.
 *
 * A collective runs when it is called, not when its stream runs: the host
 * first waits for the stream's work so far (the inputs), then the ranks
 * exchange in pieces of at most a slot each, two barriers a piece (written,
 * read), and the result lands in the receive buffer in the stream's order,
 * queued as the one-rank copy is (a host that reads it before waiting
 * still sees the old data). Meeting at the call is what keeps the ranks
 * from waiting for each other's queues: a rank's queue runs only when its
 * host waits, so a collective run from the queue would wait for a rank
 * whose host waits for something else (an MPI call, a print on rank 0).
 * The price: the call blocks until every rank has made it, where NCCL's
 * returns at once, so ranks that call collectives and host-side blocking
 * calls in different orders, which a GPU forgives, meet the timeout here.
 *
 * Results are NCCL's, computed the same way on every rank: reductions in
 * rank order (0, 1, ...), so every rank gets bitwise the same result;
 * bf16 and f16 rounded to their type after each operation, as NCCL's
 * kernels do (they add in float, one pair at a time); avg as ncclAvg:
 * floats multiplied by 1/nranks (in their type) before the sum, integers
 * summed then divided.
 *
 * The first barrier of a call also checks that the ranks' calls agree
 * (collective, count, type, op, root), which NCCL does not (it hangs or
 * corrupts): a mismatch fails on every rank, naming each rank's call. A rank
 * that does not come within LUTRA_EMU_NCCL_TIMEOUT seconds (120), or whose
 * process has ended, fails the call on the others, naming the collective,
 * the call and the missing ranks; the communicator then fails every call.
 */
#include "nccl_emu.h"

#include "emu_queue.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

namespace nccl_emu {

enum { MAX_RANKS = 256, MIN_SLOT = 8 * MAX_RANKS };

/* what the unique id's 128 bytes hold */
struct id_body {
  char magic[16];
  char name[80];
  unsigned long long slot_bytes;
};
static_assert(sizeof(id_body) <= sizeof(ncclUniqueId), "the id's body fits NCCL's 128 bytes");
const char MAGIC[16] = "lutra-emu-nccl";

/* a rank's current call, for the check that the ranks' calls agree */
struct call_desc {
  unsigned long long call, count;
  int kind, type, op, root;
};

struct segment {
  std::atomic<unsigned> bell;  /* bumped at every arrival: the futex waiters sleep on */
  std::atomic<int> nranks;     /* set by the first rank to map it */
  std::atomic<unsigned long long> passed[MAX_RANKS]; /* barriers each rank has reached */
  std::atomic<int> pid[MAX_RANKS];
  call_desc desc[MAX_RANKS];
};
static_assert(std::atomic<unsigned>::is_always_lock_free && std::atomic<unsigned long long>::is_always_lock_free,
              "lock-free atomics work across processes");
const size_t HEADER = (sizeof(segment) + 4095) / 4096 * 4096;

double now() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

double timeout_s() {
  static double t = [] {
    const char *e = getenv("LUTRA_EMU_NCCL_TIMEOUT");
    double v = e ? atof(e) : 0;
    return v > 0 ? v : 120.0;
  }();
  return t;
}

/* whether process pid has ended (gone, or a zombie its parent has not reaped) */
bool ended(int pid) {
  if (pid <= 0)
    return false;
  if (kill(pid, 0) != 0)
    return errno == ESRCH;
  char path[64], buf[256];
  snprintf(path, sizeof path, "/proc/%d/stat", pid);
  FILE *f = fopen(path, "r");
  if (!f)
    return false;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  const char *close = strrchr(buf, ')'); /* "pid (comm) S ..." */
  return close && close[1] == ' ' && (close[2] == 'Z' || close[2] == 'X');
}

/* The ranks' barrier: this rank's arrival, then a wait until every rank has
   arrived as often, sleeping on the bell between looks. what: the call, for
   the message naming the ranks still missing when one has ended or the
   time is up. */
ncclResult_t meet(ncclComm *c, const char *what) {
  segment *s = c->seg;
  unsigned long long k = ++c->meets;
  s->passed[c->rank].store(k, std::memory_order_release);
  s->bell.fetch_add(1, std::memory_order_acq_rel);
  syscall(SYS_futex, &s->bell, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
  double start = now();
  for (;;) {
    unsigned bell = s->bell.load(std::memory_order_acquire);
    std::string missing, gone;
    int nmissing = 0;
    for (int q = 0; q < c->nranks; q++) {
      if (s->passed[q].load(std::memory_order_acquire) >= k)
        continue;
      nmissing++;
      missing += (missing.empty() ? "" : ", ") + std::to_string(q);
      int pid = s->pid[q].load(std::memory_order_relaxed);
      if (ended(pid))
        gone += (gone.empty() ? "" : ", ") + ("rank " + std::to_string(q) + " (pid " + std::to_string(pid) + ")");
    }
    if (!nmissing)
      return ncclSuccess;
    double waited = now() - start;
    if (!gone.empty() || waited > timeout_s()) {
      c->broken = true;
      if (!gone.empty())
        return fail(ncclRemoteError, "%s on rank %d of %d: %s ended before arriving", what, c->rank, c->nranks,
                    gone.c_str());
      return fail(ncclRemoteError, "%s on rank %d of %d: rank%s %s never arrived within %.0f s (LUTRA_EMU_NCCL_TIMEOUT)",
                  what, c->rank, c->nranks, nmissing > 1 ? "s" : "", missing.c_str(), timeout_s());
    }
    timespec nap = {0, 100 * 1000 * 1000}; /* (woken at once by an arrival; the nap bounds the checks above) */
    syscall(SYS_futex, &s->bell, FUTEX_WAIT, bell, &nap, NULL, 0);
  }
}

char *slot(ncclComm *c, int q) { return (char *)c->seg + HEADER + (size_t)q * c->slot_bytes; }

/* ---- reductions in rank order, in NCCL's arithmetic ------------------------ */

/* an element as its kernels compute with it: halves in float, rounded back
   after each operation */
template <class T> struct arith {
  typedef T acc;
  static acc load(T v) { return v; }
  static T store(acc v) { return v; }
};
template <> struct arith<__nv_bfloat16> {
  typedef float acc;
  static acc load(__nv_bfloat16 v) { return __bfloat162float(v); }
  static __nv_bfloat16 store(acc v) { return __float2bfloat16(v); }
};
template <> struct arith<__half> {
  typedef float acc;
  static acc load(__half v) { return __half2float(v); }
  static __half store(acc v) { return __float2half(v); }
};

/* (integers wrap, as on a GPU: summed as unsigned) */
template <class A> typename std::enable_if<std::is_integral<A>::value, A>::type combine(ncclRedOp_t op, A a, A b) {
  typedef typename std::make_unsigned<A>::type U;
  switch (op) {
  case ncclProd: return (A)(U)((U)a * (U)b);
  case ncclMax: return std::max(a, b);
  case ncclMin: return std::min(a, b);
  default: return (A)(U)((U)a + (U)b); /* sum, avg */
  }
}
/* (floats: NaN-ignoring max and min, as fmaxf) */
template <class A> typename std::enable_if<std::is_floating_point<A>::value, A>::type combine(ncclRedOp_t op, A a,
                                                                                              A b) {
  switch (op) {
  case ncclProd: return a * b;
  case ncclMax: return std::fmax(a, b);
  case ncclMin: return std::fmin(a, b);
  default: return a + b; /* sum, avg */
  }
}

/* out[i] = the ranks' slots (at offset `at`) reduced, rank 0 first */
template <class T> void reduce_as(ncclComm *c, ncclRedOp_t op, size_t at, size_t len, char *out) {
  typedef arith<T> A;
  typedef typename A::acc V;
  const bool floats = std::is_floating_point<V>::value;
  const int n = c->nranks;
  /* ncclAvg: floats pre-multiplied by 1/n in their own type, integers divided after the sum */
  const V scale = A::load(A::store((V)(1.0 / n)));
  auto input = [&](int q, size_t i) {
    V v = A::load(((const T *)(slot(c, q) + at))[i]);
    return op == ncclAvg && floats ? A::load(A::store(v * scale)) : v;
  };
  for (size_t i = 0; i < len; i++) {
    V acc = input(0, i);
    for (int q = 1; q < n; q++)
      acc = A::load(A::store(combine(op, acc, input(q, i))));
    if (op == ncclAvg && !floats)
      acc = (V)(acc / (V)n);
    ((T *)out)[i] = A::store(acc);
  }
}

void reduce(ncclDataType_t t, ncclComm *c, ncclRedOp_t op, size_t at, size_t len, char *out) {
  switch (t) {
  case ncclInt8: reduce_as<int8_t>(c, op, at, len, out); break;
  case ncclUint8: reduce_as<uint8_t>(c, op, at, len, out); break;
  case ncclInt32: reduce_as<int32_t>(c, op, at, len, out); break;
  case ncclUint32: reduce_as<uint32_t>(c, op, at, len, out); break;
  case ncclInt64: reduce_as<int64_t>(c, op, at, len, out); break;
  case ncclUint64: reduce_as<uint64_t>(c, op, at, len, out); break;
  case ncclFloat16: reduce_as<__half>(c, op, at, len, out); break;
  case ncclBfloat16: reduce_as<__nv_bfloat16>(c, op, at, len, out); break;
  case ncclFloat32: reduce_as<float>(c, op, at, len, out); break;
  case ncclFloat64: reduce_as<double>(c, op, at, len, out); break;
  default: break; /* (checked at the call) */
  }
}

std::string describe(const call_desc &d) {
  char buf[160];
  int n = snprintf(buf, sizeof buf, "%s of %llu %s", kind_name((kind)d.kind), d.count,
                   type_name((ncclDataType_t)d.type));
  if (d.kind == ALL_REDUCE || d.kind == REDUCE_SCATTER)
    snprintf(buf + n, sizeof buf - n, ", %s", op_name((ncclRedOp_t)d.op));
  else if (d.kind == BROADCAST)
    snprintf(buf + n, sizeof buf - n, " from root %d", d.root);
  return buf;
}

/* after the call's first barrier: whether every rank's call is this one's
   (else a message naming each rank's) */
bool calls_agree(ncclComm *c, std::string *why) {
  const call_desc &me = c->seg->desc[c->rank];
  bool same = true;
  for (int q = 0; q < c->nranks; q++) {
    const call_desc &d = c->seg->desc[q];
    same = same && d.kind == me.kind && d.count == me.count && d.type == me.type && d.op == me.op &&
           d.root == me.root;
  }
  if (same)
    return true;
  for (int q = 0; q < c->nranks; q++)
    *why += (q ? "; rank " : "rank ") + std::to_string(q) + " " + describe(c->seg->desc[q]);
  return false;
}

} // namespace nccl_emu

using namespace nccl_emu;

void nccl_emu::new_unique_id(ncclUniqueId *id) {
  static std::atomic<unsigned> made;
  id_body b;
  memset(&b, 0, sizeof b);
  memcpy(b.magic, MAGIC, sizeof MAGIC);
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  snprintf(b.name, sizeof b.name, "/lutra-emu-nccl-%d-%u-%lld%09ld", (int)getpid(), made++, (long long)ts.tv_sec,
           ts.tv_nsec);
  const char *e = getenv("LUTRA_EMU_NCCL_SLOT_BYTES");
  long long v = e ? atoll(e) : 0;
  b.slot_bytes = v > 0 ? (unsigned long long)std::max<long long>(v, MIN_SLOT) / 8 * 8 : 1u << 20;
  memset(id, 0, sizeof *id);
  memcpy(id->internal, &b, sizeof b);
}

ncclResult_t nccl_emu::join(ncclComm *c, const ncclUniqueId &id) {
  id_body b;
  memcpy(&b, id.internal, sizeof b);
  if (memcmp(b.magic, MAGIC, sizeof MAGIC) != 0 || b.slot_bytes < MIN_SLOT)
    return fail(ncclInvalidArgument, "ncclCommInitRank: the unique id was not made by ncclGetUniqueId");
  if (c->nranks > MAX_RANKS)
    return fail(ncclInvalidArgument, "ncclCommInitRank: %d ranks; the emulator takes at most %d", c->nranks,
                MAX_RANKS);
  b.name[sizeof b.name - 1] = 0;
  c->slot_bytes = b.slot_bytes;
  c->map_bytes = HEADER + (size_t)c->nranks * c->slot_bytes;
  int fd = shm_open(b.name, O_CREAT | O_RDWR, 0600);
  if (fd < 0)
    return fail(ncclSystemError, "ncclCommInitRank: shm_open %s: %s", b.name, strerror(errno));
  struct stat st;
  /* (grown, never cut, by the first ranks to come; ranks that disagree on
     the count are refused below) */
  if (fstat(fd, &st) != 0 || ((size_t)st.st_size < c->map_bytes && ftruncate(fd, (off_t)c->map_bytes) != 0)) {
    int e = errno;
    close(fd);
    shm_unlink(b.name);
    return fail(ncclSystemError, "ncclCommInitRank: sizing %s to %zu bytes: %s", b.name, c->map_bytes, strerror(e));
  }
  void *p = mmap(NULL, c->map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) {
    shm_unlink(b.name);
    return fail(ncclSystemError, "ncclCommInitRank: mapping %s: %s", b.name, strerror(errno));
  }
  c->seg = (segment *)p;
  int expected = 0, claimed = 0;
  ncclResult_t r = ncclSuccess;
  if (!c->seg->nranks.compare_exchange_strong(expected, c->nranks) && expected != c->nranks)
    r = fail(ncclInvalidUsage, "ncclCommInitRank: rank %d says %d ranks, another rank said %d", c->rank, c->nranks,
             expected);
  else if (!c->seg->pid[c->rank].compare_exchange_strong(claimed, (int)getpid()))
    r = fail(ncclInvalidUsage, "ncclCommInitRank: rank %d is claimed twice (pids %d and %d)", c->rank, claimed,
             (int)getpid());
  else
    r = meet(c, "ncclCommInitRank");
  if (r == ncclSuccess && c->rank != 0)
    return r;
  shm_unlink(b.name); /* (every rank has it mapped, or the rendezvous failed) */
  if (r != ncclSuccess)
    leave(c);
  return r;
}

void nccl_emu::leave(ncclComm *c) {
  if (c->seg)
    munmap(c->seg, c->map_bytes);
  c->seg = NULL;
}

ncclResult_t nccl_emu::collective(kind k, const void *send, void *recv, size_t count, ncclDataType_t t, ncclRedOp_t op,
                                  int root, ncclComm *c, cudaStream_t stream) {
  const char *what = kind_name(k);
  unsigned long long call = c->calls++;
  char where[96];
  snprintf(where, sizeof where, "%s (call %llu of this communicator)", what, call);
  if (c->broken)
    return fail(ncclRemoteError, "%s on rank %d of %d: the communicator lost a rank earlier", where, c->rank,
                c->nranks);
  const int n = c->nranks, me = c->rank;
  const size_t es = type_size(t);
  char why[64];
  snprintf(why, sizeof why, "host waits (nccl %s: the ranks meet at the call)", what);
  lt_emu_host_waits(stream, why); /* (the inputs: the stream's work so far) */
  const size_t out_elems = k == ALL_GATHER ? count * n : count;
  auto out = std::make_shared<std::vector<char>>(out_elems * es);
  char *res = out->data();
  const char *in = (const char *)send;
  /* elements a piece: a rank's slot holds its piece (reduce_scatter: a piece for every rank) */
  const size_t per = k == REDUCE_SCATTER ? c->slot_bytes / (es * n) : c->slot_bytes / es;
  c->seg->desc[me] = call_desc{call, count, (int)k, (int)t, (int)op, k == BROADCAST ? root : 0};
  size_t off = 0;
  do {
    size_t len = std::min(per, count - off);
    char *mine = slot(c, me);
    if (k == REDUCE_SCATTER)
      for (int d = 0; d < n; d++)
        memcpy(mine + d * len * es, in + ((size_t)d * count + off) * es, len * es);
    else if (k != BROADCAST || me == root)
      memcpy(mine, in + off * es, len * es);
    ncclResult_t r = meet(c, where);
    if (r != ncclSuccess)
      return r;
    std::string differ;
    if (off == 0 && !calls_agree(c, &differ)) {
      r = meet(c, where); /* (the descriptions stay until every rank has read them) */
      return r != ncclSuccess ? r : fail(ncclInvalidUsage, "%s: the ranks' calls differ: %s", where, differ.c_str());
    }
    switch (k) {
    case ALL_REDUCE: reduce(t, c, op, 0, len, res + off * es); break;
    case REDUCE_SCATTER: reduce(t, c, op, me * len * es, len, res + off * es); break;
    case BROADCAST: memcpy(res + off * es, slot(c, root), len * es); break;
    case ALL_GATHER:
      for (int q = 0; q < n; q++)
        memcpy(res + ((size_t)q * count + off) * es, slot(c, q), len * es);
      break;
    }
    if ((r = meet(c, where)) != ncclSuccess) /* (every rank has read the slots) */
      return r;
    off += len;
  } while (off < count);
  lt_emu_trace(stream, "nccl %s %zu", what, count * es);
  if (out_elems)
    lt_emu_enqueue(stream, [recv, out] { memcpy(recv, out->data(), out->size()); });
  return ncclSuccess;
}
