/* test_oob_socket.c - the process bootstrap (mc_unique_id_create,
 * mc_oob_socket_*): ranks are fork()ed children that report through their
 * exit status; the parent makes the id before forking (so rank 0's child
 * inherits the listener) and reaps them with a bounded wait. What must
 * happen before what is ordered by mc_proc_mark / mc_proc_await, not by
 * sleeps; a rank that must be missed is absent or stopped for sure, and
 * every wait for a live one has MC_TEST_LIVE_MS. */
#include <arpa/inet.h>
#include <errno.h>
#include <grp.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "mc_test.h"
#include "mc_test_procs.h"

static int allgather_child(const mc_proc_ctx_t *c, int p) {
  static const size_t sizes[] = {1, 8, 13, 4096, 65539, 1u << 20, 3, 1};
  mc_oob_socket_t *s;
  mc_oob_t oob;
  MC_CHECK_OK(mc_oob_socket_create(&c->id, c->rank[p], c->world, c->timeout_ms, &s));
  MC_CHECK_OK(mc_oob_socket_get(s, &oob));
  MC_CHECK(oob.rank == c->rank[p] && oob.world_size == c->world);
  for (int i = 0; i < (int)(sizeof sizes / sizeof sizes[0]); i++)
    if (mc_proc_gather_check(&oob, sizes[i], i)) return 1;
  mc_oob_socket_destroy(s);
  return 0;
}

int test_oob_socket_allgather(void) {
  static const int worlds[] = {1, 2, 3, 5};
  for (int w = 0; w < 4; w++) {
    mc_proc_ctx_t c;
    int codes[MC_PROC_MAX];
    mc_proc_world(&c, worlds[w], MC_TEST_LIVE_MS);
    MC_CHECK_OK(mc_unique_id_create(&c.id));
    MC_CHECK(mc_proc_run(&c, allgather_child, 60000, codes) == 0);
    for (int p = 0; p < c.nprocs; p++)
      MC_CHECK_MSG(codes[p] == 0, "world %d: rank %d exited with %d", c.world, p, codes[p]);
  }
  return 0;
}

/* A process whose create must be refused (MC_ERR_BOOTSTRAP, not a timeout:
 * at once): exit MC_PROC_REFUSED if it is, and mark step 0. */
static int stranger_child(const mc_proc_ctx_t *c, int p, const mc_unique_id_t *id, int world) {
  mc_oob_socket_t *s = NULL;
  mc_result_t rc = mc_oob_socket_create(id, c->rank[p], world, c->timeout_ms, &s);
  MC_CHECK_MSG(rc == MC_ERR_BOOTSTRAP, "process %d: create gave %s: %s", p, mc_result_string(rc),
               mc_last_error());
  MC_CHECK(s == NULL && mc_last_error()[0] != '\0');
  mc_proc_mark(0);
  return MC_PROC_REFUSED;
}

/* mode 0: process 1 has a wrong secret, process 2 the wrong world size;
 * mode 1: processes 1 and 2 both claim rank 1, exactly one may join. The
 * last real rank joins only once the strangers were refused (step 0), so
 * that rank 0 is still taking joins when they come. */
static int strangers_child(const mc_proc_ctx_t *c, int p) {
  if (c->mode == 0 && p == 1) {
    mc_unique_id_t bad = c->id;
    bad.internal[20] ^= 0x01; /* a byte of the secret (see the layout in mc_oob_socket.c) */
    return stranger_child(c, p, &bad, c->world);
  }
  if (c->mode == 0 && p == 2) return stranger_child(c, p, &c->id, c->world + 1);
  if (c->delay_ms[p] < 0) mc_proc_await(0, c->mode == 0 ? 2 : 1);
  mc_oob_socket_t *s;
  mc_oob_t oob;
  mc_result_t rc = mc_oob_socket_create(&c->id, c->rank[p], c->world, c->timeout_ms, &s);
  if (c->mode == 1 && rc == MC_ERR_BOOTSTRAP && c->rank[p] == 1) {
    mc_proc_mark(0);
    return MC_PROC_REFUSED;
  }
  MC_CHECK_OK(rc);
  MC_CHECK_OK(mc_oob_socket_get(s, &oob));
  if (mc_proc_gather_check(&oob, 100, 0) || mc_proc_gather_check(&oob, 1, 1)) return 1;
  mc_oob_socket_destroy(s);
  return 0;
}

