/* mc_gpu_prewait.cuh - MC_GPU_PREWAIT=1 (experimental, written 2026-11-29
 * after the session's last device call, not yet run on a GPU): one block
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
 * copying or registered: a.zc says which) */
static __global__ void __launch_bounds__(MC_THREADS) mc_k_prewait(mc_kargs_t a, int phase) {
  const mc_shape_t *s = &a.s;
  const uint32_t *sc = mc_ws_u32(&a, mc_ws_scalars_off(s));
  if (sc[MC_WS_BAD]) return;
  const int W = s->world_size;
  const uint64_t round = *mc_ws_round(&a);
  const uint64_t *seen = (const uint64_t *)(a.ws + mc_ws_seen_off(s));
  for (int p = threadIdx.x; p < W; p += blockDim.x) {
    if (phase == MC_PHASE_DRECV) { /* dispatch-recv: the meta, then the records it announces */
      if (mc_dev_wait_ge(&a, mc_sig_local(&a, MC_SIG_DISP_META, p), round, phase, p, MC_SIG_DISP_META, round)) return;
      const uint32_t records = ((const uint32_t *)(a.win + mc_disp_meta_off(s, p)))[0];
      if (mc_dev_wait_ge(&a, mc_sig_local(&a, MC_SIG_DISP_RECS, p), seen[MC_SIG_DISP_RECS * W + p] + records, phase,
                         p, MC_SIG_DISP_RECS, round))
        return;
    } else if (a.zc) { /* registered combine-recv: every expert_y complete, the lower ranks' counts */
      if (mc_dev_wait_ge(&a, mc_sig_local(&a, MC_SIG_COMB_BAR, p), round, phase, p, MC_SIG_COMB_BAR, round)) return;
      if (p < a.rank &&
          mc_dev_wait_ge(&a, mc_sig_local(&a, MC_SIG_ZC_CNT, p), round, phase, p, MC_SIG_ZC_CNT, round))
        return;
    } else { /* copying combine-recv: every row segment expected from p */
      const uint32_t *expect = mc_ws_u32(&a, mc_ws_expect_off(s));
      if (mc_dev_wait_ge(&a, mc_sig_local(&a, MC_SIG_COMB_ROWS, p),
                         seen[MC_SIG_COMB_ROWS * W + p] + (uint64_t)expect[p] * mc_row_segs(s), phase, p,
                         MC_SIG_COMB_ROWS, round))
        return;
    }
  }
}

#endif
