/* mc_oob_root.c - rank 0's side of the socket bootstrap's handshake: accept
 * connections on the id's listener, challenge each, verify the joins, and
 * answer every rank with a signed ack once all have joined (or with why not).
 * Who gets in, and in what time, is described at the top of
 * mc_oob_socket.c. */
#include <errno.h>
#include <openssl/crypto.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "mc_error.h"
#include "mc_oob_wire.h"

typedef struct {
  int fd;
  size_t got; /* bytes of the join read so far */
  int64_t since, deadline;
  uint8_t nonce[MC_OOB_NONCE_BYTES]; /* the challenge it was sent */
  mc_oob_join_t m;
} pending_t;

typedef struct { uint8_t chal[MC_OOB_NONCE_BYTES], join[MC_OOB_NONCE_BYTES]; } nonces_t;

typedef struct {
  mc_oob_socket_t *s;
  const uint8_t *secret;
  int64_t deadline, paused_until; /* paused_until: no accept before (out of descriptors) */
  int joined;
  int other_user, unproven, idle, refused; /* connections dropped, by reason */
  nonces_t *nonces;                        /* [world]: what a joined rank's ack is bound to */
  pending_t pend[MC_OOB_MAX_PENDING];
} root_t;

/* An unsigned status for a connection that has not proven the secret. */
static void send_note(int fd, int status) {
  mc_oob_ack_t a = {MC_OOB_ACK_MAGIC, status, 0, 0, {0}};
  mc_oob_send_once(fd, &a, sizeof a);
}

static void drop_pending(pending_t *p, int note, int *count) {
  if (note >= 0) send_note(p->fd, note);
  mc_oob_close_fd(&p->fd);
  (*count)++;
}

/* A signed ack for the join of rank `rank` that came with these nonces. */
static int make_ack(const root_t *rt, const nonces_t *nc, int rank, int world, int status,
                    mc_oob_ack_t *a) {
  *a = (mc_oob_ack_t){MC_OOB_ACK_MAGIC, status, rt->s->world_size, 0, {0}};
  return mc_oob_ack_mac(rt->secret, nc->chal, nc->join, rank, world, a, a->mac);
}

/* How many new connections fit now: free slots, and pending ones that had
 * MC_OOB_EVICT_GRACE_MS to answer (a live rank answers far sooner). */
static int room(const root_t *rt, int64_t now) {
  int k = 0;
  for (int i = 0; i < MC_OOB_MAX_PENDING; i++)
    k += rt->pend[i].fd < 0 || now - rt->pend[i].since >= MC_OOB_EVICT_GRACE_MS;
  return k;
}

/* A slot for a new connection: a free one, else the oldest pending one,
 * dropped (room() said that it had its grace). */
static pending_t *take_slot(root_t *rt) {
  int oldest = 0;
  for (int i = 0; i < MC_OOB_MAX_PENDING; i++) {
    if (rt->pend[i].fd < 0) return &rt->pend[i];
    if (rt->pend[i].since < rt->pend[oldest].since) oldest = i;
  }
  drop_pending(&rt->pend[oldest], MC_OOB_ST_RETRY, &rt->idle);
  return &rt->pend[oldest];
}

/* Put a fresh connection in slot p and send it its challenge: 0, or -1 if
 * the challenge could not go out whole at once (the peer is gone), -2 if no
 * nonce could be drawn. */
