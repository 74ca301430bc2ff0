/*
 * backend/index-report.h: an index check that a backend finishes later. An
 * index kernel that sets *bad to LT_BAD_LATER has not looked at its verdict
 * yet (the CUDA backend copies it to the host in stream order); the host
 * hands the backend what the message needs (lt_index_report), and the
 * backend reports it at its next synchronisation (lt_index_report_fail),
 * then lets go of the index (the report's release). Part of the backends'
 * interface: a backend needs nothing of tensors to finish a check.
 */
#ifndef LUTRA_BACKEND_INDEX_REPORT_H
#define LUTRA_BACKEND_INDEX_REPORT_H

#include "lutra.h"

enum { LT_BAD_LATER = -2 };
typedef enum { LT_REPORT_INDEX, LT_REPORT_IDS, LT_REPORT_TARGET } lt_report_kind; /* (IDS: an embedding's) */
typedef struct lt_index_report {
  lt_report_kind kind;
  const char *op; /* a string literal */
  int dim;        /* 0-based (LT_REPORT_INDEX) */
  int64_t limit;  /* the indexed dim's size, or the vocabulary */
  int64_t ignore; /* the ignored target (LT_REPORT_TARGET) */
  char shape[200]; /* lt_tensor_shape_str's size */
  lt_tensor *index; /* retained: 1-D, its element at the kernel's position is the bad one */
  /* lets go of index once the check is resolved (the host's lt_tensor_release,
     set where the report is handed over; the backend calls it) */
  void (*release)(lt_tensor *index);
} lt_index_report;

/* The error for report r whose first bad element is position pos (0-based)
   with value v: LT_ERR_ARG, the message naming r's op, the value, its
   1-based position and the valid range (for a target, the vocabulary and
   the ignore index; otherwise the dim and the indexed tensor's shape). */
lt_status lt_index_report_fail(const lt_index_report *r, int64_t pos, int64_t v);

#endif
