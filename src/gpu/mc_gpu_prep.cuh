/* mc_gpu_prep.cuh - dispatch-send's first kernel: checks, routes and record
 * positions, one block. Part of mc_gpu_kernels.cuh (static: compiled into
 * each GPU transport). */
#ifndef MC_GPU_PREP_CUH
#define MC_GPU_PREP_CUH

#include "../mc_route.h"
#include "mc_gpu_rows.cuh"

/* ---- dispatch-send, part 1: check, route, positions ----
 * The prep kernel's scan: one block per chunk of (scanning warps) x 32
 * tokens, MC_PREP_THREADS threads, warps of 32 tokens each, per-warp lane
 * masks per expert and per destination rank in shared memory. MC_PREP_SMEM
 * caps the masks, so many experts mean fewer scanning warps (smaller
 * chunks, never below MC_PREP_MIN_CHUNK), never a failed launch. */
#define MC_PREP_THREADS 256 /* up to 255 registers: the per-k state of MC_MAX_TOPK stays in them */
#define MC_PREP_SMEM (40u << 10)
static inline __host__ __device__ int mc_prep_warps(const mc_shape_t *s) {
  const size_t cols = (size_t)s->num_experts + (size_t)s->world_size;
  const size_t fixed = sizeof(uint32_t) * (cols + (size_t)s->world_size); /* running counts, expected rows */
  size_t w = fixed < MC_PREP_SMEM ? (MC_PREP_SMEM - fixed) / (sizeof(uint32_t) * cols) : 1;
  if (w > MC_PREP_THREADS / 32) w = MC_PREP_THREADS / 32;
  return w < 1 ? 1 : (int)w;
}
/* Tokens per prep block: its scanning warps x 32 (>= MC_PREP_MIN_CHUNK). */
static inline __host__ __device__ int mc_prep_chunk(const mc_shape_t *s) { return mc_prep_warps(s) * 32; }
/* Dynamic shared memory of the two kernels that carve it, beside the carving:
 * prep: count[E + W], rexp[W], mask[warps][E + W] (more than the default
 * 48 KB only near the limits of 4096 experts and 1024 ranks: the host then
 * raises the kernel's limit). */
static inline size_t mc_prep_smem_bytes(const mc_shape_t *s) {
  const size_t cols = (size_t)s->num_experts + (size_t)s->world_size;
  return sizeof(uint32_t) * (cols + (size_t)s->world_size + cols * (size_t)mc_prep_warps(s));
}

/* Several prep blocks: each stores its chunk's counts (smem holds them as
 * one row of pcount: experts, ranks, rows expected back) and its verdict;
 * the last block to arrive turns every column into each chunk's base (a
 * scan over chunks) and leaves the totals in smem and the round's verdict
 * in *bad. Returns 1 in the last block only. (One block alone skips this
 * and keeps its counts in shared memory.) */
MC_DEV int mc_prep_scan_chunks(const mc_kargs_t &a, uint32_t *smem, const int cols, int *bad) {
  const int tid = threadIdx.x;
  uint32_t *sc = mc_ws_u32(&a, mc_ws_scalars_off(&a.s));
  uint32_t *pcount = mc_ws_u32(&a, mc_ws_pcount_off(&a.s));
  __shared__ int last;
  for (int i = tid; i < cols; i += blockDim.x) pcount[(size_t)blockIdx.x * cols + i] = smem[i];
  __syncthreads();
  if (tid == 0) {
    if (*bad) atomicOr(&sc[MC_WS_PREP_BAD], 1u);
    __threadfence(); /* our counts and verdict before our arrival */
    const unsigned int arrived = atomicAdd(&sc[MC_WS_DONE_PREP], 1u);
    __threadfence(); /* and the earlier arrivals' counts after it (the barrier below passes them on) */
    last = arrived == gridDim.x - 1;
  }
  __syncthreads();
  if (!last) return 0;
  __threadfence(); /* every block's counts, seen through the arrivals, before ours reads them */
  for (int c = tid; c < cols; c += blockDim.x) {
    uint32_t run = 0;
    for (int q0 = 0; q0 < (int)gridDim.x; q0 += 16) { /* 16 loads in flight, then the stores */
      uint32_t n[16];
#pragma unroll
      for (int j = 0; j < 16; j++) n[j] = q0 + j < (int)gridDim.x ? __ldcg(&pcount[(size_t)(q0 + j) * cols + c]) : 0;
#pragma unroll
      for (int j = 0; j < 16; j++)
        if (q0 + j < (int)gridDim.x) pcount[(size_t)(q0 + j) * cols + c] = run, run += n[j];
    }
    smem[c] = run; /* totals over the chunks */
  }
  __syncthreads(); /* every thread read *bad (shared) above before tid 0 rewrites it */
  if (tid == 0) {
    *bad = (int)*(volatile uint32_t *)&sc[MC_WS_PREP_BAD];
    sc[MC_WS_PREP_BAD] = 0;
    sc[MC_WS_DONE_PREP] = 0; /* for the next round */
  }
  __syncthreads();
  return 1;
}

