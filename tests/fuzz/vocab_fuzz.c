/*
 * vocab_fuzz.c: a libFuzzer harness for the vocabulary parsers. The first
 * byte picks the format (tiktoken lines, or encoder.json and vocab.bpe split
 * at the first NUL); a vocabulary that loads is then used to encode and
 * decode a little text, to reach the tables it built.
 */
#include "lutra.h"

#include <stddef.h>
#include <stdint.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1)
    return 0;
  lt_tokenizer *t = NULL;
  const char *text = (const char *)data + 1;
  size_t len = size - 1;
  if (data[0] & 1) {
    if (lt_tokenizer_parse_tiktoken(text, len, "fuzz", &t) != LT_OK)
      return 0;
  } else {
    const char *nul = memchr(text, 0, len);
    size_t jl = nul ? (size_t)(nul - text) : len;
    const char *bpe = nul ? nul + 1 : NULL;
    size_t bl = nul ? len - jl - 1 : 0;
    if (lt_tokenizer_parse_gpt2(text, jl, bpe, bl, "fuzz", &t) != LT_OK)
      return 0;
  }
  static const char sample[] = "Hello world, it's 2024! \xF0\x9F\x98\x80  \n";
  int32_t *ids;
  int64_t n;
  if (lt_tokenizer_encode(t, sample, sizeof sample - 1, 1, 1, &ids, &n) == LT_OK) {
    char *back;
    size_t bl2;
    if (lt_tokenizer_decode(t, ids, n, &back, &bl2) == LT_OK)
      lt_free(back);
    lt_free(ids);
  }
  lt_tokenizer_free(t);
  return 0;
}