int test_oob_socket_wrong_secret(void) {
  int codes[MC_PROC_MAX];
  for (int mode = 0; mode < 2; mode++) {
    /* world 3; the strangers (processes 1, 2) go first, the real ranks after
     * them (delay -1: once step 0 says they were refused) */
    mc_proc_ctx_t c;
    memset(&c, 0, sizeof c);
    c.world = 3;
    c.timeout_ms = MC_TEST_LIVE_MS;
    c.nprocs = 5;
    c.mode = mode;
    int ranks[5] = {0, 1, 1, 1, 2}, delays[5] = {0, 0, 0, -1, -1};
    if (mode == 1) ranks[3] = 2, delays[3] = -1, c.nprocs = 4; /* 0, 1, 1, 2 */
    memcpy(c.rank, ranks, sizeof ranks);
    memcpy(c.delay_ms, delays, sizeof delays);
    MC_CHECK_OK(mc_unique_id_create(&c.id));
    MC_CHECK(mc_proc_run(&c, strangers_child, 20000, codes) == 0);
    MC_CHECK_MSG(codes[0] == 0, "mode %d: rank 0 exited with %d", mode, codes[0]);
    if (mode == 0) {
      MC_CHECK_MSG(codes[1] == MC_PROC_REFUSED && codes[2] == MC_PROC_REFUSED, "strangers exited with %d, %d",
                   codes[1], codes[2]);
      MC_CHECK_MSG(codes[3] == 0 && codes[4] == 0, "ranks 1, 2 exited with %d, %d", codes[3],
                   codes[4]);
    } else {
      MC_CHECK_MSG((codes[1] == 0 && codes[2] == MC_PROC_REFUSED) || (codes[1] == MC_PROC_REFUSED && codes[2] == 0),
                   "the two rank-1 processes exited with %d, %d", codes[1], codes[2]);
      MC_CHECK_MSG(codes[3] == 0, "rank 2 exited with %d", codes[3]);
    }
  }
  return 0;
}

/* An allgather that must fail, for the reason that the text names: not
 * the timeout (every test here waits MC_TEST_LIVE_MS, so a failure found
 * only by the clock would say "within"), unless `late` says a rank is
 * away; and the next call fails at once, as the text of a poisoned object
 * shows. */
static int expect_fail(const mc_oob_t *oob, size_t bytes, int late) {
  static unsigned char small[4096], big[4096 * MC_PROC_MAX];
  unsigned char *send = bytes <= sizeof small ? small : NULL;
  unsigned char *recv = bytes <= sizeof small ? big : NULL;
  if (!send) { /* real buffers unless the size is refused before they are touched */
    send = malloc(16);
    recv = malloc(16);
  }
  int rc = oob->allgather(send, recv, bytes, oob->user);
  fprintf(stderr, "rank %d: %s\n", oob->rank, mc_last_error());
  MC_CHECK_MSG(rc != 0, "rank %d: allgather of %zu bytes succeeded", oob->rank, bytes);
  MC_CHECK_MSG(late || !strstr(mc_last_error(), "within"), "rank %d: %s", oob->rank, mc_last_error());
  MC_CHECK(oob->allgather(small, big, 8, oob->user) != 0);
  MC_CHECK_MSG(strstr(mc_last_error(), "an earlier one failed on this rank") != NULL, "rank %d: %s", oob->rank,
               mc_last_error());
  if (send != small) {
    free(send);
    free(recv);
  }
  return 0;
}

