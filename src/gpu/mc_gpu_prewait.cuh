/* mc_gpu_prewait.cuh - before a receiving grid (which ones: g->prewait,
 * mc_gpu_host.h; by default the registered combine-recv where ranks share
 * a GPU, perf-notes 39; MC_GPU_PREWAIT=1 both receivers, which at EP8 on one
 * H200 cut the registered combine's p99 from ~580 to ~150 us and added
 * 10-35 us to every median before dispatch was fused, perf-notes 30): one block
 * waits for everything a receiving kernel would wait for at its start, and
 * only then is the receiving kernel's grid launched, so that grid never
 * spins. Why: at EP8 on one GPU a larger grid moves the bytes faster but
 * its blocks spinning on signals crowd out the other ranks' senders
 * (dispatch p99 over 1 ms with a full wave, perf-notes 25). The receiving
 * kernels keep their own waits, which then pass at once, so their
 * correctness does not rest on this kernel; a timeout here is recorded like
 * theirs, and theirs then give up at their first check of the error slot.
 * Costs one launch per receiving half. Part of mc_gpu_kernels.cuh. */
#ifndef MC_GPU_PREWAIT_CUH
#define MC_GPU_PREWAIT_CUH

/* phase: MC_PHASE_DRECV (copying dispatch-recv), MC_PHASE_CRECV (combine-recv,
 * copying or registered: a.zc says which). The waits are the receiving
 * kernels' own (mc_wait_* in mc_gpu_kernels.cuh, mc_zc_wait_outputs). */
static __global__ void __launch_bounds__(MC_THREADS) mc_k_prewait(mc_kargs_t a, int phase) {
  if (mc_ws_u32(&a, mc_ws_scalars_off(&a.s))[MC_WS_BAD]) return;
  const uint64_t round = *mc_ws_round(&a);
  for (int p = threadIdx.x; p < a.s.world_size; p += blockDim.x) {
    const int fail = phase == MC_PHASE_DRECV ? mc_wait_meta(a, p, round) || mc_wait_records(a, p, round)
                     : a.zc                  ? mc_zc_wait_outputs(a, p, round)
                                             : mc_wait_rows(a, p, round);
    if (fail) return; /* recorded; the receiving kernel's own waits then give up */
  }
}

#endif
