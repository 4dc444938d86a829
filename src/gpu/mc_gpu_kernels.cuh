/* mc_gpu_kernels.cuh - dispatch and combine on the GPU, written once for
 * both GPU transports. The including .cu file first defines the device-side
 * transport interface:
 *
 *   mc_t_put_signal_warp(a, dst_off, src, bytes, slot, value, op, pe)
 *       warp-collective: copy bytes from src (this rank's window or device
 *       memory) to offset dst_off of rank pe's window, then update pe's
 *       signal (slot, indexed by this rank) after the data (SET or ADD).
 *   mc_t_signal(a, slot, value, op, pe)       one thread: update a signal.
 *   mc_t_peer_window(a, pe)   rank pe's window as a pointer this GPU can store
 *       to directly (NVLink / same GPU), or NULL (reached only by puts).
 *
 * Where a peer is directly reachable the kernels store into its window and
 * then update its signal with a release RMW (no staging copy); elsewhere
 * they stage and put. a->staged says whether any peer needs staging.
 *
 * and waits use mc_dev_wait_ge on this rank's own window. The protocol is
 * the cpu transport's, step for step (src/mc_cpu_dispatch.c and
 * src/mc_cpu_combine.c say it in prose); the layout is src/mc_layout.h.
 *
 * Why round i+1 cannot overwrite what a peer still reads from round i
 * (the same argument as on the cpu, now across kernels):
 * - disp_recv/disp_meta at rank d are written by s's dispatch-send(i+1),
 *   launched after s's combine-recv(i) kernel, which waited for every rank's
 *   COMB_BAR(i), which d set at the start of its combine-send(i), a kernel
 *   launched after d's dispatch-recv(i) finished reading them.
 * - comb_recv at rank r is written by d's combine-send(i+1), after d's
 *   dispatch-recv(i+1) waited for r's meta(i+1), which r's dispatch-send(i+1)
 *   sends after r's combine-recv(i) finished reading comb_recv.
 * - staging (disp_send, meta_send, comb_send) is the source of non-blocking
 *   puts: round i's puts have landed (their receivers saw the signals that
 *   follow them) before anyone sends the metas or barrier signals round i+1
 *   waits for, so rewriting staging in round i+1 is safe.
 * - Running totals (records, rows) and round-tagged SETs (meta, barrier):
 *   no signal is ever reset, so no reset can race with a peer's update.
 *   The round number itself lives in device memory (mc_ws_round_off), bumped by
 *   the prep kernel, so a captured CUDA graph replays correctly.
 *
 * Determinism: record positions come from a warp scan in token order, slots
 * from (source rank, position); sums use __fadd_rn/__fmul_rn (no fma
 * contraction) in the documented order. Same bits as the cpu reference. */
#ifndef MC_GPU_KERNELS_CUH
#define MC_GPU_KERNELS_CUH

#include "../mc_dtype.h"
#include "../mc_route.h"
#include "mc_dev.cuh"

#include <cuda_fp16.h>

/* fp16 through the hardware's cvt instructions: the bit-arithmetic versions
 * of mc_dtype.h held 70 more registers per thread in combine-send. Round to
 * nearest even like them; NaN (the one case where cvt's canonical NaN could
 * differ) takes mc_dtype.h's path, so the bits match the cpu's everywhere. */
MC_DEV uint16_t mc_dev_f32_to_f16(float f) {
  const uint16_t h = __half_as_ushort(__float2half_rn(f));
  const uint16_t nan = (uint16_t)(((__float_as_uint(f) >> 16) & 0x8000u) | 0x7e00u);
  return f != f ? nan : h; /* a select, not a branch: no call inlined 32 times */
}
MC_DEV float mc_dev_f16_to_f32(uint16_t h) {
  const float v = __half2float(__ushort_as_half(h));
  const uint32_t nan = ((uint32_t)(h & 0x8000u) << 16) | 0x7f800000u | ((uint32_t)(h & 0x3ffu) << 13);
  return ((h & 0x7c00u) == 0x7c00u && (h & 0x3ffu)) ? __uint_as_float(nan) : v;
}

#define MC_THREADS 512
#define MC_CSEND_THREADS 256 /* combine-send holds 32 fp32 sums + 4 loads per lane: 2 blocks of 256 per SM at <= 128 registers */
#define MC_GPU_MAX_EXPERTS 4096 /* shared-memory scan state of the prep kernel */
#define MC_GPU_MAX_RANKS 1024

