/* mc_gpu_kernels.cuh - dispatch and combine on the GPU, written once for
 * both GPU transports: dispatch-send here (its prep in mc_gpu_prep.cuh),
 * dispatch-recv in mc_gpu_dispatch_recv.cuh and mc_gpu_packed.cuh, combine
 * in mc_gpu_combine.cuh; the entry points are the rows of mc_gpu_table.cuh,
 * which the transport's .cu includes. The including .cu file first
 * defines the device-side transport interface:
 *
 *   mc_t_put_signal_warp(a, dst_off, src, bytes, slot, value, op, pe)
 *       warp-collective: copy bytes from src (this rank's window or device
 *       memory) to offset dst_off of rank pe's window, then update pe's
 *       signal (slot, indexed by this rank) after the data (SET or ADD).
 *   mc_t_signal(a, slot, value, op, pe)       one thread: update a signal.
 *   mc_t_peer_window(a, pe)   rank pe's window as a pointer this GPU can store
 *       to directly (NVLink / same GPU), or NULL (reached only by puts).
 *
 * Where a peer is directly reachable the kernels store into its window and,
 * once per block, add what they stored to its signal with a release RMW (no
 * staging copy); elsewhere they stage and put (never on p2p, where every
 * peer is mapped). A meta stored directly needs no signal: each of its
 * words carries the round (mc_layout.h). Both ends of a pair must agree on
 * which way it goes, as mc_t_peer_window does (nvshmem_ptr is symmetric,
 * and the test switch that stages everything is set on every rank). Waits
 * use mc_dev_wait_ge and mc_dev_wait on this rank's own window. The
 * protocol is the cpu transport's, step for step (docs/protocol.md says it
 * in prose); the layout is src/core/mc_layout.h.
 * The copies are cut in pieces of MC_SEG_BYTES, a warp each, so that a
 * batch of 128 tokens keeps hundreds of warps busy instead of 128: a record
 * is a header piece and mc_token_segs payload pieces, a combine row
 * mc_row_segs pieces, and the signals count pieces.
 *
 * Launches (mc_gpu_launch.cuh): where a call's tokens fit one prep chunk,
 * dispatch-send is one kernel (prep in every block, then the pieces), a
 * kernel per common top-k. Each half is its own kernel: in one kernel per
 * phase, blocks waiting in the recv part slow the sending ones in some
 * rounds. Where a rank has its GPU alone, a receiving kernel is launched as
 * a programmatic dependent of the sending one before it (mc_pdl_*,
 * mc_dev.cuh): same order, less gap.
 *
 * Round i+1 cannot overwrite what a peer still reads from round i: a rank
 * sends records of round i+1 only after its combine-recv(i) saw every
 * rank's COMB_BAR(i), set once that rank's dispatch-recv(i) had read them,
 * and rows of round i+1 reach r only after r's meta(i+1), sent once r's
 * combine-recv(i) had read its rows (a meta goes without a release: that
 * holds because dispatch-send is never launched early, so r's reads ended
 * with combine-recv's kernel). Signals are running totals or carry the
 * round, as meta words do, so none is reset. The round number lives in device memory
 * (mc_ws_round_off), so a captured CUDA graph replays correctly. The whole
 * argument, staging and stream order included: docs/protocol.md, "Why
 * buffers can be reused without a reset".
 *
 * Determinism: record positions come from a scan in token order, slots
 * from (source rank, position); sums use __fadd_rn/__fmul_rn (no fma
 * contraction) in the documented order. Same bits as the cpu reference. */
#ifndef MC_GPU_KERNELS_CUH
#define MC_GPU_KERNELS_CUH

#include "mc_dtype.h"
#include "mc_route.h"
#include "mc_dev.cuh"
#include "mc_gpu_prep.cuh"
#include "mc_gpu_prep_tiny.cuh"
#include "mc_gpu_quant.cuh"
#include "mc_gpu_rows.cuh"

#define MC_THREADS 512

/* Blocks the one-launch dispatch kernel needs for a call of m tokens: a
 * warp for each payload piece (MC_QUANT_WARPS where it quantises) beside
 * block 0, which publishes the metas and stores none; at most grid. */
static inline __host__ __device__ int mc_one_blocks(const mc_shape_t *s, int m, int quant, int grid) {
  const int64_t warps = MC_THREADS / 32, per = quant ? MC_QUANT_WARPS : 1;
  const int64_t need = ((int64_t)m * mc_token_segs(s) * per + warps - 1) / warps + 1;
  return need > grid ? grid : (int)need;
}

