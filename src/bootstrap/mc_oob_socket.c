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
 *   note       {u32 'MCNT', u32 kind, u64 rank, u64 seq}
 *     who is to blame for a failed allgather, or that a rank left: rank 0
 *     -> every rank in place of an answer, a rank -> rank 0 in place of its
 *     part, and on destroy (mc_oob_gather.c says when and what kinds).
 *
 * Who gets in: rank 0 accepts a connection into one of MC_OOB_MAX_PENDING slots and
 * gives it MC_OOB_HANDSHAKE_MS (less if its own deadline is nearer) to send a join
 * that verifies; a connection that sends a bad join (wrong secret, garbage,
 * a replayed proof) is closed without a word. When every slot is taken, the
 * oldest is dropped to make room once it had MC_OOB_EVICT_GRACE_MS (a live rank
 * answers its challenge far sooner), and the dropped one gets a note so that
 * a slow real rank connects again. A connection that proved the secret
 * leaves the slots at once and is never dropped. Idle connections queued
 * ahead of a rank therefore delay it by about MC_OOB_EVICT_GRACE_MS per MC_OOB_MAX_PENDING
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
 * object: every socket is closed at once, after a note that names the rank
 * at fault, so peers fail fast naming it instead of waiting out their own
 * deadline, and later calls fail at once (mc_oob_gather.c). Rank 0 closes
 * its listener at the end of its create (joined or not): no one can join
 * later and the port is freed early (processes that inherited the fd
 * through fork keep it open; that is harmless). */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <openssl/crypto.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "mc_error.h"
#include "mc_oob_wire.h"
#include "mc_params.h"

/* Listeners of ids made in this process, until rank 0's create takes them.
 * An id never used by a create keeps its listener until the process exits. */
typedef struct listener {
  struct listener *next;
  uint16_t port; /* network byte order, as in the id */
  uint8_t secret[MC_OOB_SECRET_BYTES];
  int fd;
} listener_t;
static pthread_mutex_t listeners_mu = PTHREAD_MUTEX_INITIALIZER;
static listener_t *listeners;

mc_result_t mc_unique_id_create(mc_unique_id_t *out) {
  if (!out) return mc_fail_tls(MC_ERR_INVALID_ARG, "mc_unique_id_create: out is NULL");
  memset(out, 0, sizeof *out);
  mc_oob_id_wire_t w = {MC_OOB_ID_MAGIC, MC_OOB_WIRE_VERSION, 0, 0, 0, {0}, (int64_t)getpid()};
  const char *bad = NULL;
  const mc_params_t *params = mc_params(&bad); /* MC_BOOTSTRAP_ADDR */
  if (!params) return mc_fail_tls(MC_ERR_INVALID_ARG, "mc_unique_id_create: %s", bad);
  const char *where = params->bootstrap_addr;
  struct sockaddr_in sa = {.sin_family = AF_INET};
  if (inet_pton(AF_INET, where, &sa.sin_addr) != 1)
    return mc_fail_tls(MC_ERR_INVALID_ARG, "mc_unique_id_create: '%s' is not an IPv4 address", where);
  if (mc_oob_random(w.secret, sizeof w.secret) != 0)
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
static int take_listener(const mc_oob_id_wire_t *w) {
  int fd = -1;
  pthread_mutex_lock(&listeners_mu);
  for (listener_t **pl = &listeners; *pl; pl = &(*pl)->next) {
    listener_t *l = *pl;
    if (l->port == w->port && CRYPTO_memcmp(l->secret, w->secret, MC_OOB_SECRET_BYTES) == 0) {
      fd = l->fd;
      *pl = l->next;
      free(l);
      break;
    }
  }
  pthread_mutex_unlock(&listeners_mu);
  return fd;
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
      do pr = poll(&p, 1, mc_oob_left_ms(deadline));
      while (pr < 0 && errno == EINTR);
      socklen_t len = sizeof err;
      if (pr < 0) err = errno;
      else if (pr == 0) err = ETIMEDOUT;
      else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
    }
    if (err == 0) break;
    mc_oob_close_fd(&s->fds[0]);
    if (err != ECONNREFUSED && err != ETIMEDOUT && err != ECONNRESET && err != EAGAIN)
      return mc_fail_tls(MC_ERR_SYSTEM,
                         "mc_oob_socket_create: rank %d: connect to rank 0 at %s:%u: %s", me,
                         at->host, at->port, strerror(err));
    int left = mc_oob_left_ms(deadline);
    if (left == 0)
      return mc_fail_tls(MC_ERR_TIMEOUT,
                         "mc_oob_socket_create: rank %d: could not connect to rank 0 at %s:%u "
                         "within %d ms: %s", me, at->host, at->port, s->timeout_ms, strerror(err));
    struct timespec pause = {0, (left < 10 ? left : 10) * 1000000L};
    nanosleep(&pause, NULL);
  }
  mc_oob_nodelay(s->fds[0]);
  return MC_SUCCESS;
}

