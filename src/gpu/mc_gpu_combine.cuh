/* mc_gpu_combine.cuh - combine on the GPU: combine-send pre-reduces each
 * received record's experts into one row per (token, rank of its group) and
 * stores it into those ranks' windows; combine-recv waits for every rank's
 * rows and sums each token's in rank order. Built on mc_gpu_kernels.cuh
 * (which says what a transport provides, and why a round cannot overwrite
 * what a peer still reads); its entry points are rows of mc_gpu_table.cuh. */
#ifndef MC_GPU_COMBINE_CUH
#define MC_GPU_COMBINE_CUH

#include "mc_gpu_kernels.cuh"

#define MC_CSEND_THREADS 256 /* combine-send holds 32 fp32 sums + 4 loads per lane: 2 blocks of 256 per SM at <= 128 registers */

/* combine-recv: src's running total of row segments once it has sent
 * every one it owes this rank this round */
MC_DEV uint64_t mc_rows_target(const mc_kargs_t &a, int src) {
  const uint64_t *seen = (const uint64_t *)(a.ws + mc_ws_seen_off(&a.s));
  const uint32_t *expect = mc_ws_u32(&a, mc_ws_expect_off(&a.s));
  return seen[MC_SIG_COMB_ROWS * a.s.world_size + src] + (uint64_t)expect[src] * mc_row_segs(&a.s);
}

/* Expert row k of a record (lane j holds the entry's j-th target): its
 * row's place in expert_y, and its weight in *w. Warp-collective. */
MC_DEV uint64_t mc_target_row(const mc_target_t &mine, const int k, const int cap, float *w) {
  const int kj = k & 31;
  const uint64_t at =
      (uint64_t)__shfl_sync(0xffffffffu, mine.expert, kj) * cap + (uint64_t)__shfl_sync(0xffffffffu, mine.pos, kj);
  *w = __shfl_sync(0xffffffffu, mine.weight, kj);
  return at;
}

/* A staged member's segment is in staging (stored by this warp, or by the
 * block before a barrier): count it; the warp that counts a row's last
 * segment puts the whole row to every staged member (the unit of the
 * signal is a segment for every source, direct or not). One warp. */
MC_DEV void mc_csend_put_staged(const mc_kargs_t &a, const int i, const int segs, const int first,
                                const uint64_t dst_off, const unsigned char *stage, uint32_t *rowdone) {
  const int lane = threadIdx.x & 31;
  __syncwarp();
  uint32_t done = 0;
  if (lane == 0) {
    __threadfence(); /* the segment's stores before the count another warp acts on */
    done = atomicAdd(&rowdone[i], 1u);
  }
  done = __shfl_sync(0xffffffffu, done, 0);
  if (done != (uint32_t)segs - 1) return;
  if (lane == 0) rowdone[i] = 0; /* for the next round */
  /* the other warps' segments, seen through the count, before the put */
  mc_fence_peers(&a);
  for (int p = first; p < first + a.s.group_size; p++)
    if (!mc_t_peer_window(&a, p))
      mc_t_put_signal_warp(&a, dst_off, stage, mc_row_bytes(&a.s), MC_SIG_COMB_ROWS, (uint64_t)segs, MC_SIG_ADD, p);
}

/* Combine-send at decode sizes (a call's segments no more than its
 * blocks): block b sums item b = (record, segment), 8 bytes of the
 * segment a thread, with MC_CSEND_ROWS experts' loads in flight at once,
 * not the MC_SEG_ROWS a warp's registers allow for its 64 bytes a lane.
 * The same fp32 operations in the same order as the warp path: the same
 * bits. */
#define MC_CSEND_ROWS 8
static_assert(MC_SEG_BYTES == 8 * MC_CSEND_THREADS, "a thread of combine-send's block path holds 8 bytes of a segment");
/* What combine-send loads first, all at once (one memory round trip, not
 * three one after another): the refusal check, the round, the records
 * taken in, and the route entry a decode call's block path needs (entry
 * blockIdx / segments, loaded before it is known whether this call takes
 * that path; it is in the route table's range whatever the call). */