/* Dynamic shared memory, beside the kernels that carve it (prep's:
 * mc_gpu_prep.cuh; dispatch-recv's: mc_gpu_dispatch_recv.cuh).
 * dispatch-send (chunked) and combine-send: sent[W], what this block stored into each rank. */
static inline size_t mc_send_smem_bytes(const mc_shape_t *s) { return sizeof(uint32_t) * (size_t)s->world_size; }

/* ---- dispatch-send, chunked path: pack payloads into staging (whole
 * grid), launched only when some peer is reached by puts ---- */
MC_DEV void mc_dispatch_pack(const mc_kargs_t &a) {
  const mc_shape_t *s = &a.s;
  const uint32_t *sc = mc_ws_u32(&a, mc_ws_scalars_off(s));
  if (sc[MC_WS_BAD]) return;
  mc_trace_start(&a, MC_TK_PACK);
  const int lane = threadIdx.x & 31;
  const int gw = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, nw = (gridDim.x * blockDim.x) >> 5;
  int begin, end;
  mc_send_chunk(s, (int)sc[MC_WS_M_EFF], mc_group_member(s, a.rank), &begin, &end);
  for (int t = begin + gw; t < end; t += nw) {
    unsigned char *rec = a.win + mc_disp_send_off(s, t - begin);
    if (a.quant) { /* the payload and scales made part by part from the bf16 row */
      for (int j = 0; j < mc_token_segs(s); j++) {
        const uint64_t po = (uint64_t)j * MC_SEG_BYTES;
        const uint32_t bytes = mc_token_seg_bytes(s, j);
        for (int qq = 0; qq < MC_QUANT_WARPS; qq++) {
          int4 v;
          uint32_t sc;
          mc_quant_part(a, t, j, bytes, qq, lane, &v, &sc);
          mc_quant_part_store(a, j, bytes, qq, lane, v, sc, rec + mc_record_payload_off(s) + po,
                              rec + mc_record_scale_off(s));
        }
      }
      continue;
    }
    mc_warp_copy16(rec + mc_record_payload_off(s), (const unsigned char *)a.tokens + (uint64_t)t * s->token_bytes,
                   s->token_bytes, lane);
    if (s->scale_bytes)
      mc_warp_copy4(rec + mc_record_scale_off(s), (const unsigned char *)a.scales + (uint64_t)t * s->scale_bytes,
                    s->scale_bytes, lane);
  }
  mc_trace_end(&a, MC_TK_PACK);
}

/* One thread: SET peer p's signal (slot, from this rank) to v, by a store
 * where its window is mapped, else by the transport's put. */
MC_DEV void mc_signal_set(const mc_kargs_t &a, int p, int slot, uint64_t v) {
  unsigned char *peer = mc_t_peer_window(&a, p);
  if (peer) mc_sig_set(&a, (uint64_t *)(peer + mc_sig_off(&a.s, slot, a.rank)), v);
  else mc_t_signal(&a, slot, v, MC_SIG_SET, p);
}

/* End of a send part: after every warp of the block stored its share, one
 * release per directly reachable rank this block sent to, adding what it
 * stored (record or row pieces) to that rank's running total. A signal per
 * block, not per piece: each release waits for the stores before it, and
 * the receivers wait for a source's whole total before reading any of it.
 * The release orders the other warps' stores too: they happen before it
 * through bar.sync, and release is cumulative. (A fence.sc before the
 * release would order nothing more and cost a wait of its own.) */
MC_DEV void mc_block_signal_counts(const mc_kargs_t &a, uint32_t *count, int slot) {
  __syncthreads();
  for (int p = threadIdx.x; p < a.s.world_size; p += blockDim.x)
    if (count[p]) mc_sig_add(&a, (uint64_t *)(mc_t_peer_window(&a, p) + mc_sig_off(&a.s, slot, a.rank)), count[p]);
}

/* The receiving kernels' state from round to round (running totals, the
 * round and call counts): every block reads it at its start, one warp
 * moves it on. A block that has read it (the values used: in shared memory
 * or in registers before a block barrier) arrives at its kernel's word
 * (which: MC_WS_ARRIVED_DRECV, _CRECV) with a release; the grid's last
 * warp waits there until every block has (mc_recv_all_arrived), then
 * writes the state for the next round. No block counts at a kernel's end:
 * that count (a barrier, an atomic's round trip, then the last block's
 * stores) came after each block's work, on the kernel's last path. */