/* mode 0: the last rank announces twice the others' size; mode 1: rank 0
 * does; mode 2: rank 1 asks for more than the 256 MiB cap. */
static int oversized_child(const mc_proc_ctx_t *c, int p) {
  mc_oob_socket_t *s;
  mc_oob_t oob;
  MC_CHECK_OK(mc_oob_socket_create(&c->id, p, c->world, c->timeout_ms, &s));
  MC_CHECK_OK(mc_oob_socket_get(s, &oob));
  if (mc_proc_gather_check(&oob, 64, 0)) return 1; /* a proper one first */
  size_t bytes = 1000;
  if ((c->mode == 0 && p == c->world - 1) || (c->mode == 1 && p == 0)) bytes = 2000;
  if (c->mode == 2 && p == 1) bytes = ((size_t)256 << 20) + 1;
  if (expect_fail(&oob, bytes, 0)) return 1;
  mc_oob_socket_destroy(s);
  return 0;
}

int test_oob_socket_oversized(void) {
  for (int mode = 0; mode < 3; mode++) {
    mc_proc_ctx_t c;
    int codes[MC_PROC_MAX];
    mc_proc_world(&c, 3, MC_TEST_LIVE_MS);
    c.mode = mode;
    MC_CHECK_OK(mc_unique_id_create(&c.id));
    MC_CHECK(mc_proc_run(&c, oversized_child, 4 * MC_TEST_LIVE_MS, codes) == 0);
    for (int p = 0; p < c.nprocs; p++)
      MC_CHECK_MSG(codes[p] == 0, "mode %d: rank %d exited with %d", mode, p, codes[p]);
  }
  return 0;
}

/* Rank 0 of mode 0 starts once rank 1's connection waits for it (rank 0
 * answers what came before its call, however late it runs): rank 2 is the
 * one missing, and rank 1 hears that rank 0 timed out. The others of mode
 * 1 have no rank 0 at all. The ranks that are there wait MC_TEST_LIVE_MS
 * but rank 0, whose timeout the test waits out. */
static int missing_child(const mc_proc_ctx_t *c, int p) {
  mc_oob_socket_t *s = NULL;
  const int rank = c->rank[p], timeout_ms = rank == 0 || c->mode == 1 ? c->timeout_ms : MC_TEST_LIVE_MS;
  if (rank == 0) MC_CHECK(mc_proc_await_connection(&c->id) == 0);
  int64_t t0 = mc_proc_now_ms();
  mc_result_t rc = mc_oob_socket_create(&c->id, rank, c->world, timeout_ms, &s);
  int64_t took = mc_proc_now_ms() - t0;
  const char *msg = mc_last_error();
  MC_CHECK_MSG(rc == MC_ERR_TIMEOUT, "rank %d: create gave %s: %s", rank, mc_result_string(rc), msg);
  MC_CHECK(s == NULL);
  MC_CHECK_MSG(rank != 0 || took >= timeout_ms - 5, "rank 0: timed out after %d ms (timeout %d)", (int)took,
               timeout_ms);
  if (rank == 0) /* rank 1 too, had it not answered by then: it was slow, not missing */
    MC_CHECK_MSG(strstr(msg, "missing rank(s): 2;") || strstr(msg, "missing rank(s): 1,2;"), "rank 0's message: %s",
                 msg);
  else
    MC_CHECK_MSG(strstr(msg, "rank 0") != NULL, "rank %d's message: %s", rank, msg);
  return 0;
}

