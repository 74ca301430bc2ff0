/*
 * tokenizer.c: GPT-2's byte-level BPE (Radford et al. 2019), as tiktoken
 * implements it: text is split into pieces by GPT-2's pre-tokenisation
 * pattern (contractions, letters, numbers, other symbols, whitespace runs),
 * matched by PCRE2 with Unicode properties; each piece's bytes are merged
 * pairwise, always merging the adjacent pair whose concatenation has the
 * lowest rank, until no pair is a token (tiktoken's byte_pair_merge).
 *
 * Vocabularies: the tiktoken format (one "base64-token rank" per line, e.g.
 * gpt2.tiktoken) or GPT-2's original encoder.json (byte-level unicode
 * strings to ids; ranks are the ids) with vocab.bpe (merges, checked for
 * form). <|endoftext|> gets the id after the last rank (50256 for GPT-2).
 * Every vocabulary line and entry is checked; a bad file is an error naming
 * it, the line and the problem.
 *
 * lt_tokenizer_file_sha256 gives a vocabulary file's SHA-256 (libmd's), which
 * lt.tokenizer.load checks as tiktoken checks its encodings' files.
 *
 * Invalid UTF-8 in text is replaced by U+FFFD per maximal invalid subpart
 * (as Python's bytes.decode(errors="replace")), or is an error giving its
 * byte offset, as the caller asks.
 */
#include "base/status.h"

#include <cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <sha2.h> /* libmd */


/* ---- the rank table: token bytes -> rank, open addressing ------------------- */

typedef struct {
  uint32_t off, len; /* bytes in the arena */
  int32_t rank;      /* -1: empty slot */
} slot;

struct lt_tokenizer {
  char *arena;
  size_t arena_len, arena_cap;
  slot *slots;
  uint64_t nslots; /* a power of two */
  uint32_t *rank_off, *rank_len; /* rank -> bytes */
  int64_t nranks;                /* ranks 0 .. nranks-1 */
  int32_t eot;                   /* <|endoftext|> */
  pcre2_code *re;
};

static uint64_t hash_bytes(const unsigned char *p, size_t n) {
  uint64_t h = 1469598103934665603ull; /* FNV-1a */
  for (size_t i = 0; i < n; i++) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  return h;
}

static int32_t lookup(const struct lt_tokenizer *t, const unsigned char *p, size_t n) {
  uint64_t i = hash_bytes(p, n) & (t->nslots - 1);
  for (;;) {
    const slot *s = &t->slots[i];
    if (s->rank < 0)
      return -1;
    if (s->len == n && memcmp(t->arena + s->off, p, n) == 0)
      return s->rank;
    i = (i + 1) & (t->nslots - 1);
  }
}

/* Adds token bytes with a rank; fails on duplicates of bytes or rank. */
static lt_status add_token(struct lt_tokenizer *t, const unsigned char *p, size_t n, int64_t rank,
                           const char *path, int64_t line) {
  if (rank < 0 || rank >= t->nranks)
    return lt_fail(LT_ERR_IO, "vocabulary %s: line %lld: rank %lld is outside 0..%lld", path, (long long)line,
                   (long long)rank, (long long)t->nranks - 1);
  if (t->rank_len[rank] != UINT32_MAX)
    return lt_fail(LT_ERR_IO, "vocabulary %s: line %lld: rank %lld is given twice", path, (long long)line,
                   (long long)rank);
  if (n == 0 || n > 4096)
    return lt_fail(LT_ERR_IO, "vocabulary %s: line %lld: a token of %zu bytes", path, (long long)line, n);
  if (t->arena_len + n > t->arena_cap) {
    size_t cap = t->arena_cap ? 2 * t->arena_cap : 1 << 20;
    while (cap < t->arena_len + n)
      cap *= 2;
    char *grown = realloc(t->arena, cap);
    if (!grown)
      return lt_fail(LT_ERR_OOM, "vocabulary %s: out of host memory", path);
    t->arena = grown;
    t->arena_cap = cap;
  }
  uint64_t i = hash_bytes(p, n) & (t->nslots - 1);
  while (t->slots[i].rank >= 0) {
    if (t->slots[i].len == n && memcmp(t->arena + t->slots[i].off, p, n) == 0)
      return lt_fail(LT_ERR_IO, "vocabulary %s: line %lld: the token of rank %lld repeats rank %d", path,
                     (long long)line, (long long)rank, t->slots[i].rank);
    i = (i + 1) & (t->nslots - 1);
  }
  memcpy(t->arena + t->arena_len, p, n);
  t->slots[i] = (slot){(uint32_t)t->arena_len, (uint32_t)n, (int32_t)rank};
  t->rank_off[rank] = (uint32_t)t->arena_len;
  t->rank_len[rank] = (uint32_t)n;
  t->arena_len += n;
  return LT_OK;
}

