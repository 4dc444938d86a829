/* mc_cpu.h - the cpu transport's state and its three primitives, the host
 * twins of NVSHMEM's putmem_signal_nbi, signal_op and wait_until. The
 * dispatch and combine halves (mc_cpu_dispatch.c, mc_cpu_combine.c) are
 * written against these alone. */
#ifndef MC_CPU_H
#define MC_CPU_H

#include "mc_internal.h"

typedef struct mc_cpu {
  unsigned char **peer;  /* peer[r]: rank r's window as this rank sees it */
  unsigned char *ws;     /* private workspace (mc_workspace_bytes) */
  uint64_t window_bytes;
  int64_t *pid;          /* pid[r]: rank r's process (its liveness names a dead peer in a timeout) */
  int m_eff;             /* valid tokens of the current round (bound_m applied) */
  int n_route;           /* records dispatch-recv took in this round */
  uint64_t *barriers;    /* barriers[r]: mc_a2a_barrier calls made with rank r (both count them alike,
                            however many either made while the other was masked) */
  struct mc_cpu_wait *waits; /* waits[r]: mc_cpu_wait_each's state for rank r */
  int32_t *lcount;       /* packed layouts: [num_local_experts] pairs per local expert this round */
  int64_t *loff;         /* packed layouts: [num_local_experts + 1] each expert's first row, then the rows */
} mc_cpu_t;

/* Copy bytes to offset dst_off of peer's window, then update peer's signal
 * (slot, indexed by this rank) with release order: "flags after data". */
void mc_cpu_put_signal(mc_a2a_t *a2a, int peer, uint64_t dst_off, const void *src, uint64_t bytes,
                       int slot, uint64_t value, int op);
/* Update peer's signal (slot, indexed by this rank) with release order. */
void mc_cpu_signal(mc_a2a_t *a2a, int peer, int slot, uint64_t value, int op);
/* Wait until this rank's signal (slot, from peer) is >= target, with
 * acquire order, for at most the comm's timeout. On expiry: MC_ERR_TIMEOUT,
 * and the handle's text names the phase, this rank, the peer, and the values. */
mc_result_t mc_cpu_wait_ge(mc_a2a_t *a2a, const char *phase, int slot, int peer, uint64_t target,
                           uint64_t *seen);
/* What a peer's signal means to mc_cpu_wait_each's caller: 1 when the wait
 * for that peer is over; else 0, with the value it waits for in *expect. */
typedef int (*mc_cpu_check_fn)(void *ctx, int peer, uint64_t value, uint64_t *expect);
/* Wait on this rank's signal (slot) from every peer with skip[peer] clear
 * at once, each read with acquire order and given to check, in passes over
 * them all, until one pass finds check saying 1 for every one. Each peer
 * has timeout_ms from the start, from the last change of what check
 * expects of it, or from when check stopped saying 1 for it; on expiry
 * MC_ERR_TIMEOUT, with a text as mc_cpu_wait_ge's. */
mc_result_t mc_cpu_wait_each(mc_a2a_t *a2a, const char *phase, int slot, const uint8_t *skip,
                             mc_cpu_check_fn check, void *ctx, int timeout_ms);

static inline mc_cpu_t *mc_cpu(mc_a2a_t *a2a) { return (mc_cpu_t *)a2a->impl; }
static inline unsigned char *mc_cpu_mine(mc_a2a_t *a2a) { return mc_cpu(a2a)->peer[a2a->comm->rank]; }
static inline void *mc_cpu_ws(mc_a2a_t *a2a, uint64_t off) { return mc_cpu(a2a)->ws + off; }

mc_result_t mc_cpu_dispatch_send(mc_a2a_t *a2a, const mc_dispatch_args_t *args);
mc_result_t mc_cpu_dispatch_recv(mc_a2a_t *a2a, const mc_dispatch_args_t *args);
mc_result_t mc_cpu_combine_send(mc_a2a_t *a2a, const mc_combine_args_t *args);
mc_result_t mc_cpu_combine_recv(mc_a2a_t *a2a, const mc_combine_args_t *args);
mc_result_t mc_cpu_mask(mc_a2a_t *a2a, const uint8_t *mask); /* mc_cpu_mask.c */
/* mc_cpu_dispatch.c: step 1 of the recv half of every layout (the metas,
 * the slot bases; count: pairs per local expert, if not NULL) */
mc_result_t mc_cpu_dispatch_metas(mc_a2a_t *a2a, int32_t *count);
/* mc_cpu_dispatch.c: source src's records of this round all arrived, the running total moved on */
mc_result_t mc_cpu_take_records(mc_a2a_t *a2a, int src, uint32_t *n);
/* mc_cpu_dispatch.c: the next route entry of the round, for a record from src (no target yet) */
mc_route_entry_t *mc_cpu_route_next(mc_a2a_t *a2a, int src, const mc_record_header_t *h);
/* mc_cpu_packed.c: the packed layouts' recv half and count step */
mc_result_t mc_cpu_dispatch_recv_packed(mc_a2a_t *a2a, const mc_dispatch_args_t *args);
mc_result_t mc_cpu_dispatch_counts(mc_a2a_t *a2a, int64_t *rows, int32_t *expert_count, void *stream);

#endif
