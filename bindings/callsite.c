/*
 * callsite.c: "lutra.core".set_call_site, the call site a collective checks
 * against the other ranks' and reports (host/comm/comm.c's lt_comm_set_site): the
 * first Lua frame from a given level outwards as "file:line", and a few
 * frames beyond it as context ("file:line < file:line"). A classic C
 * function, not an FFI call: calling it leaves a compiled trace first, so
 * the frames it reads are current; it walks them with lua_getstack and
 * lua_getinfo and formats without snprintf, allocating nothing (about
 * 0.3 us for 4 frames, where debug.getinfo and string concatenation in Lua
 * took about 2.9 us and snprintf about 1.5).
 */
#include "../host/lutra.h"
#include "bindings.h"

#include <lauxlib.h>
#include <string.h>

/* appends s to buf (cap bytes, NUL-terminated at *at); 0 when it did not fit (buf keeps what did) */
static int append(char *buf, size_t cap, size_t *at, const char *s) {
  size_t n = strlen(s);
  if (*at + n + 1 > cap)
    return 0;
  memcpy(buf + *at, s, n + 1);
  *at += n;
  return 1;
}

/* appends "src:line" (without snprintf, which cost most of a call) */
static int append_frame(char *buf, size_t cap, size_t *at, const char *src, int line) {
  char num[16];
  int k = (int)sizeof num;
  num[--k] = 0;
  do {
    num[--k] = (char)('0' + line % 10);
    line /= 10;
  } while (line > 0 && k > 1);
  num[--k] = ':';
  return append(buf, cap, at, src) && append(buf, cap, at, num + k);
}

/* set_call_site(level, frames): sets the site of the next collective to the
   first Lua frame from level outwards (lua_getstack's levels: 0 is
   set_call_site itself, 1 its caller), with up to frames - 1 further frames
   as context for messages; frames without a line (C functions) are
   skipped. */
static int set_call_site(lua_State *L) {
  int level = (int)luaL_checkinteger(L, 1), frames = (int)luaL_checkinteger(L, 2);
  char site[256], context[768];
  size_t at_site = 0, at = 0;
  int found = 0;
  lua_Debug ar;
  site[0] = context[0] = 0;
  for (int k = level; found < frames && lua_getstack(L, k, &ar); k++) {
    if (!lua_getinfo(L, "Sl", &ar) || ar.currentline < 0)
      continue;
    if (found++ == 0) {
      append_frame(site, sizeof site, &at_site, ar.short_src, ar.currentline);
      continue;
    }
    size_t before = at;
    if (!((at == 0 || append(context, sizeof context, &at, " < ")) &&
          append_frame(context, sizeof context, &at, ar.short_src, ar.currentline))) {
      context[before] = 0;
      break;
    }
  }
  lt_comm_set_site(site, context);
  return 0;
}

void lt_callsite_register(lua_State *L) {
  lua_pushcfunction(L, set_call_site);
  lua_setfield(L, -2, "set_call_site");
}