/* ---- pre-tokenisation --------------------------------------------------------- */

/* tiktoken's r50k/gpt2 pattern with \s spelled as Unicode White_Space (PCRE2's
   \s would also take U+180E, which White_Space no longer has). */
#define WS "\\t\\n\\x0B\\f\\r \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}"
static const char *const PATTERN = "'(?:[sdmt]|ll|ve|re)| ?\\p{L}++| ?\\p{N}++| ?[^" WS "\\p{L}\\p{N}]++|[" WS
                                   "]++\\z|[" WS "]+(?![^" WS "])|[" WS "]";

void lt_tokenizer_free(lt_tokenizer *t) {
  if (!t)
    return;
  free(t->arena);
  free(t->slots);
  free(t->rank_off);
  free(t->rank_len);
  if (t->re)
    pcre2_code_free(t->re);
  free(t);
}

static lt_status alloc_tables(struct lt_tokenizer *t, int64_t nranks, const char *path) {
  t->nranks = nranks;
  t->nslots = 1;
  while (t->nslots < (uint64_t)nranks * 2 + 16)
    t->nslots *= 2;
  t->slots = malloc(sizeof(slot) * t->nslots);
  t->rank_off = malloc(sizeof(uint32_t) * (size_t)(nranks > 0 ? nranks : 1));
  t->rank_len = malloc(sizeof(uint32_t) * (size_t)(nranks > 0 ? nranks : 1));
  if (!t->slots || !t->rank_off || !t->rank_len)
    return lt_fail(LT_ERR_OOM, "vocabulary %s: out of host memory", path);
  for (uint64_t i = 0; i < t->nslots; i++)
    t->slots[i].rank = -1;
  for (int64_t r = 0; r < nranks; r++)
    t->rank_len[r] = UINT32_MAX;
  return LT_OK;
}

/* Checks the table is complete, compiles the pattern. */
static lt_status finish_load(struct lt_tokenizer *t, const char *path) {
  for (int64_t r = 0; r < t->nranks; r++)
    if (t->rank_len[r] == UINT32_MAX)
      return lt_fail(LT_ERR_IO, "vocabulary %s: rank %lld is missing", path, (long long)r);
  for (int b = 0; b < 256; b++) {
    unsigned char c = (unsigned char)b;
    if (lookup(t, &c, 1) < 0)
      return lt_fail(LT_ERR_IO, "vocabulary %s: byte 0x%02x has no token (byte-level BPE needs all 256)", path, b);
  }
  t->eot = (int32_t)t->nranks;
  int err;
  PCRE2_SIZE off;
  t->re = pcre2_compile((PCRE2_SPTR)PATTERN, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK, &err,
                        &off, NULL);
  if (!t->re)
    return lt_fail(LT_ERR_INTERNAL, "tokenizer: the pre-tokenisation pattern does not compile (PCRE2 error %d)", err);
  pcre2_jit_compile(t->re, PCRE2_JIT_COMPLETE); /* falls back to the interpreter if JIT is missing */
  return LT_OK;
}