/* ---- 8 elements at a time: 16 bytes of bf16/fp16, 32 of fp32 ---- */
MC_DEV void mc_store8(void *row, int64_t i8, int dt, const float v[8]) {
  if (dt == MC_DTYPE_FP32) {
    float4 *p = (float4 *)row + 2 * i8;
    p[0] = make_float4(v[0], v[1], v[2], v[3]);
    p[1] = make_float4(v[4], v[5], v[6], v[7]);
  } else {
    int4 q;
    uint16_t *h = (uint16_t *)&q;
#pragma unroll
    for (int j = 0; j < 8; j++) h[j] = dt == MC_DTYPE_BF16 ? mc_f32_to_bf16(v[j]) : mc_dev_f32_to_f16(v[j]);
    ((int4 *)row)[i8] = q;
  }
}

/* The same 8 elements as raw bits (two int4 for fp32, one for 16-bit), so a
 * lane can keep several loads in flight in few registers, then fold them
 * into fp32 accumulators: acc += w * x (w = 1: acc += x, the same bits). */
typedef struct mc_raw8 {
  int4 lo, hi;
} mc_raw8_t;
MC_DEV mc_raw8_t mc_load8_raw(const void *row, int64_t i8, int dt) {
  mc_raw8_t r;
  if (dt == MC_DTYPE_FP32) {
    const int4 *p = (const int4 *)row + 2 * i8;
    r.lo = p[0];
    r.hi = p[1];
  } else {
    r.lo = ((const int4 *)row)[i8];
    r.hi = make_int4(0, 0, 0, 0);
  }
  return r;
}
MC_DEV float mc_raw8_elem(const mc_raw8_t &r, int e, int dt) {
  if (dt == MC_DTYPE_FP32) {
    const int w = e < 4 ? (e == 0 ? r.lo.x : e == 1 ? r.lo.y : e == 2 ? r.lo.z : r.lo.w)
                        : (e == 4 ? r.hi.x : e == 5 ? r.hi.y : e == 6 ? r.hi.z : r.hi.w);
    return __int_as_float(w);
  }
  const int w = (e >> 1) == 0 ? r.lo.x : (e >> 1) == 1 ? r.lo.y : (e >> 1) == 2 ? r.lo.z : r.lo.w;
  const uint16_t h = (uint16_t)((e & 1) ? ((unsigned)w >> 16) : ((unsigned)w & 0xffffu));
  return dt == MC_DTYPE_BF16 ? mc_bf16_to_f32(h) : mc_dev_f16_to_f32(h);
}
MC_DEV void mc_acc8(float acc[8], float w, const mc_raw8_t &r, int dt) {
#pragma unroll
  for (int e = 0; e < 8; e++) acc[e] = __fadd_rn(acc[e], __fmul_rn(w, mc_raw8_elem(r, e, dt)));
}

/* ---- a warp's share of one row segment (MC_SEG_BYTES): lane owns the
 * 8-element groups g0 + lane + 32 q, four loads in flight per lane ---- */
#define MC_SEG_GROUPS_PER_LANE 4 /* 32 lanes x 4 groups x 8 bf16 = MC_SEG_BYTES */
typedef struct mc_seg {
  int64_t g0, seg_groups, row_groups; /* first group, groups per segment, groups per row */
  int lane;
} mc_seg_t;
MC_DEV bool mc_seg_owns(const mc_seg_t &sg, int q, int64_t *g) {
  *g = sg.g0 + sg.lane + 32 * q;
  return 32 * q + sg.lane < sg.seg_groups && *g < sg.row_groups;
}
/* fp32 segments hold half the groups: with the dtype a constant (the
 * kernels inline one copy per dtype) the unused half costs no registers */
MC_DEV bool mc_seg_q_used(int q, int dt) { return dt != MC_DTYPE_FP32 || q < MC_SEG_GROUPS_PER_LANE / 2; }
MC_DEV void mc_seg_zero(float acc[MC_SEG_GROUPS_PER_LANE][8]) {
#pragma unroll
  for (int q = 0; q < MC_SEG_GROUPS_PER_LANE; q++)
#pragma unroll
    for (int e = 0; e < 8; e++) acc[q][e] = 0.0f;
}
/* acc += w * row over the segment: all loads first, then the sums */
MC_DEV void mc_seg_axpy(float acc[MC_SEG_GROUPS_PER_LANE][8], float w, const void *row, const mc_seg_t &sg, int dt) {
  mc_raw8_t v[MC_SEG_GROUPS_PER_LANE];
  int64_t g;
#pragma unroll
  for (int q = 0; q < MC_SEG_GROUPS_PER_LANE; q++)
    if (mc_seg_q_used(q, dt) && mc_seg_owns(sg, q, &g)) v[q] = mc_load8_raw(row, g, dt);
#pragma unroll
  for (int q = 0; q < MC_SEG_GROUPS_PER_LANE; q++)
    if (mc_seg_q_used(q, dt)) mc_acc8(acc[q], w, v[q], dt);
}
/* seg_dt: the dtype the segment was cut for (the wire's); dt: the row's */
MC_DEV void mc_seg_store(void *row, const float acc[MC_SEG_GROUPS_PER_LANE][8], const mc_seg_t &sg, int seg_dt,
                         int dt) {
  int64_t g;
#pragma unroll
  for (int q = 0; q < MC_SEG_GROUPS_PER_LANE; q++)
    if (mc_seg_q_used(q, seg_dt) && mc_seg_owns(sg, q, &g)) mc_store8(row, g, dt, acc[q]);
}

