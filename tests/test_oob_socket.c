/* test_oob_socket.c - the process bootstrap (mc_unique_id_create,
 * mc_oob_socket_*): ranks are fork()ed children that report through their
 * exit status; the parent makes the id before forking (so rank 0's child
 * inherits the listener) and reaps them with a bounded wait. */
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "mc_test.h"

#define MAX_PROCS 8
#define REFUSED 10 /* exit code of a child whose create was refused as expected */

typedef struct proc_ctx {
  mc_unique_id_t id;
  int world, timeout_ms, nprocs;
  int rank[MAX_PROCS];     /* rank each process claims */
  int delay_ms[MAX_PROCS]; /* sleep before create */
  int mode;                /* per test */
} proc_ctx_t;

typedef int (*proc_fn)(const proc_ctx_t *c, int p);

static int64_t ms_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0) {
  }
}

/* Fork c->nprocs children running fn; codes[p] = exit status, -1 if it was
 * killed. Waits at most wait_ms in all, then kills what is left; returns 0 if
 * every child ended by itself in time. */
static int run_procs(const proc_ctx_t *c, proc_fn fn, int wait_ms, int *codes) {
  pid_t pid[MAX_PROCS];
  int alive = 0, late = 0;
  fflush(stdout);
  fflush(stderr);
  for (int p = 0; p < c->nprocs; p++) {
    codes[p] = -1;
    pid[p] = fork();
    if (pid[p] == 0) {
      if (c->delay_ms[p] > 0) sleep_ms(c->delay_ms[p]);
      int rc = fn(c, p);
      fflush(stderr);
      _exit(rc);
    }
    if (pid[p] > 0) alive++;
  }
  int64_t deadline = ms_now() + wait_ms;
  while (alive > 0) {
    for (int p = 0; p < c->nprocs; p++) {
      int st;
      if (pid[p] > 0 && waitpid(pid[p], &st, WNOHANG) == pid[p]) {
        codes[p] = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
        pid[p] = 0;
        alive--;
      }
    }
    if (alive > 0 && ms_now() > deadline) {
      for (int p = 0; p < c->nprocs; p++)
        if (pid[p] > 0) {
          fprintf(stderr, "process %d (rank %d) still running after %d ms: killed\n", p,
                  c->rank[p], wait_ms);
          kill(pid[p], SIGKILL);
          waitpid(pid[p], NULL, 0);
        }
      late = 1;
      break;
    }
    if (alive > 0) sleep_ms(2);
  }
  for (int p = 0; p < c->nprocs; p++)
    if (pid[p] < 0) return -1; /* fork failed */
  return late ? -1 : 0;
}

/* One world: process p is rank p, no delays. */
static void world_ctx(proc_ctx_t *c, int world, int timeout_ms) {
  memset(c, 0, sizeof *c);
  c->world = c->nprocs = world;
  c->timeout_ms = timeout_ms;
  for (int p = 0; p < world; p++) c->rank[p] = p;
}

/* Bytes that rank `rank` contributes to call `iter`, reproducible anywhere. */
static void fill(unsigned char *b, size_t n, int rank, int iter) {
  uint64_t st = mc_test_seed ^ ((uint64_t)(rank + 1) << 40) ^ ((uint64_t)iter << 20), v = 0;
  for (size_t i = 0; i < n; i++) {
    if (i % 8 == 0) v = mc_test_rand(&st);
    b[i] = (unsigned char)(v >> (8 * (i % 8)));
  }
}

