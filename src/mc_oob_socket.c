/* mc_oob_socket.c - helper 2 of moecomm.h: the out-of-band allgather for
 * processes on one host, bootstrapped over TCP through a unique id.
 *
 * Wire format (fixed-width fields in host byte order, since every process
 * is on one host; address and port in network order):
 *   unique id  {u32 'MCID', u32 version, u32 ipv4, u16 port, u16 0,
 *               u8 secret[16], i64 creator pid}, zero-padded to 128 bytes.
 *     magic/version reject garbage or an id of another build; the secret is
 *     what keeps strangers out (anyone on the host can reach a loopback port);
 *     the pid only serves error messages.
 *   hello      {u32 'MCHL', u32 version, u8 secret[16], i32 rank, i32 world}
 *     each rank r > 0 sends it once connected. Rank 0 closes, without a word,
 *     a connection with a wrong magic or secret (a stranger, another job), a
 *     rank outside 1..world-1 or already taken (two processes think they are
 *     the same rank), or another world size (a misconfigured launcher), and
 *     keeps waiting for proper peers until the deadline.
 *   ack        {u32 'MCAK', i32 status, i32 world, u32 0}
 *     rank 0 -> every joined rank: status 0 once all joined, 1 when rank 0's
 *     deadline passed first (so every rank's create fails with MC_ERR_TIMEOUT,
 *     not rank 0's alone), 2 on another failure. A refused peer sees EOF.
 *   allgather  {u32 'MCAG', u32 0, u64 bytes, u64 seq} + bytes
 *     every rank r > 0 -> rank 0; rank 0 answers each with the same header +
 *     world*bytes in rank order. Rank 0 refuses a wrong magic, a size that is
 *     not its own (its buffers are sized for its own), a size above 256 MiB
 *     (never wait for or store more than a sane amount on a peer's say-so),
 *     a sequence number not its own (a rank skipped or repeated a call); the
 *     other ranks check rank 0's answer likewise.
 *
 * Time: create is bounded by timeout_ms in total, and so is each allgather.
 * Every socket is non-blocking; each transfer waits in poll() for the time
 * left, retries EINTR and partial transfers, and sends with MSG_NOSIGNAL (a
 * dead peer gives EPIPE, never SIGPIPE). Any allgather failure poisons the
 * object: every socket is closed at once, so peers see EOF and fail fast
 * instead of waiting out their own deadline, and later calls fail at once.
 * Rank 0 closes its listener at the end of its create (joined or not): no one
 * can join later and the port is freed early (processes that inherited the fd
 * through fork keep it open; that is harmless). */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "mc_error.h"

#define ID_MAGIC 0x4d434944u    /* "MCID" */
#define HELLO_MAGIC 0x4d43484cu /* "MCHL" */
#define ACK_MAGIC 0x4d43414bu   /* "MCAK" */
#define MSG_MAGIC 0x4d434147u   /* "MCAG" */
#define WIRE_VERSION 1u
#define MSG_CAP ((uint64_t)256 << 20)
#define MAX_PENDING 64 /* connections accepted whose hello is not complete yet */

typedef struct {
  uint32_t magic, version, addr; /* addr and port in network byte order */
  uint16_t port, pad;
  uint8_t secret[16];
  int64_t pid;
} id_wire_t;
typedef struct { uint32_t magic, version; uint8_t secret[16]; int32_t rank, world_size; } hello_t;
typedef struct { uint32_t magic; int32_t status, world_size; uint32_t pad; } ack_t;
typedef struct { uint32_t magic, pad; uint64_t bytes, seq; } msg_hdr_t;
_Static_assert(sizeof(id_wire_t) == 40 && sizeof(id_wire_t) <= MC_UNIQUE_ID_BYTES, "id layout");
_Static_assert(sizeof(hello_t) == 32 && sizeof(ack_t) == 16 && sizeof(msg_hdr_t) == 24, "wire");

