/* test_hardening.c - careless and unlucky use on the cpu transport: a
 * window larger than the memory left, handles used after destroy, a rank
 * that destroys early while a peer thread still writes into its window,
 * the first failure's text kept after an abort, configs and group inputs
 * that disagree, a config one rank refuses (its peers fail naming it, and
 * retries meet), barrier counts lined up again when a rank rejoins (also
 * on a GPU, ranks as processes over p2p), and a timeout that names the dead
 * rank at the root. */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "mc_ref_dev.h"
#include "mc_test.h"
#include "mc_test_procs.h"

/* A few ranks as threads, each running `body(rank, comm)` on a fresh
 * communicator; the results in rc[] and texts in msg[]. */
typedef struct trun {
  int world, group, timeout_ms;
  int (*body)(struct trun *t, int rank, mc_comm_t *comm);
  mc_oob_threads_t *oob;
  mc_result_t rc[8];
  char msg[8][512];
  void *shared; /* per test */
} trun_t;
typedef struct {
  trun_t *t;
  int rank;
} targ_t;

static void *trun_main(void *p) {
  targ_t *a = p;
  trun_t *t = a->t;
  mc_oob_t oob;
  mc_comm_t *comm = NULL;
  mc_comm_config_t cc = MC_COMM_CONFIG_INITIALIZER;
  cc.group_size = t->group;
  cc.transport = MC_TRANSPORT_CPU;
  cc.timeout_ms = t->timeout_ms;
  mc_oob_threads_get(t->oob, a->rank, &oob);
  if (mc_comm_create(&oob, &cc, &comm) != MC_SUCCESS) {
    t->rc[a->rank] = MC_ERR_INTERNAL;
    snprintf(t->msg[a->rank], sizeof t->msg[0], "comm create: %s", mc_last_error());
    return NULL;
  }
  t->body(t, a->rank, comm);
  return NULL;
}

static int trun(trun_t *t) {
  pthread_t th[8];
  targ_t args[8];
  if (mc_oob_threads_create(t->world, 20000, &t->oob) != MC_SUCCESS) return -1;
  for (int r = 0; r < t->world; r++) {
    args[r] = (targ_t){t, r};
    pthread_create(&th[r], NULL, trun_main, &args[r]);
  }
  for (int r = 0; r < t->world; r++) pthread_join(th[r], NULL);
  mc_oob_threads_destroy(t->oob);
  return 0;
}

mc_a2a_config_t mc_test_small_config(void) {
  mc_a2a_config_t ac = MC_A2A_CONFIG_INITIALIZER;
  ac.max_tokens = 4;
  ac.num_experts = 4;
  ac.experts_per_token = 2;
  ac.token_bytes = 64;
  ac.hidden = 32;
  ac.combine_in_dtype = MC_DTYPE_FP32;
  ac.combine_out_dtype = MC_DTYPE_FP32;
  return ac;
}

/* ---- a window larger than the memory this process may take ---- */
static int too_big_body(trun_t *t, int rank, mc_comm_t *comm) {
  mc_a2a_config_t ac = mc_test_small_config();
  ac.max_tokens = 1 << 20;
  ac.token_bytes = (size_t)1 << 24; /* records of 16 MiB: terabytes of window */
  mc_a2a_t *a2a = NULL;
  t->rc[rank] = mc_a2a_create(comm, &ac, &a2a);
  snprintf(t->msg[rank], sizeof t->msg[0], "%s", mc_last_error());
  mc_comm_destroy(comm);
  return 0;
}
int test_window_too_big(void) {
  trun_t t = {.world = 2, .group = 1, .timeout_ms = 5000, .body = too_big_body};
  MC_CHECK(trun(&t) == 0);
  for (int r = 0; r < 2; r++) {
    fprintf(stderr, "rank %d: %s: %s\n", r, mc_result_string(t.rc[r]), t.msg[r]);
    MC_CHECK_MSG(t.rc[r] == MC_ERR_SYSTEM, "rank %d: %s", r, t.msg[r]);
    MC_CHECK_MSG(strstr(t.msg[r], "bytes of shared memory") != NULL, "rank %d: %s", r, t.msg[r]);
  }
  return 0;
}