/* Registered expert buffers (mc_gpu_zc.cuh): this rank's records per
 * global expert, into every rank's zc_cnt, then a round-tagged SET. Here,
 * in the prep kernel's last block, so that the send kernels that wait for
 * them never wait on a block of their own grid. */
MC_DEV void mc_zc_send_counts(const mc_kargs_t &a, const uint32_t *count, uint64_t round) {
  const mc_shape_t *s = &a.s;
  const int E = s->num_experts, W = s->world_size;
  for (int i = threadIdx.x; i < W * E; i += blockDim.x)
    ((uint32_t *)(mc_t_peer_window(&a, i / E) + mc_zc_cnt_off(s, round, a.rank)))[i % E] = count[i % E];
  __syncthreads();
  for (int p = threadIdx.x; p < W; p += blockDim.x) {
    mc_fence_peers(&a); /* the other threads' count stores, ordered by the barrier, before the signal */
    mc_sig_set(&a, (uint64_t *)(mc_t_peer_window(&a, p) + mc_sig_off(s, MC_SIG_ZC_CNT, a.rank)), round);
  }
}

/* Checks every valid token's top-k before anything is sent: a bad round
 * sets MC_WS_BAD and the send kernel then sends nothing. Computes every
 * token's destination ranks and the rows expected back (all members of a
 * group need them for combine); for this rank's chunk, gives each record
 * its position per expert and its index per destination rank in token
 * order (the order makes the slots deterministic), writes the record
 * headers into staging, and the metas.
 * One block per chunk of (scanning warps x 32) tokens, lane t owning token
 * t: it loads its ids and weights once, checks and routes them, and ORs its
 * bit into its warp's mask of each of its experts and ranks; its place
 * among the warp's tokens is then a popcount of the lower lanes, and one
 * thread per column (expert or rank) turns the warps' counts into bases
 * within the chunk. No serial walk over tokens (one warp walking them took
 * 20-30 us: perf-notes). Each block stores its chunk's column counts; the
 * last block to finish turns them into every chunk's bases (a scan over
 * chunks per column) and publishes totals, metas and the round; where
 * there is more than one chunk, mc_k_dispatch_prep_fix then adds each
 * chunk's bases to its tokens' positions. (One block walking the chunks
 * took 10 us each: 166 us at 4096 tokens, perf-notes 15.)
 * Headers, routes and row counts are written even when a later token turns
 * out bad: nothing reads them before the next accepted round rewrites them,
 * and the refused round leaves round number, metas and stats alone.
 * chunks: the prep blocks of the round, one per chunk; 1 in the fused
 * kernel (mc_gpu_fused.cuh), where whichever block started first preps. */
