/*
 * comm.c: process groups and collectives (lt_dist_*, lt_comm_*): the front
 * over the implementations of comm/comm-impl.h. lt_dist_init chooses the
 * world's: MPI when the process runs under mpirun (OMPI_COMM_WORLD_SIZE above 1;
 * comm/mpi.c), a single process otherwise (comm/single.c: every collective
 * the identity or a copy). A collective on CUDA tensors goes to NCCL on the
 * same group (comm/nccl.c; there all_gather and reduce_scatter need equal
 * chunks). Here: the groups (the world and its sub-groups, lt_comm_split),
 * the call site Lua sets, the argument checks, the agreement exchange
 * (comm/agree.c) on groups of several ranks, the works (lt_work) and their
 * bf16/f16 conversions; the watchdog that guards every wait is
 * comm/watchdog.c.
 *
 * Semantics follow torch.distributed: all_reduce in place (sum, avg, max,
 * min); broadcast in place from a root; all_gather concatenates each rank's
 * tensor along dim 0 (ranks may hold different lengths); reduce_scatter
 * reduces a tensor that every rank holds whole and gives rank r the r-th of
 * world_size chunks along dim 0, the first (n mod world) chunks one row
 * longer (torch.tensor_split's rule), so sizes need not divide. bf16 and f16
 * are reduced in f32 (converted on the way in and out). Point-to-point calls
 * (send, recv) count apart from the group's collectives.
 * The asynchronous forms return an lt_work to wait on.
 */
#include "comm/agree.h"
#include "comm/comm-impl.h"
#include "comm/comm.h"
#include "lutra.h"
#include "base/status.h"
#include "core/tensor-impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int initialised, next_id = 1, local_rank;
static lt_comm world = {.rank = 0, .size = 1, .impl = &lt_comm_single_impl};
static lt_comm_site pending_site; /* set by lt_comm_set_site, taken by the next collective */

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

lt_comm_site lt_comm_take_site(void) {
  lt_comm_site s = pending_site;
  pending_site.hash = 0;
  pending_site.text[0] = 0;
  return s;
}

const char *lt_comm_site_name(const lt_comm_site *s) { return s && s->hash ? s->text : "(no Lua call site)"; }

int lt_comm_env_int(const char *name, int dflt) {
  const char *v = getenv(name);
  return v && *v ? atoi(v) : dflt;
}

/* ---- the process and its groups --------------------------------------------------- */

int lt_has_mpi(void) { return lt_comm_mpi() != NULL; }

const char *lt_comm_build_info(void) {
  static char buf[512];
  const lt_comm_impl *mpi = lt_comm_mpi();
  if (!mpi) {
    snprintf(buf, sizeof buf, "mpi: not compiled in (MPI=0)");
    return buf;
  }
  char ver[384] = "";
  mpi->library_version(ver, sizeof ver);
  snprintf(buf, sizeof buf, "mpi: compiled in (%s)", ver);
  return buf;
}

lt_status lt_dist_init(void) {
  LT_OP_SCOPE("dist init");
  if (initialised)
    return LT_OK;
  int size = lt_comm_env_int("OMPI_COMM_WORLD_SIZE", 1);
  local_rank = lt_comm_env_int("OMPI_COMM_WORLD_LOCAL_RANK", 0);
  if (size > 1) {
    const lt_comm_impl *mpi = lt_comm_mpi();
    if (!mpi)
      return lt_fail(LT_ERR_UNSUPPORTED,
                     "dist.init: running under mpirun with %d ranks, but this lutra was built without MPI "
                     "(install libopenmpi-dev and rebuild, or build with MPI=1)",
                     size);
    LT_TRY(mpi->init(&world));
    world.impl = mpi;
  }
  initialised = 1;
  return LT_OK;
}

int lt_dist_initialised(void) { return initialised; }
int lt_dist_rank(void) { return world.rank; }
int lt_dist_world_size(void) { return world.size; }
int lt_dist_local_rank(void) { return local_rank; }

void lt_dist_abort(int code) {
  if (world.impl->abort)
    world.impl->abort(code);
  _exit(code);
}

void lt_dist_finalize(void) {
  if (world.impl->finalize)
    world.impl->finalize();
}

lt_comm *lt_comm_world(void) { return &world; }
int lt_comm_rank(const lt_comm *c) { return c->rank; }
int lt_comm_size(const lt_comm *c) { return c->size; }
int lt_comm_id(const lt_comm *c) { return c->id; }

lt_status lt_comm_split(lt_comm *parent, int color, int key, lt_comm **out) {
  *out = NULL;
  lt_comm *c = calloc(1, sizeof *c);
  if (!c)
    return lt_fail(LT_ERR_OOM, "comm split: out of memory");
  c->id = next_id++;
  c->impl = parent->impl;
  lt_status st = LT_OK;
  if (parent->impl->agrees) {
    /* every rank of the parent must come: checked under the watchdog, as
       the split itself would wait forever for a rank that does not */
    lt_comm_site site = lt_comm_take_site();
    st = lt_comm_agree(parent, parent->seq++, "new_group", LT_AGREE_SPLIT, LT_DTYPE_I32, 0, -1, 1, NULL, &site);
  }
  if (st == LT_OK)
    st = parent->impl->split(parent, color, key, c);
  if (st != LT_OK) {
    free(c);
    return st;
  }
  *out = c;
  return LT_OK;
}