static char *slurp(const char *path, size_t *len, lt_status *st) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    *st = lt_fail(LT_ERR_IO, "vocabulary %s: cannot open: %s", path, strerror(errno));
    return NULL;
  }
  struct stat sb;
  if (fstat(fileno(f), &sb) != 0 || !S_ISREG(sb.st_mode) || sb.st_size > (1 << 30)) {
    fclose(f);
    *st = lt_fail(LT_ERR_IO, "vocabulary %s: not a regular file of at most 1 GiB", path);
    return NULL;
  }
  char *buf = malloc((size_t)sb.st_size + 1);
  if (!buf || fread(buf, 1, (size_t)sb.st_size, f) != (size_t)sb.st_size) {
    free(buf);
    fclose(f);
    *st = lt_fail(LT_ERR_IO, "vocabulary %s: cannot read", path);
    return NULL;
  }
  fclose(f);
  buf[sb.st_size] = 0;
  *len = (size_t)sb.st_size;
  *st = LT_OK;
  return buf;
}

static int b64_value(unsigned char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

/* Decodes standard base64 (with padding) into out; returns the length or -1. */
static long b64_decode(const char *s, size_t n, unsigned char *out) {
  if (n == 0 || n % 4 != 0)
    return -1;
  long o = 0;
  for (size_t i = 0; i < n; i += 4) {
    int v[4];
    for (int k = 0; k < 4; k++) {
      v[k] = s[i + k] == '=' ? -2 : b64_value((unsigned char)s[i + k]);
      if (v[k] == -1 || (v[k] == -2 && i + 4 != n) || (v[k] == -2 && k < 2))
        return -1;
    }
    out[o++] = (unsigned char)((v[0] << 2) | (v[1] >> 4));
    if (v[2] == -2) {
      if (v[3] != -2)
        return -1;
      break;
    }
    out[o++] = (unsigned char)(((v[1] & 15) << 4) | (v[2] >> 2));
    if (v[3] == -2)
      break;
    out[o++] = (unsigned char)(((v[2] & 3) << 6) | v[3]);
  }
  return o;
}

lt_status lt_tokenizer_parse_tiktoken(const char *data, size_t len, const char *path, lt_tokenizer **out) {
  int64_t lines = 0;
  for (size_t i = 0; i < len; i++)
    lines += data[i] == '\n';
  if (len > 0 && data[len - 1] != '\n')
    lines++;
  struct lt_tokenizer *t = calloc(1, sizeof *t);
  if (!t)
    return lt_fail(LT_ERR_OOM, "vocabulary %s: out of host memory", path);
  lt_status st = alloc_tables(t, lines, path);
  unsigned char tok[4096];
  int64_t line = 0, count = 0;
  size_t i = 0;
  while (st == LT_OK && i < len) {
    size_t e = i;
    while (e < len && data[e] != '\n')
      e++;
    line++;
    size_t sp = i;
    while (sp < e && data[sp] != ' ')
      sp++;
    if (e == i) {
      i = e + 1;
      continue; /* a blank line (the last, usually) */
    }
    if (sp == e || sp - i > 5460) {
      st = lt_fail(LT_ERR_IO, "vocabulary %s: line %lld is not \"<base64 token> <rank>\"", path, (long long)line);
      break;
    }
    long n = b64_decode(data + i, sp - i, tok);
    if (n <= 0) {
      st = lt_fail(LT_ERR_IO, "vocabulary %s: line %lld: the token is not valid base64", path, (long long)line);
      break;
    }
    /* the rank: decimal digits up to the line's end (and a '\r'), read within
       the line only: the data need not end with a NUL */
    size_t q = sp + 1, qe = e > q && data[e - 1] == '\r' ? e - 1 : e;
    long long rank = 0;
    int digits = 0;
    while (q < qe && data[q] >= '0' && data[q] <= '9' && digits < 12) {
      rank = rank * 10 + (data[q] - '0');
      q++;
      digits++;
    }
    if (digits == 0 || q != qe) {
      st = lt_fail(LT_ERR_IO, "vocabulary %s: line %lld: the rank is not a whole number", path, (long long)line);
      break;
    }
    st = add_token(t, tok, (size_t)n, rank, path, line);
    count++;
    i = e + 1;
  }
  if (st == LT_OK && count == 0)
    st = lt_fail(LT_ERR_IO, "vocabulary %s: no tokens", path);
  if (st == LT_OK) {
    t->nranks = count; /* blank lines were counted as capacity only */
    st = finish_load(t, path);
  }
  if (st != LT_OK) {
    lt_tokenizer_free(t);
    return st;
  }
  *out = t;
  return LT_OK;
}

lt_status lt_tokenizer_load_tiktoken(const char *path, lt_tokenizer **out) {
  LT_OP_SCOPE("tokenizer load");
  size_t len;
  lt_status st;
  char *data = slurp(path, &len, &st);
  if (!data)
    return st;
  st = lt_tokenizer_parse_tiktoken(data, len, path, out);
  free(data);
  return st;
}

lt_status lt_tokenizer_file_sha256(const char *path, char hex[65]) {
  size_t len;
  lt_status st;
  char *data = slurp(path, &len, &st);
  if (!data)
    return st;
  SHA256Data((const uint8_t *)data, len, hex); /* 64 lowercase hex digits and a NUL */
  free(data);
  return LT_OK;
}

/* GPT-2's bytes_to_unicode: printable bytes map to themselves, the rest to
   U+0100 upwards, so every byte is a visible character in encoder.json. */
static void byte_unicode_table(int *cp_of_byte) {
  int n = 0;
  for (int b = 0; b < 256; b++) {
    int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    cp_of_byte[b] = printable ? b : 256 + n++;
  }
}

/* Decodes one encoder.json key (UTF-8 of byte-level code points) into bytes. */
static long unicode_to_bytes(const char *s, const int *byte_of_cp, unsigned char *out, size_t cap) {
  long o = 0;
  const unsigned char *p = (const unsigned char *)s;
  while (*p) {
    int cp, k;
    if (p[0] < 0x80) { cp = p[0]; k = 1; }
    else if ((p[0] & 0xE0) == 0xC0 && (p[1] & 0xC0) == 0x80) { cp = ((p[0] & 31) << 6) | (p[1] & 63); k = 2; }
    else return -1; /* byte-level code points are below U+0800 */
    if (cp >= 324 || byte_of_cp[cp] < 0 || (size_t)o >= cap)
      return -1;
    out[o++] = (unsigned char)byte_of_cp[cp];
    p += k;
  }
  return o;
}

lt_status lt_tokenizer_parse_gpt2(const char *json, size_t json_len, const char *bpe, size_t bpe_len,
                                  const char *path, lt_tokenizer **out) {
  cJSON *root = cJSON_ParseWithLength(json, json_len);
  if (!root || !cJSON_IsObject(root)) {
    cJSON_Delete(root);
    return lt_fail(LT_ERR_IO, "vocabulary %s: encoder.json is not a JSON object", path);
  }
  int cp_of_byte[256], byte_of_cp[324];
  byte_unicode_table(cp_of_byte);
  for (int i = 0; i < 324; i++)
    byte_of_cp[i] = -1;
  for (int b = 0; b < 256; b++)
    byte_of_cp[cp_of_byte[b]] = b;
  int64_t n = 0;
  for (cJSON *it = root->child; it; it = it->next)
    if (strcmp(it->string, "<|endoftext|>") != 0)
      n++;
  struct lt_tokenizer *t = calloc(1, sizeof *t);
  lt_status st = t ? alloc_tables(t, n, path) : lt_fail(LT_ERR_OOM, "vocabulary %s: out of host memory", path);
  unsigned char tok[4096];
  int64_t line = 0;
  for (cJSON *it = root->child; st == LT_OK && it; it = it->next) {
    line++;
    if (strcmp(it->string, "<|endoftext|>") == 0)
      continue;
    if (!cJSON_IsNumber(it) || it->valuedouble != floor(it->valuedouble)) {
      st = lt_fail(LT_ERR_IO, "vocabulary %s: encoder.json entry %lld is not a whole-number id", path, (long long)line);
      break;
    }
    /* the range before the conversion (a double outside int64_t's is undefined to convert) */
    if (!(it->valuedouble >= 0 && it->valuedouble < (double)t->nranks)) {
      st = lt_fail(LT_ERR_IO, "vocabulary %s: encoder.json entry %lld: id %.17g is outside 0..%lld", path,
                   (long long)line, it->valuedouble, (long long)t->nranks - 1);
      break;
    }
    long len = unicode_to_bytes(it->string, byte_of_cp, tok, sizeof tok);
    if (len <= 0) {
      st = lt_fail(LT_ERR_IO, "vocabulary %s: encoder.json entry %lld is not a byte-level token", path, (long long)line);
      break;
    }
    st = add_token(t, tok, (size_t)len, (int64_t)it->valuedouble, path, line);
  }
  cJSON_Delete(root);
  /* vocab.bpe: a version line, then "a b" merges; each must form a token */
  if (st == LT_OK && bpe) {
    int64_t ln = 0;
    size_t i = 0;
    while (st == LT_OK && i < bpe_len) {
      size_t e = i;
      while (e < bpe_len && bpe[e] != '\n')
        e++;
      ln++;
      if (ln > 1 && e > i) {
        char buf[8192];
        size_t m = e - i < sizeof buf - 1 ? e - i : sizeof buf - 1;
        memcpy(buf, bpe + i, m);
        buf[m] = 0;
        char *sp = strchr(buf, ' ');
        if (!sp || strchr(sp + 1, ' ')) {
          st = lt_fail(LT_ERR_IO, "vocabulary %s: vocab.bpe line %lld is not \"<a> <b>\"", path, (long long)ln);
          break;
        }
        *sp = 0;
        unsigned char a[4096], b[4096];
        long la = unicode_to_bytes(buf, byte_of_cp, a, sizeof a), lb = unicode_to_bytes(sp + 1, byte_of_cp, b, sizeof b);
        if (la <= 0 || lb <= 0 || la + lb > 4096) {
          st = lt_fail(LT_ERR_IO, "vocabulary %s: vocab.bpe line %lld holds a non-byte-level token", path, (long long)ln);
          break;
        }
        memcpy(a + la, b, (size_t)lb);
        if (lookup(t, a, (size_t)(la + lb)) < 0) {
          st = lt_fail(LT_ERR_IO, "vocabulary %s: vocab.bpe line %lld merges into a token encoder.json lacks", path,
                       (long long)ln);
          break;
        }
      }
      i = e + 1;
    }
  }
  if (st == LT_OK)
    st = finish_load(t, path);
  if (st != LT_OK) {
    lt_tokenizer_free(t);
    return st;
  }
  *out = t;
  return LT_OK;
}

lt_status lt_tokenizer_load_gpt2(const char *encoder_json, const char *vocab_bpe, lt_tokenizer **out) {
  LT_OP_SCOPE("tokenizer load");
  size_t jl, bl = 0;
  lt_status st;
  char *json = slurp(encoder_json, &jl, &st), *bpe = NULL;
  if (!json)
    return st;
  if (vocab_bpe && !(bpe = slurp(vocab_bpe, &bl, &st))) {
    free(json);
    return st;
  }
  st = lt_tokenizer_parse_gpt2(json, jl, bpe, bl, encoder_json, out);
  free(json);
  free(bpe);
  return st;
}

int64_t lt_tokenizer_vocab_size(const lt_tokenizer *t) { return t ? t->nranks + 1 : 0; }
int32_t lt_tokenizer_eot(const lt_tokenizer *t) { return t ? t->eot : -1; }

/* ---- UTF-8 ------------------------------------------------------------------------- */

/* Length of the valid UTF-8 sequence at p (1..4), or 0 with *bad set to the
   length of the maximal invalid subpart (Unicode 3.9, "U+FFFD Substitution
   of Maximal Subparts", as Python's errors="replace"). */
static int utf8_seq(const unsigned char *p, size_t n, int *bad) {
  unsigned char c = p[0];
  if (c < 0x80)
    return 1;
  int need;
  unsigned char lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) need = 1;
  else if (c == 0xE0) { need = 2; lo = 0xA0; }
  else if (c >= 0xE1 && c <= 0xEC) need = 2;
  else if (c == 0xED) { need = 2; hi = 0x9F; }
  else if (c >= 0xEE && c <= 0xEF) need = 2;
  else if (c == 0xF0) { need = 3; lo = 0x90; }
  else if (c >= 0xF1 && c <= 0xF3) need = 3;
  else if (c == 0xF4) { need = 3; hi = 0x8F; }
  else { *bad = 1; return 0; }
  for (int k = 1; k <= need; k++) {
    unsigned char x = (size_t)k < n ? p[k] : 0;
    unsigned char l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
    if ((size_t)k >= n || x < l || x > h) {
      *bad = k;
      return 0;
    }
  }
  return need + 1;
}

