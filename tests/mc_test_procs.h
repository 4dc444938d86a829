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
/* Bytes that rank `rank` contributes to call `iter`, reproducible anywhere. */
void mc_proc_fill(unsigned char *b, size_t n, int rank, int iter);
/* One allgather of `bytes` and a check of every rank's part (0: all right). */
int mc_proc_gather_check(const mc_oob_t *oob, size_t bytes, int iter);

#endif
