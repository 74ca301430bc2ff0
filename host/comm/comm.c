/*
 * comm.c: process groups and collectives (lt_dist_*, lt_comm_*), one
 * interface over two implementations chosen at lt_dist_init: MPI for CPU
 * tensors when the process runs under mpirun (OMPI_COMM_WORLD_SIZE set), and
 * a single process otherwise (every collective is the identity or a copy).
 * CUDA tensors go through NCCL behind the same calls (comm/nccl.c; there
 * all_gather and reduce_scatter need equal chunks).
 *
 * Semantics follow torch.distributed: all_reduce in place (sum, avg, max,
 * min); broadcast in place from a root; all_gather concatenates each rank's
 * tensor along dim 0 (ranks may hold different lengths); reduce_scatter
 * reduces a tensor that every rank holds whole and gives rank r the r-th of
 * world_size chunks along dim 0, the first (n mod world) chunks one row
 * longer (torch.tensor_split's rule), so sizes need not divide. bf16 and f16
 * are reduced in f32 (converted on the way in and out).
 *
 * Every collective first exchanges (op, dtype, element count, root, the
 * group's call number and the call site Lua set with lt_comm_set_site) with
 * the group, so a rank that passes another size or dtype, or calls the
 * collective from another place (an extra call on some ranks pairs with the
 * others' next one), gets an error naming the ranks, sizes and call sites
 * on every rank, not a hang or garbage (LUTRA_COMM_CHECK=0 skips this).
 * Waiting polls the request; a collective still incomplete after the
 * watchdog timeout (LUTRA_COMM_TIMEOUT seconds, default 600) asks the
 * group's other ranks what they wait in (they answer while they wait in
 * one themselves), prints rank, op, group, call number, size, call site and
 * the ranks that never arrived (what each waits in, or that it did not
 * answer), and aborts the job. Point-to-point calls count apart.
 * The asynchronous forms return an lt_work to wait on.
 */
#include "comm/comm-impl.h"
#include "lutra.h"
#include "base/status.h"
#include "core/tensor-impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#ifdef LT_WITH_MPI
#include <mpi.h>
#endif

/* Where a collective was called from (Lua's lt_comm_set_site): a hash of the
   site "file:line" (0: not known) and the first SITE_TEXT - 1 bytes of the
   site followed by its context (" < caller:line < ..."). */
enum { SITE_TEXT = 160 };
typedef struct {
  uint64_t hash;
  char text[SITE_TEXT];
} call_site;

struct lt_comm {
  int rank, size;
  int id; /* 0 for the world, then in creation order */
  uint64_t seq;     /* collectives called on the group (the same on every rank) */
  uint64_t p2p_seq; /* sends and recvs (between two ranks only) */
  call_site last_site; /* of the last collective agreed on */
#ifdef LT_WITH_MPI
  MPI_Comm mpi;
#endif
};

struct lt_work {
  lt_comm *comm;
  call_site site;
  const char *op;
  uint64_t seq;
  int64_t numel;
  int done;
#ifdef LT_WITH_MPI
  MPI_Request req;
#endif
  /* a bf16/f16 collective works on an f32 copy, converted back at wait */
  lt_tensor *f32, *target;
  double scale; /* avg: the sum is divided by the group size at wait */
};

static int initialised, use_mpi, next_id = 1, local_rank;
static lt_comm world = {.rank = 0, .size = 1};
static double timeout_s = -1;
static call_site pending_site; /* set by lt_comm_set_site, taken by the next collective */

void lt_comm_set_site(const char *site, const char *context) {
  if (!site || !*site) {
    pending_site.hash = 0;
    pending_site.text[0] = 0;
    return;
  }
  uint64_t h = 1469598103934665603ULL; /* FNV-1a of the site alone */
  for (const unsigned char *p = (const unsigned char *)site; *p; p++)
    h = (h ^ *p) * 1099511628211ULL;
  pending_site.hash = h ? h : 1;
  /* site, then " < " context, cut to fit (no snprintf: it cost most of a call) */
  const char *parts[3] = {site, context && *context ? " < " : "", context ? context : ""};
  size_t at = 0;
  for (int k = 0; k < 3; k++)
    for (const char *p = parts[k]; *p && at < sizeof pending_site.text - 1; p++)
      pending_site.text[at++] = *p;
  pending_site.text[at] = 0;
}

/* the pending call site, cleared (so a later call from C does not inherit it) */
static call_site take_site(void) {
  call_site s = pending_site;
  pending_site.hash = 0;
  pending_site.text[0] = 0;
  return s;
}

static const char *site_name(const call_site *s) { return s && s->hash ? s->text : "(no Lua call site)"; }

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double comm_timeout(void) {
  if (timeout_s < 0) {
    const char *env = getenv("LUTRA_COMM_TIMEOUT");
    timeout_s = env && atof(env) > 0 ? atof(env) : 600;
  }
  return timeout_s;
}

void lt_comm_set_timeout(double seconds) { timeout_s = seconds > 0 ? seconds : 600; }

static int env_int(const char *name, int dflt) {
  const char *v = getenv(name);
  return v && *v ? atoi(v) : dflt;
}

lt_status lt_dist_init(void) {
  LT_OP_SCOPE("dist init");
  if (initialised)
    return LT_OK;
  int size = env_int("OMPI_COMM_WORLD_SIZE", 1);
  local_rank = env_int("OMPI_COMM_WORLD_LOCAL_RANK", 0);
  if (size > 1) {
#ifdef LT_WITH_MPI
    int provided = 0;
    if (MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS)
      return lt_fail(LT_ERR_IO, "dist.init: MPI_Init_thread failed");
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    world.mpi = MPI_COMM_WORLD;
    MPI_Comm_rank(MPI_COMM_WORLD, &world.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world.size);
    use_mpi = 1;
#else
    return lt_fail(LT_ERR_UNSUPPORTED,
                   "dist.init: running under mpirun with %d ranks, but this lutra was built without MPI "
                   "(install libopenmpi-dev and rebuild, or build with MPI=1)",
                   size);
#endif
  }
  initialised = 1;
  return LT_OK;
}

int lt_dist_initialised(void) { return initialised; }
int lt_dist_rank(void) { return world.rank; }
int lt_dist_world_size(void) { return world.size; }
int lt_dist_local_rank(void) { return local_rank; }

void lt_dist_abort(int code) {
#ifdef LT_WITH_MPI
  if (use_mpi)
    MPI_Abort(MPI_COMM_WORLD, code);
#endif
  _exit(code);
}

