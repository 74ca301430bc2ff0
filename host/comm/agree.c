/*
 * comm/agree.c: the agreement exchange that runs before every collective on
 * a group of several ranks (an implementation with agrees set): every rank
 * gives (op, dtype, element count, root, the group's call number, the call
 * site Lua set with lt_comm_set_site), so a rank that passes another size or
 * dtype, or calls the collective from another place (an extra call on some
 * ranks pairs with the others' next one), gets an error naming the ranks,
 * sizes and call sites on every rank, not a hang or garbage
 * (LUTRA_COMM_CHECK=0 skips it, except where it carries data: all_gather's
 * rows, new_group). The bytes travel by the implementation's gather_bytes,
 * under the watchdog.
 */
#include "comm/agree.h"
#include "base/status.h"

#include <stdio.h>
#include <stdlib.h>

int lt_comm_check_enabled(void) {
  static int on = -1;
  if (on < 0)
    on = lt_comm_env_int("LUTRA_COMM_CHECK", 1);
  return on;
}

/* the collective an agreement op code stands for (codes >= 16 carry the reduction in the low 4 bits) */
static const char *op_name(int64_t opcode) {
  switch (opcode >= 16 && opcode != LT_AGREE_REFUSED ? opcode / 16 : opcode) {
  case LT_AGREE_ALL_REDUCE: return "all_reduce";
  case LT_AGREE_BROADCAST: return "broadcast";
  case LT_AGREE_ALL_GATHER: return "all_gather";
  case LT_AGREE_REDUCE_SCATTER: return "reduce_scatter";
  case LT_AGREE_BARRIER: return "barrier";
  case LT_AGREE_SPLIT: return "new_group";
  default: return "another collective";
  }
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
static lt_status exchange(lt_comm *c, uint64_t seq, const char *op, const agreement *mine, const lt_comm_site *site,
                          int64_t count, agreement **all, lt_comm_site **sites) {
  *all = malloc(sizeof(agreement) * (size_t)c->size);
  *sites = malloc(sizeof(lt_comm_site) * (size_t)c->size); /* before the exchange: no rank can fail after it */
  lt_status st = LT_OK;
  if (!*all || !*sites)
    st = lt_fail(LT_ERR_OOM, "%s: out of memory", op);
  else
    st = c->impl->gather_bytes(c, mine, (int)sizeof *mine, *all, op, "exchanging sizes", seq, count, site);
  if (st == LT_OK && need_sites(*all, c->size)) {
    st = c->impl->gather_bytes(c, site, (int)sizeof *site, *sites, op, "exchanging call sites", seq, count, site);
    for (int r = 0; st == LT_OK && r < c->size; r++)
      (*sites)[r].text[LT_COMM_SITE_TEXT - 1] = 0;
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
static void sites_by_rank(const lt_comm_site *sites, int n, char *buf, size_t cap) {
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
      at += (size_t)snprintf(buf + at, cap - at, " at %s", lt_comm_site_name(&sites[r]));
  }
}

lt_status lt_comm_agree(lt_comm *c, uint64_t seq, const char *op, int opcode, lt_dtype dt, int64_t count, int root,
                        int counts_may_differ, int64_t *all_counts, const lt_comm_site *site) {
  static const lt_comm_site none = {0, ""};
  if (!site)
    site = &none;
  agreement mine = {opcode, dt, count, root, (int64_t)seq, site->hash}, *all;
  lt_comm_site *sites;
  c->last_site = *site;
  lt_status st = exchange(c, seq, op, &mine, site, count, &all, &sites);
  if (st != LT_OK)
    return st;
  const char *here = lt_comm_site_name(site);
  for (int r = 0; r < c->size && st == LT_OK; r++) {
    agreement *o = all + r;
    if (o->opcode == LT_AGREE_REFUSED)
      st = lt_fail(LT_ERR_ARG, "%s (group %d, call %llu) at %s: rank %d of the group refused its arguments to this "
                   "call (its own error says why)", op, c->id, (unsigned long long)seq, here, r);
    else if (o->opcode != opcode && o->opcode / 16 == opcode / 16 && opcode >= 16)
      st = lt_fail(LT_ERR_ARG, "%s (group %d, call %llu) at %s: rank %d of the group passes another reduction op",
                   op, c->id, (unsigned long long)seq, here, r);
    else if (o->opcode != opcode)
      st = lt_fail(LT_ERR_ARG, "%s (group %d, call %llu) at %s: rank %d of the group called %s instead, at %s", op,
                   c->id, (unsigned long long)seq, here, r, op_name(o->opcode),
                   lt_comm_site_name(sites ? &sites[r] : NULL));
    else if (o->dtype != dt)
      st = lt_fail(LT_ERR_DTYPE, "%s (group %d): rank %d passes %s, rank %d passes %s", op, c->id, r,
                   lt_dtype_name((lt_dtype)o->dtype), c->rank, lt_dtype_name(dt));
    else if (!counts_may_differ && o->count != count)
      st = lt_fail(LT_ERR_SHAPE, "%s (group %d): rank %d passes %lld elements, rank %d passes %lld", op, c->id, r,
                   (long long)o->count, c->rank, (long long)count);
    else if (o->root != root && (opcode == LT_AGREE_ALL_GATHER || opcode / 16 == LT_AGREE_REDUCE_SCATTER))
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

lt_status lt_comm_announce_refusal(lt_comm *c) {
  lt_comm_site site = lt_comm_take_site();
  agreement mine = {LT_AGREE_REFUSED, 0, 0, 0, (int64_t)c->seq, site.hash}, *all;
  lt_comm_site *sites;
  lt_status st = exchange(c, c->seq++, "a refused collective", &mine, &site, 0, &all, &sites);
  if (st == LT_OK) {
    free(all);
    free(sites);
  }
  return st;
}
