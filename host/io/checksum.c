/*
 * checksum.c: CRC-32C (Castagnoli, the CRC of iSCSI, RFC 3720, and of ext4
 * and Btrfs metadata) of memory and of files, which lt.ckpt records for
 * each checkpoint file and checks on load. Reflected polynomial 0x82F63B78,
 * initial value and final xor 0xFFFFFFFF: lt_crc32c(0, "123456789", 9) is
 * 0xE3069283.
 *
 * On x86-64 with SSE4.2 (checked at run time) the crc32 instruction does 8
 * bytes at a time, over three interleaved streams (the instruction's
 * latency is 3 cycles, its throughput 1 a cycle) joined by a table that
 * shifts a CRC over a block of zeros (the CRC is linear over GF(2)).
 * Elsewhere, slicing-by-8 tables (Kounavis and Berry, 2008), about 1-2 GB/s.
 * A large file is mapped in pieces by OpenMP threads and the pieces' CRCs
 * joined as zlib's crc32_combine does (multiplication by x^(8n) modulo the
 * polynomial).
 */
#include "lutra.h"
#include "base/status.h"

#include <errno.h>
#include <fcntl.h>
#include <omp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "checksum.c: the slicing-by-8 code reads words little-endian"
#endif

#define POLY 0x82F63B78u
#define BLOCK 4096 /* bytes of each of the three streams */

static uint32_t table[8][256]; /* slicing-by-8 */
static uint32_t shift_block[4][256]; /* a raw CRC state advanced over BLOCK zero bytes, byte by byte */
static uint32_t x2n[32]; /* x^(2^k) modulo the polynomial (reflected) */
static pthread_once_t once = PTHREAD_ONCE_INIT;
static int have_hw;

/* the raw state (no pre/post inversion) over n bytes, in software */
static uint32_t crc_sw(uint32_t c, const unsigned char *p, size_t n) {
  while (n && ((uintptr_t)p & 7)) {
    c = table[0][(c ^ *p++) & 0xff] ^ (c >> 8);
    n--;
  }
  while (n >= 8) {
    uint32_t lo, hi;
    memcpy(&lo, p, 4);
    memcpy(&hi, p + 4, 4);
    lo ^= c; /* (little-endian: checked above) */
    c = table[7][lo & 0xff] ^ table[6][(lo >> 8) & 0xff] ^ table[5][(lo >> 16) & 0xff] ^ table[4][lo >> 24] ^
        table[3][hi & 0xff] ^ table[2][(hi >> 8) & 0xff] ^ table[1][(hi >> 16) & 0xff] ^ table[0][hi >> 24];
    p += 8;
    n -= 8;
  }
  while (n--)
    c = table[0][(c ^ *p++) & 0xff] ^ (c >> 8);
  return c;
}

/* a * b modulo the polynomial, reflected (bit 31 is x^0) */
static uint32_t multmodp(uint32_t a, uint32_t b) {
  uint32_t m = 1u << 31, p = 0;
  for (;;) {
    if (a & m) {
      p ^= b;
      if ((a & (m - 1)) == 0)
        break;
    }
    m >>= 1;
    b = b & 1 ? (b >> 1) ^ POLY : b >> 1;
  }
  return p;
}

