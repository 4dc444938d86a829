/* mc_gpu_prep.cuh - dispatch-send's first step: check every valid token's
 * top-k, route it (its destination ranks), and give each record its
 * position among this rank's records to each expert and each destination
 * (token order: the slots are deterministic). Part of mc_gpu_kernels.cuh.
 *
 * Two ways to run it (mc_gpu_launch.cuh picks):
 * - one launch (MC_PREP_ONE): where the group's tokens fit one prep chunk
 *   (256 at the DeepSeek-V3 shape) every block of the dispatch kernel preps
 *   all of them in its own shared memory, then sends its share. No block
 *   waits for another and nothing is read back from global memory: a
 *   handoff from one prepping block to the others costs more (a flag,
 *   fences, then the tables reloaded) than the prep done in every block.
 *   Block 0 also publishes what later kernels and the peers need.
 * - chunked (MC_PREP_CHUNKS): a prep kernel of one block per chunk; the
 *   last block to finish scans the chunks' counts into each chunk's bases
 *   (mc_prep_scan_chunks) and a small fix kernel adds them; the tables go
 *   to the workspace and the headers to staging, for the send kernel.
 * A decode call of at most 32 (token, k) pairs, in groups of one rank,
 * takes the one-warp prep of mc_gpu_prep_tiny.cuh instead.
 *
 * The scan: lane t of a scanning warp owns token t; it ORs its bit into its
 * warp's mask of each of its experts and ranks (shared-memory atomics:
 * grouping a column's lanes by __match_any_sync first is slower);
 * its place among the warp's tokens is a popcount of the lower lanes, and
 * one thread per column turns the warps' counts into bases. */
#ifndef MC_GPU_PREP_CUH
#define MC_GPU_PREP_CUH

#include "mc_route.h"
#include "mc_gpu_rows.cuh"

enum { MC_PREP_ONE = 0, MC_PREP_CHUNKS = 1 };

/* The call's tokens: bound_m where the caller gives them on the device (a
 * captured graph replays with any count up to a.m), else a.m. */
MC_DEV int mc_call_m(const mc_kargs_t &a) { return a.bound_m ? *a.bound_m : a.m; }

/* Scanning warps per chunk (<= 8), and tokens per chunk (mc_layout.h). */
static inline __host__ __device__ int mc_prep_warps(const mc_shape_t *s) { return s->prep_warps; }
static inline __host__ __device__ int mc_prep_chunk(const mc_shape_t *s) { return mc_prep_warps(s) * 32; }

/* Shared memory, in 32-bit words from the start:
 *   count[C]      C = E + W columns (experts, then ranks): totals after the scan
 *   rexp[W]       rows each rank will send back to this group (combine's expect)
 *   mask[NW][C]   per scanning warp: lane masks, then that warp's bases
 * and for the one-launch path the tables the send step reads:
 *   sent[W]       pieces this block stored into each rank (mc_gpu_kernels.cuh)
 *   ridx[P][K]    per token of this rank's share: record index at each destination
 *   tpos[P][K]    per token of this rank's share: its position among this rank's
 *                 records to its k-th expert (the send step writes the header)
 *   dests[P][K]   (uint16) per token of the group: destination ranks, ascending
 *   ndest[P]      (uint16) how many
 * (P: tokens per chunk). */
static inline __host__ __device__ size_t mc_prep_words(const mc_shape_t *s) {
  const size_t C = (size_t)s->num_experts + (size_t)s->world_size;
  return C + (size_t)s->world_size + C * (size_t)mc_prep_warps(s);
}
static inline size_t mc_prep_smem_bytes(const mc_shape_t *s) { return sizeof(uint32_t) * mc_prep_words(s); }
static inline __host__ __device__ size_t mc_one_smem_bytes(const mc_shape_t *s) {
  const size_t P = (size_t)mc_prep_chunk(s), K = (size_t)s->topk;
  return mc_align_up(sizeof(uint32_t) * (mc_prep_words(s) + (size_t)s->world_size + 2 * P * K) +
                         sizeof(uint16_t) * (P * K + P),
                     16);
}

/* Where the send step finds, per token, its destinations and record
 * indices: shared memory (one launch) or the workspace (chunked). */
