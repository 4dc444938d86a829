/* mc_internal.h - the handles behind the opaque public types, and the
 * function table every transport fills (NCCL style: the API layer checks
 * arguments and call order once, a transport only moves bytes). */
#ifndef MC_INTERNAL_H
#define MC_INTERNAL_H

#include "mc_error.h"
#include "mc_layout.h"
#include "moecomm.h"

struct mc_comm {
  int rank, world_size, group_size;
  mc_transport_t transport;
  int timeout_ms;
  int device;
  mc_oob_t oob;
  int live_a2a; /* handles not yet destroyed; destroy refuses while > 0 */
  int owns_nvshmem; /* we called nvshmem_init (to start it, or to attach), so we finalise */
  int peer_failed;  /* a handle timed out: skip collective teardown that would wait forever */
  char err[MC_ERRTEXT_LEN];
};

/* Where a handle is in its round; each call checks it first. */
typedef enum mc_phase {
  MC_NEXT_DISPATCH_SEND = 0,
  MC_NEXT_DISPATCH_RECV,
  MC_NEXT_COMBINE_SEND,
  MC_NEXT_COMBINE_RECV
} mc_phase_t;

/* Arguments of one dispatch half, as the caller gave them. */
typedef struct mc_dispatch_args {
  const void *tokens, *scales;
  const void *indices; /* int32 or int64: a2a->cfg.index_dtype (mc_route.h reads either) */
  const float *weights;
  int m;
  const int32_t *bound_m;
  void *expert_x, *expert_scale;
  int32_t *expert_count;
  const mc_packed_recv_t *recv; /* the packed layouts (mc_dispatch_packed); NULL for the batched one */
  void *stream;
} mc_dispatch_args_t;

typedef struct mc_combine_args {
  const void *expert_y;
  void *out;
  void *stream;
} mc_combine_args_t;

typedef struct mc_transport_ops mc_transport_ops_t;

struct mc_a2a {
  mc_comm_t *comm;
  mc_a2a_config_t cfg;
  mc_shape_t shape;
  const mc_transport_ops_t *ops;
  void *impl;        /* the transport's state */
  mc_phase_t next;
  int aborted;       /* a wait timed out: peers are out of step, only destroy is left */
  int refused;       /* the transport refused this round's input after the call returned
                        (checked on the device): the round is over, dispatch-send is next */
  uint64_t round;    /* 1-based number of the round in progress or last done (64-bit: never wraps) */
  uint8_t *masked;   /* [world_size]: 1 where the rank is left out (mc_a2a_mask_ranks) */
  int any_masked;    /* some rank is */
  uint64_t *mask_calls; /* [world_size]: the last attempt at a mask this rank and rank r numbered
                           together (the cpu transport's; docs/protocol.md) */
  int round_m;       /* m of this round's dispatch (host value, before bound_m) */
  int64_t declared;  /* packed layouts: the capacity this round's send half declared (0: none) */
  int64_t counted;   /* packed layouts: the rows mc_dispatch_counts found this round (-1: not called) */
  mc_a2a_stats_t stats;
  char err[MC_ERRTEXT_LEN];
  char first_err[MC_ERRTEXT_LEN]; /* the failure that aborted the handle, kept for later refusals */
};

/* A transport: whether this process can use it and whether it reaches the
 * communicator's peers (for MC_TRANSPORT_AUTO), create/destroy the buffers
 * of one a2a handle, and run the four halves. Each half may assume the API
 * layer checked pointers, sizes and order; it checks what only it can read
 * (indices, bound_m) before sending anything. mc_transport.c lists the
 * transports this build has. */