MC_DEV uint32_t mc_lanemask_lt(void) {
  uint32_t m;
  asm("mov.u32 %0, %%lanemask_lt;" : "=r"(m));
  return m;
}

/* ---- dispatch-send, part 1: check, route, positions (one block) ----
 * The prep kernel's scan: MC_PREP_THREADS threads, warps of 32 tokens each,
 * per-warp lane masks per expert and per destination rank in shared
 * memory; a pass covers (scanning warps) x 32 tokens. MC_PREP_SMEM caps the
 * masks, so many experts mean fewer scanning warps, never a failed launch. */
#define MC_PREP_THREADS 256 /* up to 255 registers: the per-k state of MC_MAX_TOPK stays in them */
#define MC_PREP_SMEM (40u << 10)
static inline __host__ __device__ int mc_prep_warps(const mc_shape_t *s) {
  const size_t cols = (size_t)s->num_experts + (size_t)s->world_size;
  const size_t fixed = sizeof(uint32_t) * (cols + (size_t)s->world_size); /* running counts, expected rows */
  size_t w = fixed < MC_PREP_SMEM ? (MC_PREP_SMEM - fixed) / (sizeof(uint32_t) * cols) : 1;
  if (w > MC_PREP_THREADS / 32) w = MC_PREP_THREADS / 32;
  return w < 1 ? 1 : (int)w;
}
/* Dynamic shared memory of the two kernels that carve it, beside the carving:
 * prep: count[E + W], rexp[W], mask[warps][E + W] (more than the default
 * 48 KB only near the limits of 4096 experts and 1024 ranks: the host then
 * raises the kernel's limit); recv: base[W][L], prefix[W+1]. */
static inline size_t mc_prep_smem_bytes(const mc_shape_t *s) {
  const size_t cols = (size_t)s->num_experts + (size_t)s->world_size;
  return sizeof(uint32_t) * (cols + (size_t)s->world_size + cols * (size_t)mc_prep_warps(s));
}
/* dispatch-send and combine-send: count[W], what this block sent each rank */
static inline size_t mc_send_smem_bytes(const mc_shape_t *s) { return sizeof(uint32_t) * (size_t)s->world_size; }
static inline size_t mc_drecv_smem_bytes(const mc_shape_t *s) {
  return sizeof(uint32_t) * ((size_t)s->world_size * mc_num_local_experts(s) + (size_t)s->world_size + 1);
}

/* Checks every valid token's top-k before anything is sent: a bad round
 * sets MC_WS_BAD and the send kernel then sends nothing. Computes every
 * token's destination ranks and the rows expected back (all members of a
 * group need them for combine); for this rank's chunk, gives each record
 * its position per expert and its index per destination rank in token
 * order (the order makes the slots deterministic), writes the record
 * headers into staging, and the metas.
 * One pass per (scanning warps x 32) tokens, lane t owning token t: it
 * loads its ids and weights once, checks and routes them, and ORs its bit
 * into its warp's mask of each of its experts and ranks; its place among
 * the warp's tokens is then a popcount of the lower lanes, and one thread
 * per column (expert or rank) turns the warps' counts into running bases.
 * A few block barriers per pass and one round trip to memory; no serial
 * walk over tokens (one warp walking them took 20-30 us: perf-notes).
 * Headers, routes and row counts are written even when a later token turns
 * out bad: nothing reads them before the next accepted round rewrites them,
 * and the refused round leaves round number, metas and stats alone. */
MC_DEV void mc_dispatch_prep_body(const mc_kargs_t &a, const int K) {
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
  for (int base = 0; base < m_eff; base += NW * 32) {
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
    __syncthreads(); /* every warp read its bases before the next pass clears the masks */
  }
  __syncthreads();
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
  if (tid == 0) {
    sc[MC_WS_BAD] = 0;
    sc[MC_WS_M_EFF] = (uint32_t)m_eff;
    *mc_ws_round(&a) = round; /* later kernels read it */
    uint64_t recs = 0;
    for (int dst = 0; dst < W; dst++) recs += count[E + dst];
    uint64_t *st = (uint64_t *)(a.ws + mc_ws_stats_off(s));
    st[MC_STAT_DREC] += recs;
    st[MC_STAT_DBYTES] += recs * mc_record_bytes(s) + (uint64_t)W * mc_meta_bytes(s);
  }
  mc_trace_end(&a, MC_TK_PREP);
}
/* One inlined copy per common top-k: with K a constant the per-k loops,
 * unrolled to MC_MAX_TOPK, shrink to K (K x K compares instead of 16 x 16).
 * ncu, one rank alone, 128 tokens: the kernel is a chain of ~2600
 * dependent instructions per warp at ~16 cycles each, so their count is
 * its time (perf-notes). */
