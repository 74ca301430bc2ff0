/*
 * safetensors.c: reading and writing the safetensors format
 * (https://github.com/huggingface/safetensors, "Format"): an 8-byte
 * little-endian header length N, N bytes of JSON mapping each tensor name to
 * {"dtype", "shape", "data_offsets": [begin, end]} (offsets relative to the
 * byte after the header) plus an optional "__metadata__" object of strings,
 * then the raw little-endian data.
 *
 * Reading memory-maps the file and validates everything before any tensor
 * is touched: the header length fits the file, the JSON parses and is an
 * object, each entry has a known dtype, a shape of whole numbers, offsets
 * with end - begin = numel * element size, inside the data area, and the
 * spans together cover the data area without overlaps or holes (as the
 * reference implementation requires). A bad file is rejected naming the file,
 * the tensor and the problem. Writing goes to a temporary file in the same
 * directory, is fsynced, then renamed, so a reader never sees half a file.
 */
#include "base/status.h"
#include "core/tensor-impl.h"

#include <cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct entry {
  char *name;
  lt_dtype dtype;
  int ndim;
  int64_t sizes[LT_MAX_DIMS];
  uint64_t begin, end;
} entry;

struct lt_safetensors {
  char *path;
  const unsigned char *map; /* the whole file (or caller's memory) */
  size_t len;
  int mapped;
  int fd;            /* kept open while mapped, to notice a file that shrinks */
  int64_t *by_name;  /* entry indices sorted by name, for lookups */
  const unsigned char *data; /* the data area */
  uint64_t data_len;
  entry *entries;
  int64_t n;
  char *metadata; /* JSON text of __metadata__, or "{}" */
};

static const struct {
  const char *name;
  lt_dtype dtype;
} st_dtypes[] = {
    {"F32", LT_DTYPE_F32}, {"F64", LT_DTYPE_F64}, {"BF16", LT_DTYPE_BF16}, {"F16", LT_DTYPE_F16},
    {"I8", LT_DTYPE_I8},   {"U8", LT_DTYPE_U8},   {"U16", LT_DTYPE_U16},   {"I32", LT_DTYPE_I32},
    {"I64", LT_DTYPE_I64}, {"BOOL", LT_DTYPE_BOOL},
};

static const char *st_name(lt_dtype d) {
  for (size_t i = 0; i < sizeof st_dtypes / sizeof st_dtypes[0]; i++)
    if (st_dtypes[i].dtype == d)
      return st_dtypes[i].name;
  return NULL;
}

void lt_safetensors_close(lt_safetensors *f) {
  if (!f)
    return;
  for (int64_t i = 0; i < f->n; i++)
    free(f->entries[i].name);
  free(f->entries);
  free(f->metadata);
  if (f->mapped && f->map)
    munmap((void *)f->map, f->len);
  if (f->fd >= 0)
    close(f->fd);
  free(f->by_name);
  free(f->path);
  free(f);
}

static int cmp_begin(const void *a, const void *b) {
  const entry *x = a, *y = b;
  return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : (x->end < y->end ? -1 : x->end > y->end);
}

#define BAD(...) (lt_fail(LT_ERR_IO, __VA_ARGS__))

static const entry *sort_entries; /* for cmp_name: qsort has no context argument */

static int cmp_name(const void *a, const void *b) {
  return strcmp(sort_entries[*(const int64_t *)a].name, sort_entries[*(const int64_t *)b].name);
}