struct mc_oob_socket {
  int rank, world_size, timeout_ms, poisoned;
  uint64_t seq; /* allgathers completed */
  int *fds;     /* rank 0: fds[r] = rank r's connection; rank > 0: fds[0] = rank 0's */
};

/* Listeners of ids made in this process, until rank 0's create takes them.
 * An id never used by a create keeps its listener until the process exits. */
typedef struct listener {
  struct listener *next;
  uint16_t port; /* network byte order, as in the id */
  uint8_t secret[16];
  int fd;
} listener_t;
static pthread_mutex_t listeners_mu = PTHREAD_MUTEX_INITIALIZER;
static listener_t *listeners;

enum { IO_OK, IO_TIMEOUT, IO_EOF, IO_ERR };

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int left_ms(int64_t deadline) {
  int64_t left = deadline - now_ms();
  return left <= 0 ? 0 : left > INT_MAX ? INT_MAX : (int)left;
}

static void close_fd(int *fd) {
  if (*fd >= 0) close(*fd);
  *fd = -1;
}

static void set_nodelay(int fd) {
  int one = 1;
  (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

/* Equal secrets, in time that does not depend on where they differ. */
static int secret_eq(const uint8_t *a, const uint8_t *b) {
  unsigned diff = 0;
  for (int i = 0; i < 16; i++) diff |= (unsigned)(a[i] ^ b[i]);
  return diff == 0;
}

/* Move exactly len bytes over a non-blocking socket by the deadline. The
 * transfer is tried before the clock is read, so a small write into an empty
 * socket succeeds even when the deadline has just passed. */
static int io_full(int fd, void *buf, size_t len, int64_t deadline, int writing) {
  char *p = buf;
  while (len > 0) {
    ssize_t n = writing ? send(fd, p, len, MSG_NOSIGNAL) : recv(fd, p, len, 0);
    if (n > 0) {
      p += n;
      len -= (size_t)n;
      continue;
    }
    if (n == 0) return IO_EOF; /* recv only: send of len > 0 never returns 0 */
    if (errno == EINTR) continue;
    if (errno == EPIPE || errno == ECONNRESET) return IO_EOF;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return IO_ERR;
    int left = left_ms(deadline);
    if (left == 0) return IO_TIMEOUT;
    struct pollfd pfd = {fd, (short)(writing ? POLLOUT : POLLIN), 0};
    if (poll(&pfd, 1, left) < 0 && errno != EINTR) return IO_ERR;
  }
  return IO_OK;
}

/* The secret: getrandom(), else /dev/urandom (kernels before 3.17). Up to
 * 256 bytes come whole from either once the pool is ready. */
static int random_bytes(uint8_t *p, size_t n) {
  ssize_t k;
  do k = getrandom(p, n, 0);
  while (k < 0 && errno == EINTR);
  if (k == (ssize_t)n) return 0;
  int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  do k = read(fd, p, n);
  while (k < 0 && errno == EINTR);
  int e = k < 0 ? errno : EIO;
  close(fd);
  errno = e;
  return k == (ssize_t)n ? 0 : -1;
}

mc_result_t mc_unique_id_create(mc_unique_id_t *out) {
  if (!out) return mc_fail_tls(MC_ERR_INVALID_ARG, "mc_unique_id_create: out is NULL");
  memset(out, 0, sizeof *out);
  id_wire_t w = {ID_MAGIC, WIRE_VERSION, 0, 0, 0, {0}, (int64_t)getpid()};
  const char *env = getenv("MC_BOOTSTRAP_ADDR");
  const char *where = env && *env ? env : "127.0.0.1";
  struct sockaddr_in sa = {.sin_family = AF_INET};
  if (inet_pton(AF_INET, where, &sa.sin_addr) != 1)
    return mc_fail_tls(MC_ERR_INVALID_ARG,
                       "mc_unique_id_create: MC_BOOTSTRAP_ADDR='%s' is not an IPv4 address", where);
  if (random_bytes(w.secret, sizeof w.secret) != 0)
    return mc_fail_tls(MC_ERR_SYSTEM, "mc_unique_id_create: cannot draw the secret: %s",
                       strerror(errno));
  listener_t *l = malloc(sizeof *l);
  if (!l) return mc_fail_tls(MC_ERR_SYSTEM, "mc_unique_id_create: out of memory");
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  socklen_t len = sizeof sa;
  if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(fd, SOMAXCONN) != 0 ||
      getsockname(fd, (struct sockaddr *)&sa, &len) != 0) {
    int e = errno;
    if (fd >= 0) close(fd);
    free(l);
    return mc_fail_tls(MC_ERR_SYSTEM, "mc_unique_id_create: cannot listen on %s (TCP): %s", where,
                       strerror(e));
  }
  w.addr = sa.sin_addr.s_addr;
  w.port = sa.sin_port;
  l->port = w.port;
  memcpy(l->secret, w.secret, sizeof l->secret);
  l->fd = fd;
  pthread_mutex_lock(&listeners_mu);
  l->next = listeners;
  listeners = l;
  pthread_mutex_unlock(&listeners_mu);
  memcpy(out->internal, &w, sizeof w);
  return MC_SUCCESS;
}

/* Remove the id's listener from this process's table; -1 if it is not there. */
static int take_listener(const id_wire_t *w) {
  int fd = -1;
  pthread_mutex_lock(&listeners_mu);
  for (listener_t **pl = &listeners; *pl; pl = &(*pl)->next) {
    listener_t *l = *pl;
    if (l->port == w->port && secret_eq(l->secret, w->secret)) {
      fd = l->fd;
      *pl = l->next;
      free(l);
      break;
    }
  }
  pthread_mutex_unlock(&listeners_mu);
  return fd;
}

/* Tell every joined rank how the join ended (status 0: all joined). */
static mc_result_t send_acks(mc_oob_socket_t *s, int status, int64_t deadline) {
  ack_t a = {ACK_MAGIC, status, s->world_size, 0};
  for (int r = 1; r < s->world_size; r++) {
    if (s->fds[r] < 0) continue;
    if (io_full(s->fds[r], &a, sizeof a, deadline, 1) != IO_OK && status == 0)
      return mc_fail_tls(MC_ERR_BOOTSTRAP,
                         "mc_oob_socket_create: rank 0: rank %d disconnected before the join "
                         "completed", r);
  }
  return MC_SUCCESS;
}

static mc_result_t join_timeout(const mc_oob_socket_t *s, int joined, int refused) {
  char missing[256] = "";
  size_t off = 0;
  int listed = 0;
  for (int r = 1; r < s->world_size && off < sizeof missing; r++) {
    if (s->fds[r] >= 0) continue;
    if (listed++ == 16) {
      snprintf(missing + off, sizeof missing - off, ",...");
      break;
    }
    off += (size_t)snprintf(missing + off, sizeof missing - off, "%s%d", listed > 1 ? "," : "", r);
  }
  return mc_fail_tls(MC_ERR_TIMEOUT,
                     "mc_oob_socket_create: rank 0: timed out after %d ms waiting for %d of %d "
                     "ranks to join; missing rank(s): %s (%d connection(s) refused: wrong secret, "
                     "bad or duplicate rank, or another world_size)",
                     s->timeout_ms, s->world_size - 1 - joined, s->world_size, missing, refused);
}

/* Rank 0: accept until every rank 1..world-1 presented a proper hello. */
static mc_result_t root_join(mc_oob_socket_t *s, const id_wire_t *w, int lfd, int64_t deadline) {
  struct { int fd; size_t got; int64_t since; hello_t h; } pend[MAX_PENDING];
  struct pollfd pfd[MAX_PENDING + 1];
  int slot_of[MAX_PENDING + 1];
  int n = s->world_size, joined = 0, refused = 0;
  mc_result_t rc = MC_SUCCESS;
  for (int i = 0; i < MAX_PENDING; i++) pend[i].fd = -1;
  while (rc == MC_SUCCESS && joined < n - 1) {
    int left = left_ms(deadline);
    if (left == 0) {
      rc = join_timeout(s, joined, refused);
      break;
    }
    int np = 0;
    pfd[np++] = (struct pollfd){lfd, POLLIN, 0};
    for (int i = 0; i < MAX_PENDING; i++)
      if (pend[i].fd >= 0) {
        slot_of[np] = i;
        pfd[np++] = (struct pollfd){pend[i].fd, POLLIN, 0};
      }
    int pr = poll(pfd, (nfds_t)np, left);
    if (pr < 0 && errno != EINTR)
      rc = mc_fail_tls(MC_ERR_SYSTEM, "mc_oob_socket_create: rank 0: poll: %s", strerror(errno));
    if (pr <= 0) continue;
    for (int k = 1; k < np; k++) { /* hellos first: accepting below reuses slots */
      if (!pfd[k].revents) continue;
      int i = slot_of[k];
      char *at = (char *)&pend[i].h + pend[i].got;
      ssize_t got = recv(pend[i].fd, at, sizeof(hello_t) - pend[i].got, 0);
      if (got < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
      if (got <= 0) { /* closed or broken before a whole hello */
        close_fd(&pend[i].fd);
        refused++;
        continue;
      }
      pend[i].got += (size_t)got;
      if (pend[i].got < sizeof(hello_t)) continue;
      const hello_t *h = &pend[i].h;
      int r = h->rank;
      if (h->magic == HELLO_MAGIC && h->version == WIRE_VERSION &&
          secret_eq(h->secret, w->secret) && h->world_size == n && r >= 1 && r < n &&
          s->fds[r] < 0) {
        s->fds[r] = pend[i].fd;
        pend[i].fd = -1;
        joined++;
      } else {
        close_fd(&pend[i].fd);
        refused++;
      }
    }
    while (pfd[0].revents & POLLIN) {
      int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED || errno == EPROTO) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
          rc = mc_fail_tls(MC_ERR_SYSTEM, "mc_oob_socket_create: rank 0: accept: %s",
                           strerror(errno));
        break;
      }
      set_nodelay(fd);
      int slot = 0; /* a free slot, else evict the oldest (a silent stranger) */
      for (int i = 0; i < MAX_PENDING; i++) {
        if (pend[i].fd < 0) {
          slot = i;
          break;
        }
        if (pend[i].since < pend[slot].since) slot = i;
      }
      if (pend[slot].fd >= 0) {
        close_fd(&pend[slot].fd);
        refused++;
      }
      pend[slot].fd = fd;
      pend[slot].got = 0;
      pend[slot].since = now_ms();
    }
  }
  for (int i = 0; i < MAX_PENDING; i++) close_fd(&pend[i].fd);
  if (rc == MC_SUCCESS) return send_acks(s, 0, deadline);
  (void)send_acks(s, rc == MC_ERR_TIMEOUT ? 1 : 2, now_ms() + 100); /* best effort */
  return rc;
}