/* Valid UTF-8 for text: the text itself when valid, else a copy with U+FFFD
   in place of invalid subparts (replace), or an error at the first one. */
static lt_status clean_utf8(const char *text, size_t len, int replace, char **clean, size_t *clean_len) {
  const unsigned char *p = (const unsigned char *)text;
  size_t i = 0;
  while (i < len) {
    int bad = 0, k = utf8_seq(p + i, len - i, &bad);
    if (!k)
      break;
    i += (size_t)k;
  }
  if (i == len) {
    *clean = NULL;
    *clean_len = len;
    return LT_OK;
  }
  if (!replace)
    return lt_fail(LT_ERR_ARG, "tokenizer: invalid UTF-8 at byte %zu (0x%02x)", i + 1, p[i]);
  char *out = malloc(len * 3 + 1);
  if (!out)
    return lt_fail(LT_ERR_OOM, "tokenizer: out of host memory");
  memcpy(out, text, i);
  size_t o = i;
  while (i < len) {
    int bad = 0, k = utf8_seq(p + i, len - i, &bad);
    if (k) {
      memcpy(out + o, p + i, (size_t)k);
      o += (size_t)k;
      i += (size_t)k;
    } else {
      memcpy(out + o, "\xEF\xBF\xBD", 3);
      o += 3;
      i += (size_t)bad;
    }
  }
  *clean = out;
  *clean_len = o;
  return LT_OK;
}