/* Validates and indexes the header of a file image; fills f. */
static lt_status parse(lt_safetensors *f) {
  const char *p = f->path;
  if (f->len < 8)
    return BAD("safetensors %s: %zu bytes, too short for the 8-byte header length", p, f->len);
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; i--)
    hlen = (hlen << 8) | f->map[i];
  if (hlen > f->len - 8)
    return BAD("safetensors %s: the header length %llu runs past the end of the file (%zu bytes)", p,
               (unsigned long long)hlen, f->len);
  if (hlen < 2 || f->map[8] != '{')
    return BAD("safetensors %s: the header does not start with a JSON object", p);
  f->data = f->map + 8 + hlen;
  f->data_len = f->len - 8 - hlen;
  const char *htext = (const char *)f->map + 8;
  for (uint64_t i = 0; i + 6 <= hlen; i++) { /* cJSON's C strings would cut a \u0000 short */
    if (htext[i] != '\\')
      continue;
    if (memcmp(htext + i + 1, "u0000", 5) == 0)
      return BAD("safetensors %s: the header holds \\u0000 (a NUL in a name or value)", p);
    i++;
  }
  const char *end = NULL;
  cJSON *root = cJSON_ParseWithLengthOpts(htext, (size_t)hlen, &end, 0);
  if (!root || !cJSON_IsObject(root)) {
    cJSON_Delete(root);
    return BAD("safetensors %s: the %llu-byte header is not valid JSON", p, (unsigned long long)hlen);
  }
  for (const char *q = end; q && q < htext + hlen; q++)
    if (*q != ' ' && *q != '\t' && *q != '\n' && *q != '\r') {
      cJSON_Delete(root);
      return BAD("safetensors %s: text after the header's JSON object (at header byte %ld)", p, (long)(q - htext) + 1);
    }
  int64_t count = cJSON_GetArraySize(root);
  f->entries = calloc((size_t)(count > 0 ? count : 1), sizeof(entry));
  if (!f->entries) {
    cJSON_Delete(root);
    return lt_fail(LT_ERR_OOM, "safetensors %s: out of host memory", p);
  }
  lt_status st = LT_OK;
  for (cJSON *it = root->child; it && st == LT_OK; it = it->next) {
    const char *name = it->string ? it->string : "";
    if (strcmp(name, "__metadata__") == 0) {
      if (!cJSON_IsObject(it)) {
        st = BAD("safetensors %s: __metadata__ is not an object", p);
        break;
      }
      for (cJSON *m = it->child; m; m = m->next)
        if (!cJSON_IsString(m)) {
          st = BAD("safetensors %s: __metadata__ entry '%s' is not a string", p, m->string ? m->string : "");
          break;
        }
      if (st == LT_OK) {
        free(f->metadata);
        f->metadata = cJSON_PrintUnformatted(it);
      }
      continue;
    }
    entry *e = &f->entries[f->n];
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(it, "dtype");
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(it, "shape");
    const cJSON *off = cJSON_GetObjectItemCaseSensitive(it, "data_offsets");
    if (!cJSON_IsObject(it) || !cJSON_IsString(dt) || !cJSON_IsArray(sh) || !cJSON_IsArray(off) ||
        cJSON_GetArraySize(off) != 2) {
      st = BAD("safetensors %s: tensor '%s' needs dtype (a string), shape (an array) and data_offsets "
               "(two numbers)", p, name);
      break;
    }
    int known = 0;
    for (size_t k = 0; k < sizeof st_dtypes / sizeof st_dtypes[0]; k++)
      if (strcmp(dt->valuestring, st_dtypes[k].name) == 0) {
        e->dtype = st_dtypes[k].dtype;
        known = 1;
      }
    if (!known) {
      st = BAD("safetensors %s: tensor '%s' has dtype '%s', which lutra does not read", p, name, dt->valuestring);
      break;
    }
    int nd = cJSON_GetArraySize(sh);
    if (nd > LT_MAX_DIMS) {
      st = BAD("safetensors %s: tensor '%s' has %d dims, at most %d are supported", p, name, nd, LT_MAX_DIMS);
      break;
    }
    e->ndim = nd;
    int64_t numel = 1;
    int d = 0;
    for (cJSON *s = sh->child; s; s = s->next, d++) {
      if (!cJSON_IsNumber(s) || !(s->valuedouble >= 0) || s->valuedouble > 4611686018427387904.0 ||
          s->valuedouble != floor(s->valuedouble)) { /* (the range checked before any conversion) */
        st = BAD("safetensors %s: tensor '%s' has a shape entry that is not a whole number >= 0", p, name);
        break;
      }
      e->sizes[d] = (int64_t)s->valuedouble;
      if (__builtin_mul_overflow(numel, e->sizes[d], &numel)) {
        st = BAD("safetensors %s: tensor '%s' has a shape with too many elements", p, name);
        break;
      }
    }
    if (st != LT_OK)
      break;
    double b = cJSON_GetArrayItem(off, 0)->valuedouble, en = cJSON_GetArrayItem(off, 1)->valuedouble;
    /* range first: converting a double outside uint64_t's range is undefined */
    if (!cJSON_IsNumber(cJSON_GetArrayItem(off, 0)) || !cJSON_IsNumber(cJSON_GetArrayItem(off, 1)) ||
        !(b >= 0) || !(en >= b) || b != floor(b) || en != floor(en)) {
      st = BAD("safetensors %s: tensor '%s' has data_offsets that are not whole numbers begin <= end", p, name);
      break;
    }
    if (en > (double)f->data_len) { /* (data_len < 2^53: the comparison is exact) */
      st = BAD("safetensors %s: tensor '%s' ends at byte %.17g of a %llu-byte data area", p, name, en,
               (unsigned long long)f->data_len);
      break;
    }
    e->begin = (uint64_t)b;
    e->end = (uint64_t)en;
    int64_t want;
    if (__builtin_mul_overflow(numel, lt_dtype_size(e->dtype), &want) || (uint64_t)want != e->end - e->begin) {
      st = BAD("safetensors %s: tensor '%s' spans %llu bytes but its shape and dtype %s need %lld", p, name,
               (unsigned long long)(e->end - e->begin), dt->valuestring, (long long)want);
      break;
    }
    e->name = strdup(name);
    if (!e->name) {
      st = lt_fail(LT_ERR_OOM, "safetensors %s: out of host memory", p);
      break;
    }
    f->n++;
  }
  cJSON_Delete(root);
  if (st != LT_OK)
    return st;
  if (!f->metadata && !(f->metadata = strdup("{}")))
    return lt_fail(LT_ERR_OOM, "safetensors %s: out of host memory", p);
  /* names: sorted for lookups, each once */
  f->by_name = malloc(sizeof(int64_t) * (size_t)(f->n > 0 ? f->n : 1));
  if (!f->by_name)
    return lt_fail(LT_ERR_OOM, "safetensors %s: out of host memory", p);
  for (int64_t i = 0; i < f->n; i++)
    f->by_name[i] = i;
  sort_entries = f->entries;
  qsort(f->by_name, (size_t)f->n, sizeof(int64_t), cmp_name);
  for (int64_t i = 1; i < f->n; i++)
    if (strcmp(f->entries[f->by_name[i]].name, f->entries[f->by_name[i - 1]].name) == 0)
      return BAD("safetensors %s: tensor '%s' appears twice in the header", p, f->entries[f->by_name[i]].name);
  /* spans: sorted, they must tile the data area exactly */
  entry *sorted = malloc(sizeof(entry) * (size_t)(f->n > 0 ? f->n : 1));
  if (!sorted)
    return lt_fail(LT_ERR_OOM, "safetensors %s: out of host memory", p);
  memcpy(sorted, f->entries, sizeof(entry) * (size_t)f->n);
  qsort(sorted, (size_t)f->n, sizeof(entry), cmp_begin);
  uint64_t at = 0;
  for (int64_t i = 0; i < f->n && st == LT_OK; i++) {
    if (sorted[i].begin < at)
      st = BAD("safetensors %s: tensor '%s' overlaps the tensor before it in the data area", p, sorted[i].name);
    else if (sorted[i].begin > at)
      st = BAD("safetensors %s: bytes %llu..%llu of the data area belong to no tensor (before '%s')", p,
               (unsigned long long)at, (unsigned long long)sorted[i].begin, sorted[i].name);
    at = sorted[i].end;
  }
  if (st == LT_OK && at != f->data_len)
    st = BAD("safetensors %s: the data area has %llu bytes but the tensors cover %llu", p,
             (unsigned long long)f->data_len, (unsigned long long)at);
  free(sorted);
  return st;
}

