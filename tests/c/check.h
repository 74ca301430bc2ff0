/*
 * check.h: a minimal C test harness. TEST(name) defines a test; CHECK*
 * record failures with file and line and keep going; RUN_TESTS() runs them
 * and prints one "<file>: N passed, M failed" line that tests/run.sh sums.
 */
#ifndef LUTRA_CHECK_H
#define LUTRA_CHECK_H

#include <math.h>
#include <stdio.h>
#include <string.h>

typedef void (*check_fn)(void);
static struct {
  const char *name;
  check_fn fn;
} check_tests[256];
static int check_ntests, check_failures_in_test;

#define TEST(tname)                                                            \
  static void test_##tname(void);                                              \
  __attribute__((constructor)) static void register_##tname(void) {           \
    check_tests[check_ntests].name = #tname;                                   \
    check_tests[check_ntests++].fn = test_##tname;                             \
  }                                                                            \
  static void test_##tname(void)

#define CHECK(cond)                                                                  \
  do {                                                                               \
    if (!(cond)) {                                                                   \
      if (check_failures_in_test++ < 5)                                              \
        fprintf(stderr, "  %s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);  \
    }                                                                                \
  } while (0)

#define CHECK_MSG(cond, ...)                                                         \
  do {                                                                               \
    if (!(cond)) {                                                                   \
      if (check_failures_in_test++ < 5) {                                            \
        fprintf(stderr, "  %s:%d: check failed: %s: ", __FILE__, __LINE__, #cond);  \
        fprintf(stderr, __VA_ARGS__);                                                \
        fprintf(stderr, "\n");                                                       \
      }                                                                              \
    }                                                                                \
  } while (0)

#define CHECK_NEAR(a, b, tol) \
  CHECK_MSG(fabs((double)(a) - (double)(b)) <= (tol), "%.17g vs %.17g", (double)(a), (double)(b))

/* A call that must succeed (LT_OK); prints lt_last_error() otherwise. */
#define CHECK_OK(call) CHECK_MSG((call) == LT_OK, "%s", lt_last_error())

static int check_run_all(const char *file) {
  int passed = 0, failed = 0;
  for (int i = 0; i < check_ntests; i++) {
    check_failures_in_test = 0;
    check_tests[i].fn();
    if (check_failures_in_test) {
      fprintf(stderr, "FAIL %s (%d checks)\n", check_tests[i].name, check_failures_in_test);
      failed++;
    } else {
      passed++;
    }
  }
  printf("%s: %d passed, %d failed\n", file, passed, failed);
  return failed ? 1 : 0;
}

#define RUN_TESTS() \
  int main(void) { return check_run_all(__FILE__); }

#endif