MC_DEV void mc_recv_arrive(const mc_kargs_t &a, int which) {
  if (threadIdx.x == 0) mc_red_release_gpu_add_u64(mc_ws_scalar64(&a, which), 1);
}
/* One thread: wait until every block of the grid has arrived (a wait on
 * this kernel's own blocks, which arrive whatever fails elsewhere; the
 * waiting warp's block is the grid's last, dispatched after the others),
 * then set the word back to 0 for the next launch. 1 on a timeout
 * (recorded; mc_mask_kernel sets the word back). */
MC_DEV int mc_recv_all_arrived(const mc_kargs_t &a, int which, int phase, uint64_t round) {
  uint64_t *arrived = mc_ws_scalar64(&a, which), got;
  if (mc_dev_wait(&a, arrived, gridDim.x, 0, phase, a.rank, -1, round, &got, NULL, true)) return 1;
  *arrived = 0;
  return 0;
}

/* One launch: token t's header, lane k < K holding its k-th target (id,
 * the prep's position among this rank's records to that expert, weight)
 * and its place among the targets in ascending id (the ids are distinct). */
MC_DEV mc_target_t mc_header_target(const mc_kargs_t &a, const int K, const mc_route_tab_t &tab, const int t,
                                    const int tt, int *at) {
  const int lane = threadIdx.x & 31;
  mc_target_t tg = {0, 0, 0.0f};
  if (lane < K) {
    const int64_t i = (int64_t)t * K + lane;
    tg.expert = a.ids64 ? (int32_t)((const int64_t *)a.indices)[i] : ((const int32_t *)a.indices)[i];
    tg.weight = a.weights ? a.weights[i] : 1.0f;
    tg.pos = (int32_t)tab.tpos[(int64_t)tt * K + lane];
  }
  int n = 0;
  for (int j = 0; j < K; j++) n += __shfl_sync(0xffffffffu, tg.expert, j) < tg.expert;
  *at = n;
  return tg;
}

/* ---- dispatch-send: the records, a warp per (token, payload piece), or
 * MC_QUANT_WARPS where it quantises (mc_gpu_quant.cuh) ----
 * Piece j of token t is its payload bytes [j, j + 1) x MC_SEG_BYTES (the
 * last piece also the scales), loaded once and stored into the record slot
 * of every directly reachable destination. A destination reached only by
 * puts (chunked path) gets the whole staged record from the warp of piece
 * 0, adding all its pieces at once. Headers: the warp of piece 0 stores
 * them too, built from the prep's positions (one launch, hdr_staged 0:
 * lane k the k-th target, mc_header_target) or copied from staging
 * (chunked, 1). Blocks b0 to nb - 1 take part (the one-launch
 * kernel leaves out block 0, which publishes the round's metas first: its
 * share of pieces went out last). Each block counts the pieces it stored
 * per destination in sent[] for mc_block_signal_counts. */