lt_status lt_safetensors_open_memory(const void *data, size_t len, const char *label, lt_safetensors **out) {
  lt_safetensors *f = calloc(1, sizeof *f);
  if (!f || !(f->path = strdup(label ? label : "(memory)"))) {
    free(f);
    return lt_fail(LT_ERR_OOM, "safetensors: out of host memory");
  }
  f->fd = -1;
  f->map = data;
  f->len = len;
  lt_status st = parse(f);
  if (st != LT_OK) {
    lt_safetensors_close(f);
    return st;
  }
  *out = f;
  return LT_OK;
}

lt_status lt_safetensors_open(const char *path, lt_safetensors **out) {
  LT_OP_SCOPE("safetensors load");
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return lt_fail(LT_ERR_IO, "safetensors %s: cannot open: %s", path, strerror(errno));
  struct stat sb;
  if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
    close(fd);
    return lt_fail(LT_ERR_IO, "safetensors %s: not a regular file", path);
  }
  size_t len = (size_t)sb.st_size;
  void *map = NULL;
  if (len > 0) {
    map = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) {
      close(fd);
      return lt_fail(LT_ERR_IO, "safetensors %s: cannot map %zu bytes: %s", path, len, strerror(errno));
    }
  }
  lt_safetensors *f = calloc(1, sizeof *f);
  if (!f || !(f->path = strdup(path))) {
    free(f);
    if (map)
      munmap(map, len);
    close(fd);
    return lt_fail(LT_ERR_OOM, "safetensors: out of host memory");
  }
  f->fd = fd;
  f->map = map ? map : (const unsigned char *)"";
  f->len = len;
  f->mapped = map != NULL;
  lt_status st = parse(f);
  if (st != LT_OK) {
    lt_safetensors_close(f);
    return st;
  }
  *out = f;
  return LT_OK;
}

