/* mc_gpu_fused.cuh - dispatch's prep and send in one launch, where the
 * prep is one block (the call's tokens fit one prep chunk: 256 at the
 * DeepSeek-V3 shape) and no pack kernel stands between them (no staged
 * peer, no pull). The block that starts first preps and publishes; the
 * others wait for that, then every block sends. Why: under MPS the gap
 * between two kernels of a rank is 2-6 us, and in a round the latest
 * rank's send started 26 us after its prep ended (1 token, median over
 * rounds: perf-notes 12 and 36). MC_GPU_FUSE=0 launches the two kernels
 * instead. Part of mc_gpu_kernels.cuh.
 *
 * Why the waiters cannot starve the prep: the prepping block is the first
 * to take a ticket, so it is already on an SM, whatever the grid. The last
 * block to see the flag resets ticket, flag and count for the next round,
 * whose kernel starts only after this one has ended (stream order). */
#ifndef MC_GPU_FUSED_CUH
#define MC_GPU_FUSED_CUH

/* Dynamic shared memory: the prep's carving, then the send's, in turn. */
static inline size_t mc_fused_smem_bytes(const mc_shape_t *s, int zc_direct) {
  const size_t prep = mc_prep_smem_bytes(s), send = zc_direct ? mc_zc_send_smem_bytes(s) : mc_send_smem_bytes(s);
  return prep > send ? prep : send;
}
/* Whether a dispatch-send of m tokens may run fused (the host's choice). */
static inline int mc_fused_fits(const mc_shape_t *s, int m) {
  return m <= mc_prep_chunk(s) && mc_prep_smem_bytes(s) <= (48u << 10);
}

/* The last block to see the flag: reset for the next round. */
MC_DEV void mc_fused_reset(uint32_t *sc) {
  sc[MC_WS_PREP_SEEN] = 0;
  sc[MC_WS_PREP_READY] = 0;
  sc[MC_WS_PREP_TICKET] = 0;
}

/* Every block: 1 when this block is the one to prep (the first started). */
MC_DEV int mc_fused_take_ticket(const mc_kargs_t &a) {
  __shared__ int first;
  if (threadIdx.x == 0) first = atomicAdd(&mc_ws_u32(&a, mc_ws_scalars_off(&a.s))[MC_WS_PREP_TICKET], 1u) == 0;
  __syncthreads();
  return first;
}

/* The prepping block, after its prep: release the prep's stores. */
MC_DEV void mc_fused_publish(const mc_kargs_t &a) {
  uint32_t *sc = mc_ws_u32(&a, mc_ws_scalars_off(&a.s));
  __syncthreads(); /* every thread's prep stores before the release */
  if (threadIdx.x != 0) return;
  if (gridDim.x == 1) { /* no one waits */
    mc_fused_reset(sc);
    return;
  }
  __threadfence(); /* the block's stores, ordered through the barrier (cumulativity), before the flag */
  atomicExch(&sc[MC_WS_PREP_READY], 1u);
}

/* Every other block: wait for the prep. Returns 1 on a failure (recorded). */
MC_DEV int mc_fused_await(const mc_kargs_t &a) {
  uint32_t *sc = mc_ws_u32(&a, mc_ws_scalars_off(&a.s));
  __shared__ int fail;
  if (threadIdx.x == 0) {
    fail = 0;
    const uint64_t deadline = mc_globaltimer_ns() + a.timeout_ns;
    while (mc_ld_volatile_u32(&sc[MC_WS_PREP_READY]) == 0) {
      __nanosleep(64);
      /* not mc_dev_failed: a refused round records its failure in the
       * prep and still publishes, and the handle lives on, so a waiter
       * must not leave early (it would leave the flags set for the next
       * round). The prep waits on nothing, so this deadline is only a
       * guard; a timeout ends the handle (MC_ERR_TIMEOUT is sticky), and
       * the flags it leaves set are never read again. peer = this rank:
       * its own prep. */
      if (mc_globaltimer_ns() > deadline) {
        mc_dev_fail(a.err, MC_DEVERR_TIMEOUT, MC_PHASE_DSEND, a.rank, a.rank, -1, -1, -1, 0, 1, 0, 0);
        fail = 1;
        break;
      }
    }
    __threadfence(); /* the flag's load before this block's loads of the prep's results (acquire) */
    if (!fail && atomicAdd(&sc[MC_WS_PREP_SEEN], 1u) == gridDim.x - 2) mc_fused_reset(sc);
  }
  __syncthreads(); /* the other threads' loads after thread 0's acquire */
  return fail;
}

static __global__ void __launch_bounds__(MC_THREADS) mc_k_dispatch_fused(mc_kargs_t a) {
  if (mc_fused_take_ticket(a)) {
    mc_dispatch_prep_k(a, 1);
    mc_fused_publish(a);
  } else if (mc_fused_await(a)) {
    return;
  }
  if (a.zc == MC_ZC_DIRECT) mc_zc_dispatch_send_body(a);
  else mc_dispatch_send_body(a);
}

#endif