/* One allgather of `bytes` and a check of every rank's part. */
static int gather_check(const mc_oob_t *oob, size_t bytes, int iter) {
  size_t n = (size_t)oob->world_size;
  unsigned char *send = malloc(bytes + 1), *recv = malloc(n * bytes + 1), *want = malloc(bytes + 1);
  MC_CHECK(send && recv && want);
  fill(send, bytes, oob->rank, iter);
  memset(recv, 0xa5, n * bytes);
  MC_CHECK_MSG(oob->allgather(send, recv, bytes, oob->user) == 0, "rank %d: allgather of %zu bytes",
               oob->rank, bytes);
  for (size_t r = 0; r < n; r++) {
    fill(want, bytes, (int)r, iter);
    MC_CHECK_MSG(memcmp(recv + r * bytes, want, bytes) == 0,
                 "rank %d: part of rank %zu wrong (%zu bytes)", oob->rank, r, bytes);
  }
  free(send);
  free(recv);
  free(want);
  return 0;
}

static int allgather_child(const proc_ctx_t *c, int p) {
  static const size_t sizes[] = {1, 8, 13, 4096, 65539, 1u << 20, 3, 1};
  mc_oob_socket_t *s;
  mc_oob_t oob;
  MC_CHECK_OK(mc_oob_socket_create(&c->id, c->rank[p], c->world, c->timeout_ms, &s));
  MC_CHECK_OK(mc_oob_socket_get(s, &oob));
  MC_CHECK(oob.rank == c->rank[p] && oob.world_size == c->world);
  for (int i = 0; i < (int)(sizeof sizes / sizeof sizes[0]); i++)
    if (gather_check(&oob, sizes[i], i)) return 1;
  mc_oob_socket_destroy(s);
  return 0;
}

int test_oob_socket_allgather(void) {
  static const int worlds[] = {1, 2, 3, 5};
  for (int w = 0; w < 4; w++) {
    proc_ctx_t c;
    int codes[MAX_PROCS];
    world_ctx(&c, worlds[w], 10000);
    MC_CHECK_OK(mc_unique_id_create(&c.id));
    MC_CHECK(run_procs(&c, allgather_child, 60000, codes) == 0);
    for (int p = 0; p < c.nprocs; p++)
      MC_CHECK_MSG(codes[p] == 0, "world %d: rank %d exited with %d", c.world, p, codes[p]);
  }
  return 0;
}

/* A process whose create must be refused: exit REFUSED if it is, promptly. */
static int stranger_child(const proc_ctx_t *c, int p, const mc_unique_id_t *id, int world) {
  mc_oob_socket_t *s = NULL;
  int64_t t0 = ms_now();
  mc_result_t rc = mc_oob_socket_create(id, c->rank[p], world, c->timeout_ms, &s);
  MC_CHECK_MSG(rc == MC_ERR_BOOTSTRAP, "process %d: create gave %s: %s", p, mc_result_string(rc),
               mc_last_error());
  MC_CHECK(s == NULL && mc_last_error()[0] != '\0');
  MC_CHECK_MSG(ms_now() - t0 < c->timeout_ms / 2, "refusal took %d ms", (int)(ms_now() - t0));
  return REFUSED;
}

/* mode 0: process 1 has a wrong secret, process 2 the wrong world size;
 * mode 1: processes 1 and 2 both claim rank 1, exactly one may join. */
static int strangers_child(const proc_ctx_t *c, int p) {
  if (c->mode == 0 && p == 1) {
    mc_unique_id_t bad = c->id;
    bad.internal[20] ^= 0x01; /* a byte of the secret (see the layout in mc_oob_socket.c) */
    return stranger_child(c, p, &bad, c->world);
  }
  if (c->mode == 0 && p == 2) return stranger_child(c, p, &c->id, c->world + 1);
  mc_oob_socket_t *s;
  mc_oob_t oob;
  mc_result_t rc = mc_oob_socket_create(&c->id, c->rank[p], c->world, c->timeout_ms, &s);
  if (c->mode == 1 && rc == MC_ERR_BOOTSTRAP && c->rank[p] == 1) return REFUSED;
  MC_CHECK_OK(rc);
  MC_CHECK_OK(mc_oob_socket_get(s, &oob));
  if (gather_check(&oob, 100, 0) || gather_check(&oob, 1, 1)) return 1;
  mc_oob_socket_destroy(s);
  return 0;
}