int64_t lt_safetensors_count(const lt_safetensors *f) { return f ? f->n : 0; }

const char *lt_safetensors_name(const lt_safetensors *f, int64_t i) {
  return f && i >= 0 && i < f->n ? f->entries[i].name : NULL;
}

const char *lt_safetensors_metadata(const lt_safetensors *f) { return f ? f->metadata : "{}"; }

lt_status lt_safetensors_get(const lt_safetensors *f, const char *name, lt_tensor **out) {
  LT_OP_SCOPE("safetensors load");
  if (!f || !name)
    return lt_fail(LT_ERR_ARG, "safetensors: get needs an open file and a name");
  int64_t lo = 0, hi = f->n - 1, found = -1;
  while (lo <= hi) {
    int64_t mid = (lo + hi) / 2;
    int c = strcmp(f->entries[f->by_name[mid]].name, name);
    if (c == 0) {
      found = f->by_name[mid];
      break;
    }
    if (c < 0)
      lo = mid + 1;
    else
      hi = mid - 1;
  }
  if (found < 0)
    return lt_fail(LT_ERR_ARG, "safetensors %s: no tensor named '%s'", f->path, name);
  if (f->fd >= 0) { /* reading a map of a file that shrank since would fault (SIGBUS) */
    struct stat sb;
    if (fstat(f->fd, &sb) != 0 || (size_t)sb.st_size != f->len)
      return lt_fail(LT_ERR_IO, "safetensors %s: the file changed size since it was opened; open it again", f->path);
  }
  const entry *e = &f->entries[found];
  lt_tensor *t;
  LT_TRY(lt_tensor_empty(e->ndim, e->sizes, e->dtype, LT_DEVICE_CPU, &t));
  const unsigned char *src = f->data + e->begin;
  if (e->dtype == LT_DTYPE_BOOL)
    for (uint64_t k = 0; k < e->end - e->begin; k++)
      if (src[k] > 1) {
        lt_tensor_release(t);
        return lt_fail(LT_ERR_IO, "safetensors %s: tensor '%s' (BOOL) holds byte 0x%02x at element %llu", f->path,
                       name, src[k], (unsigned long long)k + 1);
      }
  memcpy(lt_tensor_ptr(t), src, (size_t)(e->end - e->begin));
  *out = t;
  return LT_OK;
}

/* ---- writing ------------------------------------------------------------------- */

static lt_status write_all(int fd, const void *buf, size_t n, const char *path) {
  const char *p = buf;
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR)
      continue;
    if (w <= 0)
      return lt_fail(LT_ERR_IO, "safetensors %s: write failed: %s", path, strerror(errno));
    p += w;
    n -= (size_t)w;
  }
  return LT_OK;
}

