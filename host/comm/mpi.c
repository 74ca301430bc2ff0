/*
 * comm/mpi.c: the collectives over MPI, for CPU tensors when the process
 * runs under mpirun: the only file that includes mpi.h, compiled only in a
 * build with MPI (MPI=1; comm/no-mpi.c takes its place otherwise). Each
 * group (lt_comm) holds its MPI communicator (MPI_COMM_WORLD for the world,
 * MPI_Comm_split for sub-groups). Collectives use the nonblocking forms
 * (MPI_Iallreduce, MPI_Ibcast, MPI_Iallgatherv, MPI_Ireduce_scatter,
 * MPI_Ibarrier), waited on under the front's watchdog (comm/watchdog.c);
 * bf16 and f16 are reduced in f32 copies (comm.c's lt_comm_work_buffer).
 * MPI counts are C ints: all_reduce and broadcast go in pieces of at most
 * 2^30 elements (LUTRA_COMM_CHUNK lowers it for tests); all_gather and
 * reduce_scatter refuse more than 2 GiB (2^31 elements) per rank.
 * Point-to-point: send and recv carry a header (bytes, dtype) then the
 * data, so a recv of another size or dtype is an error naming both. The
 * watchdog's queries travel on MPI_COMM_WORLD under tags of their own.
 */
#include "comm/comm-impl.h"
#include "base/status.h"

#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

_Static_assert(sizeof(MPI_Comm) <= sizeof(lt_comm_handle), "an MPI_Comm fits an lt_comm_handle");
_Static_assert(sizeof(MPI_Request) <= sizeof(lt_comm_handle), "an MPI_Request fits an lt_comm_handle");

static const lt_comm_impl mpi_impl;

static MPI_Comm *comm_of(const lt_comm *c) { return (MPI_Comm *)&((lt_comm *)c)->handle; }
static MPI_Request *req_of(lt_work *w) { return (MPI_Request *)&w->req; }

static int poll_request(void *req, int *done) {
  return MPI_Test((MPI_Request *)req, done, MPI_STATUS_IGNORE) != MPI_SUCCESS;
}

/* a request to completion under the watchdog (peer >= 0: a send or recv) */
static lt_status wait_request(MPI_Request *req, const char *op, const lt_comm *c, uint64_t seq, int64_t numel,
                              const lt_comm_site *site, int peer) {
  return lt_comm_watch(poll_request, req, op, c, seq, numel, site, peer);
}

/* ---- the process and its groups --------------------------------------------------- */

static lt_status mpi_init(lt_comm *world) {
  int provided = 0;
  if (MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS)
    return lt_fail(LT_ERR_IO, "dist.init: MPI_Init_thread failed");
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  *comm_of(world) = MPI_COMM_WORLD;
  MPI_Comm_rank(MPI_COMM_WORLD, &world->rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world->size);
  return LT_OK;
}

static void mpi_abort(int code) { MPI_Abort(MPI_COMM_WORLD, code); }

static void mpi_finalize(void) {
  int fin = 0;
  MPI_Finalized(&fin);
  if (!fin)
    MPI_Finalize();
}

