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

/* ---- strangers: a fake rank 0, junk and replays, floods, other users ----
 * The tests below speak the wire format of src/bootstrap/mc_oob_socket.c's header
 * comment themselves, to play the parts a library process never plays. */

#define ID_PORT_AT 12   /* u16 port, network order, in the id */
#define ID_SECRET_AT 16 /* u8 secret[16] */
#define CHALLENGE_BYTES 24
#define JOIN_BYTES 64
#define ACK_BYTES 48
#define NOBODY 65534

static void close_quiet(int *fd) {
  if (*fd >= 0) close(*fd);
  *fd = -1;
}

static uint16_t id_port(const mc_unique_id_t *id) {
  uint16_t p;
  memcpy(&p, id->internal + ID_PORT_AT, sizeof p);
  return p;
}

static void set_id_port(mc_unique_id_t *id, uint16_t port) {
  memcpy(id->internal + ID_PORT_AT, &port, sizeof port);
}

/* Whether any 8 consecutive bytes of the id's secret occur in buf. */
static int holds_secret(const mc_unique_id_t *id, const unsigned char *buf, size_t n) {
  for (int at = 0; at + 8 <= 16; at++)
    if (memmem(buf, n, id->internal + ID_SECRET_AT + at, 8)) return 1;
  return 0;
}

/* A listener on 127.0.0.1:port (network order; 0 for any port). */
static int listen_loopback(uint16_t port) {
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = port};
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
  if (fd < 0) return -1;
  (void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(fd, 16) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

static uint16_t bound_port(int fd) {
  struct sockaddr_in sa;
  socklen_t len = sizeof sa;
  return getsockname(fd, (struct sockaddr *)&sa, &len) == 0 ? sa.sin_port : 0;
}

/* accept() within wait_ms; -1 if nobody came. */
static int accept_within(int lfd, int wait_ms) {
  struct pollfd p = {lfd, POLLIN, 0};
  return poll(&p, 1, wait_ms) == 1 ? accept4(lfd, NULL, NULL, SOCK_CLOEXEC) : -1;
}

/* A blocking connection to 127.0.0.1:port (network order), or -1. */
static int connect_loopback(uint16_t port) {
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = port};
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
    close(fd);
    fd = -1;
  }
  return fd;
}

/* Read into buf until `want` bytes, EOF (or a reset) or wait_ms; returns the
 * bytes read, *eof whether the peer closed. */
static size_t read_for(int fd, unsigned char *buf, size_t want, int wait_ms, int *eof) {
  size_t got = 0;
  int64_t deadline = ms_now() + wait_ms;
  *eof = 0;
  while (got < want) {
    int left = (int)(deadline - ms_now());
    struct pollfd p = {fd, POLLIN, 0};
    if (left <= 0 || poll(&p, 1, left) != 1) break;
    ssize_t k = recv(fd, buf + got, want - got, MSG_DONTWAIT);
    if (k < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (k <= 0) {
      *eof = 1;
      break;
    }
    got += (size_t)k;
  }
  return got;
}

/* A challenge as rank 0 sends it: "MCCH", version 2, a nonce. */
static void send_challenge(int fd) {
  unsigned char c[CHALLENGE_BYTES];
  uint32_t head[2] = {0x4d434348u, 2u};
  memcpy(c, head, sizeof head);
  for (int i = 8; i < CHALLENGE_BYTES; i++) c[i] = (unsigned char)(i * 37 + 11);
  (void)!write(fd, c, sizeof c);
}

/* Fork a child that runs fn(arg) and exits with its result. */
static pid_t spawn(int (*fn)(const void *), const void *arg) {
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid == 0) {
    int rc = fn(arg);
    fflush(stderr);
    _exit(rc);
  }
  return pid;
}

/* The child's exit status, waiting at most wait_ms (then killing it): -1 if
 * it was killed or did not exit by itself. */
