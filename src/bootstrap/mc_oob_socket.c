/* mc_oob_socket.c - helper 2 of moecomm.h: the out-of-band allgather for
 * processes on one host (or on several, through MC_BOOTSTRAP_ADDR),
 * bootstrapped over TCP through a unique id.
 *
 * Wire format (fixed-width fields in host byte order, so every process must
 * share one byte order; address and port in network order):
 *   unique id  {u32 'MCID', u32 version, u32 ipv4, u16 port, u16 0,
 *               u8 secret[16], i64 creator pid}, zero-padded to 128 bytes.
 *     magic/version reject garbage or an id of another build; the secret is
 *     what keeps strangers out (anyone on the host can reach a loopback
 *     port) and never leaves the processes that hold the id: each side
 *     proves it holds it by an HMAC-SHA256 (OpenSSL's libcrypto) over fresh
 *     nonces, so a proof seen on the wire is useless for any other
 *     connection. The pid only serves error messages.
 *   challenge  {u32 'MCCH', u32 version, u8 nonce0[16]}
 *     rank 0 -> each connection it accepts, at once.
 *   join       {u32 'MCJN', u32 version, i32 rank, i32 world, u8 nonce1[16],
 *               u8 mac[32]}
 *     the joining rank's answer: its own fresh nonce1 and
 *     mac = HMAC(secret, "moecomm join\0" | nonce0 | nonce1 | rank | world).
 *   ack        {u32 'MCAK', i32 status, i32 world, u32 0, u8 mac[32]}
 *     rank 0 -> a rank whose join verified, with
 *     mac = HMAC(secret, "moecomm ack\0" | nonce0 | nonce1 | rank | world of
 *     the join | status | world of rank 0); the joining rank trusts nothing
 *     rank 0 says before this mac verifies. Status 0 once all joined, 1 when
 *     rank 0's deadline passed first (so every rank's create fails with
 *     MC_ERR_TIMEOUT, not rank 0's alone), 2 on another failure, 3 the rank
 *     is outside 1..world-1 or taken (two processes think they are the same
 *     rank), 4 another world size (a misconfigured launcher); 3 and 4 come at
 *     once, and rank 0 closes that connection and keeps waiting.
 *     Integers inside a mac are 32-bit little-endian; every compare of a mac
 *     or secret is constant-time (CRYPTO_memcmp).
 *   note       an ack with a zero mac, to a connection that has not proven
 *     the secret (so rank 0 cannot sign for it): status 5 "dropped as too
 *     slow, connect again", or 1 "rank 0 timed out". Anyone can forge one,
 *     so the joining rank only takes it as advice on how to fail or retry;
 *     success needs a signed ack.
 *   allgather  {u32 'MCAG', u32 0, u64 bytes, u64 seq} + bytes
 *     every rank r > 0 -> rank 0; rank 0 answers each with the same header +
 *     world*bytes in rank order. Rank 0 refuses a wrong magic, a size that is
 *     not its own (its buffers are sized for its own), a size above 256 MiB
 *     (never wait for or store more than a sane amount on a peer's say-so),
 *     a sequence number not its own (a rank skipped or repeated a call); the
 *     other ranks check rank 0's answer likewise.
 *
 * Who gets in: rank 0 accepts a connection into one of MAX_PENDING slots and
 * gives it HANDSHAKE_MS (less if its own deadline is nearer) to send a join
 * that verifies; a connection that sends a bad join (wrong secret, garbage,
 * a replayed proof) is closed without a word. When every slot is taken, the
 * oldest is dropped to make room once it had EVICT_GRACE_MS (a live rank
 * answers its challenge far sooner), and the dropped one gets a note so that
 * a slow real rank connects again. A connection that proved the secret
 * leaves the slots at once and is never dropped. Idle connections queued
 * ahead of a rank therefore delay it by about EVICT_GRACE_MS per MAX_PENDING
 * of them, junk ones by less, other users' ones (below) by nothing but the
 * accept; rank 0's timeout text counts what it dropped and why.
 * Loopback: when both ends of a connection are in 127.0.0.0/8, each side
 * also looks up the uid owning the other end (TCP has no SO_PEERCRED: the
 * entry of /proc/net/tcp whose local address is the peer's and remote
 * address is ours) and requires this process's effective uid. Rank 0 does
 * it at accept, before the connection takes a slot, and closes other users'
 * connections at once; a joining rank does it before it answers the
 * challenge, so it sends nothing to a process of another user holding the
 * port (say, after rank 0 exited). All ranks of a group must therefore run
 * as one user. Where /proc/net/tcp cannot be read or holds no live entry for
 * the peer, the check is skipped and the proofs alone decide.
 *
 * Across hosts (MC_BOOTSTRAP_ADDR): the secret never crosses the network, and
 * nobody without it can join the group or pass for rank 0. The handshake is
 * all that is authenticated: the allgather payloads that follow are neither
 * encrypted nor authenticated per message, so anyone who can alter traffic
 * between the hosts can read and alter them. Use it across hosts only on a
 * trusted network, or pass the library your own allgather (mc_oob_t).
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
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
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
#include "mc_params.h"

#define ID_MAGIC 0x4d434944u   /* "MCID" */
#define CHAL_MAGIC 0x4d434348u /* "MCCH" */
#define JOIN_MAGIC 0x4d434a4eu /* "MCJN" */
#define ACK_MAGIC 0x4d43414bu  /* "MCAK" */
#define MSG_MAGIC 0x4d434147u  /* "MCAG" */
#define WIRE_VERSION 2u
#define MSG_CAP ((uint64_t)256 << 20)
#define SECRET_BYTES 16
#define NONCE_BYTES 16
#define MAC_BYTES 32       /* HMAC-SHA256 */
#define MAX_PENDING 128    /* accepted connections that have not proven the secret yet */
#define HANDSHAKE_MS 2000  /* the most a pending connection may take to send its join */
#define EVICT_GRACE_MS 150 /* the least it gets before it may be dropped for a newer one */
#define ACCEPT_BATCH 64    /* accepts per wakeup (one read of /proc/net/tcp for them) */