/* ---- encoding ------------------------------------------------------------------------ */

typedef struct {
  int32_t *ids;
  int64_t n, cap;
} idvec;

static int push(idvec *v, int32_t id) {
  if (v->n == v->cap) {
    int64_t cap = v->cap ? 2 * v->cap : 256;
    int32_t *grown = realloc(v->ids, sizeof(int32_t) * (size_t)cap);
    if (!grown)
      return 0;
    v->ids = grown;
    v->cap = cap;
  }
  v->ids[v->n++] = id;
  return 1;
}

enum { SMALL_PIECE = 64 };

/* tiktoken's byte_pair_merge: boundaries start at every byte; repeatedly
   remove the boundary whose removal forms the lowest-ranked token. */
static int bpe_piece(const struct lt_tokenizer *t, const unsigned char *p, size_t n, idvec *out) {
  if (n == 1)
    return push(out, lookup(t, p, 1));
  int32_t whole = lookup(t, p, n);
  if (whole >= 0)
    return push(out, whole);
  size_t small_b[SMALL_PIECE + 1];
  int32_t small_r[SMALL_PIECE + 1];
  size_t *b = small_b;
  int32_t *r = small_r;
  if (n > SMALL_PIECE) {
    b = malloc(sizeof(size_t) * (n + 1));
    r = malloc(sizeof(int32_t) * (n + 1));
    if (!b || !r) {
      free(b);
      free(r);
      return 0;
    }
  }
  size_t m = n + 1; /* boundaries b[0..m-1]; r[i] ranks the token b[i]..b[i+2] */
  for (size_t i = 0; i < m; i++)
    b[i] = i;
  for (size_t i = 0; i + 2 < m; i++)
    r[i] = lookup(t, p + b[i], b[i + 2] - b[i]);
  if (m >= 2)
    r[m - 2] = -1;
  for (;;) {
    int32_t best = -1;
    size_t at = 0;
    for (size_t i = 0; i + 2 < m; i++)
      if (r[i] >= 0 && (best < 0 || r[i] < best)) {
        best = r[i];
        at = i;
      }
    if (best < 0)
      break;
    /* drop boundary at+1 and re-rank the pairs around it */
    memmove(b + at + 1, b + at + 2, sizeof(size_t) * (m - at - 2));
    memmove(r + at + 1, r + at + 2, sizeof(int32_t) * (m - at - 2));
    m--;
    r[at] = at + 2 < m ? lookup(t, p + b[at], b[at + 2] - b[at]) : -1;
    if (at > 0)
      r[at - 1] = lookup(t, p + b[at - 1], b[at + 1] - b[at - 1]);
  }
  int ok = 1;
  for (size_t i = 0; i + 1 < m && ok; i++)
    ok = push(out, lookup(t, p + b[i], b[i + 1] - b[i]));
  if (b != small_b) {
    free(b);
    free(r);
  }
  return ok;
}

