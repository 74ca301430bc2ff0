/*
 * dtype.c: dtype names, sizes, parsing and type promotion; device names.
 * Promotion follows torch.result_type for tensor-tensor operands, except that
 * lutra has no int16, so mixing a signed 8-bit and an unsigned type gives i32.
 */
#include "base/status.h"

#include <stdlib.h>
#include <string.h>

static const char *const dtype_names[LT_DTYPE_COUNT] = {
    "f32", "f64", "bf16", "f16", "i8", "u8", "u16", "i32", "i64", "bool"};
static const int64_t dtype_sizes[LT_DTYPE_COUNT] = {4, 8, 2, 2, 1, 1, 2, 4, 8, 1};

const char *lt_dtype_name(lt_dtype dtype) {
  if ((unsigned)dtype >= LT_DTYPE_COUNT)
    return "?";
  return dtype_names[dtype];
}

int64_t lt_dtype_size(lt_dtype dtype) {
  if ((unsigned)dtype >= LT_DTYPE_COUNT)
    return 0;
  return dtype_sizes[dtype];
}

int lt_dtype_is_float(lt_dtype d) {
  return d == LT_DTYPE_F32 || d == LT_DTYPE_F64 || d == LT_DTYPE_BF16 || d == LT_DTYPE_F16;
}

static const struct {
  const char *alias;
  lt_dtype dtype;
} aliases[] = {
    {"float32", LT_DTYPE_F32}, {"float", LT_DTYPE_F32},   {"float64", LT_DTYPE_F64},
    {"double", LT_DTYPE_F64},  {"bfloat16", LT_DTYPE_BF16}, {"float16", LT_DTYPE_F16},
    {"half", LT_DTYPE_F16},    {"int8", LT_DTYPE_I8},     {"uint8", LT_DTYPE_U8},
    {"uint16", LT_DTYPE_U16},  {"int32", LT_DTYPE_I32},   {"int", LT_DTYPE_I32},
    {"int64", LT_DTYPE_I64},   {"long", LT_DTYPE_I64},
};

lt_status lt_dtype_parse(const char *name, lt_dtype *out) {
  if (!name)
    return lt_fail(LT_ERR_DTYPE, "dtype: expected a name, got nothing");
  for (int i = 0; i < LT_DTYPE_COUNT; i++)
    if (strcmp(name, dtype_names[i]) == 0) {
      *out = (lt_dtype)i;
      return LT_OK;
    }
  for (size_t i = 0; i < sizeof aliases / sizeof aliases[0]; i++)
    if (strcmp(name, aliases[i].alias) == 0) {
      *out = aliases[i].dtype;
      return LT_OK;
    }
  return lt_fail(LT_ERR_DTYPE,
                 "unknown dtype '%s' (expected one of f32, f64, bf16, f16, i8, u8, u16, i32, i64, bool)",
                 name);
}

static int int_bits(lt_dtype d) {
  switch (d) {
  case LT_DTYPE_I8: case LT_DTYPE_U8: return 8;
  case LT_DTYPE_U16: return 16;
  case LT_DTYPE_I32: return 32;
  default: return 64;
  }
}

static int is_unsigned(lt_dtype d) { return d == LT_DTYPE_U8 || d == LT_DTYPE_U16; }

lt_dtype lt_dtype_promote(lt_dtype a, lt_dtype b) {
  if (a == b)
    return a;
  if (a == LT_DTYPE_BOOL)
    return b;
  if (b == LT_DTYPE_BOOL)
    return a;
  int fa = lt_dtype_is_float(a), fb = lt_dtype_is_float(b);
  if (fa && !fb)
    return a;
  if (fb && !fa)
    return b;
  if (fa && fb) {
    if (a == LT_DTYPE_F64 || b == LT_DTYPE_F64)
      return LT_DTYPE_F64;
    return LT_DTYPE_F32; /* f32 with a half type, or bf16 with f16 */
  }
  /* two different integer types */
  if (a == LT_DTYPE_I64 || b == LT_DTYPE_I64)
    return LT_DTYPE_I64;
  if (a == LT_DTYPE_I32 || b == LT_DTYPE_I32)
    return LT_DTYPE_I32;
  if (is_unsigned(a) && is_unsigned(b))
    return int_bits(a) >= int_bits(b) ? a : b; /* u8 with u16 */
  return LT_DTYPE_I32; /* i8 with u8 or u16: no i16 here */
}

lt_status lt_device_parse(const char *name, lt_device *out) {
  if (!name)
    return lt_fail(LT_ERR_DEVICE, "device: expected a name, got nothing");
  if (strcmp(name, "cpu") == 0) {
    *out = LT_DEVICE_CPU;
    return LT_OK;
  }
  if (strcmp(name, "cuda") == 0) {
    *out = LT_DEVICE_CUDA;
    return LT_OK;
  }
  if (strncmp(name, "cuda:", 5) == 0 && name[5]) {
    char *end;
    long idx = strtol(name + 5, &end, 10);
    if (*end == 0 && idx >= 0 && idx < 255) {
      *out = LT_DEVICE_CUDA + (int)idx;
      return LT_OK;
    }
  }
  return lt_fail(LT_ERR_DEVICE, "unknown device '%s' (expected cpu, cuda or cuda:N)", name);
}

const char *lt_device_name(lt_device device, char *buf) {
  if (device == LT_DEVICE_CPU)
    snprintf(buf, 16, "cpu");
  else if (device >= LT_DEVICE_CUDA && device < LT_DEVICE_CUDA + 256)
    snprintf(buf, 16, "cuda:%d", device - LT_DEVICE_CUDA);
  else
    snprintf(buf, 16, "device#%d", (int)device);
  return buf;
}
