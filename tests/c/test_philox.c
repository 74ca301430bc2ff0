/*
 * test_philox.c: Philox4x32-10 against the known-answer vectors published
 * with Random123 (kat_vectors), and the counter layout of draws.
 */
#include "check.h"
#include "lutra.h"

TEST(known_answers) {
  struct {
    uint32_t ctr[4], key[2], out[4];
  } kat[] = {
      {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
      {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
       {0xffffffff, 0xffffffff},
       {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
      {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
       {0xa4093822, 0x299f31d0},
       {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
  };
  for (int i = 0; i < 3; i++) {
    uint32_t out[4];
    lt_philox4x32_10(kat[i].ctr, kat[i].key, out);
    for (int j = 0; j < 4; j++)
      CHECK_MSG(out[j] == kat[i].out[j], "vector %d word %d: %08x vs %08x", i, j, out[j], kat[i].out[j]);
  }
}

/* Element i of a draw at offset o is word i%4 of counter o + i/4 (key = seed):
   a uniform f64 draw of 10 elements equals words * 2^-32. */
TEST(draw_layout) {
  lt_generator *g;
  CHECK_OK(lt_generator_new(0x123456789ull, &g));
  lt_generator_set_state(g, 0x123456789ull, 5);
  lt_tensor *t;
  int64_t n = 10;
  CHECK_OK(lt_tensor_empty(1, &n, LT_DTYPE_F64, LT_DEVICE_CPU, &t));
  CHECK_OK(lt_tensor_uniform_(t, g, 0, 1));
  const double *v = lt_tensor_data(t);
  for (int i = 0; i < 10; i++) {
    uint64_t c = 5 + (uint64_t)i / 4;
    uint32_t ctr[4] = {(uint32_t)c, (uint32_t)(c >> 32), 0, 0}, key[2] = {0x23456789u, 0x1u}, w[4];
    lt_philox4x32_10(ctr, key, w);
    CHECK_NEAR(v[i], w[i % 4] * 0x1p-32, 0);
  }
  uint64_t seed, off;
  lt_generator_get_state(g, &seed, &off);
  CHECK(seed == 0x123456789ull);
  CHECK(off == 5 + 3); /* ceil(10 / 4) counters */
  lt_tensor_release(t);
  lt_generator_release(g);
}

RUN_TESTS()
