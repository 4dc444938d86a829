/* test_failures.c - a rank that stops must make the others return a
 * timeout that names it, within the timeout, never hang: as a thread that
 * goes silent and as a process that is killed. And the wire and memory
 * claims of docs/api.md, counted by the library itself. */
#include <stdio.h>
#include <string.h>

#include "mc_layout.h"
#include "mc_ref_run.h"
#include "mc_test.h"

/* A rank that stops before dispatch of round 3 (a silent thread, or a process
 * killed with SIGKILL): every other rank must return MC_ERR_TIMEOUT within
 * the timeout, naming that rank and the round, and its handle must then
 * refuse further work with MC_ERR_ABORTED; the harness names the killed
 * process's signal. Shared with the GPU tests. */
void mc_test_stall_setup(uint64_t seed, int world, int stalled, int timeout_ms, mc_case_t *c, mc_run_opts_t *o) {
  mc_ref_random_case(seed, c);
  c->world_size = world;
  c->group_size = 1;
  c->num_experts = 16;
  c->topk = 4;
  c->max_tokens = 8;
  c->hidden = c->hidden > 256 ? 256 : c->hidden;
  *o = (mc_run_opts_t)MC_RUN_OPTS_DEFAULT;
  o->rounds = 4;
  o->timeout_ms = timeout_ms;
  o->stall_rank = stalled;
  o->stall_round = 2;
}

int mc_test_check_stall(mc_transport_t transport, int processes, int timeout_ms, int world) {
  const int stalled = world / 2;
  mc_case_t c;
  mc_run_opts_t o;
  mc_test_stall_setup(mc_test_seed, world, stalled, timeout_ms, &c, &o);
  o.processes = processes;
  o.transport = transport;
  mc_run_result_t res;
  int failed = mc_run(&c, &o, &res);
  MC_CHECK(failed >= world - 1);
  char waiting[40];
  snprintf(waiting, sizeof waiting, "waiting for rank %d", stalled);
  for (int r = 0; r < world; r++) {
    if (r == stalled) continue;
    const mc_run_rank_t *me = &res.ranks[r];
    fprintf(stderr, "rank %d: %s\n", r, me->msg);
    MC_CHECK_MSG(me->failed && me->api_rc == MC_ERR_TIMEOUT, "rank %d: %s", r, me->msg);
    MC_CHECK_MSG(strstr(me->msg, waiting) != NULL, "rank %d: %s", r, me->msg);
    MC_CHECK_MSG(strstr(me->msg, "round 3") != NULL, "rank %d: %s", r, me->msg); /* the stalled round */
    char missing[64]; /* a killed process: named as the one missing (its pid is gone) */
    snprintf(missing, sizeof missing, "rank %d is the one missing", stalled);
    MC_CHECK_MSG(!processes || (strstr(me->msg, missing) != NULL && mc_test_blames_only(me->msg, stalled)),
                 "rank %d: %s", r, me->msg);
    MC_CHECK_MSG(me->rc_after_timeout == MC_ERR_ABORTED, "rank %d: next call gave %s", r,
                 mc_result_string((mc_result_t)me->rc_after_timeout));
  }
  MC_CHECK_MSG(!processes || strstr(res.ranks[stalled].msg, "killed by signal 9 (SIGKILL"), "rank %d: %s", stalled,
               res.ranks[stalled].msg);
  mc_run_free(&res);
  return 0;
}

/* A silent thread cannot be told from a slow one: the others wait out the
 * timeout, which must outlast any lag between the live threads (a round of
 * this small case); a killed process is seen at once, and the timeout only
 * bounds waits for the live ones. */
int test_stall_thread(void) { return mc_test_check_stall(MC_TRANSPORT_CPU, 0, 2000, 4); }
int test_stall_process(void) { return mc_test_check_stall(MC_TRANSPORT_CPU, 1, MC_TEST_LIVE_MS, 4); }

int test_wire_bytes(void) {
  /* Tokens whose top-8 sit on one or two ranks: one record per (token, rank),
   * so far fewer than one per (token, expert), and the same for combine rows. */
  mc_case_t c;
  mc_ref_random_case(mc_test_seed, &c);
  c.world_size = 4;
  c.group_size = 1;
  c.num_experts = 64; /* 16 per rank */
  c.topk = 8;
  c.max_tokens = 32;
  c.routing = MC_ROUTING_ONE_EXPERT; /* experts hot..hot+7: one or two ranks */
  c.zero_tokens = 0;
  c.use_bound_m = 0;
  mc_run_opts_t o = MC_RUN_OPTS_DEFAULT;
  o.rounds = 3;
  mc_run_result_t res;
  MC_CHECK(mc_run(&c, &o, &res) == 0);
  uint64_t recs = 0, rows = 0, want = 0;
  for (int r = 0; r < 4; r++) {
    recs += res.ranks[r].stats.dispatch_records_sent;
    rows += res.ranks[r].stats.combine_rows_sent;
    want += res.ranks[r].expected_records;
  }
  mc_run_free(&res);
  uint64_t per_expert_max = 3ull * 4 * 32 * 8; /* rounds x groups x tokens x topk */
  fprintf(stderr, "records %llu (reference %llu), combine rows %llu, per-expert design at most %llu\n",
          (unsigned long long)recs, (unsigned long long)want, (unsigned long long)rows,
          (unsigned long long)per_expert_max);
  MC_CHECK(recs == want);
  MC_CHECK(rows == recs); /* group_size 1: one row back per record */
  MC_CHECK(recs <= 2 * per_expert_max / 8); /* 8 consecutive experts span at most 2 ranks */
  return 0;
}

