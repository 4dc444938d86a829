/* test_oob_socket.c - the process bootstrap (mc_unique_id_create,
 * mc_oob_socket_*): ranks are fork()ed children that report through their
 * exit status; the parent makes the id before forking (so rank 0's child
 * inherits the listener) and reaps them with a bounded wait. */
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
    mc_proc_world(&c, worlds[w], 10000);
    MC_CHECK_OK(mc_unique_id_create(&c.id));
    MC_CHECK(mc_proc_run(&c, allgather_child, 60000, codes) == 0);
    for (int p = 0; p < c.nprocs; p++)
      MC_CHECK_MSG(codes[p] == 0, "world %d: rank %d exited with %d", c.world, p, codes[p]);
  }
  return 0;
}

/* A process whose create must be refused: exit MC_PROC_REFUSED if it is, promptly. */
static int stranger_child(const mc_proc_ctx_t *c, int p, const mc_unique_id_t *id, int world) {
  mc_oob_socket_t *s = NULL;
  int64_t t0 = mc_proc_now_ms();
  mc_result_t rc = mc_oob_socket_create(id, c->rank[p], world, c->timeout_ms, &s);
  MC_CHECK_MSG(rc == MC_ERR_BOOTSTRAP, "process %d: create gave %s: %s", p, mc_result_string(rc),
               mc_last_error());
  MC_CHECK(s == NULL && mc_last_error()[0] != '\0');
  MC_CHECK_MSG(mc_proc_now_ms() - t0 < c->timeout_ms / 2, "refusal took %d ms", (int)(mc_proc_now_ms() - t0));
  return MC_PROC_REFUSED;
}

/* mode 0: process 1 has a wrong secret, process 2 the wrong world size;
 * mode 1: processes 1 and 2 both claim rank 1, exactly one may join. */
static int strangers_child(const mc_proc_ctx_t *c, int p) {
  if (c->mode == 0 && p == 1) {
    mc_unique_id_t bad = c->id;
    bad.internal[20] ^= 0x01; /* a byte of the secret (see the layout in mc_oob_socket.c) */
    return stranger_child(c, p, &bad, c->world);
  }
  if (c->mode == 0 && p == 2) return stranger_child(c, p, &c->id, c->world + 1);
  mc_oob_socket_t *s;
  mc_oob_t oob;
  mc_result_t rc = mc_oob_socket_create(&c->id, c->rank[p], c->world, c->timeout_ms, &s);
  if (c->mode == 1 && rc == MC_ERR_BOOTSTRAP && c->rank[p] == 1) return MC_PROC_REFUSED;
  MC_CHECK_OK(rc);
  MC_CHECK_OK(mc_oob_socket_get(s, &oob));
  if (mc_proc_gather_check(&oob, 100, 0) || mc_proc_gather_check(&oob, 1, 1)) return 1;
  mc_oob_socket_destroy(s);
  return 0;
}

