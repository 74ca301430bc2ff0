/*
 * json.c: JSON decode and encode for Lua through cJSON (RFC 8259). Objects
 * become tables with string keys, arrays 1-based sequences, null becomes
 * core.json_null (a unique light userdata) so arrays keep their length.
 * Encoding: a table whose keys are exactly 1..n is an array, a table of
 * string keys an object (keys sorted, so output is deterministic), an empty
 * table "{}"; NaN, infinities, cycles and other key types are errors.
 */
#include "bindings.h"

#include <cJSON.h>
#include <lauxlib.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define JSON_NULL ((void *)0)
enum { MAX_DEPTH = 200 };

/* Checks what push_value cannot report without leaking the tree: nesting
   depth and numbers beyond the range of a double. Returns a message or NULL. */
static const char *validate(const cJSON *v, int depth) {
  if (depth > MAX_DEPTH)
    return "nesting deeper than 200 levels";
  if (cJSON_IsNumber(v) && !isfinite(v->valuedouble))
    return "a number beyond the range of a double";
  for (const cJSON *c = v->child; c; c = c->next) {
    const char *err = validate(c, depth + 1);
    if (err)
      return err;
  }
  return NULL;
}

static void push_value(lua_State *L, const cJSON *v, int depth) {
  luaL_checkstack(L, 4, "json.decode");
  if (cJSON_IsNull(v)) {
    lua_pushlightuserdata(L, JSON_NULL);
  } else if (cJSON_IsFalse(v)) {
    lua_pushboolean(L, 0);
  } else if (cJSON_IsTrue(v)) {
    lua_pushboolean(L, 1);
  } else if (cJSON_IsNumber(v)) {
    lua_pushnumber(L, v->valuedouble);
  } else if (cJSON_IsString(v)) {
    lua_pushstring(L, v->valuestring);
  } else if (cJSON_IsArray(v)) {
    lua_newtable(L);
    int i = 1;
    for (const cJSON *c = v->child; c; c = c->next) {
      push_value(L, c, depth + 1);
      lua_rawseti(L, -2, i++);
    }
  } else if (cJSON_IsObject(v)) {
    lua_newtable(L);
    for (const cJSON *c = v->child; c; c = c->next) {
      push_value(L, c, depth + 1);
      lua_setfield(L, -2, c->string);
    }
  } else {
    lua_pushnil(L);
  }
}

/* Whether text holds the escape \u0000 (a NUL inside a string), which
   cJSON's C strings would silently cut short. */
static int has_escaped_nul(const char *text, size_t len) {
  for (size_t i = 0; i + 6 <= len; i++) {
    if (text[i] != '\\')
      continue;
    if (memcmp(text + i + 1, "u0000", 5) == 0)
      return 1;
    i++; /* skip the escaped character, so "\\u0000" is not a NUL */
  }
  return 0;
}

/* json.decode(text) -> value; raises "json.decode: invalid JSON at byte N". */
static int json_decode(lua_State *L) {
  size_t len;
  if (lua_type(L, 1) != LUA_TSTRING)
    return luaL_error(L, "json.decode: expected a string, got %s", luaL_typename(L, 1));
  const char *text = lua_tolstring(L, 1, &len);
  if (has_escaped_nul(text, len))
    return luaL_error(L, "json.decode: a string holds \\u0000 (NUL), which is not supported");
  const char *end = NULL;
  cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, 0);
  if (!root) {
    size_t at = end ? (size_t)(end - text) : 0;
    const char *err = cJSON_GetErrorPtr();
    if (err && err >= text && err <= text + len)
      at = (size_t)(err - text);
    return luaL_error(L, "json.decode: invalid JSON at byte %d of %d (or nested deeper than %d)",
                      (int)at + 1, (int)len, CJSON_NESTING_LIMIT);
  }
  /* trailing text after the value is an error too */
  const char *p = end;
  while (p && p < text + len && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t'))
    p++;
  if (p && p < text + len) {
    cJSON_Delete(root);
    return luaL_error(L, "json.decode: unexpected text after the value at byte %d", (int)(p - text) + 1);
  }
  const char *bad = validate(root, 0);
  if (bad) {
    cJSON_Delete(root);
    return luaL_error(L, "json.decode: %s", bad);
  }
  push_value(L, root, 0);
  cJSON_Delete(root);
  return 1;
}

