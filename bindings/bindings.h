/*
 * bindings.h: what host/app/main.c and host/app/repl.c call to make lutra's Lua side
 * available in a lua_State: the embedded modules in package.preload (or a
 * source tree named by LUTRA_PATH) and the native helpers in "lutra.core".
 */
#ifndef LUTRA_BINDINGS_H
#define LUTRA_BINDINGS_H

#include <lua.h>

/* Registers the modules; returns 0, or raises a Lua error. */
int lt_bindings_open(lua_State *L);

/* The JSON helpers (bindings/json.c): push their functions into the table on top. */
void lt_json_register(lua_State *L);

/* backward and its Lua handlers (bindings/autograd.c), into the table on top. */
void lt_autograd_register(lua_State *L);

/* set_call_site (bindings/callsite.c), the call site of the next collective, into the table on top. */
void lt_callsite_register(lua_State *L);

#endif