/* The kernels' divisions by a handle's divisors (mc_fdiv), for every d up
 * to 4096 and then d growing by half up to 2^20: n / d for every n below
 * 4096 (d <= 4096), at and around k d for k = 1, 3, 7, 15 ... below 2^31,
 * at random n and at n = 2^31 - 1. */
int test_layout_division(void) {
  uint64_t x = 0x9e3779b97f4a7c15ull; /* a fixed stream: every run checks the same values */
  for (uint32_t d = 1; d <= (1u << 20); d = d < 4096 ? d + 1 : d * 3 / 2) {
    const mc_fdiv_t f = mc_fdiv_make(d);
    for (int n = 0; n < 4096 && d <= 4096; n++)
      if ((uint32_t)mc_fdiv(n, f) != (uint32_t)n / d) {
        fprintf(stderr, "mc_fdiv(%d, %u) = %d\n", n, d, mc_fdiv(n, f));
        MC_CHECK(0);
      }
    for (uint64_t k = 1; k * d < (1ull << 31); k = k * 2 + 1)
      for (int e = -1; e <= 1; e++) {
        const uint64_t n = k * d + (uint64_t)(int64_t)e;
        if (n < (1ull << 31) && (uint32_t)mc_fdiv((int)n, f) != (uint32_t)(n / d)) {
          fprintf(stderr, "mc_fdiv(%llu, %u) = %d\n", (unsigned long long)n, d, mc_fdiv((int)n, f));
          MC_CHECK(0);
        }
      }
    for (int r = 0; r < 64; r++) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      const int n = (int)(x >> 33);
      MC_CHECK((uint32_t)mc_fdiv(n, f) == (uint32_t)n / d);
    }
    MC_CHECK((uint32_t)mc_fdiv(0x7fffffff, f) == 0x7fffffffu / d);
  }
  return 0;
}

int test_buffer_memory(void) {
  /* Receive buffers grow with num_groups x max_tokens and world_size x
   * max_tokens x hidden, never with num_experts x max_tokens x hidden. */
  const mc_shape_t a = mc_shape_make(8, 1, 256, 8, 128, 7168, 7168, 224, 2, 0, 1);
  const mc_shape_t more_experts = mc_shape_make(8, 1, 1024, 8, 128, 7168, 7168, 224, 2, 0, 1);
  const mc_shape_t more_tokens = mc_shape_make(8, 1, 256, 8, 256, 7168, 7168, 224, 2, 0, 1);
  const mc_shape_t grouped = mc_shape_make(8, 2, 256, 8, 128, 7168, 7168, 224, 2, 0, 1);
  uint64_t base = mc_window_bytes(&a);
  fprintf(stderr, "window bytes at EP8 DeepSeek-V3, 128 tokens: %llu (%.1f MiB)\n", (unsigned long long)base,
          (double)base / 1048576.0);
  /* 4x the experts adds only the per-expert counts of the meta */
  MC_CHECK(mc_window_bytes(&more_experts) - base <= (uint64_t)8 * 1024 * sizeof(uint64_t) * 2);
  /* 2x the tokens: about 2x the bytes */
  MC_CHECK(mc_window_bytes(&more_tokens) > base * 19 / 10 && mc_window_bytes(&more_tokens) < base * 21 / 10);
  /* two ranks per group share the sending: the dispatch staging halves */
  MC_CHECK(mc_window_bytes(&grouped) < base);
  /* the target: at most 64 MiB per rank (a buffer per (expert, token), as
   * pplx-kernels lays them out, takes 679 MiB here: docs/benchmarks.md) */
  MC_CHECK(base + mc_workspace_bytes(&a) <= 64ull << 20);
  /* and the handle reports what it allocated */
  mc_oob_threads_t *g;
  MC_CHECK_OK(mc_oob_threads_create(1, 1000, &g));
  mc_oob_t oob;
  MC_CHECK_OK(mc_oob_threads_get(g, 0, &oob));
  mc_comm_config_t cc = MC_COMM_CONFIG_INITIALIZER;
  mc_comm_t *comm;
  MC_CHECK_OK(mc_comm_create(&oob, &cc, &comm));
  mc_a2a_config_t ac = MC_A2A_CONFIG_INITIALIZER;
  ac.max_tokens = 128;
  ac.num_experts = 256;
  ac.experts_per_token = 8;
  ac.token_bytes = 7168;
  ac.scale_bytes = 224;
  ac.hidden = 7168;
  mc_a2a_t *a2a;
  MC_CHECK_OK(mc_a2a_create(comm, &ac, &a2a));
  mc_a2a_stats_t st = {.size = sizeof st};
  MC_CHECK_OK(mc_a2a_get_stats(a2a, &st));
  mc_shape_t one = mc_shape_make(1, 1, 256, 8, 128, 7168, 7168, 224, 2, 0, 1);
  MC_CHECK(st.buffer_bytes == mc_window_bytes(&one) + mc_workspace_bytes(&one));
  MC_CHECK_OK(mc_a2a_destroy(a2a));
  MC_CHECK_OK(mc_comm_destroy(comm));
  mc_oob_threads_destroy(g);
  return 0;
}