static __global__ void __launch_bounds__(MC_PREP_THREADS) mc_k_dispatch_prep(mc_kargs_t a) {
  switch (a.s.topk) {
  case 8: mc_dispatch_prep_body(a, 8); break;
  case 4: mc_dispatch_prep_body(a, 4); break;
  default: mc_dispatch_prep_body(a, a.s.topk); break;
  }
}

/* ---- dispatch-send, part 2a: pack payloads into staging (whole grid),
 * launched only when some peer is reached by puts ---- */
static __global__ void __launch_bounds__(MC_THREADS) mc_k_dispatch_pack(mc_kargs_t a) {
  const mc_shape_t *s = &a.s;
  const uint32_t *sc = mc_ws_u32(&a, mc_ws_scalars_off(s));
  if (sc[MC_WS_BAD]) return;
  mc_trace_start(&a, MC_TK_PACK);
  const int lane = threadIdx.x & 31;
  const int gw = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, nw = (gridDim.x * blockDim.x) >> 5;
  int begin, end;
  mc_send_chunk(s, (int)sc[MC_WS_M_EFF], a.rank % s->group_size, &begin, &end);
  for (int t = begin + gw; t < end; t += nw) {
    unsigned char *rec = a.win + mc_disp_send_off(s, t - begin);
    mc_warp_copy16(rec + mc_record_payload_off(s), (const unsigned char *)a.tokens + (uint64_t)t * s->token_bytes,
                   s->token_bytes, lane);
    if (s->scale_bytes)
      mc_warp_copy4(rec + mc_record_scale_off(s), (const unsigned char *)a.scales + (uint64_t)t * s->scale_bytes,
                    s->scale_bytes, lane);
  }
  mc_trace_end(&a, MC_TK_PACK);
}

/* End of a send kernel: after every warp of the block stored its share,
 * one release per directly reachable rank this block sent to, adding what
 * it sent (records, or row segments) to that rank's running total. A
 * signal per block instead of per record or segment: each is a fence that
 * waits for the stores before it, and the receivers wait for a source's
 * whole total before reading any of it, so finer signals bought nothing
 * (perf-notes). The fence after the block barrier orders the other warps'
 * stores too (they happen before it through bar.sync: cumulativity). */
MC_DEV void mc_block_signal_counts(const mc_kargs_t &a, uint32_t *count, int slot) {
  __syncthreads();
  for (int p = threadIdx.x; p < a.s.world_size; p += blockDim.x) {
    if (!count[p]) continue;
    mc_fence_peers(&a);
    mc_sig_add(&a, (uint64_t *)(mc_t_peer_window(&a, p) + mc_sig_off(&a.s, slot, a.rank)), count[p]);
  }
}

/* ---- dispatch-send, part 2b: one warp per (token, destination rank) ----
 * A directly reachable destination gets the record stored straight into its
 * window (header from staging, payload and scales from the caller's
 * buffers), then its record counter is bumped with a release; any other
 * gets the staged record by put-with-signal. Direct records are counted
 * per block and signalled at the end (mc_block_signal_counts). */
