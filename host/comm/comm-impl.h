/*
 * comm/comm-impl.h: the interface between the front of the collectives
 * (comm/comm.c: groups, argument checks, the agreement exchange of
 * comm/agree.c, the watchdog of comm/watchdog.c, the choice of an
 * implementation) and the implementations that move the data:
 *
 *   comm/mpi.c     MPI, for CPU tensors under mpirun (the only file that
 *                  includes mpi.h; compiled only with MPI=1)
 *   comm/no-mpi.c  compiled in mpi.c's place with MPI=0: lt_comm_mpi() is NULL
 *   comm/single.c  one process: every collective the identity or a copy
 *   comm/nccl.c    NCCL, for CUDA tensors (lt_comm_nccl() is NULL without CUDA)
 *
 * Every group (lt_comm) has a host implementation (c->impl: MPI or single,
 * the world's, chosen at lt_dist_init by how the process was launched); a
 * collective on CUDA tensors goes to NCCL instead, on the same group. Which
 * MPI is linked is a link-time choice (the Makefile compiles mpi.c or
 * no-mpi.c), so no source has an MPI conditional. Nothing above comm/ sees
 * this header.
 */
#ifndef LUTRA_COMM_IMPL_H
#define LUTRA_COMM_IMPL_H

#include "lutra.h"
#include "core/tensor-impl.h"

#include <stddef.h>
#include <stdint.h>

/* Where a collective was called from (Lua's lt_comm_set_site): a hash of the
   site "file:line" (0: not known) and the first LT_COMM_SITE_TEXT - 1 bytes
   of the site followed by its context (" < caller:line < ..."). */
enum { LT_COMM_SITE_TEXT = 160 };
typedef struct {
  uint64_t hash;
  char text[LT_COMM_SITE_TEXT];
} lt_comm_site;

/* An implementation's own handle (MPI: an MPI_Comm or an MPI_Request), kept
   inside the front's objects so a call allocates nothing for it. */
typedef union {
  void *ptr;
  int64_t i;
  unsigned char bytes[16];
} lt_comm_handle;

typedef struct lt_comm_impl lt_comm_impl;

struct lt_comm {
  int rank, size;
  int id;               /* 0 for the world, then in creation order */
  uint64_t seq;         /* collectives called on the group (the same on every rank) */
  uint64_t p2p_seq;     /* sends and recvs (between two ranks only) */
  lt_comm_site last_site; /* of the last collective agreed on */
  const lt_comm_impl *impl; /* for CPU tensors: the world's (MPI or single process) */
  lt_comm_handle handle;    /* the implementation's (MPI: the MPI_Comm) */
};

struct lt_work {
  lt_comm *comm;
  lt_comm_site site;
  const char *op;
  uint64_t seq;
  int64_t numel;
  int done;
  const lt_comm_impl *pending; /* the implementation whose request req is in flight (NULL: none) */
  lt_comm_handle req;
  /* a bf16/f16 collective works on an f32 copy, converted back at wait */
  lt_tensor *f32, *target;
  double scale; /* avg: the sum is divided by the group size at wait */
  int peer;         /* isend / irecv: the other rank (the watchdog names it); -1 for a collective */
  int64_t expect;   /* irecv: the bytes the message must hold (checked at wait); 0 otherwise */
};

/* What this rank waits in now, for another rank's watchdog to ask
   (comm/watchdog.c keeps it, the implementation's serve_queries sends it). */
typedef struct {
  int64_t active, group, size, seq, p2p; /* p2p: a send or recv (its seq counts those) */
  char op[40];
  char site[LT_COMM_SITE_TEXT];
} lt_comm_wait_info;

/* One collective implementation. Entries an implementation does not need
   are NULL (the front says what NULL means at each). The tensor entries run
   after the front's checks and agreement, with st == LT_OK; they start the
   transfer on w (setting w->pending and w->req for one to wait on) or
   complete it. Errors are lt_fail's, naming the call and the rank. */
struct lt_comm_impl {
  const char *name; /* "MPI", "single process", "NCCL" */
  int agrees;       /* several ranks: calls are checked with the group (comm/agree.c) */

  /* the process (host implementations) */
  lt_status (*init)(lt_comm *world);           /* fills world's rank, size and handle */
  void (*abort)(int code);                     /* NULL: _exit alone */
  void (*finalize)(void);                      /* NULL: nothing to do */
  void (*library_version)(char *buf, size_t cap); /* the library's own name and version */

  /* groups: child's rank, size and handle (id, impl set by the front) */
  lt_status (*split)(lt_comm *parent, int color, int key, lt_comm *child);
  void (*free)(lt_comm *c); /* NULL: nothing to release */