MC_DEV void mc_dispatch_send_pieces(const mc_kargs_t &a, const int K, const int quant, const mc_route_tab_t &tab,
                                    const int begin, const int end, const int hdr_staged, const int b0, const int nb,
                                    uint32_t *sent) {
  const mc_shape_t *s = &a.s;
  const int S = mc_token_segs(s), lane = threadIdx.x & 31;
  if ((int)blockIdx.x < b0) return;
  const int gw = ((blockIdx.x - b0) * blockDim.x + threadIdx.x) >> 5, nw = ((nb - b0) * blockDim.x) >> 5;
  const uint64_t rec_bytes = mc_record_bytes(s), hdr = mc_header_bytes(s);
  const uint64_t poff = mc_record_payload_off(s), soff = mc_record_scale_off(s);
  /* quantising, MC_QUANT_WARPS neighbouring warps a piece, all in one
   * block (a block's warps are a multiple of them, as is nw): the first
   * (qq 0) counts the piece, and the block's signal follows all four */
  const int per = quant ? MC_QUANT_WARPS : 1;
  for (int it = gw; it < (end - begin) * S * per; it += nw) {
    const int pc = it / per, qq = it % per, tt = mc_fdiv(pc, s->div_tsegs), j = pc - tt * S, t = begin + tt;
    const unsigned char *rec = a.win + mc_disp_send_off(s, tt); /* staging (chunked path) */
    const uint64_t po = (uint64_t)j * MC_SEG_BYTES;
    const uint32_t bytes = mc_token_seg_bytes(s, j);
    int4 v[4]; /* the piece (quantising: v[0] the part), loaded or made once for every destination,
                  before the table is read */
    uint32_t qsc = 0; /* quantising: the scale of the part's block */
    if (quant) mc_quant_part(a, t, j, bytes, qq, lane, &v[0], &qsc);
    else mc_warp_piece_load(v, (const unsigned char *)a.tokens + (uint64_t)t * s->token_bytes + po, bytes, lane);
    /* the last piece's warp: the scales' first pass loaded with the piece */
    const bool with_scales = !quant && j == S - 1 && s->scale_bytes;
    const unsigned char *scales = (const unsigned char *)a.scales + (uint64_t)t * s->scale_bytes;
    int sv[4];
    if (with_scales) mc_warp_scales_first(sv, scales, s->scale_bytes, lane);
    const int first = qq == 0 && j == 0; /* the warp that brings the header */
    int at = 0; /* one launch, piece 0: this lane's target of the header */
    const mc_target_t tg = !hdr_staged && first ? mc_header_target(a, K, tab, t, tt, &at) : mc_target_t{0, 0, 0.0f};
    if (!hdr_staged && first && lane == 0) mc_trace_after(&a, MC_TK_DSEND, 3, (uint32_t)at);
    const int nd = tab.ndest[t];
    /* one destination at a time: a table of destination pointers, indexed
     * by a running count, lived in local memory (a load per store) */
    for (int q = 0; q < nd; q++) {
      const int d = tab.dests[(int64_t)t * K + q];
      const uint64_t off = mc_disp_recv_off(s, a.rank, (int)tab.ridx[(int64_t)tt * K + q]);
      unsigned char *peer = mc_t_peer_window(&a, d);
      if (!peer) {
        if (first) mc_t_put_signal_warp(&a, off, rec, rec_bytes, MC_SIG_DISP_RECS, mc_record_pieces(s), MC_SIG_ADD, d);
        continue;
      }
      if (lane == 0 && qq == 0) atomicAdd(&sent[d], j == 0 ? 2u : 1u); /* piece 0 brings the header too */
      unsigned char *dst = peer + off;
      if (hdr_staged && first) mc_warp_piece16_to(&dst, 1, 0, rec, (uint32_t)hdr, lane);
      if (!hdr_staged && first) {
        mc_record_header_t *h = (mc_record_header_t *)dst;
        if (lane < K) h->targets[at] = tg;
        if (lane == 0) h->token = t, h->n_targets = K;
      }
      if (quant) {
        mc_quant_part_store(a, j, bytes, qq, lane, v[0], qsc, dst + poff + po, dst + soff);
        continue;
      }
      mc_warp_piece_store(&dst, 1, poff + po, v, bytes, lane);
      if (with_scales) mc_warp_piece4_to(&dst, 1, soff, scales, s->scale_bytes, lane, sv);
    }
    if (lane == 0) mc_trace_after(&a, MC_TK_DSEND, 4, (uint32_t)v[0].x); /* the piece's stores issued */
  }
}

/* ---- dispatch-send, chunked path: after the prep kernel(s) ---- */
MC_DEV void mc_dispatch_send_body(const mc_kargs_t &a, const int masking, const int quant) {
  const mc_shape_t *s = &a.s;
  mc_pdl_launch_dependents();
  const uint32_t *sc = mc_ws_u32(&a, mc_ws_scalars_off(s));
  if (sc[MC_WS_BAD]) return;
  mc_trace_start(&a, MC_TK_DSEND);
  extern __shared__ uint32_t sent[];
  const int W = s->world_size, lane = threadIdx.x & 31;
  for (int p = threadIdx.x; p < W; p += blockDim.x) sent[p] = 0;
  __syncthreads();
  const uint64_t round = *mc_ws_round(&a);
  int begin, end;
  mc_send_chunk(s, (int)sc[MC_WS_M_EFF], mc_group_member(s, a.rank), &begin, &end);
  mc_dispatch_send_pieces(a, s->topk, quant, mc_tab_global(a), begin, end, 1, 0, gridDim.x, sent);
  /* metas to every rank (zero records included), one warp per rank, from
   * the end of the grid: word by word where stored directly (each word
   * carries the round: no signal), else put and signalled */
  const int gw = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, nw = (gridDim.x * blockDim.x) >> 5;
  for (int d = nw - 1 - gw; d < W; d += nw) {
    if (mc_masked(masking, &a, d)) continue;
    unsigned char *peer = mc_t_peer_window(&a, d);
    const uint64_t *meta = (const uint64_t *)(a.win + mc_meta_send_off(s, d));
    if (peer) {
      for (int w = lane; w < mc_meta_words(s); w += 32)
        mc_word_store(&a, (uint64_t *)(peer + mc_disp_meta_off(s, a.rank)) + w, meta[w]);
    } else {
      mc_t_put_signal_warp(&a, mc_disp_meta_off(s, a.rank), meta, mc_meta_bytes(s), MC_SIG_DISP_META, round,
                           MC_SIG_SET, d);
    }
  }
  mc_block_signal_counts(a, sent, MC_SIG_DISP_RECS);
  mc_trace_end(&a, MC_TK_DSEND);
}