MC_DEV void mc_dispatch_prep_body(const mc_kargs_t &a, const int K, const int chunks) {
  const mc_shape_t *s = &a.s;
  const int W = s->world_size, L = mc_num_local_experts(s), E = s->num_experts, C = E + W;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, NW = mc_prep_warps(s);
  uint32_t *sc = mc_ws_u32(&a, mc_ws_scalars_off(s));
  extern __shared__ uint32_t smem[];
  uint32_t *count = smem, *rexp = smem + C, *mask = smem + C + W; /* count: experts then ranks */
  __shared__ int bad;
  mc_trace_start(&a, MC_TK_PREP);
  if (tid == 0) bad = 0;
  for (int i = tid; i < C + W; i += blockDim.x) smem[i] = 0;
  const int m_eff = a.bound_m ? *a.bound_m : a.m;
  /* the round number moves on only once the input is accepted: a refused
   * round leaves this rank exactly as it was */
  const uint64_t round = *mc_ws_round(&a) + 1;
  if (m_eff < 0 || m_eff > a.m) {
    if (tid == 0) {
      mc_dev_fail(a.err, MC_DEVERR_BAD_BOUND, MC_PHASE_DSEND, a.rank, -1, -1, -1, -1, m_eff, (uint64_t)a.m, 0, round);
      sc[MC_WS_BAD] = 1;
    }
    return;
  }
  int begin, end;
  mc_send_chunk(s, m_eff, a.rank % s->group_size, &begin, &end);
  uint16_t *dests = (uint16_t *)(a.ws + mc_ws_dests_off(s)), *n_dests = (uint16_t *)(a.ws + mc_ws_ndests_off(s));
  uint32_t *ridx = mc_ws_u32(&a, mc_ws_ridx_off(s));
  uint32_t *wm = mask + (size_t)warp * C; /* this warp's masks (warps < NW) */
  const int base = (chunks > 1 ? (int)blockIdx.x : 0) * mc_prep_chunk(s); /* this block's chunk (one: any block) */
  if (base < m_eff) {
    for (int i = tid; i < NW * C; i += blockDim.x) mask[i] = 0;
    __syncthreads(); /* the masks (and, first time, the counts) are zero */
    const int t = base + warp * 32 + lane;
    const bool mine = warp < NW && t < m_eff;
    /* Per k, in registers (loops unrolled to MC_MAX_TOPK, guarded by K: no
     * dynamically indexed arrays, which would live in local memory and make
     * every step a dependent load): expert id, weight, destination rank,
     * whether k is the first of its rank (bit k of first), and that rank's
     * index among the token's distinct ranks, ascending (jpos). */
    int32_t idx[MC_MAX_TOPK], rk[MC_MAX_TOPK], jpos[MC_MAX_TOPK];
    float wt[MC_MAX_TOPK];
    uint32_t pe[MC_MAX_TOPK], pr[MC_MAX_TOPK], first = 0;
    bool scan = false; /* a valid token of this rank's chunk */
    if (mine) {
#pragma unroll
      for (int k = 0; k < MC_MAX_TOPK; k++)
        if (k < K) idx[k] = a.indices[(int64_t)t * K + k], wt[k] = a.weights ? a.weights[(int64_t)t * K + k] : 1.0f;
      int bad_k = -1, why = MC_ROUTE_OK; /* the first bad k, as mc_route_check reports it */
#pragma unroll
      for (int k = 0; k < MC_MAX_TOPK; k++) {
        if (k >= K || bad_k >= 0) continue;
        if (idx[k] < 0 || idx[k] >= E) bad_k = k, why = MC_ROUTE_OUT_OF_RANGE;
#pragma unroll
        for (int j = 0; j < k; j++)
          if (bad_k < 0 && idx[j] == idx[k]) bad_k = k, why = MC_ROUTE_DUPLICATE;
      }
      if (bad_k >= 0) {
        int v = 0;
#pragma unroll
        for (int k = 0; k < MC_MAX_TOPK; k++)
          if (k == bad_k) v = idx[k];
        mc_dev_fail(a.err, why == MC_ROUTE_OUT_OF_RANGE ? MC_DEVERR_BAD_EXPERT : MC_DEVERR_DUP_EXPERT,
                    MC_PHASE_DSEND, a.rank, -1, -1, t, bad_k, v, 0, 0, round);
        bad = 1;
      } else {
#pragma unroll
        for (int k = 0; k < MC_MAX_TOPK; k++) {
          rk[k] = k < K ? idx[k] / L : 0;
          bool f = k < K;
#pragma unroll
          for (int j = 0; j < k; j++) f = f && rk[j] != rk[k];
          first |= (uint32_t)f << k;
        }
        int nd = 0;
#pragma unroll
        for (int k = 0; k < MC_MAX_TOPK; k++) {
          jpos[k] = 0;
#pragma unroll
          for (int j = 0; j < MC_MAX_TOPK; j++) jpos[k] += (first >> j & 1u) && rk[j] < rk[k];
          nd += first >> k & 1u;
        }
        n_dests[t] = (uint16_t)nd;
#pragma unroll
        for (int k = 0; k < MC_MAX_TOPK; k++)
          if (first >> k & 1u) {
            dests[(int64_t)t * K + jpos[k]] = (uint16_t)rk[k];
            atomicAdd(&rexp[rk[k]], 1u);
          }
        scan = t >= begin && t < end;
      }
    }
    if (scan) {
#pragma unroll
      for (int k = 0; k < MC_MAX_TOPK; k++) {
        if (k < K) atomicOr(&wm[idx[k]], 1u << lane);
        if (first >> k & 1u) atomicOr(&wm[E + rk[k]], 1u << lane);
      }
    }
    __syncwarp();
    const uint32_t lt = mc_lanemask_lt();
    if (scan) { /* place among this warp's tokens */
#pragma unroll
      for (int k = 0; k < MC_MAX_TOPK; k++) {
        if (k < K) pe[k] = __popc(wm[idx[k]] & lt);
        if (first >> k & 1u) pr[k] = __popc(wm[E + rk[k]] & lt);
      }
    }
    __syncthreads();
    /* per column, warp by warp: mask -> base of that warp's tokens */
    for (int c = tid; c < C; c += blockDim.x) {
      uint32_t run = count[c];
      for (int w = 0; w < NW; w++) {
        const uint32_t n = __popc(mask[(size_t)w * C + c]);
        mask[(size_t)w * C + c] = run;
        run += n;
      }
      count[c] = run;
    }
    __syncthreads();
    if (scan) {
      mc_record_header_t *h = (mc_record_header_t *)(a.win + mc_disp_send_off(s, t - begin));
      h->token = t;
      h->n_targets = K;
#pragma unroll
      for (int k = 0; k < MC_MAX_TOPK; k++) {
        if (k >= K) continue;
        int at = 0; /* ascending expert id: the ids are distinct */
#pragma unroll
        for (int j = 0; j < MC_MAX_TOPK; j++) at += j < K && idx[j] < idx[k];
        h->targets[at] = mc_target_t{idx[k], (int32_t)(wm[idx[k]] + pe[k]), wt[k]};
        if (first >> k & 1u) ridx[(int64_t)(t - begin) * K + jpos[k]] = wm[E + rk[k]] + pr[k];
      }
    }
  }
  __syncthreads();
  if (chunks > 1 && !mc_prep_scan_chunks(a, smem, C + W, &bad)) return;
  mc_trace_point(&a, MC_TK_PREP, 0);
  if (bad) {
    if (tid == 0) sc[MC_WS_BAD] = 1;
    return;
  }
  uint32_t *expect = mc_ws_u32(&a, mc_ws_expect_off(s));
  for (int dst = tid; dst < W; dst += blockDim.x) expect[dst] = rexp[dst];
  /* the metas: records per destination, then records per its local experts */
  for (int i = tid; i < W * (L + 1); i += blockDim.x) {
    const int dst = i / (L + 1), l = i % (L + 1);
    ((uint32_t *)(a.win + mc_meta_send_off(s, dst)))[l] = l == 0 ? count[E + dst] : count[dst * L + l - 1];
  }
  if (a.zc) mc_zc_send_counts(a, count, round);
  if (tid == 0) {
    sc[MC_WS_BAD] = 0;
    sc[MC_WS_M_EFF] = (uint32_t)m_eff;
    *mc_ws_round(&a) = round; /* later kernels read it */
    uint64_t recs = 0, slots = 0;
    for (int dst = 0; dst < W; dst++) recs += count[E + dst];
    for (int e = 0; a.zc == MC_ZC_DIRECT && e < E; e++) slots += count[e];
    uint64_t *st = (uint64_t *)(a.ws + mc_ws_stats_off(s));
    st[MC_STAT_DREC] += recs;
    /* registered buffers: the counts to every rank; direct stores: a payload
     * (and scales) per expert slot and no header instead of the records */
    st[MC_STAT_DBYTES] += (a.zc == MC_ZC_DIRECT ? slots * (s->token_bytes + s->scale_bytes)
                                                : recs * mc_record_bytes(s) + (uint64_t)W * mc_meta_bytes(s)) +
                          (a.zc ? (uint64_t)W * E * sizeof(uint32_t) : 0);
  }
  mc_trace_end(&a, MC_TK_PREP);
}
/* One inlined copy per common top-k: with K a constant the per-k loops,
 * unrolled to MC_MAX_TOPK, shrink to K (K x K compares instead of 16 x 16).
 * ncu, one rank alone, 128 tokens: the kernel is a chain of ~2600
 * dependent instructions per warp at ~16 cycles each, so their count is
 * its time (perf-notes). */