/* ---- destroy twice, use after destroy ---- */
int test_use_after_destroy(void) {
  mc_oob_threads_t *g;
  mc_oob_t oob;
  MC_CHECK_OK(mc_oob_threads_create(1, 5000, &g));
  MC_CHECK_OK(mc_oob_threads_get(g, 0, &oob));
  mc_comm_config_t cc = MC_COMM_CONFIG_INITIALIZER;
  cc.transport = MC_TRANSPORT_CPU;
  mc_comm_t *comm;
  MC_CHECK_OK(mc_comm_create(&oob, &cc, &comm));
  mc_a2a_config_t ac = mc_test_small_config();
  mc_a2a_t *a2a;
  MC_CHECK_OK(mc_a2a_create(comm, &ac, &a2a));
  MC_CHECK_OK(mc_a2a_destroy(a2a));
  MC_CHECK_RC(mc_a2a_destroy(a2a), MC_ERR_INVALID_USAGE);
  MC_CHECK(strstr(mc_last_error(), "not a live handle") != NULL);
  int32_t idx[8] = {0, 1, 2, 3, 0, 1, 2, 3}, count[4];
  unsigned char tok[4 * 64], x[4 * 4 * 64];
  MC_CHECK_RC(mc_dispatch(a2a, tok, NULL, idx, NULL, 4, NULL, x, NULL, count, MC_SEND_RECV, NULL),
              MC_ERR_INVALID_USAGE);
  MC_CHECK_RC(mc_combine(a2a, x, tok, MC_SEND_RECV, NULL), MC_ERR_INVALID_USAGE);
  MC_CHECK_RC(mc_a2a_check(a2a), MC_ERR_INVALID_USAGE);
  MC_CHECK(mc_a2a_expert_capacity(a2a) == -1 && mc_a2a_num_local_experts(a2a) == -1);
  MC_CHECK(strstr(mc_a2a_last_error(a2a), "not a live handle") != NULL);
  MC_CHECK_OK(mc_comm_destroy(comm));
  MC_CHECK_RC(mc_comm_destroy(comm), MC_ERR_INVALID_USAGE);
  MC_CHECK_RC(mc_a2a_create(comm, &ac, &a2a), MC_ERR_INVALID_USAGE);
  MC_CHECK(mc_comm_rank(comm) == -1 && mc_comm_world_size(comm) == -1);
  mc_oob_threads_destroy(g);
  return 0;
}

/* One dispatch of four small tokens (ids 0 1 | 2 3 | 1 2 | 3 0) with weights
 * w (NULL: the call's default of 1), its result and text kept for the
 * test; then the handle and the communicator go. Buffers fit the small
 * config at up to 2 ranks. */
static void dispatch_then_close(trun_t *t, int rank, mc_comm_t *comm, mc_a2a_t *a2a, const float *w) {
  int32_t idx[8] = {0, 1, 2, 3, 1, 2, 3, 0}, count[4];
  unsigned char tok[4 * 64], x[4 * 8 * 64];
  memset(tok, 7, sizeof tok);
  t->rc[rank] = mc_dispatch(a2a, tok, NULL, idx, w, 4, NULL, x, NULL, count, MC_SEND_RECV, NULL);
  snprintf(t->msg[rank], sizeof t->msg[0], "%s", mc_a2a_last_error(a2a));
  mc_a2a_destroy(a2a);
  mc_comm_destroy(comm);
}

/* ---- a rank destroys at once; its peer thread dispatches into its window ---- */
static int early_body(trun_t *t, int rank, mc_comm_t *comm) {
  mc_a2a_config_t ac = mc_test_small_config();
  mc_a2a_t *a2a = NULL;
  if ((t->rc[rank] = mc_a2a_create(comm, &ac, &a2a)) != MC_SUCCESS) return 1;
  if (rank == 0) { /* gone before the first round: its window stays while rank 1 may write */
    t->rc[rank] = mc_a2a_destroy(a2a);
    mc_comm_destroy(comm);
    return 0;
  }
  float w[8] = {1, 1, 1, 1, 1, 1, 1, 1};
  dispatch_then_close(t, rank, comm, a2a, w);
  return 0;
}
int test_early_destroy(void) {
  trun_t t = {.world = 2, .group = 1, .timeout_ms = 300, .body = early_body};
  MC_CHECK(trun(&t) == 0);
  fprintf(stderr, "rank 1: %s: %s\n", mc_result_string(t.rc[1]), t.msg[1]);
  MC_CHECK(t.rc[0] == MC_SUCCESS);
  MC_CHECK_MSG(t.rc[1] == MC_ERR_TIMEOUT && strstr(t.msg[1], "waiting for rank 0") != NULL, "%s", t.msg[1]);
  return 0;
}