/* ---- dispatch-send in one launch, where the group's tokens fit one prep
 * chunk and every peer is reachable: the blocks the call's tokens need
 * prep (mc_gpu_prep.cuh), then store their pieces; the last of them out
 * counts the call and, if it was accepted, writes the round number (every
 * block has read the old one by then). The grid is sized for the most
 * tokens a call may pass (bound_m gives the count on the device); blocks
 * past what this call needs leave at once, so that the receiving kernel's
 * blocks, which cannot share an SM with one of these (registers), find
 * their SMs free. ---- */
MC_DEV void mc_dispatch_send_one_body(const mc_kargs_t &a, const int K, const int quant) {
  const mc_shape_t *s = &a.s;
  const uint64_t round = *mc_ws_round(&a) + 1;
  const int m = mc_call_m(a);
  /* a count out of range: every block, to refuse it in the prep */
  const int nb = m < 0 || m > a.m ? (int)gridDim.x : mc_one_blocks(s, m, quant, gridDim.x);
  if ((int)blockIdx.x >= nb) return;
  /* no rank masked (mc_gpu_launch.cuh); a decode call of a group of one rank
   * into the batched layout: the one-warp prep */
  const int m_eff = s->group_size == 1 && !mc_packed_layout(s) && m >= 0 && m <= a.m && m * K <= 32
                        ? mc_prep_tiny(a, K, round, m)
                        : mc_dispatch_prep_body(a, 0, K, MC_PREP_ONE, round, m);
  if (m_eff >= 0) { /* else refused: every block saw it, block 0 recorded it */
    extern __shared__ uint32_t smem[];
    int begin, end;
    mc_send_chunk(s, m_eff, mc_group_member(s, a.rank), &begin, &end);
    mc_trace_start(&a, MC_TK_DSEND);
    if (blockIdx.x != 0 || nb == 1) mc_trace_point(&a, MC_TK_DSEND, 2);
    uint32_t *sent = mc_one_sent(smem, s);
    mc_dispatch_send_pieces(a, K, quant, mc_tab_shared(smem, s), begin, end, 0, nb > 1, nb, sent);
    if (a.trace) __syncthreads(); /* the stores, apart from the signals (uniform: a.trace is one value) */
    mc_trace_point(&a, MC_TK_DSEND, 0);
    mc_block_signal_counts(a, sent, MC_SIG_DISP_RECS);
    mc_trace_end(&a, MC_TK_DSEND);
  }
  if (threadIdx.x == 0) { /* the call is counted, refused or not; only an accepted one moves the round */
    uint32_t *sc = mc_ws_u32(&a, mc_ws_scalars_off(s));
    if (atomicAdd(&sc[MC_WS_DONE_DSEND], 1u) == (unsigned)nb - 1) {
      sc[MC_WS_DONE_DSEND] = 0;
      *mc_ws_scalar64(&a, MC_WS_SEND_TRIES) += 1;
      if (m_eff >= 0) *mc_ws_round(&a) = round;
      mc_trace_point(&a, MC_TK_DSEND, 1);
    }
  }
}
/* ---- the launch floor (mc_a2a_bench_floor): a phase's sending and
 * receiving kernels with no work, launched as the phase's are (the same
 * argument block); the receiving one waits for its sender at its end, as
 * the phase's receivers do ---- */

