/* test_mask_retry.c - a mask call that timed out, called again while its
 * peer is late: the two ranks must still meet, and keep meeting later.
 *
 * Two ranks as processes, T the comm's timeout (a mask call waits up to
 * 2T). After a barrier, with nothing masked, rank 1 stays away until rank
 * 0's first call has timed out (mc_proc_await on rank 0's step, so it is
 * away for sure, however slow either is), then:
 * 1. rank 0 calls again at once; rank 1 makes its first call T/4 later,
 *    into rank 0's second attempt;
 * 2. rank 0 calls again T/4 later; rank 1 calls at once, when rank 0's
 *    slot says it gave up its first attempt, and must meet the second.
 * (A loaded machine may swap the two orders; both must meet.) Then both
 * make three mask calls and three barriers back to back: every one must
 * pass on both ranks. Before the pair's attempts were numbered together,
 * the first retry left the two counts one apart for good. And a rank that
 * is masked for being late, then comes back (below). The same steps run
 * on the cpu transport and on a GPU (p2p). The only timeout waited out is
 * the one a rank that is away makes the others miss; every other wait is
 * for a live rank a call or two away. */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mc_ref_dev.h"
#include "mc_test.h"
#include "mc_test_procs.h"

/* One scenario: rank 1 calls once step `step` says rank 0's first call
 * timed out, after T/4 when rank 0 retries at once (retry_later 0), at
 * once when rank 0 retries T/4 later. */
static mc_result_t meet_late(mc_a2a_t *a2a, int rank, int gpu, int timeout_ms, int retry_later, int step, char *msg,
                             size_t len) {
  static const uint8_t none[2] = {0, 0};
  mc_result_t rc = mc_test_barrier_done(a2a, gpu);
  if (rc != MC_SUCCESS) return rc;
  if (rank == 1) {
    mc_proc_await(step, 1);
    if (!retry_later) mc_proc_sleep_ms(timeout_ms / 4);
    return mc_a2a_mask_ranks(a2a, none);
  }
  const int64_t t0 = mc_proc_now_ms();
  rc = mc_a2a_mask_ranks(a2a, none);
  const int64_t waited = mc_proc_now_ms() - t0;
  mc_proc_mark(step); /* rank 1 may come now, whatever this rank found */
  if (rc != MC_ERR_TIMEOUT) {
    snprintf(msg, len, "the first call, with rank 1 away, returned %s (%s)", mc_result_string(rc),
             mc_a2a_last_error(a2a));
    return MC_ERR_INTERNAL;
  }
  if (waited < 2 * timeout_ms - 50) { /* the library's promise, whatever the machine's speed */
    snprintf(msg, len, "the first call timed out after %lld ms, not 2 x %d", (long long)waited, timeout_ms);
    return MC_ERR_INTERNAL;
  }
  if (retry_later) mc_proc_sleep_ms(timeout_ms / 4);
  return mc_a2a_mask_ranks(a2a, none);
}

/* A handle of one expert a rank, each token to one of them. */
static mc_result_t one_expert_a_rank(mc_comm_t *comm, int world, mc_a2a_t **a2a) {
  mc_a2a_config_t ac = mc_test_small_config();
  ac.num_experts = world;
  ac.experts_per_token = 1;
  return mc_a2a_create(comm, &ac, a2a);
}

static mc_result_t retry_steps(mc_comm_t *comm, int rank, int gpu, int T, char *msg, size_t len) {
  mc_a2a_t *a2a = NULL;
  mc_result_t rc = one_expert_a_rank(comm, 2, &a2a);
  static const uint8_t none[2] = {0, 0};
  if (rc == MC_SUCCESS) rc = meet_late(a2a, rank, gpu, T, 0, 0, msg, len);
  if (rc == MC_SUCCESS) rc = meet_late(a2a, rank, gpu, T, 1, 1, msg, len);
  for (int i = 0; i < 3 && rc == MC_SUCCESS; i++)
    if ((rc = mc_a2a_mask_ranks(a2a, none)) == MC_SUCCESS) rc = mc_test_barrier_done(a2a, gpu);
  if (rc != MC_SUCCESS && rc != MC_ERR_INTERNAL)
    snprintf(msg, len, "%s", a2a ? mc_a2a_last_error(a2a) : mc_last_error());
  if (a2a) mc_a2a_destroy(a2a);
  return rc;
}

/* ---- a rank late for a mask call, masked, then back ----
 * Three ranks, T the timeout. Ranks 0 and 2 make a mask call that keeps
 * rank 1, which is away (until both have marked a step after their
 * rounds): it times out; they mask rank 1 and run two rounds without it.
 * Then all three clear the mask, rank 1 first (the others T/4 after it
 * said it calls), and again with rank 1 last (T/4 after the others); two
 * rounds with all three follow each. Before a failed call left
 * "gave up" in its peers' slots, rank 1 coming first took the failed
 * call's first step for a live one, and took in the state of before the
 * rounds it missed: the rounds after it failed. */
