/*
 * backend/index-report.c: the message of a failed index check
 * (backend/index-report.h), the same whether the check finished at once (the
 * host's index ops and cross-entropy) or later (a backend's deferred check).
 */
#include "backend/index-report.h"
#include "base/status.h"

lt_status lt_index_report_fail(const lt_index_report *r, int64_t pos, int64_t v) {
  if (r->kind == LT_REPORT_TARGET)
    return lt_fail(LT_ERR_ARG,
                   "%s: target %lld at position %lld (1-based) is outside the vocabulary [0, %lld) and is not the "
                   "ignore index %lld", r->op, (long long)v, (long long)pos + 1, (long long)r->limit,
                   (long long)r->ignore);
  return lt_fail(LT_ERR_ARG,
                 "%s: index %lld (%s %lld of the %s, 1-based) is out of range [0, %lld) for "
                 "dim %d of shape %s (indices are 0-based)", r->op, (long long)v,
                 r->kind == LT_REPORT_IDS ? "position" : "element", (long long)pos + 1,
                 r->kind == LT_REPORT_IDS ? "ids" : "index", (long long)r->limit, r->dim + 1, r->shape);
}
