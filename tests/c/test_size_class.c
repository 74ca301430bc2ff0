/*
 * test_size_class.c: the caching allocators' size classes
 * (base/size-class.h): multiples of the step up to the limit, then four
 * classes in each (2^p, 2^(p+1)], so a block wastes under a quarter of its
 * size; a rounded size maps to its own class, and classes are distinct.
 */
#include "check.h"
#include "base/size-class.h"

TEST(small_sizes_round_to_the_step) {
  size_t r;
  CHECK(lt_size_class(1, 64, 4096, &r) == 0 && r == 64);
  CHECK(lt_size_class(64, 64, 4096, &r) == 0 && r == 64);
  CHECK(lt_size_class(65, 64, 4096, &r) == 1 && r == 128);
  CHECK(lt_size_class(4096, 64, 4096, &r) == 63 && r == 4096);
}

TEST(large_sizes_take_four_classes_a_power_of_two) {
  size_t r;
  int k = lt_size_class(4097, 64, 4096, &r);
  CHECK_MSG(k == 64 && r == 5120, "k %d r %zu", k, r);
  CHECK(lt_size_class(6144, 64, 4096, &r) == 65 && r == 6144);
  CHECK(lt_size_class(8192, 64, 4096, &r) == 67 && r == 8192);
  CHECK(lt_size_class(8193, 64, 4096, &r) == 68 && r == 10240);
  CHECK(lt_size_class(((size_t)1 << 20) + 1, 64, 4096, &r) >= 0 && r == ((size_t)1 << 20) + ((size_t)1 << 18));
}

TEST(every_size_fits_its_class_with_under_a_quarter_wasted) {
  int last = -1;
  size_t last_r = 0;
  for (size_t n = 1; n <= ((size_t)1 << 22); n += (n < 65536 ? 1 : 97)) {
    size_t r, r2;
    int k = lt_size_class(n, 512, 32768, &r);
    CHECK_MSG(r >= n && (n <= 32768 || (r - n) * 4 < r), "n %zu r %zu", n, r);
    CHECK_MSG(lt_size_class(r, 512, 32768, &r2) == k && r2 == r, "n %zu: r %zu maps elsewhere", n, r);
    CHECK_MSG(k >= last && (k != last || r == last_r), "n %zu: class %d after %d", n, k, last);
    CHECK_MSG(k < LT_SIZE_CLASSES(512, 32768), "n %zu: class %d", n, k);
    last = k;
    last_r = r;
  }
}

RUN_TESTS()
