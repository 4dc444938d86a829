/* mc_gpu_zc.cuh - the kernels for when every rank registered its expert
 * buffers (mc_a2a_register_expert_buffers, p2p only, group_size 1):
 * combine reads the expert rows from the peers' expert_y where the token
 * lives (no pre-reduced row crosses memory), and with MC_ZC_DIRECT
 * dispatch stores a token straight into its slots in the receivers'
 * expert_x (no record, no receive copy). Part of mc_gpu_kernels.cuh;
 * docs/zero-copy.md has the design and its measurements.
 *
 * The round, kernel by kernel (p: this rank; a.zc_tab: every rank's
 * registered buffers as mapped here):
 * 1. prep (mc_gpu_prep.cuh), last block: p's records per global expert
 *    into every rank's zc_cnt[round parity][p], then SET ZC_CNT[p] = round.
 *    A record's slot at its expert's rank is then base + pos everywhere:
 *    pos its place among p's records for the expert (the header's), base
 *    the records of the ranks below p for that expert (slots are ordered
 *    by source), which every rank can sum from its own zc_cnt.
 * 2. dispatch-send: the copying path's (mc_gpu_kernels.cuh), or with
 *    MC_ZC_DIRECT this one: wait for ZC_CNT from the ranks below p, then a
 *    warp per (token, 2 KB of payload) loads it once and stores it into all
 *    its expert slots in the peers' expert_x; per block, one release per
 *    rank adding the (slot, segment) pairs it stored there (DISP_RECS).
 * 3. dispatch-recv: the copying path's, or with MC_ZC_DIRECT: wait for
 *    every rank's ZC_CNT (expert_count follows from them) and for each
 *    rank's pairs to have landed; nothing to copy.
 * 4. combine-send: SET every rank's COMB_BAR[p] = round: "my expert_y of
 *    this round is complete" (it runs after the caller's GEMM on its stream).
 * 5. combine-recv: wait for every rank's COMB_BAR, sum the lower ranks'
 *    counts into each expert's base (per block, in shared memory), then per
 *    token read its rows from the peers' expert_y and sum them exactly as
 *    the copying path does: per rank, fp32 over its experts ascending,
 *    weighted, rounded to the wire dtype; over ranks ascending in fp32,
 *    rounded once. Same bits. (The bases are summed here, not in
 *    dispatch-recv, to keep the copying dispatch's kernels as they are;
 *    moving them did not change the measured dispatch: perf-notes 22.)
 *
 * Why round i+1 cannot touch what round i still uses:
 * - (MC_ZC_DIRECT) s writes d's expert_x in its dispatch-send(i+1), after s's
 *   combine-recv(i) saw d's COMB_BAR(i), set by d's combine-send(i), which
 *   runs after d's GEMM(i) read expert_x.
 * - d's GEMM(i+1) rewrites expert_y after d's dispatch-recv(i+1), which
 *   waited for every s's meta (copying) or ZC_CNT (direct) of round i+1,
 *   sent after s's combine-recv(i) finished reading d's expert_y.
 * - zc_cnt[i parity][s] at d is rewritten by s's prep(i+2), after s's
 *   combine-recv(i+1) saw d's COMB_BAR(i+1), set by d's combine-send(i+1),
 *   after d's combine-recv(i), the last kernel of round i to read it.
 *   (Round i+1's go to the other copy: one copy was not enough, since s
 *   may start round i+1 as soon as d's combine-send(i) has signalled.)
 * - the staged headers (each token's experts, pos, weights) are this
 *   rank's, rewritten by its own next prep, after its own combine-recv.
 * The caller's part (moecomm.h): not to write expert_y between its
 * combine-send and its next dispatch-recv, nor, with MC_ZC_DIRECT,
 * expert_x. */
#ifndef MC_GPU_ZC_CUH
#define MC_GPU_ZC_CUH

/* dispatch-send: count[W] stored per rank, base[E] first slot of my records
 * per expert; combine-recv: base[E] */
static inline size_t mc_zc_send_smem_bytes(const mc_shape_t *s) {
  return sizeof(uint32_t) * ((size_t)s->world_size + (size_t)s->num_experts);
}
static inline size_t mc_zc_crecv_smem_bytes(const mc_shape_t *s) { return sizeof(uint32_t) * (size_t)s->num_experts; }

/* base[e] = the records the ranks below this one send to expert e this
 * round, for every e (a thread per expert; after the ZC_CNT waits) */