/* Token i of rank src goes to the expert (one a rank) of the first kept
 * rank from src + i on. */
static int kept_expert(const uint8_t *masked, int src, int i) {
  int e = (src + i) % 3;
  while (masked[e]) e = (e + 1) % 3;
  return e;
}

/* One round: every byte of a token is its sender's rank + 1, every expert
 * output 1; this rank checks how many tokens its expert got, the sum of
 * their first bytes, and that each combined value is 1. */
static mc_result_t checked_round(mc_a2a_t *a2a, int rank, int gpu, const uint8_t *masked, char *msg, size_t len) {
  enum { W = 3, M = 2, H = 32 };
  const int cap = mc_a2a_expert_capacity(a2a);
  int32_t idx[M], count = -1, expect = 0, senders = 0;
  float w[M] = {1.0f, 1.0f}, out[M * H];
  unsigned char tok[M * 64];
  for (int i = 0; i < M; i++) idx[i] = kept_expert(masked, rank, i);
  for (int src = 0; src < W; src++)
    for (int i = 0; i < M && !masked[src]; i++)
      if (kept_expert(masked, src, i) == rank) expect++, senders += src + 1;
  memset(tok, rank + 1, sizeof tok);
  unsigned char *x = malloc((size_t)cap * 64);
  float *y = malloc(sizeof(float) * (size_t)cap * H);
  for (int i = 0; i < cap * H; i++) y[i] = 1.0f;
  void *d_tok = mc_dev_alloc(gpu, sizeof tok), *d_idx = mc_dev_alloc(gpu, sizeof idx), *d_w = mc_dev_alloc(gpu, sizeof w);
  void *d_x = mc_dev_alloc(gpu, (size_t)cap * 64), *d_cnt = mc_dev_alloc(gpu, sizeof count);
  void *d_y = mc_dev_alloc(gpu, sizeof(float) * (size_t)cap * H), *d_out = mc_dev_alloc(gpu, sizeof out);
  mc_result_t rc = MC_ERR_INTERNAL;
  if (y && x && d_tok && d_idx && d_w && d_x && d_cnt && d_y && d_out && !mc_dev_put(gpu, d_tok, tok, sizeof tok) &&
      !mc_dev_put(gpu, d_idx, idx, sizeof idx) && !mc_dev_put(gpu, d_w, w, sizeof w) &&
      !mc_dev_put(gpu, d_y, y, sizeof(float) * (size_t)cap * H) && !mc_dev_fill(gpu, d_out, 0xff, sizeof out)) {
    void *st = gpu ? mc_dev_stream() : NULL;
    rc = mc_dispatch(a2a, d_tok, NULL, d_idx, d_w, M, NULL, d_x, NULL, d_cnt, MC_SEND_RECV, st);
    if (rc == MC_SUCCESS) rc = mc_combine(a2a, d_y, d_out, MC_SEND_RECV, st);
    if (rc == MC_SUCCESS && gpu) rc = mc_dev_sync(1) == 0 ? mc_a2a_check(a2a) : MC_ERR_CUDA;
    if (rc != MC_SUCCESS) snprintf(msg, len, "round: %s", mc_a2a_last_error(a2a));
    if (rc == MC_SUCCESS && (mc_dev_get(gpu, &count, d_cnt, sizeof count) || mc_dev_get(gpu, out, d_out, sizeof out) ||
                             mc_dev_get(gpu, x, d_x, (size_t)cap * 64)))
      rc = MC_ERR_CUDA;
    int got = 0;
    for (int j = 0; rc == MC_SUCCESS && j < count && j < cap; j++) got += x[(size_t)j * 64];
    for (int i = 0; rc == MC_SUCCESS && i < M * H; i++)
      if (count != expect || got != senders || out[i] != 1.0f) {
        snprintf(msg, len,
                 "round: %d tokens for this rank's expert (expected %d), their senders summing to %d (expected %d), "
                 "out[%d] = %g (expected 1)",
                 count, expect, got, senders, i, out[i]);
        rc = MC_ERR_INTERNAL;
      }
  }
  free(y);
  free(x);
  void *all[] = {d_tok, d_idx, d_w, d_x, d_cnt, d_y, d_out};
  for (int i = 0; i < 7; i++) mc_dev_free(gpu, all[i]);
  return rc;
}