/* Join statuses of the ack (see the wire format above). */
enum { ST_OK, ST_TIMEOUT, ST_FAILED, ST_RANK_TAKEN, ST_WORLD_DIFFERS, ST_RETRY };

typedef struct {
  uint32_t magic, version, addr; /* addr and port in network byte order */
  uint16_t port, pad;
  uint8_t secret[SECRET_BYTES];
  int64_t pid;
} id_wire_t;
typedef struct { uint32_t magic, version; uint8_t nonce[NONCE_BYTES]; } challenge_t;
typedef struct {
  uint32_t magic, version;
  int32_t rank, world_size;
  uint8_t nonce[NONCE_BYTES], mac[MAC_BYTES];
} join_t;
typedef struct {
  uint32_t magic;
  int32_t status, world_size; /* world_size: rank 0's */
  uint32_t pad;
  uint8_t mac[MAC_BYTES];
} ack_t;
typedef struct { uint32_t magic, pad; uint64_t bytes, seq; } msg_hdr_t;
_Static_assert(sizeof(id_wire_t) == 40 && sizeof(id_wire_t) <= MC_UNIQUE_ID_BYTES, "id layout");
_Static_assert(sizeof(challenge_t) == 24 && sizeof(join_t) == 64 && sizeof(ack_t) == 48 &&
               sizeof(msg_hdr_t) == 24, "wire");

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
  uint8_t secret[SECRET_BYTES];
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

/* One send that never waits, for messages whose loss only costs a clearer
 * error on the other side. */
static void send_once(int fd, const void *buf, size_t len) {
  while (send(fd, buf, len, MSG_NOSIGNAL) < 0 && errno == EINTR) {
  }
}

/* The secret and the nonces: getrandom(), else /dev/urandom (kernels before
 * 3.17). Up to 256 bytes come whole from either once the pool is ready. */
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

/* HMAC-SHA256 under the secret of: label with its NUL (a join proof can
 * never pass for an ack, nor the reverse) | nonce0 | nonce1 | the fields as
 * 32-bit little-endian (the same bytes on every host). 0 on success. */
static int make_mac(const uint8_t *secret, const char *label, const uint8_t *nonce0,
                    const uint8_t *nonce1, const int32_t *field, int nfield, uint8_t *mac) {
  uint8_t msg[16 + 2 * NONCE_BYTES + 4 * 4];
  size_t off = strlen(label) + 1;
  if (off > 16 || nfield > 4) return -1;
  memcpy(msg, label, off);
  memcpy(msg + off, nonce0, NONCE_BYTES);
  memcpy(msg + off + NONCE_BYTES, nonce1, NONCE_BYTES);
  off += 2 * NONCE_BYTES;
  for (int i = 0; i < nfield; i++)
    for (int b = 0; b < 4; b++) msg[off++] = (uint8_t)((uint32_t)field[i] >> (8 * b));
  unsigned len = 0;
  if (!HMAC(EVP_sha256(), secret, SECRET_BYTES, msg, off, mac, &len)) return -1;
  return len == MAC_BYTES ? 0 : -1;
}

