/* mc_oob_gather.c - the socket bootstrap's allgather (the wire format is
 * at the top of mc_oob_socket.c), and its destroy.
 *
 * Rank 0 is the hub: it reads every rank's part at once (poll over all
 * connections), so the first rank whose connection closes or whose part is
 * wrong is seen as soon as that happens, whatever the others do; then it
 * answers each rank with the whole. Any failure poisons the object: every
 * socket is closed, so peers fail at once instead of waiting out their
 * deadline, and later calls fail at once, repeating the first failure's
 * text.
 *
 * Who is to blame: only rank 0 sees every rank, so before it closes its
 * sockets it sends each rank a note naming the rank at fault and how (its
 * connection closed, it left, it was late, its part was wrong). A rank
 * whose connection to rank 0 ends reads that note, if one came, and names
 * that rank; only a bare end names rank 0 itself. Destroy sends notes too:
 * a rank other than 0 tells rank 0 that it left (so that rank 0 can tell a
 * rank that left from one whose process died), and rank 0 tells every rank
 * that is still connected which rank's connection had closed without
 * leaving, or else that rank 0 itself left. A rank still waiting in an
 * allgather when its peers give up thus learns which rank started it, not
 * only that rank 0 went away. Notes are advice for the text: an allgather
 * fails the same with or without one. */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "mc_error.h"
#include "mc_oob.h"
#include "mc_oob_wire.h"

/* A rank at fault and how (MC_OOB_NOTE_*); relayed: rank 0 said so. */
typedef struct {
  int who, kind, relayed;
} fault_t;

static int hdr_ok(const mc_oob_msg_hdr_t *h, uint64_t bytes, uint64_t seq) {
  return h->magic == MC_OOB_MSG_MAGIC && h->bytes <= MC_OOB_MSG_CAP && h->bytes == bytes && h->seq == seq;
}

static void send_note(int fd, fault_t f, uint64_t seq) {
  const mc_oob_msg_hdr_t note = {MC_OOB_NOTE_MAGIC, (uint32_t)f.kind, (uint64_t)f.who, seq};
  if (fd >= 0) mc_oob_send_once(fd, &note, sizeof note);
}

/* The fault a note says, if h is a well-formed one; kind 0 if not. */
static fault_t note_of(const mc_oob_msg_hdr_t *h, int world) {
  if (h->magic != MC_OOB_NOTE_MAGIC || h->pad < MC_OOB_NOTE_GONE || h->pad > MC_OOB_NOTE_FAILED ||
      h->bytes >= (uint64_t)world)
    return (fault_t){-1, 0, 0};
  return (fault_t){(int)h->bytes, (int)h->pad, 0};
}

/* The text of a fault as this rank tells it. */
static void fault_text(const mc_oob_socket_t *s, fault_t f, char *out, size_t n) {
  const char *by = f.relayed && f.who != 0 ? " (rank 0 saw it and told this rank)" : "";
  char who[32];
  if (f.who == s->rank) snprintf(who, sizeof who, "this rank (%d)", f.who);
  else snprintf(who, sizeof who, "rank %d", f.who);
  if (f.kind == MC_OOB_NOTE_GONE)
    snprintf(out, n, "%s closed its connection: its process exited or was killed%s", who, by);
  else if (f.kind == MC_OOB_NOTE_LEFT)
    snprintf(out, n, "%s left the group (mc_oob_socket_destroy) before this allgather ended%s", who, by);
  else if (f.kind == MC_OOB_NOTE_LATE)
    snprintf(out, n, "%s did not take part within rank 0's timeout of %d ms%s", who, s->timeout_ms, by);
  else if (f.kind == MC_OOB_NOTE_FAILED)
    snprintf(out, n, "%s gave up this allgather on its side (its own error says why)%s", who, by);
  else
    snprintf(out, n, "%s sent something else than its part of this allgather (another size or sequence number), "
             "or its connection broke%s", who, by);
}

