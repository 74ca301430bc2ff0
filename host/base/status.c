/*
 * status.c: the thread-local error message behind lt_last_error(), the
 * interrupt flag (and its deferral), the op running on each thread, and
 * lutra's version.
 */
#include "base/status.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define LT_ERR_MAX 2048

static _Thread_local char err_buf[LT_ERR_MAX];

volatile int lt_interrupt_pending = 0;

const char *lt_last_error(void) { return err_buf; }

const char *lt_version(void) { return "0.1.0"; }

lt_status lt_set_last_error(lt_status st, const char *msg) { return lt_fail(st, "%s", msg); }

lt_status lt_fail(lt_status st, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err_buf, sizeof err_buf, fmt, ap);
  va_end(ap);
  return st;
}

lt_status lt_fail_prefix(lt_status st, const char *prefix) {
  size_t plen = strlen(prefix), mlen = strlen(err_buf);
  if (plen + 2 >= LT_ERR_MAX)
    return st;
  if (plen + 2 + mlen >= LT_ERR_MAX)
    mlen = LT_ERR_MAX - plen - 3;
  memmove(err_buf + plen + 2, err_buf, mlen);
  err_buf[plen + 2 + mlen] = 0;
  memcpy(err_buf, prefix, plen);
  err_buf[plen] = ':';
  err_buf[plen + 1] = ' ';
  return st;
}

void lt_interrupt(void) { lt_interrupt_pending = 1; }
void lt_clear_interrupt(void) { lt_interrupt_pending = 0; }
int lt_is_interrupted(void) { return lt_interrupt_pending; }

static _Thread_local const char *op_running;

const char *lt_op_running(void) { return op_running; }

const char *lt_op_scope_begin_(const char *name) {
  const char *outer = op_running;
  if (!outer)
    op_running = name;
  return outer;
}

void lt_op_scope_end_(const char **outer) {
  if (!*outer)
    op_running = NULL;
}

static volatile int deferred;
static char deferred_what[128];

void lt_interrupt_defer(int on, const char *what) {
  if (on) {
    snprintf(deferred_what, sizeof deferred_what, "%s", what ? what : "");
    deferred = 1;
  } else {
    deferred = 0;
  }
}

const char *lt_interrupt_deferred(void) { return deferred ? deferred_what : NULL; }

lt_status lt_check_interrupt(const char *op) {
  if (!lt_interrupt_pending || deferred)
    return LT_OK;
  lt_interrupt_pending = 0;
  return lt_fail(LT_ERR_INTERRUPTED, "interrupted! (in %s)", op);
}