/* Encodes valid UTF-8 text without specials. */
static lt_status encode_ordinary(const struct lt_tokenizer *t, const char *text, size_t len, idvec *out) {
  pcre2_match_data *md = pcre2_match_data_create_from_pattern(t->re, NULL);
  if (!md)
    return lt_fail(LT_ERR_OOM, "tokenizer: out of host memory");
  size_t at = 0;
  lt_status st = LT_OK;
  while (at < len) {
    int rc = pcre2_match(t->re, (PCRE2_SPTR)text, len, at, PCRE2_NO_UTF_CHECK, md, NULL);
    if (rc < 0) {
      /* cannot happen: the last alternative takes any single whitespace and
         the others any other character; guard against looping anyway */
      st = lt_fail(LT_ERR_INTERNAL, "tokenizer: no pre-token matches at byte %zu (PCRE2 %d)", at + 1, rc);
      break;
    }
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
    size_t s = ov[0], e = ov[1];
    if (e <= at) {
      st = lt_fail(LT_ERR_INTERNAL, "tokenizer: an empty pre-token at byte %zu", at + 1);
      break;
    }
    if (s > at) { /* unmatched text (not expected): encode it byte by byte */
      for (size_t k = at; k < s; k++)
        if (!push(out, lookup(t, (const unsigned char *)text + k, 1)))
          st = lt_fail(LT_ERR_OOM, "tokenizer: out of host memory");
    }
    if (!bpe_piece(t, (const unsigned char *)text + s, e - s, out)) {
      st = lt_fail(LT_ERR_OOM, "tokenizer: out of host memory");
      break;
    }
    at = e;
  }
  pcre2_match_data_free(md);
  return st;
}