static int reap(pid_t pid, int wait_ms) {
  int64_t deadline = ms_now() + wait_ms;
  int st;
  while (waitpid(pid, &st, WNOHANG) != pid) {
    if (ms_now() > deadline) {
      fprintf(stderr, "child %d still running after %d ms: killed\n", (int)pid, wait_ms);
      kill(pid, SIGKILL);
      waitpid(pid, NULL, 0);
      return -1;
    }
    sleep_ms(2);
  }
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

typedef struct fake_ctx {
  mc_unique_id_t id;
  int mode, timeout_ms;
} fake_ctx_t;

/* Rank 1 of 2 joining a fake rank 0: its create must fail, with the text
 * that says rank 0 did not prove it holds the secret (mode 2: the fake says
 * nothing, so the create times out). */
static int fake_root_joiner(const void *arg) {
  const fake_ctx_t *f = arg;
  mc_oob_socket_t *s = NULL;
  mc_result_t rc = mc_oob_socket_create(&f->id, 1, 2, f->timeout_ms, &s);
  const char *msg = mc_last_error();
  mc_result_t want = f->mode == 2 ? MC_ERR_TIMEOUT : MC_ERR_BOOTSTRAP;
  MC_CHECK_MSG(rc == want && s == NULL, "mode %d: create gave %s: %s", f->mode,
               mc_result_string(rc), msg);
  if (f->mode != 2)
    MC_CHECK_MSG(strstr(msg, "did not prove it holds the id's secret") && strstr(msg, "127.0.0.1:"),
                 "mode %d: message: %s", f->mode, msg);
  return REFUSED;
}

/* The fake rank 0 in this process: mode 0 challenges, reads the join and
 * answers "all joined" with a made-up mac; mode 1 hangs up after the join;
 * mode 2 never challenges. Everything the joining rank sent lands in buf. */
static size_t play_fake_root(int lfd, int mode, unsigned char *buf, size_t cap) {
  int fd = accept_within(lfd, 5000), eof;
  if (fd < 0) return (size_t)-1;
  if (mode != 2) send_challenge(fd);
  size_t n = read_for(fd, buf, mode == 2 ? cap : JOIN_BYTES, mode == 2 ? 1500 : 3000, &eof);
  if (mode == 0) {
    unsigned char ack[ACK_BYTES] = {0};
    uint32_t head[4] = {0x4d43414bu, 0, 2, 0}; /* "MCAK", status 0 (all joined), world 2 */
    memcpy(ack, head, sizeof head);
    memset(ack + 16, 0x5a, ACK_BYTES - 16);
    (void)!write(fd, ack, sizeof ack);
  }
  if (mode == 1) shutdown(fd, SHUT_RDWR);
  if (!eof && n < cap) n += read_for(fd, buf + n, cap - n, 3000, &eof); /* until it hangs up */
  close(fd);
  return n;
}

int test_oob_socket_fake_root(void) {
  for (int mode = 0; mode < 3; mode++) {
    fake_ctx_t f = {.mode = mode, .timeout_ms = mode == 2 ? 500 : 4000};
    mc_oob_socket_t *s = NULL;
    MC_CHECK_OK(mc_unique_id_create(&f.id));
    /* rank 0 gives up waiting and closes its listener: the port is free */
    MC_CHECK_RC(mc_oob_socket_create(&f.id, 0, 2, 20, &s), MC_ERR_TIMEOUT);
    int lfd = listen_loopback(id_port(&f.id));
    if (lfd < 0) { /* someone else took the freed port already: point the id at ours */
      lfd = listen_loopback(0);
      set_id_port(&f.id, bound_port(lfd));
    }
    MC_CHECK(lfd >= 0);
    pid_t pid = spawn(fake_root_joiner, &f);
    MC_CHECK(pid > 0);
    unsigned char got[4096];
    size_t n = play_fake_root(lfd, mode, got, sizeof got);
    close(lfd);
    int code = reap(pid, 8000);
    MC_CHECK_MSG(code == REFUSED, "mode %d: the joining rank exited with %d", mode, code);
    MC_CHECK_MSG(n == (mode == 2 ? 0u : (size_t)JOIN_BYTES),
                 "mode %d: the fake rank 0 got %zu bytes", mode, n);
    MC_CHECK_MSG(!holds_secret(&f.id, got, n), "mode %d: the secret went to the fake rank 0", mode);
  }
  return 0;
}

/* A join that rank 1 sent to someone else, replayed below. */
static unsigned char replayed_join[JOIN_BYTES];

static int capture_joiner(const void *arg) {
  mc_oob_socket_t *s = NULL;
  (void)mc_oob_socket_create(arg, 1, 3, 3000, &s); /* fails: the listener is no rank 0 */
  mc_oob_socket_destroy(s);
  return 0;
}

/* Capture a real join of rank 1 of 3 under id's secret, made for another
 * challenge than the one rank 0 will send. */
static int capture_join(const mc_unique_id_t *id) {
  mc_unique_id_t elsewhere = *id;
  int lfd = listen_loopback(0), eof;
  MC_CHECK(lfd >= 0);
  set_id_port(&elsewhere, bound_port(lfd));
  pid_t pid = spawn(capture_joiner, &elsewhere);
  MC_CHECK(pid > 0);
  int fd = accept_within(lfd, 5000);
  MC_CHECK(fd >= 0);
  send_challenge(fd);
  size_t n = read_for(fd, replayed_join, JOIN_BYTES, 3000, &eof);
  close(fd);
  close(lfd);
  MC_CHECK(reap(pid, 5000) == 0);
  MC_CHECK_MSG(n == JOIN_BYTES, "captured %zu bytes", n);
  return 0;
}

/* A stranger on rank 0's port: mode 0 answers the challenge with junk, 1
 * with the replayed join, 2 sends junk without reading. Rank 0 must close
 * the connection soon, having sent nothing but its challenge. */
static int stranger_conn(int mode, uint16_t port) {
  unsigned char buf[4096];
  int fd = connect_loopback(port), eof = 0;
  MC_CHECK(fd >= 0);
  size_t n = 0;
  if (mode == 2) {
    for (size_t i = 0; i < sizeof buf; i++) buf[i] = (unsigned char)(i * 131 + 7);
    (void)!write(fd, buf, sizeof buf);
  } else {
    n = read_for(fd, buf, CHALLENGE_BYTES, 3000, &eof);
    MC_CHECK_MSG(n == CHALLENGE_BYTES, "stranger %d: no challenge (%zu bytes)", mode, n);
    if (mode == 0) memset(buf, 0x33, JOIN_BYTES);
    else memcpy(buf, replayed_join, JOIN_BYTES);
    (void)!write(fd, buf, JOIN_BYTES);
  }
  int64_t t0 = ms_now();
  n += read_for(fd, buf, sizeof buf, 3000, &eof);
  close(fd);
  MC_CHECK_MSG(eof && ms_now() - t0 < 1000, "stranger %d: connection still open after %d ms", mode,
               (int)(ms_now() - t0));
  MC_CHECK_MSG(n <= CHALLENGE_BYTES, "stranger %d: got %zu bytes, more than a challenge", mode, n);
  return 0;
}

/* Processes 0-2 are ranks 0-2, 3-5 strangers that come first. */
static int stranger_join_child(const proc_ctx_t *c, int p) {
  if (p >= c->world) return stranger_conn(p - c->world, id_port(&c->id));
  mc_oob_socket_t *s;
  mc_oob_t oob;
  MC_CHECK_OK(mc_oob_socket_create(&c->id, c->rank[p], c->world, c->timeout_ms, &s));
  MC_CHECK_OK(mc_oob_socket_get(s, &oob));
  if (gather_check(&oob, 100, 0)) return 1;
  mc_oob_socket_destroy(s);
  return 0;
}

int test_oob_socket_stranger_join(void) {
  proc_ctx_t c;
  int codes[MAX_PROCS];
  world_ctx(&c, 3, 5000);
  c.nprocs = 6;
  c.delay_ms[1] = c.delay_ms[2] = 300;
  MC_CHECK_OK(mc_unique_id_create(&c.id));
  if (capture_join(&c.id)) return 1;
  MC_CHECK(run_procs(&c, stranger_join_child, 20000, codes) == 0);
  for (int p = 0; p < c.nprocs; p++)
    MC_CHECK_MSG(codes[p] == 0, "process %d exited with %d", p, codes[p]);
  return 0;
}

#define FLOOD_BEFORE 150 /* idle connections opened at once */
#define FLOOD_DURING 300 /* then 10 every 15 ms, while the ranks connect and rank 0 accepts */

/* Open idle connections to rank 0's port and keep them until hold_ms; each
 * may receive a challenge and an unsigned note (an ack with a zero mac, so a
 * dropped connection), never anything else. */
static int flooder(uint16_t port, int hold_ms) {
  static int fd[FLOOD_BEFORE + FLOOD_DURING];
  static unsigned char got[FLOOD_BEFORE + FLOOD_DURING][CHALLENGE_BYTES + ACK_BYTES + 1];
  static size_t n[FLOOD_BEFORE + FLOOD_DURING];
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = port};
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  int64_t t0 = ms_now();
  int total = FLOOD_BEFORE + FLOOD_DURING;
  for (int i = 0; i < total; i++) {
    if (i >= FLOOD_BEFORE && i % 10 == 0) sleep_ms(15);
    fd[i] = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    MC_CHECK(fd[i] >= 0);
    (void)connect(fd[i], (struct sockaddr *)&sa, sizeof sa); /* EINPROGRESS: fine */
  }
  while (ms_now() - t0 < hold_ms) {
    sleep_ms(20);
    for (int i = 0; i < total; i++) {
      ssize_t k = fd[i] < 0 ? 0 : recv(fd[i], got[i] + n[i], sizeof got[i] - n[i], MSG_DONTWAIT);
      if (k > 0) n[i] += (size_t)k;
      else if (fd[i] >= 0 && (k == 0 || (errno != EAGAIN && errno != EINTR))) close_quiet(&fd[i]);
    }
  }
  for (int i = 0; i < total; i++) {
    uint32_t magic = 0, mac_or = 0;
    if (n[i] > CHALLENGE_BYTES) memcpy(&magic, got[i] + CHALLENGE_BYTES, 4);
    for (size_t b = CHALLENGE_BYTES + 16; b < n[i]; b++) mac_or |= got[i][b];
    MC_CHECK_MSG(n[i] == 0 || n[i] == CHALLENGE_BYTES ||
                     (n[i] == CHALLENGE_BYTES + ACK_BYTES && magic == 0x4d43414bu && mac_or == 0),
                 "idle connection %d got %zu bytes", i, n[i]);
    close_quiet(&fd[i]);
  }
  return 0;
}