void lt_comm_free(lt_comm *c) {
  if (!c || c == &world)
    return;
  if (c->impl->free)
    c->impl->free(c);
  free(c);
}

lt_status lt_comm_bcast_bytes(lt_comm *c, void *buf, int n, int root) {
  LT_OP_SCOPE("broadcast");
  if (c->impl->bcast_bytes)
    return c->impl->bcast_bytes(c, buf, n, root);
  return LT_OK;
}

/* ---- checks ----------------------------------------------------------------------- */

static int on_cuda(const lt_tensor *t) { return t && t->storage->device >= LT_DEVICE_CUDA; }

/* the implementation that moves t: NCCL for a CUDA tensor, else the group's */
static const lt_comm_impl *impl_for(const lt_comm *c, const lt_tensor *t) {
  return on_cuda(t) ? lt_comm_nccl() : c->impl;
}

static lt_status check_tensor(const char *op, const lt_tensor *t) {
  if (!t)
    return lt_fail(LT_ERR_ARG, "%s: no tensor", op);
  LT_TRY(lt_check_tensor(op, t, 1)); /* freed (:free()) or its data dropped */
  if (on_cuda(t) && !lt_comm_nccl())
    return lt_fail(LT_ERR_UNSUPPORTED, "%s: a CUDA tensor, but this lutra was built without CUDA", op);
  if (!lt_tensor_is_contiguous(t))
    return lt_fail(LT_ERR_ARG, "%s: the tensor must be contiguous", op);
  lt_dtype d = t->dtype;
  if (d != LT_DTYPE_F32 && d != LT_DTYPE_F64 && d != LT_DTYPE_BF16 && d != LT_DTYPE_F16 && d != LT_DTYPE_I32 &&
      d != LT_DTYPE_I64 && d != LT_DTYPE_U8)
    return lt_fail(LT_ERR_DTYPE, "%s: dtype %s is not supported", op, lt_dtype_name(d));
  return LT_OK;
}

/* whether calls on c are checked with its other ranks (LUTRA_COMM_CHECK) */
static int checked(const lt_comm *c) { return c->impl->agrees && lt_comm_check_enabled(); }

