/*
 * comm/watchdog.c: the collectives' watchdog. Waiting polls the request; a
 * call still incomplete after the timeout (LUTRA_COMM_TIMEOUT seconds,
 * default 600, or lt_comm_set_timeout) asks the group's other ranks what
 * they wait in (they answer while they wait in one themselves), prints rank,
 * op, group, call number, size, call site and the ranks that never arrived
 * (what each waits in, or that it did not answer), and aborts the job. The
 * asking and answering travel by the group's implementation (serve_queries,
 * ask_peers in comm/comm-impl.h); the timing, the record of what this rank
 * waits in and the report are here.
 */
#include "comm/comm-impl.h"
#include "base/status.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

lt_comm_wait_info lt_comm_waiting;
static double timeout_s = -1;

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

/* The watchdog's report: asks the group's other ranks what they wait in
   (for up to a second, answering their questions meanwhile), prints the
   call, its site and the ranks that never arrived, and aborts the job. */
static void watchdog_abort(const char *op, const lt_comm *c, uint64_t seq, int64_t numel, const lt_comm_site *site,
                           double limit, int peer) {
  int n = c->size;
  int *wr = calloc((size_t)n, sizeof(int)), *got = calloc((size_t)n, sizeof(int));
  lt_comm_wait_info *ans = calloc((size_t)n, sizeof *ans);
  char who[3072] = "";
  size_t at = 0;
  int missing = 0;
  if (wr && got && ans && c->impl->ask_peers) {
    c->impl->ask_peers(c, peer, ans, got, wr);
    for (int r = 0; r < n && at < sizeof who - 256; r++) {
      if (r == c->rank || (peer >= 0 && r != peer))
        continue;
      lt_comm_wait_info *a = &ans[r];
      int here = peer < 0 && got[r] && a->active && !a->p2p && a->group == c->id && (uint64_t)a->seq == seq;
      if (here)
        continue;
      missing++;
      a->op[sizeof a->op - 1] = a->site[sizeof a->site - 1] = 0;
      if (got[r] && a->active)
        at += (size_t)snprintf(who + at, sizeof who - at, "%srank %d (waits in %s, group %lld %s %llu, at %s)",
                               missing > 1 ? "; " : "", wr[r], a->op, (long long)a->group,
                               a->p2p ? "send/recv" : "call", (unsigned long long)a->seq,
                               a->site[0] ? a->site : "(no Lua call site)");
      else
        at += (size_t)snprintf(who + at, sizeof who - at,
                               "%srank %d (no answer in 1 s: busy outside a collective, finished, or gone)",
                               missing > 1 ? "; " : "", wr[r]);
    }
  }
  fprintf(stderr,
          "[rank %d] lutra: watchdog: %s (group %d of %d ranks, call %llu, %lld elements) not complete after %.0f s "
          "at %s: %s%s; aborting the job\n",
          lt_dist_rank(), op, c->id, c->size, (unsigned long long)seq, (long long)numel, limit,
          lt_comm_site_name(site), missing ? "never arrived: " : "every rank of the group is in it", who);
  fflush(stderr);
  lt_dist_abort(3);
}

lt_status lt_comm_watch(lt_comm_poll poll, void *req, const char *op, const lt_comm *c, uint64_t seq, int64_t numel,
                        const lt_comm_site *site, int peer) {
  double start = now_s(), limit = comm_timeout();
  int flag = 0;
  long spins = 0;
  while (!flag) {
    if (poll(req, &flag) != 0) {
      lt_comm_waiting.active = 0;
      return lt_fail(LT_ERR_IO, "%s (group %d, call %llu) failed on rank %d", op, c->id, (unsigned long long)seq,
                     lt_dist_rank());
    }
    if (!flag && (++spins & 1023) == 0) {
      if (!lt_comm_waiting.active) { /* what another rank's watchdog is told */
        lt_comm_wait_info *w = &lt_comm_waiting;
        w->active = 1;
        w->group = c->id;
        w->size = c->size;
        w->seq = (int64_t)seq;
        w->p2p = peer >= 0;
        snprintf(w->op, sizeof w->op, "%s", op);
        snprintf(w->site, sizeof w->site, "%s", site && site->hash ? site->text : "");
      }
      if (c->impl->serve_queries)
        c->impl->serve_queries();
      if (now_s() - start > limit)
        watchdog_abort(op, c, seq, numel, site, limit, peer);
      usleep(50);
    }
  }
  lt_comm_waiting.active = 0;
  return LT_OK;
}
