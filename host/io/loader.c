/*
 * loader.c: token shards and the batch loader.
 *
 * Shards use llm.c's format: 256 little-endian int32 (magic 20240520,
 * version 1, token count, then zeros) and the tokens as uint16; or magic
 * 20240801, version 7 and uint32 tokens for vocabularies over 65,535. Every
 * header is checked against the file's size before a token is read.
 *
 * The loader keeps its shards open and reads windows of T+1 tokens at a
 * stride of T with pread (a shard cut short under it is an error naming
 * it, never a SIGBUS) (x = tokens[0..T), y = tokens[1..T]). An epoch visits every
 * window once, in an order shuffled by (seed, epoch) with Philox-driven
 * Fisher-Yates (or in file order, unshuffled). Under data parallelism every
 * rank reads the same number of windows per epoch, floor(windows / world):
 * the last (windows mod world) positions of each epoch's order are dropped,
 * as torch's DistributedSampler(drop_last=True) does, and rank r of world
 * takes positions r, r + world, ... of the rest. So the ranks' streams are
 * disjoint, each window is read at most once per epoch, every global batch
 * (the ranks' step-s batches together: positions s*B*world.. of the order)
 * is split into disjoint per-rank slices, and all ranks change epoch at the
 * same step and row. Batches take the next B windows of the stream,
 * crossing into the next epoch when one ends. A
 * background thread fills a bounded queue of ready batches; the state
 * (epoch, position in the rank's stream) is that of the batches handed out,
 * so a loader restored from it yields exactly what the original would have.
 */
#include "base/status.h"
#include "core/tensor-impl.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum { HEADER_INTS = 256, HEADER_BYTES = HEADER_INTS * 4 };
enum { MAGIC_U16 = 20240520, MAGIC_U32 = 20240801 };

