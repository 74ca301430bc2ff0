/*
 * status.h: recording failures for lt_last_error() and asserting internal
 * invariants. Relies on lutra.h for lt_status.
 */
#ifndef LUTRA_STATUS_H
#define LUTRA_STATUS_H

#include "lutra.h"

#include <stdio.h>
#include <stdlib.h>

/* Formats the message of a failure on this thread and returns st. */
lt_status lt_fail(lt_status st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Prepends "prefix: " to the current message (keeps the status). */
lt_status lt_fail_prefix(lt_status st, const char *prefix);

/* Set by the SIGINT handler; ops check it on entry (not while deferred). */
extern volatile int lt_interrupt_pending;
lt_status lt_check_interrupt(const char *op);

/* LT_OP_SCOPE("name") first in a public op's body marks it as running on this
   thread (lt_op_running()) until the function returns, by any return (GCC's
   cleanup attribute); an op called inside another keeps the outer one's name.
   Not for functions that call back into Lua (backward): a Lua loop there
   would be taken for the op. */
const char *lt_op_scope_begin_(const char *name);
void lt_op_scope_end_(const char **outer);
#define LT_OP_SCOPE(name) \
  __attribute__((cleanup(lt_op_scope_end_), unused)) const char *lt_op_outer_ = lt_op_scope_begin_(name)

/* Broken internal invariant: print where and stop. Not for user errors. */
#define LT_ASSERT(cond, msg)                                                         \
  do {                                                                              \
    if (!(cond)) {                                                                  \
      fprintf(stderr, "lutra: internal error at %s:%d: %s (%s)\n", __FILE__, __LINE__, \
              msg, #cond);                                                          \
      abort();                                                                      \
    }                                                                               \
  } while (0)

#define LT_TRY(expr)                 \
  do {                               \
    lt_status lt_try_st_ = (expr);   \
    if (lt_try_st_ != LT_OK)         \
      return lt_try_st_;             \
  } while (0)

#endif