static __global__ void __launch_bounds__(MC_THREADS) mc_k_dispatch_send(mc_kargs_t a) {
  const mc_shape_t *s = &a.s;
  const uint32_t *sc = mc_ws_u32(&a, mc_ws_scalars_off(s));
  if (sc[MC_WS_BAD]) return;
  mc_trace_start(&a, MC_TK_DSEND);
  extern __shared__ uint32_t count[]; /* [W] records this block stored into each rank */
  for (int p = threadIdx.x; p < s->world_size; p += blockDim.x) count[p] = 0;
  __syncthreads();
  const int K = s->topk, W = s->world_size, lane = threadIdx.x & 31;
  const int gw = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, nw = (gridDim.x * blockDim.x) >> 5;
  const int m_eff = (int)sc[MC_WS_M_EFF];
  const uint64_t round = *mc_ws_round(&a);
  int begin, end;
  mc_send_chunk(s, m_eff, a.rank % s->group_size, &begin, &end);
  const uint16_t *dests = (const uint16_t *)(a.ws + mc_ws_dests_off(s));
  const uint16_t *n_dests = (const uint16_t *)(a.ws + mc_ws_ndests_off(s));
  const uint32_t *ridx = mc_ws_u32(&a, mc_ws_ridx_off(s));
  const uint64_t rec_bytes = mc_record_bytes(s), hdr = mc_header_bytes(s);
  for (int it = gw; it < (end - begin) * K; it += nw) {
    const int t = begin + it / K, j = it % K;
    if (j >= n_dests[t]) continue;
    const int d = dests[(int64_t)t * K + j];
    const uint64_t dst_off = mc_disp_recv_off(s, a.rank, (int)ridx[(int64_t)(t - begin) * K + j]);
    const unsigned char *rec = a.win + mc_disp_send_off(s, t - begin);
    unsigned char *peer = mc_t_peer_window(&a, d);
    if (peer) {
      unsigned char *dst = peer + dst_off;
      mc_warp_copy16(dst, rec, hdr, lane);
      mc_warp_copy16(dst + mc_record_payload_off(s), (const unsigned char *)a.tokens + (uint64_t)t * s->token_bytes,
                     s->token_bytes, lane);
      if (s->scale_bytes)
        mc_warp_copy4(dst + mc_record_scale_off(s), (const unsigned char *)a.scales + (uint64_t)t * s->scale_bytes,
                      s->scale_bytes, lane);
      if (lane == 0) atomicAdd(&count[d], 1u);
    } else {
      mc_t_put_signal_warp(&a, dst_off, rec, rec_bytes, MC_SIG_DISP_RECS, 1, MC_SIG_ADD, d);
    }
  }
  /* metas to every rank (zero records included), one warp per rank */
  for (int d = nw - 1 - gw; d < W; d += nw) {
    unsigned char *peer = mc_t_peer_window(&a, d);
    if (peer) {
      mc_warp_copy16(peer + mc_disp_meta_off(s, a.rank), a.win + mc_meta_send_off(s, d), mc_meta_bytes(s), lane);
      __syncwarp();
      if (lane == 0) mc_sig_set(&a, (uint64_t *)(peer + mc_sig_off(s, MC_SIG_DISP_META, a.rank)), round);
    } else {
      mc_t_put_signal_warp(&a, mc_disp_meta_off(s, a.rank), a.win + mc_meta_send_off(s, d), mc_meta_bytes(s),
                           MC_SIG_DISP_META, round, MC_SIG_SET, d);
    }
  }
  mc_block_signal_counts(a, count, MC_SIG_DISP_RECS);
  mc_trace_end(&a, MC_TK_DSEND);
}

/* ---- dispatch-recv (whole grid) ----
 * Every block waits for all metas and computes the slot bases itself (a few
 * hundred integers: cheaper than a grid-wide barrier); warps then take
 * records in (source, index) order, wait until that source's records have
 * all landed, and copy payload and scales into their slots. The last block
 * to finish moves the running totals on. */
static __global__ void __launch_bounds__(MC_THREADS) mc_k_dispatch_recv(mc_kargs_t a) {
  const mc_shape_t *s = &a.s;
  uint32_t *sc = mc_ws_u32(&a, mc_ws_scalars_off(s));
  if (sc[MC_WS_BAD]) return;
  const int W = s->world_size, K = s->topk, L = mc_num_local_experts(s), cap = mc_expert_capacity(s);
  const int tid = threadIdx.x, lane = tid & 31;
  const uint64_t round = *mc_ws_round(&a);
  extern __shared__ uint32_t smem[];
  uint32_t *base = smem, *prefix = smem + W * L; /* [W][L], [W+1] */
  __shared__ int abort_;
  mc_trace_start(&a, MC_TK_DRECV);
  if (tid == 0) abort_ = 0;
  __syncthreads();
  for (int src = tid; src < W; src += blockDim.x)
    if (mc_dev_wait_ge(&a, mc_sig_local(&a, MC_SIG_DISP_META, src), round, MC_PHASE_DRECV, src, MC_SIG_DISP_META, round))
      abort_ = 1;
  __syncthreads();
  if (abort_) return;
  mc_trace_point(&a, MC_TK_DRECV, 0);
  for (int l = tid; l < L; l += blockDim.x) {
    uint32_t run = 0;
    for (int src = 0; src < W; src++) {
      base[src * L + l] = run;
      run += ((const uint32_t *)(a.win + mc_disp_meta_off(s, src)))[1 + l];
    }
    if (blockIdx.x == 0) a.expert_count[l] = (int32_t)run;
  }
  if (tid == 0) {
    prefix[0] = 0;
    for (int src = 0; src < W; src++) prefix[src + 1] = prefix[src] + ((const uint32_t *)(a.win + mc_disp_meta_off(s, src)))[0];
  }
  __syncthreads();
  const uint64_t *seen = (const uint64_t *)(a.ws + mc_ws_seen_off(s));
  const int total = (int)prefix[W];
  const int gw = (blockIdx.x * blockDim.x + tid) >> 5, nw = (gridDim.x * blockDim.x) >> 5;
  int waited_src = -1;
  for (int i = gw; i < total; i += nw) {
    int src = 0;
    while (prefix[src + 1] <= (uint32_t)i) src++;
    if (src != waited_src) {
      int fail = 0;
      if (lane == 0) {
        uint64_t target = seen[MC_SIG_DISP_RECS * W + src] + (prefix[src + 1] - prefix[src]);
        fail = mc_dev_wait_ge(&a, mc_sig_local(&a, MC_SIG_DISP_RECS, src), target, MC_PHASE_DRECV, src,
                              MC_SIG_DISP_RECS, round);
      }
      if (__shfl_sync(0xffffffffu, fail, 0)) break; /* the failure is recorded; finish quietly */
      waited_src = src;
    }
    const unsigned char *rec = a.win + mc_disp_recv_off(s, src, i - (int)prefix[src]);
    const mc_record_header_t *h = (const mc_record_header_t *)rec;
    mc_route_entry_t *r = (mc_route_entry_t *)(a.ws + mc_ws_route_off(s, i));
    int n = 0;
    for (int k = 0; k < K; k++) {
      mc_target_t tg = h->targets[k];
      if (tg.expert / L != a.rank) continue;
      int l = tg.expert - a.rank * L, slot = (int)base[src * L + l] + tg.pos;
      mc_warp_copy16((unsigned char *)a.expert_x + ((uint64_t)l * cap + slot) * s->token_bytes,
                     rec + mc_record_payload_off(s), s->token_bytes, lane);
      if (s->scale_bytes)
        mc_warp_copy4((unsigned char *)a.expert_scale + ((uint64_t)l * cap + slot) * s->scale_bytes,
                      rec + mc_record_scale_off(s), s->scale_bytes, lane);
      if (lane == 0) r->targets[n] = mc_target_t{l, slot, tg.weight};
      n++;
    }
    if (lane == 0) {
      r->src_rank = src;
      r->token = h->token;
      r->n_targets = n;
    }
  }
  /* last block out: running totals of records move on by this round's counts */
  mc_trace_end(&a, MC_TK_DRECV);
  __syncthreads();
  if (tid == 0) {
    __threadfence();
    unsigned int done = atomicAdd(&sc[MC_WS_DONE_DRECV], 1u);
    if (done == gridDim.x - 1) {
      uint64_t *seen_w = (uint64_t *)(a.ws + mc_ws_seen_off(s));
      for (int src = 0; src < W; src++) seen_w[MC_SIG_DISP_RECS * W + src] += prefix[src + 1] - prefix[src];
      sc[MC_WS_N_ROUTE] = (uint32_t)total;
      sc[MC_WS_DONE_DRECV] = 0;
    }
  }
}