/* Process 4 floods from the start; ranks 1-3 connect in the midst of it,
 * each with over a hundred idle connections queued behind it; rank 0 starts
 * accepting once they all wait in its listen queue, while the flood goes on. */
static int flood_child(const proc_ctx_t *c, int p) {
  if (p == c->world) return flooder(id_port(&c->id), 1500);
  mc_oob_socket_t *s;
  mc_oob_t oob;
  int64_t t0 = ms_now();
  MC_CHECK_OK(mc_oob_socket_create(&c->id, c->rank[p], c->world, c->timeout_ms, &s));
  MC_CHECK_MSG(ms_now() - t0 < c->timeout_ms / 2, "rank %d: the join took %d ms", c->rank[p],
               (int)(ms_now() - t0));
  MC_CHECK_OK(mc_oob_socket_get(s, &oob));
  if (gather_check(&oob, 100, 0) || gather_check(&oob, 5000, 1)) return 1;
  mc_oob_socket_destroy(s);
  return 0;
}

int test_oob_socket_flood(void) {
  for (int round = 0; round < 3; round++) {
    proc_ctx_t c;
    int codes[MAX_PROCS];
    world_ctx(&c, 4, 8000);
    c.nprocs = 5;
    c.rank[4] = -1;
    int delays[4] = {300, 60, 120, 180};
    memcpy(c.delay_ms, delays, sizeof delays);
    MC_CHECK_OK(mc_unique_id_create(&c.id));
    MC_CHECK(run_procs(&c, flood_child, 20000, codes) == 0);
    for (int p = 0; p < c.nprocs; p++)
      MC_CHECK_MSG(codes[p] == 0, "round %d: process %d exited with %d", round, p, codes[p]);
  }
  return 0;
}

