/*
 * moecomm_bench.h - what a benchmark of libmoecomm needs besides the API of
 * moecomm.h: figures to set beside dispatch and combine, measured on the
 * same handle in the same run. Not for inference code; these calls may
 * change between minor versions.
 */
#ifndef MOECOMM_BENCH_H
#define MOECOMM_BENCH_H

#include "moecomm.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A dense all-to-all baseline for benchmarks: the transport's own dense
 * all-to-all (NVSHMEM's alltoallmem) of bytes_per_peer bytes to every rank,
 * padded as a dense design must be, so a benchmark can show what the link
 * gives in the same run. Collective. Each of `iters` samples (after
 * `warmup`) is timed with CUDA events after a barrier on the stream, into
 * times_us[iters]. nvshmem only: MC_ERR_UNSUPPORTED on the cpu and p2p
 * transports. */
MC_API mc_result_t mc_comm_bench_dense_alltoall(mc_comm_t *comm, size_t bytes_per_peer, int warmup, int iters,
                                                float *times_us);

/* Line the handle's ranks up before a timed sample. GPU transports enqueue
 * on the stream a kernel that finishes once every rank's has started, so
 * the work queued after it starts within microseconds on every rank (a
 * host barrier between processes leaves tens of microseconds of launch
 * skew); the cpu transport waits on a host barrier. Collective: every rank
 * calls it equally often. Not needed by the protocol; a rank that never
 * arrives makes it time out like a dispatch or combine wait. */
MC_API mc_result_t mc_a2a_barrier(mc_a2a_t *a2a, void *stream);

enum { MC_BENCH_DISPATCH = 0, MC_BENCH_COMBINE = 1 };

/* The launch floor of a phase: enqueue on `stream` an empty sending kernel
 * (flags & MC_SEND) and an empty receiving kernel (flags & MC_RECV),
 * launched exactly as the phase's own send and receive kernels are for a
 * call of m tokens (grid, block, dynamic shared memory, and the early
 * launch of the receiving kernel where the phase uses it). Timed as the
 * phase is timed, it is what a phase would cost if its kernels did no work:
 * two kernels, whatever the phase launches. phase: MC_BENCH_DISPATCH or
 * MC_BENCH_COMBINE. The handle's round is not touched (any step may come
 * next). GPU transports only (MC_ERR_UNSUPPORTED on the cpu transport);
 * capturable in a CUDA graph. */
MC_API mc_result_t mc_a2a_bench_floor(mc_a2a_t *a2a, int phase, int m, unsigned int flags, void *stream);

#ifdef __cplusplus
}
#endif

#endif /* MOECOMM_BENCH_H */