/* The joining rank's proof. */
static int join_mac(const uint8_t *secret, const uint8_t *nonce0, const join_t *j, uint8_t *mac) {
  int32_t f[2] = {j->rank, j->world_size};
  return make_mac(secret, "moecomm join", nonce0, j->nonce, f, 2, mac);
}

/* Rank 0's proof, bound to the join it answers. */
static int ack_mac(const uint8_t *secret, const uint8_t *nonce0, const uint8_t *nonce1, int rank,
                   int world, const ack_t *a, uint8_t *mac) {
  int32_t f[4] = {rank, world, a->status, a->world_size};
  return make_mac(secret, "moecomm ack", nonce0, nonce1, f, 4, mac);
}

static int is_loopback(uint32_t addr) { return (ntohl(addr) >> 24) == 127; }

#define KEY_LEN 27 /* "AAAAAAAA:PPPP AAAAAAAA:PPPP" */

/* How /proc/net/tcp names the other end of connection fd when both ends are
 * on loopback: "PEERADDR:PORT OURADDR:PORT" (an address as its raw 32-bit
 * value, a port in host order, both in hex); "" otherwise. */
static void peer_key(int fd, char key[32]) {
  struct sockaddr_in me, peer;
  socklen_t lm = sizeof me, lp = sizeof peer;
  key[0] = '\0';
  if (getsockname(fd, (struct sockaddr *)&me, &lm) != 0 ||
      getpeername(fd, (struct sockaddr *)&peer, &lp) != 0 || me.sin_family != AF_INET ||
      peer.sin_family != AF_INET || !is_loopback(me.sin_addr.s_addr) ||
      !is_loopback(peer.sin_addr.s_addr))
    return;
  snprintf(key, 32, "%08X:%04X %08X:%04X", (unsigned)peer.sin_addr.s_addr,
           (unsigned)ntohs(peer.sin_port), (unsigned)me.sin_addr.s_addr,
           (unsigned)ntohs(me.sin_port));
}

/* uid[i] = the uid owning the other end of loopback connection fd[i], or -1
 * where it cannot be told. TCP sockets have no SO_PEERCRED, but both ends of
 * a loopback connection are sockets of this network namespace, and
 * /proc/net/tcp lists each with its owner: the peer's entry is the one whose
 * local address is the peer's and whose remote address is ours. -1 where
 * the connection is not on loopback, the file cannot be read, or it has no
 * live entry for the peer (inode 0: TIME_WAIT or orphaned, the owner gone or
 * not shown): the caller then skips the check, and the proofs alone decide.
 * One pass serves many connections: the file lists every TCP socket of the
 * namespace, and reading it costs time in proportion. */
static void peer_uids(const int *fd, long *uid, int n) {
  char key[ACCEPT_BATCH][32], line[512];
  int want = 0;
  n = n < ACCEPT_BATCH ? n : ACCEPT_BATCH;
  for (int i = 0; i < n; i++) {
    uid[i] = -1;
    peer_key(fd[i], key[i]);
    want += key[i][0] != '\0';
  }
  FILE *f = want ? fopen("/proc/net/tcp", "re") : NULL;
  if (!f) return;
  while (want > 0 && fgets(line, sizeof line, f)) {
    const char *p = strchr(line, ':'); /* "sl: local rem st tx:rx tr:when retr uid timeout inode" */
    if (!p || strlen(p) < 2 + KEY_LEN) continue;
    for (int i = 0; i < n; i++) {
      unsigned long u, inode;
      if (!key[i][0] || memcmp(p + 2, key[i], KEY_LEN) != 0) continue;
      if (sscanf(p + 2 + KEY_LEN, " %*x %*x:%*x %*x:%*x %*x %lu %*d %lu", &u, &inode) == 2 && inode)
        uid[i] = (long)u;
      key[i][0] = '\0';
      want--;
      break;
    }
  }
  fclose(f);
}

/* Whether uid is known and is not this process's effective one. */
static int other_user(long uid) { return uid >= 0 && (uid_t)uid != geteuid(); }

