/*
 * shard_fuzz.c: a libFuzzer harness for the token-shard header check
 * (lt_shard_parse_header): any input is taken as a whole shard file; when
 * the check passes, every token it promises is read, so AddressSanitizer
 * catches a header that lets a reader past the end.
 */
#include "lutra.h"

#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  int64_t n;
  int tb;
  if (lt_shard_parse_header(data, size, "fuzz", &n, &tb) != LT_OK)
    return 0;
  volatile uint32_t sum = 0;
  for (int64_t i = 0; i < n * tb; i++)
    sum += data[1024 + i];
  return 0;
}
