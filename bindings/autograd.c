/*
 * bindings/autograd.c: backward as a classic lua_CFunction, so the engine
 * (host/autograd/engine.c's lt_autograd_backward) may call back into Lua:
 * gradient-ready hooks on leaves and the backward of custom Lua functions
 * (LuaJIT forbids re-entering the VM from a function called through the
 * FFI, and allows it from a lua_CFunction).
 *
 * Tensors cross as addresses (Lua numbers; x86-64 addresses fit a double);
 * the Lua side (lua/lutra/autograd.lua) turns them into owned cdata. The two
 * Lua handlers are registered once with core.set_autograd_handlers.
 */
#include "../host/lutra.h"
#include "bindings.h"

#include <lauxlib.h>
#include <stdint.h>

static const char *HANDLERS = "lutra.autograd.handlers";

static lt_tensor *to_tensor(lua_State *L, int idx) {
  return (lt_tensor *)(uintptr_t)luaL_checknumber(L, idx);
}

typedef struct {
  lua_State *L;
} hook_ctx;

/* Calls handlers[which] with the values pushed after it; copies a Lua error
   into lt_last_error. */
static lt_status call_handler(lua_State *L, int nargs, int nres) {
  if (lua_pcall(L, nargs, nres, 0) != 0) {
    const char *msg = lua_tostring(L, -1);
    lt_status st = lt_set_last_error(LT_ERR_ARG, msg ? msg : "(error in a backward hook)");
    lua_pop(L, 1);
    return st;
  }
  return LT_OK;
}

static lt_status leaf_ready(void *ctx, int64_t hook_id, lt_tensor *grad) {
  lua_State *L = ((hook_ctx *)ctx)->L;
  lua_getfield(L, LUA_REGISTRYINDEX, HANDLERS);
  lua_rawgeti(L, -1, 1);
  lua_remove(L, -2);
  lua_pushnumber(L, (double)hook_id);
  lua_pushnumber(L, (double)(uintptr_t)grad);
  return call_handler(L, 2, 0);
}

static lt_status custom(void *ctx, int64_t id, int nout, lt_tensor *const *gout, int nin, lt_tensor **gin) {
  lua_State *L = ((hook_ctx *)ctx)->L;
  int top = lua_gettop(L);
  lua_getfield(L, LUA_REGISTRYINDEX, HANDLERS);
  lua_rawgeti(L, -1, 2);
  lua_remove(L, -2);
  lua_pushnumber(L, (double)id);
  lua_pushinteger(L, nin);
  for (int k = 0; k < nout; k++)
    lua_pushnumber(L, (double)(uintptr_t)gout[k]); /* 0 for an output without a gradient */
  lt_status st = call_handler(L, 2 + nout, nin);
  if (st != LT_OK)
    return st;
  /* the handler returns nin addresses of retained tensors, or 0 for none */
  for (int k = 0; k < nin; k++)
    gin[k] = (lt_tensor *)(uintptr_t)lua_tonumber(L, top + 1 + k);
  lua_settop(L, top);
  return LT_OK;
}

/* core.backward(root, grad or 0, retain_graph) */
static int l_backward(lua_State *L) {
  lt_tensor *root = to_tensor(L, 1);
  lt_tensor *grad = lua_isnoneornil(L, 2) ? NULL : to_tensor(L, 2);
  int retain = lua_toboolean(L, 3);
  hook_ctx ctx = {L};
  lt_backward_hooks hooks = {leaf_ready, custom, &ctx};
  if (lt_autograd_backward(root, grad, retain, &hooks) != LT_OK)
    return luaL_error(L, "%s", lt_last_error());
  return 0;
}

/* core.set_autograd_handlers(leaf_ready(hook_id, grad), custom(id, nin, grads...)) */
static int l_set_handlers(lua_State *L) {
  luaL_checktype(L, 1, LUA_TFUNCTION);
  luaL_checktype(L, 2, LUA_TFUNCTION);
  lua_createtable(L, 2, 0);
  lua_pushvalue(L, 1);
  lua_rawseti(L, -2, 1);
  lua_pushvalue(L, 2);
  lua_rawseti(L, -2, 2);
  lua_setfield(L, LUA_REGISTRYINDEX, HANDLERS);
  return 0;
}

void lt_autograd_register(lua_State *L) {
  lua_pushcfunction(L, l_backward);
  lua_setfield(L, -2, "backward");
  lua_pushcfunction(L, l_set_handlers);
  lua_setfield(L, -2, "set_autograd_handlers");
}