/* ---- combine-send (whole grid): one warp per (received record, row segment) ----
 * Enter the round barrier, then for each segment of each pre-reduced row:
 * the fp32 sum of the record's experts on this rank, weighted, ascending
 * local expert, rounded to the wire dtype, stored straight into every group
 * member's window that is directly reachable, or into staging for the
 * others. The warp that finishes a row's last segment (a per-row counter)
 * sends the row's signal: one release per direct member, one
 * put-with-signal per staged member. Each lane keeps four 8-element loads
 * in flight per expert. (Measured: a warp per whole row starves the SMs of
 * warps, a signal per segment costs a system-scope release each; perf-notes.) */
MC_DEV void mc_combine_send_body(const mc_kargs_t &a, const int dt) {
  const mc_shape_t *s = &a.s;
  uint32_t *sc = mc_ws_u32(&a, mc_ws_scalars_off(s));
  const int W = s->world_size, G = s->group_size, cap = mc_expert_capacity(s), lane = threadIdx.x & 31;
  const uint64_t round = *mc_ws_round(&a);
  const int n_route = (int)sc[MC_WS_N_ROUTE];
  mc_trace_start(&a, MC_TK_CSEND);
  extern __shared__ uint32_t count[]; /* [W] row segments this block stored into each rank */
  for (int p = threadIdx.x; p < W; p += blockDim.x) count[p] = 0;
  __syncthreads();
  if (blockIdx.x == 0)
    for (int p = threadIdx.x; p < W; p += blockDim.x) {
      unsigned char *peer = mc_t_peer_window(&a, p);
      if (peer) mc_sig_set(&a, (uint64_t *)(peer + mc_sig_off(s, MC_SIG_COMB_BAR, a.rank)), round);
      else mc_t_signal(&a, MC_SIG_COMB_BAR, round, MC_SIG_SET, p);
    }
  const uint64_t row_bytes = mc_row_bytes(s);
  const int segs = mc_row_segs(s);
  const int64_t seg_groups = MC_SEG_BYTES / (8 * (int64_t)s->in_elem_bytes); /* 8-element groups per segment */
  const int64_t row_groups = s->hidden / 8;
  uint32_t *rowdone = mc_ws_u32(&a, mc_ws_rowdone_off(s));
  const int gw = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, nw = (gridDim.x * blockDim.x) >> 5;
  for (int it = gw; it < n_route * segs; it += nw) {
    const int i = it / segs, sg = it % segs;
    const mc_route_entry_t *r = (const mc_route_entry_t *)(a.ws + mc_ws_route_off(s, i));
    const int n = r->n_targets, first = (r->src_rank / G) * G;
    const uint64_t dst_off = mc_comb_recv_off(s, a.rank, r->token);
    unsigned char *stage = a.win + mc_comb_send_off(s, i);
    const mc_seg_t seg = {(int64_t)sg * seg_groups, seg_groups, row_groups, lane};
    float acc[MC_SEG_GROUPS_PER_LANE][8];
    mc_seg_zero(acc);
    for (int k = 0; k < n; k++) {
      const mc_target_t tg = r->targets[k];
      mc_seg_axpy(acc, tg.weight,
                  (const unsigned char *)a.expert_y + ((uint64_t)tg.expert * cap + (uint64_t)tg.pos) * row_bytes, seg,
                  dt);
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
    /* staged members get the whole row by one put: count this segment done,
     * the row's last segment puts it, adding segs to the signal (the unit
     * is a segment for every source, direct or not) */
    mc_seg_store(stage, acc, seg, dt, dt);
    __syncwarp();
    uint32_t done = 0;
    if (lane == 0) {
      __threadfence(); /* our segment's stores before the count another warp acts on */
      done = atomicAdd(&rowdone[i], 1u);
    }
    done = __shfl_sync(0xffffffffu, done, 0);
    if (done != (uint32_t)segs - 1) continue;
    if (lane == 0) rowdone[i] = 0; /* for the next round */
    /* the other warps' segments, seen through the count, before the put */
    mc_fence_peers(&a);
    for (int p = first; p < first + G; p++)
      if (!mc_t_peer_window(&a, p))
        mc_t_put_signal_warp(&a, dst_off, stage, row_bytes, MC_SIG_COMB_ROWS, (uint64_t)segs, MC_SIG_ADD, p);
  }
  mc_block_signal_counts(a, count, MC_SIG_COMB_ROWS);
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    uint64_t *st = (uint64_t *)(a.ws + mc_ws_stats_off(s));
    st[MC_STAT_CROWS] += (uint64_t)n_route * G;
    st[MC_STAT_CBYTES] += (uint64_t)n_route * G * row_bytes;
  }
  mc_trace_end(&a, MC_TK_CSEND);
}
/* One inlined copy of the body per wire dtype: with the dtype a constant,
 * each copy holds only its own loads and conversions in registers (one
 * generic body needed 225 registers per thread, one block per SM). */
