/*
 * test_half.c: the bf16 and f16 conversions (kernels/cpu/half.h) against
 * independent references: GCC's _Float16 (IEEE binary16, round to nearest
 * even) exhaustively for f16, and a rounding computed in f64 for bf16.
 */
#include "check.h"
#include "half.h"

#include <float.h>
#include <stdint.h>
#include <stdlib.h>

/* bf16 by the definition: the nearest of the two bf16 neighbours, ties to the
   one with an even last bit, computed on doubles. */
static uint16_t bf16_reference(float f) {
  if (f != f)
    return 0x7fc0;
  uint32_t u = lt_f32_bits(f);
  uint32_t lo = u & 0xffff0000u;
  uint32_t hi = lo + 0x10000u;
  double dlo = lt_bits_f32(lo), dhi, x = f;
  if ((hi & 0x7f800000u) == 0x7f800000u && (hi & 0x007fffffu) == 0) /* rounds up to inf */
    dhi = (u >> 31) ? -ldexp(1.0, 128) : ldexp(1.0, 128); /* where the exponent would go next */
  else
    dhi = lt_bits_f32(hi);
  if ((u & 0x7fffffffu) == 0x7f800000u)
    return (uint16_t)(u >> 16);
  double elo = fabs(x - dlo), ehi = fabs(dhi - x);
  if (elo < ehi || (elo == ehi && ((lo >> 16) & 1) == 0))
    return (uint16_t)(lo >> 16);
  return (uint16_t)(hi >> 16);
}

TEST(f16_to_f32_all_65536) {
  for (uint32_t h = 0; h < 65536; h++) {
    _Float16 ref;
    uint16_t hh = (uint16_t)h;
    memcpy(&ref, &hh, 2);
    float want = (float)ref, got = lt_f16_to_f32(hh);
    if (want != want)
      CHECK_MSG(got != got, "h=%04x", h);
    else
      CHECK_MSG(lt_f32_bits(got) == lt_f32_bits(want), "h=%04x got %g want %g", h, got, want);
  }
}

TEST(f32_to_f16_matches_float16) {
  /* every f16 value, every midpoint between neighbours and points around it */
  for (uint32_t h = 0; h < 0x7c00; h++) {
    float a = lt_f16_to_f32((uint16_t)h), b = lt_f16_to_f32((uint16_t)(h + 1));
    float mids[5] = {a, (a + b) / 2, nextafterf((a + b) / 2, 0), nextafterf((a + b) / 2, 1e9f), b};
    for (int k = 0; k < 5; k++)
      for (int s = 0; s < 2; s++) {
        float x = s ? -mids[k] : mids[k];
        _Float16 ref = (_Float16)x;
        uint16_t want;
        memcpy(&want, &ref, 2);
        CHECK_MSG(lt_f32_to_f16(x) == want, "x=%.9g got %04x want %04x", x, lt_f32_to_f16(x), want);
      }
  }
  float specials[] = {INFINITY, -INFINITY, 65504.0f, 65519.99f, 65520.0f, 1e10f, 1e-10f, 0x1p-25f, 0x1p-24f};
  for (size_t i = 0; i < sizeof specials / sizeof specials[0]; i++) {
    _Float16 ref = (_Float16)specials[i];
    uint16_t want;
    memcpy(&want, &ref, 2);
    CHECK_MSG(lt_f32_to_f16(specials[i]) == want, "x=%g", specials[i]);
  }
  CHECK(lt_f16_to_f32(lt_f32_to_f16(NAN)) != lt_f16_to_f32(lt_f32_to_f16(NAN)));
}

TEST(bf16_round_trip_and_rounding) {
  srand(7);
  for (int i = 0; i < 2000000; i++) {
    uint32_t u = ((uint32_t)rand() << 16) ^ (uint32_t)rand() ^ ((uint32_t)rand() << 31);
    float f = lt_bits_f32(u);
    uint16_t got = lt_f32_to_bf16(f);
    if (f != f) {
      CHECK_MSG(lt_bf16_to_f32(got) != lt_bf16_to_f32(got), "NaN %08x lost", u);
      continue;
    }
    CHECK_MSG(got == bf16_reference(f), "u=%08x got %04x want %04x", u, got, bf16_reference(f));
  }
  for (uint32_t h = 0; h < 65536; h++) { /* every bf16 survives a round trip */
    float f = lt_bf16_to_f32((uint16_t)h);
    if (f == f)
      CHECK_MSG(lt_f32_to_bf16(f) == h, "h=%04x", h);
  }
  CHECK(lt_f32_to_bf16(1.0f + 0x1p-8f) == 0x3f80);       /* tie to even: stays 1 */
  CHECK(lt_f32_to_bf16(1.0f + 3 * 0x1p-8f) == 0x3f82);   /* tie to even: up */
  CHECK(lt_f32_to_bf16(INFINITY) == 0x7f80);
  CHECK(lt_f32_to_bf16(-INFINITY) == 0xff80);
  CHECK(lt_f32_to_bf16(3.4028235e38f) == 0x7f80);         /* FLT_MAX rounds to inf */
}

RUN_TESTS()
