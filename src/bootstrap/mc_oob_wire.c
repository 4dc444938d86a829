/* mc_oob_wire.c - the socket bootstrap's helpers: transfers bounded by a
 * deadline, random bytes, the HMAC-SHA256 proofs of the handshake, and who
 * owns the other end of a loopback connection (/proc/net/tcp). */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "mc_oob_wire.h"

int64_t mc_oob_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int mc_oob_left_ms(int64_t deadline) {
  int64_t left = deadline - mc_oob_now_ms();
  return left <= 0 ? 0 : left > INT_MAX ? INT_MAX : (int)left;
}

void mc_oob_close_fd(int *fd) {
  if (*fd >= 0) close(*fd);
  *fd = -1;
}

void mc_oob_nodelay(int fd) {
  int one = 1;
  (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

/* Move exactly len bytes over a non-blocking socket by the deadline. The
 * transfer is tried before the clock is read, so a small write into an empty
 * socket succeeds even when the deadline has just passed. */
int mc_oob_io(int fd, void *buf, size_t len, int64_t deadline, int writing) {
  char *p = buf;
  while (len > 0) {
    ssize_t n = writing ? send(fd, p, len, MSG_NOSIGNAL) : recv(fd, p, len, 0);
    if (n > 0) {
      p += n;
      len -= (size_t)n;
      continue;
    }
    if (n == 0) return MC_OOB_IO_EOF; /* recv only: send of len > 0 never returns 0 */
    if (errno == EINTR) continue;
    if (errno == EPIPE || errno == ECONNRESET) return MC_OOB_IO_EOF;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return MC_OOB_IO_ERR;
    int left = mc_oob_left_ms(deadline);
    if (left == 0) return MC_OOB_IO_TIMEOUT;
    struct pollfd pfd = {fd, (short)(writing ? POLLOUT : POLLIN), 0};
    if (poll(&pfd, 1, left) < 0 && errno != EINTR) return MC_OOB_IO_ERR;
  }
  return MC_OOB_IO_OK;
}

/* One send that never waits, for messages whose loss only costs a clearer
 * error on the other side. */
void mc_oob_send_once(int fd, const void *buf, size_t len) {
  while (send(fd, buf, len, MSG_NOSIGNAL) < 0 && errno == EINTR) {
  }
}

/* The secret and the nonces: getrandom(), else /dev/urandom (kernels before
 * 3.17). Up to 256 bytes come whole from either once the pool is ready. */
int mc_oob_random(uint8_t *p, size_t n) {
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
  uint8_t msg[16 + 2 * MC_OOB_NONCE_BYTES + 4 * 4];
  size_t off = strlen(label) + 1;
  if (off > 16 || nfield > 4) return -1;
  memcpy(msg, label, off);
  memcpy(msg + off, nonce0, MC_OOB_NONCE_BYTES);
  memcpy(msg + off + MC_OOB_NONCE_BYTES, nonce1, MC_OOB_NONCE_BYTES);
  off += 2 * MC_OOB_NONCE_BYTES;
  for (int i = 0; i < nfield; i++)
    for (int b = 0; b < 4; b++) msg[off++] = (uint8_t)((uint32_t)field[i] >> (8 * b));
  unsigned len = 0;
  if (!HMAC(EVP_sha256(), secret, MC_OOB_SECRET_BYTES, msg, off, mac, &len)) return -1;
  return len == MC_OOB_MAC_BYTES ? 0 : -1;
}

/* The joining rank's proof. */
int mc_oob_join_mac(const uint8_t *secret, const uint8_t *nonce0, const mc_oob_join_t *j, uint8_t *mac) {
  int32_t f[2] = {j->rank, j->world_size};
  return make_mac(secret, "moecomm join", nonce0, j->nonce, f, 2, mac);
}

/* Rank 0's proof, bound to the join it answers. */
int mc_oob_ack_mac(const uint8_t *secret, const uint8_t *nonce0, const uint8_t *nonce1, int rank,
                   int world, const mc_oob_ack_t *a, uint8_t *mac) {
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
void mc_oob_peer_uids(const int *fd, long *uid, int n) {
  char key[MC_OOB_ACCEPT_BATCH][32], line[512];
  int want = 0;
  n = n < MC_OOB_ACCEPT_BATCH ? n : MC_OOB_ACCEPT_BATCH;
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
int mc_oob_other_user(long uid) { return uid >= 0 && (uid_t)uid != geteuid(); }