typedef struct mc_csend_pre {
  uint64_t round;
  uint32_t bad, n_route;
  mc_target_t mine; /* lane k < topk: the entry's k-th target */
  int32_t n, src_rank, token;
} mc_csend_pre_t;
MC_DEV mc_csend_pre_t mc_csend_prefetch(const mc_kargs_t &a) {
  const mc_shape_t *s = &a.s;
  const int lane = threadIdx.x & 31, most = s->world_size * mc_src_cap(s) - 1;
  const int b = mc_fdiv((int)blockIdx.x, s->div_rsegs), i = b < most ? b : most;
  const uint32_t *sc = mc_ws_u32(&a, mc_ws_scalars_off(s));
  const mc_route_entry_t *r = (const mc_route_entry_t *)(a.ws + mc_ws_route_off(s, i));
  mc_csend_pre_t p;
  p.bad = mc_ld_now_u32(&sc[MC_WS_BAD]);
  p.n_route = mc_ld_now_u32(&sc[MC_WS_N_ROUTE]);
  p.round = mc_ld_now_u64(mc_ws_round(&a));
  p.mine = mc_target_t{0, 0, 0.0f};
  if (lane < s->topk) {
    p.mine.expert = (int32_t)mc_ld_now_u32(&r->targets[lane].expert);
    p.mine.pos = (int32_t)mc_ld_now_u32(&r->targets[lane].pos);
    p.mine.weight = __uint_as_float(mc_ld_now_u32(&r->targets[lane].weight));
  }
  p.n = (int32_t)mc_ld_now_u32(&r->n_targets);
  p.src_rank = (int32_t)mc_ld_now_u32(&r->src_rank);
  p.token = (int32_t)mc_ld_now_u32(&r->token);
  return p;
}

MC_DEV void mc_csend_block_item(const mc_kargs_t &a, const mc_csend_pre_t &pre, const int sg, const int dt,
                                uint32_t *count, uint32_t *rowdone) {
  const mc_shape_t *s = &a.s;
  const int G = s->group_size, cap = mc_expert_capacity(s);
  const int i = mc_fdiv((int)blockIdx.x, s->div_rsegs);
  const mc_target_t mine = pre.mine;
  const int n = pre.n, first = mc_fdiv(pre.src_rank, s->div_group) * G;
  if (threadIdx.x == 0) mc_trace_after(&a, MC_TK_CSEND, 0, (uint32_t)n);
  const uint64_t row_bytes = mc_row_bytes(s), dst_off = mc_comb_recv_off(s, a.rank, pre.token);
  const uint64_t off = (uint64_t)sg * MC_SEG_BYTES + 8u * threadIdx.x; /* this thread's bytes of the row */
  const bool in_row = off < row_bytes; /* rows are a multiple of 16 bytes */
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int k = 0; k < n; k += MC_CSEND_ROWS) {
    uint2 v[MC_CSEND_ROWS];
    float w[MC_CSEND_ROWS];
#pragma unroll
    for (int j = 0; j < MC_CSEND_ROWS; j++) {
      const uint64_t at = mc_target_row(mine, k + j, cap, &w[j]);
      v[j] = k + j < n && in_row ? *(const uint2 *)((const unsigned char *)a.expert_y + at * row_bytes + off)
                                 : make_uint2(0u, 0u);
    }
#pragma unroll
    for (int j = 0; j < MC_CSEND_ROWS; j++)
      if (k + j < n) mc_acc4(acc, w[j], v[j], dt);
  }
  const uint2 q = mc_pack4(acc, dt);
  if (threadIdx.x == 0) mc_trace_after(&a, MC_TK_CSEND, 3, q.x); /* the rows loaded and summed */
  bool any_staged = false;
  for (int p = first; p < first + G; p++) {
    unsigned char *peer = mc_t_peer_window(&a, p);
    any_staged |= peer == NULL;
    if (peer && in_row) *(uint2 *)(peer + dst_off + off) = q;
    if (peer && threadIdx.x == 0) atomicAdd(&count[p], 1u); /* the block barrier before its signals orders all stores */
  }
  if (!any_staged) return;
  unsigned char *stage = a.win + mc_comb_send_off(s, i);
  if (in_row) *(uint2 *)(stage + off) = q;
  __syncthreads();
  if (threadIdx.x < 32) mc_csend_put_staged(a, i, mc_row_segs(s), first, dst_off, stage, rowdone);
}