/* Rank r > 0: connect to rank 0 (retrying until it listens), say hello, wait
 * until rank 0 says that everyone joined. */
static mc_result_t peer_join(mc_oob_socket_t *s, const id_wire_t *w, int64_t deadline) {
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = w->port, .sin_addr = {w->addr}};
  char host[INET_ADDRSTRLEN] = "?";
  inet_ntop(AF_INET, &sa.sin_addr, host, sizeof host);
  unsigned port = ntohs(w->port);
  int me = s->rank, n = s->world_size;
  for (;;) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
      return mc_fail_tls(MC_ERR_SYSTEM, "mc_oob_socket_create: rank %d: socket: %s", me,
                         strerror(errno));
    s->fds[0] = fd;
    int err = connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0 ? 0 : errno;
    if (err == EINPROGRESS || err == EINTR) {
      struct pollfd p = {fd, POLLOUT, 0};
      int pr;
      do pr = poll(&p, 1, left_ms(deadline));
      while (pr < 0 && errno == EINTR);
      socklen_t len = sizeof err;
      if (pr < 0) err = errno;
      else if (pr == 0) err = ETIMEDOUT;
      else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
    }
    if (err == 0) break;
    close_fd(&s->fds[0]);
    if (err != ECONNREFUSED && err != ETIMEDOUT && err != ECONNRESET && err != EAGAIN)
      return mc_fail_tls(MC_ERR_SYSTEM,
                         "mc_oob_socket_create: rank %d: connect to rank 0 at %s:%u: %s", me, host,
                         port, strerror(err));
    int left = left_ms(deadline);
    if (left == 0)
      return mc_fail_tls(MC_ERR_TIMEOUT,
                         "mc_oob_socket_create: rank %d: could not connect to rank 0 at %s:%u "
                         "within %d ms: %s", me, host, port, s->timeout_ms, strerror(err));
    struct timespec pause = {0, (left < 10 ? left : 10) * 1000000L};
    nanosleep(&pause, NULL);
  }
  set_nodelay(s->fds[0]);
  hello_t h = {HELLO_MAGIC, WIRE_VERSION, {0}, me, n};
  memcpy(h.secret, w->secret, sizeof h.secret);
  ack_t a;
  int io = io_full(s->fds[0], &h, sizeof h, deadline, 1);
  if (io == IO_OK) io = io_full(s->fds[0], &a, sizeof a, deadline, 0);
  if (io == IO_OK && a.magic == ACK_MAGIC && a.world_size == n && a.status == 0) return MC_SUCCESS;
  if (io == IO_TIMEOUT)
    return mc_fail_tls(MC_ERR_TIMEOUT,
                       "mc_oob_socket_create: rank %d: rank 0 at %s:%u did not confirm within "
                       "%d ms that all %d ranks joined (is rank 0 running, with this id?)",
                       me, host, port, s->timeout_ms, n);
  if (io == IO_OK && a.magic == ACK_MAGIC && a.status == 1)
    return mc_fail_tls(MC_ERR_TIMEOUT,
                       "mc_oob_socket_create: rank %d: rank 0 timed out before all %d ranks "
                       "joined (its error names the missing ones)", me, n);
  if (io == IO_ERR)
    return mc_fail_tls(MC_ERR_SYSTEM, "mc_oob_socket_create: rank %d: talking to rank 0: %s", me,
                       strerror(errno));
  return mc_fail_tls(MC_ERR_BOOTSTRAP,
                     "mc_oob_socket_create: rank %d: rank 0 at %s:%u refused the join or failed "
                     "(wrong secret, rank %d taken by another process, or world_size %d differs "
                     "from rank 0's)", me, host, port, me, n);
}

