/* test_blame.c - a failure names its cause: every survivor of a rank that
 * died names that rank, and never a live one; a rank a signal killed is
 * reported with the signal, and first (mc-bench's verdict); a caller's own
 * allgather that fails is reported as just that.
 *
 * The ranks die for sure (SIGKILL at a fixed step, or a thread that never
 * calls), and the survivors' timeouts are far longer than any of these
 * tests takes: a dead process is seen at once (its connection closes, its
 * pid is gone), so no verdict waits on a clock a slow live rank could
 * miss. */
#include <ctype.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "mc_ref_run.h"
#include "mc_test.h"
#include "mc_test_procs.h"

/* What a text may say of a rank to put a failure on it. */
static const char *const blames[] = {" is the one missing",        " closed its connection",
                                     " left the group",            " did not take part",
                                     " gave up this allgather",    " sent something else",
                                     ": process killed by signal", " did not come within"};

int mc_test_blames_only(const char *msg, int dead) {
  int named = 0;
  for (size_t b = 0; b < sizeof blames / sizeof blames[0]; b++)
    for (const char *p = strstr(msg, blames[b]); p; p = strstr(p + 1, blames[b])) {
      const char *q = p;
      if (q > msg && q[-1] == ')') q--;
      int any = 0;
      while (q > msg && (isdigit((unsigned char)q[-1]) || q[-1] == ',')) {
        const char *end = q;
        while (q > msg && isdigit((unsigned char)q[-1])) q--;
        if (q == end) return 0; /* ",," */
        if (atoi(q) != dead) return 0;
        any = 1;
        if (q > msg && q[-1] == ',') q--;
      }
      if (!any) return 0; /* a blame whose rank cannot be read is not one on the dead rank */
      named = 1;
    }
  return named;
}

/* ---- a rank killed mid-run, under the harness as mc-bench drives it ---- */

/* World 4, ranks as processes with the out-of-band barrier before each
 * round (as mc-bench runs them): rank `dead` raises SIGKILL before its
 * dispatch of a round (its peers then wait in the barrier) or before its
 * combine (they wait in the transport). */
static int killed_in_run(int dead, int in_combine, uint64_t seed) {
  const int W = 4;
  mc_case_t c;
  mc_run_opts_t o;
  mc_test_stall_setup(seed, W, dead, MC_TEST_LIVE_MS, &c, &o);
  o.warmup = 2;
  o.check_first = 2;
  o.barrier = 1;
  o.processes = 1;
  o.stall_round = 1 + (int)(seed % 4);
  o.stall_in_combine = in_combine;
  mc_run_result_t res;
  const int failed = mc_run(&c, &o, &res);
  const char *first = failed > 0 ? mc_run_first_failure(&res) : "";
  char want[96];
  snprintf(want, sizeof want, "rank %d: process killed by signal 9 (SIGKILL: likely the out-of-memory killer", dead);
  fprintf(stderr, "rank %d killed before its %s of round %d; first failure: %s\n", dead,
          in_combine ? "combine" : "dispatch", o.stall_round + 1, first);
  MC_CHECK_MSG(failed == W, "%d of %d ranks failed", failed, W);
  MC_CHECK_MSG(strncmp(first, want, strlen(want)) == 0 && res.ranks[dead].signal == SIGKILL, "first failure: %s",
               first);
  for (int r = 0; r < W; r++) {
    if (r == dead) continue;
    fprintf(stderr, "  %s\n", res.ranks[r].msg);
    MC_CHECK_MSG(mc_test_blames_only(res.ranks[r].msg, dead), "rank %d dead: rank %d says: %s", dead, r,
                 res.ranks[r].msg);
  }
  mc_run_free(&res);
  return 0;
}

int test_killed_rank_named(void) {
  for (int i = 0; i < 4; i++) {
    const int dead = i == 0 ? 0 : 1 + (int)((mc_test_seed + (uint64_t)i) % 3);
    if (killed_in_run(dead, i % 2, mc_test_seed + (uint64_t)i)) return 1;
  }
  return 0;
}

/* ---- a rank killed during create ---- */

typedef struct {
  char msg[4][600];
  int rc[4];
} create_out_t;

/* Every rank: the socket bootstrap, mc_comm_create, mc_a2a_create; rank
 * create_dead raises SIGKILL before the step c->mode names (0: the
 * communicator, 1: the handle). What each survivor's failing create said
 * goes to shared memory. */
static create_out_t *create_out;
static int create_dead;

