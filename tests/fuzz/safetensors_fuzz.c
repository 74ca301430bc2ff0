/*
 * safetensors_fuzz.c: a libFuzzer harness for the safetensors reader. Every
 * input is parsed from memory; when it validates, each tensor is read out.
 * AddressSanitizer turns any read outside the input into a crash.
 *
 *   make fuzz                       (builds build-fuzz/safetensors_fuzz)
 *   build-fuzz/safetensors_fuzz -max_total_time=60 tests/fuzz/corpus
 */
#include "lutra.h"

#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  lt_safetensors *f;
  if (lt_safetensors_open_memory(data, size, "fuzz", &f) != LT_OK)
    return 0;
  for (int64_t i = 0; i < lt_safetensors_count(f); i++) {
    lt_tensor *t;
    if (lt_safetensors_get(f, lt_safetensors_name(f, i), &t) == LT_OK)
      lt_tensor_release(t);
  }
  (void)lt_safetensors_metadata(f);
  lt_safetensors_close(f);
  return 0;
}