int test_oob_socket_wrong_secret(void) {
  int codes[MAX_PROCS];
  for (int mode = 0; mode < 2; mode++) {
    /* world 3; the strangers (processes 1, 2) go first, the last real ranks
     * come 300 ms later so that rank 0 reads the strangers' hellos first. */
    proc_ctx_t c;
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
    MC_CHECK(run_procs(&c, strangers_child, 20000, codes) == 0);
    MC_CHECK_MSG(codes[0] == 0, "mode %d: rank 0 exited with %d", mode, codes[0]);
    if (mode == 0) {
      MC_CHECK_MSG(codes[1] == REFUSED && codes[2] == REFUSED, "strangers exited with %d, %d",
                   codes[1], codes[2]);
      MC_CHECK_MSG(codes[3] == 0 && codes[4] == 0, "ranks 1, 2 exited with %d, %d", codes[3],
                   codes[4]);
    } else {
      MC_CHECK_MSG((codes[1] == 0 && codes[2] == REFUSED) || (codes[1] == REFUSED && codes[2] == 0),
                   "the two rank-1 processes exited with %d, %d", codes[1], codes[2]);
      MC_CHECK_MSG(codes[3] == 0, "rank 2 exited with %d", codes[3]);
    }
  }
  return 0;
}

/* A failing allgather must fail within the timeout (plus slack), and the
 * next one at once. */
static int expect_fail(const mc_oob_t *oob, size_t bytes, int timeout_ms) {
  static unsigned char small[4096], big[4096 * MAX_PROCS];
  unsigned char *send = bytes <= sizeof small ? small : NULL;
  unsigned char *recv = bytes <= sizeof small ? big : NULL;
  if (!send) { /* real buffers unless the size is refused before they are touched */
    send = malloc(16);
    recv = malloc(16);
  }
  int64_t t0 = ms_now();
  int rc = oob->allgather(send, recv, bytes, oob->user);
  int64_t took = ms_now() - t0;
  MC_CHECK_MSG(rc != 0, "rank %d: allgather of %zu bytes succeeded", oob->rank, bytes);
  MC_CHECK_MSG(took <= timeout_ms + 500, "rank %d: failure took %d ms (timeout %d)", oob->rank,
               (int)took, timeout_ms);
  t0 = ms_now();
  MC_CHECK(oob->allgather(small, big, 8, oob->user) != 0);
  MC_CHECK_MSG(ms_now() - t0 < 100, "rank %d: poisoned call took %d ms", oob->rank,
               (int)(ms_now() - t0));
  if (send != small) {
    free(send);
    free(recv);
  }
  return 0;
}

/* mode 0: the last rank announces twice the others' size; mode 1: rank 0
 * does; mode 2: rank 1 asks for more than the 256 MiB cap. */
static int oversized_child(const proc_ctx_t *c, int p) {
  mc_oob_socket_t *s;
  mc_oob_t oob;
  MC_CHECK_OK(mc_oob_socket_create(&c->id, p, c->world, c->timeout_ms, &s));
  MC_CHECK_OK(mc_oob_socket_get(s, &oob));
  if (gather_check(&oob, 64, 0)) return 1; /* a proper one first */
  size_t bytes = 1000;
  if ((c->mode == 0 && p == c->world - 1) || (c->mode == 1 && p == 0)) bytes = 2000;
  if (c->mode == 2 && p == 1) bytes = ((size_t)256 << 20) + 1;
  if (expect_fail(&oob, bytes, c->timeout_ms)) return 1;
  mc_oob_socket_destroy(s);
  return 0;
}