static int challenge(root_t *rt, pending_t *p, int fd, int64_t now) {
  mc_oob_challenge_t c = {MC_OOB_CHAL_MAGIC, MC_OOB_WIRE_VERSION, {0}};
  if (mc_oob_random(c.nonce, sizeof c.nonce) != 0) return -2;
  ssize_t k;
  do k = send(fd, &c, sizeof c, MSG_NOSIGNAL);
  while (k < 0 && errno == EINTR);
  if (k != (ssize_t)sizeof c) return -1;
  p->fd = fd;
  p->got = 0;
  p->since = now;
  p->deadline = now + MC_OOB_HANDSHAKE_MS < rt->deadline ? now + MC_OOB_HANDSHAKE_MS : rt->deadline;
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
      rt->paused_until = mc_oob_now_ms() + 10; /* expiring pending connections free some */
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
  int fd[MC_OOB_ACCEPT_BATCH], n;
  long uid[MC_OOB_ACCEPT_BATCH];
  int64_t now = mc_oob_now_ms();
  int max = room(rt, now);
  mc_result_t rc = accept_some(rt, lfd, fd, max < MC_OOB_ACCEPT_BATCH ? max : MC_OOB_ACCEPT_BATCH, &n);
  mc_oob_peer_uids(fd, uid, n);
  for (int i = 0; i < n; i++) {
    int c = -1;
    if (mc_oob_other_user(uid[i])) {
      rt->other_user++;
    } else if (rc == MC_SUCCESS) {
      mc_oob_nodelay(fd[i]);
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
  const mc_oob_join_t *m = &p->m;
  uint8_t want[MC_OOB_MAC_BYTES];
  if (m->magic != MC_OOB_JOIN_MAGIC || m->version != MC_OOB_WIRE_VERSION ||
      mc_oob_join_mac(rt->secret, p->nonce, m, want) != 0 ||
      CRYPTO_memcmp(want, m->mac, MC_OOB_MAC_BYTES) != 0) {
    drop_pending(p, -1, &rt->unproven); /* a stranger learns nothing, not even why */
    return;
  }
  mc_oob_socket_t *s = rt->s;
  int r = m->rank, n = s->world_size;
  int status = m->world_size != n ? MC_OOB_ST_WORLD_DIFFERS
             : r < 1 || r >= n || s->fds[r] >= 0 ? MC_OOB_ST_RANK_TAKEN : MC_OOB_ST_OK;
  nonces_t nc;
  memcpy(nc.chal, p->nonce, MC_OOB_NONCE_BYTES);
  memcpy(nc.join, m->nonce, MC_OOB_NONCE_BYTES);
  if (status != MC_OOB_ST_OK) {
    mc_oob_ack_t a;
    if (make_ack(rt, &nc, r, m->world_size, status, &a) == 0) mc_oob_send_once(p->fd, &a, sizeof a);
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
  for (int i = 0; i < MC_OOB_MAX_PENDING; i++)
    if (rt->pend[i].fd >= 0 && now >= rt->pend[i].deadline)
      drop_pending(&rt->pend[i], MC_OOB_ST_RETRY, &rt->idle);
}

/* How long poll may wait: until the overall deadline, the next handshake
 * deadline, the end of an accept pause, or (no room) the moment the oldest
 * pending connection may be dropped. *listen: whether to poll the listener. */
static int root_wait(const root_t *rt, int64_t now, int *listen) {
  int64_t until = rt->deadline, oldest = now;
  for (int i = 0; i < MC_OOB_MAX_PENDING; i++) {
    const pending_t *p = &rt->pend[i];
    if (p->fd >= 0 && p->deadline < until) until = p->deadline;
    if (p->fd >= 0 && p->since < oldest) oldest = p->since;
  }
  *listen = now >= rt->paused_until && room(rt, now) > 0;
  if (now < rt->paused_until && rt->paused_until < until) until = rt->paused_until;
  if (now >= rt->paused_until && !*listen && oldest + MC_OOB_EVICT_GRACE_MS < until)
    until = oldest + MC_OOB_EVICT_GRACE_MS;
  return mc_oob_left_ms(until > now ? until : now);
}

/* Tell every joined rank how the join ended (status 0: all joined). */
static mc_result_t send_acks(const root_t *rt, int status, int64_t deadline) {
  const mc_oob_socket_t *s = rt->s;
  for (int r = 1; r < s->world_size; r++) {
    mc_oob_ack_t a;
    if (s->fds[r] < 0) continue;
    int ok = make_ack(rt, &rt->nonces[r], r, s->world_size, status, &a) == 0 &&
             mc_oob_io(s->fds[r], &a, sizeof a, deadline, 1) == MC_OOB_IO_OK;
    if (!ok && status == MC_OOB_ST_OK)
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
  struct pollfd pfd[MC_OOB_MAX_PENDING + 1];
  int slot_of[MC_OOB_MAX_PENDING + 1], np = 0, listen;
  int64_t now = mc_oob_now_ms();
  root_expire(rt, now);
  int wait = root_wait(rt, now, &listen);
  if (listen) pfd[np++] = (struct pollfd){lfd, POLLIN, 0};
  for (int i = 0; i < MC_OOB_MAX_PENDING; i++)
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
mc_result_t mc_oob_root_join(mc_oob_socket_t *s, const mc_oob_id_wire_t *w, int lfd, int64_t deadline) {
  root_t *rt = calloc(1, sizeof *rt);
  if (rt) rt->nonces = calloc((size_t)s->world_size, sizeof *rt->nonces);
  if (!rt || !rt->nonces) {
    free(rt);
    return mc_fail_tls(MC_ERR_SYSTEM, "mc_oob_socket_create: rank 0: out of memory");
  }
  rt->s = s;
  rt->secret = w->secret;
  rt->deadline = deadline;
  for (int i = 0; i < MC_OOB_MAX_PENDING; i++) rt->pend[i].fd = -1;
  /* One step even where the deadline passed before this call got here: a
   * rank that connected before it is accepted and answered (it joins, or
   * hears that rank 0 timed out), however late this process ran. */
  mc_result_t rc = s->world_size > 1 ? root_step(rt, lfd) : MC_SUCCESS;
  while (rc == MC_SUCCESS && rt->joined < s->world_size - 1)
    rc = mc_oob_left_ms(deadline) == 0 ? join_timeout(rt) : root_step(rt, lfd);
  int note = rc == MC_ERR_TIMEOUT ? MC_OOB_ST_TIMEOUT : -1; /* a rank in mid-handshake fails too */
  for (int i = 0; i < MC_OOB_MAX_PENDING; i++)
    if (rt->pend[i].fd >= 0) drop_pending(&rt->pend[i], note, &rt->idle);
  if (rc == MC_SUCCESS) rc = send_acks(rt, MC_OOB_ST_OK, deadline);
  else (void)send_acks(rt, rc == MC_ERR_TIMEOUT ? MC_OOB_ST_TIMEOUT : MC_OOB_ST_FAILED, mc_oob_now_ms() + 100);
  free(rt->nonces);
  free(rt);
  return rc;
}