/* ---- combine-send (whole grid): one warp per (received record, row segment) ----
 * Enter the round barrier, then for each segment of each pre-reduced row:
 * the fp32 sum of the record's experts on this rank, weighted, ascending
 * local expert, rounded to the wire dtype, stored straight into every group
 * member's window that is directly reachable, or into staging for the
 * others. The warp that finishes a row's last segment (a per-row counter)
 * sends the row's signal: one release per direct member, one
 * put-with-signal per staged member. Each lane keeps four 8-element loads
 * in flight per expert, MC_SEG_ROWS experts at once, their targets loaded
 * with the entry. (Measured: a warp per whole row starves the SMs of
 * warps, a signal per segment costs a system-scope release each.) */
MC_DEV void mc_combine_send_body(const mc_kargs_t &a, const int masking, const int dt, const mc_csend_pre_t &pre) {
  const mc_shape_t *s = &a.s;
  const int W = s->world_size, G = s->group_size, cap = mc_expert_capacity(s), lane = threadIdx.x & 31;
  const uint64_t round = pre.round;
  const int n_route = (int)pre.n_route;
  mc_trace_start(&a, MC_TK_CSEND);
  extern __shared__ uint32_t count[]; /* [W] row segments this block stored into each rank */
  for (int p = threadIdx.x; p < W; p += blockDim.x) count[p] = 0;
  __syncthreads();
  /* the round barrier's signals, by the last block's last warp: a release
   * holds up the warp that makes it (mc-probe times it), and that warp is
   * the last one dealt an item, in either path below */
  if (blockIdx.x == gridDim.x - 1 && (int)(threadIdx.x >> 5) == (int)(blockDim.x >> 5) - 1) {
    for (int p = threadIdx.x & 31; p < W; p += 32)
      if (!mc_masked(masking, &a, p)) mc_signal_set(a, p, MC_SIG_COMB_BAR, round);
  }
  const uint64_t row_bytes = mc_row_bytes(s);
  const int segs = mc_row_segs(s);
  const int64_t seg_groups = mc_seg_groups(dt);
  const int64_t row_groups = s->hidden / 8;
  uint32_t *rowdone = mc_ws_u32(&a, mc_ws_rowdone_off(s));
  /* decode sizes: a block an item (mc_csend_block_item); else items dealt
   * to blocks first, a warp each, so that a call's few segments run on as
   * many SMs */
  const int items = n_route * segs;
  const bool per_block = items <= (int)gridDim.x; /* the same in every block */
  if (per_block && (int)blockIdx.x < items)
    mc_csend_block_item(a, pre, (int)blockIdx.x - mc_fdiv((int)blockIdx.x, s->div_rsegs) * segs, dt, count, rowdone);
  const int gw = (int)(threadIdx.x >> 5) * (int)gridDim.x + (int)blockIdx.x, nw = (gridDim.x * blockDim.x) >> 5;
  for (int it = per_block ? items : gw; it < items; it += nw) {
    const int i = mc_fdiv(it, s->div_rsegs), sg = it - i * segs;
    const mc_route_entry_t *r = (const mc_route_entry_t *)(a.ws + mc_ws_route_off(s, i));
    /* the entry and its targets in one round trip: lane k loads the k-th
     * (those past n_targets are not used) */
    const mc_target_t mine = lane < s->topk ? r->targets[lane] : mc_target_t{0, 0, 0.0f};
    const int n = r->n_targets, first = mc_fdiv(r->src_rank, s->div_group) * G;
    const uint64_t dst_off = mc_comb_recv_off(s, a.rank, r->token);
    unsigned char *stage = a.win + mc_comb_send_off(s, i);
    const mc_seg_t seg = {(int64_t)sg * seg_groups, seg_groups, row_groups, lane};
    float acc[MC_SEG_GROUPS_PER_LANE][8];
    mc_seg_zero(acc);
    /* MC_SEG_ROWS experts' rows loaded at once, summed in target order */
    for (int k = 0; k < n; k += MC_SEG_ROWS) {
      const void *row[MC_SEG_ROWS];
      float w[MC_SEG_ROWS];
#pragma unroll
      for (int j = 0; j < MC_SEG_ROWS; j++)
        row[j] = (const unsigned char *)a.expert_y + mc_target_row(mine, k + j, cap, &w[j]) * row_bytes;
      mc_seg_axpy_rows(acc, w, row, n - k, seg, dt);
    }
    bool any_staged = false;
    for (int p = first; p < first + G; p++) {
      unsigned char *peer = mc_t_peer_window(&a, p);
      any_staged |= peer == NULL;
      if (peer) mc_seg_store(peer + dst_off, acc, seg, dt, dt);
    }
    __syncwarp();
    if (lane == 0)
      for (int p = first; p < first + G; p++)
        if (mc_t_peer_window(&a, p)) atomicAdd(&count[p], 1u);
    if (!any_staged) continue;
    /* staged members get the whole row by one put */
    mc_seg_store(stage, acc, seg, dt, dt);
    mc_csend_put_staged(a, i, segs, first, dst_off, stage, rowdone);
  }
  mc_trace_point(&a, MC_TK_CSEND, 1);
  mc_block_signal_counts(a, count, MC_SIG_COMB_ROWS);
  mc_trace_point(&a, MC_TK_CSEND, 2);
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    uint64_t *st = (uint64_t *)(a.ws + mc_ws_stats_off(s));
    st[MC_STAT_CROWS] += (uint64_t)n_route * G;
    st[MC_STAT_CBYTES] += (uint64_t)n_route * G * row_bytes;
  }
  mc_trace_end(&a, MC_TK_CSEND);
}
/* A kernel per wire dtype (mc_gpu_table.cuh): with the dtype a constant,
 * each holds only its own loads and conversions in registers (one generic
 * body needed 225 registers per thread, one block per SM), and its code
 * alone. */