int test_oob_socket_oversized(void) {
  for (int mode = 0; mode < 3; mode++) {
    proc_ctx_t c;
    int codes[MAX_PROCS];
    world_ctx(&c, 3, 2000);
    c.mode = mode;
    MC_CHECK_OK(mc_unique_id_create(&c.id));
    MC_CHECK(run_procs(&c, oversized_child, 20000, codes) == 0);
    for (int p = 0; p < c.nprocs; p++)
      MC_CHECK_MSG(codes[p] == 0, "mode %d: rank %d exited with %d", mode, p, codes[p]);
  }
  return 0;
}

static int missing_child(const proc_ctx_t *c, int p) {
  mc_oob_socket_t *s = NULL;
  int64_t t0 = ms_now();
  mc_result_t rc = mc_oob_socket_create(&c->id, c->rank[p], c->world, c->timeout_ms, &s);
  int64_t took = ms_now() - t0;
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
    proc_ctx_t c;
    int codes[MAX_PROCS];
    world_ctx(&c, 3, 300);
    c.nprocs = 2;
    if (mode == 1) c.rank[0] = 1, c.rank[1] = 2;
    MC_CHECK_OK(mc_unique_id_create(&c.id));
    MC_CHECK(run_procs(&c, missing_child, 10000, codes) == 0);
    for (int p = 0; p < c.nprocs; p++)
      MC_CHECK_MSG(codes[p] == 0, "mode %d: rank %d exited with %d", mode, c.rank[p], codes[p]);
  }
  return 0;
}

/* mode 0: rank 2 exits after create; mode 1: rank 0 does; mode 2: rank 1
 * stalls (sleeps past the others' timeout). The others must fail in time. */
static int dies_child(const proc_ctx_t *c, int p) {
  mc_oob_socket_t *s;
  mc_oob_t oob;
  MC_CHECK_OK(mc_oob_socket_create(&c->id, p, c->world, c->timeout_ms, &s));
  MC_CHECK_OK(mc_oob_socket_get(s, &oob));
  if ((c->mode == 0 && p == 2) || (c->mode == 1 && p == 0)) _exit(0);
  if (c->mode == 2 && p == 1) {
    sleep_ms(c->timeout_ms + 1000);
    _exit(0);
  }
  if (expect_fail(&oob, 64, c->timeout_ms)) return 1;
  mc_oob_socket_destroy(s);
  return 0;
}

int test_oob_socket_peer_dies(void) {
  for (int mode = 0; mode < 3; mode++) {
    proc_ctx_t c;
    int codes[MAX_PROCS];
    world_ctx(&c, 3, 1000);
    c.mode = mode;
    MC_CHECK_OK(mc_unique_id_create(&c.id));
    MC_CHECK(run_procs(&c, dies_child, 20000, codes) == 0);
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
  if (gather_check(&oob, 1, 0) || gather_check(&oob, 1000, 1) || gather_check(&oob, 0, 2)) return 1;
  mc_oob_socket_t *again = NULL;
  MC_CHECK_RC(mc_oob_socket_create(&id, 0, 1, 1000, &again), MC_ERR_INVALID_ARG);
  mc_oob_socket_destroy(s);

  /* MC_BOOTSTRAP_ADDR: honoured when it is an IPv4 address, refused if not. */
  const char *old = getenv("MC_BOOTSTRAP_ADDR");
  char *saved = old ? strdup(old) : NULL;
  setenv("MC_BOOTSTRAP_ADDR", "localhost-ish", 1);
  mc_result_t bad = mc_unique_id_create(&other);
  setenv("MC_BOOTSTRAP_ADDR", "127.0.0.1", 1);
  mc_result_t good = mc_unique_id_create(&other);
  if (saved) setenv("MC_BOOTSTRAP_ADDR", saved, 1);
  else unsetenv("MC_BOOTSTRAP_ADDR");
  free(saved);
  MC_CHECK(bad == MC_ERR_INVALID_ARG && good == MC_SUCCESS);
  MC_CHECK_OK(mc_oob_socket_create(&other, 0, 1, 1000, &s));
  mc_oob_socket_destroy(s);
  return 0;
}