static void mpi_library_version(char *buf, size_t cap) {
  char ver[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  MPI_Get_library_version(ver, &len);
  char *nl = strchr(ver, ',');
  if (nl)
    *nl = 0;
  snprintf(buf, cap, "%s", ver);
}

static lt_status mpi_split(lt_comm *parent, int color, int key, lt_comm *child) {
  MPI_Comm *mc = comm_of(child);
  if (MPI_Comm_split(*comm_of(parent), color, key, mc) != MPI_SUCCESS)
    return lt_fail(LT_ERR_IO, "comm split: MPI_Comm_split failed on rank %d", lt_dist_rank());
  MPI_Comm_set_errhandler(*mc, MPI_ERRORS_RETURN);
  MPI_Comm_rank(*mc, &child->rank);
  MPI_Comm_size(*mc, &child->size);
  return LT_OK;
}

static void mpi_free(lt_comm *c) {
  int fin = 0;
  MPI_Finalized(&fin);
  if (!fin)
    MPI_Comm_free(comm_of(c));
}

/* ---- the watchdog's transport ----------------------------------------------------- */

/* What this rank waits in, for the watchdog of another rank to ask
   (tags on MPI_COMM_WORLD that no other message uses). */
enum { TAG_QUERY = 0x6c71, TAG_REPLY = 0x6c72 };

/* answers every pending query with what this rank waits in */
static void serve_queries(void) {
  for (;;) {
    int flag = 0;
    MPI_Status s;
    if (MPI_Iprobe(MPI_ANY_SOURCE, TAG_QUERY, MPI_COMM_WORLD, &flag, &s) != MPI_SUCCESS || !flag)
      return;
    int64_t q;
    MPI_Recv(&q, 1, MPI_INT64_T, s.MPI_SOURCE, TAG_QUERY, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    MPI_Send(&lt_comm_waiting, (int)sizeof lt_comm_waiting, MPI_BYTE, s.MPI_SOURCE, TAG_REPLY, MPI_COMM_WORLD);
  }
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* asks the group's other ranks (only peer when peer >= 0) what they wait in,
   for up to a second, answering their questions meanwhile */
static void ask_peers(const lt_comm *c, int peer, lt_comm_wait_info *ans, int *got, int *wr) {
  int n = c->size;
  int *idx = malloc(sizeof(int) * (size_t)n);
  MPI_Request *rq = malloc(sizeof(MPI_Request) * 2 * (size_t)n);
  if (!idx || !rq) {
    free(idx);
    free(rq);
    return;
  }
  MPI_Group g, wg;
  MPI_Comm_group(*comm_of(c), &g);
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
  for (int left = peer >= 0 ? 1 : n - 1; left > 0 && now_s() < until;) {
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
  free(idx); /* (the requests stay: the job is about to be aborted) */
}

/* ---- bytes ------------------------------------------------------------------------ */

static lt_status mpi_bcast_bytes(lt_comm *c, void *buf, int n, int root) {
  MPI_Request req;
  if (MPI_Ibcast(buf, n, MPI_BYTE, root, *comm_of(c), &req) != MPI_SUCCESS)
    return lt_fail(LT_ERR_IO, "broadcasting %d bytes from rank %d failed on rank %d", n, root, lt_dist_rank());
  return wait_request(&req, "broadcast of a communicator id", c, c->seq++, n, NULL, -1);
}

static lt_status mpi_gather_bytes(lt_comm *c, const void *mine, int n, void *all, const char *op, const char *what,
                                  uint64_t seq, int64_t count, const lt_comm_site *site) {
  MPI_Request req;
  if (MPI_Iallgather(mine, n, MPI_BYTE, all, n, MPI_BYTE, *comm_of(c), &req) != MPI_SUCCESS)
    return lt_fail(LT_ERR_IO, "%s: %s failed on rank %d", op, what, lt_dist_rank());
  return wait_request(&req, op, c, seq, count, site, -1);
}

/* ---- collectives ------------------------------------------------------------------ */

/* MPI counts are C ints: all_reduce and broadcast go in pieces of at most
   this many elements (bytes for broadcast); LUTRA_COMM_CHUNK lowers it so
   tests can reach the piecewise path with small tensors. */
static int64_t max_piece(void) {
  static int64_t n = -1;
  if (n < 0) {
    n = lt_comm_env_int("LUTRA_COMM_CHUNK", 1 << 30);
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
    int rc = root < 0 ? MPI_Iallreduce(MPI_IN_PLACE, data + at * es, (int)k, type, mop, *comm_of(c), &req)
                      : MPI_Ibcast(data + at * es, (int)k, type, root, *comm_of(c), &req);
    if (rc != MPI_SUCCESS)
      return lt_fail(LT_ERR_IO, "%s: MPI failed on rank %d (elements %lld..%lld)", op, lt_dist_rank(), (long long)at,
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

/* w's request is in flight on MPI */
static void started(lt_work *w) { w->pending = &mpi_impl; }

static lt_status mpi_all_reduce(lt_work *w, lt_tensor *t, lt_comm_op op) {
  lt_comm *c = w->comm;
  lt_tensor *buf = NULL;
  LT_TRY(lt_comm_work_buffer(w, t, &buf));
  if (op == LT_COMM_AVG) {
    if (!w->f32) { /* the sum is divided in place at wait: keep t as both */
      lt_tensor_retain(t);
      lt_tensor_retain(t);
      w->f32 = t;
      w->target = t;
    }
    w->scale = 1.0 / c->size;
  }
  int64_t n = lt_tensor_numel(buf);
  if (n > max_piece())
    return in_pieces(c, "all_reduce", w->seq, lt_tensor_data(buf), n, lt_dtype_size(buf->dtype),
                     mpi_type(buf->dtype), mpi_op(op), -1);
  if (MPI_Iallreduce(MPI_IN_PLACE, lt_tensor_data(buf), (int)n, mpi_type(buf->dtype), mpi_op(op), *comm_of(c),
                     req_of(w)) != MPI_SUCCESS)
    return lt_fail(LT_ERR_IO, "all_reduce: MPI_Iallreduce failed on rank %d", lt_dist_rank());
  started(w);
  return LT_OK;
}

static lt_status mpi_broadcast(lt_work *w, lt_tensor *t, int root) {
  lt_comm *c = w->comm;
  int64_t bytes = lt_tensor_numel(t) * lt_dtype_size(t->dtype);
  if (bytes > max_piece())
    return in_pieces(c, "broadcast", w->seq, lt_tensor_data(t), bytes, 1, MPI_BYTE, MPI_SUM, root);
  if (MPI_Ibcast(lt_tensor_data(t), (int)bytes, MPI_BYTE, root, *comm_of(c), req_of(w)) != MPI_SUCCESS)
    return lt_fail(LT_ERR_IO, "broadcast: MPI_Ibcast failed on rank %d", lt_dist_rank());
  started(w);
  return LT_OK;
}

static lt_status mpi_all_gather(lt_work *w, lt_tensor *outp, const lt_tensor *t, const int64_t *counts) {
  lt_comm *c = w->comm;
  int64_t es = lt_dtype_size(t->dtype), n = lt_tensor_numel(t);
  lt_status st = LT_OK;
  int *rc = malloc(sizeof(int) * (size_t)c->size * 2);
  if (!rc)
    st = lt_fail(LT_ERR_OOM, "all_gather: out of memory");
  int64_t at = 0, re = 1; /* the elements of a row */
  for (int d = 1; d < t->ndim; d++)
    re *= t->sizes[d];
  for (int r = 0; st == LT_OK && r < c->size; r++) {
    if (counts[r] * re * es > 2147483647LL || at > 2147483647LL)
      st = lt_fail(LT_ERR_ARG, "all_gather: more than 2 GiB per rank is not supported yet");
    rc[r] = (int)(counts[r] * re * es);
    rc[c->size + r] = (int)at;
    at += counts[r] * re * es;
  }
  if (st == LT_OK && MPI_Iallgatherv(lt_tensor_data(t), (int)(n * es), MPI_BYTE, lt_tensor_data(outp), rc,
                                     rc + c->size, MPI_BYTE, *comm_of(c), req_of(w)) != MPI_SUCCESS)
    st = lt_fail(LT_ERR_IO, "all_gather: MPI_Iallgatherv failed on rank %d", lt_dist_rank());
  /* the count arrays must live until completion (MPI-3, the v-forms): the
     work completes here, under the watchdog, and a handle is already done */
  if (st == LT_OK) {
    started(w);
    st = lt_work_wait(w);
  }
  free(rc);
  return st;
}

static lt_status mpi_reduce_scatter(lt_work *w, lt_tensor *outp, lt_tensor *t, lt_comm_op op) {
  lt_comm *c = w->comm;
  int64_t rows = t->ndim ? t->sizes[0] : 1, re = 1;
  for (int d = 1; d < t->ndim; d++)
    re *= t->sizes[d];
  /* MPI reads the send buffer and never writes it: a contiguous CPU tensor
     (lt_comm_reduce_scatter checked contiguity) is sent as it is, else a CPU
     copy, f32 for bf16/f16; the result goes straight into outp where it can
     (a CPU tensor of the reduction's dtype) */
  lt_tensor *buf = NULL, *res = NULL;
  lt_status st = lt_tensor_to(t, lt_comm_is_half(t->dtype) ? LT_DTYPE_F32 : t->dtype, LT_DEVICE_CPU, &buf);
  if (st == LT_OK && outp->storage->device == LT_DEVICE_CPU && outp->dtype == buf->dtype &&
      lt_tensor_is_contiguous(outp)) {
    lt_tensor_retain(outp);
    res = outp;
  } else if (st == LT_OK)
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
                                         mpi_op(op), *comm_of(c), req_of(w)) != MPI_SUCCESS)
    st = lt_fail(LT_ERR_IO, "reduce_scatter: MPI_Ireduce_scatter failed on rank %d", lt_dist_rank());
  if (st == LT_OK) { /* as for all_gather: complete here, under the watchdog */
    started(w);
    st = lt_work_wait(w);
  }
  free(rc);
  if (st == LT_OK && op == LT_COMM_AVG) {
    lt_tensor *r2 = NULL;
    st = lt_binary_scalar(LT_BINARY_MUL, res, 1.0 / c->size, 0, NULL, &r2);
    lt_tensor_release(res);
    res = r2;
  }
  if (st == LT_OK && res != outp)
    st = lt_tensor_copy_(outp, res);
  lt_tensor_release(buf);
  lt_tensor_release(res);
  return st;
}

static lt_status mpi_barrier(lt_work *w) {
  if (MPI_Ibarrier(*comm_of(w->comm), req_of(w)) != MPI_SUCCESS)
    return lt_fail(LT_ERR_IO, "barrier: MPI_Ibarrier failed on rank %d", lt_dist_rank());
  started(w);
  return LT_OK;
}

/* ---- requests --------------------------------------------------------------------- */

/* an irecv's request polled keeping its status (the received size) */
typedef struct {
  MPI_Request *req;
  MPI_Status status;
  int err; /* MPI_Test's error class, when it failed */
} recv_poll;

static int poll_recv(void *p, int *done) {
  recv_poll *r = p;
  int rc = MPI_Test(r->req, done, &r->status);
  if (rc != MPI_SUCCESS)
    MPI_Error_class(rc, &r->err);
  return rc != MPI_SUCCESS;
}

static lt_status wait_irecv(lt_work *w) {
  recv_poll r = {.req = req_of(w), .err = MPI_SUCCESS};
  lt_status st = lt_comm_watch(poll_recv, &r, w->op, w->comm, w->seq, w->numel, &w->site, w->peer);
  if (st != LT_OK && r.err == MPI_ERR_TRUNCATE)
    return lt_fail(LT_ERR_SHAPE, "irecv: rank %d sent more than the %lld bytes this rank expects", w->peer,
                   (long long)w->expect);
  LT_TRY(st);
  int count = 0;
  MPI_Get_count(&r.status, MPI_BYTE, &count);
  if (count != w->expect)
    return lt_fail(LT_ERR_SHAPE, "irecv: rank %d sent %d bytes, this rank expects %lld", w->peer, count,
                   (long long)w->expect);
  return LT_OK;
}

static lt_status mpi_wait(lt_work *w) {
  if (*req_of(w) == MPI_REQUEST_NULL)
    return LT_OK;
  if (w->expect > 0)
    return wait_irecv(w);
  return wait_request(req_of(w), w->op, w->comm, w->seq, w->numel, &w->site, w->peer);
}

static int mpi_test(lt_work *w) {
  if (*req_of(w) == MPI_REQUEST_NULL)
    return 1;
  int flag = 0;
  if (MPI_Test(req_of(w), &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS)
    return 1; /* the error surfaces at wait */
  return flag;
}

/* ---- point-to-point --------------------------------------------------------------- */

static lt_status mpi_send(lt_comm *c, const lt_tensor *t, int dst) {
  int64_t bytes = lt_tensor_numel(t) * lt_dtype_size(t->dtype);
  int64_t head[2] = {bytes, t->dtype};
  MPI_Request req[2];
  if (MPI_Isend(head, 2, MPI_INT64_T, dst, 1, *comm_of(c), &req[0]) != MPI_SUCCESS ||
      MPI_Isend(lt_tensor_data(t), (int)bytes, MPI_BYTE, dst, 2, *comm_of(c), &req[1]) != MPI_SUCCESS)
    return lt_fail(LT_ERR_IO, "send: MPI_Isend to rank %d failed", dst);
  uint64_t seq = c->p2p_seq++;
  lt_comm_site site = lt_comm_take_site();
  LT_TRY(wait_request(&req[0], "send", c, seq, lt_tensor_numel(t), &site, dst));
  LT_TRY(wait_request(&req[1], "send", c, seq, lt_tensor_numel(t), &site, dst));
  return LT_OK;
}

static lt_status mpi_recv(lt_comm *c, lt_tensor *t, int src) {
  int64_t bytes = lt_tensor_numel(t) * lt_dtype_size(t->dtype), head[2];
  uint64_t seq = c->p2p_seq++;
  lt_comm_site site = lt_comm_take_site();
  MPI_Request req;
  if (MPI_Irecv(head, 2, MPI_INT64_T, src, 1, *comm_of(c), &req) != MPI_SUCCESS)
    return lt_fail(LT_ERR_IO, "recv: MPI_Irecv from rank %d failed", src);
  /* the watchdog covers a sender that never comes */
  LT_TRY(wait_request(&req, "recv", c, seq, lt_tensor_numel(t), &site, src));
  if (head[0] != bytes || head[1] != t->dtype) {
    /* drain the payload so the pair stays in step, then report */
    void *junk = malloc((size_t)head[0] + 1);
    MPI_Recv(junk, (int)head[0], MPI_BYTE, src, 2, *comm_of(c), MPI_STATUS_IGNORE);
    free(junk);
    return lt_fail(LT_ERR_SHAPE, "recv: rank %d sent %lld bytes of %s, this rank expects %lld bytes of %s", src,
                   (long long)head[0], lt_dtype_name((lt_dtype)head[1]), (long long)bytes, lt_dtype_name(t->dtype));
  }
  if (MPI_Irecv(lt_tensor_data(t), (int)bytes, MPI_BYTE, src, 2, *comm_of(c), &req) != MPI_SUCCESS)
    return lt_fail(LT_ERR_IO, "recv: MPI_Irecv from rank %d failed", src);
  return wait_request(&req, "recv", c, seq, lt_tensor_numel(t), &site, src);
}

/* isend / irecv: the data alone (no header: the sizes are the caller's,
   checked at the irecv's wait), tags offset past the blocking pair's 1 and 2 */
enum { P2P_TAG_BASE = 16 };

static lt_status too_large(const char *op, int64_t bytes) {
  return lt_fail(LT_ERR_ARG, "%s: %lld bytes is over MPI's 2 GiB per message", op, (long long)bytes);
}

static lt_status mpi_isend(lt_work *w, const lt_tensor *t, int dst, int tag) {
  int64_t bytes = lt_tensor_numel(t) * lt_dtype_size(t->dtype);
  if (bytes > INT32_MAX)
    return too_large("isend", bytes);
  if (MPI_Isend(lt_tensor_data(t), (int)bytes, MPI_BYTE, dst, P2P_TAG_BASE + tag, *comm_of(w->comm), req_of(w)) !=
      MPI_SUCCESS)
    return lt_fail(LT_ERR_IO, "isend: MPI_Isend to rank %d failed", dst);
  w->pending = &mpi_impl;
  return LT_OK;
}

static lt_status mpi_irecv(lt_work *w, lt_tensor *t, int src, int tag) {
  int64_t bytes = lt_tensor_numel(t) * lt_dtype_size(t->dtype);
  if (bytes > INT32_MAX)
    return too_large("irecv", bytes);
  if (MPI_Irecv(lt_tensor_data(t), (int)bytes, MPI_BYTE, src, P2P_TAG_BASE + tag, *comm_of(w->comm), req_of(w)) !=
      MPI_SUCCESS)
    return lt_fail(LT_ERR_IO, "irecv: MPI_Irecv from rank %d failed", src);
  w->expect = bytes;
  w->pending = &mpi_impl;
  return LT_OK;
}

static const lt_comm_impl mpi_impl = {
    .name = "MPI",
    .agrees = 1,
    .init = mpi_init,
    .abort = mpi_abort,
    .finalize = mpi_finalize,
    .library_version = mpi_library_version,
    .split = mpi_split,
    .free = mpi_free,
    .all_reduce = mpi_all_reduce,
    .broadcast = mpi_broadcast,
    .all_gather = mpi_all_gather,
    .reduce_scatter = mpi_reduce_scatter,
    .barrier = mpi_barrier,
    .bcast_bytes = mpi_bcast_bytes,
    .gather_bytes = mpi_gather_bytes,
    .send = mpi_send,
    .recv = mpi_recv,
    .isend = mpi_isend,
    .irecv = mpi_irecv,
    .wait = mpi_wait,
    .test = mpi_test,
    .serve_queries = serve_queries,
    .ask_peers = ask_peers,
};

const lt_comm_impl *lt_comm_mpi(void) { return &mpi_impl; }