int test_oob_socket_missing_rank(void) {
  /* mode 0: ranks 0, 1 of 3 show up; mode 1: ranks 1, 2 of 3 (no rank 0). */
  for (int mode = 0; mode < 2; mode++) {
    mc_proc_ctx_t c;
    int codes[MC_PROC_MAX];
    mc_proc_world(&c, 3, 300);
    c.nprocs = 2;
    c.mode = mode;
    if (mode == 1) c.rank[0] = 1, c.rank[1] = 2;
    MC_CHECK_OK(mc_unique_id_create(&c.id));
    MC_CHECK(mc_proc_run(&c, missing_child, 4 * MC_TEST_LIVE_MS, codes) == 0);
    for (int p = 0; p < c.nprocs; p++)
      MC_CHECK_MSG(codes[p] == 0, "mode %d: rank %d exited with %d", mode, c.rank[p], codes[p]);
  }
  return 0;
}

/* mode 0: rank 2 exits after create; mode 1: rank 0 does; mode 2: rank 1
 * stays away from the allgather until the others are done with it (step
 * 0). The others must fail, naming that rank: at once in modes 0 and 1
 * (its connection closes), at rank 0's timeout in mode 2 (the one timeout
 * here that is waited out; all ranks start create together, step 1, so
 * that it is far longer than any of their steps before it). */
static int dies_child(const mc_proc_ctx_t *c, int p) {
  mc_oob_socket_t *s;
  mc_oob_t oob;
  const int away = c->mode == 0 ? 2 : c->mode == 1 ? 0 : 1;
  mc_proc_mark(1);
  mc_proc_await(1, c->world);
  MC_CHECK_OK(mc_oob_socket_create(&c->id, p, c->world, c->timeout_ms, &s));
  MC_CHECK_OK(mc_oob_socket_get(s, &oob));
  if (p == away && c->mode < 2) _exit(0);
  if (p == away) {
    mc_proc_await(0, c->world - 1);
    _exit(0);
  }
  if (expect_fail(&oob, 64, c->mode == 2)) return 1;
  const char *msg = mc_last_error();
  MC_CHECK_MSG(mc_test_blames_only(msg, away) || (c->mode == 2 && strstr(msg, "no answer from rank 0")),
               "rank %d, rank %d away: %s", p, away, msg);
  mc_proc_mark(0);
  mc_oob_socket_destroy(s);
  return 0;
}

int test_oob_socket_peer_dies(void) {
  for (int mode = 0; mode < 3; mode++) {
    mc_proc_ctx_t c;
    int codes[MC_PROC_MAX];
    mc_proc_world(&c, 3, mode == 2 ? 1000 : MC_TEST_LIVE_MS);
    c.mode = mode;
    MC_CHECK_OK(mc_unique_id_create(&c.id));
    MC_CHECK(mc_proc_run(&c, dies_child, 4 * MC_TEST_LIVE_MS, codes) == 0);
    for (int p = 0; p < c.nprocs; p++)
      MC_CHECK_MSG(codes[p] == 0, "mode %d: rank %d exited with %d", mode, p, codes[p]);
  }
  return 0;
}