static const char EOT_TEXT[] = "<|endoftext|>";

lt_status lt_tokenizer_encode(const lt_tokenizer *t, const char *text, size_t len, int allow_special,
                              int replace_invalid, int32_t **ids, int64_t *n) {
  LT_OP_SCOPE("encode");
  if (!t)
    return lt_fail(LT_ERR_ARG, "tokenizer: not loaded");
  char *clean = NULL;
  size_t clen = 0;
  LT_TRY(clean_utf8(text, len, replace_invalid, &clean, &clen));
  const char *s = clean ? clean : text;
  idvec out = {0};
  lt_status st = LT_OK;
  size_t at = 0;
  while (st == LT_OK && at < clen) {
    const char *hit = NULL;
    if (allow_special) {
      hit = memmem(s + at, clen - at, EOT_TEXT, sizeof EOT_TEXT - 1);
    }
    size_t end = hit ? (size_t)(hit - s) : clen;
    st = encode_ordinary(t, s + at, end - at, &out);
    if (st == LT_OK && hit) {
      if (!push(&out, t->eot))
        st = lt_fail(LT_ERR_OOM, "tokenizer: out of host memory");
      end += sizeof EOT_TEXT - 1;
    }
    at = end;
  }
  free(clean);
  if (st != LT_OK) {
    free(out.ids);
    return st;
  }
  *ids = out.ids ? out.ids : malloc(sizeof(int32_t));
  *n = out.n;
  return LT_OK;
}