/* ---- the first failure stays readable after MC_ERR_ABORTED ---- */
static int abort_body(trun_t *t, int rank, mc_comm_t *comm) {
  mc_a2a_config_t ac = mc_test_small_config();
  mc_a2a_t *a2a = NULL;
  if ((t->rc[rank] = mc_a2a_create(comm, &ac, &a2a)) != MC_SUCCESS) return 1;
  int32_t idx[8] = {0, 1, 2, 3, 1, 2, 3, 0}, count[2];
  unsigned char tok[4 * 64], x[2 * 8 * 64];
  memset(tok, 7, sizeof tok);
  if (rank == 1) { /* silent: never dispatches */
    while (!__atomic_load_n((int *)t->shared, __ATOMIC_ACQUIRE)) usleep(1000);
  } else {
    mc_result_t first = mc_dispatch(a2a, tok, NULL, idx, NULL, 4, NULL, x, NULL, count, MC_SEND_RECV, NULL);
    t->rc[rank] = mc_dispatch(a2a, tok, NULL, idx, NULL, 4, NULL, x, NULL, count, MC_SEND, NULL);
    snprintf(t->msg[rank], sizeof t->msg[0], "%d|%s", (int)first, mc_a2a_last_error(a2a));
    __atomic_store_n((int *)t->shared, 1, __ATOMIC_RELEASE);
  }
  mc_a2a_destroy(a2a);
  mc_comm_destroy(comm);
  return 0;
}
int test_abort_keeps_first_error(void) {
  int done = 0;
  trun_t t = {.world = 2, .group = 1, .timeout_ms = 300, .body = abort_body, .shared = &done};
  MC_CHECK(trun(&t) == 0);
  fprintf(stderr, "rank 0: %s\n", t.msg[0]);
  MC_CHECK(t.rc[0] == MC_ERR_ABORTED);
  MC_CHECK_MSG(atoi(t.msg[0]) == MC_ERR_TIMEOUT, "%s", t.msg[0]);
  MC_CHECK_MSG(strstr(t.msg[0], "failed earlier") != NULL && strstr(t.msg[0], "timed out") != NULL &&
                   strstr(t.msg[0], "waiting for rank 1") != NULL,
               "%s", t.msg[0]);
  return 0;
}

/* ---- configs that differ: the field and both values ---- */
static int mismatch_body(trun_t *t, int rank, mc_comm_t *comm) {
  mc_a2a_config_t ac = mc_test_small_config();
  if (rank == 1) ac.hidden = 48;
  mc_a2a_t *a2a = NULL;
  t->rc[rank] = mc_a2a_create(comm, &ac, &a2a);
  snprintf(t->msg[rank], sizeof t->msg[0], "%s", mc_last_error());
  mc_comm_destroy(comm);
  return 0;
}
int test_config_mismatch_named(void) {
  trun_t t = {.world = 2, .group = 1, .timeout_ms = 2000, .body = mismatch_body};
  MC_CHECK(trun(&t) == 0);
  for (int r = 0; r < 2; r++) {
    fprintf(stderr, "rank %d: %s\n", r, t.msg[r]);
    MC_CHECK(t.rc[r] == MC_ERR_INVALID_ARG);
    MC_CHECK_MSG(strstr(t.msg[r], "config->hidden=") != NULL && strstr(t.msg[r], "48") != NULL &&
                     strstr(t.msg[r], "32") != NULL,
                 "%s", t.msg[r]);
  }
  return 0;
}

/* ---- a config one rank refuses: every rank fails, and retries meet ----
 * A rank whose own config fails its checks must still take part in the
 * create's exchange: its peers fail at once naming it (not a bootstrap
 * timeout), and a retry with a good config pairs with the peers' retry,
 * not with their first call. */
