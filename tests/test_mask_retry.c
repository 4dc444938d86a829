/* test_mask_retry.c - a mask call that timed out, called again while its
 * peer is late: the two ranks must still meet, and keep meeting later.
 *
 * Two ranks as processes, T the comm's timeout (a mask call waits up to
 * 2T). After a barrier that lines them up in time, with nothing masked:
 * 1. rank 0 calls, times out at 2T and calls again at once; rank 1 makes
 *    its first call at 2.5T, into rank 0's second attempt;
 * 2. rank 0 calls, times out at 2T and calls again at 3T; rank 1 calls at
 *    2.5T, meets rank 0's first attempt (stale by then: rank 0 has left
 *    it) and must be taken into the second.
 * Then both make three mask calls and three barriers back to back: every
 * one must pass on both ranks. Before the pair's attempts were numbered
 * together, the first retry left the two counts one apart for good. The
 * same steps run on the cpu transport and on a GPU (p2p). */
#include <sched.h>
#include <stdio.h>

#include "mc_ref_dev.h"
#include "mc_test.h"
#include "mc_test_procs.h"

/* One scenario; rank 0's retry comes retry_at ms after the barrier, rank 1's
 * only call at late ms. */
static mc_result_t meet_late(mc_a2a_t *a2a, int rank, int gpu, int timeout_ms, int retry_at, int late, char *msg,
                             size_t len) {
  static const uint8_t none[2] = {0, 0};
  mc_result_t rc = mc_test_barrier_done(a2a, gpu);
  if (rc != MC_SUCCESS) return rc;
  const int64_t t0 = mc_proc_now_ms();
  if (rank == 1) {
    mc_proc_sleep_ms(late);
    return mc_a2a_mask_ranks(a2a, none);
  }
  rc = mc_a2a_mask_ranks(a2a, none);
  if (rc != MC_ERR_TIMEOUT) {
    snprintf(msg, len, "the first call, with rank 1 %d ms away, returned %s (%s)", late, mc_result_string(rc),
             mc_a2a_last_error(a2a));
    return MC_ERR_INTERNAL;
  }
  const int64_t waited = mc_proc_now_ms() - t0;
  if (waited < 2 * timeout_ms - 50 || waited >= late) {
    snprintf(msg, len, "the first call timed out after %lld ms, not 2 x %d", (long long)waited, timeout_ms);
    return MC_ERR_INTERNAL;
  }
  const int64_t left = retry_at - (mc_proc_now_ms() - t0);
  if (left > 0) mc_proc_sleep_ms((int)left);
  return mc_a2a_mask_ranks(a2a, none);
}

static mc_result_t retry_steps(mc_comm_t *comm, int rank, int gpu, int T, char *msg, size_t len) {
  mc_a2a_config_t ac = mc_test_small_config();
  ac.num_experts = 2;
  ac.experts_per_token = 1;
  mc_a2a_t *a2a = NULL;
  mc_result_t rc = mc_a2a_create(comm, &ac, &a2a);
  static const uint8_t none[2] = {0, 0};
  if (rc == MC_SUCCESS) rc = meet_late(a2a, rank, gpu, T, 2 * T, 5 * T / 2, msg, len);
  if (rc == MC_SUCCESS) rc = meet_late(a2a, rank, gpu, T, 3 * T, 5 * T / 2, msg, len);
  for (int i = 0; i < 3 && rc == MC_SUCCESS; i++)
    if ((rc = mc_a2a_mask_ranks(a2a, none)) == MC_SUCCESS) rc = mc_test_barrier_done(a2a, gpu);
  if (rc != MC_SUCCESS && rc != MC_ERR_INTERNAL)
    snprintf(msg, len, "%s", a2a ? mc_a2a_last_error(a2a) : mc_last_error());
  if (a2a) mc_a2a_destroy(a2a);
  return rc;
}

/* Both ranks on one core, taking turns whenever a wait yields: a rank that
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
  if (!c->mode) share_one_core();
  mc_oob_socket_t *s = NULL;
  mc_oob_t oob;
  mc_comm_t *comm = NULL;
  mc_comm_config_t cc = MC_COMM_CONFIG_INITIALIZER;
  cc.transport = c->mode ? MC_TRANSPORT_P2P : MC_TRANSPORT_CPU;
  cc.timeout_ms = c->timeout_ms;
  if (c->mode && (cc.device = mc_dev_select(p)) < 0) return 2;
  char msg[512] = "";
  if (mc_oob_socket_create(&c->id, p, c->world, 20000, &s) != MC_SUCCESS || mc_oob_socket_get(s, &oob) != MC_SUCCESS ||
      mc_comm_create(&oob, &cc, &comm) != MC_SUCCESS) {
    fprintf(stderr, "rank %d: setup: %s\n", p, mc_last_error());
    return 2;
  }
  mc_result_t rc = retry_steps(comm, p, c->mode, c->timeout_ms, msg, sizeof msg);
  fprintf(stderr, "rank %d: %s %s\n", p, mc_result_string(rc), msg);
  mc_comm_destroy(comm);
  mc_oob_socket_destroy(s);
  return rc == MC_SUCCESS ? 0 : 1;
}

static int run_retry(int gpu, int timeout_ms) {
  mc_proc_ctx_t c;
  mc_proc_world(&c, 2, timeout_ms);
  c.mode = gpu;
  if (mc_unique_id_create(&c.id) != MC_SUCCESS) return -1;
  int codes[2];
  MC_CHECK(mc_proc_run(&c, retry_child, 60000, codes) == 0);
  for (int r = 0; r < 2; r++) MC_CHECK_MSG(codes[r] == 0, "rank %d ended with %d", r, codes[r]);
  return 0;
}

int test_mask_retry(void) { return run_retry(0, 500); }

int test_gpu_mask_retry(void) {
  if (!mc_proc_cuda_seen()) {
    printf("skipped: no CUDA device visible, or this build has no GPU transport\n");
    return 77;
  }
  return run_retry(1, 1000);
}