lt_status lt_tokenizer_encode_many(const lt_tokenizer *t, int64_t ndocs, const char *const *texts,
                                   const size_t *lens, int allow_special, int replace_invalid, int append_eot,
                                   int32_t **ids, int64_t *n, int64_t *doc_ends) {
  LT_OP_SCOPE("encode_many");
  idvec *parts = calloc((size_t)(ndocs > 0 ? ndocs : 1), sizeof(idvec));
  lt_status *sts = calloc((size_t)(ndocs > 0 ? ndocs : 1), sizeof(lt_status));
  char (*errs)[256] = calloc((size_t)(ndocs > 0 ? ndocs : 1), 256);
  if (!parts || !sts || !errs) {
    free(parts);
    free(sts);
    free(errs);
    return lt_fail(LT_ERR_OOM, "tokenizer: out of host memory");
  }
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t d = 0; d < ndocs; d++) {
    int32_t *v = NULL;
    int64_t m = 0;
    sts[d] = lt_tokenizer_encode(t, texts[d], lens[d], allow_special, replace_invalid, &v, &m);
    if (sts[d] == LT_OK) {
      parts[d].ids = v;
      parts[d].n = m;
    } else {
      snprintf(errs[d], 256, "%s", lt_last_error()); /* the message lives in that thread */
    }
  }
  lt_status st = LT_OK;
  int64_t total = 0;
  for (int64_t d = 0; d < ndocs && st == LT_OK; d++) {
    if (sts[d] != LT_OK)
      st = lt_fail(sts[d], "document %lld: %s", (long long)d + 1, errs[d]);
    total += parts[d].n + (append_eot ? 1 : 0);
  }
  int32_t *all = st == LT_OK ? malloc(sizeof(int32_t) * (size_t)(total > 0 ? total : 1)) : NULL;
  if (st == LT_OK && !all)
    st = lt_fail(LT_ERR_OOM, "tokenizer: out of host memory for %lld ids", (long long)total);
  int64_t o = 0;
  for (int64_t d = 0; d < ndocs; d++) {
    if (st == LT_OK) {
      memcpy(all + o, parts[d].ids, sizeof(int32_t) * (size_t)parts[d].n);
      o += parts[d].n;
      if (append_eot)
        all[o++] = t->eot;
      if (doc_ends)
        doc_ends[d] = o;
    }
    free(parts[d].ids);
  }
  free(parts);
  free(sts);
  free(errs);
  if (st != LT_OK) {
    free(all);
    return st;
  }
  *ids = all;
  *n = total;
  return LT_OK;
}

lt_status lt_tokenizer_decode(const lt_tokenizer *t, const int32_t *ids, int64_t n, char **bytes, size_t *len) {
  LT_OP_SCOPE("decode");
  if (!t)
    return lt_fail(LT_ERR_ARG, "tokenizer: not loaded");
  size_t total = 0;
  for (int64_t i = 0; i < n; i++) {
    int32_t id = ids[i];
    if (id == t->eot)
      total += sizeof EOT_TEXT - 1;
    else if (id < 0 || id >= t->nranks)
      return lt_fail(LT_ERR_ARG, "decode: id %d at position %lld (1-based) is outside the vocabulary [0, %lld]", id,
                     (long long)i + 1, (long long)t->nranks);
    else
      total += t->rank_len[id];
  }
  char *out = malloc(total + 1);
  if (!out)
    return lt_fail(LT_ERR_OOM, "decode: out of host memory");
  size_t o = 0;
  for (int64_t i = 0; i < n; i++) {
    int32_t id = ids[i];
    if (id == t->eot) {
      memcpy(out + o, EOT_TEXT, sizeof EOT_TEXT - 1);
      o += sizeof EOT_TEXT - 1;
    } else {
      memcpy(out + o, t->arena + t->rank_off[id], t->rank_len[id]);
      o += t->rank_len[id];
    }
  }
  out[o] = 0;
  *bytes = out;
  *len = o;
  return LT_OK;
}

void lt_free(void *p) { free(p); }