static int32_t read_i32(const unsigned char *p) {
  return (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
}

lt_status lt_shard_parse_header(const void *data, size_t len, const char *label, int64_t *ntokens, int *token_bytes) {
  const unsigned char *p = data;
  if (len < HEADER_BYTES)
    return lt_fail(LT_ERR_IO, "shard %s: %zu bytes, shorter than the %d-byte header", label, len, HEADER_BYTES);
  int32_t magic = read_i32(p), version = read_i32(p + 4), count = read_i32(p + 8);
  int tb;
  if (magic == MAGIC_U16 && version == 1)
    tb = 2;
  else if (magic == MAGIC_U32 && version == 7)
    tb = 4;
  else if (magic != MAGIC_U16 && magic != MAGIC_U32)
    return lt_fail(LT_ERR_IO, "shard %s: magic %d is not a token shard's (%d or %d)", label, magic, MAGIC_U16, MAGIC_U32);
  else
    return lt_fail(LT_ERR_IO, "shard %s: version %d does not go with magic %d (expected %d)", label, version, magic,
                   magic == MAGIC_U16 ? 1 : 7);
  if (count < 0)
    return lt_fail(LT_ERR_IO, "shard %s: negative token count %d", label, count);
  uint64_t want = HEADER_BYTES + (uint64_t)count * (uint64_t)tb;
  if (want != len)
    return lt_fail(LT_ERR_IO, "shard %s: the header counts %d tokens (%llu bytes with the header) but the file has %zu bytes%s",
                   label, count, (unsigned long long)want, len, want > len ? " (truncated?)" : "");
  *ntokens = count;
  *token_bytes = tb;
  return LT_OK;
}

lt_status lt_shard_write(const char *path, const int32_t *ids, int64_t n, int64_t vocab_size) {
  LT_OP_SCOPE("shard write");
  if (n < 0 || n > INT32_MAX)
    return lt_fail(LT_ERR_ARG, "shard %s: %lld tokens do not fit a shard (at most %d)", path, (long long)n, INT32_MAX);
  int tb = vocab_size > 65536 ? 4 : 2;
  for (int64_t i = 0; i < n; i++)
    if (ids[i] < 0 || (int64_t)ids[i] >= vocab_size)
      return lt_fail(LT_ERR_ARG, "shard %s: token %d at position %lld is outside the vocabulary of %lld", path, ids[i],
                     (long long)i + 1, (long long)vocab_size);
  unsigned char header[HEADER_BYTES] = {0};
  int32_t h[3] = {tb == 2 ? MAGIC_U16 : MAGIC_U32, tb == 2 ? 1 : 7, (int32_t)n};
  for (int k = 0; k < 3; k++)
    for (int b = 0; b < 4; b++)
      header[4 * k + b] = (unsigned char)((uint32_t)h[k] >> (8 * b));
  size_t plen = strlen(path) + 32;
  char *tmp = malloc(plen);
  if (!tmp)
    return lt_fail(LT_ERR_OOM, "shard %s: out of host memory", path);
  snprintf(tmp, plen, "%s.tmp.%ld", path, (long)getpid());
  FILE *f = fopen(tmp, "wb");
  lt_status st = LT_OK;
  if (!f)
    st = lt_fail(LT_ERR_IO, "shard %s: cannot create %s: %s", path, tmp, strerror(errno));
  if (st == LT_OK && fwrite(header, 1, sizeof header, f) != sizeof header)
    st = lt_fail(LT_ERR_IO, "shard %s: write failed: %s", path, strerror(errno));
  enum { CHUNK = 1 << 16 };
  unsigned char buf[CHUNK * 4];
  for (int64_t i = 0; st == LT_OK && i < n; i += CHUNK) {
    int64_t m = n - i < CHUNK ? n - i : CHUNK;
    for (int64_t k = 0; k < m; k++) {
      uint32_t v = (uint32_t)ids[i + k];
      for (int b = 0; b < tb; b++)
        buf[k * tb + b] = (unsigned char)(v >> (8 * b));
    }
    if (fwrite(buf, (size_t)tb, (size_t)m, f) != (size_t)m)
      st = lt_fail(LT_ERR_IO, "shard %s: write failed: %s", path, strerror(errno));
  }
  if (f) {
    if (st == LT_OK && (fflush(f) != 0 || fsync(fileno(f)) != 0))
      st = lt_fail(LT_ERR_IO, "shard %s: fsync failed: %s", path, strerror(errno));
    if (fclose(f) != 0 && st == LT_OK)
      st = lt_fail(LT_ERR_IO, "shard %s: close failed: %s", path, strerror(errno));
  }
  if (st == LT_OK && rename(tmp, path) != 0)
    st = lt_fail(LT_ERR_IO, "shard %s: cannot rename into place: %s", path, strerror(errno));
  if (st != LT_OK)
    unlink(tmp);
  free(tmp);
  return st;
}

/* ---- the loader -------------------------------------------------------------- */

typedef struct {
  char *path;
  int fd; /* open for pread, or -1 */
  size_t len;
  int64_t ntokens, nwindows, first_window;
  int token_bytes;
} shard;

typedef struct {
  lt_tensor *x, *y;
  int64_t epoch, index; /* the stream position after this batch */
  int end;              /* no batch: the last epoch is over */
} batch;

struct lt_loader {
  shard *shards;
  int nshards;
  int64_t B, T, nwindows;
  int shuffle, rank, world;
  int64_t max_epochs; /* 0: no end */
  uint64_t seed;
  /* producer side */
  int64_t p_epoch, p_index, perm_epoch;
  int64_t *perm;
  /* queue */
  batch *queue;
  int qcap, qhead, qlen;
  int stop, running, failed;
  char error[512];
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t can_put, can_take;
  /* consumer side */
  int64_t c_epoch, c_index;
};

/* Windows this rank reads per epoch (positions rank, rank + world, ... of
   an epoch's order): the same on every rank, the remainder dropped. */
static int64_t stream_len(const lt_loader *l) { return l->nwindows / l->world; }

static void make_perm(lt_loader *l, int64_t epoch) {
  for (int64_t i = 0; i < l->nwindows; i++)
    l->perm[i] = i;
  if (l->shuffle) {
    /* Fisher-Yates driven by Philox words of (seed, epoch-tagged counters) */
    uint32_t key[2] = {(uint32_t)l->seed, (uint32_t)(l->seed >> 32)};
    uint32_t w[4];
    for (int64_t i = l->nwindows - 1; i > 0; i--) {
      uint64_t c = (uint64_t)i;
      uint32_t ctr[4] = {(uint32_t)c, (uint32_t)(c >> 32), (uint32_t)epoch, 0x5348554Fu /* "SHUF" */};
      lt_philox4x32_10(ctr, key, w);
      uint64_t r = ((uint64_t)w[0] << 32 | w[1]) % (uint64_t)(i + 1);
      int64_t t = l->perm[i];
      l->perm[i] = l->perm[r];
      l->perm[r] = t;
    }
  }
  l->perm_epoch = epoch;
}

/* n bytes at off into buf (pread until done); the bytes read, fewer at end of file or on an error (errno) */
static size_t pread_full(int fd, void *buf, size_t n, off_t off) {
  size_t got = 0;
  while (got < n) {
    ssize_t k = pread(fd, (char *)buf + got, n - got, off + (off_t)got);
    if (k < 0 && errno == EINTR)
      continue;
    if (k <= 0)
      break;
    got += (size_t)k;
  }
  return got;
}

/* Copies window w's T+1 tokens into x (T) and y (T) rows, read with pread
   into buf ((T+1) * 4 bytes): a shard cut short while the loader runs is an
   error naming it, not a SIGBUS as a mapped file would give. */
static lt_status copy_window(const lt_loader *l, int64_t w, int32_t *x, int32_t *y, unsigned char *buf) {
  int lo = 0, hi = l->nshards - 1;
  while (lo < hi) { /* the shard holding window w */
    int mid = (lo + hi + 1) / 2;
    if (l->shards[mid].first_window <= w)
      lo = mid;
    else
      hi = mid - 1;
  }
  const shard *s = &l->shards[lo];
  int64_t start = (w - s->first_window) * l->T;
  size_t want = (size_t)(l->T + 1) * (size_t)s->token_bytes;
  off_t at = (off_t)(HEADER_BYTES + start * s->token_bytes);
  errno = 0;
  size_t got = pread_full(s->fd, buf, want, at);
  if (got < want)
    return lt_fail(LT_ERR_IO, "shard %s: read %zu of %zu bytes at offset %lld%s%s: the file changed under the loader",
                   s->path, got, want, (long long)at, errno ? ": " : "", errno ? strerror(errno) : " (truncated?)");
  for (int64_t k = 0; k <= l->T; k++) {
    const unsigned char *p = buf + k * s->token_bytes;
    int32_t v = s->token_bytes == 2 ? (int32_t)(p[0] | p[1] << 8) : read_i32(p);
    if (k < l->T)
      x[k] = v;
    if (k > 0)
      y[k - 1] = v;
  }
  return LT_OK;
}

/* Builds the next batch at the producer's position (advancing it). */
static lt_status produce(lt_loader *l, batch *b) {
  memset(b, 0, sizeof *b);
  int64_t len = stream_len(l);
  if (l->max_epochs && l->p_epoch >= l->max_epochs) {
    b->end = 1;
    return LT_OK;
  }
  int64_t shape[2] = {l->B, l->T};
  LT_TRY(lt_tensor_empty(2, shape, LT_DTYPE_I32, LT_DEVICE_CPU, &b->x));
  lt_status st = lt_tensor_empty(2, shape, LT_DTYPE_I32, LT_DEVICE_CPU, &b->y);
  if (st != LT_OK) {
    lt_tensor_release(b->x);
    return st;
  }
  int32_t *xp = (int32_t *)lt_tensor_ptr(b->x), *yp = (int32_t *)lt_tensor_ptr(b->y);
  unsigned char *buf = malloc((size_t)(l->T + 1) * 4);
  if (!buf)
    st = lt_fail(LT_ERR_OOM, "loader: out of host memory");
  for (int64_t r = 0; st == LT_OK && r < l->B; r++) {
    if (l->p_index >= len) {
      l->p_epoch++;
      l->p_index = 0;
      if (l->max_epochs && l->p_epoch >= l->max_epochs) { /* the last batch is short: drop it */
        lt_tensor_release(b->x);
        lt_tensor_release(b->y);
        b->x = b->y = NULL;
        b->end = 1;
        free(buf);
        return LT_OK;
      }
    }
    if (l->perm_epoch != l->p_epoch)
      make_perm(l, l->p_epoch);
    int64_t w = l->perm[l->rank + l->p_index * l->world];
    st = copy_window(l, w, xp + r * l->T, yp + r * l->T, buf);
    if (st == LT_OK)
      l->p_index++;
  }
  free(buf);
  if (st != LT_OK) {
    lt_tensor_release(b->x);
    lt_tensor_release(b->y);
    b->x = b->y = NULL;
    return st;
  }
  b->epoch = l->p_epoch;
  b->index = l->p_index;
  return LT_OK;
}

static void *producer_main(void *arg) {
  lt_loader *l = arg;
  for (;;) {
    pthread_mutex_lock(&l->mu);
    while (!l->stop && l->qlen == l->qcap)
      pthread_cond_wait(&l->can_put, &l->mu);
    if (l->stop) {
      pthread_mutex_unlock(&l->mu);
      return NULL;
    }
    pthread_mutex_unlock(&l->mu);
    batch b;
    lt_status st = produce(l, &b);
    pthread_mutex_lock(&l->mu);
    if (st != LT_OK) {
      snprintf(l->error, sizeof l->error, "%s", lt_last_error());
      l->failed = 1;
      pthread_cond_broadcast(&l->can_take);
      pthread_mutex_unlock(&l->mu);
      return NULL;
    }
    l->queue[(l->qhead + l->qlen) % l->qcap] = b;
    l->qlen++;
    pthread_cond_signal(&l->can_take);
    int done = b.end;
    pthread_mutex_unlock(&l->mu);
    if (done)
      return NULL;
  }
}

static void stop_producer(lt_loader *l) {
  if (!l->running)
    return;
  pthread_mutex_lock(&l->mu);
  l->stop = 1;
  pthread_cond_broadcast(&l->can_put);
  pthread_mutex_unlock(&l->mu);
  pthread_join(l->thread, NULL);
  l->running = 0;
  while (l->qlen > 0) {
    batch *b = &l->queue[l->qhead];
    lt_tensor_release(b->x);
    lt_tensor_release(b->y);
    l->qhead = (l->qhead + 1) % l->qcap;
    l->qlen--;
  }
  l->qhead = 0;
}

static lt_status start_producer(lt_loader *l) {
  l->stop = 0;
  l->failed = 0;
  l->p_epoch = l->c_epoch;
  l->p_index = l->c_index;
  if (pthread_create(&l->thread, NULL, producer_main, l) != 0)
    return lt_fail(LT_ERR_INTERNAL, "loader: cannot start the prefetch thread: %s", strerror(errno));
  l->running = 1;
  return LT_OK;
}

void lt_loader_close(lt_loader *l) {
  if (!l)
    return;
  stop_producer(l);
  for (int i = 0; i < l->nshards; i++) {
    if (l->shards[i].fd >= 0)
      close(l->shards[i].fd);
    free(l->shards[i].path);
  }
  free(l->shards);
  free(l->perm);
  free(l->queue);
  pthread_mutex_destroy(&l->mu);
  pthread_cond_destroy(&l->can_put);
  pthread_cond_destroy(&l->can_take);
  free(l);
}

/* A shard opened for reading: the file stays open (pread), its header checked against its size. */
static lt_status open_shard(shard *s, const char *path) {
  s->fd = -1;
  s->path = strdup(path);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return lt_fail(LT_ERR_IO, "shard %s: cannot open: %s", path, strerror(errno));
  struct stat sb;
  if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
    close(fd);
    return lt_fail(LT_ERR_IO, "shard %s: not a regular file", path);
  }
  s->fd = fd;
  s->len = (size_t)sb.st_size;
  unsigned char header[HEADER_BYTES];
  size_t want = s->len < HEADER_BYTES ? s->len : HEADER_BYTES;
  errno = 0;
  if (pread_full(fd, header, want, 0) < want)
    return lt_fail(LT_ERR_IO, "shard %s: cannot read its header: %s", path, errno ? strerror(errno) : "end of file");
  /* the parser reads the header alone and checks its count against the file's size */
  return lt_shard_parse_header(header, s->len, path, &s->ntokens, &s->token_bytes);
}