static int refused_body(trun_t *t, int rank, mc_comm_t *comm) {
  mc_a2a_config_t ac = mc_test_small_config();
  if (rank == 1) ac.num_experts = 3; /* not a multiple of the world size */
  mc_a2a_t *a2a = NULL;
  t->rc[rank] = mc_a2a_create(comm, &ac, &a2a);
  snprintf(t->msg[rank], sizeof t->msg[0], "%s", mc_last_error());
  if (a2a) mc_a2a_destroy(a2a);
  ac = mc_test_small_config(); /* the retry, with the good config on every rank */
  a2a = NULL;
  const mc_result_t again = mc_a2a_create(comm, &ac, &a2a);
  if (again != MC_SUCCESS) {
    t->rc[rank] = MC_ERR_INTERNAL;
    snprintf(t->msg[rank], sizeof t->msg[0], "the retry failed: %s", mc_last_error());
  }
  if (a2a) mc_a2a_destroy(a2a);
  mc_comm_destroy(comm);
  return 0;
}
int test_config_refused_joins(void) {
  trun_t t = {.world = 2, .group = 1, .timeout_ms = 2000, .body = refused_body};
  MC_CHECK(trun(&t) == 0);
  for (int r = 0; r < 2; r++) fprintf(stderr, "rank %d: %s\n", r, t.msg[r]);
  MC_CHECK_MSG(t.rc[1] == MC_ERR_INVALID_ARG && strstr(t.msg[1], "num_experts") != NULL, "%s", t.msg[1]);
  MC_CHECK_MSG(t.rc[0] == MC_ERR_INVALID_ARG && strstr(t.msg[0], "rank 1 refused") != NULL, "%s", t.msg[0]);
  return 0;
}

/* The same for the communicator: rank 1 asks for a negative timeout, then
 * every rank retries with a good config. Also: a timeout above a day is
 * refused (twice it must still fit the waits' arithmetic). */
typedef struct {
  mc_oob_threads_t *g;
  int rank;
  mc_result_t rc, again;
  char msg[512];
} comm_try_t;
static void *comm_try(void *p) {
  comm_try_t *a = p;
  mc_oob_t oob;
  mc_oob_threads_get(a->g, a->rank, &oob);
  mc_comm_config_t cc = MC_COMM_CONFIG_INITIALIZER;
  cc.transport = MC_TRANSPORT_CPU;
  cc.timeout_ms = a->rank == 1 ? -1 : 2000;
  mc_comm_t *comm = NULL;
  a->rc = mc_comm_create(&oob, &cc, &comm);
  snprintf(a->msg, sizeof a->msg, "%s", mc_last_error());
  if (comm) mc_comm_destroy(comm);
  cc.timeout_ms = 2000;
  comm = NULL;
  a->again = mc_comm_create(&oob, &cc, &comm);
  if (comm) mc_comm_destroy(comm);
  return NULL;
}
int test_comm_config_refused_joins(void) {
  comm_try_t a[2];
  pthread_t th[2];
  mc_oob_threads_t *g;
  MC_CHECK_OK(mc_oob_threads_create(2, 5000, &g));
  for (int r = 0; r < 2; r++) {
    a[r] = (comm_try_t){.g = g, .rank = r};
    pthread_create(&th[r], NULL, comm_try, &a[r]);
  }
  for (int r = 0; r < 2; r++) pthread_join(th[r], NULL);
  mc_oob_threads_destroy(g);
  for (int r = 0; r < 2; r++) fprintf(stderr, "rank %d: %s (retry %d)\n", r, a[r].msg, (int)a[r].again);
  MC_CHECK_MSG(a[1].rc == MC_ERR_INVALID_ARG && strstr(a[1].msg, "timeout_ms=-1") != NULL, "%s", a[1].msg);
  MC_CHECK_MSG(a[0].rc == MC_ERR_INVALID_ARG && strstr(a[0].msg, "rank 1 refused") != NULL, "%s", a[0].msg);
  MC_CHECK(a[0].again == MC_SUCCESS && a[1].again == MC_SUCCESS);

  mc_oob_threads_t *one;
  MC_CHECK_OK(mc_oob_threads_create(1, 1000, &one));
  mc_oob_t oob;
  MC_CHECK_OK(mc_oob_threads_get(one, 0, &oob));
  mc_comm_config_t cc = MC_COMM_CONFIG_INITIALIZER;
  cc.transport = MC_TRANSPORT_CPU;
  cc.timeout_ms = 86400001;
  mc_comm_t *comm = NULL;
  MC_CHECK_RC(mc_comm_create(&oob, &cc, &comm), MC_ERR_INVALID_ARG);
  MC_CHECK_MSG(strstr(mc_last_error(), "timeout_ms=86400001") != NULL, "%s", mc_last_error());
  cc.timeout_ms = 86400000;
  MC_CHECK_OK(mc_comm_create(&oob, &cc, &comm));
  MC_CHECK_OK(mc_comm_destroy(comm));
  mc_oob_threads_destroy(one);
  return 0;
}

