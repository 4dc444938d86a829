/* mc_gpu_packed.cuh - the packed receive layouts on the GPU
 * (MC_LAYOUT_PACKED, MC_LAYOUT_EXPERT_SORTED): dispatch-recv into rows, and
 * the count step. Built on dispatch-recv, whose first steps it shares
 * (mc_drecv_metas); its entry points are rows of mc_gpu_table.cuh.
 *
 * The send half is the batched layout's; its metas then also carry the
 * sender's declared capacity and its records to every rank and expert
 * (mc_layout.h), so that every rank computes every rank's rows alike
 * (mc_packed_rows) and all reach one verdict. Combine is the batched
 * layout's too: each route entry names the rows combine-send reads as
 * (expert 0, position the row). Packed: one target of weight 1 per record,
 * so the caller's pre-reduced row goes back as it is (times 1 and added to
 * 0 in fp32: the same value). Sorted: a target per (record, local expert)
 * with its weight, summed as in the batched layout.
 *
 * A round in which a rank's rows exceed the capacity it declared is dropped
 * on every rank alike: the records are awaited and left unread, the round
 * barrier that combine would pass is passed here, the round's combine does
 * nothing (MC_WS_BAD), the drop is recorded for the host (apart from
 * failures: the handle goes on), and dispatch-send refuses until the host
 * has reported it (MC_WS_DROP). docs/protocol.md says why the buffers are
 * then reusable. */
#ifndef MC_GPU_PACKED_CUH
#define MC_GPU_PACKED_CUH

#include "mc_gpu_dispatch_recv.cuh"

/* Dynamic shared memory, in 32-bit words: seen[W], rows[W] and loff[L + 1]
 * (uint64 each), then base[W][L], prefix[W + 1], ecount[L]. */
static inline __host__ __device__ size_t mc_packed_smem_bytes(const mc_shape_t *s) {
  const size_t W = (size_t)s->world_size, L = (size_t)mc_num_local_experts(s);
  return sizeof(uint32_t) * (2 * W + 2 * W + 2 * (L + 1) + W * L + W + 1 + L);
}
typedef struct mc_packed_smem {
  uint64_t *seen, *rows, *loff;
  uint32_t *base, *prefix, *ecount;
} mc_packed_smem_t;
MC_DEV mc_packed_smem_t mc_packed_carve(uint32_t *smem, const mc_shape_t *s) {
  const int W = s->world_size, L = mc_num_local_experts(s);
  mc_packed_smem_t m;
  m.seen = (uint64_t *)smem;
  m.rows = m.seen + W;
  m.loff = m.rows + W;
  m.base = (uint32_t *)(m.loff + L + 1);
  m.prefix = m.base + W * L;
  m.ecount = m.prefix + W + 1;
  return m;
}

/* After mc_drecv_metas: where each local expert's rows start (sorted: its
 * pairs rounded up to expert_align; packed: its pairs, as the cpu
 * transport reports them), and the verdict: the lowest rank whose rows
 * exceed the capacity it declared, or -1 (*over_rows, *over_limit set).
 * Every thread of the block calls it; the same answer in every block and
 * on every rank. */