MC_DEV void mc_combine_send_kernel(const mc_kargs_t &a, const int masking, const int dt) {
  mc_pdl_launch_dependents();
  const mc_csend_pre_t pre = mc_csend_prefetch(a);
  if (pre.bad) return;
  mc_combine_send_body(a, masking, dt, pre);
}

/* combine-recv's grid's last warp, once it has summed its share (none at
 * decode sizes, where it does this while the other warps sum): waits for
 * every kept rank's barrier signal of this round (nobody may start the
 * next dispatch-send while a peer still reads this round's dispatch
 * buffers: the kernel's end comes after this warp's), and for every
 * block's arrival; then, where the rows came (ok), moves the running
 * totals of row segments on by this round's. */
MC_DEV void mc_crecv_move_on(const mc_kargs_t &a, const int masking, const uint64_t round, const int ok) {
  const int W = a.s.world_size, lane = threadIdx.x & 31;
  int fail = 0;
  for (int p = lane; p < W; p += 32)
    if (ok && !mc_masked(masking, &a, p) &&
        mc_dev_wait_ge(&a, mc_sig_local(&a, MC_SIG_COMB_BAR, p), round, MC_PHASE_CRECV, p, MC_SIG_COMB_BAR, round))
      fail = 1;
  if (lane == 0 && mc_recv_all_arrived(a, MC_WS_ARRIVED_CRECV, MC_PHASE_CRECV, round)) fail = 1;
  if (__any_sync(0xffffffffu, fail) || !ok) return;
  /* lane 0's acquire before every lane's stores; the totals are read first */
  __syncwarp();
  uint64_t *seen_w = (uint64_t *)(a.ws + mc_ws_seen_off(&a.s)) + MC_SIG_COMB_ROWS * W;
  for (int src = lane; src < W; src += 32) seen_w[src] = mc_rows_target(a, src);
  if (lane == 0) mc_trace_stamp(&a, MC_TK_CRECV, 3);
}

/* ---- combine-recv (whole grid) ----
 * Wait for every rank's rows, sum each token's rows in ascending rank order
 * in fp32, round once; the grid's last warp does the rest
 * (mc_crecv_move_on). */