MC_DEV void mc_zc_bases(const mc_kargs_t &a, uint64_t round, uint32_t *base) {
  for (int e = threadIdx.x; e < a.s.num_experts; e += blockDim.x) {
    uint32_t run = 0;
    for (int src = 0; src < a.rank; src++) run += ((const uint32_t *)(a.win + mc_zc_cnt_off(&a.s, round, src)))[e];
    base[e] = run;
  }
}

MC_DEV unsigned char *mc_zc_buf(const mc_kargs_t &a, int buf, int rank) {
  return (unsigned char *)a.zc_tab[buf * a.s.world_size + rank];
}

MC_DEV void mc_zc_dispatch_send_body(const mc_kargs_t &a) {
  const mc_shape_t *s = &a.s;
  const uint32_t *sc = mc_ws_u32(&a, mc_ws_scalars_off(s));
  if (sc[MC_WS_BAD]) return;
  mc_trace_start(&a, MC_TK_DSEND);
  const int W = s->world_size, K = s->topk, L = mc_num_local_experts(s);
  const int cap = mc_expert_capacity(s), tid = threadIdx.x, lane = tid & 31;
  const uint64_t round = *mc_ws_round(&a);
  extern __shared__ uint32_t smem[];
  uint32_t *count = smem, *base = smem + W;
  __shared__ int abort_;
  if (tid == 0) abort_ = 0;
  for (int p = tid; p < W; p += blockDim.x) count[p] = 0;
  __syncthreads();
  /* only the ranks below this one: their records come first in every slot list */
  for (int src = tid; src < a.rank; src += blockDim.x)
    if (mc_dev_wait_ge(&a, mc_sig_local(&a, MC_SIG_ZC_CNT, src), round, MC_PHASE_DSEND, src, MC_SIG_ZC_CNT, round))
      abort_ = 1;
  __syncthreads();
  if (abort_) return;
  mc_trace_point(&a, MC_TK_DSEND, 0);
  mc_zc_bases(a, round, base);
  __syncthreads();
  const int m_eff = (int)sc[MC_WS_M_EFF]; /* group_size 1: this rank sends every token */
  const int segs = mc_token_segs(s);
  const int gw = (blockIdx.x * blockDim.x + tid) >> 5, nw = (gridDim.x * blockDim.x) >> 5;
  /* a warp per (token, payload segment): a warp per token left most warps
   * idle (128 tokens, ~1000 warps) and each a chain of loads and 8x stores */
  for (int it = gw; it < m_eff * segs; it += nw) {
    const int t = it / segs, sg = it % segs;
    const mc_record_header_t *h = (const mc_record_header_t *)(a.win + mc_disp_send_off(s, t));
    unsigned char *xd[MC_MAX_TOPK], *sd[MC_MAX_TOPK];
    for (int k = 0; k < K; k++) {
      const mc_target_t tg = h->targets[k];
      const int d = tg.expert / L;
      const uint32_t slot = base[tg.expert] + (uint32_t)tg.pos;
      const uint64_t at = (uint64_t)(tg.expert - d * L) * cap + slot;
      xd[k] = mc_zc_buf(a, MC_ZC_X, d) + at * s->token_bytes;
      sd[k] = s->scale_bytes ? mc_zc_buf(a, MC_ZC_SCALE, d) + at * s->scale_bytes : NULL;
      if (lane == 0) atomicAdd(&count[d], 1u); /* the unit: a (slot, segment) */
    }
    const uint64_t off = (uint64_t)sg * MC_SEG_BYTES, left = s->token_bytes - off;
    mc_warp_copy16_to(xd, K, off, (const unsigned char *)a.tokens + (uint64_t)t * s->token_bytes + off,
                      left < MC_SEG_BYTES ? left : MC_SEG_BYTES, lane);
    if (s->scale_bytes && sg == 0)
      mc_warp_copy4_to(sd, K, 0, (const unsigned char *)a.scales + (uint64_t)t * s->scale_bytes, s->scale_bytes,
                       lane);
  }
  mc_block_signal_counts(a, count, MC_SIG_DISP_RECS);
  mc_trace_end(&a, MC_TK_DSEND);
}
static __global__ void __launch_bounds__(MC_THREADS) mc_k_zc_dispatch_send(mc_kargs_t a) {
  mc_zc_dispatch_send_body(a);
}