/* Close every socket after telling the others: rank 0 tells every rank
 * who was at fault; another rank tells rank 0 that it gave up, unless its
 * failure came from rank 0 (rank 0's note, or its connection's end), so
 * that rank 0 does not take it for a rank whose process died. Keeps the
 * text for later calls. Returns -1 for the allgather. */
static int poison(mc_oob_socket_t *s, fault_t f, mc_result_t code, const char *text) {
  if (s->rank == 0 && f.kind)
    for (int r = 1; r < s->world_size; r++) send_note(s->fds[r], f, s->seq);
  if (s->rank != 0 && !f.relayed && !(f.who == 0 && f.kind == MC_OOB_NOTE_GONE))
    send_note(s->fds[0], (fault_t){s->rank, MC_OOB_NOTE_FAILED, 0}, s->seq);
  s->poisoned = 1;
  for (int r = 0; r < s->world_size; r++) mc_oob_close_fd(&s->fds[r]);
  snprintf(s->why, sizeof s->why, "%s", text);
  mc_fail_tls(code, "socket allgather: %s", text);
  return -1;
}

/* ---- rank 0 ---- */

/* Read what has come from rank r without waiting: its header, then its
 * part into out + r * bytes. 1 once it is all there, 0 for more, -1 on a
 * fault (in *f, its text in text). */
static int root_read(mc_oob_socket_t *s, int r, mc_oob_msg_hdr_t *h, size_t *got, char *out, size_t bytes,
                     fault_t *f, char *text, size_t n) {
  const size_t hb = sizeof *h;
  for (;;) {
    const size_t want = *got < hb ? hb - *got : hb + bytes - *got;
    if (want == 0) return 1;
    char *at = *got < hb ? (char *)h + *got : out + (size_t)r * bytes + (*got - hb);
    ssize_t k = recv(s->fds[r], at, want, MSG_DONTWAIT);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
    if (k <= 0) {
      const int gone = k == 0 || errno == ECONNRESET || errno == EPIPE;
      *f = (fault_t){r, gone ? MC_OOB_NOTE_GONE : MC_OOB_NOTE_BROKE, 0};
      if (gone) fault_text(s, *f, text, n);
      else snprintf(text, n, "rank %d's connection broke: %s", r, strerror(errno));
      return -1;
    }
    *got += (size_t)k;
    if (*got != hb) continue;
    fault_t note = note_of(h, s->world_size);
    if (note.kind && note.who == r) { /* it gave up or left: its note in place of a part */
      *f = note;
      fault_text(s, *f, text, n);
      return -1;
    }
    if (!hdr_ok(h, bytes, s->seq)) {
      *f = (fault_t){r, MC_OOB_NOTE_BROKE, 0};
      if (h->magic == MC_OOB_MSG_MAGIC)
        snprintf(text, n, "rank %d sent %llu bytes as call %llu, rank 0 %zu bytes as call %llu", r,
                 (unsigned long long)h->bytes, (unsigned long long)h->seq, bytes, (unsigned long long)s->seq);
      else
        snprintf(text, n, "rank %d sent something else than its part of this allgather", r);
      return -1;
    }
  }
}

/* Which fault to name when several show at once: a rank whose process
 * died comes first (the others' failures follow from it), then one whose
 * part was wrong, then one that gave up or left (it did so after a
 * failure of its own). */
static int weight(int kind) {
  return kind == MC_OOB_NOTE_GONE ? 4 : kind == MC_OOB_NOTE_BROKE ? 3 : kind == MC_OOB_NOTE_FAILED ? 2 : 1;
}

/* The ranks at[0..np-1] but skip, as "1,3" (those whose part has not come). */
static void list_ranks(char *out, size_t n, const int *at, int np, int skip) {
  size_t off = 0;
  out[0] = '\0';
  for (int i = 0, listed = 0; i < np && off < n; i++)
    if (at[i] != skip) off += (size_t)snprintf(out + off, n - off, "%s%d", listed++ ? "," : "", at[i]);
}

/* Every rank's part into out, all connections at once. 0, or -1 with the
 * fault in *f and its text. */