typedef struct mc_route_tab {
  uint16_t *dests;  /* [t][K] */
  uint16_t *ndest;  /* [t] */
  uint32_t *ridx;   /* [t - begin][K] */
  uint32_t *tpos;   /* [t - begin][K], one launch only (chunked: the staged header holds them) */
} mc_route_tab_t;

MC_DEV mc_route_tab_t mc_tab_global(const mc_kargs_t &a) {
  return mc_route_tab_t{(uint16_t *)(a.ws + mc_ws_dests_off(&a.s)), (uint16_t *)(a.ws + mc_ws_ndests_off(&a.s)),
                        (uint32_t *)(a.ws + mc_ws_ridx_off(&a.s)), NULL};
}
MC_DEV uint32_t *mc_one_sent(uint32_t *smem, const mc_shape_t *s) { return smem + mc_prep_words(s); }
MC_DEV mc_route_tab_t mc_tab_shared(uint32_t *smem, const mc_shape_t *s) {
  const int P = mc_prep_chunk(s), K = s->topk;
  uint32_t *ridx = mc_one_sent(smem, s) + s->world_size, *tpos = ridx + (size_t)P * K;
  uint16_t *dests = (uint16_t *)(tpos + (size_t)P * K);
  return mc_route_tab_t{dests, dests + (size_t)P * K, ridx, tpos};
}

/* Chunked: each block stores its chunk's counts (one row of pcount:
 * experts, ranks, rows expected back) and its verdict; the last block to
 * arrive turns every column into each chunk's base (a scan over chunks),
 * leaves the totals in smem and the round's verdict in *bad. Returns 1 in
 * the last block only. */
MC_DEV int mc_prep_scan_chunks(const mc_kargs_t &a, uint32_t *smem, const int cols, int *bad,
                               unsigned long long *digest) {
  const int tid = threadIdx.x;
  uint32_t *sc = mc_ws_u32(&a, mc_ws_scalars_off(&a.s));
  uint32_t *pcount = mc_ws_u32(&a, mc_ws_pcount_off(&a.s));
  unsigned long long *wsdig = (unsigned long long *)&sc[MC_WS_DIGEST];
  __shared__ int last;
  for (int i = tid; i < cols; i += blockDim.x) pcount[(size_t)blockIdx.x * cols + i] = smem[i];
  __syncthreads();
  if (tid == 0) {
    if (*bad) atomicOr(&sc[MC_WS_PREP_BAD], 1u);
    if (*digest) atomicAdd(wsdig, *digest); /* this chunk's share of the group digest */
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
    *digest = *(volatile unsigned long long *)wsdig; /* every chunk's, seen through the arrivals */
    sc[MC_WS_PREP_BAD] = 0;
    *wsdig = 0;
    sc[MC_WS_DONE_PREP] = 0; /* for the next round */
  }
  __syncthreads();
  return 1;
}

/* The rest of the round's state, once the counts are final and the round
 * is accepted: rows expected back, records sent (stats), m_eff, and the
 * verdict for the later kernels. One block. (The round number itself is
 * written where every block of the kernel has read it: the chunked prep's
 * last block, the one-launch kernel's last block out.) */
MC_DEV void mc_prep_publish(const mc_kargs_t &a, const uint32_t *count, const uint32_t *rexp, int m_eff) {
  const mc_shape_t *s = &a.s;
  const int W = s->world_size, E = s->num_experts;
  uint32_t *expect = mc_ws_u32(&a, mc_ws_expect_off(s));
  for (int dst = threadIdx.x; dst < W; dst += blockDim.x) expect[dst] = rexp[dst];
  if (threadIdx.x == 0) {
    uint32_t *sc = mc_ws_u32(&a, mc_ws_scalars_off(s));
    sc[MC_WS_BAD] = 0;
    sc[MC_WS_M_EFF] = (uint32_t)m_eff;
    uint64_t recs = 0;
    for (int dst = 0; dst < W; dst++) recs += count[E + dst];
    uint64_t *st = (uint64_t *)(a.ws + mc_ws_stats_off(s));
    st[MC_STAT_DREC] += recs;
    st[MC_STAT_DBYTES] += recs * mc_record_bytes(s) + (uint64_t)W * mc_meta_bytes(s);
  }
}

