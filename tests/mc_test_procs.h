/* mc_test_procs.h - worlds of fork()ed processes for the bootstrap tests:
 * each process is a rank that reports through its exit status; the parent
 * makes the id before forking (so rank 0's child inherits the listener) and
 * reaps them with a bounded wait. */
#ifndef MC_TEST_PROCS_H
#define MC_TEST_PROCS_H

#include <stddef.h>
#include <stdint.h>

#include "moecomm.h"

#define MC_PROC_MAX 8
#define MC_PROC_REFUSED 10 /* exit code of a child whose create was refused as expected */

typedef struct proc_ctx {
  mc_unique_id_t id;
  int world, timeout_ms, nprocs;
  int rank[MC_PROC_MAX];     /* rank each process claims */
  int delay_ms[MC_PROC_MAX]; /* sleep before create */
  int mode;                /* per test */
} mc_proc_ctx_t;

typedef int (*mc_proc_fn)(const mc_proc_ctx_t *c, int p);

int64_t mc_proc_now_ms(void); /* CLOCK_MONOTONIC */
void mc_proc_sleep_ms(int ms);
/* Fork c->nprocs children running fn; codes[p] = exit status, -1 if it was
 * killed. Waits at most wait_ms in all, then kills what is left; returns 0 if
 * every child ended by itself in time. */
int mc_proc_run(const mc_proc_ctx_t *c, mc_proc_fn fn, int wait_ms, int *codes);
/* Whether a child process sees a CUDA device this build can use (asked in
 * a child: CUDA must not start in the parent of ranks it forks). */
int mc_proc_cuda_seen(void);
/* One world: process p is rank p, no delays. */
void mc_proc_world(mc_proc_ctx_t *c, int world, int timeout_ms);
/* Steps that order a run's processes (and its parent) without a clock:
 * counters in memory that mc_proc_run maps shared and sets to 0 before it
 * forks. mc_proc_mark(k) adds one to counter k; mc_proc_await(k, n) returns
 * once it reached n (no deadline: mc_proc_run's wait ends a run that
 * hangs). k < MC_PROC_STEPS. */
#define MC_PROC_STEPS 8
void mc_proc_mark(int k);
void mc_proc_await(int k, int n);
/* The port of an id (network byte order), as the wire format places it. */
uint16_t mc_proc_id_port(const mc_unique_id_t *id);
/* Rank 0's process, before its mc_oob_socket_create: return once a
 * connection waits on the id's listener (inherited from the parent that
 * made the id), so that the create must see it, however late it runs. 0,
 * or -1 if this process holds no such listener. */
int mc_proc_await_connection(const mc_unique_id_t *id);
/* Bytes that rank `rank` contributes to call `iter`, reproducible anywhere. */
void mc_proc_fill(unsigned char *b, size_t n, int rank, int iter);
/* One allgather of `bytes` and a check of every rank's part (0: all right). */
int mc_proc_gather_check(const mc_oob_t *oob, size_t bytes, int iter);

#endif