  /* refusals before the call counts (NULL: none): NCCL's equal chunks */
  lt_status (*check_all_gather)(const lt_comm *c, const int64_t *counts);
  lt_status (*check_reduce_scatter)(const lt_comm *c, int64_t rows);

  /* collectives on contiguous tensors (semantics in lutra.h) */
  lt_status (*all_reduce)(lt_work *w, lt_tensor *t, lt_comm_op op);
  lt_status (*broadcast)(lt_work *w, lt_tensor *t, int root);
  /* counts[r]: rank r's rows (agreed); out holds their sum of rows */
  lt_status (*all_gather)(lt_work *w, lt_tensor *out, const lt_tensor *t, const int64_t *counts);
  lt_status (*reduce_scatter)(lt_work *w, lt_tensor *out, lt_tensor *t, lt_comm_op op);
  lt_status (*barrier)(lt_work *w); /* NULL: nothing to wait for (and no call counted) */

  /* bytes: the broadcast NCCL's unique id travels by (NULL: one rank, nothing
     to do), and the agreement's exchange of every rank's n bytes into all
     (size * n bytes) under the watchdog (what: "exchanging sizes", ...) */
  lt_status (*bcast_bytes)(lt_comm *c, void *buf, int n, int root);
  lt_status (*gather_bytes)(lt_comm *c, const void *mine, int n, void *all, const char *op, const char *what,
                            uint64_t seq, int64_t count, const lt_comm_site *site);

  /* point-to-point, blocking under the watchdog (ranks of c, not this one) */
  lt_status (*send)(lt_comm *c, const lt_tensor *t, int dst);
  lt_status (*recv)(lt_comm *c, lt_tensor *t, int src);

  /* point-to-point, asynchronous: start the transfer on w (tag: the
     caller's, so messages between two ranks match by it); NULL: refused */
  lt_status (*isend)(lt_work *w, const lt_tensor *t, int dst, int tag);
  lt_status (*irecv)(lt_work *w, lt_tensor *t, int src, int tag);

  /* a work's request: wait under the watchdog; test: 1 when complete or failed */
  lt_status (*wait)(lt_work *w);
  int (*test)(lt_work *w);

  /* the watchdog's transport: answer other ranks' queries with
     lt_comm_waiting; ask the group's ranks (only peer when peer >= 0) what
     they wait in for up to a second: ans[r], got[r] = 1 when rank r
     answered, world_rank[r] its rank in the world (arrays of c->size) */
  void (*serve_queries)(void);
  void (*ask_peers)(const lt_comm *c, int peer, lt_comm_wait_info *ans, int *got, int *world_rank);
};

/* ---- the implementations ---------------------------------------------------------- */

extern const lt_comm_impl lt_comm_single_impl; /* comm/single.c */
/* The MPI implementation (comm/mpi.c), or NULL in a build without MPI (comm/no-mpi.c). */
const lt_comm_impl *lt_comm_mpi(void);
/* The NCCL implementation for CUDA tensors (comm/nccl.c), or NULL without CUDA. */
const lt_comm_impl *lt_comm_nccl(void);

/* ---- what the front gives the implementations ------------------------------------- */

/* The pending call site (lt_comm_set_site), cleared so a later call from C does not inherit it. */
lt_comm_site lt_comm_take_site(void);
/* The site's text, or "(no Lua call site)". */
const char *lt_comm_site_name(const lt_comm_site *s);
/* Broadcasts n bytes from root over the group (nothing to do alone). */
lt_status lt_comm_bcast_bytes(lt_comm *c, void *buf, int n, int root);
/* The buffer a CPU reduction works on: t itself, or an f32 copy of a bf16/f16
   t (kept in w, converted back into t when w completes). */
lt_status lt_comm_work_buffer(lt_work *w, lt_tensor *t, lt_tensor **buf);
int lt_comm_is_half(lt_dtype d);
/* an environment variable as an int (dflt when unset or empty) */
int lt_comm_env_int(const char *name, int dflt);

/* comm/agree.c: whether the agreement check is on (LUTRA_COMM_CHECK, default 1). */
int lt_comm_check_enabled(void);

/* comm/watchdog.c: polls a request to completion under the watchdog. poll
   returns nonzero when the test itself failed, else sets *done. Past the
   timeout (LUTRA_COMM_TIMEOUT, lt_comm_set_timeout) it reports what this rank
   waits for and the ranks that never came, and aborts the job; while it
   waits it answers other ranks' watchdogs (c->impl->serve_queries). peer >= 0:
   a send or recv with that rank. */
typedef int (*lt_comm_poll)(void *req, int *done);
lt_status lt_comm_watch(lt_comm_poll poll, void *req, const char *op, const lt_comm *c, uint64_t seq, int64_t numel,
                        const lt_comm_site *site, int peer);
extern lt_comm_wait_info lt_comm_waiting;

#endif