/* ---- mc_a2a_mask_ranks: the cpu transport's two steps in one block,
 * after every kernel of the broken round has ended; the new mask is in the
 * workspace already. The rules: docs/protocol.md, "Going on without a
 * rank". ---- */
/* What peer p holds (its last round, barrier count and running totals),
 * once it has made step 1 of the pair's attempt. */
MC_DEV void mc_mask_take_in(const mc_kargs_t *a, int p, unsigned long long *round, unsigned int *barriers) {
  uint64_t *seen = (uint64_t *)(a->ws + mc_ws_seen_off(&a->s));
  const int W = a->s.world_size;
  atomicMax(round, (unsigned long long)mc_sig_load(a, mc_sig_local(a, MC_SIG_RESYNC_ROUND, p)));
  seen[MC_SIG_DISP_RECS * W + p] = mc_sig_load(a, mc_sig_local(a, MC_SIG_DISP_RECS, p));
  seen[MC_SIG_COMB_ROWS * W + p] = mc_sig_load(a, mc_sig_local(a, MC_SIG_COMB_ROWS, p));
  atomicMax(barriers, (unsigned int)mc_sig_load(a, mc_sig_local(a, MC_SIG_BARRIER, p)));
}

/* Waits for peer p's step k of the pair's attempt, following the peer to a
 * later attempt where it called again; in step 2 what a peer that called
 * again holds is taken in again, once its step 2 has come (the acquire
 * that makes it visible). 1 on a timeout. */
MC_DEV int mc_mask_wait(const mc_kargs_t *a, uint64_t *calls, int p, int k, unsigned long long *round,
                        unsigned int *barriers) {
  const uint64_t *sig = mc_sig_local(a, MC_SIG_RESYNC, p);
  uint64_t target = 4 * calls[p] + k;
  int joined = 0;
  for (;;) {
    if (mc_dev_wait_ge(a, sig, target, MC_PHASE_MASK, p, MC_SIG_RESYNC, *round)) return 1;
    const uint64_t v = mc_sig_load(a, sig), b = v / 4;
    if (mc_resync_done(v, calls[p], k)) {
      if (joined && b == calls[p]) mc_mask_take_in(a, p, round, barriers);
      return 0;
    }
    if (v % 4 == 0) { /* it gave up on a call: wait for its next one */
      target = 4 * b + 1;
      continue;
    }
    calls[p] = b; /* it called again: join */
    joined = k == 2;
    mc_signal_set(*a, p, MC_SIG_RESYNC, 4 * b + k);
    target = 4 * b + k;
  }
}

/* Step k with every kept peer, a thread each, until one look finds it
 * done with all of them: a peer it was done with may have moved on since
 * (given up on the call after this rank saw its step, then called again),
 * and what was seen of it would be stale (the cpu transport's
 * mc_cpu_wait_each reads every peer again in each pass for the same
 * reason). 1 on a timeout. Every thread of the block calls it. */
MC_DEV int mc_mask_step(const mc_kargs_t *a, uint64_t *calls, int k, unsigned long long *round,
                        unsigned int *barriers) {
  const int W = a->s.world_size;
  for (;;) {
    int failed = 0, moved = 0;
    for (int p = threadIdx.x; p < W; p += blockDim.x)
      if (!mc_masked(1, a, p) && mc_mask_wait(a, calls, p, k, round, barriers)) failed = 1;
    if (__syncthreads_or(failed)) return 1;
    for (int p = threadIdx.x; p < W; p += blockDim.x)
      if (!mc_masked(1, a, p) && !mc_resync_done(mc_sig_load(a, mc_sig_local(a, MC_SIG_RESYNC, p)), calls[p], k))
        moved = 1;
    if (!__syncthreads_or(moved)) return 0;
  }
}

/* A failed call: the next one with each kept peer skips a number, left in
 * the peer's slot with step 0 ("gave up"). */
MC_DEV void mc_mask_used_up(const mc_kargs_t *a, uint64_t *calls) {
  for (int p = threadIdx.x; p < a->s.world_size; p += blockDim.x)
    if (!mc_masked(1, a, p)) mc_signal_set(*a, p, MC_SIG_RESYNC, 4 * ++calls[p]);
}