lt_status lt_shard_read(const char *path, lt_tensor **out) {
  LT_OP_SCOPE("shard read");
  shard s = {0};
  lt_status st = open_shard(&s, path);
  lt_tensor *t = NULL;
  if (st == LT_OK)
    st = lt_tensor_empty(1, (int64_t[]){s.ntokens}, LT_DTYPE_I32, LT_DEVICE_CPU, &t);
  enum { CHUNK = 1 << 16 }; /* tokens read at a time */
  unsigned char *buf = st == LT_OK ? malloc((size_t)CHUNK * 4) : NULL;
  if (st == LT_OK && !buf)
    st = lt_fail(LT_ERR_OOM, "shard %s: out of host memory", path);
  int32_t *dst = t ? (int32_t *)lt_tensor_ptr(t) : NULL;
  for (int64_t at = 0; st == LT_OK && at < s.ntokens; at += CHUNK) {
    int64_t n = s.ntokens - at < CHUNK ? s.ntokens - at : CHUNK;
    size_t want = (size_t)n * (size_t)s.token_bytes;
    errno = 0;
    if (pread_full(s.fd, buf, want, (off_t)(HEADER_BYTES + at * s.token_bytes)) < want) {
      st = lt_fail(LT_ERR_IO, "shard %s: cannot read its tokens: %s", path, errno ? strerror(errno) : "end of file");
      break;
    }
    for (int64_t i = 0; i < n; i++)
      dst[at + i] = s.token_bytes == 2 ? (int32_t)(buf[2 * i] | buf[2 * i + 1] << 8) : read_i32(buf + 4 * i);
  }
  free(buf);
  if (st == LT_OK)
    *out = t;
  else
    lt_tensor_release(t);
  if (s.fd >= 0)
    close(s.fd);
  free(s.path);
  return st;
}