/* the raw state c advanced over BLOCK zero bytes */
static uint32_t shift(uint32_t c) {
  return shift_block[0][c & 0xff] ^ shift_block[1][(c >> 8) & 0xff] ^ shift_block[2][(c >> 16) & 0xff] ^
         shift_block[3][c >> 24];
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <nmmintrin.h>
#define HW 1

__attribute__((target("sse4.2"))) static uint32_t crc_hw(uint32_t c, const unsigned char *p, size_t n) {
  uint64_t a = c;
  while (n && ((uintptr_t)p & 7)) {
    a = _mm_crc32_u8((uint32_t)a, *p++);
    n--;
  }
  /* three streams of BLOCK bytes each: a over the first, b the second, d the third */
  while (n >= 3 * BLOCK) {
    uint64_t b = 0, d = 0;
    const unsigned char *q = p + BLOCK, *r = p + 2 * BLOCK;
    for (size_t i = 0; i < BLOCK; i += 8) {
      uint64_t x, y, z;
      memcpy(&x, p + i, 8);
      memcpy(&y, q + i, 8);
      memcpy(&z, r + i, 8);
      a = _mm_crc32_u64(a, x);
      b = _mm_crc32_u64(b, y);
      d = _mm_crc32_u64(d, z);
    }
    a = shift(shift((uint32_t)a) ^ (uint32_t)b) ^ (uint32_t)d;
    p += 3 * BLOCK;
    n -= 3 * BLOCK;
  }
  while (n >= 8) {
    uint64_t x;
    memcpy(&x, p, 8);
    a = _mm_crc32_u64(a, x);
    p += 8;
    n -= 8;
  }
  while (n--)
    a = _mm_crc32_u8((uint32_t)a, *p++);
  return (uint32_t)a;
}
#endif

static void init(void) {
  for (uint32_t i = 0; i < 256; i++) {
    uint32_t c = i;
    for (int k = 0; k < 8; k++)
      c = c & 1 ? (c >> 1) ^ POLY : c >> 1;
    table[0][i] = c;
  }
  /* slicing tables: table[t][i] is byte i followed by t zero bytes */
  for (int t = 1; t < 8; t++)
    for (int i = 0; i < 256; i++)
      table[t][i] = (table[t - 1][i] >> 8) ^ table[0][table[t - 1][i] & 0xff];
  /* the shift over BLOCK zeros of each single bit, then of each byte value */
  static const unsigned char zeros[BLOCK];
  uint32_t bit[32];
  for (int k = 0; k < 32; k++)
    bit[k] = crc_sw(1u << k, zeros, BLOCK);
  for (int j = 0; j < 4; j++)
    for (int v = 0; v < 256; v++) {
      uint32_t s = 0;
      for (int k = 0; k < 8; k++)
        if (v >> k & 1)
          s ^= bit[8 * j + k];
      shift_block[j][v] = s;
    }
  uint32_t x = 1u << 30; /* x^1 */
  for (int k = 0; k < 32; k++) {
    x2n[k] = x;
    x = multmodp(x, x);
  }
#ifdef HW
  __builtin_cpu_init();
  have_hw = __builtin_cpu_supports("sse4.2") != 0;
#endif
}

uint32_t lt_crc32c(uint32_t crc, const void *data, int64_t len) {
  pthread_once(&once, init);
  if (len <= 0)
    return crc;
  uint32_t c = ~crc;
#ifdef HW
  if (have_hw)
    return ~crc_hw(c, data, (size_t)len);
#endif
  return ~crc_sw(c, data, (size_t)len);
}

uint32_t lt_crc32c_portable(uint32_t crc, const void *data, int64_t len) {
  pthread_once(&once, init);
  return len <= 0 ? crc : ~crc_sw(~crc, data, (size_t)len);
}

uint32_t lt_crc32c_combine(uint32_t crc1, uint32_t crc2, int64_t len2) {
  pthread_once(&once, init);
  uint32_t p = 1u << 31; /* x^0; times x^(8 len2) */
  for (unsigned k = 3; len2 > 0; len2 >>= 1, k++)
    if (len2 & 1)
      p = multmodp(x2n[k & 31], p);
  return multmodp(p, crc1) ^ crc2;
}

int lt_crc32c_hardware(void) {
  pthread_once(&once, init);
  return have_hw;
}

/* the CRC-32C of bytes [from, from + n) of the open file fd, into *crc
   (from a multiple of the page size): mapped in windows (MAP_POPULATE maps
   the page cache's pages at once, about twice as fast as copying them out
   with read), or read with pread where the file cannot be mapped. On a
   failed read, the failing offset in *at and errno in *err. */
static int crc_range(int fd, int64_t from, int64_t n, unsigned char *buf, size_t cap, uint32_t *crc, int64_t *at,
                     int *err) {
  uint32_t c = 0;
  int64_t done = 0;
  enum { WINDOW = 64 << 20 };
  while (done < n) {
    size_t len = (size_t)(n - done < WINDOW ? n - done : WINDOW);
    void *m = mmap(NULL, len, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, (off_t)(from + done));
    if (m == MAP_FAILED)
      break;
    c = lt_crc32c(c, m, (int64_t)len);
    munmap(m, len);
    done += (int64_t)len;
  }
  while (done < n) {
    size_t want = (size_t)(n - done < (int64_t)cap ? n - done : (int64_t)cap);
    ssize_t got = pread(fd, buf, want, (off_t)(from + done));
    if (got < 0 && errno == EINTR)
      continue;
    if (got <= 0) {
      *at = from + done;
      *err = got < 0 ? errno : 0;
      return -1;
    }
    c = lt_crc32c(c, buf, got);
    done += got;
  }
  *crc = c;
  return 0;
}

lt_status lt_file_crc32c(const char *path, uint32_t *crc, int64_t *bytes) {
  *crc = 0;
  *bytes = 0;
  pthread_once(&once, init);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return lt_fail(LT_ERR_IO, "cannot open %s: %s", path, strerror(errno));
  struct stat sb;
  if (fstat(fd, &sb) != 0) {
    int e = errno;
    close(fd);
    return lt_fail(LT_ERR_IO, "cannot stat %s: %s", path, strerror(e));
  }
  int64_t size = sb.st_size;
#ifdef POSIX_FADV_SEQUENTIAL
  posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
#endif
  /* pieces of at least 32 MiB, one a thread, up to 8 */
  enum { PIECE_MIN = 32 << 20, BUF = 1 << 20 };
  int pieces = (int)(size / PIECE_MIN);
  int threads = omp_get_max_threads();
  if (pieces > threads)
    pieces = threads;
  if (pieces > 8)
    pieces = 8;
  if (pieces < 1)
    pieces = 1;
  uint32_t part[8];
  int64_t fail_at = -1, at[8];
  int fail_err = 0, errs[8], bad[8];
  int64_t page = sysconf(_SC_PAGESIZE) > 0 ? sysconf(_SC_PAGESIZE) : 4096;
  int64_t step = size / pieces / page * page; /* (mappings start at page boundaries) */
#pragma omp parallel for num_threads(pieces) schedule(static, 1) if (pieces > 1)
  for (int i = 0; i < pieces; i++) {
    int64_t from = step * i, n = i == pieces - 1 ? size - from : step;
    unsigned char *buf = malloc(BUF);
    at[i] = from;
    errs[i] = ENOMEM;
    bad[i] = !buf || crc_range(fd, from, n, buf, BUF, &part[i], &at[i], &errs[i]) != 0;
    free(buf);
  }
  uint32_t c = 0;
  for (int i = 0; i < pieces; i++) {
    if (bad[i] && fail_at < 0) {
      fail_at = at[i];
      fail_err = errs[i];
    }
    if (!bad[i])
      c = lt_crc32c_combine(c, part[i], i == pieces - 1 ? size - step * i : step);
  }
  /* the file must end where fstat said (a file growing meanwhile is not this one) */
  unsigned char extra;
  ssize_t more = fail_at < 0 ? pread(fd, &extra, 1, (off_t)size) : 0;
  close(fd);
  if (fail_at >= 0)
    return lt_fail(LT_ERR_IO, "read %s at byte %lld of %lld: %s", path, (long long)fail_at, (long long)size,
                   fail_err ? strerror(fail_err) : "the file ended early");
  if (more > 0)
    return lt_fail(LT_ERR_IO, "read %s: it grew past its %lld bytes while being read", path, (long long)size);
  *crc = c;
  *bytes = size;
  return LT_OK;
}