static int cmp_keys(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Builds the cJSON value of the Lua value at idx; NULL with *err set on failure. */
static cJSON *to_json(lua_State *L, int idx, int depth, const char **err) {
  if (depth > MAX_DEPTH) {
    *err = "nesting too deep (a cycle?)";
    return NULL;
  }
  switch (lua_type(L, idx)) {
  case LUA_TNIL:
    return cJSON_CreateNull();
  case LUA_TLIGHTUSERDATA:
    if (lua_touserdata(L, idx) == JSON_NULL)
      return cJSON_CreateNull();
    break;
  case LUA_TBOOLEAN:
    return cJSON_CreateBool(lua_toboolean(L, idx));
  case LUA_TNUMBER: {
    double x = lua_tonumber(L, idx);
    if (!isfinite(x)) {
      *err = "NaN and infinities have no JSON form";
      return NULL;
    }
    /* the shortest of %.15g..%.17g that reads back as exactly x (cJSON's own
       printer accepts a relative error of one epsilon, which loses the last
       bits of checkpointed values) */
    char buf[40];
    for (int prec = 15; prec <= 17; prec++) {
      snprintf(buf, sizeof buf, "%.*g", prec, x);
      if (strtod(buf, NULL) == x)
        break;
    }
    return cJSON_CreateRaw(buf);
  }
  case LUA_TSTRING: {
    size_t len;
    const char *str = lua_tolstring(L, idx, &len);
    if (strlen(str) != len) {
      *err = "a string holds a NUL byte";
      return NULL;
    }
    return cJSON_CreateString(str);
  }
  case LUA_TTABLE: {
    if (idx < 0)
      idx = lua_gettop(L) + idx + 1;
    luaL_checkstack(L, 4, "json.encode");
    size_t n = lua_objlen(L, idx), count = 0, nstr = 0;
    lua_pushnil(L);
    while (lua_next(L, idx)) {
      count++;
      if (lua_type(L, -2) == LUA_TSTRING)
        nstr++;
      lua_pop(L, 1);
    }
    if (count > 0 && count == n) { /* keys 1..n: an array */
      cJSON *arr = cJSON_CreateArray();
      for (size_t i = 1; i <= n; i++) {
        lua_rawgeti(L, idx, (int)i);
        cJSON *item = to_json(L, -1, depth + 1, err);
        lua_pop(L, 1);
        if (!item) {
          cJSON_Delete(arr);
          return NULL;
        }
        cJSON_AddItemToArray(arr, item);
      }
      return arr;
    }
    if (nstr != count) {
      *err = "a table that is neither an array (keys 1..n without holes) nor an object (string keys)";
      return NULL;
    }
    const char **keys = malloc(sizeof(char *) * (count ? count : 1));
    size_t k = 0;
    lua_pushnil(L);
    while (lua_next(L, idx)) {
      size_t klen;
      keys[k] = lua_tolstring(L, -2, &klen); /* the table keeps the strings alive */
      if (strlen(keys[k]) != klen) {
        lua_pop(L, 2);
        free(keys);
        *err = "a key holds a NUL byte";
        return NULL;
      }
      k++;
      lua_pop(L, 1);
    }
    qsort(keys, count, sizeof(char *), cmp_keys);
    cJSON *obj = cJSON_CreateObject();
    for (size_t i = 0; i < count; i++) {
      lua_getfield(L, idx, keys[i]);
      cJSON *item = to_json(L, -1, depth + 1, err);
      lua_pop(L, 1);
      if (!item) {
        free(keys);
        cJSON_Delete(obj);
        return NULL;
      }
      cJSON_AddItemToObject(obj, keys[i], item);
    }
    free(keys);
    return obj;
  }
  default:
    break;
  }
  *err = lua_typename(L, lua_type(L, idx));
  return NULL;
}

/* json.encode(value [, pretty]) -> string. */
static int json_encode(lua_State *L) {
  luaL_checkany(L, 1);
  int pretty = lua_toboolean(L, 2);
  lua_settop(L, 1);
  const char *err = NULL;
  cJSON *root = to_json(L, 1, 0, &err);
  if (!root)
    return luaL_error(L, "json.encode: cannot encode: %s", err ? err : "unknown value");
  char *s = pretty ? cJSON_Print(root) : cJSON_PrintUnformatted(root);
  cJSON_Delete(root);
  if (!s)
    return luaL_error(L, "json.encode: out of memory");
  lua_pushstring(L, s);
  cJSON_free(s);
  return 1;
}

void lt_json_register(lua_State *L) {
  lua_pushcfunction(L, json_decode);
  lua_setfield(L, -2, "json_decode");
  lua_pushcfunction(L, json_encode);
  lua_setfield(L, -2, "json_encode");
  lua_pushlightuserdata(L, JSON_NULL);
  lua_setfield(L, -2, "json_null");
}