MC_DEV void mc_mask_kernel(mc_kargs_t a) {
  const mc_shape_t *s = &a.s;
  const int W = s->world_size, tid = threadIdx.x;
  uint64_t *calls = (uint64_t *)(a.ws + mc_ws_mask_calls_off(s));
  uint64_t *drecv_round = mc_ws_scalar64(&a, MC_WS_DRECV_ROUND);
  uint32_t *sc = mc_ws_u32(&a, mc_ws_scalars_off(s));
  __shared__ unsigned long long round;
  __shared__ unsigned int barriers;
  if (tid == 0) {
    round = max(*mc_ws_round(&a), *drecv_round); /* dispatch-recv's may lag dispatch-send's in a broken round */
    barriers = sc[MC_WS_BARRIERS];
  }
  __syncthreads();
  for (int p = tid; p < W; p += blockDim.x)
    if (!mc_masked(1, &a, p)) {
      /* the pair's attempt: after this rank's last, or the peer's if later
       * (docs/protocol.md says why) */
      const uint64_t peers = mc_sig_load(&a, mc_sig_local(&a, MC_SIG_RESYNC, p)) / 4;
      calls[p] = max(calls[p] + 1, peers);
      /* this rank's barrier count, again: a barrier that timed out counted
       * on the ranks that called it only; every kept rank takes the largest
       * below (one count for all peers here, where the cpu transport keeps
       * one a peer), so their next barriers carry the same number */
      mc_signal_set(a, p, MC_SIG_BARRIER, barriers);
      mc_signal_set(a, p, MC_SIG_RESYNC_ROUND, round); /* release order: seen before the step */
      mc_signal_set(a, p, MC_SIG_RESYNC, 4 * calls[p] + 1);
    }
  if (mc_mask_step(&a, calls, 1, &round, &barriers)) {
    mc_mask_used_up(&a, calls);
    return;
  }
  /* nobody kept sends any more: take in what the broken round left */
  for (int p = tid; p < W; p += blockDim.x)
    if (!mc_masked(1, &a, p)) mc_mask_take_in(&a, p, &round, &barriers);
  __syncthreads();
  for (int p = tid; p < W; p += blockDim.x)
    if (!mc_masked(1, &a, p)) mc_signal_set(a, p, MC_SIG_RESYNC, 4 * calls[p] + 2);
  if (mc_mask_step(&a, calls, 2, &round, &barriers)) mc_mask_used_up(&a, calls);
  if (tid == 0) {
    *mc_ws_round(&a) = round;
    sc[MC_WS_BARRIERS] = barriers;
    *drecv_round = round;
    *mc_ws_scalar64(&a, MC_WS_DRECV_TRIES) = *mc_ws_scalar64(&a, MC_WS_SEND_TRIES);
    /* counts a broken round may have left part way: a block that failed
     * left before it counted, or a wait for the arrivals timed out before
     * setting them back */
    *mc_ws_scalar64(&a, MC_WS_ARRIVED_DRECV) = 0;
    *mc_ws_scalar64(&a, MC_WS_ARRIVED_CRECV) = 0;
    sc[MC_WS_DONE_DRECV] = sc[MC_WS_DONE_PREP] = sc[MC_WS_DONE_DSEND] = 0;
    sc[MC_WS_BAD] = 0;
    sc[MC_WS_DROP] = 0; /* a drop not yet reported stays recorded for the host (mc_gpu_host.c) */
  }
}

/* ---- mc_a2a_barrier: one block; every rank SETs its count into every
 * peer's slot, then waits for every peer's. Counts only grow, so a SET of
 * call n+1 cannot be confused with call n's. ---- */
MC_DEV void mc_barrier_kernel(mc_kargs_t a) {
  const mc_shape_t *s = &a.s;
  uint32_t *sc = mc_ws_u32(&a, mc_ws_scalars_off(s));
  const uint64_t n = (uint64_t)sc[MC_WS_BARRIERS] + 1;
  __syncthreads(); /* every thread has read the count before it moves on */
  if (threadIdx.x == 0) sc[MC_WS_BARRIERS] = (uint32_t)n;
  for (int p = threadIdx.x; p < s->world_size; p += blockDim.x)
    if (!(a.mask && a.mask[p])) mc_signal_set(a, p, MC_SIG_BARRIER, n);
  for (int p = threadIdx.x; p < s->world_size; p += blockDim.x)
    if (!(a.mask && a.mask[p]) &&
        mc_dev_wait_ge(&a, mc_sig_local(&a, MC_SIG_BARRIER, p), n, MC_PHASE_BARRIER, p, MC_SIG_BARRIER, n))
      return;
}


#endif