lt_status lt_comm_refuse(lt_comm *c) {
  if (c && checked(c))
    return lt_comm_announce_refusal(c);
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

/* ---- works ------------------------------------------------------------------------ */

int lt_comm_is_half(lt_dtype d) { return d == LT_DTYPE_BF16 || d == LT_DTYPE_F16; }

/* a work numbered by *counter (the group's collectives, or its sends and receives) */
static lt_status alloc_work(lt_comm *c, const char *op, int64_t numel, uint64_t *counter, int peer, lt_work **out) {
  lt_work *w = calloc(1, sizeof *w);
  if (!w)
    return lt_fail(LT_ERR_OOM, "%s: out of memory", op);
  w->comm = c;
  w->op = op;
  w->seq = (*counter)++;
  w->site = lt_comm_take_site();
  w->numel = numel;
  w->scale = 1;
  w->peer = peer;
  *out = w;
  return LT_OK;
}

static lt_status new_work(lt_comm *c, const char *op, int64_t numel, lt_work **out) {
  return alloc_work(c, op, numel, &c->seq, -1, out);
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
  if (w->pending)
    LT_TRY(w->pending->wait(w));
  w->done = 1;
  return finish(w);
}

int lt_work_test(lt_work *w) {
  if (!w || w->done)
    return 1;
  if (w->pending)
    return w->pending->test(w);
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

lt_status lt_comm_work_buffer(lt_work *w, lt_tensor *t, lt_tensor **buf) {
  if (!lt_comm_is_half(t->dtype)) {
    *buf = t;
    return LT_OK;
  }
  LT_TRY(lt_tensor_to(t, LT_DTYPE_F32, LT_DEVICE_CPU, &w->f32));
  lt_tensor_retain(t);
  w->target = t;
  *buf = w->f32;
  return LT_OK;
}

/* ---- collectives ------------------------------------------------------------------ */

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
  if (checked(c))
    st = lt_comm_agree(c, w->seq, "all_reduce", LT_AGREE_ALL_REDUCE * 16 + (int)op, t->dtype, lt_tensor_numel(t), -1,
                       0, NULL, &w->site);
  if (st == LT_OK)
    st = impl_for(c, t)->all_reduce(w, t, op);
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
  if (checked(c))
    st = lt_comm_agree(c, w->seq, "broadcast", LT_AGREE_BROADCAST, t->dtype, lt_tensor_numel(t), root, 0, NULL,
                       &w->site);
  if (st == LT_OK)
    st = impl_for(c, t)->broadcast(w, t, root);
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
  if (c->impl->agrees) { /* the rows travel by the agreement, LUTRA_COMM_CHECK or not */
    lt_comm_site site = lt_comm_take_site();
    return lt_comm_agree(c, c->seq++, "all_gather", LT_AGREE_ALL_GATHER, t->dtype, rows, (int)re, 1, counts, &site);
  }
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
  const lt_comm_impl *im = impl_for(c, t);
  if (im->check_all_gather)
    LT_TRY(im->check_all_gather(c, counts));
  lt_work *w = NULL;
  LT_TRY(new_work(c, "all_gather", lt_tensor_numel(t), &w));
  w->site = c->last_site; /* taken by its rows' agreement */
  return complete(im->all_gather(w, outp, t, counts), w, out);
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
  const lt_comm_impl *im = impl_for(c, t);
  if (im->check_reduce_scatter)
    LT_TRY(im->check_reduce_scatter(c, rows));
  lt_work *w = NULL;
  LT_TRY(new_work(c, "reduce_scatter", lt_tensor_numel(t), &w));
  lt_status st = LT_OK;
  if (checked(c))
    st = lt_comm_agree(c, w->seq, "reduce_scatter", LT_AGREE_REDUCE_SCATTER * 16 + (int)op, t->dtype, rows, (int)re,
                       0, NULL, &w->site);
  if (st == LT_OK)
    st = im->reduce_scatter(w, outp, t, op);
  return complete(st, w, out);
}

lt_status lt_comm_barrier(lt_comm *c) {
  LT_OP_SCOPE("barrier");
  if (!c->impl->barrier)
    return LT_OK;
  lt_work *w = NULL;
  LT_TRY(new_work(c, "barrier", 0, &w));
  lt_status st = LT_OK;
  if (checked(c)) /* a rank in another collective meanwhile is an error, not a hang */
    st = lt_comm_agree(c, w->seq, "barrier", LT_AGREE_BARRIER, LT_DTYPE_U8, 0, -1, 0, NULL, &w->site);
  if (st == LT_OK)
    st = c->impl->barrier(w);
  return complete(st, w, NULL);
}

/* ---- point-to-point --------------------------------------------------------------- */

lt_status lt_comm_send(lt_comm *c, const lt_tensor *t, int dst) {
  LT_OP_SCOPE("send");
  LT_TRY(check_tensor("send", t));
  if (dst < 0 || dst >= c->size || dst == c->rank)
    return lt_fail(LT_ERR_ARG, "send: destination %d is not another rank of the group (0..%d)", dst, c->size - 1);
  return c->impl->send(c, t, dst);
}

lt_status lt_comm_recv(lt_comm *c, lt_tensor *t, int src) {
  LT_OP_SCOPE("recv");
  LT_TRY(check_tensor("recv", t));
  if (src < 0 || src >= c->size || src == c->rank)
    return lt_fail(LT_ERR_ARG, "recv: source %d is not another rank of the group (0..%d)", src, c->size - 1);
  return c->impl->recv(c, t, src);
}

/* ---- asynchronous point-to-point -------------------------------------------------- */

enum { LT_P2P_TAG_MAX = 1 << 20 }; /* (MPI guarantees tags up to 32767; Open MPI's reach 2^31 - 1) */

static lt_status p2p_start(lt_comm *c, const char *op, lt_tensor *t, int peer, int tag, int receive,
                           lt_work **out) {
  LT_OP_SCOPE(op);
  LT_TRY(check_tensor(op, t));
  if (peer < 0 || peer >= c->size || peer == c->rank)
    return lt_fail(LT_ERR_ARG, "%s: %s %d is not another rank of the group (0..%d)", op,
                   receive ? "source" : "destination", peer, c->size - 1);
  if (lt_tensor_numel(t) == 0)
    return lt_fail(LT_ERR_ARG, "%s: an empty tensor (nothing to %s)", op, receive ? "receive" : "send");
  if (tag < 0 || tag >= LT_P2P_TAG_MAX)
    return lt_fail(LT_ERR_ARG, "%s: tag %d is outside 0..%d", op, tag, LT_P2P_TAG_MAX - 1);
  const lt_comm_impl *im = impl_for(c, t);
  if (receive ? im->irecv == NULL : im->isend == NULL)
    return lt_fail(LT_ERR_UNSUPPORTED, "%s: %s has no asynchronous point-to-point for %s tensors", op, im->name,
                   on_cuda(t) ? "CUDA" : "CPU");
  lt_work *w = NULL;
  LT_TRY(alloc_work(c, op, lt_tensor_numel(t), &c->p2p_seq, peer, &w));
  lt_status st = receive ? im->irecv(w, t, peer, tag) : im->isend(w, t, peer, tag);
  if (st != LT_OK) {
    w->done = 1;
    lt_work_free(w);
    return st;
  }
  *out = w;
  return LT_OK;
}

lt_status lt_comm_isend(lt_comm *c, const lt_tensor *t, int dst, int tag, lt_work **out) {
  return p2p_start(c, "isend", (lt_tensor *)t, dst, tag, 0, out);
}

lt_status lt_comm_irecv(lt_comm *c, lt_tensor *t, int src, int tag, lt_work **out) {
  return p2p_start(c, "irecv", t, src, tag, 1, out);
}