static mc_result_t rejoin_steps(mc_comm_t *comm, int rank, int gpu, int T, char *msg, size_t len) {
  mc_a2a_t *a2a = NULL;
  mc_result_t rc = one_expert_a_rank(comm, 3, &a2a);
  static const uint8_t none[3] = {0, 0, 0}, without1[3] = {0, 1, 0};
  for (int late_first = 1; late_first >= 0 && rc == MC_SUCCESS; late_first--) {
    const int done = late_first ? 0 : 2, calls = done + 1; /* steps: ranks 0, 2 done; rank 1 calls */
    if ((rc = mc_test_barrier_done(a2a, gpu)) != MC_SUCCESS) break;
    if (rank != 1) {
      if ((rc = mc_a2a_mask_ranks(a2a, none)) != MC_ERR_TIMEOUT) {
        snprintf(msg, len, "a mask call with rank 1 away returned %s", mc_result_string(rc));
        rc = MC_ERR_INTERNAL;
      } else {
        rc = mc_a2a_mask_ranks(a2a, without1);
      }
      for (int i = 0; i < 2 && rc == MC_SUCCESS; i++) rc = checked_round(a2a, rank, gpu, without1, msg, len);
      mc_proc_mark(done); /* rank 1 may come now, whatever this rank found */
      if (rc != MC_SUCCESS) break;
      if (late_first) {
        mc_proc_await(calls, 1);
        mc_proc_sleep_ms(T / 4);
      }
    } else {
      mc_proc_await(done, 2);
      if (!late_first) mc_proc_sleep_ms(T / 4);
      mc_proc_mark(calls);
    }
    rc = mc_a2a_mask_ranks(a2a, none);
    for (int i = 0; i < 2 && rc == MC_SUCCESS; i++) rc = checked_round(a2a, rank, gpu, none, msg, len);
  }
  if (rc != MC_SUCCESS && !*msg) snprintf(msg, len, "%s", a2a ? mc_a2a_last_error(a2a) : mc_last_error());
  if (a2a) mc_a2a_destroy(a2a);
  return rc;
}

/* The ranks on one core, taking turns whenever a wait yields: a rank that
 * signals and yields lets its peer leave the call and start its next one
 * before it reads again (a race the cpu transport must survive; with a
 * core each it shows only under load). */
static void share_one_core(void) {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) != 0) return;
  for (int i = 0; i < CPU_SETSIZE; i++)
    if (CPU_ISSET(i, &set)) {
      CPU_ZERO(&set);
      CPU_SET(i, &set);
      (void)sched_setaffinity(0, sizeof set, &set);
      return;
    }
}

static int retry_child(const mc_proc_ctx_t *c, int p) {
  if (!(c->mode & 1)) share_one_core();
  mc_oob_socket_t *s = NULL;
  mc_oob_t oob;
  mc_comm_t *comm = NULL;
  mc_comm_config_t cc = MC_COMM_CONFIG_INITIALIZER;
  cc.transport = c->mode & 1 ? MC_TRANSPORT_P2P : MC_TRANSPORT_CPU;
  cc.timeout_ms = c->timeout_ms;
  if ((c->mode & 1) && (cc.device = mc_dev_select(p)) < 0) return 2;
  char msg[512] = "";
  if (mc_oob_socket_create(&c->id, p, c->world, 20000, &s) != MC_SUCCESS || mc_oob_socket_get(s, &oob) != MC_SUCCESS ||
      mc_comm_create(&oob, &cc, &comm) != MC_SUCCESS) {
    fprintf(stderr, "rank %d: setup: %s\n", p, mc_last_error());
    return 2;
  }
  const int gpu = c->mode & 1;
  mc_result_t rc = c->mode & 2 ? rejoin_steps(comm, p, gpu, c->timeout_ms, msg, sizeof msg)
                               : retry_steps(comm, p, gpu, c->timeout_ms, msg, sizeof msg);
  fprintf(stderr, "rank %d: %s %s\n", p, mc_result_string(rc), msg);
  mc_comm_destroy(comm);
  mc_oob_socket_destroy(s);
  return rc == MC_SUCCESS ? 0 : 1;
}

/* mode: 1 on a GPU, 2 the rejoin scenario (three ranks) */
static int run_retry(int mode, int timeout_ms) {
  const int world = mode & 2 ? 3 : 2;
  mc_proc_ctx_t c;
  mc_proc_world(&c, world, timeout_ms);
  c.mode = mode;
  if (mc_unique_id_create(&c.id) != MC_SUCCESS) return -1;
  int codes[3];
  MC_CHECK(mc_proc_run(&c, retry_child, 90000, codes) == 0);
  for (int r = 0; r < world; r++) MC_CHECK_MSG(codes[r] == 0, "rank %d ended with %d", r, codes[r]);
  return 0;
}

/* T = 1000 ms: each live rank is a call away from its peer, which waits up
 * to 2T for it (T/4 of that spent on purpose) */
int test_mask_retry(void) { return run_retry(0, 1000) || run_retry(2, 1000); }

int test_gpu_mask_retry(void) {
  if (!mc_proc_cuda_seen()) {
    printf("skipped: no CUDA device visible, or this build has no GPU transport\n");
    return 77;
  }
  return run_retry(1, 1000) || run_retry(3, 1000);
}