static __global__ void __launch_bounds__(MC_CSEND_THREADS, 2) mc_k_combine_send(mc_kargs_t a) {
  if (mc_ws_u32(&a, mc_ws_scalars_off(&a.s))[MC_WS_BAD]) return;
  switch (a.in_dtype) {
  case MC_DTYPE_BF16: mc_combine_send_body(a, MC_DTYPE_BF16); break;
  case MC_DTYPE_FP16: mc_combine_send_body(a, MC_DTYPE_FP16); break;
  default: mc_combine_send_body(a, MC_DTYPE_FP32); break;
  }
}

/* ---- combine-recv (whole grid) ----
 * Wait for every rank's rows, sum each token's rows in ascending rank order
 * in fp32, round once; then wait for every rank's barrier signal of this
 * round (nobody may start the next dispatch-send while a peer still reads
 * this round's dispatch buffers). */
MC_DEV void mc_combine_recv_body(const mc_kargs_t &a, const int dt, const int odt) {
  const mc_shape_t *s = &a.s;
  uint32_t *sc = mc_ws_u32(&a, mc_ws_scalars_off(s));
  const int W = s->world_size, K = s->topk, tid = threadIdx.x, lane = tid & 31;
  const uint64_t round = *mc_ws_round(&a);
  const int m_eff = (int)sc[MC_WS_M_EFF];
  const uint32_t *expect = mc_ws_u32(&a, mc_ws_expect_off(s));
  const uint64_t *seen = (const uint64_t *)(a.ws + mc_ws_seen_off(s));
  __shared__ int abort_;
  mc_trace_start(&a, MC_TK_CRECV);
  if (tid == 0) abort_ = 0;
  __syncthreads();
  const int segs = mc_row_segs(s); /* the rows signal counts row segments */
  for (int src = tid; src < W; src += blockDim.x)
    if (mc_dev_wait_ge(&a, mc_sig_local(&a, MC_SIG_COMB_ROWS, src),
                       seen[MC_SIG_COMB_ROWS * W + src] + (uint64_t)expect[src] * segs, MC_PHASE_CRECV, src,
                       MC_SIG_COMB_ROWS, round))
      abort_ = 1;
  __syncthreads();
  if (abort_) return;
  mc_trace_point(&a, MC_TK_CRECV, 0);
  const uint16_t *dests = (const uint16_t *)(a.ws + mc_ws_dests_off(s));
  const uint16_t *n_dests = (const uint16_t *)(a.ws + mc_ws_ndests_off(s));
  const uint64_t out_row = (uint64_t)s->hidden * (odt == MC_DTYPE_FP32 ? 4u : 2u);
  const int64_t seg_groups = MC_SEG_BYTES / (8 * (int64_t)s->in_elem_bytes), row_groups = s->hidden / 8;
  const int gw = (blockIdx.x * blockDim.x + tid) >> 5, nw = (gridDim.x * blockDim.x) >> 5;
  /* one warp per (token, segment): four 8-element groups per lane in flight */
  for (int it = gw; it < m_eff * segs; it += nw) {
    const int t = it / segs, sg = it % segs;
    const uint16_t *d = dests + (int64_t)t * K;
    const int nd = n_dests[t];
    const mc_seg_t seg = {(int64_t)sg * seg_groups, seg_groups, row_groups, lane};
    float acc[MC_SEG_GROUPS_PER_LANE][8];
    mc_seg_zero(acc);
    for (int j = 0; j < nd; j++) mc_seg_axpy(acc, 1.0f, a.win + mc_comb_recv_off(s, d[j], t), seg, dt);
    mc_seg_store((unsigned char *)a.out + (uint64_t)t * out_row, acc, seg, dt, odt);
  }
  mc_trace_point(&a, MC_TK_CRECV, 1);
  for (int p = tid; p < W; p += blockDim.x)
    if (mc_dev_wait_ge(&a, mc_sig_local(&a, MC_SIG_COMB_BAR, p), round, MC_PHASE_CRECV, p, MC_SIG_COMB_BAR, round))
      abort_ = 1;
  __syncthreads();
  if (abort_) return;
  mc_trace_end(&a, MC_TK_CRECV);
  if (tid == 0) {
    __threadfence();
    unsigned int done = atomicAdd(&sc[MC_WS_DONE_CRECV], 1u);
    if (done == gridDim.x - 1) {
      uint64_t *seen_w = (uint64_t *)(a.ws + mc_ws_seen_off(s));
      for (int src = 0; src < W; src++) seen_w[MC_SIG_COMB_ROWS * W + src] += (uint64_t)expect[src] * segs;
      sc[MC_WS_DONE_CRECV] = 0;
    }
  }
}