static int root_gather(mc_oob_socket_t *s, char *out, size_t bytes, int64_t deadline, fault_t *f, char *text,
                       size_t n) {
  const int W = s->world_size;
  struct pollfd *pfd = calloc((size_t)W, sizeof *pfd);
  size_t *got = calloc((size_t)W, sizeof *got);
  mc_oob_msg_hdr_t *h = calloc((size_t)W, sizeof *h);
  int *at = calloc((size_t)W, sizeof *at), left = W - 1, rc = 0;
  if (!pfd || !got || !h || !at) {
    snprintf(text, n, "rank 0: out of host memory");
    *f = (fault_t){0, MC_OOB_NOTE_FAILED, 0};
    rc = -1;
  }
  while (rc == 0 && left > 0) {
    int np = 0;
    for (int r = 1; r < W; r++)
      if (got[r] < sizeof *h + bytes) at[np] = r, pfd[np++] = (struct pollfd){s->fds[r], POLLIN, 0};
    const int pr = poll(pfd, (nfds_t)np, mc_oob_left_ms(deadline));
    if (pr < 0 && errno != EINTR) {
      snprintf(text, n, "rank 0: poll: %s", strerror(errno));
      *f = (fault_t){0, MC_OOB_NOTE_FAILED, 0};
      rc = -1;
    } else if (pr == 0 && mc_oob_left_ms(deadline) == 0) {
      char late[128];
      list_ranks(late, sizeof late, at, np, -1);
      snprintf(text, n, "rank(s) %s did not take part within %d ms", late, s->timeout_ms);
      *f = (fault_t){at[0], MC_OOB_NOTE_LATE, 0};
      rc = -1;
    }
    char one[200];
    for (int i = 0; rc == 0 && pr > 0 && i < np; i++) { /* all that came, then the fault to name */
      if (!pfd[i].revents) continue;
      fault_t g;
      const int k = root_read(s, at[i], &h[at[i]], &got[at[i]], out, bytes, &g, one, sizeof one);
      if (k > 0) left--;
      if (k < 0 && (f->kind == 0 || weight(g.kind) > weight(f->kind))) *f = g, snprintf(text, n, "%s", one);
    }
    if (rc == 0 && f->kind) { /* one that gave up or left may have done so for want of those not come yet */
      char rest[128];
      np = 0;
      for (int r = 1; r < W; r++)
        if (got[r] < sizeof *h + bytes) at[np++] = r;
      list_ranks(rest, sizeof rest, at, np, f->who);
      if ((f->kind == MC_OOB_NOTE_FAILED || f->kind == MC_OOB_NOTE_LEFT) && rest[0])
        snprintf(text + strlen(text), n - strlen(text), "; rank(s) %s had not sent their part yet", rest);
      rc = -1;
    }
  }
  free(pfd);
  free(got);
  free(h);
  free(at);
  return rc;
}

/* The whole to every rank, in rank order. */
static int root_answer(mc_oob_socket_t *s, const char *out, size_t bytes, int64_t deadline, fault_t *f, char *text,
                       size_t n) {
  const mc_oob_msg_hdr_t mine = {MC_OOB_MSG_MAGIC, 0, bytes, s->seq};
  for (int r = 1; r < s->world_size; r++) {
    int io = mc_oob_io(s->fds[r], (void *)&mine, sizeof mine, deadline, 1);
    if (io == MC_OOB_IO_OK) io = mc_oob_io(s->fds[r], (void *)out, (size_t)s->world_size * bytes, deadline, 1);
    if (io == MC_OOB_IO_OK) continue;
    mc_oob_msg_hdr_t h;
    fault_t note = {-1, 0, 0}; /* a rank that gave up after its part says so before it closes */
    if (io == MC_OOB_IO_EOF && mc_oob_io(s->fds[r], &h, sizeof h, mc_oob_now_ms(), 0) == MC_OOB_IO_OK)
      note = note_of(&h, s->world_size);
    const int kind = io == MC_OOB_IO_EOF ? MC_OOB_NOTE_GONE : io == MC_OOB_IO_TIMEOUT ? MC_OOB_NOTE_LATE
                                                                                     : MC_OOB_NOTE_BROKE;
    *f = note.kind && note.who == r ? note : (fault_t){r, kind, 0};
    if (io == MC_OOB_IO_TIMEOUT) snprintf(text, n, "rank %d did not take the answer within %d ms", r, s->timeout_ms);
    else fault_text(s, *f, text, n);
    return -1;
  }
  return 0;
}