MC_DEV int mc_packed_plan(const mc_kargs_t &a, const int masking, const mc_packed_smem_t &m, int64_t *over_rows,
                          int64_t *over_limit) {
  const mc_shape_t *s = &a.s;
  const int W = s->world_size, L = mc_num_local_experts(s), tid = threadIdx.x;
  const int sorted = s->layout == MC_LAYOUT_EXPERT_SORTED;
  const unsigned char *meta0 = a.win + mc_disp_meta_off(s, 0);
  const uint8_t *skip = masking ? a.mask : NULL;
  __shared__ int any_limit, over;
  if (tid == 0) {
    uint64_t run = 0;
    m.loff[0] = 0;
    for (int l = 0; l < L; l++)
      m.loff[l + 1] = run += sorted ? mc_align_up(m.ecount[l], (uint64_t)s->expert_align) : m.ecount[l];
    any_limit = 0;
    over = W; /* none */
  }
  for (int q = tid; q < W; q += blockDim.x) m.rows[q] = 0;
  __syncthreads();
  for (int q = tid; q < W; q += blockDim.x)
    if (!(skip && skip[q]) && mc_packed_limit(s, meta0, q) > 0) any_limit = 1;
  __syncthreads();
  if (!any_limit) return -1; /* counted: nothing declared, nothing to compare */
  /* every rank's rows: packed, a (rank, source) pair a thread; sorted, a
   * (rank, local expert) pair a thread, each expert's rows rounded up */
  if (!sorted) {
    for (int i = tid; i < W * W; i += blockDim.x) {
      const int q = i / W, src = i % W;
      if (!(skip && (skip[q] || skip[src])))
        atomicAdd((unsigned long long *)&m.rows[q], mc_meta_get(s, meta0, src, mc_meta_torank_word(s) + q));
    }
  } else {
    for (int i = tid; i < W * L; i += blockDim.x) {
      const int q = i / L, l = i % L;
      if (skip && skip[q]) continue;
      uint64_t n = 0;
      for (int src = 0; src < W; src++)
        if (!(skip && skip[src])) n += mc_meta_get(s, meta0, src, mc_meta_toexpert_word(s) + q * L + l);
      atomicAdd((unsigned long long *)&m.rows[q], mc_align_up(n, (uint64_t)s->expert_align));
    }
  }
  __syncthreads();
  for (int q = tid; q < W; q += blockDim.x) {
    const int64_t limit = skip && skip[q] ? 0 : mc_packed_limit(s, meta0, q);
    if (limit > 0 && (int64_t)m.rows[q] > limit) atomicMin(&over, q);
  }
  __syncthreads();
  if (over >= W) return -1;
  *over_rows = (int64_t)m.rows[over];
  *over_limit = mc_packed_limit(s, meta0, over);
  return over;
}

/* A dropped round, from one block once every block has arrived (or the
 * count step's one block): every source's records awaited and left
 * unread, the round's state moved on as dispatch-recv moves it, the
 * round's combine made a no-op, the round barrier passed with every kept
 * rank, and the drop recorded last (apart from failures: no wait gives
 * up for it). */
MC_DEV void mc_packed_drop(const mc_kargs_t &a, const int masking, const mc_packed_smem_t &m, const uint64_t round,
                           const uint64_t call, const int q, const int64_t rows, const int64_t limit) {
  const mc_shape_t *s = &a.s;
  const int W = s->world_size, tid = threadIdx.x;
  uint32_t *sc = mc_ws_u32(&a, mc_ws_scalars_off(s));
  __shared__ int failed;
  if (tid == 0) failed = 0;
  __syncthreads();
  for (int src = tid; src < W; src += blockDim.x)
    if (!mc_masked(masking, &a, src) && mc_wait_records(a, src, round, m.seen, m.prefix)) failed = 1;
  __syncthreads();
  if (failed) return; /* a timeout, recorded: the handle is done */
  uint64_t *seen_w = (uint64_t *)(a.ws + mc_ws_seen_off(s)) + MC_SIG_DISP_RECS * W;
  for (int src = tid; src < W; src += blockDim.x)
    seen_w[src] = m.seen[src] + (uint64_t)(m.prefix[src + 1] - m.prefix[src]) * mc_record_pieces(s);
  if (tid == 0) {
    sc[MC_WS_N_ROUTE] = 0;
    sc[MC_WS_BAD] = 1; /* the round's combine kernels do nothing */
    *mc_ws_scalar64(&a, MC_WS_DRECV_ROUND) = round;
    *mc_ws_scalar64(&a, MC_WS_DRECV_TRIES) = call;
  }
  for (int p = tid; p < W; p += blockDim.x)
    if (!mc_masked(masking, &a, p)) mc_signal_set(a, p, MC_SIG_COMB_BAR, round);
  for (int p = tid; p < W; p += blockDim.x)
    if (!mc_masked(masking, &a, p) &&
        mc_dev_wait_ge(&a, mc_sig_local(&a, MC_SIG_COMB_BAR, p), round, MC_PHASE_DRECV, p, MC_SIG_COMB_BAR, round))
      failed = 1;
  __syncthreads();
  if (!failed && tid == 0) { /* dispatch-send refuses from here until the host has reported the drop */
    sc[MC_WS_DROP] = 1;
    volatile mc_dev_error_t *e = a.err;
    const uint64_t seq = e->drop_seq + 1;
    e->drop_peer = q;
    e->drop_rows = rows;
    e->drop_limit = limit;
    e->drop_round = round;
    __threadfence_system();
    e->drop_seq = seq;
    __threadfence_system();
  }
}