void mc_oob_socket_destroy(mc_oob_socket_t *sock) {
  if (!sock) return;
  if (sock->fds)
    for (int r = 0; r < sock->world_size; r++) close_fd(&sock->fds[r]);
  free(sock->fds);
  free(sock);
}

mc_result_t mc_oob_socket_create(const mc_unique_id_t *id, int rank, int world_size, int timeout_ms,
                                 mc_oob_socket_t **out) {
  if (out) *out = NULL;
  const char *bad = !id ? "id is NULL" : !out ? "out is NULL" : world_size < 1 ? "world_size < 1"
                  : rank < 0 || rank >= world_size ? "rank outside 0..world_size-1"
                  : timeout_ms <= 0 ? "timeout_ms <= 0" : NULL;
  if (bad)
    return mc_fail_tls(MC_ERR_INVALID_ARG, "mc_oob_socket_create: %s (rank=%d, world_size=%d, "
                       "timeout_ms=%d)", bad, rank, world_size, timeout_ms);
  id_wire_t w;
  memcpy(&w, id->internal, sizeof w);
  if (w.magic != ID_MAGIC || w.version != WIRE_VERSION || w.port == 0)
    return mc_fail_tls(MC_ERR_INVALID_ARG,
                       "mc_oob_socket_create: rank %d: the id is not one made by "
                       "mc_unique_id_create of this version (magic 0x%08x, version %u)",
                       rank, (unsigned)w.magic, (unsigned)w.version);
  int64_t deadline = now_ms() + timeout_ms;
  mc_oob_socket_t *s = calloc(1, sizeof *s);
  if (s) s->fds = malloc(sizeof(int) * (size_t)world_size);
  if (!s || !s->fds) {
    free(s);
    return mc_fail_tls(MC_ERR_SYSTEM, "mc_oob_socket_create: rank %d: out of memory", rank);
  }
  for (int r = 0; r < world_size; r++) s->fds[r] = -1;
  s->rank = rank;
  s->world_size = world_size;
  s->timeout_ms = timeout_ms;
  mc_result_t rc;
  if (rank == 0) {
    int lfd = take_listener(&w);
    if (lfd < 0) {
      mc_oob_socket_destroy(s);
      return mc_fail_tls(MC_ERR_INVALID_ARG,
                         "mc_oob_socket_create: rank 0: the listener of this id (port %u) is not "
                         "open in this process (pid %d): rank 0 must run in the process that made "
                         "the id (pid %lld) or one forked from it, and may use an id only once",
                         (unsigned)ntohs(w.port), (int)getpid(), (long long)w.pid);
    }
    rc = root_join(s, &w, lfd, deadline);
    close(lfd); /* closed here, joined or not: nobody may join later */
  } else {
    rc = peer_join(s, &w, deadline);
  }
  if (rc != MC_SUCCESS) {
    mc_oob_socket_destroy(s);
    return rc;
  }
  *out = s;
  return MC_SUCCESS;
}

