/* mc_test_main.c - the test runner: `mc_tests NAME` runs one test (CTest
 * runs each in its own process with a timeout), `mc_tests --list` lists
 * them, `mc_tests` alone runs them all in this process. MC_SEED=N replays
 * a run. */
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "mc_test.h"

uint64_t mc_test_seed;

typedef struct {
  const char *name;
  int (*fn)(void);
} entry_t;

static const entry_t tests[] = {
#define MC_TEST(name) {#name, test_##name},
#include "test_list.h"
#undef MC_TEST
};
#define N_TESTS (sizeof tests / sizeof tests[0])

static int run_one(const entry_t *t) {
  printf("[ RUN  ] %s (MC_SEED=%llu)\n", t->name, (unsigned long long)mc_test_seed);
  fflush(stdout);
  int rc = t->fn();
  printf("[ %s ] %s\n", rc == 0 ? " OK " : rc == 77 ? "SKIP" : "FAIL", t->name); /* 77: skipped (CTest's SKIP_RETURN_CODE) */
  fflush(stdout);
  return rc;
}

int main(int argc, char **argv) {
  const char *s = getenv("MC_SEED");
  if (s && *s) mc_test_seed = strtoull(s, NULL, 10);
  else {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    mc_test_seed = ((uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20) ^ ((uint64_t)getpid() << 40)) % 1000000007ull;
  }
  if (argc > 1 && strcmp(argv[1], "--list") == 0) {
    for (size_t i = 0; i < N_TESTS; i++) puts(tests[i].name);
    return 0;
  }
  if (argc > 1) {
    for (size_t i = 0; i < N_TESTS; i++)
      if (strcmp(argv[1], tests[i].name) == 0) return run_one(&tests[i]);
    fprintf(stderr, "no test named '%s' (mc_tests --list)\n", argv[1]);
    return 2;
  }
  int failed = 0, skipped = 0;
  for (size_t i = 0; i < N_TESTS; i++) {
    int rc = run_one(&tests[i]);
    skipped += rc == 77;
    failed += rc != 0 && rc != 77;
  }
  printf("%zu passed, %d failed, %d skipped\n", N_TESTS - (size_t)failed - (size_t)skipped, failed, skipped);
  return failed != 0;
}