/* ---- ranks other than 0 ---- */

/* How this rank's exchange with rank 0 failed (io, at the transfer of
 * what): rank 0's note, if one is waiting, else what this rank saw. */
static fault_t peer_fault(mc_oob_socket_t *s, int io, char *text, size_t n) {
  mc_oob_msg_hdr_t h;
  fault_t f = {-1, 0, 0};
  if (io == MC_OOB_IO_EOF && mc_oob_io(s->fds[0], &h, sizeof h, mc_oob_now_ms(), 0) == MC_OOB_IO_OK)
    f = note_of(&h, s->world_size);
  if (f.kind) {
    f.relayed = 1;
    fault_text(s, f, text, n);
  } else if (io == MC_OOB_IO_EOF) {
    f = (fault_t){0, MC_OOB_NOTE_GONE, 0};
    fault_text(s, f, text, n);
  } else if (io == MC_OOB_IO_TIMEOUT) {
    f = (fault_t){0, MC_OOB_NOTE_LATE, 0};
    snprintf(text, n, "no answer from rank 0 within %d ms (rank 0 answers once every rank's part came; its own "
             "error names the rank it waited for)", s->timeout_ms);
  } else {
    f = (fault_t){0, MC_OOB_NOTE_BROKE, 0};
    snprintf(text, n, "the connection to rank 0 broke: %s", strerror(errno));
  }
  return f;
}

static int peer_exchange(mc_oob_socket_t *s, const void *send, char *out, size_t bytes, int64_t deadline,
                         fault_t *f, char *text, size_t n) {
  const mc_oob_msg_hdr_t mine = {MC_OOB_MSG_MAGIC, 0, bytes, s->seq};
  mc_oob_msg_hdr_t theirs;
  int io = mc_oob_io(s->fds[0], (void *)&mine, sizeof mine, deadline, 1);
  if (io == MC_OOB_IO_OK) io = mc_oob_io(s->fds[0], (void *)send, bytes, deadline, 1);
  if (io == MC_OOB_IO_OK) io = mc_oob_io(s->fds[0], &theirs, sizeof theirs, deadline, 0);
  if (io == MC_OOB_IO_OK && theirs.magic == MC_OOB_NOTE_MAGIC) { /* rank 0 failed: its note in place of an answer */
    *f = note_of(&theirs, s->world_size);
    if (!f->kind) *f = (fault_t){0, MC_OOB_NOTE_BROKE, 0};
    f->relayed = 1;
    fault_text(s, *f, text, n);
    return -1;
  }
  if (io == MC_OOB_IO_OK && !hdr_ok(&theirs, bytes, s->seq)) {
    *f = (fault_t){0, MC_OOB_NOTE_BROKE, 0};
    snprintf(text, n, "rank 0 answered with another size or sequence number");
    return -1;
  }
  if (io == MC_OOB_IO_OK) io = mc_oob_io(s->fds[0], out, (size_t)s->world_size * bytes, deadline, 0);
  if (io == MC_OOB_IO_OK) return 0;
  *f = peer_fault(s, io, text, n);
  return -1;
}