/* ---- barrier counts lined up again by a mask call ----
 * Rank 2 stalls while ranks 0 and 1 call mc_a2a_barrier (which times out,
 * counted on their side only); they mask rank 2 and pass one more barrier
 * without it; it comes back, every rank clears the mask: later barriers of
 * all three must pass. On a GPU the barrier is a kernel: its failure shows
 * once the stream is done. come_back(arg) returns when rank 2 is back. */
mc_result_t mc_test_barrier_done(mc_a2a_t *a2a, int gpu) {
  mc_result_t rc = mc_a2a_barrier(a2a, mc_dev_stream());
  if (rc != MC_SUCCESS || !gpu) return rc;
  return mc_dev_sync(1) == 0 ? mc_a2a_check(a2a) : MC_ERR_CUDA;
}
static mc_result_t rejoin_steps(mc_comm_t *comm, int rank, int gpu, void (*come_back)(void *, int), void *arg,
                                char *msg, size_t len) {
  mc_a2a_config_t ac = mc_test_small_config();
  ac.num_experts = 3;
  ac.experts_per_token = 1;
  mc_a2a_t *a2a = NULL;
  mc_result_t rc = mc_a2a_create(comm, &ac, &a2a);
  const uint8_t without2[3] = {0, 0, 1}, none[3] = {0, 0, 0};
  if (rc == MC_SUCCESS && rank != 2) {
    if (mc_test_barrier_done(a2a, gpu) != MC_ERR_TIMEOUT) rc = MC_ERR_INTERNAL; /* rank 2 is away */
    else rc = mc_a2a_mask_ranks(a2a, without2);
    if (rc == MC_SUCCESS) rc = mc_test_barrier_done(a2a, gpu); /* one that rank 2 misses while masked */
  }
  come_back(arg, rank);
  if (rc == MC_SUCCESS) rc = mc_a2a_mask_ranks(a2a, none);
  for (int i = 0; i < 3 && rc == MC_SUCCESS; i++) rc = mc_test_barrier_done(a2a, gpu);
  snprintf(msg, len, "%s", a2a ? mc_a2a_last_error(a2a) : mc_last_error());
  if (a2a) mc_a2a_destroy(a2a);
  return rc;
}
static void threads_meet(void *all, int rank) {
  (void)rank;
  pthread_barrier_wait(all);
}
static int rejoin_body(trun_t *t, int rank, mc_comm_t *comm) {
  t->rc[rank] = rejoin_steps(comm, rank, 0, threads_meet, t->shared, t->msg[rank], sizeof t->msg[0]);
  mc_comm_destroy(comm);
  return 0;
}
int test_barrier_after_rejoin(void) {
  pthread_barrier_t all;
  pthread_barrier_init(&all, NULL, 3);
  /* rank 2 is away (at the pthread barrier) for the one timeout waited out;
   * every other wait is for live ranks a few calls apart */
  trun_t t = {.world = 3, .group = 1, .timeout_ms = 1000, .body = rejoin_body, .shared = &all};
  MC_CHECK(trun(&t) == 0);
  pthread_barrier_destroy(&all);
  for (int r = 0; r < 3; r++) {
    fprintf(stderr, "rank %d: %s %s\n", r, mc_result_string(t.rc[r]), t.msg[r]);
    MC_CHECK_MSG(t.rc[r] == MC_SUCCESS, "rank %d: %s", r, t.msg[r]);
  }
  return 0;
}

/* The same on a GPU (p2p), ranks as processes (several on one GPU under
 * MPS, scripts/mc-launch.sh): a mask call synchronises the device, which
 * ranks that are threads of one process on one GPU would share. Rank 2
 * comes back 1.5 s after create; ranks 0 and 1 reach the mask call after
 * their barrier's timeout of 1 s and wait up to 2 s there. */