mc_result_t mc_unique_id_create(mc_unique_id_t *out) {
  if (!out) return mc_fail_tls(MC_ERR_INVALID_ARG, "mc_unique_id_create: out is NULL");
  memset(out, 0, sizeof *out);
  id_wire_t w = {ID_MAGIC, WIRE_VERSION, 0, 0, 0, {0}, (int64_t)getpid()};
  const char *bad = NULL;
  const mc_params_t *params = mc_params(&bad); /* MC_BOOTSTRAP_ADDR */
  if (!params) return mc_fail_tls(MC_ERR_INVALID_ARG, "mc_unique_id_create: %s", bad);
  const char *where = params->bootstrap_addr;
  struct sockaddr_in sa = {.sin_family = AF_INET};
  if (inet_pton(AF_INET, where, &sa.sin_addr) != 1)
    return mc_fail_tls(MC_ERR_INVALID_ARG, "mc_unique_id_create: '%s' is not an IPv4 address", where);
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
    if (l->port == w->port && CRYPTO_memcmp(l->secret, w->secret, SECRET_BYTES) == 0) {
      fd = l->fd;
      *pl = l->next;
      free(l);
      break;
    }
  }
  pthread_mutex_unlock(&listeners_mu);
  return fd;
}

/* ---- rank 0: accept, challenge, verify ---- */

typedef struct {
  int fd;
  size_t got; /* bytes of the join read so far */
  int64_t since, deadline;
  uint8_t nonce[NONCE_BYTES]; /* the challenge it was sent */
  join_t m;
} pending_t;

typedef struct { uint8_t chal[NONCE_BYTES], join[NONCE_BYTES]; } nonces_t;

typedef struct {
  mc_oob_socket_t *s;
  const uint8_t *secret;
  int64_t deadline, paused_until; /* paused_until: no accept before (out of descriptors) */
  int joined;
  int other_user, unproven, idle, refused; /* connections dropped, by reason */
  nonces_t *nonces;                        /* [world]: what a joined rank's ack is bound to */
  pending_t pend[MAX_PENDING];
} root_t;

/* An unsigned status for a connection that has not proven the secret. */
static void send_note(int fd, int status) {
  ack_t a = {ACK_MAGIC, status, 0, 0, {0}};
  send_once(fd, &a, sizeof a);
}

static void drop_pending(pending_t *p, int note, int *count) {
  if (note >= 0) send_note(p->fd, note);
  close_fd(&p->fd);
  (*count)++;
}

/* A signed ack for the join of rank `rank` that came with these nonces. */
static int make_ack(const root_t *rt, const nonces_t *nc, int rank, int world, int status,
                    ack_t *a) {
  *a = (ack_t){ACK_MAGIC, status, rt->s->world_size, 0, {0}};
  return ack_mac(rt->secret, nc->chal, nc->join, rank, world, a, a->mac);
}

/* How many new connections fit now: free slots, and pending ones that had
 * EVICT_GRACE_MS to answer (a live rank answers far sooner). */
static int room(const root_t *rt, int64_t now) {
  int k = 0;
  for (int i = 0; i < MAX_PENDING; i++)
    k += rt->pend[i].fd < 0 || now - rt->pend[i].since >= EVICT_GRACE_MS;
  return k;
}

/* A slot for a new connection: a free one, else the oldest pending one,
 * dropped (room() said that it had its grace). */
static pending_t *take_slot(root_t *rt) {
  int oldest = 0;
  for (int i = 0; i < MAX_PENDING; i++) {
    if (rt->pend[i].fd < 0) return &rt->pend[i];
    if (rt->pend[i].since < rt->pend[oldest].since) oldest = i;
  }
  drop_pending(&rt->pend[oldest], ST_RETRY, &rt->idle);
  return &rt->pend[oldest];
}

/* Put a fresh connection in slot p and send it its challenge: 0, or -1 if
 * the challenge could not go out whole at once (the peer is gone), -2 if no
 * nonce could be drawn. */
static int challenge(root_t *rt, pending_t *p, int fd, int64_t now) {
  challenge_t c = {CHAL_MAGIC, WIRE_VERSION, {0}};
  if (random_bytes(c.nonce, sizeof c.nonce) != 0) return -2;
  ssize_t k;
  do k = send(fd, &c, sizeof c, MSG_NOSIGNAL);
  while (k < 0 && errno == EINTR);
  if (k != (ssize_t)sizeof c) return -1;
  p->fd = fd;
  p->got = 0;
  p->since = now;
  p->deadline = now + HANDSHAKE_MS < rt->deadline ? now + HANDSHAKE_MS : rt->deadline;
  memcpy(p->nonce, c.nonce, sizeof p->nonce);
  return 0;
}

/* Accept up to max waiting connections into fd[]; *n says how many. */
static mc_result_t accept_some(root_t *rt, int lfd, int *fd, int max, int *n) {
  *n = 0;
  while (*n < max) {
    int c = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (c >= 0) {
      fd[(*n)++] = c;
      continue;
    }
    if (errno == EINTR || errno == ECONNABORTED || errno == EPROTO) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) break;
    if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
      rt->paused_until = now_ms() + 10; /* expiring pending connections free some */
      break;
    }
    return mc_fail_tls(MC_ERR_SYSTEM, "mc_oob_socket_create: rank 0: accept: %s",
                       strerror(errno));
  }
  return MC_SUCCESS;
}