void lt_dist_finalize(void) {
#ifdef LT_WITH_MPI
  if (use_mpi) {
    int fin = 0;
    MPI_Finalized(&fin);
    if (!fin)
      MPI_Finalize();
  }
#endif
}

lt_comm *lt_comm_world(void) { return &world; }
int lt_comm_rank(const lt_comm *c) { return c->rank; }
int lt_comm_size(const lt_comm *c) { return c->size; }
int lt_comm_id(const lt_comm *c) { return c->id; }

#ifdef LT_WITH_MPI
static lt_status agree(lt_comm *c, uint64_t seq, const char *op, int opcode, lt_dtype dt, int64_t count, int root,
                       int counts_may_differ, int64_t *all_counts, const call_site *site);
#endif
enum { OP_ALL_REDUCE = 1, OP_BROADCAST, OP_ALL_GATHER, OP_REDUCE_SCATTER, OP_BARRIER, OP_SPLIT, OP_BCAST_BYTES };
enum { OP_REFUSED = 0x7fff }; /* a rank that refused its arguments (lt_comm_refuse) */

/* the collective an agreement op code stands for (codes >= 16 carry the reduction in the low 4 bits) */
static const char *op_name(int64_t opcode) {
  switch (opcode >= 16 && opcode != OP_REFUSED ? opcode / 16 : opcode) {
  case OP_ALL_REDUCE: return "all_reduce";
  case OP_BROADCAST: return "broadcast";
  case OP_ALL_GATHER: return "all_gather";
  case OP_REDUCE_SCATTER: return "reduce_scatter";
  case OP_BARRIER: return "barrier";
  case OP_SPLIT: return "new_group";
  default: return "another collective";
  }
}

lt_status lt_comm_split(lt_comm *parent, int color, int key, lt_comm **out) {
  *out = NULL;
  lt_comm *c = calloc(1, sizeof *c);
  if (!c)
    return lt_fail(LT_ERR_OOM, "comm split: out of memory");
  c->id = next_id++;
#ifdef LT_WITH_MPI
  if (use_mpi) {
    /* every rank of the parent must come: checked under the watchdog, as
       MPI_Comm_split itself would wait forever for a rank that does not */
    call_site site = take_site();
    lt_status st = agree(parent, parent->seq++, "new_group", OP_SPLIT, LT_DTYPE_I32, 0, -1, 1, NULL, &site);
    if (st != LT_OK) {
      free(c);
      return st;
    }
    if (MPI_Comm_split(parent->mpi, color, key, &c->mpi) != MPI_SUCCESS) {
      free(c);
      return lt_fail(LT_ERR_IO, "comm split: MPI_Comm_split failed on rank %d", world.rank);
    }
    MPI_Comm_set_errhandler(c->mpi, MPI_ERRORS_RETURN);
    MPI_Comm_rank(c->mpi, &c->rank);
    MPI_Comm_size(c->mpi, &c->size);
    *out = c;
    return LT_OK;
  }
#endif
  (void)parent, (void)color, (void)key;
  c->rank = 0;
  c->size = 1;
  *out = c;
  return LT_OK;
}

void lt_comm_free(lt_comm *c) {
  if (!c || c == &world)
    return;
#ifdef LT_WITH_MPI
  if (use_mpi) {
    int fin = 0;
    MPI_Finalized(&fin);
    if (!fin)
      MPI_Comm_free(&c->mpi);
  }
#endif
  free(c);
}

#ifdef LT_WITH_MPI
/* What this rank waits in now, for the watchdog of another rank to ask
   (tags on MPI_COMM_WORLD that no other message uses). */
enum { TAG_QUERY = 0x6c71, TAG_REPLY = 0x6c72 };
typedef struct {
  int64_t active, group, size, seq, p2p; /* p2p: a send or recv (its seq counts those) */
  char op[40];
  char site[SITE_TEXT];
} wait_info;
static wait_info waiting;