/* Read rank 0's challenge and check who holds the other end before any
 * answer goes out. */
static mc_result_t peer_challenge(const mc_oob_socket_t *s, const root_addr_t *at,
                                  int64_t deadline, mc_oob_challenge_t *c) {
  int me = s->rank, io = mc_oob_io(s->fds[0], c, sizeof *c, deadline, 0);
  if (io == MC_OOB_IO_TIMEOUT)
    return mc_fail_tls(MC_ERR_TIMEOUT,
                       "mc_oob_socket_create: rank %d: rank 0 at %s:%u sent no challenge within "
                       "%d ms (is rank 0 in mc_oob_socket_create, with this id?)",
                       me, at->host, at->port, s->timeout_ms);
  if (io == MC_OOB_IO_ERR)
    return mc_fail_tls(MC_ERR_SYSTEM, "mc_oob_socket_create: rank %d: talking to rank 0: %s", me,
                       strerror(errno));
  if (io == MC_OOB_IO_EOF || c->magic != MC_OOB_CHAL_MAGIC)
    return mc_fail_tls(MC_ERR_BOOTSTRAP,
                       "mc_oob_socket_create: rank %d: rank 0 at %s:%u %s (rank 0 may have exited "
                       "or timed out, leaving its port to another process; or rank 0 runs as "
                       "another user and drops this user's connections)",
                       me, at->host, at->port,
                       io == MC_OOB_IO_EOF ? "closed the connection before its challenge"
                                    : "sent no valid challenge");
  if (c->version != MC_OOB_WIRE_VERSION)
    return mc_fail_tls(MC_ERR_BOOTSTRAP,
                       "mc_oob_socket_create: rank %d: rank 0 at %s:%u speaks wire version %u, "
                       "this library %u", me, at->host, at->port, (unsigned)c->version,
                       MC_OOB_WIRE_VERSION);
  long uid;
  mc_oob_peer_uids(&s->fds[0], &uid, 1);
  if (mc_oob_other_user(uid))
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
static mc_result_t peer_status(const mc_oob_socket_t *s, const root_addr_t *at, const mc_oob_ack_t *a) {
  int me = s->rank, n = s->world_size;
  if (a->status == MC_OOB_ST_OK && a->world_size == n) return MC_SUCCESS;
  if (a->status == MC_OOB_ST_TIMEOUT)
    return mc_fail_tls(MC_ERR_TIMEOUT,
                       "mc_oob_socket_create: rank %d: rank 0 timed out before all %d ranks "
                       "joined (its error names the missing ones)", me, n);
  if (a->status == MC_OOB_ST_RANK_TAKEN)
    return mc_fail_tls(MC_ERR_BOOTSTRAP,
                       "mc_oob_socket_create: rank %d: rank 0 at %s:%u refused the join: rank %d "
                       "is taken by another process", me, at->host, at->port, me);
  if (a->status == MC_OOB_ST_WORLD_DIFFERS)
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
static mc_result_t peer_handshake(mc_oob_socket_t *s, const mc_oob_id_wire_t *w, const root_addr_t *at,
                                  int64_t deadline, int *retry) {
  mc_oob_challenge_t c;
  mc_result_t rc = peer_challenge(s, at, deadline, &c);
  if (rc != MC_SUCCESS) return rc;
  mc_oob_join_t j = {MC_OOB_JOIN_MAGIC, MC_OOB_WIRE_VERSION, s->rank, s->world_size, {0}, {0}};
  uint8_t want[MC_OOB_MAC_BYTES];
  if (mc_oob_random(j.nonce, sizeof j.nonce) != 0 || mc_oob_join_mac(w->secret, c.nonce, &j, j.mac) != 0)
    return mc_fail_tls(MC_ERR_SYSTEM, "mc_oob_socket_create: rank %d: cannot make the join proof "
                       "(random bytes or HMAC-SHA256 failed)", s->rank);
  mc_oob_ack_t a;
  int io = mc_oob_io(s->fds[0], &j, sizeof j, deadline, 1);
  if (io == MC_OOB_IO_OK || io == MC_OOB_IO_EOF) /* a peer that hung up may have left a note */
    io = mc_oob_io(s->fds[0], &a, sizeof a, deadline, 0);
  if (io == MC_OOB_IO_TIMEOUT)
    return mc_fail_tls(MC_ERR_TIMEOUT,
                       "mc_oob_socket_create: rank %d: rank 0 at %s:%u did not confirm within "
                       "%d ms that all %d ranks joined (is rank 0 running, with this id?)",
                       s->rank, at->host, at->port, s->timeout_ms, s->world_size);
  if (io == MC_OOB_IO_ERR)
    return mc_fail_tls(MC_ERR_SYSTEM, "mc_oob_socket_create: rank %d: talking to rank 0: %s",
                       s->rank, strerror(errno));
  if (io == MC_OOB_IO_EOF || a.magic != MC_OOB_ACK_MAGIC)
    return not_proven(s, at, io == MC_OOB_IO_EOF ? "it closed the connection after this rank's proof"
                                          : "its answer is not an ack");
  if (mc_oob_ack_mac(w->secret, c.nonce, j.nonce, s->rank, s->world_size, &a, want) != 0)
    return mc_fail_tls(MC_ERR_SYSTEM, "mc_oob_socket_create: rank %d: HMAC-SHA256 failed",
                       s->rank);
  if (CRYPTO_memcmp(want, a.mac, MC_OOB_MAC_BYTES) == 0) return peer_status(s, at, &a);
  if (a.status == MC_OOB_ST_RETRY) {
    *retry = 1;
    return mc_fail_tls(MC_ERR_TIMEOUT,
                       "mc_oob_socket_create: rank %d: rank 0 at %s:%u kept dropping this rank's "
                       "connection before its proof arrived (too many other connections), and "
                       "%d ms passed", s->rank, at->host, at->port, s->timeout_ms);
  }
  if (a.status == MC_OOB_ST_TIMEOUT) /* a note: unsigned, it only picks how to fail */
    return mc_fail_tls(MC_ERR_TIMEOUT,
                       "mc_oob_socket_create: rank %d: rank 0 at %s:%u says it timed out before "
                       "all %d ranks joined (before it checked this rank's proof)",
                       s->rank, at->host, at->port, s->world_size);
  return not_proven(s, at, "its answer did not verify");
}

/* Rank r > 0: join rank 0, connecting again while rank 0 asks it to. */
static mc_result_t peer_join(mc_oob_socket_t *s, const mc_oob_id_wire_t *w, int64_t deadline) {
  root_addr_t at = {.sa = {.sin_family = AF_INET, .sin_port = w->port, .sin_addr = {w->addr}},
                    .host = "?", .port = ntohs(w->port)};
  inet_ntop(AF_INET, &at.sa.sin_addr, at.host, sizeof at.host);
  for (;;) {
    int retry = 0;
    mc_result_t rc = peer_connect(s, &at, deadline);
    if (rc == MC_SUCCESS) rc = peer_handshake(s, w, &at, deadline, &retry);
    if (!retry || mc_oob_left_ms(deadline) == 0) return rc;
    mc_oob_close_fd(&s->fds[0]);
  }
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
  mc_oob_id_wire_t w;
  memcpy(&w, id->internal, sizeof w);
  if (w.magic != MC_OOB_ID_MAGIC || w.version != MC_OOB_WIRE_VERSION || w.port == 0)
    return mc_fail_tls(MC_ERR_INVALID_ARG,
                       "mc_oob_socket_create: rank %d: the id is not one made by "
                       "mc_unique_id_create of this version (magic 0x%08x, version %u)",
                       rank, (unsigned)w.magic, (unsigned)w.version);
  int64_t deadline = mc_oob_now_ms() + timeout_ms;
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
    rc = mc_oob_root_join(s, &w, lfd, deadline);
    close(lfd); /* closed here, joined or not: nobody may join later */
  } else {
    rc = peer_join(s, &w, deadline);
  }
  if (rc != MC_SUCCESS) {
    mc_oob_socket_destroy(s);
    return rc;
  }
  s->formed = 1;
  *out = s;
  return MC_SUCCESS;
}