/* One token's routing, held by its lane. Per k, in registers (loops
 * unrolled to MC_MAX_TOPK, guarded by K: no dynamically indexed arrays,
 * which would live in local memory and make every step a dependent load):
 * expert id, weight, destination rank, whether k is the first of its rank
 * (bit k of first), that rank's index among the token's distinct ranks,
 * ascending (jpos), and the token's place among its warp's tokens to each
 * expert (pe) and each rank (pr). */
typedef struct mc_prep_tok {
  int32_t idx[MC_MAX_TOPK], rk[MC_MAX_TOPK], jpos[MC_MAX_TOPK];
  float wt[MC_MAX_TOPK];
  uint32_t pe[MC_MAX_TOPK], pr[MC_MAX_TOPK], first;
} mc_prep_tok_t;

/* Loads token t's top-k and checks it. A bad one is recorded (by one block
 * where every block scans every token) and refused: returns false. */
MC_DEV bool mc_prep_load(const mc_kargs_t &a, const int K, const bool one, const int t, mc_prep_tok_t &tk) {
  const int E = a.s.num_experts;
  uint32_t wide_bad = 0; /* bit k: id k is outside 0..E-1 at its full width (int64: before narrowing) */
#pragma unroll
  for (int k = 0; k < MC_MAX_TOPK; k++)
    if (k < K) {
      const int64_t i = (int64_t)t * K + k;
      const int64_t v = a.ids64 ? ((const int64_t *)a.indices)[i] : (int64_t)((const int32_t *)a.indices)[i];
      wide_bad |= (uint32_t)(v < 0 || v >= E) << k;
      tk.idx[k] = (int32_t)v;
      tk.wt[k] = a.weights ? a.weights[i] : 1.0f;
    }
  int bad_k = -1, why = MC_ROUTE_OK; /* the first bad k, as mc_route_load reports it */
#pragma unroll
  for (int k = 0; k < MC_MAX_TOPK; k++) {
    if (k >= K || bad_k >= 0) continue;
    if (wide_bad >> k & 1u) bad_k = k, why = MC_ROUTE_OUT_OF_RANGE;
#pragma unroll
    for (int j = 0; j < k; j++)
      if (bad_k < 0 && tk.idx[j] == tk.idx[k]) bad_k = k, why = MC_ROUTE_DUPLICATE;
  }
  if (bad_k >= 0) {
    int v = 0;
#pragma unroll
    for (int k = 0; k < MC_MAX_TOPK; k++)
      if (k == bad_k) v = tk.idx[k];
    /* the full id of an out-of-range one, read again (this path only) */
    const int64_t i = (int64_t)t * K + bad_k;
    const int64_t wide = a.ids64 ? ((const int64_t *)a.indices)[i] : (int64_t)((const int32_t *)a.indices)[i];
    if (!one || blockIdx.x == 0) /* one launch: every block finds it; one records it */
      mc_dev_refuse(a.err, why == MC_ROUTE_OUT_OF_RANGE ? MC_DEVERR_BAD_EXPERT : MC_DEVERR_DUP_EXPERT, t, bad_k, v, 0,
                    (uint64_t)wide);
  }
  return bad_k < 0;
}

/* The group digest: the ranks of a group must pass the same m, indices and
 * weights (each sends a share of the same tokens). Each token adds a hash
 * of its index, ids and weights; a sum does not depend on the order in
 * which blocks or lanes add, so every member of a group with the same
 * inputs gets the same bits. Sent in every meta (mc_meta_digest_word);
 * dispatch-recv compares a source's with its group's first rank's. */
MC_DEV uint64_t mc_mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
MC_DEV uint64_t mc_token_digest(const int K, const int t, const mc_prep_tok_t &tk) {
  uint64_t h = mc_mix64((uint64_t)t);
#pragma unroll
  for (int k = 0; k < MC_MAX_TOPK; k++)
    if (k < K) h = mc_mix64(h ^ ((uint64_t)(uint32_t)tk.idx[k] << 32 | mc_f32_bits(tk.wt[k])));
  return h;
}
MC_DEV uint64_t mc_m_digest(int m_eff) { return mc_mix64(0x6d2d656666ull ^ (uint64_t)m_eff); }