/* Accept what waits, as far as there is room: close other users'
 * connections before they take a slot, challenge the rest. */
static mc_result_t root_accept(root_t *rt, int lfd) {
  int fd[ACCEPT_BATCH], n;
  long uid[ACCEPT_BATCH];
  int64_t now = now_ms();
  int max = room(rt, now);
  mc_result_t rc = accept_some(rt, lfd, fd, max < ACCEPT_BATCH ? max : ACCEPT_BATCH, &n);
  peer_uids(fd, uid, n);
  for (int i = 0; i < n; i++) {
    int c = -1;
    if (other_user(uid[i])) {
      rt->other_user++;
    } else if (rc == MC_SUCCESS) {
      set_nodelay(fd[i]);
      c = challenge(rt, take_slot(rt), fd[i], now);
      if (c == -1) rt->unproven++;
      if (c == -2)
        rc = mc_fail_tls(MC_ERR_SYSTEM, "mc_oob_socket_create: rank 0: cannot draw a nonce: %s",
                         strerror(errno));
    }
    if (c != 0) close(fd[i]);
  }
  return rc;
}

/* A complete join: admit its rank if the proof verifies and the rank is
 * free; a proven join that cannot be admitted gets its reason, signed. */
static void root_verify(root_t *rt, pending_t *p) {
  const join_t *m = &p->m;
  uint8_t want[MAC_BYTES];
  if (m->magic != JOIN_MAGIC || m->version != WIRE_VERSION ||
      join_mac(rt->secret, p->nonce, m, want) != 0 ||
      CRYPTO_memcmp(want, m->mac, MAC_BYTES) != 0) {
    drop_pending(p, -1, &rt->unproven); /* a stranger learns nothing, not even why */
    return;
  }
  mc_oob_socket_t *s = rt->s;
  int r = m->rank, n = s->world_size;
  int status = m->world_size != n ? ST_WORLD_DIFFERS
             : r < 1 || r >= n || s->fds[r] >= 0 ? ST_RANK_TAKEN : ST_OK;
  nonces_t nc;
  memcpy(nc.chal, p->nonce, NONCE_BYTES);
  memcpy(nc.join, m->nonce, NONCE_BYTES);
  if (status != ST_OK) {
    ack_t a;
    if (make_ack(rt, &nc, r, m->world_size, status, &a) == 0) send_once(p->fd, &a, sizeof a);
    drop_pending(p, -1, &rt->refused);
    return;
  }
  rt->nonces[r] = nc;
  s->fds[r] = p->fd;
  p->fd = -1;
  rt->joined++;
}

/* Data on a pending connection: more of its join, or its end. */
static void root_read(root_t *rt, pending_t *p) {
  ssize_t got = recv(p->fd, (char *)&p->m + p->got, sizeof p->m - p->got, 0);
  if (got < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) return;
  if (got <= 0) { /* closed or broken before a whole join */
    drop_pending(p, -1, &rt->unproven);
    return;
  }
  p->got += (size_t)got;
  if (p->got == sizeof p->m) root_verify(rt, p);
}

/* Drop pending connections past their handshake deadline; the note lets a
 * real rank that was merely slow connect again. */
static void root_expire(root_t *rt, int64_t now) {
  for (int i = 0; i < MAX_PENDING; i++)
    if (rt->pend[i].fd >= 0 && now >= rt->pend[i].deadline)
      drop_pending(&rt->pend[i], ST_RETRY, &rt->idle);
}

/* How long poll may wait: until the overall deadline, the next handshake
 * deadline, the end of an accept pause, or (no room) the moment the oldest
 * pending connection may be dropped. *listen: whether to poll the listener. */
static int root_wait(const root_t *rt, int64_t now, int *listen) {
  int64_t until = rt->deadline, oldest = now;
  for (int i = 0; i < MAX_PENDING; i++) {
    const pending_t *p = &rt->pend[i];
    if (p->fd >= 0 && p->deadline < until) until = p->deadline;
    if (p->fd >= 0 && p->since < oldest) oldest = p->since;
  }
  *listen = now >= rt->paused_until && room(rt, now) > 0;
  if (now < rt->paused_until && rt->paused_until < until) until = rt->paused_until;
  if (now >= rt->paused_until && !*listen && oldest + EVICT_GRACE_MS < until)
    until = oldest + EVICT_GRACE_MS;
  return left_ms(until > now ? until : now);
}