static void gpu_rank2_later(void *arg, int rank) {
  (void)arg;
  if (rank == 2) mc_proc_sleep_ms(1500);
}
static int gpu_rejoin_child(const mc_proc_ctx_t *c, int p) {
  mc_oob_socket_t *s = NULL;
  mc_oob_t oob;
  mc_comm_t *comm = NULL;
  mc_comm_config_t cc = MC_COMM_CONFIG_INITIALIZER;
  cc.transport = MC_TRANSPORT_P2P;
  cc.timeout_ms = c->timeout_ms;
  cc.device = mc_dev_select(p);
  char msg[512] = "";
  if (cc.device < 0 || mc_oob_socket_create(&c->id, p, c->world, 20000, &s) != MC_SUCCESS ||
      mc_oob_socket_get(s, &oob) != MC_SUCCESS || mc_comm_create(&oob, &cc, &comm) != MC_SUCCESS) {
    fprintf(stderr, "rank %d: setup: %s\n", p, mc_last_error());
    return 2;
  }
  mc_result_t rc = rejoin_steps(comm, p, 1, gpu_rank2_later, NULL, msg, sizeof msg);
  fprintf(stderr, "rank %d: %s %s\n", p, mc_result_string(rc), msg);
  mc_comm_destroy(comm);
  mc_oob_socket_destroy(s);
  return rc == MC_SUCCESS ? 0 : 1;
}
int test_gpu_barrier_after_rejoin(void) {
  if (!mc_proc_cuda_seen()) {
    printf("skipped: no CUDA device visible, or this build has no GPU transport\n");
    return 77;
  }
  mc_proc_ctx_t c;
  mc_proc_world(&c, 3, 1000);
  MC_CHECK_OK(mc_unique_id_create(&c.id));
  int codes[3];
  MC_CHECK(mc_proc_run(&c, gpu_rejoin_child, 60000, codes) == 0);
  for (int r = 0; r < 3; r++) MC_CHECK_MSG(codes[r] == 0, "rank %d ended with %d", r, codes[r]);
  return 0;
}

/* ---- the ranks of a group pass different weights ---- */
static int group_body(trun_t *t, int rank, mc_comm_t *comm) {
  mc_a2a_config_t ac = mc_test_small_config();
  mc_a2a_t *a2a = NULL;
  if ((t->rc[rank] = mc_a2a_create(comm, &ac, &a2a)) != MC_SUCCESS) return 1;
  float w[8] = {1, 1, 1, 1, 1, 1, 1, 1};
  if (rank == 1) w[5] = 0.5f;
  dispatch_then_close(t, rank, comm, a2a, w);
  return 0;
}
int test_group_inputs_differ(void) {
  trun_t t = {.world = 2, .group = 2, .timeout_ms = MC_TEST_LIVE_MS, .body = group_body};
  MC_CHECK(trun(&t) == 0);
  for (int r = 0; r < 2; r++) {
    fprintf(stderr, "rank %d: %s\n", r, t.msg[r]);
    MC_CHECK(t.rc[r] == MC_ERR_INVALID_USAGE);
    MC_CHECK_MSG(strstr(t.msg[r], "different m, indices or weights") != NULL, "%s", t.msg[r]);
  }
  return 0;
}