int test_oob_socket_wrong_secret(void) {
  int codes[MC_PROC_MAX];
  for (int mode = 0; mode < 2; mode++) {
    /* world 3; the strangers (processes 1, 2) go first, the last real ranks
     * come 300 ms later so that rank 0 reads the strangers' hellos first. */
    mc_proc_ctx_t c;
    memset(&c, 0, sizeof c);
    c.world = 3;
    c.timeout_ms = 5000;
    c.nprocs = 5;
    c.mode = mode;
    int ranks[5] = {0, 1, 1, 1, 2}, delays[5] = {0, 0, 0, 300, 300};
    if (mode == 1) ranks[3] = 2, delays[3] = 300, c.nprocs = 4; /* 0, 1, 1, 2 */
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

/* A failing allgather must fail within the timeout (plus slack), and the
 * next one at once. */
static int expect_fail(const mc_oob_t *oob, size_t bytes, int timeout_ms) {
  static unsigned char small[4096], big[4096 * MC_PROC_MAX];
  unsigned char *send = bytes <= sizeof small ? small : NULL;
  unsigned char *recv = bytes <= sizeof small ? big : NULL;
  if (!send) { /* real buffers unless the size is refused before they are touched */
    send = malloc(16);
    recv = malloc(16);
  }
  int64_t t0 = mc_proc_now_ms();
  int rc = oob->allgather(send, recv, bytes, oob->user);
  int64_t took = mc_proc_now_ms() - t0;
  MC_CHECK_MSG(rc != 0, "rank %d: allgather of %zu bytes succeeded", oob->rank, bytes);
  MC_CHECK_MSG(took <= timeout_ms + 500, "rank %d: failure took %d ms (timeout %d)", oob->rank,
               (int)took, timeout_ms);
  t0 = mc_proc_now_ms();
  MC_CHECK(oob->allgather(small, big, 8, oob->user) != 0);
  MC_CHECK_MSG(mc_proc_now_ms() - t0 < 100, "rank %d: poisoned call took %d ms", oob->rank,
               (int)(mc_proc_now_ms() - t0));
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
  if (expect_fail(&oob, bytes, c->timeout_ms)) return 1;
  mc_oob_socket_destroy(s);
  return 0;
}

int test_oob_socket_oversized(void) {
  for (int mode = 0; mode < 3; mode++) {
    mc_proc_ctx_t c;
    int codes[MC_PROC_MAX];
    mc_proc_world(&c, 3, 2000);
    c.mode = mode;
    MC_CHECK_OK(mc_unique_id_create(&c.id));
    MC_CHECK(mc_proc_run(&c, oversized_child, 20000, codes) == 0);
    for (int p = 0; p < c.nprocs; p++)
      MC_CHECK_MSG(codes[p] == 0, "mode %d: rank %d exited with %d", mode, p, codes[p]);
  }
  return 0;
}

static int missing_child(const mc_proc_ctx_t *c, int p) {
  mc_oob_socket_t *s = NULL;
  int64_t t0 = mc_proc_now_ms();
  mc_result_t rc = mc_oob_socket_create(&c->id, c->rank[p], c->world, c->timeout_ms, &s);
  int64_t took = mc_proc_now_ms() - t0;
  const char *msg = mc_last_error();
  MC_CHECK_MSG(rc == MC_ERR_TIMEOUT, "rank %d: create gave %s: %s", c->rank[p],
               mc_result_string(rc), msg);
  MC_CHECK(s == NULL);
  /* rank 0 waits its whole timeout; another rank may hear of it a bit sooner */
  MC_CHECK_MSG(took <= c->timeout_ms + 1000 && (c->rank[p] != 0 || took >= c->timeout_ms - 5),
               "rank %d: timed out after %d ms (timeout %d)", c->rank[p], (int)took, c->timeout_ms);
  if (c->rank[p] == 0)
    MC_CHECK_MSG(strstr(msg, "missing rank(s): 2") != NULL, "rank 0's message: %s", msg);
  else
    MC_CHECK_MSG(strstr(msg, "rank 0") != NULL, "rank %d's message: %s", c->rank[p], msg);
  return 0;
}

int test_oob_socket_missing_rank(void) {
  /* mode 0: ranks 0, 1 of 3 show up; mode 1: ranks 1, 2 of 3 (no rank 0). */
  for (int mode = 0; mode < 2; mode++) {
    mc_proc_ctx_t c;
    int codes[MC_PROC_MAX];
    mc_proc_world(&c, 3, 300);
    c.nprocs = 2;
    if (mode == 1) c.rank[0] = 1, c.rank[1] = 2;
    MC_CHECK_OK(mc_unique_id_create(&c.id));
    MC_CHECK(mc_proc_run(&c, missing_child, 10000, codes) == 0);
    for (int p = 0; p < c.nprocs; p++)
      MC_CHECK_MSG(codes[p] == 0, "mode %d: rank %d exited with %d", mode, c.rank[p], codes[p]);
  }
  return 0;
}

/* mode 0: rank 2 exits after create; mode 1: rank 0 does; mode 2: rank 1
 * stalls (sleeps past the others' timeout). The others must fail in time. */
static int dies_child(const mc_proc_ctx_t *c, int p) {
  mc_oob_socket_t *s;
  mc_oob_t oob;
  MC_CHECK_OK(mc_oob_socket_create(&c->id, p, c->world, c->timeout_ms, &s));
  MC_CHECK_OK(mc_oob_socket_get(s, &oob));
  if ((c->mode == 0 && p == 2) || (c->mode == 1 && p == 0)) _exit(0);
  if (c->mode == 2 && p == 1) {
    mc_proc_sleep_ms(c->timeout_ms + 1000);
    _exit(0);
  }
  if (expect_fail(&oob, 64, c->timeout_ms)) return 1;
  mc_oob_socket_destroy(s);
  return 0;
}

int test_oob_socket_peer_dies(void) {
  for (int mode = 0; mode < 3; mode++) {
    mc_proc_ctx_t c;
    int codes[MC_PROC_MAX];
    mc_proc_world(&c, 3, 1000);
    c.mode = mode;
    MC_CHECK_OK(mc_unique_id_create(&c.id));
    MC_CHECK(mc_proc_run(&c, dies_child, 20000, codes) == 0);
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