static int hdr_ok(const msg_hdr_t *h, uint64_t bytes, uint64_t seq) {
  return h->magic == MSG_MAGIC && h->bytes <= MSG_CAP && h->bytes == bytes && h->seq == seq;
}

static int socket_allgather(const void *send, void *recv, size_t bytes, void *user) {
  mc_oob_socket_t *s = user;
  if (!s || s->poisoned) return -1;
  int n = s->world_size;
  int ok = bytes <= MSG_CAP && (bytes == 0 || (send && recv));
  int64_t deadline = now_ms() + s->timeout_ms;
  msg_hdr_t mine = {MSG_MAGIC, 0, bytes, s->seq}, theirs;
  char *out = recv;
  if (ok && s->rank == 0) {
    if (bytes) memmove(out, send, bytes);
    for (int r = 1; ok && r < n; r++) /* gather in rank order */
      ok = io_full(s->fds[r], &theirs, sizeof theirs, deadline, 0) == IO_OK &&
           hdr_ok(&theirs, bytes, s->seq) &&
           io_full(s->fds[r], out + (size_t)r * bytes, bytes, deadline, 0) == IO_OK;
    for (int r = 1; ok && r < n; r++)
      ok = io_full(s->fds[r], &mine, sizeof mine, deadline, 1) == IO_OK &&
           io_full(s->fds[r], out, (size_t)n * bytes, deadline, 1) == IO_OK;
  } else if (ok) {
    ok = io_full(s->fds[0], &mine, sizeof mine, deadline, 1) == IO_OK &&
         io_full(s->fds[0], (void *)send, bytes, deadline, 1) == IO_OK &&
         io_full(s->fds[0], &theirs, sizeof theirs, deadline, 0) == IO_OK &&
         hdr_ok(&theirs, bytes, s->seq) &&
         io_full(s->fds[0], out, (size_t)n * bytes, deadline, 0) == IO_OK;
  }
  if (!ok) { /* poison: close everything so the peers fail fast too */
    s->poisoned = 1;
    for (int r = 0; r < n; r++) close_fd(&s->fds[r]);
    return -1;
  }
  s->seq++;
  return 0;
}

mc_result_t mc_oob_socket_get(mc_oob_socket_t *sock, mc_oob_t *out) {
  if (!sock || !out)
    return mc_fail_tls(MC_ERR_INVALID_ARG, "mc_oob_socket_get: %s is NULL", sock ? "out" : "sock");
  out->allgather = socket_allgather;
  out->user = sock;
  out->rank = sock->rank;
  out->world_size = sock->world_size;
  return MC_SUCCESS;
}