/* Tell every joined rank how the join ended (status 0: all joined). */
static mc_result_t send_acks(const root_t *rt, int status, int64_t deadline) {
  const mc_oob_socket_t *s = rt->s;
  for (int r = 1; r < s->world_size; r++) {
    ack_t a;
    if (s->fds[r] < 0) continue;
    int ok = make_ack(rt, &rt->nonces[r], r, s->world_size, status, &a) == 0 &&
             io_full(s->fds[r], &a, sizeof a, deadline, 1) == IO_OK;
    if (!ok && status == ST_OK)
      return mc_fail_tls(MC_ERR_BOOTSTRAP,
                         "mc_oob_socket_create: rank 0: rank %d disconnected before the join "
                         "completed", r);
  }
  return MC_SUCCESS;
}

static mc_result_t join_timeout(const root_t *rt) {
  const mc_oob_socket_t *s = rt->s;
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
                     "ranks to join; missing rank(s): %s; connections dropped: %d of other "
                     "users, %d that did not prove the id's secret, %d idle past the handshake "
                     "deadline, %d refused for a taken rank or another world_size",
                     s->timeout_ms, s->world_size - 1 - rt->joined, s->world_size, missing,
                     rt->other_user, rt->unproven, rt->idle, rt->refused);
}

/* One wait for events and their handling. */
static mc_result_t root_step(root_t *rt, int lfd) {
  struct pollfd pfd[MAX_PENDING + 1];
  int slot_of[MAX_PENDING + 1], np = 0, listen;
  int64_t now = now_ms();
  root_expire(rt, now);
  int wait = root_wait(rt, now, &listen);
  if (listen) pfd[np++] = (struct pollfd){lfd, POLLIN, 0};
  for (int i = 0; i < MAX_PENDING; i++)
    if (rt->pend[i].fd >= 0) {
      slot_of[np] = i;
      pfd[np++] = (struct pollfd){rt->pend[i].fd, POLLIN, 0};
    }
  int pr = poll(pfd, (nfds_t)np, wait);
  if (pr < 0 && errno != EINTR)
    return mc_fail_tls(MC_ERR_SYSTEM, "mc_oob_socket_create: rank 0: poll: %s", strerror(errno));
  if (pr <= 0) return MC_SUCCESS;
  for (int k = listen; k < np; k++) /* joins first: accepting below reuses slots */
    if (pfd[k].revents) root_read(rt, &rt->pend[slot_of[k]]);
  if (listen && (pfd[0].revents & POLLIN)) return root_accept(rt, lfd);
  return MC_SUCCESS;
}

/* Rank 0: accept until every rank 1..world-1 proved the secret. */
static mc_result_t root_join(mc_oob_socket_t *s, const id_wire_t *w, int lfd, int64_t deadline) {
  root_t *rt = calloc(1, sizeof *rt);
  if (rt) rt->nonces = calloc((size_t)s->world_size, sizeof *rt->nonces);
  if (!rt || !rt->nonces) {
    free(rt);
    return mc_fail_tls(MC_ERR_SYSTEM, "mc_oob_socket_create: rank 0: out of memory");
  }
  rt->s = s;
  rt->secret = w->secret;
  rt->deadline = deadline;
  for (int i = 0; i < MAX_PENDING; i++) rt->pend[i].fd = -1;
  mc_result_t rc = MC_SUCCESS;
  while (rc == MC_SUCCESS && rt->joined < s->world_size - 1)
    rc = left_ms(deadline) == 0 ? join_timeout(rt) : root_step(rt, lfd);
  int note = rc == MC_ERR_TIMEOUT ? ST_TIMEOUT : -1; /* a rank in mid-handshake fails too */
  for (int i = 0; i < MAX_PENDING; i++)
    if (rt->pend[i].fd >= 0) drop_pending(&rt->pend[i], note, &rt->idle);
  if (rc == MC_SUCCESS) rc = send_acks(rt, ST_OK, deadline);
  else (void)send_acks(rt, rc == MC_ERR_TIMEOUT ? ST_TIMEOUT : ST_FAILED, now_ms() + 100);
  free(rt->nonces);
  free(rt);
  return rc;
}

/* ---- rank r > 0: connect, prove, check rank 0's proof ---- */

/* Where rank 0 is, for messages. */
typedef struct {
  struct sockaddr_in sa;
  char host[INET_ADDRSTRLEN];
  unsigned port;
} root_addr_t;

/* Connect to rank 0, retrying until it listens or the deadline passes;
 * the connection lands in s->fds[0]. */