struct mc_transport_ops {
  mc_transport_t id;
  const char *name;
  int (*usable)(void); /* 1 where this process can use it (a GPU transport: it sees a CUDA device) */
  /* optional (else every peer is reachable), collective: *reachable = 1 when
   * every rank reaches every peer by this transport, else why says which
   * rank could not and why */
  mc_result_t (*probe)(mc_comm_t *comm, int *reachable, char *why, size_t why_n);
  mc_result_t (*comm_init)(mc_comm_t *comm); /* optional: start the transport (collective) */
  void (*comm_fini)(mc_comm_t *comm);        /* optional */
  mc_result_t (*a2a_create)(mc_a2a_t *a2a);
  void (*a2a_destroy)(mc_a2a_t *a2a);
  mc_result_t (*dispatch_send)(mc_a2a_t *a2a, const mc_dispatch_args_t *args);
  mc_result_t (*dispatch_recv)(mc_a2a_t *a2a, const mc_dispatch_args_t *args);
  mc_result_t (*combine_send)(mc_a2a_t *a2a, const mc_combine_args_t *args);
  mc_result_t (*combine_recv)(mc_a2a_t *a2a, const mc_combine_args_t *args);
  void (*refresh_stats)(mc_a2a_t *a2a); /* optional: counters kept on a device */
  mc_result_t (*check)(mc_a2a_t *a2a);  /* optional: failures recorded asynchronously */
  mc_result_t (*barrier)(mc_a2a_t *a2a, void *stream); /* optional: else a host barrier */
  /* optional: the dense all-to-all baseline of mc_comm_bench_dense_alltoall */
  mc_result_t (*dense_alltoall)(mc_comm_t *comm, size_t bytes_per_peer, int iters, int warmup, float *times_us);
  /* copy the workspace's per-expert load (mc_ws_load_off) out, then zero it if reset */
  mc_result_t (*expert_load)(mc_a2a_t *a2a, int64_t *counts, int reset);
  /* optional: mc_a2a_mask_ranks's agreement with the ranks the mask keeps
   * (NULL: the transport cannot mask ranks) */
  mc_result_t (*mask)(mc_a2a_t *a2a, const uint8_t *mask);
  /* optional: mc_a2a_bench_floor's empty kernels (combine: 0 dispatch, 1 combine) */
  mc_result_t (*bench_floor)(mc_a2a_t *a2a, int combine, int m, unsigned int flags, void *stream);
  /* optional (else the batched layout only): mc_dispatch_counts, between
   * the send and recv halves of a packed layout's round */
  mc_result_t (*dispatch_counts)(mc_a2a_t *a2a, int64_t *rows, int32_t *expert_count, void *stream);
};

/* The table for a transport this build has, or NULL. */
const mc_transport_ops_t *mc_transport_ops(mc_transport_t t);
/* Before the ranks meet: the transport asked for, if this build has it and
 * this process can use it; MC_TRANSPORT_AUTO stays AUTO where a GPU
 * transport is usable (mc_transport_settle decides), else cpu. Failures in
 * this thread's text. */
mc_result_t mc_transport_pick(mc_transport_t want, mc_transport_t *got);
/* MC_TRANSPORT_AUTO, collectively, once the ranks agreed they all want it:
 * the first GPU transport in order of preference that reaches every peer,
 * else the first usable one (whose create then names the peer it cannot
 * reach). why: what the ones passed over said. */
mc_result_t mc_transport_settle(mc_comm_t *comm, mc_transport_t *got, char *why, size_t why_n);

/* Collective helpers over the comm's oob, with the failure written to comm->err. */
mc_result_t mc_comm_allgather(mc_comm_t *comm, const void *send, void *recv, size_t bytes);
mc_result_t mc_comm_barrier(mc_comm_t *comm);
/* A create whose own checks failed still joins the peers' exchange, with
 * `mine` marked as refused (bytes each): they fail at once naming this
 * rank, and every rank's next create meets the others' next create.
 * comm->err keeps this rank's reason. */
void mc_comm_join_refused(mc_comm_t *comm, const void *mine, size_t bytes);
/* 1 when MC_VERBOSE=1: rank 0 then says on stderr what was chosen (transport, grid, launches) */
int mc_verbose(void);
/* FNV-1a of the host name (or of $MC_HOST_ID): ranks on one host give the same value */
uint64_t mc_host_id(void);
/* Whether process pid (on this host) is gone: no such process, or a zombie
 * its parent has not reaped yet. 0 for this process (a thread of it cannot
 * be told dead from stalled). */
int mc_pid_gone(int64_t pid);
/* After a timeout waiting for `peer`: who that rank waits for, and so on, to
 * the rank at the root (one whose process is gone, or that waits for
 * nobody), appended to out as "; rank 2 waits for rank 3, rank 3's process
 * (pid N) is gone: rank 3 is the one missing". A rank whose process is gone
 * while its word names another gone rank (it gave up on that one, or died
 * waiting) passes the blame on to it. A transport says, per rank,
 * whether its process is gone (and its pid) and reads its "waiting for"
 * word (MC_SIG_WAITING: 1 + the rank it waits for, 0 for none); 0 where it
 * cannot. */
typedef struct mc_wait_view {
  void *ctx;
  int (*gone)(void *ctx, int r, int64_t *pid);
  int (*waiting)(void *ctx, int r, uint64_t *word);
} mc_wait_view_t;
void mc_describe_wait_root(int world_size, int me, int peer, const mc_wait_view_t *view, char *out, size_t n);

#endif
