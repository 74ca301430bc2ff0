/*
 * preload.c: registers the Lua library compiled into the binary
 * (tools/embed.c) in package.preload, with chunk names such as
 * "@lua/lutra/init.lua" so tracebacks point at real files. When LUTRA_PATH
 * names a source tree, its lua/ folder goes first on package.path instead
 * and nothing is preloaded, so edits take effect without a rebuild.
 *
 * Also provides the native module "lutra.core": the ffi.cdef text generated
 * from host/lutra.h, build facts, the JSON helpers, autograd's handlers and
 * set_call_site (bindings/callsite.c).
 */
#include "bindings.h"

#include <lauxlib.h>
#include <luajit.h>
#include <stdlib.h>
#include <string.h>

extern const char *const lt_ffi_cdef;
extern const struct {
  const char *name, *chunkname;
  const unsigned char *data;
  size_t len;
} lt_embedded_modules[];

static int load_embedded(lua_State *L) {
  int i = (int)lua_tointeger(L, lua_upvalueindex(1));
  if (luaL_loadbuffer(L, (const char *)lt_embedded_modules[i].data, lt_embedded_modules[i].len,
                      lt_embedded_modules[i].chunkname) != 0)
    return lua_error(L);
  lua_pushstring(L, lt_embedded_modules[i].name);
  lua_call(L, 1, 1);
  return 1;
}

static int open_core(lua_State *L) {
  lua_newtable(L);
  lua_pushstring(L, lt_ffi_cdef);
  lua_setfield(L, -2, "cdef");
  lua_pushstring(L, LUAJIT_VERSION);
  lua_setfield(L, -2, "luajit_version");
  const char *src = getenv("LUTRA_PATH");
  lua_pushboolean(L, src && *src);
  lua_setfield(L, -2, "from_source");
  lt_json_register(L);
  lt_autograd_register(L);
  lt_callsite_register(L);
  return 1;
}

int lt_bindings_open(lua_State *L) {
  lua_getglobal(L, "package");
  lua_getfield(L, -1, "preload");
  lua_pushcfunction(L, open_core);
  lua_setfield(L, -2, "lutra.core");
  const char *src = getenv("LUTRA_PATH");
  if (src && *src) {
    lua_getfield(L, -2, "path");
    lua_pushfstring(L, "%s/lua/?.lua;%s/lua/?/init.lua;%s", src, src, lua_tostring(L, -1));
    lua_setfield(L, -4, "path");
    lua_pop(L, 1);
  } else {
    for (int i = 0; lt_embedded_modules[i].name; i++) {
      lua_pushinteger(L, i);
      lua_pushcclosure(L, load_embedded, 1);
      lua_setfield(L, -2, lt_embedded_modules[i].name);
    }
  }
  lua_pop(L, 2);
  return 0;
}