/* A refused call (mc_drecv_metas returned 2, in every block): nothing
 * comes; the last block out counts the call. */
MC_DEV void mc_drecv_refused(const mc_kargs_t &a) {
  if (threadIdx.x == 0) {
    uint32_t *sc = mc_ws_u32(&a, mc_ws_scalars_off(&a.s));
    __threadfence();
    if (atomicAdd(&sc[MC_WS_DONE_DRECV], 1u) == gridDim.x - 1) {
      *mc_ws_scalar64(&a, MC_WS_DRECV_TRIES) += 1;
      sc[MC_WS_DONE_DRECV] = 0;
    }
  }
}

/* ---- dispatch-recv in the packed layouts (whole grid): as the batched
 * layout's, a warp per (record, a.recv_pieces payload pieces), each
 * record's payload into one row (packed: row = the record's index among
 * all received, so rows follow (source, record)) or into a row per local
 * expert (sorted: the expert's first row + the batched slot); the warp of
 * the first piece writes the row's experts and weights and the route
 * entry. ---- */
MC_DEV void mc_dispatch_recv_packed_body(const mc_kargs_t &a, const int masking, const uint64_t round,
                                         const uint64_t call, const mc_drecv_pre_t &pre) {
  const mc_shape_t *s = &a.s;
  uint32_t *sc = mc_ws_u32(&a, mc_ws_scalars_off(s));
  const int W = s->world_size, K = s->topk, L = mc_num_local_experts(s), sorted = s->layout == MC_LAYOUT_EXPERT_SORTED;
  const int S = mc_token_segs(s), tid = threadIdx.x, lane = tid & 31;
  const int P = a.recv_pieces, I = mc_record_items(s, P);
  extern __shared__ uint32_t smem[];
  const mc_packed_smem_t m = mc_packed_carve(smem, s);
  const int r = mc_drecv_metas(a, masking, round, call, 1, 0, pre, m.seen, m.base, m.prefix, m.ecount);
  if (r == 2) mc_drecv_refused(a);
  if (r) return;
  int64_t over_rows = 0, over_limit = 0;
  const int over = mc_packed_plan(a, masking, m, &over_rows, &over_limit);
  const int total = (int)m.prefix[W];
  const int gtid = blockIdx.x * blockDim.x + tid, gthreads = gridDim.x * blockDim.x;
  if (over < 0) {
    /* the counts, once; padding rows (sorted) by the whole grid */
    if (blockIdx.x == 0) {
      uint64_t *load = (uint64_t *)(a.ws + mc_ws_load_off(s));
      for (int l = tid; l < L; l += blockDim.x) {
        load[l] += m.ecount[l];
        if (a.expert_count) a.expert_count[l] = (int32_t)m.ecount[l];
      }
      for (int l = tid; a.expert_offset && l <= L; l += blockDim.x) a.expert_offset[l] = (int32_t)m.loff[l];
      for (int src = tid; a.src_count && src < W; src += blockDim.x) {
        int32_t n = (int32_t)(m.prefix[src + 1] - m.prefix[src]);
        if (sorted) { /* its pairs: its records to each local expert, from its meta */
          n = 0;
          for (int l = 0; !mc_masked(masking, &a, src) && l < L; l++)
            n += (int32_t)mc_meta_get(s, a.win + mc_disp_meta_off(s, 0), src, 1 + l);
        }
        a.src_count[src] = n;
      }
      if (tid == 0 && a.rows_out) *a.rows_out = sorted ? (int64_t)m.loff[L] : (int64_t)total;
    }
    for (int l = 0; sorted && l < L; l++)
      for (int64_t r = (int64_t)(m.loff[l] + m.ecount[l]) + gtid; r < (int64_t)m.loff[l + 1]; r += gthreads) {
        a.row_expert[r] = -1;
        if (a.row_weight) a.row_weight[r] = 0.0f;
      }
  }
  const int gw = gtid >> 5, nw = gthreads >> 5;
  const uint64_t poff = mc_record_payload_off(s), soff = mc_record_scale_off(s);
  int waited_src = -1;
  for (int it = gw; over < 0 && it < total * I; it += nw) {
    const int i = it / I, j0 = (it % I) * P, j1 = j0 + P < S ? j0 + P : S;
    int src = 0, hi = W - 1; /* the last source whose records start at or before i */
    while (src < hi) {
      const int mid = (src + hi + 1) / 2;
      if (m.prefix[mid] <= (uint32_t)i) src = mid;
      else hi = mid - 1;
    }
    if (src != waited_src) {
      int fail = 0;
      if (lane == 0) fail = mc_wait_records(a, src, round, m.seen, m.prefix);
      if (__shfl_sync(0xffffffffu, fail, 0)) break; /* the failure is recorded; finish quietly */
      __syncwarp();
      waited_src = src;
    }
    const unsigned char *rec = a.win + mc_disp_recv_off(s, src, i - (int)m.prefix[src]);
    const mc_record_header_t *h = (const mc_record_header_t *)rec;
    const uint64_t po0 = (uint64_t)j0 * MC_SEG_BYTES;
    const uint32_t bytes0 = mc_token_seg_bytes(s, j0);
    int4 v[4];
    mc_warp_piece_load(v, rec + poff + po0, bytes0, lane);
    /* lane k reads target k: this rank's experts among them, ascending id */
    mc_target_t tg = {0, 0, 0.0f};
    int here = 0, l = 0;
    int64_t row = i; /* packed: the record's row */
    if (lane < K) {
      tg = h->targets[lane];
      l = tg.expert - a.rank * L; /* a range check, not a division: the copy waits for it */
      here = (unsigned)l < (unsigned)L;
      if (here && sorted) row = (int64_t)m.loff[l] + m.base[src * L + l] + tg.pos;
    }
    const uint32_t km = __ballot_sync(0xffffffffu, here);
    const int n = __popc(km), at = __popc(km & mc_lanemask_lt());
    for (int j = j0; j < j1; j++) {
      const uint64_t po = (uint64_t)j * MC_SEG_BYTES;
      const uint32_t bytes = mc_token_seg_bytes(s, j);
      if (j > j0) mc_warp_piece_load(v, rec + poff + po, bytes, lane);
      uint32_t rest = sorted ? km : km & (0u - km); /* packed: one row, from the first target here */
      for (; rest; rest &= rest - 1) {
        const int64_t r = __shfl_sync(0xffffffffu, row, __ffs(rest) - 1);
        unsigned char *x = (unsigned char *)a.expert_x + (uint64_t)r * s->token_bytes;
        mc_warp_piece_store(&x, 1, po, v, bytes, lane);
        if (j == S - 1 && s->scale_bytes) {
          unsigned char *sd = (unsigned char *)a.expert_scale + (uint64_t)r * s->scale_bytes;
          mc_warp_piece4_to(&sd, 1, 0, rec + soff, s->scale_bytes, lane, NULL);
        }
      }
    }
    if (j0 == 0) {
      mc_route_entry_t *re = (mc_route_entry_t *)(a.ws + mc_ws_route_off(s, i));
      if (sorted) {
        if (here) {
          re->targets[at] = mc_target_t{0, (int32_t)row, tg.weight};
          a.row_expert[row] = l;
          if (a.row_weight) a.row_weight[row] = tg.weight;
        }
      } else if (lane < K) { /* the row's local experts first (ascending), then -1 */
        const int to = here ? at : n + lane - at;
        a.row_expert[(int64_t)i * K + to] = here ? l : -1;
        if (a.row_weight) a.row_weight[(int64_t)i * K + to] = here ? tg.weight : 0.0f;
      }
      if (lane == 0) {
        if (!sorted) re->targets[0] = mc_target_t{0, i, 1.0f};
        re->src_rank = src;
        re->token = h->token;
        re->n_targets = sorted ? n : 1;
      }
    }
  }
  mc_trace_point(&a, MC_TK_DRECV, 2);
  mc_trace_end(&a, MC_TK_DRECV);
  __shared__ int last;
  __syncthreads();
  if (tid == 0) last = atomicAdd(&sc[MC_WS_DONE_DRECV], 1u) == gridDim.x - 1;
  __syncthreads();
  if (!last) return;
  if (over >= 0) {
    if (tid == 0) sc[MC_WS_DONE_DRECV] = 0;
    mc_packed_drop(a, masking, m, round, call, over, over_rows, over_limit);
    return;
  }
  if (tid == 0) { /* the state as the batched layout moves it on (mc_drecv_move_on): stores only */
    uint64_t *seen_w = (uint64_t *)(a.ws + mc_ws_seen_off(s)) + MC_SIG_DISP_RECS * W;
    for (int src = 0; src < W; src++)
      seen_w[src] = m.seen[src] + (uint64_t)(m.prefix[src + 1] - m.prefix[src]) * mc_record_pieces(s);
    sc[MC_WS_N_ROUTE] = (uint32_t)total;
    *mc_ws_scalar64(&a, MC_WS_DRECV_ROUND) = round;
    *mc_ws_scalar64(&a, MC_WS_DRECV_TRIES) = call;
    sc[MC_WS_DONE_DRECV] = 0;
  }
}

