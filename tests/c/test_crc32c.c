/*
 * test_crc32c.c: CRC-32C (host/io/checksum.c) against the check value of the
 * CRC catalogue ("123456789") and the iSCSI vectors of RFC 3720 B.4, and
 * both its paths (the crc32 instruction with three interleaved streams, the
 * slicing-by-8 tables) against a bit-at-a-time reference, over lengths and
 * alignments around the stream blocks, in pieces (and joined), and of files,
 * one read in pieces by threads.
 */
#include "check.h"
#include "lutra.h"

#include <omp.h>
#include <stdlib.h>
#include <unistd.h>

static uint32_t reference(const unsigned char *p, size_t n) {
  uint32_t c = 0xFFFFFFFFu;
  while (n--) {
    c ^= *p++;
    for (int k = 0; k < 8; k++)
      c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
  }
  return ~c;
}

TEST(known_answers) {
  unsigned char v[32];
  CHECK(lt_crc32c(0, "123456789", 9) == 0xE3069283u);
  CHECK(lt_crc32c_portable(0, "123456789", 9) == 0xE3069283u);
  memset(v, 0, 32);
  CHECK(lt_crc32c(0, v, 32) == 0x8A9136AAu);
  memset(v, 0xff, 32);
  CHECK(lt_crc32c(0, v, 32) == 0x62A8AB43u);
  for (int i = 0; i < 32; i++)
    v[i] = (unsigned char)i;
  CHECK(lt_crc32c(0, v, 32) == 0x46DD794Eu);
  for (int i = 0; i < 32; i++)
    v[i] = (unsigned char)(31 - i);
  CHECK(lt_crc32c(0, v, 32) == 0x113FDB5Cu);
  CHECK(lt_crc32c(0, v, 0) == 0);
}

TEST(paths_agree_with_the_reference) {
  size_t cap = 3 * 3 * 4096 + 64;
  unsigned char *buf = malloc(cap);
  uint32_t x = 12345;
  for (size_t i = 0; i < cap; i++) {
    x = x * 1103515245u + 12345u;
    buf[i] = (unsigned char)(x >> 16);
  }
  size_t lens[] = {1, 7, 8, 9, 63, 4096, 3 * 4096 - 1, 3 * 4096, 3 * 4096 + 1, 2 * 3 * 4096 + 13, 3 * 3 * 4096};
  for (int off = 0; off < 8; off++)
    for (size_t j = 0; j < sizeof lens / sizeof lens[0]; j++) {
      uint32_t want = reference(buf + off, lens[j]);
      CHECK_MSG(lt_crc32c(0, buf + off, (int64_t)lens[j]) == want, "offset %d, %zu bytes", off, lens[j]);
      CHECK_MSG(lt_crc32c_portable(0, buf + off, (int64_t)lens[j]) == want, "portable, offset %d, %zu bytes", off,
                lens[j]);
    }
  /* in pieces: the CRC of the pieces continues */
  uint32_t c = 0;
  for (size_t at = 0; at < cap; at += 1000)
    c = lt_crc32c(c, buf + at, (int64_t)(cap - at < 1000 ? cap - at : 1000));
  CHECK(c == reference(buf, cap));
  /* joined: A then B from the CRCs of each */
  for (size_t cut = 0; cut <= cap; cut += cap / 7)
    CHECK_MSG(lt_crc32c_combine(lt_crc32c(0, buf, (int64_t)cut), lt_crc32c(0, buf + cut, (int64_t)(cap - cut)),
                                (int64_t)(cap - cut)) == reference(buf, cap),
              "combined at %zu", cut);
  /* of a file */
  char path[] = "/tmp/lutra-crc32c-XXXXXX";
  int fd = mkstemp(path);
  CHECK(fd >= 0 && write(fd, buf, cap) == (ssize_t)cap);
  close(fd);
  uint32_t fc;
  int64_t bytes;
  CHECK_OK(lt_file_crc32c(path, &fc, &bytes));
  CHECK(fc == reference(buf, cap) && bytes == (int64_t)cap);
  unlink(path);
  CHECK(lt_file_crc32c(path, &fc, &bytes) == LT_ERR_IO && strstr(lt_last_error(), path));
  free(buf);
}

/* a file large enough to be read in pieces by several threads */
TEST(large_file_in_pieces) {
  size_t n = (size_t)100 << 20;
  unsigned char *buf = malloc(n);
  uint64_t x = 99;
  for (size_t i = 0; i < n; i += 8) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    memcpy(buf + i, &x, 8);
  }
  char path[] = "/tmp/lutra-crc32c-XXXXXX";
  int fd = mkstemp(path);
  CHECK(fd >= 0 && write(fd, buf, n) == (ssize_t)n);
  close(fd);
  omp_set_num_threads(4);
  uint32_t fc;
  int64_t bytes;
  CHECK_OK(lt_file_crc32c(path, &fc, &bytes));
  CHECK_MSG(fc == lt_crc32c(0, buf, (int64_t)n), "%08x vs %08x", fc, lt_crc32c(0, buf, (int64_t)n));
  CHECK(bytes == (int64_t)n);
  unlink(path);
  free(buf);
}

RUN_TESTS()