/* A valid token's destination ranks (rk, first, jpos), stored ascending
 * into the route table. */
MC_DEV void mc_prep_ranks(const mc_kargs_t &a, const int masking, const int K, const int L, const int t,
                          const mc_route_tab_t &tab, mc_prep_tok_t &tk) {
#pragma unroll
  for (int k = 0; k < MC_MAX_TOPK; k++) {
    tk.rk[k] = k < K ? tk.idx[k] / L : 0;
    bool f = k < K && !mc_masked(masking, &a, tk.rk[k]); /* a masked rank's experts drop out */
#pragma unroll
    for (int j = 0; j < k; j++) f = f && tk.rk[j] != tk.rk[k];
    tk.first |= (uint32_t)f << k;
  }
  int nd = 0;
#pragma unroll
  for (int k = 0; k < MC_MAX_TOPK; k++) {
    tk.jpos[k] = 0;
#pragma unroll
    for (int j = 0; j < MC_MAX_TOPK; j++) tk.jpos[k] += (tk.first >> j & 1u) && tk.rk[j] < tk.rk[k];
    nd += tk.first >> k & 1u;
  }
  tab.ndest[t] = (uint16_t)nd;
#pragma unroll
  for (int k = 0; k < MC_MAX_TOPK; k++)
    if (tk.first >> k & 1u) tab.dests[(int64_t)t * K + tk.jpos[k]] = (uint16_t)tk.rk[k];
}

/* Every thread of the block: masks and row counts, then each token's place
 * among its warp's tokens, then per column the warps' bases (in mask) and
 * the totals (in count). ok: a valid token of the group; scan: one of this
 * rank's share. One shared-memory RMW per group of lanes with the same
 * column (every lane of a scanning warp takes part: a lane with nothing to
 * add uses a key no other lane has). */
MC_DEV void mc_prep_place(const int K, const int E, const int C, const int NW, const bool ok, const bool scan,
                          uint32_t *count, uint32_t *rexp, uint32_t *mask, uint32_t *wm, mc_prep_tok_t &tk) {
  const int lane = threadIdx.x & 31;
  if (ok) {
#pragma unroll
    for (int k = 0; k < MC_MAX_TOPK; k++)
      if (tk.first >> k & 1u) atomicAdd(&rexp[tk.rk[k]], 1u);
  }
  if (scan) {
#pragma unroll
    for (int k = 0; k < MC_MAX_TOPK; k++) {
      if (k < K) atomicOr(&wm[tk.idx[k]], 1u << lane);
      if (tk.first >> k & 1u) atomicOr(&wm[E + tk.rk[k]], 1u << lane);
    }
  }
  __syncwarp();
  const uint32_t lt = mc_lanemask_lt();
  if (scan) { /* place among this warp's tokens */
#pragma unroll
    for (int k = 0; k < MC_MAX_TOPK; k++) {
      if (k < K) tk.pe[k] = __popc(wm[tk.idx[k]] & lt);
      if (tk.first >> k & 1u) tk.pr[k] = __popc(wm[E + tk.rk[k]] & lt);
    }
  }
  __syncthreads();
  /* per column, warp by warp: mask -> base of that warp's tokens */
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    uint32_t run = count[c];
    for (int w = 0; w < NW; w++) {
      const uint32_t n = __popc(mask[(size_t)w * C + c]);
      mask[(size_t)w * C + c] = run;
      run += n;
    }
    count[c] = run;
  }
  __syncthreads();
}

/* A token of this rank's share, placed: its record index at each
 * destination, and where its header goes. One launch: its position among
 * this rank's records to each expert, for the warp that stores its first
 * payload piece, which writes the header too (mc_gpu_kernels.cuh): one
 * lane building and storing a whole header was thousands of unrolled
 * instructions in the block that publishes the metas, on the round's
 * critical path. Chunked: the header (targets in ascending expert id: the
 * ids are distinct) into staging, for the send kernel to copy or put; none
 * where the round is refused (*refused, shared). */