/* Become uid and gid NOBODY (root only). */
static int become_nobody(void) {
  MC_CHECK(setgroups(0, NULL) == 0 && setgid(NOBODY) == 0 && setuid(NOBODY) == 0);
  MC_CHECK(geteuid() == NOBODY);
  return 0;
}

/* Another user's connection to rank 0: closed at once, not even challenged. */
static int nobody_conn(uint16_t port) {
  if (become_nobody()) return 1;
  unsigned char buf[256];
  int fd = connect_loopback(port), eof;
  MC_CHECK(fd >= 0);
  int64_t t0 = ms_now();
  size_t n = read_for(fd, buf, sizeof buf, 3000, &eof);
  close(fd);
  MC_CHECK_MSG(eof && n == 0 && ms_now() - t0 < 1000,
               "another user's connection: %zu bytes, %s after %d ms", n, eof ? "closed" : "open",
               (int)(ms_now() - t0));
  return 0;
}

/* mode 0: ranks 0-2 form a group while process 3, another user, connects
 * first; mode 1: rank 0 waits alone and its timeout text counts the drop. */
static int other_user_child(const proc_ctx_t *c, int p) {
  if (c->rank[p] < 0) return nobody_conn(id_port(&c->id));
  mc_oob_socket_t *s = NULL;
  mc_oob_t oob;
  mc_result_t rc = mc_oob_socket_create(&c->id, c->rank[p], c->world, c->timeout_ms, &s);
  if (c->mode == 1) {
    MC_CHECK_MSG(rc == MC_ERR_TIMEOUT && strstr(mc_last_error(), "dropped: 1 of other users"),
                 "rank 0: %s: %s", mc_result_string(rc), mc_last_error());
    return 0;
  }
  MC_CHECK_OK(rc);
  MC_CHECK_OK(mc_oob_socket_get(s, &oob));
  if (gather_check(&oob, 100, 0)) return 1;
  mc_oob_socket_destroy(s);
  return 0;
}