MC_DEV void mc_dispatch_recv_packed_kernel(const mc_kargs_t &a, const int masking) {
  mc_trace_start(&a, MC_TK_DRECV); /* the kernel's start, before its first loads */
  const mc_drecv_pre_t pre = mc_drecv_prefetch(a);
  const uint64_t round = mc_drecv_round(a), call = mc_drecv_call(a);
  mc_dispatch_recv_packed_body(a, masking, round, call, pre);
  mc_pdl_wait();
}

/* A dropped round reported by the host: dispatch-sends launched after this
 * go out again (mc_gpu_host.c, drop_report). */
MC_DEV void mc_drop_ack(const mc_kargs_t &a) { mc_ws_u32(&a, mc_ws_scalars_off(&a.s))[MC_WS_DROP] = 0; }

/* ---- the count step (mc_dispatch_counts): one block, launched after the
 * send half on the caller's stream, which the host then synchronises. It
 * reads what dispatch-recv reads first and writes the rows and each local
 * expert's rows (its segment: pairs rounded up to expert_align) to host
 * memory, a2a->counts; it moves nothing on, so it may run again, unless
 * the round is over a declared capacity: then it drops it as dispatch-recv
 * would. A call refused on the device leaves nothing to count: -1 rows. ---- */
MC_DEV void mc_counts_kernel(const mc_kargs_t &a) {
  const mc_shape_t *s = &a.s;
  const int L = mc_num_local_experts(s), tid = threadIdx.x;
  const int masking = a.mask != NULL;
  const mc_drecv_pre_t pre = mc_drecv_prefetch(a);
  const uint64_t round = mc_drecv_round(a), call = mc_drecv_call(a);
  if (tid == 0) *a.rows_out = -1;
  extern __shared__ uint32_t smem[];
  const mc_packed_smem_t m = mc_packed_carve(smem, s);
  /* refused (counted by dispatch-recv, not here), a later call's outcome, or a timeout (recorded, the host
   * reports it) */
  if (mc_drecv_metas(a, masking, round, call, 1, 0, pre, m.seen, m.base, m.prefix, m.ecount)) return;
  int64_t over_rows = 0, over_limit = 0;
  const int over = mc_packed_plan(a, masking, m, &over_rows, &over_limit);
  if (over >= 0) {
    mc_packed_drop(a, masking, m, round, call, over, over_rows, over_limit);
    return;
  }
  for (int l = tid; l < L; l += blockDim.x) a.expert_count[l] = (int32_t)(m.loff[l + 1] - m.loff[l]);
  if (tid == 0) *a.rows_out = s->layout == MC_LAYOUT_EXPERT_SORTED ? (int64_t)m.loff[L] : (int64_t)m.prefix[s->world_size];
}

#endif