MC_DEV void mc_dispatch_prep_k(const mc_kargs_t &a, const int chunks) {
  switch (a.s.topk) {
  case 8: mc_dispatch_prep_body(a, 8, chunks); break;
  case 4: mc_dispatch_prep_body(a, 4, chunks); break;
  default: mc_dispatch_prep_body(a, a.s.topk, chunks); break;
  }
}
static __global__ void __launch_bounds__(MC_PREP_THREADS) mc_k_dispatch_prep(mc_kargs_t a) {
  mc_dispatch_prep_k(a, (int)gridDim.x);
}

/* ---- dispatch-send, part 1b: where there is more than one chunk, each
 * chunk's bases (the last prep block's scan) added to its tokens'
 * positions: the header's slot per expert and the record index per
 * destination rank. One thread per (token, k) of this rank's chunk past the
 * first chunk (whose bases are zero). ---- */
static __global__ void __launch_bounds__(MC_PREP_THREADS) mc_k_dispatch_prep_fix(mc_kargs_t a) {
  const mc_shape_t *s = &a.s;
  const uint32_t *sc = mc_ws_u32(&a, mc_ws_scalars_off(s));
  if (sc[MC_WS_BAD]) return;
  const int K = s->topk, E = s->num_experts, W = s->world_size, P = mc_prep_chunk(s);
  int begin, end;
  mc_send_chunk(s, (int)sc[MC_WS_M_EFF], a.rank % s->group_size, &begin, &end);
  const int from = begin > P ? begin : P;
  const uint16_t *dests = (const uint16_t *)(a.ws + mc_ws_dests_off(s));
  const uint16_t *n_dests = (const uint16_t *)(a.ws + mc_ws_ndests_off(s));
  uint32_t *ridx = mc_ws_u32(&a, mc_ws_ridx_off(s));
  const uint32_t *pcount = mc_ws_u32(&a, mc_ws_pcount_off(s));
  for (int64_t it = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; it < (int64_t)(end - from) * K;
       it += (int64_t)gridDim.x * blockDim.x) {
    const int t = from + (int)(it / K), k = (int)(it % K);
    const uint32_t *bases = pcount + (size_t)(t / P) * (E + 2 * W);
    mc_record_header_t *h = (mc_record_header_t *)(a.win + mc_disp_send_off(s, t - begin));
    h->targets[k].pos += (int32_t)bases[h->targets[k].expert];
    if (k < n_dests[t]) ridx[(int64_t)(t - begin) * K + k] += bases[E + dests[(int64_t)t * K + k]];
  }
}

#endif