MC_DEV void mc_prep_record(const mc_kargs_t &a, const int K, const bool one, const int t, const int begin,
                           const mc_route_tab_t &tab, const uint32_t *wm, const int *refused, const mc_prep_tok_t &tk) {
  const mc_shape_t *s = &a.s;
  const int E = s->num_experts;
#pragma unroll
  for (int k = 0; k < MC_MAX_TOPK; k++)
    if (tk.first >> k & 1u) tab.ridx[(int64_t)(t - begin) * K + tk.jpos[k]] = wm[E + tk.rk[k]] + tk.pr[k];
  if (one) {
#pragma unroll
    for (int k = 0; k < MC_MAX_TOPK; k++)
      if (k < K) tab.tpos[(int64_t)(t - begin) * K + k] = wm[tk.idx[k]] + tk.pe[k];
    return;
  }
  if (*refused) return;
  mc_record_header_t *h = (mc_record_header_t *)(a.win + mc_disp_send_off(s, t - begin));
  h->token = t;
  h->n_targets = K;
#pragma unroll
  for (int k = 0; k < MC_MAX_TOPK; k++) {
    if (k >= K) continue;
    int at = 0;
#pragma unroll
    for (int j = 0; j < MC_MAX_TOPK; j++) at += j < K && tk.idx[j] < tk.idx[k];
    h->targets[at] = mc_target_t{tk.idx[k], (int32_t)(wm[tk.idx[k]] + tk.pe[k]), tk.wt[k]};
  }
}

/* The call's outcome for dispatch-recv, which may already be waiting for
 * it (launched early: mc_gpu_kernels.cuh): 2 x the call's number (calls
 * counted in MC_WS_SEND_TRIES), + 1 where refused. One thread of the block
 * that decides; the count itself moves on after (chunked: right here, from
 * the block that decides, the last of the prep; one launch: the last block
 * out, mc_gpu_kernels.cuh). */
MC_DEV void mc_prep_outcome(const mc_kargs_t &a, const bool one, const int refused) {
  uint64_t *tries = mc_ws_scalar64(&a, MC_WS_SEND_TRIES);
  *(volatile uint64_t *)mc_ws_scalar64(&a, MC_WS_OUTCOME) = 2 * (*tries + 1) + (uint64_t)refused;
  if (!one) *tries += 1;
}

/* A refused call (one thread): the verdict for the later kernels and for
 * dispatch-recv. The round number stays: the rank may send the round again. */
MC_DEV void mc_prep_refuse(const mc_kargs_t &a, const bool one) {
  mc_ws_u32(&a, mc_ws_scalars_off(&a.s))[MC_WS_BAD] = 1;
  mc_prep_outcome(a, one, 1);
}

/* The accepted round, from one block: the state later kernels read, the
 * metas (into staging, or one launch: into the peers' windows, each word
 * carrying the round, so no signal and no release follow them: the
 * receivers poll the words). One launch: the call's outcome and the metas
 * first, then what only later kernels read. */
MC_DEV void mc_prep_finish(const mc_kargs_t &a, const int masking, const int K, const bool one, const uint32_t *count,
                           const uint32_t *rexp, const int m_eff, const mc_route_tab_t &tab, const uint64_t round,
                           const uint64_t digest) {
  const mc_shape_t *s = &a.s;
  const int W = s->world_size, tid = threadIdx.x;
  if (!one) mc_prep_publish(a, count, rexp, m_eff);
  if (tid == 0) {
    mc_prep_outcome(a, one, 0);
    mc_trace_point(&a, MC_TK_PREP, 4);
  }
  const int MW = mc_meta_words(s);
  for (int i = tid; i < W * MW; i += blockDim.x) {
    const int dst = i / MW, l = i % MW;
    if (mc_masked(masking, &a, dst)) continue;
    const uint64_t w =
        mc_meta_pack(round, mc_meta_value(s, count + s->num_experts, count, dst, l, digest, (uint64_t)a.limit));
    if (one) mc_word_store(&a, (uint64_t *)(mc_t_peer_window(&a, dst) + mc_disp_meta_off(s, a.rank)) + l, w);
    else ((uint64_t *)(a.win + mc_meta_send_off(s, dst)))[l] = w;
  }
  if (a.trace) __syncthreads(); /* every word stored, for the stamp (uniform: a.trace is one value) */
  mc_trace_point(&a, MC_TK_PREP, 5);
  if (one) {
    mc_prep_publish(a, count, rexp, m_eff);
    /* later kernels (combine) read the routes from the workspace */
    uint16_t *gd = (uint16_t *)(a.ws + mc_ws_dests_off(s)), *gn = (uint16_t *)(a.ws + mc_ws_ndests_off(s));
    for (int i = tid; i < m_eff * K; i += blockDim.x) gd[i] = tab.dests[i];
    for (int i = tid; i < m_eff; i += blockDim.x) gn[i] = tab.ndest[i];
  } else if (tid == 0) {
    *mc_ws_round(&a) = round; /* every block of this kernel has read the old value */
  }
}