static int create_child(const mc_proc_ctx_t *c, int p) {
  const int dead = create_dead;
  mc_oob_socket_t *s = NULL;
  mc_oob_t oob;
  mc_comm_t *comm = NULL;
  mc_a2a_t *a2a = NULL;
  mc_comm_config_t cc = MC_COMM_CONFIG_INITIALIZER;
  cc.transport = MC_TRANSPORT_CPU;
  cc.timeout_ms = MC_TEST_LIVE_MS;
  mc_a2a_config_t ac = mc_test_small_config();
  MC_CHECK_OK(mc_oob_socket_create(&c->id, p, c->world, MC_TEST_LIVE_MS, &s));
  MC_CHECK_OK(mc_oob_socket_get(s, &oob));
  if (p == dead && c->mode == 0) raise(SIGKILL);
  mc_result_t rc = mc_comm_create(&oob, &cc, &comm);
  if (rc == MC_SUCCESS) {
    if (p == dead) raise(SIGKILL);
    rc = mc_a2a_create(comm, &ac, &a2a);
  }
  create_out->rc[p] = (int)rc;
  snprintf(create_out->msg[p], sizeof create_out->msg[p], "%s", mc_last_error());
  if (a2a) mc_a2a_destroy(a2a);
  if (comm) mc_comm_destroy(comm);
  mc_oob_socket_destroy(s);
  return 0;
}

int test_create_killed_rank_named(void) {
  create_out = mmap(NULL, sizeof *create_out, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  MC_CHECK(create_out != MAP_FAILED);
  for (int i = 0; i < 4; i++) {
    mc_proc_ctx_t c;
    int codes[MC_PROC_MAX];
    mc_proc_world(&c, 4, MC_TEST_LIVE_MS);
    c.mode = i % 2;
    const int dead = i < 2 ? 0 : 1 + (int)((mc_test_seed + (uint64_t)i) % 3);
    create_dead = dead;
    memset(create_out, 0, sizeof *create_out);
    MC_CHECK_OK(mc_unique_id_create(&c.id));
    (void)mc_proc_run(&c, create_child, 4 * MC_TEST_LIVE_MS, codes);
    for (int r = 0; r < 4; r++) {
      if (r == dead) continue;
      fprintf(stderr, "rank %d killed before %s; rank %d: %s\n", dead, c.mode ? "mc_a2a_create" : "mc_comm_create", r,
              create_out->msg[r]);
      MC_CHECK_MSG(codes[r] == 0 && create_out->rc[r] == MC_ERR_BOOTSTRAP, "rank %d: exit %d, create gave %d", r,
                   codes[r], create_out->rc[r]);
      MC_CHECK_MSG(mc_test_blames_only(create_out->msg[r], dead), "rank %d dead: rank %d says: %s", dead, r,
                   create_out->msg[r]);
    }
  }
  munmap(create_out, sizeof *create_out);
  return 0;
}

/* ---- the threads bootstrap, and the caller's own allgather ---- */

/* mc_comm_create on this thread with oob, which must fail in its
 * allgather; its text. */
static const char *create_fails(const mc_oob_t *oob) {
  mc_comm_t *comm = NULL;
  mc_comm_config_t cc = MC_COMM_CONFIG_INITIALIZER;
  cc.transport = MC_TRANSPORT_CPU;
  const mc_result_t rc = mc_comm_create(oob, &cc, &comm);
  fprintf(stderr, "%s: %s\n", mc_result_string(rc), mc_last_error());
  return rc == MC_ERR_BOOTSTRAP && !comm ? mc_last_error() : NULL;
}

/* Two ranks as threads; rank 1 never calls. Rank 0's create fails naming
 * it, and so does a second create (the group stays failed). */
int test_silent_thread_named(void) {
  mc_oob_threads_t *g;
  mc_oob_t oob;
  MC_CHECK_OK(mc_oob_threads_create(2, 200, &g));
  MC_CHECK_OK(mc_oob_threads_get(g, 0, &oob));
  for (int k = 0; k < 2; k++) {
    const char *msg = create_fails(&oob);
    MC_CHECK(msg && mc_test_blames_only(msg, 1));
  }
  mc_oob_threads_destroy(g);
  return 0;
}

static int refusing_allgather(const void *send, void *recv, size_t bytes, void *user) {
  (void)send, (void)recv, (void)bytes, (void)user;
  return 7;
}

/* A callback that fails is reported as such, naming no rank: not even
 * one the text of an earlier failure on this thread named. */
int test_own_allgather_failure(void) {
  mc_oob_threads_t *g;
  mc_oob_t threads_oob;
  MC_CHECK_OK(mc_oob_threads_create(2, 1, &g));
  MC_CHECK_OK(mc_oob_threads_get(g, 0, &threads_oob));
  const char *before = create_fails(&threads_oob); /* rank 1 never comes */
  MC_CHECK(before && mc_test_blames_only(before, 1));
  mc_oob_threads_destroy(g);
  const mc_oob_t own = {refusing_allgather, NULL, 1, 3};
  const char *msg = create_fails(&own);
  MC_CHECK(msg != NULL);
  MC_CHECK_MSG(strstr(msg, "the caller's allgather callback returned 7") != NULL, "%s", msg);
  MC_CHECK_MSG(strncmp(msg, "rank 1: ", 8) == 0, "%s", msg);
  for (const char *p = strstr(msg + 8, "rank "); p; p = strstr(p + 1, "rank "))
    MC_CHECK_MSG(!isdigit((unsigned char)p[5]), "a rank named: %s", msg);
  return 0;
}