MC_DEV void mc_combine_recv_body(const mc_kargs_t &a, const int masking, const int dt, const int odt) {
  const mc_shape_t *s = &a.s;
  uint32_t *sc = mc_ws_u32(&a, mc_ws_scalars_off(s));
  const int W = s->world_size, K = s->topk, tid = threadIdx.x, lane = tid & 31;
  const uint64_t round = *mc_ws_round(&a);
  const int m_eff = (int)sc[MC_WS_M_EFF];
  __shared__ int abort_;
  mc_trace_start(&a, MC_TK_CRECV);
  if (tid == 0) abort_ = 0;
  __syncthreads();
  const int segs = mc_row_segs(s); /* the rows signal counts row segments */
  const uint16_t *dests = (const uint16_t *)(a.ws + mc_ws_dests_off(s));
  const uint16_t *n_dests = (const uint16_t *)(a.ws + mc_ws_ndests_off(s));
  const int gw = (blockIdx.x * blockDim.x + tid) >> 5, nw = (gridDim.x * blockDim.x) >> 5;
  /* the route of each warp's first token (written by dispatch) loaded
   * while the rows are awaited, not after */
  int nd0 = 0, d00 = 0;
  if (gw < m_eff * segs) nd0 = n_dests[mc_fdiv(gw, s->div_rsegs)], d00 = dests[(int64_t)mc_fdiv(gw, s->div_rsegs) * K];
  for (int src = tid; src < W; src += blockDim.x)
    if (mc_dev_wait_ge(&a, mc_sig_local(&a, MC_SIG_COMB_ROWS, src), mc_rows_target(a, src), MC_PHASE_CRECV, src,
                       MC_SIG_COMB_ROWS, round))
      abort_ = 1;
  __syncthreads();
  mc_recv_arrive(a, MC_WS_ARRIVED_CRECV); /* the totals are read */
  const bool mover = blockIdx.x == gridDim.x - 1 && tid >= (int)blockDim.x - 32;
  if (abort_) {
    if (mover) mc_crecv_move_on(a, masking, round, 0);
    return;
  }
  mc_trace_point(&a, MC_TK_CRECV, 0);
  const uint64_t out_row = (uint64_t)s->hidden * (odt == MC_DTYPE_FP32 ? 4u : 2u);
  const int64_t seg_groups = mc_seg_groups(dt), row_groups = s->hidden / 8;
  /* one warp per (token, segment): four 8-element groups per lane in flight */
  for (int it = gw; it < m_eff * segs; it += nw) {
    const int t = mc_fdiv(it, s->div_rsegs), sg = it - t * segs;
    const uint16_t *d = dests + (int64_t)t * K;
    const bool first = it == gw;
    const int nd = first ? nd0 : n_dests[t];
    const mc_seg_t seg = {(int64_t)sg * seg_groups, seg_groups, row_groups, lane};
    float acc[MC_SEG_GROUPS_PER_LANE][8];
    mc_seg_zero(acc);
    /* one row at a time: two rows' loads in flight spilled here (combine-send can afford it) */
    for (int j = 0; j < nd; j++)
      mc_seg_axpy(acc, 1.0f, a.win + mc_comb_recv_off(s, first && j == 0 ? d00 : d[j], t), seg, dt);
    if (lane == 0) mc_trace_after(&a, MC_TK_CRECV, 2, __float_as_uint(acc[0][0])); /* the rows summed */
    mc_seg_store((unsigned char *)a.out + (uint64_t)t * out_row, acc, seg, dt, odt);
  }
  if (mover) mc_crecv_move_on(a, masking, round, 1);
  mc_trace_point(&a, MC_TK_CRECV, 1);
  /* traced: the end stamp once this block's stores are performed, which
   * the kernel's end waits for */
  if (a.trace) __threadfence();
  mc_trace_end(&a, MC_TK_CRECV);
}

/* Launched early (mc_gpu_launch.cuh), it waits for its own rank's
 * combine-send only at its end: everything it reads before was written by
 * dispatch, long finished, or arrives signalled (its own rows too), so it
 * sums rows while the sender still runs; the wait keeps later work on the
 * stream after both. A kernel per (wire, output) dtype pair where the
 * pair is common, as for combine-send; one with the dtypes read from the
 * arguments for the others (mc_gpu_table.cuh). */
MC_DEV void mc_combine_recv_kernel(const mc_kargs_t &a, const int masking, const int dt, const int odt) {
  if (!mc_ws_u32(&a, mc_ws_scalars_off(&a.s))[MC_WS_BAD]) mc_combine_recv_body(a, masking, dt, odt);
  mc_pdl_wait();
}

#endif