/* The prep. mode MC_PREP_CHUNKS: block b scans chunk b; tables to the
 * workspace, headers to staging, the last block publishes and leaves the
 * metas in staging for the send kernel. mode MC_PREP_ONE: every block
 * scans every token (one chunk); tables to this block's shared memory
 * (the headers are the send step's); block 0 publishes and
 * stores the metas into the peers' windows. Returns
 * m_eff, or -1 where the round is refused (bad input: nothing sent; the
 * refusal is recorded and MC_WS_BAD set) or this block has nothing more
 * to do (chunked, not the last block). round: the round being prepared;
 * m_eff: the call's tokens (mc_call_m), checked here. */
MC_DEV int mc_dispatch_prep_body(const mc_kargs_t &a, const int masking, const int K, const int mode,
                                 const uint64_t round, const int m_eff) {
  const mc_shape_t *s = &a.s;
  const int W = s->world_size, L = mc_num_local_experts(s), E = s->num_experts, C = E + W;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, NW = mc_prep_warps(s);
  const bool one = mode == MC_PREP_ONE;
  uint32_t *sc = mc_ws_u32(&a, mc_ws_scalars_off(s));
  extern __shared__ uint32_t smem[];
  uint32_t *count = smem, *rexp = smem + C, *mask = smem + C + W;
  const mc_route_tab_t tab = one ? mc_tab_shared(smem, s) : mc_tab_global(a);
  uint32_t *sent = mc_one_sent(smem, s);
  __shared__ int bad;
  __shared__ unsigned long long digest; /* groups of several ranks: this block's tokens' share */
  mc_trace_start(&a, MC_TK_PREP);
  if (tid == 0) bad = 0, digest = 0;
  /* a dropped round not yet reported (the packed layouts): refused, with
   * nothing recorded (the drop is, and the host reports that) */
  if (tid == 0 && mc_packed_layout(s) && sc[MC_WS_DROP]) bad = 1;
  for (int i = tid; i < C + W; i += blockDim.x) smem[i] = 0;
  if (one)
    for (int i = tid; i < W; i += blockDim.x) sent[i] = 0;
  if (m_eff < 0 || m_eff > a.m) {
    if (tid == 0 && blockIdx.x == 0) {
      mc_dev_refuse(a.err, MC_DEVERR_BAD_BOUND, -1, -1, m_eff, (uint64_t)a.m, 0);
      mc_prep_refuse(a, one);
    }
    return -1;
  }
  int begin, end;
  mc_send_chunk(s, m_eff, a.rank % s->group_size, &begin, &end);
  uint32_t *wm = mask + (size_t)(warp < NW ? warp : 0) * C; /* this warp's masks (warps < NW) */
  const int base = (one ? 0 : (int)blockIdx.x) * mc_prep_chunk(s); /* this block's chunk */
  mc_prep_tok_t tk;
#pragma unroll
  for (int k = 0; k < MC_MAX_TOPK; k++)
    tk.idx[k] = 0, tk.rk[k] = 0, tk.jpos[k] = 0, tk.wt[k] = 0.0f, tk.pe[k] = 0, tk.pr[k] = 0;
  tk.first = 0;
  bool ok = false;   /* a valid token of the group */
  bool scan = false; /* a valid token of this rank's share */
  const int t = base + warp * 32 + lane;
  if (base < m_eff) {
    for (int i = tid; i < NW * C; i += blockDim.x) mask[i] = 0;
    __syncthreads(); /* masks and counts are zero */
    mc_trace_point(&a, MC_TK_PREP, 1);
    if (warp < NW && t < m_eff) {
      if (!mc_prep_load(a, K, one, t, tk)) {
        bad = 1;
      } else {
        mc_prep_ranks(a, masking, K, L, t, tab, tk);
        ok = true;
        scan = t >= begin && t < end;
        if (s->group_size > 1 && (!one || blockIdx.x == 0)) atomicAdd(&digest, mc_token_digest(K, t, tk));
      }
    }
    mc_trace_point(&a, MC_TK_PREP, 2);
    mc_prep_place(K, E, C, NW, ok, scan, count, rexp, mask, wm, tk);
    mc_trace_point(&a, MC_TK_PREP, 3);
    if (scan) mc_prep_record(a, K, one, t, begin, tab, wm, &bad, tk);
  }
  __syncthreads();
  if (!one && gridDim.x > 1 && !mc_prep_scan_chunks(a, smem, C + W, &bad, &digest)) return -1;
  mc_trace_point(&a, MC_TK_PREP, 0);
  if (bad) {
    if (tid == 0 && (!one || blockIdx.x == 0)) mc_prep_refuse(a, one);
    return -1;
  }
  /* one launch: dispatch-recv may start once every block has prepped, not
   * before (started with this kernel, its blocks wait through the prep and
   * some rounds take far longer), block 0 included, before it publishes
   * (so the receiver's launch overlaps the publishing). A block
   * that returned above, refused, lets it start by exiting. */
  if (one) mc_pdl_launch_dependents();
  if (!one || blockIdx.x == 0)
    mc_prep_finish(a, masking, K, one, count, rexp, m_eff, tab, round,
                   s->group_size > 1 ? digest + mc_m_digest(m_eff) : 0);
  mc_trace_end(&a, MC_TK_PREP);
  return m_eff;
}