/* One block: the counts give expert_count and what each rank stored here. */
static __global__ void __launch_bounds__(MC_THREADS) mc_k_zc_dispatch_recv(mc_kargs_t a) {
  const mc_shape_t *s = &a.s;
  const uint32_t *sc = mc_ws_u32(&a, mc_ws_scalars_off(s));
  if (sc[MC_WS_BAD]) return;
  mc_trace_start(&a, MC_TK_DRECV);
  const int W = s->world_size, L = mc_num_local_experts(s), tid = threadIdx.x;
  const uint64_t round = *mc_ws_round(&a);
  __shared__ int abort_;
  if (tid == 0) abort_ = 0;
  __syncthreads();
  for (int src = tid; src < W; src += blockDim.x)
    if (mc_dev_wait_ge(&a, mc_sig_local(&a, MC_SIG_ZC_CNT, src), round, MC_PHASE_DRECV, src, MC_SIG_ZC_CNT, round))
      abort_ = 1;
  __syncthreads();
  if (abort_) return;
  mc_trace_point(&a, MC_TK_DRECV, 0);
  for (int l = tid; l < L; l += blockDim.x) {
    uint32_t n = 0;
    for (int src = 0; src < W; src++) n += ((const uint32_t *)(a.win + mc_zc_cnt_off(s, round, src)))[a.rank * L + l];
    a.expert_count[l] = (int32_t)n;
  }
  uint64_t *seen = (uint64_t *)(a.ws + mc_ws_seen_off(s));
  for (int src = tid; src < W; src += blockDim.x) {
    const uint32_t *cnt = (const uint32_t *)(a.win + mc_zc_cnt_off(s, round, src)) + a.rank * L;
    uint64_t n = 0;
    for (int l = 0; l < L; l++) n += cnt[l];
    n *= (uint64_t)mc_token_segs(s); /* dispatch-send counts (slot, segment) pairs */
    if (mc_dev_wait_ge(&a, mc_sig_local(&a, MC_SIG_DISP_RECS, src), seen[MC_SIG_DISP_RECS * W + src] + n,
                       MC_PHASE_DRECV, src, MC_SIG_DISP_RECS, round))
      return; /* recorded; the handle is aborted */
    seen[MC_SIG_DISP_RECS * W + src] += n;
  }
  mc_trace_end(&a, MC_TK_DRECV);
}

/* One block: expert_y is complete (the caller's GEMM ran before, on this stream). */
static __global__ void __launch_bounds__(MC_THREADS) mc_k_zc_combine_send(mc_kargs_t a) {
  if (mc_ws_u32(&a, mc_ws_scalars_off(&a.s))[MC_WS_BAD]) return;
  mc_trace_start(&a, MC_TK_CSEND);
  const uint64_t round = *mc_ws_round(&a);
  for (int p = threadIdx.x; p < a.s.world_size; p += blockDim.x) {
    mc_fence_peers(&a); /* the previous kernels' expert_y stores before the signal, at the peers' scope */
    mc_sig_set(&a, (uint64_t *)(mc_t_peer_window(&a, p) + mc_sig_off(&a.s, MC_SIG_COMB_BAR, a.rank)), round);
  }
  mc_trace_end(&a, MC_TK_CSEND);
}

/* What the registered combine-recv waits for from rank p (also
 * MC_GPU_PREWAIT's, mc_gpu_prewait.cuh): p's expert_y complete, and for a
 * rank below this one its counts, long there (prep sent them) but the wait
 * is what orders the loads of them. 1 on a failure (recorded). */
MC_DEV int mc_zc_wait_outputs(const mc_kargs_t &a, int p, uint64_t round) {
  return mc_dev_wait_ge(&a, mc_sig_local(&a, MC_SIG_COMB_BAR, p), round, MC_PHASE_CRECV, p, MC_SIG_COMB_BAR, round) ||
         (p < a.rank &&
          mc_dev_wait_ge(&a, mc_sig_local(&a, MC_SIG_ZC_CNT, p), round, MC_PHASE_CRECV, p, MC_SIG_ZC_CNT, round));
}

/* acc += (the wire dtype's rounding of part): the row the copying path
 * stores at the source and the owner loads again, without the trip */