/* ---- a killed process is named as the one missing ---- */
int test_timeout_names_dead_rank(void) {
  mc_unique_id_t id;
  MC_CHECK_OK(mc_unique_id_create(&id));
  const int W = 3, dead = 2;
  int fds[3][2];
  pid_t pid[3];
  fflush(NULL);
  for (int r = 0; r < W; r++) {
    if (pipe(fds[r]) != 0) return 1;
    pid[r] = fork();
    if (pid[r] == 0) {
      close(fds[r][0]);
      mc_oob_socket_t *sock;
      mc_oob_t oob;
      mc_comm_t *comm;
      mc_a2a_t *a2a;
      mc_comm_config_t cc = MC_COMM_CONFIG_INITIALIZER;
      cc.transport = MC_TRANSPORT_CPU;
      cc.timeout_ms = MC_TEST_LIVE_MS; /* rank 2's death is seen at once */
      mc_a2a_config_t ac = mc_test_small_config();
      ac.num_experts = 6;
      if (mc_oob_socket_create(&id, r, W, MC_TEST_LIVE_MS, &sock) || mc_oob_socket_get(sock, &oob) ||
          mc_comm_create(&oob, &cc, &comm) || mc_a2a_create(comm, &ac, &a2a))
        _exit(2);
      if (r == dead) raise(SIGKILL); /* after create, before the first round */
      int32_t idx[8] = {0, 5, 2, 3, 4, 1, 3, 0}, count[2];
      unsigned char tok[4 * 64], x[2 * 12 * 64];
      memset(tok, 1, sizeof tok);
      mc_result_t rc = mc_dispatch(a2a, tok, NULL, idx, NULL, 4, NULL, x, NULL, count, MC_SEND_RECV, NULL);
      char msg[600];
      int n = snprintf(msg, sizeof msg, "%d|%s", (int)rc, mc_a2a_last_error(a2a));
      if (write(fds[r][1], msg, (size_t)n) != n) _exit(3);
      _exit(0);
    }
    close(fds[r][1]);
  }
  for (int r = 0; r < W; r++) {
    char msg[600] = "";
    ssize_t n = read(fds[r][0], msg, sizeof msg - 1);
    msg[n > 0 ? n : 0] = '\0';
    close(fds[r][0]);
    int st = 0;
    waitpid(pid[r], &st, 0);
    if (r == dead) continue;
    fprintf(stderr, "rank %d: %s\n", r, msg);
    MC_CHECK_MSG(WIFEXITED(st) && WEXITSTATUS(st) == 0, "rank %d exited %d", r, st);
    MC_CHECK_MSG(atoi(msg) == MC_ERR_TIMEOUT && strstr(msg, "rank 2's process") != NULL &&
                     mc_test_blames_only(msg, dead),
                 "rank %d: %s", r, msg);
  }
  return 0;
}

/* ---- the settings the library reads from the environment: a malformed
 * value fails create with its name; a valid one is used. The library reads
 * them once per process: each case in a child forked before any call. ---- */
static int comm_in_child(const char *name, const char *value, mc_result_t want, const char *text) {
  fflush(NULL);
  pid_t child = fork();
  if (child == 0) {
    setenv(name, value, 1);
    mc_oob_threads_t *g;
    mc_oob_t oob;
    mc_comm_t *comm = NULL;
    mc_comm_config_t cc = MC_COMM_CONFIG_INITIALIZER;
    cc.transport = MC_TRANSPORT_CPU;
    if (mc_oob_threads_create(1, 1000, &g) != MC_SUCCESS || mc_oob_threads_get(g, 0, &oob) != MC_SUCCESS) _exit(100);
    mc_result_t rc = mc_comm_create(&oob, &cc, &comm);
    int ok = rc == want && (!text || strstr(mc_last_error(), text) != NULL);
    if (!ok) fprintf(stderr, "%s=%s: %s: %s\n", name, value, mc_result_string(rc), mc_last_error());
    mc_comm_destroy(comm);
    mc_oob_threads_destroy(g);
    _exit(ok ? 0 : 1);
  }
  int st = 0;
  waitpid(child, &st, 0);
  return WIFEXITED(st) && WEXITSTATUS(st) == 0;
}
int test_settings_from_environment(void) {
  MC_CHECK(comm_in_child("MC_TIMEOUT_MS", "2500", MC_SUCCESS, NULL));
  MC_CHECK(comm_in_child("MC_TIMEOUT_MS", "soon", MC_ERR_INVALID_ARG, "MC_TIMEOUT_MS='soon'"));
  MC_CHECK(comm_in_child("MC_TIMEOUT_MS", "0", MC_ERR_INVALID_ARG, "MC_TIMEOUT_MS='0'"));
  MC_CHECK(comm_in_child("MC_VERBOSE", "1", MC_SUCCESS, NULL));
  MC_CHECK(comm_in_child("MC_VERBOSE", "yes", MC_ERR_INVALID_ARG, "MC_VERBOSE='yes' is not 0 or 1"));
  MC_CHECK(comm_in_child("MC_HOST_ID", "node-7", MC_SUCCESS, NULL));
  return 0;
}