/* The chunked prep kernel: one inlined copy per common top-k (with K a
 * constant the per-k loops shrink to K: K x K compares instead of 16 x 16).
 * The one-launch kernel has a kernel per top-k instead (mc_gpu_kernels.cuh). */
MC_DEV int mc_dispatch_prep(const mc_kargs_t &a, const int masking, const int mode, const uint64_t round) {
  const int m = mc_call_m(a);
  switch (a.s.topk) {
  case 8: return mc_dispatch_prep_body(a, masking, 8, mode, round, m);
  case 4: return mc_dispatch_prep_body(a, masking, 4, mode, round, m);
  default: return mc_dispatch_prep_body(a, masking, a.s.topk, mode, round, m);
  }
}

/* ---- chunked, more than one chunk: each chunk's bases (the last prep
 * block's scan) added to its tokens' positions: the header's slot per
 * expert and the record index per destination rank. One thread per
 * (token, k) of this rank's share past the first chunk (whose bases are
 * zero). ---- */
MC_DEV void mc_dispatch_prep_fix(const mc_kargs_t &a) {
  const mc_shape_t *s = &a.s;
  const uint32_t *sc = mc_ws_u32(&a, mc_ws_scalars_off(s));
  if (sc[MC_WS_BAD]) return;
  const int K = s->topk, E = s->num_experts, W = s->world_size, P = mc_prep_chunk(s);
  int begin, end;
  mc_send_chunk(s, (int)sc[MC_WS_M_EFF], a.rank % s->group_size, &begin, &end);
  const int from = begin > P ? begin : P;
  const mc_route_tab_t tab = mc_tab_global(a);
  const uint32_t *pcount = mc_ws_u32(&a, mc_ws_pcount_off(s));
  for (int64_t it = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; it < (int64_t)(end - from) * K;
       it += (int64_t)gridDim.x * blockDim.x) {
    const int t = from + (int)(it / K), k = (int)(it % K);
    const uint32_t *bases = pcount + (size_t)(t / P) * (E + 2 * W);
    mc_record_header_t *h = (mc_record_header_t *)(a.win + mc_disp_send_off(s, t - begin));
    h->targets[k].pos += (int32_t)bases[h->targets[k].expert];
    if (k < tab.ndest[t]) tab.ridx[(int64_t)(t - begin) * K + k] += bases[E + tab.dests[(int64_t)t * K + k]];
  }
}

#endif