static mc_result_t peer_connect(mc_oob_socket_t *s, const root_addr_t *at, int64_t deadline) {
  int me = s->rank;
  for (;;) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
      return mc_fail_tls(MC_ERR_SYSTEM, "mc_oob_socket_create: rank %d: socket: %s", me,
                         strerror(errno));
    s->fds[0] = fd;
    int err = connect(fd, (const struct sockaddr *)&at->sa, sizeof at->sa) == 0 ? 0 : errno;
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
                         "mc_oob_socket_create: rank %d: connect to rank 0 at %s:%u: %s", me,
                         at->host, at->port, strerror(err));
    int left = left_ms(deadline);
    if (left == 0)
      return mc_fail_tls(MC_ERR_TIMEOUT,
                         "mc_oob_socket_create: rank %d: could not connect to rank 0 at %s:%u "
                         "within %d ms: %s", me, at->host, at->port, s->timeout_ms, strerror(err));
    struct timespec pause = {0, (left < 10 ? left : 10) * 1000000L};
    nanosleep(&pause, NULL);
  }
  set_nodelay(s->fds[0]);
  return MC_SUCCESS;
}

/* Read rank 0's challenge and check who holds the other end before any
 * answer goes out. */
static mc_result_t peer_challenge(const mc_oob_socket_t *s, const root_addr_t *at,
                                  int64_t deadline, challenge_t *c) {
  int me = s->rank, io = io_full(s->fds[0], c, sizeof *c, deadline, 0);
  if (io == IO_TIMEOUT)
    return mc_fail_tls(MC_ERR_TIMEOUT,
                       "mc_oob_socket_create: rank %d: rank 0 at %s:%u sent no challenge within "
                       "%d ms (is rank 0 in mc_oob_socket_create, with this id?)",
                       me, at->host, at->port, s->timeout_ms);
  if (io == IO_ERR)
    return mc_fail_tls(MC_ERR_SYSTEM, "mc_oob_socket_create: rank %d: talking to rank 0: %s", me,
                       strerror(errno));
  if (io == IO_EOF || c->magic != CHAL_MAGIC)
    return mc_fail_tls(MC_ERR_BOOTSTRAP,
                       "mc_oob_socket_create: rank %d: rank 0 at %s:%u %s (rank 0 may have exited "
                       "or timed out, leaving its port to another process; or rank 0 runs as "
                       "another user and drops this user's connections)",
                       me, at->host, at->port,
                       io == IO_EOF ? "closed the connection before its challenge"
                                    : "sent no valid challenge");
  if (c->version != WIRE_VERSION)
    return mc_fail_tls(MC_ERR_BOOTSTRAP,
                       "mc_oob_socket_create: rank %d: rank 0 at %s:%u speaks wire version %u, "
                       "this library %u", me, at->host, at->port, (unsigned)c->version,
                       WIRE_VERSION);
  long uid;
  peer_uids(&s->fds[0], &uid, 1);
  if (other_user(uid))
    return mc_fail_tls(MC_ERR_BOOTSTRAP,
                       "mc_oob_socket_create: rank %d: the process at %s:%u (rank 0's address) "
                       "belongs to uid %ld, not to this process's user (uid %ld); nothing was "
                       "sent to it. Rank 0 may have exited, leaving its port to another user's "
                       "process, or the ranks run as different users (they must run as one)",
                       me, at->host, at->port, uid, (long)geteuid());
  return MC_SUCCESS;
}

static mc_result_t not_proven(const mc_oob_socket_t *s, const root_addr_t *at, const char *how) {
  return mc_fail_tls(MC_ERR_BOOTSTRAP,
                     "mc_oob_socket_create: rank %d: rank 0 at %s:%u did not prove it holds the "
                     "id's secret (%s): rank 0 may have exited, leaving its port to another "
                     "process, or this id is not the one rank 0 made; the secret was never sent",
                     s->rank, at->host, at->port, how);
}

/* What a verified ack says. */
static mc_result_t peer_status(const mc_oob_socket_t *s, const root_addr_t *at, const ack_t *a) {
  int me = s->rank, n = s->world_size;
  if (a->status == ST_OK && a->world_size == n) return MC_SUCCESS;
  if (a->status == ST_TIMEOUT)
    return mc_fail_tls(MC_ERR_TIMEOUT,
                       "mc_oob_socket_create: rank %d: rank 0 timed out before all %d ranks "
                       "joined (its error names the missing ones)", me, n);
  if (a->status == ST_RANK_TAKEN)
    return mc_fail_tls(MC_ERR_BOOTSTRAP,
                       "mc_oob_socket_create: rank %d: rank 0 at %s:%u refused the join: rank %d "
                       "is taken by another process", me, at->host, at->port, me);
  if (a->status == ST_WORLD_DIFFERS)
    return mc_fail_tls(MC_ERR_BOOTSTRAP,
                       "mc_oob_socket_create: rank %d: rank 0 at %s:%u refused the join: "
                       "world_size %d differs from rank 0's %d", me, at->host, at->port, n,
                       (int)a->world_size);
  return mc_fail_tls(MC_ERR_BOOTSTRAP,
                     "mc_oob_socket_create: rank %d: rank 0 at %s:%u failed before all %d ranks "
                     "joined (its error says why)", me, at->host, at->port, n);
}