lt_status lt_loader_open(int npaths, const char *const *paths, int64_t B, int64_t T, int shuffle, uint64_t seed,
                         int rank, int world, int64_t max_epochs, int prefetch, lt_loader **out) {
  if (npaths < 1)
    return lt_fail(LT_ERR_ARG, "loader: no shard files given");
  if (B < 1 || T < 1)
    return lt_fail(LT_ERR_ARG, "loader: batch %lld and sequence length %lld must be >= 1", (long long)B, (long long)T);
  if (world < 1 || rank < 0 || rank >= world)
    return lt_fail(LT_ERR_ARG, "loader: rank %d is outside 0..%d", rank, world - 1);
  if (max_epochs < 0)
    return lt_fail(LT_ERR_ARG, "loader: epochs must be >= 0 (0: no end)");
  lt_loader *l = calloc(1, sizeof *l);
  if (!l)
    return lt_fail(LT_ERR_OOM, "loader: out of host memory");
  pthread_mutex_init(&l->mu, NULL);
  pthread_cond_init(&l->can_put, NULL);
  pthread_cond_init(&l->can_take, NULL);
  l->B = B;
  l->T = T;
  l->shuffle = shuffle;
  l->seed = seed;
  l->rank = rank;
  l->world = world;
  l->max_epochs = max_epochs;
  l->perm_epoch = -1;
  l->qcap = prefetch < 1 ? 1 : prefetch;
  l->shards = calloc((size_t)npaths, sizeof(shard));
  l->queue = calloc((size_t)l->qcap, sizeof(batch));
  lt_status st = l->shards && l->queue ? LT_OK : lt_fail(LT_ERR_OOM, "loader: out of host memory");
  for (int i = 0; st == LT_OK && i < npaths; i++) {
    l->nshards++;
    st = open_shard(&l->shards[i], paths[i]);
    if (st == LT_OK) {
      shard *s = &l->shards[i];
      s->nwindows = s->ntokens > 0 ? (s->ntokens - 1) / T : 0;
      s->first_window = l->nwindows;
      l->nwindows += s->nwindows;
    }
  }
  if (st == LT_OK && l->nwindows < world)
    st = lt_fail(LT_ERR_ARG, "loader: %d shard(s) starting with %s hold %lld window(s) of %lld tokens, fewer than the %d "
                 "rank(s) need (shards shorter than one window give none)", npaths, paths[0], (long long)l->nwindows,
                 (long long)T + 1, world);
  if (st == LT_OK && !(l->perm = malloc(sizeof(int64_t) * (size_t)l->nwindows)))
    st = lt_fail(LT_ERR_OOM, "loader: out of host memory for %lld windows", (long long)l->nwindows);
  if (st == LT_OK)
    st = start_producer(l);
  if (st != LT_OK) {
    lt_loader_close(l);
    return st;
  }
  *out = l;
  return LT_OK;
}