static int socket_allgather(const void *send, void *recv, size_t bytes, void *user) {
  mc_oob_socket_t *s = user;
  if (!s) return -1;
  if (s->poisoned) {
    mc_fail_tls(MC_ERR_ABORTED, "socket allgather: an earlier one failed on this rank: %s", s->why);
    return -1;
  }
  char text[sizeof s->why];
  if (bytes > MC_OOB_MSG_CAP || (bytes && (!send || !recv))) {
    snprintf(text, sizeof text, "%zu bytes from each rank (at most %llu, and buffers needed)", bytes,
             (unsigned long long)MC_OOB_MSG_CAP);
    return poison(s, (fault_t){s->rank, MC_OOB_NOTE_FAILED, 0}, MC_ERR_INVALID_ARG, text);
  }
  fault_t f = {-1, 0, 0};
  const int64_t deadline = mc_oob_now_ms() + s->timeout_ms;
  int rc;
  if (s->rank == 0) {
    if (bytes) memmove(recv, send, bytes);
    rc = root_gather(s, recv, bytes, deadline, &f, text, sizeof text);
    if (rc == 0) rc = root_answer(s, recv, bytes, deadline, &f, text, sizeof text);
  } else {
    rc = peer_exchange(s, send, recv, bytes, deadline, &f, text, sizeof text);
  }
  if (rc != 0) return poison(s, f, f.kind == MC_OOB_NOTE_LATE ? MC_ERR_TIMEOUT : MC_ERR_SYSTEM, text);
  s->seq++;
  return 0;
}

int mc_oob_socket_is(mc_allgather_fn fn) { return fn == socket_allgather; }

mc_result_t mc_oob_socket_get(mc_oob_socket_t *sock, mc_oob_t *out) {
  if (!sock || !out)
    return mc_fail_tls(MC_ERR_INVALID_ARG, "mc_oob_socket_get: %s is NULL", sock ? "out" : "sock");
  out->allgather = socket_allgather;
  out->user = sock;
  out->rank = sock->rank;
  out->world_size = sock->world_size;
  return MC_SUCCESS;
}

/* How rank r's connection stands, read without waiting (what is waiting
 * is read and dropped, a bounded amount): 0 open, or the kind of its end
 * (the note it sent last, else MC_OOB_NOTE_GONE: it closed without one). */
static int connection_end(int fd, int r, int world) {
  unsigned char buf[4096], tail[sizeof(mc_oob_msg_hdr_t)];
  size_t seen = 0;
  for (int i = 0; fd >= 0 && i < 64; i++) {
    ssize_t k = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    if (k < 0 && errno == EINTR) continue;
    if (k > 0) { /* the last bytes so far in tail */
      const size_t got = (size_t)k, keep = got >= sizeof tail ? 0 : sizeof tail - got;
      memmove(tail, tail + sizeof tail - keep, keep);
      memcpy(tail + keep, buf + got - (sizeof tail - keep), sizeof tail - keep);
      seen += got;
      continue;
    }
    if (k == 0 || errno == ECONNRESET || errno == EPIPE) {
      mc_oob_msg_hdr_t last;
      memcpy(&last, tail, sizeof last);
      fault_t note = seen >= sizeof last ? note_of(&last, world) : (fault_t){-1, 0, 0};
      return note.kind && note.who == r ? note.kind : MC_OOB_NOTE_GONE;
    }
    return 0;
  }
  return 0;
}

/* Leaving: a rank other than 0 tells rank 0; rank 0 tells every rank still
 * connected which rank's connection had closed without a word (its
 * process died), or else that rank 0 left. Nobody waits for these. */
void mc_oob_socket_destroy(mc_oob_socket_t *sock) {
  if (!sock) return;
  if (sock->fds && sock->formed && !sock->poisoned) {
    fault_t f = {sock->rank, MC_OOB_NOTE_LEFT, 0};
    if (sock->rank != 0) send_note(sock->fds[0], f, sock->seq);
    for (int r = 1; sock->rank == 0 && r < sock->world_size && f.kind != MC_OOB_NOTE_GONE; r++)
      if (connection_end(sock->fds[r], r, sock->world_size) == MC_OOB_NOTE_GONE) f = (fault_t){r, MC_OOB_NOTE_GONE, 0};
    for (int r = 1; sock->rank == 0 && r < sock->world_size; r++) send_note(sock->fds[r], f, sock->seq);
  }
  if (sock->fds)
    for (int r = 0; r < sock->world_size; r++) mc_oob_close_fd(&sock->fds[r]);
  free(sock->fds);
  free(sock);
}