/* answers every pending query with what this rank waits in */
static void serve_queries(void) {
  for (;;) {
    int flag = 0;
    MPI_Status s;
    if (MPI_Iprobe(MPI_ANY_SOURCE, TAG_QUERY, MPI_COMM_WORLD, &flag, &s) != MPI_SUCCESS || !flag)
      return;
    int64_t q;
    MPI_Recv(&q, 1, MPI_INT64_T, s.MPI_SOURCE, TAG_QUERY, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    MPI_Send(&waiting, (int)sizeof waiting, MPI_BYTE, s.MPI_SOURCE, TAG_REPLY, MPI_COMM_WORLD);
  }
}

/* The watchdog's report: asks the group's other ranks what they wait in
   (for up to a second, answering their questions meanwhile), prints the
   call, its site and the ranks that never arrived, and aborts the job. */
static void watchdog_abort(const char *op, const lt_comm *c, uint64_t seq, int64_t numel, const call_site *site,
                           double limit, int peer) {
  int n = c->size;
  int *wr = malloc(sizeof(int) * (size_t)n), *idx = malloc(sizeof(int) * (size_t)n);
  wait_info *ans = calloc((size_t)n, sizeof *ans);
  MPI_Request *rq = malloc(sizeof(MPI_Request) * 2 * (size_t)n);
  char who[3072] = "";
  size_t at = 0;
  int missing = 0;
  if (wr && idx && ans && rq) {
    MPI_Group g, wg;
    MPI_Comm_group(c->mpi, &g);
    MPI_Comm_group(MPI_COMM_WORLD, &wg);
    for (int r = 0; r < n; r++)
      idx[r] = r;
    MPI_Group_translate_ranks(g, n, idx, wg, wr);
    int64_t q = 1;
    for (int r = 0; r < n; r++) {
      rq[2 * r] = rq[2 * r + 1] = MPI_REQUEST_NULL;
      if (r == c->rank || (peer >= 0 && r != peer))
        continue;
      MPI_Irecv(&ans[r], (int)sizeof ans[r], MPI_BYTE, wr[r], TAG_REPLY, MPI_COMM_WORLD, &rq[2 * r]);
      MPI_Isend(&q, 1, MPI_INT64_T, wr[r], TAG_QUERY, MPI_COMM_WORLD, &rq[2 * r + 1]);
    }
    double until = now_s() + 1.0;
    int *got = calloc((size_t)n, sizeof(int));
    for (int left = peer >= 0 ? 1 : n - 1; got && left > 0 && now_s() < until;) {
      for (int r = 0; r < n; r++) {
        int flag = 0;
        if (rq[2 * r] != MPI_REQUEST_NULL && !got[r] && MPI_Test(&rq[2 * r], &flag, MPI_STATUS_IGNORE) == MPI_SUCCESS &&
            flag) {
          got[r] = 1;
          left--;
        }
        if (rq[2 * r + 1] != MPI_REQUEST_NULL)
          MPI_Test(&rq[2 * r + 1], &flag, MPI_STATUS_IGNORE);
      }
      serve_queries();
      usleep(1000);
    }
    for (int r = 0; r < n && at < sizeof who - 256; r++) {
      if (r == c->rank || (peer >= 0 && r != peer))
        continue;
      wait_info *a = &ans[r];
      int here = peer < 0 && got && got[r] && a->active && !a->p2p && a->group == c->id && (uint64_t)a->seq == seq;
      if (here)
        continue;
      missing++;
      a->op[sizeof a->op - 1] = a->site[sizeof a->site - 1] = 0;
      if (got && got[r] && a->active)
        at += (size_t)snprintf(who + at, sizeof who - at, "%srank %d (waits in %s, group %lld %s %llu, at %s)",
                               missing > 1 ? "; " : "", wr[r], a->op, (long long)a->group,
                               a->p2p ? "send/recv" : "call", (unsigned long long)a->seq,
                               a->site[0] ? a->site : "(no Lua call site)");
      else
        at += (size_t)snprintf(who + at, sizeof who - at,
                               "%srank %d (no answer in 1 s: busy outside a collective, finished, or gone)",
                               missing > 1 ? "; " : "", wr[r]);
    }
    free(got);
  }
  fprintf(stderr,
          "[rank %d] lutra: watchdog: %s (group %d of %d ranks, call %llu, %lld elements) not complete after %.0f s "
          "at %s: %s%s; aborting the job\n",
          world.rank, op, c->id, c->size, (unsigned long long)seq, (long long)numel, limit, site_name(site),
          missing ? "never arrived: " : "every rank of the group is in it", who);
  fflush(stderr);
  lt_dist_abort(3);
}

/* Polls a request to completion under the watchdog: past the timeout it
   reports what this rank waits for and the ranks that never came (a rank
   that skipped the collective, or died without MPI noticing) and aborts
   the job. While it waits it answers other ranks' watchdogs. */
static lt_status wait_request(MPI_Request *req, const char *op, const lt_comm *c, uint64_t seq, int64_t numel,
                              const call_site *site, int peer) {
  double start = now_s(), limit = comm_timeout();
  int flag = 0;
  long spins = 0;
  while (!flag) {
    if (MPI_Test(req, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS) {
      waiting.active = 0;
      return lt_fail(LT_ERR_IO, "%s (group %d, call %llu) failed on rank %d", op, c->id, (unsigned long long)seq,
                     world.rank);
    }
    if (!flag && (++spins & 1023) == 0) {
      if (!waiting.active) { /* what another rank's watchdog is told */
        waiting.active = 1;
        waiting.group = c->id;
        waiting.size = c->size;
        waiting.seq = (int64_t)seq;
        waiting.p2p = peer >= 0;
        snprintf(waiting.op, sizeof waiting.op, "%s", op);
        snprintf(waiting.site, sizeof waiting.site, "%s", site && site->hash ? site->text : "");
      }
      serve_queries();
      if (now_s() - start > limit)
        watchdog_abort(op, c, seq, numel, site, limit, peer);
      usleep(50);
    }
  }
  waiting.active = 0;
  return LT_OK;
}
#endif

lt_status lt_comm_bcast_bytes(lt_comm *c, void *buf, int n, int root) {
  LT_OP_SCOPE("broadcast");
#ifdef LT_WITH_MPI
  if (use_mpi) {
    MPI_Request req;
    if (MPI_Ibcast(buf, n, MPI_BYTE, root, c->mpi, &req) != MPI_SUCCESS)
      return lt_fail(LT_ERR_IO, "broadcasting %d bytes from rank %d failed on rank %d", n, root, world.rank);
    LT_TRY(wait_request(&req, "broadcast of a communicator id", c, c->seq++, n, NULL, -1));
  }
#endif
  (void)c, (void)buf, (void)n, (void)root;
  return LT_OK;
}

/* ---- checks ----------------------------------------------------------------------- */


static int on_cuda(const lt_tensor *t) { return t && t->storage->device >= LT_DEVICE_CUDA; }

static lt_status check_tensor(const char *op, const lt_tensor *t) {
  if (!t)
    return lt_fail(LT_ERR_ARG, "%s: no tensor", op);
  LT_TRY(lt_check_tensor(op, t, 1)); /* freed (:free()) or its data dropped */
#ifndef LT_WITH_CUDA
  if (on_cuda(t))
    return lt_fail(LT_ERR_UNSUPPORTED, "%s: a CUDA tensor, but this lutra was built without CUDA", op);
#endif
  if (!lt_tensor_is_contiguous(t))
    return lt_fail(LT_ERR_ARG, "%s: the tensor must be contiguous", op);
  lt_dtype d = t->dtype;
  if (d != LT_DTYPE_F32 && d != LT_DTYPE_F64 && d != LT_DTYPE_BF16 && d != LT_DTYPE_F16 && d != LT_DTYPE_I32 &&
      d != LT_DTYPE_I64 && d != LT_DTYPE_U8)
    return lt_fail(LT_ERR_DTYPE, "%s: dtype %s is not supported", op, lt_dtype_name(d));
  return LT_OK;
}

#ifdef LT_WITH_MPI
static int check_enabled(void) {
  static int on = -1;
  if (on < 0)
    on = env_int("LUTRA_COMM_CHECK", 1);
  return on;
}

/* One rank's side of a collective's agreement exchange (48 bytes: the
   call site's text travels only when the ranks disagree). */
typedef struct {
  int64_t opcode, dtype, count, root, seq;
  uint64_t site_hash;
} agreement;

/* whether the records disagree on the op or on a known call site, when the
   ranks also exchange their call sites' texts (every rank holds the same
   records, so all decide alike) */
static int need_sites(const agreement *all, int n) {
  uint64_t known = 0;
  for (int r = 0; r < n; r++) {
    if (all[r].opcode != all[0].opcode)
      return 1;
    if (all[r].site_hash && !known)
      known = all[r].site_hash;
    else if (all[r].site_hash && all[r].site_hash != known)
      return 1;
  }
  return 0;
}

/* The agreement exchange under the watchdog: every rank's record into *all
   and, when they disagree, every rank's call site into *sites (else NULL);
   both malloc'd, the caller frees them on success. */
static lt_status exchange(lt_comm *c, uint64_t seq, const char *op, const agreement *mine, const call_site *site,
                          int64_t count, agreement **all, call_site **sites) {
  *all = malloc(sizeof(agreement) * (size_t)c->size);
  *sites = malloc(sizeof(call_site) * (size_t)c->size); /* before the exchange: no rank can fail after it */
  lt_status st = LT_OK;
  MPI_Request req;
  if (!*all || !*sites)
    st = lt_fail(LT_ERR_OOM, "%s: out of memory", op);
  else if (MPI_Iallgather(mine, (int)sizeof *mine, MPI_BYTE, *all, (int)sizeof *mine, MPI_BYTE, c->mpi, &req) !=
           MPI_SUCCESS)
    st = lt_fail(LT_ERR_IO, "%s: exchanging sizes failed on rank %d", op, world.rank);
  else
    st = wait_request(&req, op, c, seq, count, site, -1);
  if (st == LT_OK && need_sites(*all, c->size)) {
    if (MPI_Iallgather(site, (int)sizeof *site, MPI_BYTE, *sites, (int)sizeof *site, MPI_BYTE, c->mpi, &req) !=
        MPI_SUCCESS)
      st = lt_fail(LT_ERR_IO, "%s: exchanging call sites failed on rank %d", op, world.rank);
    else
      st = wait_request(&req, op, c, seq, count, site, -1);
    for (int r = 0; st == LT_OK && r < c->size; r++)
      (*sites)[r].text[SITE_TEXT - 1] = 0;
  } else if (st == LT_OK) {
    free(*sites);
    *sites = NULL;
  }
  if (st != LT_OK) {
    free(*all);
    free(*sites);
    *all = NULL;
    *sites = NULL;
  }
  return st;
}

/* "rank 0 at a.lua:3; ranks 1, 2 at a.lua:5": the group's ranks by call site
   (the same text on every rank) */
static void sites_by_rank(const call_site *sites, int n, char *buf, size_t cap) {
  size_t at = 0;
  buf[0] = 0;
  for (int r = 0; r < n && at + 64 < cap; r++) {
    int first = 1, count = 0;
    for (int q = 0; q < r; q++)
      if (sites[q].hash == sites[r].hash)
        first = 0;
    if (!first)
      continue;
    for (int q = r; q < n; q++)
      count += sites[q].hash == sites[r].hash;
    at += (size_t)snprintf(buf + at, cap - at, "%s%s ", at ? "; " : "", count > 1 ? "ranks" : "rank");
    for (int q = r, k = 0; q < n && at + 64 < cap; q++)
      if (sites[q].hash == sites[r].hash)
        at += (size_t)snprintf(buf + at, cap - at, "%s%d", k++ ? ", " : "", q);
    if (at + 32 < cap)
      at += (size_t)snprintf(buf + at, cap - at, " at %s", site_name(&sites[r]));
  }
}

/* Every rank of the group gives (op code, dtype, count, root, call number,
   call site); all must agree on the op and dtype, on the count unless
   counts may differ, and on the call site where every rank knows it. */
static lt_status agree(lt_comm *c, uint64_t seq, const char *op, int opcode, lt_dtype dt, int64_t count, int root,
                       int counts_may_differ, int64_t *all_counts, const call_site *site) {
  static const call_site none = {0, ""};
  if (!site)
    site = &none;
  agreement mine = {opcode, dt, count, root, (int64_t)seq, site->hash}, *all;
  call_site *sites;
  c->last_site = *site;
  lt_status st = exchange(c, seq, op, &mine, site, count, &all, &sites);
  if (st != LT_OK)
    return st;
  const char *here = site_name(site);
  for (int r = 0; r < c->size && st == LT_OK; r++) {
    agreement *o = all + r;
    if (o->opcode == OP_REFUSED)
      st = lt_fail(LT_ERR_ARG, "%s (group %d, call %llu) at %s: rank %d of the group refused its arguments to this "
                   "call (its own error says why)", op, c->id, (unsigned long long)seq, here, r);
    else if (o->opcode != opcode && o->opcode / 16 == opcode / 16 && opcode >= 16)
      st = lt_fail(LT_ERR_ARG, "%s (group %d, call %llu) at %s: rank %d of the group passes another reduction op",
                   op, c->id, (unsigned long long)seq, here, r);
    else if (o->opcode != opcode)
      st = lt_fail(LT_ERR_ARG, "%s (group %d, call %llu) at %s: rank %d of the group called %s instead, at %s", op,
                   c->id, (unsigned long long)seq, here, r, op_name(o->opcode), site_name(sites ? &sites[r] : NULL));
    else if (o->dtype != dt)
      st = lt_fail(LT_ERR_DTYPE, "%s (group %d): rank %d passes %s, rank %d passes %s", op, c->id, r,
                   lt_dtype_name((lt_dtype)o->dtype), c->rank, lt_dtype_name(dt));
    else if (!counts_may_differ && o->count != count)
      st = lt_fail(LT_ERR_SHAPE, "%s (group %d): rank %d passes %lld elements, rank %d passes %lld", op, c->id, r,
                   (long long)o->count, c->rank, (long long)count);
    else if (o->root != root && (opcode == OP_ALL_GATHER || opcode / 16 == OP_REDUCE_SCATTER))
      st = lt_fail(LT_ERR_SHAPE, "%s (group %d): rank %d passes rows of %lld elements, rank %d rows of %d", op, c->id,
                   r, (long long)o->root, c->rank, root);
    else if (o->root != root)
      st = lt_fail(LT_ERR_ARG, "%s (group %d): rank %d names root %lld, rank %d names %d", op, c->id, r,
                   (long long)o->root, c->rank, root);
    else if ((uint64_t)o->seq != seq)
      st = lt_fail(LT_ERR_INTERNAL, "%s (group %d): rank %d is at the group's call %llu, rank %d at call %llu", op,
                   c->id, r, (unsigned long long)o->seq, c->rank, (unsigned long long)seq);
    if (all_counts)
      all_counts[r] = o->count;
  }
  /* the same call from different places (the sites came with the records
     then): checked once every field agrees, the same message on every rank */
  if (st == LT_OK && sites) {
    char by[2048];
    sites_by_rank(sites, c->size, by, sizeof by);
    st = lt_fail(LT_ERR_ARG, "%s (group %d, call %llu): the ranks call it from different places: %s (a collective "
                 "that only some ranks call pairs with the others' next one; one that every rank reaches from its own branch "
                 "is called once after the branch, or LUTRA_COMM_CHECK=0 turns the check off)", op, c->id, (unsigned long long)seq, by);
  }
  free(all);
  free(sites);
  return st;
}

/* this rank's side of a refused call's agreement exchange */
static lt_status announce_refusal(lt_comm *c) {
  call_site site = take_site();
  agreement mine = {OP_REFUSED, 0, 0, 0, (int64_t)c->seq, site.hash}, *all;
  call_site *sites;
  lt_status st = exchange(c, c->seq++, "a refused collective", &mine, &site, 0, &all, &sites);
  if (st == LT_OK) {
    free(all);
    free(sites);
  }
  return st;
}

/* MPI counts are C ints: all_reduce and broadcast go in pieces of at most
   this many elements (bytes for broadcast); LUTRA_COMM_CHUNK lowers it so
   tests can reach the piecewise path with small tensors. */
static int64_t max_piece(void) {
  static int64_t n = -1;
  if (n < 0) {
    n = env_int("LUTRA_COMM_CHUNK", 1 << 30);
    if (n < 1)
      n = 1 << 30;
  }
  return n;
}

/* the pieces of a long all_reduce or broadcast, one after the other under
   the watchdog (so such a call is complete when it returns) */
static lt_status in_pieces(lt_comm *c, const char *op, uint64_t seq, char *data, int64_t n, int64_t es,
                           MPI_Datatype type, MPI_Op mop, int root) {
  int64_t piece = max_piece();
  for (int64_t at = 0; at < n; at += piece) {
    int64_t k = n - at < piece ? n - at : piece;
    MPI_Request req;
    int rc = root < 0 ? MPI_Iallreduce(MPI_IN_PLACE, data + at * es, (int)k, type, mop, c->mpi, &req)
                      : MPI_Ibcast(data + at * es, (int)k, type, root, c->mpi, &req);
    if (rc != MPI_SUCCESS)
      return lt_fail(LT_ERR_IO, "%s: MPI failed on rank %d (elements %lld..%lld)", op, world.rank, (long long)at,
                     (long long)(at + k));
    LT_TRY(wait_request(&req, op, c, seq, n, &c->last_site, -1));
  }
  return LT_OK;
}

static MPI_Datatype mpi_type(lt_dtype d) {
  switch (d) {
  case LT_DTYPE_F64: return MPI_DOUBLE;
  case LT_DTYPE_I32: return MPI_INT32_T;
  case LT_DTYPE_I64: return MPI_INT64_T;
  case LT_DTYPE_U8: return MPI_UINT8_T;
  default: return MPI_FLOAT; /* f32, and bf16/f16 through f32 copies */
  }
}

static MPI_Op mpi_op(lt_comm_op op) {
  switch (op) {
  case LT_COMM_MAX: return MPI_MAX;
  case LT_COMM_MIN: return MPI_MIN;
  default: return MPI_SUM;
  }
}
#endif

static int is_half(lt_dtype d) { return d == LT_DTYPE_BF16 || d == LT_DTYPE_F16; }

static lt_status new_work(lt_comm *c, const char *op, int64_t numel, lt_work **out) {
  lt_work *w = calloc(1, sizeof *w);
  if (!w)
    return lt_fail(LT_ERR_OOM, "%s: out of memory", op);
  w->comm = c;
  w->op = op;
  w->seq = c->seq++;
  w->site = take_site();
  w->numel = numel;
  w->scale = 1;
#ifdef LT_WITH_MPI
  w->req = MPI_REQUEST_NULL;
#endif
  *out = w;
  return LT_OK;
}

/* completes the conversions of a finished collective */
static lt_status finish(lt_work *w) {
  lt_status st = LT_OK;
  if (w->scale != 1 && w->f32) {
    lt_tensor *r = NULL;
    st = lt_binary_scalar(LT_BINARY_MUL, w->f32, w->scale, 0, NULL, &r);
    if (st == LT_OK) {
      st = lt_tensor_copy_(w->target, r);
      lt_tensor_release(r);
    }
  } else if (w->f32 && w->target) {
    st = lt_tensor_copy_(w->target, w->f32);
  }
  return st;
}

lt_status lt_work_wait(lt_work *w) {
  LT_OP_SCOPE("wait");
  if (!w || w->done)
    return LT_OK;
#ifdef LT_WITH_MPI
  if (use_mpi && w->req != MPI_REQUEST_NULL)
    LT_TRY(wait_request(&w->req, w->op, w->comm, w->seq, w->numel, &w->site, -1));
#endif
  w->done = 1;
  return finish(w);
}

int lt_work_test(lt_work *w) {
  if (!w || w->done)
    return 1;
#ifdef LT_WITH_MPI
  if (use_mpi && w->req != MPI_REQUEST_NULL) {
    int flag = 0;
    if (MPI_Test(&w->req, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS)
      return 1; /* the error surfaces at wait */
    return flag;
  }
#endif
  return 1;
}

void lt_work_free(lt_work *w) {
  if (!w)
    return;
  if (!w->done)
    lt_work_wait(w);
  lt_tensor_release(w->f32);
  lt_tensor_release(w->target);
  free(w);
}

/* runs a work to completion when the caller did not ask for a handle */
static lt_status complete(lt_status st, lt_work *w, lt_work **out) {
  if (st != LT_OK) {
    if (w)
      w->done = 1;
    lt_work_free(w);
    return st;
  }
  if (out) {
    *out = w;
    return LT_OK;
  }
  st = lt_work_wait(w);
  lt_work_free(w);
  return st;
}

/* the buffer a reduction works on: t itself, or an f32 copy of a bf16/f16 t */
static lt_status work_buffer(lt_work *w, lt_tensor *t, lt_tensor **buf) {
  if (!is_half(t->dtype)) {
    *buf = t;
    return LT_OK;
  }
  LT_TRY(lt_tensor_to(t, LT_DTYPE_F32, LT_DEVICE_CPU, &w->f32));
  lt_tensor_retain(t);
  w->target = t;
  *buf = w->f32;
  return LT_OK;
}

lt_status lt_comm_refuse(lt_comm *c) {
#ifdef LT_WITH_MPI
  if (use_mpi && c && check_enabled())
    return announce_refusal(c);
#endif
  (void)c;
  return LT_OK;
}

/* a local check failed (st, its message set): the group learns of it, the
   message stays this rank's */
static lt_status refused(lt_comm *c, lt_status st) {
  char msg[2048];
  snprintf(msg, sizeof msg, "%s", lt_last_error());
  if (lt_comm_refuse(c) != LT_OK)
    return LT_ERR_IO;
  return lt_fail(st, "%s", msg);
}

lt_status lt_comm_all_reduce(lt_comm *c, lt_tensor *t, lt_comm_op op, lt_work **out) {
  LT_OP_SCOPE("all_reduce");
  if (out)
    *out = NULL;
  lt_status chk = check_tensor("all_reduce", t);
  if (chk == LT_OK && op == LT_COMM_AVG && !lt_dtype_is_float(t->dtype))
    chk = lt_fail(LT_ERR_DTYPE, "all_reduce: avg needs a float tensor, got %s", lt_dtype_name(t->dtype));
  if (chk != LT_OK)
    return refused(c, chk);
  lt_work *w = NULL;
  LT_TRY(new_work(c, "all_reduce", lt_tensor_numel(t), &w));
  lt_status st = LT_OK;
#ifdef LT_WITH_MPI
  if (use_mpi) {
    if (check_enabled())
      st = agree(c, w->seq, "all_reduce", OP_ALL_REDUCE * 16 + (int)op, t->dtype, lt_tensor_numel(t), -1, 0, NULL,
                 &w->site);
#ifdef LT_WITH_CUDA
    if (on_cuda(t)) {
      if (st == LT_OK)
        st = lt_nccl_collective(c, LT_NCCL_ALL_REDUCE, t, t, op, 0);
      return complete(st, w, out);
    }
#endif
    lt_tensor *buf = NULL;
    if (st == LT_OK)
      st = work_buffer(w, t, &buf);
    if (st == LT_OK && op == LT_COMM_AVG) {
      if (!w->f32) { /* the sum is divided in place at wait: keep t as both */
        lt_tensor_retain(t);
        lt_tensor_retain(t);
        w->f32 = t;
        w->target = t;
      }
      w->scale = 1.0 / c->size;
    }
    int64_t n = st == LT_OK ? lt_tensor_numel(buf) : 0;
    if (st == LT_OK && n > max_piece())
      st = in_pieces(c, "all_reduce", w->seq, lt_tensor_data(buf), n, lt_dtype_size(buf->dtype), mpi_type(buf->dtype),
                     mpi_op(op), -1);
    else if (st == LT_OK && MPI_Iallreduce(MPI_IN_PLACE, lt_tensor_data(buf), (int)n, mpi_type(buf->dtype),
                                           mpi_op(op), c->mpi, &w->req) != MPI_SUCCESS)
      st = lt_fail(LT_ERR_IO, "all_reduce: MPI_Iallreduce failed on rank %d", world.rank);
  }
#endif
#ifdef LT_WITH_CUDA
  if (on_cuda(t)) /* one process: NCCL all the same, so the path runs on one GPU */
    st = lt_nccl_collective(c, LT_NCCL_ALL_REDUCE, t, t, op, 0);
#endif
  (void)op;
  return complete(st, w, out);
}

lt_status lt_comm_broadcast(lt_comm *c, lt_tensor *t, int root, lt_work **out) {
  LT_OP_SCOPE("broadcast");
  if (out)
    *out = NULL;
  lt_status chk = check_tensor("broadcast", t);
  if (chk == LT_OK && (root < 0 || root >= c->size))
    chk = lt_fail(LT_ERR_ARG, "broadcast: root %d is not a rank of the group (0..%d)", root, c->size - 1);
  if (chk != LT_OK)
    return refused(c, chk);
  lt_work *w = NULL;
  LT_TRY(new_work(c, "broadcast", lt_tensor_numel(t), &w));
  lt_status st = LT_OK;
#ifdef LT_WITH_MPI
  if (use_mpi) {
    if (check_enabled())
      st = agree(c, w->seq, "broadcast", OP_BROADCAST, t->dtype, lt_tensor_numel(t), root, 0, NULL, &w->site);
    int64_t bytes = lt_tensor_numel(t) * lt_dtype_size(t->dtype);
#ifdef LT_WITH_CUDA
    if (on_cuda(t)) {
      if (st == LT_OK)
        st = lt_nccl_collective(c, LT_NCCL_BROADCAST, t, t, LT_COMM_SUM, root);
      return complete(st, w, out);
    }
#endif
    if (st == LT_OK && bytes > max_piece())
      st = in_pieces(c, "broadcast", w->seq, lt_tensor_data(t), bytes, 1, MPI_BYTE, MPI_SUM, root);
    else if (st == LT_OK && MPI_Ibcast(lt_tensor_data(t), (int)bytes, MPI_BYTE, root, c->mpi, &w->req) != MPI_SUCCESS)
      st = lt_fail(LT_ERR_IO, "broadcast: MPI_Ibcast failed on rank %d", world.rank);
  }
#endif
#ifdef LT_WITH_CUDA
  if (on_cuda(t) && !use_mpi)
    st = lt_nccl_collective(c, LT_NCCL_BROADCAST, t, t, LT_COMM_SUM, root);
#endif
  return complete(st, w, out);
}

/* rows along dim 0 and the elements in one row */
static void rows_of(const lt_tensor *t, int64_t *rows, int64_t *row_elems) {
  *rows = t->ndim ? t->sizes[0] : 1;
  int64_t n = 1;
  for (int d = 1; d < t->ndim; d++)
    n *= t->sizes[d];
  *row_elems = n;
}

lt_status lt_comm_all_gather_rows(lt_comm *c, const lt_tensor *t, int64_t *counts) {
  LT_OP_SCOPE("all_gather");
  /* counts[r] = rows of rank r (filled for the caller to size the output) */
  lt_status chk = check_tensor("all_gather", t);
  if (chk != LT_OK)
    return refused(c, chk);
  int64_t rows, re;
  rows_of(t, &rows, &re);
#ifdef LT_WITH_MPI
  if (use_mpi) {
    call_site site = take_site();
    lt_status st = agree(c, c->seq++, "all_gather", OP_ALL_GATHER, t->dtype, rows, re, 1, counts, &site);
    return st;
  }
#endif
  counts[0] = rows;
  return LT_OK;
}

lt_status lt_comm_all_gather(lt_comm *c, lt_tensor *outp, const lt_tensor *t, const int64_t *counts, lt_work **out) {
  LT_OP_SCOPE("all_gather");
  if (out)
    *out = NULL;
  LT_TRY(check_tensor("all_gather", t));
  LT_TRY(check_tensor("all_gather", outp));
  int64_t rows, re, total = 0;
  rows_of(t, &rows, &re);
  for (int r = 0; r < c->size; r++)
    total += counts[r];
  if (outp->dtype != t->dtype || lt_tensor_numel(outp) != total * re)
    return lt_fail(LT_ERR_SHAPE, "all_gather: the output must hold %lld elements of %s", (long long)(total * re),
                   lt_dtype_name(t->dtype));
  lt_work *w = NULL;
#ifdef LT_WITH_CUDA
  if (on_cuda(t)) {
    for (int r = 1; r < c->size; r++)
      if (counts[r] != counts[0])
        return lt_fail(LT_ERR_SHAPE, "all_gather of CUDA tensors: NCCL needs the same rows on every rank (rank 0 has %lld, rank %d %lld)",
                       (long long)counts[0], r, (long long)counts[r]);
    LT_TRY(new_work(c, "all_gather", lt_tensor_numel(t), &w));
    w->site = c->last_site;
    return complete(lt_nccl_collective(c, LT_NCCL_ALL_GATHER, outp, t, LT_COMM_SUM, 0), w, out);
  }
#endif
  LT_TRY(new_work(c, "all_gather", lt_tensor_numel(t), &w));
  w->site = c->last_site; /* taken by its rows' agreement */
  lt_status st = LT_OK;
  int64_t es = lt_dtype_size(t->dtype);
#ifdef LT_WITH_MPI
  if (use_mpi) {
    int *rc = malloc(sizeof(int) * (size_t)c->size * 2);
    if (!rc)
      st = lt_fail(LT_ERR_OOM, "all_gather: out of memory");
    int64_t at = 0;
    for (int r = 0; st == LT_OK && r < c->size; r++) {
      if (counts[r] * re * es > 2147483647LL || at > 2147483647LL)
        st = lt_fail(LT_ERR_ARG, "all_gather: more than 2 GiB per rank is not supported yet");
      rc[r] = (int)(counts[r] * re * es);
      rc[c->size + r] = (int)at;
      at += counts[r] * re * es;
    }
    if (st == LT_OK && MPI_Iallgatherv(lt_tensor_data(t), (int)(rows * re * es), MPI_BYTE, lt_tensor_data(outp), rc,
                                       rc + c->size, MPI_BYTE, c->mpi, &w->req) != MPI_SUCCESS)
      st = lt_fail(LT_ERR_IO, "all_gather: MPI_Iallgatherv failed on rank %d", world.rank);
    /* the count arrays must live until completion (MPI-3, the v-forms): the
       work completes here, under the watchdog, and a handle is already done */
    if (st == LT_OK)
      st = lt_work_wait(w);
    free(rc);
    return complete(st, w, out);
  }
#endif
  memcpy(lt_tensor_data(outp), lt_tensor_data(t), (size_t)(rows * re * es));
  return complete(st, w, out);
}

void lt_comm_chunk(int64_t rows, int size, int rank, int64_t *start, int64_t *len) {
  if (size < 1 || rank < 0 || rank >= size || rows < 0) { /* the Lua side checks; no division by 0 here */
    *start = *len = 0;
    return;
  }
  int64_t base = rows / size, extra = rows % size;
  *len = base + (rank < extra ? 1 : 0);
  *start = rank * base + (rank < extra ? rank : extra);
}

lt_status lt_comm_reduce_scatter(lt_comm *c, lt_tensor *outp, lt_tensor *t, lt_comm_op op, lt_work **out) {
  LT_OP_SCOPE("reduce_scatter");
  if (out)
    *out = NULL;
  lt_status chk = check_tensor("reduce_scatter", t);
  if (chk == LT_OK)
    chk = check_tensor("reduce_scatter", outp);
  if (chk == LT_OK && op == LT_COMM_AVG && !lt_dtype_is_float(t->dtype))
    chk = lt_fail(LT_ERR_DTYPE, "reduce_scatter: avg needs a float tensor, got %s", lt_dtype_name(t->dtype));
  if (chk != LT_OK)
    return refused(c, chk);
  int64_t rows, re, start, len;
  rows_of(t, &rows, &re);
  lt_comm_chunk(rows, c->size, c->rank, &start, &len);
  if (outp->dtype != t->dtype || lt_tensor_numel(outp) != len * re)
    return refused(c, lt_fail(LT_ERR_SHAPE,
                              "reduce_scatter: rank %d's output must hold %lld elements (rows %lld..%lld of %lld)",
                              c->rank, (long long)(len * re), (long long)start, (long long)(start + len),
                              (long long)rows));
  lt_work *w = NULL;
#ifdef LT_WITH_CUDA
  if (on_cuda(t)) {
    if (rows % c->size != 0)
      return lt_fail(LT_ERR_SHAPE, "reduce_scatter of CUDA tensors: NCCL needs rows divisible by the %d ranks, got %lld",
                     c->size, (long long)rows);
    LT_TRY(new_work(c, "reduce_scatter", lt_tensor_numel(t), &w));
    lt_status st = LT_OK;
#ifdef LT_WITH_MPI
    if (use_mpi && check_enabled())
      st = agree(c, w->seq, "reduce_scatter", OP_REDUCE_SCATTER * 16 + (int)op, t->dtype, rows, (int)re, 0, NULL,
                 &w->site);
#endif
    if (st == LT_OK)
      st = lt_nccl_collective(c, LT_NCCL_REDUCE_SCATTER, outp, t, op, 0);
    return complete(st, w, out);
  }
#endif
  LT_TRY(new_work(c, "reduce_scatter", lt_tensor_numel(t), &w));
  lt_status st = LT_OK;
#ifdef LT_WITH_MPI
  if (use_mpi) {
    if (check_enabled())
      st = agree(c, w->seq, "reduce_scatter", OP_REDUCE_SCATTER * 16 + (int)op, t->dtype, rows, (int)re, 0, NULL,
                 &w->site);
    /* the reduction on a working copy (t stays as given), f32 for bf16/f16 */
    lt_tensor *buf = NULL, *res = NULL;
    if (st == LT_OK)
      st = lt_tensor_to(t, is_half(t->dtype) ? LT_DTYPE_F32 : t->dtype, LT_DEVICE_CPU, &buf);
    if (st == LT_OK && buf == t) { /* lt_tensor_to may return t itself */
      lt_tensor_release(buf);
      buf = NULL;
      st = lt_tensor_clone(t, &buf);
    }
    if (st == LT_OK)
      st = lt_tensor_empty(outp->ndim, outp->sizes, buf->dtype, LT_DEVICE_CPU, &res);
    int *rc = st == LT_OK ? malloc(sizeof(int) * (size_t)c->size) : NULL;
    if (st == LT_OK && !rc)
      st = lt_fail(LT_ERR_OOM, "reduce_scatter: out of memory");
    for (int r = 0; st == LT_OK && r < c->size; r++) {
      int64_t s0, l0;
      lt_comm_chunk(rows, c->size, r, &s0, &l0);
      if (l0 * re > 2147483647LL)
        st = lt_fail(LT_ERR_ARG, "reduce_scatter: more than 2^31 elements per rank is not supported yet");
      rc[r] = (int)(l0 * re);
    }
    if (st == LT_OK && MPI_Ireduce_scatter(lt_tensor_data(buf), lt_tensor_data(res), rc, mpi_type(buf->dtype),
                                           mpi_op(op), c->mpi, &w->req) != MPI_SUCCESS)
      st = lt_fail(LT_ERR_IO, "reduce_scatter: MPI_Ireduce_scatter failed on rank %d", world.rank);
    if (st == LT_OK) /* as for all_gather: complete here, under the watchdog */
      st = lt_work_wait(w);
    free(rc);
    if (st == LT_OK && op == LT_COMM_AVG) {
      lt_tensor *r2 = NULL;
      st = lt_binary_scalar(LT_BINARY_MUL, res, 1.0 / c->size, 0, NULL, &r2);
      lt_tensor_release(res);
      res = r2;
    }
    if (st == LT_OK)
      st = lt_tensor_copy_(outp, res);
    lt_tensor_release(buf);
    lt_tensor_release(res);
    return complete(st, w, out);
  }
#endif
  (void)op;
  st = lt_tensor_copy_(outp, t);
  return complete(st, w, out);
}

lt_status lt_comm_barrier(lt_comm *c) {
  LT_OP_SCOPE("barrier");
#ifdef LT_WITH_MPI
  if (use_mpi) {
    lt_work *w = NULL;
    LT_TRY(new_work(c, "barrier", 0, &w));
    lt_status st = LT_OK;
    if (check_enabled()) /* a rank in another collective meanwhile is an error, not a hang */
      st = agree(c, w->seq, "barrier", OP_BARRIER, LT_DTYPE_U8, 0, -1, 0, NULL, &w->site);
    if (st == LT_OK && MPI_Ibarrier(c->mpi, &w->req) != MPI_SUCCESS)
      st = lt_fail(LT_ERR_IO, "barrier: MPI_Ibarrier failed on rank %d", world.rank);
    return complete(st, w, NULL);
  }
#endif
  (void)c;
  return LT_OK;
}

lt_status lt_comm_send(lt_comm *c, const lt_tensor *t, int dst) {
  LT_OP_SCOPE("send");
  LT_TRY(check_tensor("send", t));
  if (dst < 0 || dst >= c->size || dst == c->rank)
    return lt_fail(LT_ERR_ARG, "send: destination %d is not another rank of the group (0..%d)", dst, c->size - 1);
#ifdef LT_WITH_MPI
  int64_t bytes = lt_tensor_numel(t) * lt_dtype_size(t->dtype);
  int64_t head[2] = {bytes, t->dtype};
  MPI_Request req[2];
  if (MPI_Isend(head, 2, MPI_INT64_T, dst, 1, c->mpi, &req[0]) != MPI_SUCCESS ||
      MPI_Isend(lt_tensor_data(t), (int)bytes, MPI_BYTE, dst, 2, c->mpi, &req[1]) != MPI_SUCCESS)
    return lt_fail(LT_ERR_IO, "send: MPI_Isend to rank %d failed", dst);
  uint64_t seq = c->p2p_seq++;
  call_site site = take_site();
  LT_TRY(wait_request(&req[0], "send", c, seq, lt_tensor_numel(t), &site, dst));
  LT_TRY(wait_request(&req[1], "send", c, seq, lt_tensor_numel(t), &site, dst));
#endif
  return LT_OK;
}

lt_status lt_comm_recv(lt_comm *c, lt_tensor *t, int src) {
  LT_OP_SCOPE("recv");
  LT_TRY(check_tensor("recv", t));
  if (src < 0 || src >= c->size || src == c->rank)
    return lt_fail(LT_ERR_ARG, "recv: source %d is not another rank of the group (0..%d)", src, c->size - 1);
#ifdef LT_WITH_MPI
  int64_t bytes = lt_tensor_numel(t) * lt_dtype_size(t->dtype), head[2];
  uint64_t seq = c->p2p_seq++;
  call_site site = take_site();
  MPI_Request req;
  if (MPI_Irecv(head, 2, MPI_INT64_T, src, 1, c->mpi, &req) != MPI_SUCCESS)
    return lt_fail(LT_ERR_IO, "recv: MPI_Irecv from rank %d failed", src);
  LT_TRY(wait_request(&req, "recv", c, seq, lt_tensor_numel(t), &site, src)); /* the watchdog covers a sender that never comes */
  if (head[0] != bytes || head[1] != t->dtype) {
    /* drain the payload so the pair stays in step, then report */
    void *junk = malloc((size_t)head[0] + 1);
    MPI_Recv(junk, (int)head[0], MPI_BYTE, src, 2, c->mpi, MPI_STATUS_IGNORE);
    free(junk);
    return lt_fail(LT_ERR_SHAPE, "recv: rank %d sent %lld bytes of %s, this rank expects %lld bytes of %s", src,
                   (long long)head[0], lt_dtype_name((lt_dtype)head[1]), (long long)bytes, lt_dtype_name(t->dtype));
  }
  if (MPI_Irecv(lt_tensor_data(t), (int)bytes, MPI_BYTE, src, 2, c->mpi, &req) != MPI_SUCCESS)
    return lt_fail(LT_ERR_IO, "recv: MPI_Irecv from rank %d failed", src);
  LT_TRY(wait_request(&req, "recv", c, seq, lt_tensor_numel(t), &site, src));
#endif
  return LT_OK;
}