/* Answer rank 0's challenge with a proof, then check rank 0's proof in its
 * ack. *retry: rank 0 asked this rank to connect again (it was too slow). */
static mc_result_t peer_handshake(mc_oob_socket_t *s, const id_wire_t *w, const root_addr_t *at,
                                  int64_t deadline, int *retry) {
  challenge_t c;
  mc_result_t rc = peer_challenge(s, at, deadline, &c);
  if (rc != MC_SUCCESS) return rc;
  join_t j = {JOIN_MAGIC, WIRE_VERSION, s->rank, s->world_size, {0}, {0}};
  uint8_t want[MAC_BYTES];
  if (random_bytes(j.nonce, sizeof j.nonce) != 0 || join_mac(w->secret, c.nonce, &j, j.mac) != 0)
    return mc_fail_tls(MC_ERR_SYSTEM, "mc_oob_socket_create: rank %d: cannot make the join proof "
                       "(random bytes or HMAC-SHA256 failed)", s->rank);
  ack_t a;
  int io = io_full(s->fds[0], &j, sizeof j, deadline, 1);
  if (io == IO_OK || io == IO_EOF) /* a peer that hung up may have left a note */
    io = io_full(s->fds[0], &a, sizeof a, deadline, 0);
  if (io == IO_TIMEOUT)
    return mc_fail_tls(MC_ERR_TIMEOUT,
                       "mc_oob_socket_create: rank %d: rank 0 at %s:%u did not confirm within "
                       "%d ms that all %d ranks joined (is rank 0 running, with this id?)",
                       s->rank, at->host, at->port, s->timeout_ms, s->world_size);
  if (io == IO_ERR)
    return mc_fail_tls(MC_ERR_SYSTEM, "mc_oob_socket_create: rank %d: talking to rank 0: %s",
                       s->rank, strerror(errno));
  if (io == IO_EOF || a.magic != ACK_MAGIC)
    return not_proven(s, at, io == IO_EOF ? "it closed the connection after this rank's proof"
                                          : "its answer is not an ack");
  if (ack_mac(w->secret, c.nonce, j.nonce, s->rank, s->world_size, &a, want) != 0)
    return mc_fail_tls(MC_ERR_SYSTEM, "mc_oob_socket_create: rank %d: HMAC-SHA256 failed",
                       s->rank);
  if (CRYPTO_memcmp(want, a.mac, MAC_BYTES) == 0) return peer_status(s, at, &a);
  if (a.status == ST_RETRY) {
    *retry = 1;
    return mc_fail_tls(MC_ERR_TIMEOUT,
                       "mc_oob_socket_create: rank %d: rank 0 at %s:%u kept dropping this rank's "
                       "connection before its proof arrived (too many other connections), and "
                       "%d ms passed", s->rank, at->host, at->port, s->timeout_ms);
  }
  if (a.status == ST_TIMEOUT) /* a note: unsigned, it only picks how to fail */
    return mc_fail_tls(MC_ERR_TIMEOUT,
                       "mc_oob_socket_create: rank %d: rank 0 at %s:%u says it timed out before "
                       "all %d ranks joined (before it checked this rank's proof)",
                       s->rank, at->host, at->port, s->world_size);
  return not_proven(s, at, "its answer did not verify");
}

/* Rank r > 0: join rank 0, connecting again while rank 0 asks it to. */
static mc_result_t peer_join(mc_oob_socket_t *s, const id_wire_t *w, int64_t deadline) {
  root_addr_t at = {.sa = {.sin_family = AF_INET, .sin_port = w->port, .sin_addr = {w->addr}},
                    .host = "?", .port = ntohs(w->port)};
  inet_ntop(AF_INET, &at.sa.sin_addr, at.host, sizeof at.host);
  for (;;) {
    int retry = 0;
    mc_result_t rc = peer_connect(s, &at, deadline);
    if (rc == MC_SUCCESS) rc = peer_handshake(s, w, &at, deadline, &retry);
    if (!retry || left_ms(deadline) == 0) return rc;
    close_fd(&s->fds[0]);
  }
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
