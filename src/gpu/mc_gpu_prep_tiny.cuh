/* mc_gpu_prep_tiny.cuh - the one-warp prep of dispatch-send's one launch:
 * a decode call of at most 32 (token, k) pairs in groups of one rank, into
 * the batched layout (mc_dispatch_send_one_body picks it). It leaves what
 * mc_gpu_prep.cuh's block prep leaves and finishes the same way
 * (mc_prep_finish). */
#ifndef MC_GPU_PREP_TINY_CUH
#define MC_GPU_PREP_TINY_CUH

#include "mc_gpu_prep.cuh"

/* The one-launch prep of a call of at most 32 (token, k) pairs where a
 * group is one rank: one warp, a lane per pair (token lane / K, its
 * (lane % K)-th expert), by warp votes in place of the per-token loops
 * over K and the block-wide scans, whose dependent chains are most of a
 * decode batch's prep. Leaves in shared memory what
 * mc_dispatch_prep_body does; the same slots (token order) and the same
 * refusal records (the first bad k of the first bad token). Returns m, or
 * -1 where refused. */
MC_DEV int mc_prep_tiny(const mc_kargs_t &a, const int K, const uint64_t round, const int m) {
  const mc_shape_t *s = &a.s;
  const int W = s->world_size, E = s->num_experts, L = mc_num_local_experts(s), C = E + W;
  const int tid = threadIdx.x, lane = tid & 31;
  extern __shared__ uint32_t smem[];
  uint32_t *count = smem, *rexp = smem + C;
  const mc_route_tab_t tab = mc_tab_shared(smem, s);
  uint32_t *sent = mc_one_sent(smem, s);
  __shared__ int bad;
  /* dispatch-recv may start now: it waits for the outcome and the metas'
   * words, never for this kernel's end, so its launch and first loads
   * overlap the prep. The block prep lets it start only once every block
   * has prepped (mc_gpu_prep.cuh): a receiver waiting through that prep
   * now and then started late. This prep is a few warp votes, and the
   * blocks a decode call does not need have left, so the receiver's
   * blocks find SMs. */
  mc_pdl_launch_dependents();
  mc_trace_start(&a, MC_TK_PREP);
  /* warp 0's ids first: their load is the prep's one memory latency, and
   * the zeroing goes on meanwhile */
  const int t = lane / K, k = lane - t * K;
  const bool on = tid < 32 && lane < m * K;
  int64_t v = -1; /* (the weights: the send step's, into the headers) */
  if (on) v = a.ids64 ? ((const int64_t *)a.indices)[lane] : (int64_t)((const int32_t *)a.indices)[lane];
  for (int i = tid; i < C + W; i += blockDim.x)
    smem[i] = 0;
  for (int i = tid; i < W; i += blockDim.x)
    sent[i] = 0;
  __syncthreads(); /* the counts are zero before warp 0 sets them */
  mc_trace_point(&a, MC_TK_PREP, 1);
  if (tid < 32) {
    const uint32_t all = 0xffffffffu, lt = mc_lanemask_lt();
    const uint32_t tok = on ? ((1u << K) - 1u) << (t * K) : 0u;         /* this token's lanes */
    const uint32_t same = __match_any_sync(all, (unsigned long long)v); /* lanes with this id */
    if (lane == 0) mc_trace_after(&a, MC_TK_PREP, 6, same);
    const bool oor = on && (v < 0 || v >= E), dup = on && !oor && (same & tok & lt);
    const uint32_t badm = __ballot_sync(all, oor || dup);
    if (lane == 0) bad = badm != 0;
    if (badm) {
      if (lane == __ffs(badm) - 1 && blockIdx.x == 0)
        mc_dev_refuse(a.err, oor ? MC_DEVERR_BAD_EXPERT : MC_DEVERR_DUP_EXPERT, t, k, (int)(int32_t)v, 0, (uint64_t)v);
    } else {
      const int rk = on ? mc_fdiv((int)v, s->div_local) : -1;
      /* every lane takes part in each warp vote: one behind a short-circuit
       * would leave the others waiting in it for ever */
      const uint32_t same_r = __match_any_sync(all, rk);
      const bool f = on && !(same_r & tok & lt); /* the first k of its rank */
      const uint32_t lead = __ballot_sync(all, f);
      int jpos = 0; /* this rank's index among the token's ranks, ascending */
      for (int j = 0; j < K; j++) {
        const int rj = __shfl_sync(all, rk, (t * K + j) & 31);
        jpos += (lead >> ((t * K + j) & 31) & 1u) && rj < rk;
      }
      /* records to each rank and to each expert: the lanes before with the same key */
      const uint32_t same_rk = __match_any_sync(all, f ? rk : W + lane);
      const int ridx = __popc(same_rk & lt), tpos = __popc(same & lt);
      if (f) {
        if (ridx == 0) count[E + rk] = rexp[rk] = __popc(same_rk);
        tab.dests[t * K + jpos] = (uint16_t)rk;
        tab.ridx[t * K + jpos] = (uint32_t)ridx;
      }
      if (on) {
        if (tpos == 0) count[v] = __popc(same);
        tab.tpos[t * K + k] = (uint32_t)tpos;
        if (k == 0) tab.ndest[t] = (uint16_t)__popc(lead & tok);
      }
    }
  }
  __syncthreads();
  mc_trace_point(&a, MC_TK_PREP, 0);
  if (bad) {
    if (tid == 0 && blockIdx.x == 0) mc_prep_refuse(a, true);
    return -1;
  }
  if (blockIdx.x == 0) mc_prep_finish(a, 0, K, true, count, rexp, m, tab, round, 0);
  mc_trace_end(&a, MC_TK_PREP);
  return m;
}

#endif