/* A fake rank 0 of another user: it listens, reports its port through the
 * pipe, challenges whoever comes, and exits 0 if nothing came back. */
static int nobody_root(const void *arg) {
  const int *pipe_w = arg;
  if (become_nobody()) return 1;
  int lfd = listen_loopback(0), eof;
  uint16_t port = bound_port(lfd);
  MC_CHECK(lfd >= 0 && write(*pipe_w, &port, sizeof port) == sizeof port);
  int fd = accept_within(lfd, 5000);
  MC_CHECK(fd >= 0);
  send_challenge(fd);
  unsigned char buf[256];
  size_t n = read_for(fd, buf, sizeof buf, 3000, &eof);
  MC_CHECK_MSG(n == 0 && eof, "the rank sent %zu bytes to another user's process", n);
  return 0;
}

static int joiner_refuses_other_user(void) {
  int pfd[2];
  uint16_t port = 0;
  MC_CHECK(pipe(pfd) == 0);
  pid_t pid = spawn(nobody_root, &pfd[1]);
  MC_CHECK(pid > 0);
  struct pollfd p = {pfd[0], POLLIN, 0};
  MC_CHECK(poll(&p, 1, 5000) == 1 && read(pfd[0], &port, sizeof port) == sizeof port);
  close(pfd[0]);
  close(pfd[1]);
  mc_unique_id_t id;
  mc_oob_socket_t *s = NULL;
  MC_CHECK_OK(mc_unique_id_create(&id));
  set_id_port(&id, port);
  mc_result_t rc = mc_oob_socket_create(&id, 1, 2, 3000, &s);
  MC_CHECK_MSG(rc == MC_ERR_BOOTSTRAP && strstr(mc_last_error(), "belongs to uid 65534"),
               "joining another user's rank 0: %s: %s", mc_result_string(rc), mc_last_error());
  int code = reap(pid, 8000);
  MC_CHECK_MSG(code == 0, "the other user's fake rank 0 exited with %d", code);
  return 0;
}

int test_oob_socket_other_user(void) {
  if (geteuid() != 0) {
    printf("oob_socket_other_user: skipped: not root, so no process of another user can be made\n");
    return 77;
  }
  for (int mode = 0; mode < 2; mode++) {
    proc_ctx_t c;
    int codes[MAX_PROCS];
    world_ctx(&c, mode == 0 ? 3 : 2, mode == 0 ? 5000 : 800);
    c.mode = mode;
    c.nprocs = mode == 0 ? 4 : 2; /* the last process is the other user */
    c.rank[c.nprocs - 1] = -1;
    c.delay_ms[0] = 50;
    if (mode == 0) c.delay_ms[1] = c.delay_ms[2] = 300;
    MC_CHECK_OK(mc_unique_id_create(&c.id));
    MC_CHECK(run_procs(&c, other_user_child, 20000, codes) == 0);
    for (int p = 0; p < c.nprocs; p++)
      MC_CHECK_MSG(codes[p] == 0, "mode %d: process %d exited with %d", mode, p, codes[p]);
  }
  return joiner_refuses_other_user();
}
