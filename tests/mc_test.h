/* mc_test.h - the smallest test harness that does the job: tests are plain
 * functions `int test_NAME(void)` returning 0 on success, listed once in
 * test_list.h; the runner runs one by name in its own process (CTest adds
 * one entry per name, with a timeout). Checks print file, line, the seed of
 * the run and the failed expression, then make the test return 1. */
#ifndef MC_TEST_H
#define MC_TEST_H

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "moecomm.h"
#include "moecomm_bench.h"

/* The seed of this run: MC_SEED from the environment, else drawn from the
 * clock and pid at start. Printed on every failure so a run can be replayed. */
extern uint64_t mc_test_seed;

#define MC_CHECK(cond)                                                                   \
  do {                                                                                   \
    if (!(cond)) {                                                                       \
      fprintf(stderr, "%s:%d: check failed: %s (MC_SEED=%" PRIu64 ")\n", __FILE__,       \
              __LINE__, #cond, mc_test_seed);                                            \
      return 1;                                                                          \
    }                                                                                    \
  } while (0)

#define MC_CHECK_MSG(cond, ...)                                                          \
  do {                                                                                   \
    if (!(cond)) {                                                                       \
      fprintf(stderr, "%s:%d: check failed: %s (MC_SEED=%" PRIu64 "): ", __FILE__,       \
              __LINE__, #cond, mc_test_seed);                                            \
      fprintf(stderr, __VA_ARGS__);                                                      \
      fputc('\n', stderr);                                                               \
      return 1;                                                                          \
    }                                                                                    \
  } while (0)

/* A call that must return `want`. */
#define MC_CHECK_RC(call, want)                                                          \
  do {                                                                                   \
    mc_result_t rc_ = (call);                                                            \
    if (rc_ != (want)) {                                                                 \
      fprintf(stderr, "%s:%d: %s returned %s, wanted %s (MC_SEED=%" PRIu64 ")\n",        \
              __FILE__, __LINE__, #call, mc_result_string(rc_), mc_result_string(want),  \
              mc_test_seed);                                                             \
      return 1;                                                                          \
    }                                                                                    \
  } while (0)

#define MC_CHECK_OK(call) MC_CHECK_RC(call, MC_SUCCESS)

/* Declarations of every test function. */
#define MC_TEST(name) int test_##name(void);
#include "test_list.h"
#undef MC_TEST

/* The timeout of a wait that only live ranks end: far longer than a slow
 * machine makes any step of a test, and never waited out by a test that
 * passes (a rank that must miss a wait is dead, stopped or never comes;
 * a dead process is seen at once, by its connection or its pid). */
#define MC_TEST_LIVE_MS 30000

/* test_failures.c: the small case of the stall tests (world ranks, 16
 * experts, top-4, 8 tokens) and the options that run it for 4 rounds on
 * the cpu transport, rank `stalled` stopping before dispatch of round 3. */
struct mc_case;
struct mc_run_opts;
void mc_test_stall_setup(uint64_t seed, int world, int stalled, int timeout_ms, struct mc_case *c,
                         struct mc_run_opts *o);
/* test_protocol.c: run a case (mc_run) and fail with the first rank's
 * message and the case (mc_ref_describe). */
int mc_test_run_case(const struct mc_case *c, const struct mc_run_opts *o);
/* A stalled rank (world / 2) makes the other world - 1 time out (test_failures.c;
 * the GPU tests use it too). */
int mc_test_check_stall(mc_transport_t transport, int processes, int timeout_ms, int world);
/* test_mask.c: ranks as processes, rank `dead` killed in a round drawn from
 * the seed (in_combine: between its dispatch and its combine); the others
 * mask it and run `rounds` checked rounds. Shared with the GPU tests. */
int mc_test_run_masked(mc_transport_t transport, int world, int dead, int in_combine, int rounds, uint64_t seed,
                       int layout);
/* test_hardening.c: a small config (4 tokens, 4 experts, top-2, fp32
 * combine), and mc_a2a_barrier with its outcome (on a GPU the barrier is a
 * kernel: its failure shows once the stream is done). */
mc_a2a_config_t mc_test_small_config(void);
mc_result_t mc_test_barrier_done(mc_a2a_t *a2a, int gpu);

/* test_blame.c: whether a failure's text puts the failure on rank `dead`
 * and on no other rank: every phrase that blames a rank ("rank 3 is the one
 * missing", "rank 3 closed its connection", "rank(s) 3 did not come", ...)
 * names dead alone, and there is at least one. */
int mc_test_blames_only(const char *msg, int dead);

/* Deterministic 64-bit generator (splitmix64) for tests and the reference. */
static inline uint64_t mc_test_rand(uint64_t *state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
/* Uniform in [lo, hi]. */
static inline int mc_test_range(uint64_t *state, int lo, int hi) {
  return lo + (int)(mc_test_rand(state) % (uint64_t)(hi - lo + 1));
}

#endif