MC_DEV void mc_seg_add_rounded(float acc[MC_SEG_GROUPS_PER_LANE][8], const float part[MC_SEG_GROUPS_PER_LANE][8],
                               int dt) {
#pragma unroll
  for (int q = 0; q < MC_SEG_GROUPS_PER_LANE; q++)
#pragma unroll
    for (int e = 0; e < 8; e++) {
      const float v = part[q][e];
      const float r = dt == MC_DTYPE_BF16   ? mc_bf16_to_f32(mc_f32_to_bf16(v))
                      : dt == MC_DTYPE_FP16 ? mc_dev_f16_to_f32(mc_dev_f32_to_f16(v))
                                            : v;
      acc[q][e] = __fadd_rn(acc[q][e], r);
    }
}

/* One warp per (token, row segment). Targets are in ascending expert id
 * (the header's order), so a rank's experts are consecutive and the ranks
 * come ascending: the copying path's two sums, in its order. */
MC_DEV void mc_zc_combine_recv_body(const mc_kargs_t &a, const int dt, const int odt) {
  const mc_shape_t *s = &a.s;
  const uint32_t *sc = mc_ws_u32(&a, mc_ws_scalars_off(s));
  const int W = s->world_size, K = s->topk, L = mc_num_local_experts(s), cap = mc_expert_capacity(s);
  const int tid = threadIdx.x, lane = tid & 31;
  const uint64_t round = *mc_ws_round(&a);
  __shared__ int abort_;
  mc_trace_start(&a, MC_TK_CRECV);
  if (tid == 0) abort_ = 0;
  __syncthreads();
  extern __shared__ uint32_t base[]; /* [E] */
  for (int p = tid; p < W; p += blockDim.x)
    if (mc_zc_wait_outputs(a, p, round)) abort_ = 1;
  __syncthreads();
  if (abort_) return;
  mc_zc_bases(a, round, base);
  __syncthreads();
  mc_trace_point(&a, MC_TK_CRECV, 0);
  const int m_eff = (int)sc[MC_WS_M_EFF], segs = mc_row_segs(s);
  const uint64_t row_bytes = mc_row_bytes(s), out_row = (uint64_t)s->hidden * (odt == MC_DTYPE_FP32 ? 4u : 2u);
  const int64_t seg_groups = MC_SEG_BYTES / (8 * (int64_t)s->in_elem_bytes), row_groups = s->hidden / 8;
  const int gw = (blockIdx.x * blockDim.x + tid) >> 5, nw = (gridDim.x * blockDim.x) >> 5;
  for (int it = gw; it < m_eff * segs; it += nw) {
    const int t = it / segs, sg = it % segs;
    const mc_record_header_t *h = (const mc_record_header_t *)(a.win + mc_disp_send_off(s, t));
    const mc_seg_t seg = {(int64_t)sg * seg_groups, seg_groups, row_groups, lane};
    float acc[MC_SEG_GROUPS_PER_LANE][8], part[MC_SEG_GROUPS_PER_LANE][8];
    mc_seg_zero(acc);
    mc_seg_zero(part);
    int cur = -1;
    for (int k = 0; k < K; k++) {
      const mc_target_t tg = h->targets[k];
      const int d = tg.expert / L;
      if (d != cur && cur >= 0) {
        mc_seg_add_rounded(acc, part, dt);
        mc_seg_zero(part);
      }
      cur = d;
      const uint64_t at = (uint64_t)(tg.expert - d * L) * cap + base[tg.expert] + (uint32_t)tg.pos;
      mc_seg_axpy(part, tg.weight, mc_zc_buf(a, MC_ZC_Y, d) + at * row_bytes, seg, dt);
    }
    mc_seg_add_rounded(acc, part, dt);
    mc_seg_store((unsigned char *)a.out + (uint64_t)t * out_row, acc, seg, dt, odt);
  }
  if (blockIdx.x == 0 && tid == 0) {
    uint64_t *st = (uint64_t *)(a.ws + mc_ws_stats_off(s));
    st[MC_STAT_CROWS] += (uint64_t)m_eff * K; /* rows read from the experts' ranks */
    st[MC_STAT_CBYTES] += (uint64_t)m_eff * K * row_bytes;
  }
  mc_trace_end(&a, MC_TK_CRECV);
}

/* per (wire, output) dtype pair, as the copying path's combine-recv */
static __global__ void __launch_bounds__(MC_CSEND_THREADS, 2) mc_k_zc_combine_recv(mc_kargs_t a) {
  if (mc_ws_u32(&a, mc_ws_scalars_off(&a.s))[MC_WS_BAD]) return;
  MC_BY_DTYPE_PAIR(mc_zc_combine_recv_body, a);
}

#endif
