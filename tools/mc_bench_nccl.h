/* mc_bench_nccl.h - the dense NCCL all-to-all baseline of mc-bench (grouped
 * ncclSend/ncclRecv of the padded payload), the "standard all-to-all" the
 * seed compares against. Only where mc-bench was built with NCCL. */
#ifndef MC_BENCH_NCCL_H
#define MC_BENCH_NCCL_H

#include <stddef.h>

#include "moecomm.h"

/* Collective over the oob: every rank sends bytes_per_peer bytes to every
 * rank (itself included) with one grouped ncclSend/ncclRecv, `iters` samples
 * after `warmup`, each timed with CUDA events after an out-of-band barrier.
 * Uses the current CUDA device. Returns 0, or -1 with a message on stderr
 * (NCCL needs one GPU per rank: several ranks on one GPU fail here). */
int mc_bench_nccl_alltoall(const mc_oob_t *oob, size_t bytes_per_peer, int warmup, int iters, float *times_us);
/* 1 when this mc-bench has the NCCL baseline. */
int mc_bench_have_nccl(void);

#endif