/* per (wire, output) dtype pair, as for combine-send */
static __global__ void __launch_bounds__(MC_THREADS) mc_k_combine_recv(mc_kargs_t a) {
  if (mc_ws_u32(&a, mc_ws_scalars_off(&a.s))[MC_WS_BAD]) return;
#define MC_CRECV_CASE(in, out)                                                                                         \
  if (a.in_dtype == in && a.out_dtype == out) return mc_combine_recv_body(a, in, out);
  MC_CRECV_CASE(MC_DTYPE_BF16, MC_DTYPE_BF16)
  MC_CRECV_CASE(MC_DTYPE_BF16, MC_DTYPE_FP32)
  MC_CRECV_CASE(MC_DTYPE_FP16, MC_DTYPE_FP16)
  MC_CRECV_CASE(MC_DTYPE_FP16, MC_DTYPE_FP32)
  MC_CRECV_CASE(MC_DTYPE_FP32, MC_DTYPE_FP32)
  mc_combine_recv_body(a, a.in_dtype, a.out_dtype); /* other pairs: one generic copy */
#undef MC_CRECV_CASE
}

/* ---- mc_a2a_barrier: one block; every rank SETs its count into every
 * peer's slot, then waits for every peer's. Counts only grow, so a SET of
 * call n+1 cannot be confused with call n's. ---- */
static __global__ void __launch_bounds__(MC_THREADS) mc_k_barrier(mc_kargs_t a) {
  const mc_shape_t *s = &a.s;
  uint32_t *sc = mc_ws_u32(&a, mc_ws_scalars_off(s));
  const uint64_t n = (uint64_t)sc[MC_WS_BARRIERS] + 1;
  __syncthreads(); /* every thread has read the count before it moves on */
  if (threadIdx.x == 0) sc[MC_WS_BARRIERS] = (uint32_t)n;
  for (int p = threadIdx.x; p < s->world_size; p += blockDim.x) {
    unsigned char *peer = mc_t_peer_window(&a, p);
    if (peer) mc_sig_set(&a, (uint64_t *)(peer + mc_sig_off(s, MC_SIG_BARRIER, a.rank)), n);
    else mc_t_signal(&a, MC_SIG_BARRIER, n, MC_SIG_SET, p);
  }
  for (int p = threadIdx.x; p < s->world_size; p += blockDim.x)
    if (mc_dev_wait_ge(&a, mc_sig_local(&a, MC_SIG_BARRIER, p), n, MC_PHASE_BARRIER, p, MC_SIG_BARRIER, n)) return;
}

#endif
