/*
 * callsite.c: "lutra.core".set_call_site, the call site a collective reports
 * and checks against the other ranks' (host/comm.c's lt_comm_set_site):
 * the Lua frames from a given level outwards as "file:line < file:line <
 * ...". A classic C function, not an FFI call: calling it leaves a compiled
 * trace first, so the frames it reads are current; and it walks them with
 * lua_getstack and lua_getinfo, allocating nothing (about 0.1 us a frame,
 * where debug.getinfo took about 0.7).
 */
#include "../host/lutra.h"
#include "bindings.h"

#include <lauxlib.h>
#include <stdio.h>

/* set_call_site(level, frames): sets the site of the next collective to the
   first Lua frame from level outwards (lua_getstack's levels: 0 is
   set_call_site itself, 1 its caller), with up to frames - 1 further frames
   as context for messages; frames without a line (C functions) are
   skipped. */
static int set_call_site(lua_State *L) {
  int level = (int)luaL_checkinteger(L, 1), frames = (int)luaL_checkinteger(L, 2);
  char site[256], context[768];
  size_t at = 0;
  int found = 0;
  lua_Debug ar;
  site[0] = context[0] = 0;
  for (int k = level; found < frames && lua_getstack(L, k, &ar); k++) {
    if (!lua_getinfo(L, "Sl", &ar) || ar.currentline < 0)
      continue;
    if (found++ == 0) {
      snprintf(site, sizeof site, "%s:%d", ar.short_src, ar.currentline);
      continue;
    }
    int n = snprintf(context + at, sizeof context - at, "%s%s:%d", at ? " < " : "", ar.short_src, ar.currentline);
    if (n < 0 || (size_t)n >= sizeof context - at) {
      context[at] = 0;
      break;
    }
    at += (size_t)n;
  }
  lt_comm_set_site(site, context);
  return 0;
}

void lt_callsite_register(lua_State *L) {
  lua_pushcfunction(L, set_call_site);
  lua_setfield(L, -2, "set_call_site");
}