lt_status lt_loader_next(lt_loader *l, lt_tensor **x, lt_tensor **y) {
  LT_OP_SCOPE("loader");
  LT_TRY(lt_check_interrupt("loader"));
  pthread_mutex_lock(&l->mu);
  while (l->qlen == 0 && !l->failed && l->running)
    pthread_cond_wait(&l->can_take, &l->mu);
  if (l->qlen == 0) {
    lt_status st = l->failed ? lt_fail(LT_ERR_INTERNAL, "loader: %s", l->error)
                             : lt_fail(LT_ERR_INTERNAL, "loader: the prefetch thread stopped");
    pthread_mutex_unlock(&l->mu);
    return st;
  }
  batch b = l->queue[l->qhead];
  if (b.end) { /* leave the end marker for later calls */
    pthread_mutex_unlock(&l->mu);
    *x = *y = NULL;
    return LT_OK;
  }
  l->qhead = (l->qhead + 1) % l->qcap;
  l->qlen--;
  l->c_epoch = b.epoch;
  l->c_index = b.index;
  pthread_cond_signal(&l->can_put);
  pthread_mutex_unlock(&l->mu);
  *x = b.x;
  *y = b.y;
  return LT_OK;
}

void lt_loader_get_state(const lt_loader *l, int64_t *epoch, int64_t *index) {
  *epoch = l->c_epoch;
  *index = l->c_index;
}

lt_status lt_loader_set_state(lt_loader *l, int64_t epoch, int64_t index) {
  if (epoch < 0 || index < 0 || index > stream_len(l))
    return lt_fail(LT_ERR_ARG, "loader: state (epoch %lld, position %lld) is outside this loader's stream of %lld "
                   "windows per epoch", (long long)epoch, (long long)index, (long long)stream_len(l));
  stop_producer(l);
  l->c_epoch = epoch;
  l->c_index = index;
  return start_producer(l);
}

int64_t lt_loader_num_windows(const lt_loader *l) { return l->nwindows; }

int64_t lt_loader_num_tokens(const lt_loader *l) {
  int64_t n = 0;
  for (int i = 0; i < l->nshards; i++)
    n += l->shards[i].ntokens;
  return n;
}

int64_t lt_loader_batches_per_epoch(const lt_loader *l) { return stream_len(l) / l->B; }

int64_t lt_loader_windows_per_epoch(const lt_loader *l) { return stream_len(l); }
