/* mc_oob_wire.h - what the socket bootstrap's files share: the messages on
 * the wire (their meaning and the handshake are described at the top of
 * mc_oob_socket.c), the socket object, transfers bounded by a deadline, the
 * HMAC proofs, the owner of a loopback connection's other end, and rank 0's
 * side of the handshake (mc_oob_root.c). */
#ifndef MC_OOB_WIRE_H
#define MC_OOB_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "moecomm.h"

#define MC_OOB_ID_MAGIC 0x4d434944u   /* "MCID" */
#define MC_OOB_CHAL_MAGIC 0x4d434348u /* "MCCH" */
#define MC_OOB_JOIN_MAGIC 0x4d434a4eu /* "MCJN" */
#define MC_OOB_ACK_MAGIC 0x4d43414bu  /* "MCAK" */
#define MC_OOB_MSG_MAGIC 0x4d434147u  /* "MCAG" */
#define MC_OOB_NOTE_MAGIC 0x4d434e54u /* "MCNT" */
#define MC_OOB_WIRE_VERSION 2u
#define MC_OOB_MSG_CAP ((uint64_t)256 << 20)
#define MC_OOB_SECRET_BYTES 16
#define MC_OOB_NONCE_BYTES 16
#define MC_OOB_MAC_BYTES 32       /* HMAC-SHA256 */
#define MC_OOB_MAX_PENDING 128    /* accepted connections that have not proven the secret yet */
#define MC_OOB_HANDSHAKE_MS 2000  /* the most a pending connection may take to send its join */
#define MC_OOB_EVICT_GRACE_MS 150 /* the least it gets before it may be dropped for a newer one */
#define MC_OOB_ACCEPT_BATCH 64    /* accepts per wakeup (one read of /proc/net/tcp for them) */

/* What a note (an mc_oob_msg_hdr_t with MC_OOB_NOTE_MAGIC: pad the kind,
 * bytes the rank it names) says of that rank: its connection closed
 * without a note (its process died), it destroyed its object, it did not
 * take part in time, its part was not this allgather's, it gave up the
 * allgather on its side. mc_oob_gather.c says who sends them. */
enum { MC_OOB_NOTE_GONE = 1, MC_OOB_NOTE_LEFT, MC_OOB_NOTE_LATE, MC_OOB_NOTE_BROKE, MC_OOB_NOTE_FAILED };

/* Join statuses of the ack. */
enum { MC_OOB_ST_OK, MC_OOB_ST_TIMEOUT, MC_OOB_ST_FAILED, MC_OOB_ST_RANK_TAKEN, MC_OOB_ST_WORLD_DIFFERS, MC_OOB_ST_RETRY };

typedef struct {
  uint32_t magic, version, addr; /* addr and port in network byte order */
  uint16_t port, pad;
  uint8_t secret[MC_OOB_SECRET_BYTES];
  int64_t pid;
} mc_oob_id_wire_t;
typedef struct { uint32_t magic, version; uint8_t nonce[MC_OOB_NONCE_BYTES]; } mc_oob_challenge_t;
typedef struct {
  uint32_t magic, version;
  int32_t rank, world_size;
  uint8_t nonce[MC_OOB_NONCE_BYTES], mac[MC_OOB_MAC_BYTES];
} mc_oob_join_t;
typedef struct {
  uint32_t magic;
  int32_t status, world_size; /* world_size: rank 0's */
  uint32_t pad;
  uint8_t mac[MC_OOB_MAC_BYTES];
} mc_oob_ack_t;
typedef struct { uint32_t magic, pad; uint64_t bytes, seq; } mc_oob_msg_hdr_t;
_Static_assert(sizeof(mc_oob_id_wire_t) == 40 && sizeof(mc_oob_id_wire_t) <= MC_UNIQUE_ID_BYTES, "id layout");
_Static_assert(sizeof(mc_oob_challenge_t) == 24 && sizeof(mc_oob_join_t) == 64 && sizeof(mc_oob_ack_t) == 48 &&
               sizeof(mc_oob_msg_hdr_t) == 24, "wire");

/* The object of mc_oob_socket_create. */
struct mc_oob_socket {
  int rank, world_size, timeout_ms;
  int formed;   /* create succeeded: destroy tells the others (mc_oob_gather.c) */
  int poisoned; /* an allgather failed: every socket is closed */
  uint64_t seq; /* allgathers completed */
  int *fds;     /* rank 0: fds[r] = rank r's connection; rank > 0: fds[0] = rank 0's */
  char why[256]; /* poisoned: the first failure's text */
};


/* Rank 0's handshake on the id's listener lfd: every other rank joined
 * (s->fds[r] its connection) and acknowledged, or a failure that names the
 * missing ranks; bounded by deadline. */
mc_result_t mc_oob_root_join(mc_oob_socket_t *s, const mc_oob_id_wire_t *w, int lfd, int64_t deadline);

/* What a transfer came to. */
enum { MC_OOB_IO_OK, MC_OOB_IO_TIMEOUT, MC_OOB_IO_EOF, MC_OOB_IO_ERR };

int64_t mc_oob_now_ms(void);                /* CLOCK_MONOTONIC */
int mc_oob_left_ms(int64_t deadline);       /* 0 once it passed */
void mc_oob_close_fd(int *fd);              /* close if open; -1 after */
void mc_oob_nodelay(int fd);                /* TCP_NODELAY, best effort */
/* Exactly len bytes over a non-blocking socket by the deadline: MC_OOB_IO_*. */
int mc_oob_io(int fd, void *buf, size_t len, int64_t deadline, int writing);
/* One send that never waits (a courtesy message). */
void mc_oob_send_once(int fd, const void *buf, size_t len);
/* n random bytes (n <= 256); 0, or -1 with errno. */
int mc_oob_random(uint8_t *p, size_t n);
/* The joining rank's proof over nonce0 and its join; rank 0's, bound to the
 * join it answers. 0 on success. */
int mc_oob_join_mac(const uint8_t *secret, const uint8_t *nonce0, const mc_oob_join_t *j, uint8_t *mac);
int mc_oob_ack_mac(const uint8_t *secret, const uint8_t *nonce0, const uint8_t *nonce1, int rank, int world,
                   const mc_oob_ack_t *a, uint8_t *mac);
/* uid[i]: the owner of loopback connection fd[i]'s other end, -1 where it
 * cannot be told (n <= MC_OOB_ACCEPT_BATCH). */
void mc_oob_peer_uids(const int *fd, long *uid, int n);
/* Whether uid is known and is not this process's effective one. */
int mc_oob_other_user(long uid);

#endif