lt_status lt_safetensors_save(const char *path, int64_t n, const char *const *names, lt_tensor *const *tensors,
                              const char *metadata_json) {
  LT_OP_SCOPE("safetensors save");
  if (!path)
    return lt_fail(LT_ERR_ARG, "safetensors: save needs a path");
  cJSON *root = cJSON_CreateObject();
  if (!root)
    return lt_fail(LT_ERR_OOM, "safetensors: out of host memory");
  lt_status st = LT_OK;
  if (metadata_json && *metadata_json) {
    cJSON *meta = cJSON_Parse(metadata_json);
    if (!meta || !cJSON_IsObject(meta)) {
      cJSON_Delete(meta);
      cJSON_Delete(root);
      return lt_fail(LT_ERR_ARG, "safetensors %s: metadata must be a JSON object of strings", path);
    }
    for (cJSON *m = meta->child; m; m = m->next)
      if (!cJSON_IsString(m))
        st = lt_fail(LT_ERR_ARG, "safetensors %s: metadata value '%s' is not a string", path, m->string);
    cJSON_AddItemToObject(root, "__metadata__", meta);
  }
  lt_tensor **host = calloc((size_t)(n > 0 ? n : 1), sizeof(lt_tensor *));
  if (!host)
    st = lt_fail(LT_ERR_OOM, "safetensors: out of host memory");
  uint64_t at = 0;
  for (int64_t i = 0; i < n && st == LT_OK; i++) {
    const lt_tensor *t = tensors[i];
    if ((st = lt_check_tensor("save", t, (int)i + 1)) != LT_OK)
      break;
    const char *dn = st_name(t->dtype);
    if (!dn) {
      st = lt_fail(LT_ERR_DTYPE, "safetensors %s: tensor '%s' has dtype %s, which safetensors cannot hold", path,
                   names[i], lt_dtype_name(t->dtype));
      break;
    }
    if (!names[i] || !*names[i] || strcmp(names[i], "__metadata__") == 0 ||
        cJSON_GetObjectItemCaseSensitive(root, names[i])) {
      st = lt_fail(LT_ERR_ARG, "safetensors %s: tensor name '%s' is empty, reserved or given twice", path,
                   names[i] ? names[i] : "");
      break;
    }
    /* contiguous CPU copies (the data is written as it lies) */
    lt_tensor *c = NULL;
    st = lt_tensor_to((lt_tensor *)t, t->dtype, LT_DEVICE_CPU, &c);
    if (st == LT_OK) {
      st = lt_tensor_contiguous(c, &host[i]);
      lt_tensor_release(c);
    }
    if (st != LT_OK)
      break;
    uint64_t bytes = (uint64_t)lt_tensor_numel(t) * (uint64_t)lt_dtype_size(t->dtype);
    cJSON *e = cJSON_CreateObject(), *shape = cJSON_CreateArray(), *offs = cJSON_CreateArray();
    cJSON_AddStringToObject(e, "dtype", dn);
    for (int d = 0; d < t->ndim; d++)
      cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)t->sizes[d]));
    cJSON_AddItemToObject(e, "shape", shape);
    cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)at));
    cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)(at + bytes)));
    cJSON_AddItemToObject(e, "data_offsets", offs);
    cJSON_AddItemToObject(root, names[i], e);
    at += bytes;
  }
  char *text = st == LT_OK ? cJSON_PrintUnformatted(root) : NULL;
  cJSON_Delete(root);
  if (st == LT_OK && !text)
    st = lt_fail(LT_ERR_OOM, "safetensors: out of host memory");
  char *tmp = NULL;
  int fd = -1;
  if (st == LT_OK) {
    size_t tl = strlen(path) + 32;
    tmp = malloc(tl);
    snprintf(tmp, tl, "%s.tmp.%ld", path, (long)getpid());
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
      st = lt_fail(LT_ERR_IO, "safetensors %s: cannot create %s: %s", path, tmp, strerror(errno));
  }
  if (st == LT_OK) {
    size_t hl = strlen(text), padded = (hl + 7) / 8 * 8; /* spaces pad the header to 8 bytes */
    unsigned char len8[8];
    for (int i = 0; i < 8; i++)
      len8[i] = (unsigned char)((uint64_t)padded >> (8 * i));
    st = write_all(fd, len8, 8, path);
    if (st == LT_OK)
      st = write_all(fd, text, hl, path);
    for (size_t k = hl; st == LT_OK && k < padded; k++)
      st = write_all(fd, " ", 1, path);
    for (int64_t i = 0; i < n && st == LT_OK; i++)
      st = write_all(fd, lt_tensor_ptr(host[i]), (size_t)(lt_tensor_numel(host[i]) * lt_dtype_size(host[i]->dtype)),
                     path);
    if (st == LT_OK && fsync(fd) != 0)
      st = lt_fail(LT_ERR_IO, "safetensors %s: fsync failed: %s", path, strerror(errno));
  }
  if (fd >= 0 && close(fd) != 0 && st == LT_OK)
    st = lt_fail(LT_ERR_IO, "safetensors %s: close failed: %s", path, strerror(errno));
  if (st == LT_OK && rename(tmp, path) != 0)
    st = lt_fail(LT_ERR_IO, "safetensors %s: cannot rename %s into place: %s", path, tmp, strerror(errno));
  if (st != LT_OK && tmp)
    unlink(tmp);
  free(tmp);
  free(text);
  for (int64_t i = 0; host && i < n; i++)
    lt_tensor_release(host[i]);
  free(host);
  return st;
}
