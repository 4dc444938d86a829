/* test_oob_strangers.c - the process bootstrap against what a library
 * process never does: a fake rank 0, junk and replayed proofs, floods of
 * idle connections, other users. The tests speak the wire format of
 * src/bootstrap/mc_oob_socket.c's header comment themselves. Whether a
 * connection was dropped at once or only when idle too long is told by
 * what it received (nothing, or a note), not by the clock; the real ranks
 * come after the strangers by mc_proc_await, not by sleeps; every wait for
 * a live process has MC_TEST_LIVE_MS. */
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

static void set_mc_proc_id_port(mc_unique_id_t *id, uint16_t port) {
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
  int64_t deadline = mc_proc_now_ms() + wait_ms;
  *eof = 0;
  while (got < want) {
    int left = (int)(deadline - mc_proc_now_ms());
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
  int64_t deadline = mc_proc_now_ms() + wait_ms;
  int st;
  while (waitpid(pid, &st, WNOHANG) != pid) {
    if (mc_proc_now_ms() > deadline) {
      fprintf(stderr, "child %d still running after %d ms: killed\n", (int)pid, wait_ms);
      kill(pid, SIGKILL);
      waitpid(pid, NULL, 0);
      return -1;
    }
    mc_proc_sleep_ms(2);
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
  return MC_PROC_REFUSED;
}

/* The fake rank 0 in this process: mode 0 challenges, reads the join and
 * answers "all joined" with a made-up mac; mode 1 hangs up after the join;
 * mode 2 never challenges (and reads what comes until the joining rank
 * gives up). Everything the joining rank sent lands in buf. */
static size_t play_fake_root(int lfd, int mode, unsigned char *buf, size_t cap) {
  int fd = accept_within(lfd, MC_TEST_LIVE_MS), eof;
  if (fd < 0) return (size_t)-1;
  if (mode != 2) send_challenge(fd);
  size_t n = read_for(fd, buf, mode == 2 ? cap : JOIN_BYTES, MC_TEST_LIVE_MS, &eof);
  if (mode == 0) {
    unsigned char ack[ACK_BYTES] = {0};
    uint32_t head[4] = {0x4d43414bu, 0, 2, 0}; /* "MCAK", status 0 (all joined), world 2 */
    memcpy(ack, head, sizeof head);
    memset(ack + 16, 0x5a, ACK_BYTES - 16);
    (void)!write(fd, ack, sizeof ack);
  }
  if (mode == 1) shutdown(fd, SHUT_RDWR);
  if (!eof && n < cap) n += read_for(fd, buf + n, cap - n, MC_TEST_LIVE_MS, &eof); /* until it hangs up */
  close(fd);
  return n;
}

int test_oob_socket_fake_root(void) {
  for (int mode = 0; mode < 3; mode++) {
    fake_ctx_t f = {.mode = mode, .timeout_ms = mode == 2 ? 500 : MC_TEST_LIVE_MS};
    mc_oob_socket_t *s = NULL;
    MC_CHECK_OK(mc_unique_id_create(&f.id));
    /* rank 0 gives up waiting and closes its listener: the port is free */
    MC_CHECK_RC(mc_oob_socket_create(&f.id, 0, 2, 20, &s), MC_ERR_TIMEOUT);
    int lfd = listen_loopback(mc_proc_id_port(&f.id));
    if (lfd < 0) { /* someone else took the freed port already: point the id at ours */
      lfd = listen_loopback(0);
      set_mc_proc_id_port(&f.id, bound_port(lfd));
    }
    MC_CHECK(lfd >= 0);
    pid_t pid = spawn(fake_root_joiner, &f);
    MC_CHECK(pid > 0);
    unsigned char got[4096];
    size_t n = play_fake_root(lfd, mode, got, sizeof got);
    close(lfd);
    int code = reap(pid, 2 * MC_TEST_LIVE_MS);
    MC_CHECK_MSG(code == MC_PROC_REFUSED, "mode %d: the joining rank exited with %d", mode, code);
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
  (void)mc_oob_socket_create(arg, 1, 3, MC_TEST_LIVE_MS, &s); /* fails: the listener is no rank 0 */
  mc_oob_socket_destroy(s);
  return 0;
}

/* Capture a real join of rank 1 of 3 under id's secret, made for another
 * challenge than the one rank 0 will send. */
static int capture_join(const mc_unique_id_t *id) {
  mc_unique_id_t elsewhere = *id;
  int lfd = listen_loopback(0), eof;
  MC_CHECK(lfd >= 0);
  set_mc_proc_id_port(&elsewhere, bound_port(lfd));
  pid_t pid = spawn(capture_joiner, &elsewhere);
  MC_CHECK(pid > 0);
  int fd = accept_within(lfd, MC_TEST_LIVE_MS);
  MC_CHECK(fd >= 0);
  send_challenge(fd);
  size_t n = read_for(fd, replayed_join, JOIN_BYTES, MC_TEST_LIVE_MS, &eof);
  close(fd);
  close(lfd);
  MC_CHECK(reap(pid, 2 * MC_TEST_LIVE_MS) == 0);
  MC_CHECK_MSG(n == JOIN_BYTES, "captured %zu bytes", n);
  return 0;
}

/* A stranger on rank 0's port: mode 0 answers the challenge with junk, 1
 * with the replayed join, 2 sends junk without reading. Rank 0 must close
 * the connection at once, having sent nothing but its challenge: one it
 * dropped as idle, at its handshake deadline, would also have its note. */
static int stranger_conn(int mode, uint16_t port) {
  unsigned char buf[4096];
  int fd = connect_loopback(port), eof = 0;
  MC_CHECK(fd >= 0);
  size_t n = 0;
  if (mode == 2) {
    for (size_t i = 0; i < sizeof buf; i++) buf[i] = (unsigned char)(i * 131 + 7);
    (void)!write(fd, buf, sizeof buf);
  } else {
    n = read_for(fd, buf, CHALLENGE_BYTES, MC_TEST_LIVE_MS, &eof);
    MC_CHECK_MSG(n == CHALLENGE_BYTES, "stranger %d: no challenge (%zu bytes)", mode, n);
    if (mode == 0) memset(buf, 0x33, JOIN_BYTES);
    else memcpy(buf, replayed_join, JOIN_BYTES);
    (void)!write(fd, buf, JOIN_BYTES);
  }
  n += read_for(fd, buf, sizeof buf, MC_TEST_LIVE_MS, &eof);
  close(fd);
  MC_CHECK_MSG(eof, "stranger %d: connection still open after %d ms", mode, MC_TEST_LIVE_MS);
  MC_CHECK_MSG(n <= CHALLENGE_BYTES, "stranger %d: got %zu bytes, more than a challenge", mode, n);
  return 0;
}

/* Processes 0-2 are ranks 0-2, 3-5 strangers; ranks 1 and 2 come once the
 * three strangers are done (step 0), so that rank 0 is still taking joins
 * when they come. */
static int stranger_join_child(const mc_proc_ctx_t *c, int p) {
  if (p >= c->world) {
    const int rc = stranger_conn(p - c->world, mc_proc_id_port(&c->id));
    mc_proc_mark(0);
    return rc;
  }
  if (p > 0) mc_proc_await(0, c->nprocs - c->world);
  mc_oob_socket_t *s;
  mc_oob_t oob;
  MC_CHECK_OK(mc_oob_socket_create(&c->id, c->rank[p], c->world, c->timeout_ms, &s));
  MC_CHECK_OK(mc_oob_socket_get(s, &oob));
  if (mc_proc_gather_check(&oob, 100, 0)) return 1;
  mc_oob_socket_destroy(s);
  return 0;
}

int test_oob_socket_stranger_join(void) {
  mc_proc_ctx_t c;
  int codes[MC_PROC_MAX];
  mc_proc_world(&c, 3, MC_TEST_LIVE_MS);
  c.nprocs = 6;
  MC_CHECK_OK(mc_unique_id_create(&c.id));
  if (capture_join(&c.id)) return 1;
  MC_CHECK(mc_proc_run(&c, stranger_join_child, 4 * MC_TEST_LIVE_MS, codes) == 0);
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
  int64_t t0 = mc_proc_now_ms();
  int total = FLOOD_BEFORE + FLOOD_DURING;
  for (int i = 0; i < total; i++) {
    if (i >= FLOOD_BEFORE && i % 10 == 0) mc_proc_sleep_ms(15);
    fd[i] = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    MC_CHECK(fd[i] >= 0);
    (void)connect(fd[i], (struct sockaddr *)&sa, sizeof sa); /* EINPROGRESS: fine */
  }
  while (mc_proc_now_ms() - t0 < hold_ms) {
    mc_proc_sleep_ms(20);
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
 * accepting once they all wait in its listen queue, while the flood goes on.
 * Every rank must join and exchange, however long the flood held it up: how
 * soon is not asked (MC_OOB_EVICT_GRACE_MS makes it soon; a clock in a test
 * would make its verdict the machine's speed). */
static int flood_child(const mc_proc_ctx_t *c, int p) {
  if (p == c->world) return flooder(mc_proc_id_port(&c->id), 1500);
  mc_oob_socket_t *s;
  mc_oob_t oob;
  MC_CHECK_OK(mc_oob_socket_create(&c->id, c->rank[p], c->world, c->timeout_ms, &s));
  MC_CHECK_OK(mc_oob_socket_get(s, &oob));
  if (mc_proc_gather_check(&oob, 100, 0) || mc_proc_gather_check(&oob, 5000, 1)) return 1;
  mc_oob_socket_destroy(s);
  return 0;
}

int test_oob_socket_flood(void) {
  for (int round = 0; round < 3; round++) {
    mc_proc_ctx_t c;
    int codes[MC_PROC_MAX];
    mc_proc_world(&c, 4, MC_TEST_LIVE_MS);
    c.nprocs = 5;
    c.rank[4] = -1;
    int delays[4] = {300, 60, 120, 180};
    memcpy(c.delay_ms, delays, sizeof delays);
    MC_CHECK_OK(mc_unique_id_create(&c.id));
    MC_CHECK(mc_proc_run(&c, flood_child, 4 * MC_TEST_LIVE_MS, codes) == 0);
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

/* Another user's connection to rank 0: closed at once, not even challenged
 * (a connection challenged, or dropped when idle, would have bytes). Step
 * 0 once it is closed. */
static int nobody_conn(uint16_t port) {
  if (become_nobody()) return 1;
  unsigned char buf[256];
  int fd = connect_loopback(port), eof;
  MC_CHECK(fd >= 0);
  size_t n = read_for(fd, buf, sizeof buf, MC_TEST_LIVE_MS, &eof);
  close(fd);
  mc_proc_mark(0);
  MC_CHECK_MSG(eof && n == 0, "another user's connection: %zu bytes, %s", n, eof ? "closed" : "open");
  return 0;
}

/* mode 0: ranks 0-2 form a group while process 3, another user, connects
 * first (ranks 1 and 2 come once it is closed, step 0); mode 1: rank 0
 * waits alone, starting once that connection waits for it, and its
 * timeout text counts the drop. */
static int other_user_child(const mc_proc_ctx_t *c, int p) {
  if (c->rank[p] < 0) return nobody_conn(mc_proc_id_port(&c->id));
  if (c->mode == 0 && c->rank[p] > 0) mc_proc_await(0, 1);
  if (c->mode == 1) MC_CHECK(mc_proc_await_connection(&c->id) == 0);
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
  if (mc_proc_gather_check(&oob, 100, 0)) return 1;
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
  int fd = accept_within(lfd, MC_TEST_LIVE_MS);
  MC_CHECK(fd >= 0);
  send_challenge(fd);
  unsigned char buf[256];
  size_t n = read_for(fd, buf, sizeof buf, MC_TEST_LIVE_MS, &eof);
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
  MC_CHECK(poll(&p, 1, MC_TEST_LIVE_MS) == 1 && read(pfd[0], &port, sizeof port) == sizeof port);
  close(pfd[0]);
  close(pfd[1]);
  mc_unique_id_t id;
  mc_oob_socket_t *s = NULL;
  MC_CHECK_OK(mc_unique_id_create(&id));
  set_mc_proc_id_port(&id, port);
  mc_result_t rc = mc_oob_socket_create(&id, 1, 2, MC_TEST_LIVE_MS, &s);
  MC_CHECK_MSG(rc == MC_ERR_BOOTSTRAP && strstr(mc_last_error(), "belongs to uid 65534"),
               "joining another user's rank 0: %s: %s", mc_result_string(rc), mc_last_error());
  int code = reap(pid, 2 * MC_TEST_LIVE_MS);
  MC_CHECK_MSG(code == 0, "the other user's fake rank 0 exited with %d", code);
  return 0;
}

int test_oob_socket_other_user(void) {
  if (geteuid() != 0) {
    printf("oob_socket_other_user: skipped: not root, so no process of another user can be made\n");
    return 77;
  }
  for (int mode = 0; mode < 2; mode++) {
    mc_proc_ctx_t c;
    int codes[MC_PROC_MAX];
    mc_proc_world(&c, mode == 0 ? 3 : 2, mode == 0 ? MC_TEST_LIVE_MS : 300);
    c.mode = mode;
    c.nprocs = mode == 0 ? 4 : 2; /* the last process is the other user */
    c.rank[c.nprocs - 1] = -1;
    MC_CHECK_OK(mc_unique_id_create(&c.id));
    MC_CHECK(mc_proc_run(&c, other_user_child, 4 * MC_TEST_LIVE_MS, codes) == 0);
    for (int p = 0; p < c.nprocs; p++)
      MC_CHECK_MSG(codes[p] == 0, "mode %d: process %d exited with %d", mode, p, codes[p]);
  }
  return joiner_refuses_other_user();
}