int test_oob_socket_bad_args(void) {
  mc_unique_id_t id, zero, other;
  static char not_null;
  mc_oob_socket_t *s = (mc_oob_socket_t *)&not_null; /* failures must reset it to NULL */
  mc_oob_t oob;
  MC_CHECK_RC(mc_unique_id_create(NULL), MC_ERR_INVALID_ARG);
  MC_CHECK_OK(mc_unique_id_create(&id));
  MC_CHECK_RC(mc_oob_socket_create(NULL, 0, 1, 1000, &s), MC_ERR_INVALID_ARG);
  MC_CHECK(s == NULL && strstr(mc_last_error(), "id") != NULL);
  MC_CHECK_RC(mc_oob_socket_create(&id, 0, 1, 1000, NULL), MC_ERR_INVALID_ARG);
  MC_CHECK_RC(mc_oob_socket_create(&id, -1, 2, 1000, &s), MC_ERR_INVALID_ARG);
  MC_CHECK_RC(mc_oob_socket_create(&id, 2, 2, 1000, &s), MC_ERR_INVALID_ARG);
  MC_CHECK(strstr(mc_last_error(), "rank=2") != NULL);
  MC_CHECK_RC(mc_oob_socket_create(&id, 0, 0, 1000, &s), MC_ERR_INVALID_ARG);
  MC_CHECK(strstr(mc_last_error(), "world_size=0") != NULL);
  MC_CHECK_RC(mc_oob_socket_create(&id, 0, -3, 1000, &s), MC_ERR_INVALID_ARG);
  MC_CHECK_RC(mc_oob_socket_create(&id, 0, 1, 0, &s), MC_ERR_INVALID_ARG);
  MC_CHECK_RC(mc_oob_socket_create(&id, 0, 1, -5, &s), MC_ERR_INVALID_ARG);
  memset(&zero, 0, sizeof zero); /* not an id */
  MC_CHECK_RC(mc_oob_socket_create(&zero, 1, 2, 1000, &s), MC_ERR_INVALID_ARG);
  other = id; /* an id whose listener this process does not have */
  other.internal[20] ^= 0x01;
  MC_CHECK_RC(mc_oob_socket_create(&other, 0, 2, 1000, &s), MC_ERR_INVALID_ARG);
  MC_CHECK(s == NULL && strstr(mc_last_error(), "listener") != NULL);
  MC_CHECK_RC(mc_oob_socket_get(NULL, &oob), MC_ERR_INVALID_ARG);
  mc_oob_socket_destroy(NULL);

  /* None of the above consumed the id: world_size 1 works with it, once. */
  MC_CHECK_OK(mc_oob_socket_create(&id, 0, 1, 1000, &s));
  MC_CHECK(s != NULL);
  MC_CHECK_RC(mc_oob_socket_get(s, NULL), MC_ERR_INVALID_ARG);
  MC_CHECK_OK(mc_oob_socket_get(s, &oob));
  MC_CHECK(oob.rank == 0 && oob.world_size == 1);
  if (mc_proc_gather_check(&oob, 1, 0) || mc_proc_gather_check(&oob, 1000, 1) || mc_proc_gather_check(&oob, 0, 2)) return 1;
  mc_oob_socket_t *again = NULL;
  MC_CHECK_RC(mc_oob_socket_create(&id, 0, 1, 1000, &again), MC_ERR_INVALID_ARG);
  mc_oob_socket_destroy(s);

  return 0;
}

/* MC_BOOTSTRAP_ADDR: honoured when it is an IPv4 address, refused if not.
 * The library reads its settings once per process: each value in a child
 * of its own, forked before this process touched the library. */
int test_oob_socket_bootstrap_addr(void) {
  mc_unique_id_t other;
  mc_oob_socket_t *s = NULL;
  static const struct {
    const char *addr;
    int want;
  } addrs[] = {{"localhost-ish", MC_ERR_INVALID_ARG}, {"127.0.0.1", MC_SUCCESS}};
  for (int i = 0; i < 2; i++) {
    fflush(NULL);
    pid_t child = fork();
    if (child == 0) {
      setenv("MC_BOOTSTRAP_ADDR", addrs[i].addr, 1);
      mc_result_t rc = mc_unique_id_create(&other);
      if (rc == MC_SUCCESS && mc_oob_socket_create(&other, 0, 1, 1000, &s) == MC_SUCCESS) mc_oob_socket_destroy(s);
      else if (rc == MC_SUCCESS) rc = MC_ERR_INTERNAL;
      if (rc != MC_SUCCESS) fprintf(stderr, "MC_BOOTSTRAP_ADDR=%s: %s\n", addrs[i].addr, mc_last_error());
      _exit((int)rc);
    }
    int st = 0;
    waitpid(child, &st, 0);
    MC_CHECK_MSG(WIFEXITED(st) && WEXITSTATUS(st) == addrs[i].want, "MC_BOOTSTRAP_ADDR=%s: exit %d", addrs[i].addr,
                 st);
  }
  return 0;
}
