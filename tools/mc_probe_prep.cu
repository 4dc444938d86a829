/* mc_probe_prep.cu - mc-probe's steps done by the library's own functions
 * in one block alone, each timed apart: the block prep of a 128-token call
 * of the DeepSeek-V3 layer at one rank (13, src/gpu/mc_gpu_prep.cuh) and
 * dispatch-recv's slot bases (14, src/gpu/mc_gpu_dispatch_recv.cuh). The
 * only file of mc-probe that uses the library's headers: what it times is
 * their code, not a copy of it. Each is timed warm and as the first
 * execution of its code in a launch, after other code on every SM
 * (pr_evict). */
#include <string.h>

#include "mc_gpu.h"
/* what a transport provides the kernels' headers; the functions timed here call none of it */
static __device__ __forceinline__ unsigned char *mc_t_peer_window(const mc_kargs_t *, int) { return 0; }
static __device__ __forceinline__ void mc_t_put_signal_warp(const mc_kargs_t *, uint64_t, const void *, uint64_t, int,
                                                            uint64_t, int, int) {}
static __device__ __forceinline__ void mc_t_signal(const mc_kargs_t *, int, uint64_t, int, int) {}
#include "mc_gpu_dispatch_recv.cuh"

#include "mc_probe.h"

/* ---- 13. the block prep: every thread of a 512-thread block, as each
 * block of a one-launch dispatch-send executes it (mc_dispatch_prep_body):
 * shared memory zeroed (a barrier), then each scanning lane's token
 * loaded, checked and routed (mc_prep_load, mc_prep_ranks: thread 0's
 * token, its data in hand), then placed (mc_prep_place: shared-memory
 * masks, a barrier, the columns' scan, a barrier), then its record
 * indices and positions stored (mc_prep_record, a barrier). Thread 0
 * reads the clock between the steps; out[4 * trial + step], cycles. The
 * ids stay in L2 from trial to trial, as a bench's do from round to
 * round. ---- */
#define PR_PREP_K 8 /* a constant, as in the library's kernel for top-k 8 (mc_gpu_table.cuh) */
static __global__ void __launch_bounds__(512) pr_k_prep(mc_kargs_t a, int warm, int trials, uint64_t *out) {
  const mc_shape_t *s = &a.s;
  const int K = PR_PREP_K, W = s->world_size, E = s->num_experts, L = mc_num_local_experts(s), C = E + W;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, NW = mc_prep_warps(s), t = warp * 32 + lane;
  extern __shared__ uint32_t smem[];
  uint32_t *count = smem, *rexp = smem + C, *mask = smem + C + W;
  uint32_t *wm = mask + (size_t)(warp < NW ? warp : 0) * C;
  const mc_route_tab_t tab = mc_tab_shared(smem, s);
  const int refused = 0;
  for (int i = -warm; i < trials; i++) {
    __syncthreads();
    const uint64_t c0 = pr_clock();
    for (int j = tid; j < C + W; j += blockDim.x) smem[j] = 0;
    for (int j = tid; j < NW * C; j += blockDim.x) mask[j] = 0;
    __syncthreads();
    const uint64_t c1 = pr_clock();
    mc_prep_tok_t tk;
#pragma unroll
    for (int k = 0; k < MC_MAX_TOPK; k++)
      tk.idx[k] = 0, tk.rk[k] = 0, tk.jpos[k] = 0, tk.wt[k] = 0.0f, tk.pe[k] = 0, tk.pr[k] = 0;
    tk.first = 0;
    bool ok = false;
    if (warp < NW && t < a.m && mc_prep_load(a, K, true, t, tk)) {
      mc_prep_ranks(a, 0, K, L, t, tab, tk);
      ok = true;
    }
    const uint64_t c2 = pr_clock_after(tk.first);
    mc_prep_place(K, E, C, NW, ok, ok, count, rexp, mask, wm, tk);
    const uint64_t c3 = pr_clock();
    if (ok) mc_prep_record(a, K, true, t, 0, tab, wm, &refused, tk);
    __syncthreads();
    const uint64_t c4 = pr_clock();
    if (tid == 0 && i >= 0) {
      out[4 * i] = c1 - c0;
      out[4 * i + 1] = c2 - c1;
      out[4 * i + 2] = c3 - c2;
      out[4 * i + 3] = c4 - c3;
    }
  }
}

/* 13. 128 tokens of distinct random experts (a fixed seed), top-8 of 256,
 * one rank, weights given, as a bench's call of max_tokens 128 */
void pr_prep(pr_t *p) {
  const int m = 128, K = PR_PREP_K, E = 256, n = p->trials;
  const mc_shape_t s = mc_shape_make(1, 1, E, K, m, 7168, 7168, 224, 2, MC_LAYOUT_BATCHED, 1);
  int32_t *ids = (int32_t *)pr_malloc(sizeof *ids * (size_t)m * K);
  float *w = (float *)pr_malloc(sizeof *w * (size_t)m * K);
  uint32_t x = 12345u;
  for (int t = 0; t < m; t++)
    for (int k = 0; k < K; k++) {
      int e, dup;
      do { /* distinct within the token */
        x = x * 1664525u + 1013904223u;
        e = (int)(x >> 8) % E;
        dup = 0;
        for (int j = 0; j < k; j++) dup |= ids[t * K + j] == e;
      } while (dup);
      ids[t * K + k] = e;
      w[t * K + k] = 1.0f / (float)K;
    }
  mc_kargs_t a;
  memset(&a, 0, sizeof a);
  a.s = s;
  a.m = m;
  CK(cudaMalloc((void **)&a.indices, sizeof *ids * (size_t)m * K));
  CK(cudaMalloc((void **)&a.weights, sizeof *w * (size_t)m * K));
  CK(cudaMemcpy((void *)a.indices, ids, sizeof *ids * (size_t)m * K, cudaMemcpyHostToDevice));
  CK(cudaMemcpy((void *)a.weights, w, sizeof *w * (size_t)m * K, cudaMemcpyHostToDevice));
  const size_t smem = mc_one_smem_bytes(&s);
  CK(cudaFuncSetAttribute(pr_k_prep, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  static const char *const step[4] = {"prep128.zero", "prep128.load_route", "prep128.place", "prep128.record"};
  static const char *const what[4] = {
      "block prep of 128 tokens (top-8 of 256, one rank), 512 threads: shared memory zeroed, a barrier (clock64)",
      "the same: ids and weights loaded from L2, checked, ranks found: thread 0's token in hand (clock64)",
      "the same: placed (shared-memory masks, barrier, the columns' scan over 8 warps, barrier) (clock64)",
      "the same: record indices and positions stored, a barrier (clock64)"};
  uint64_t *c = (uint64_t *)pr_malloc(sizeof *c * 4 * (size_t)n), *col = (uint64_t *)pr_malloc(sizeof *col * (size_t)n);
  /* cold 0: trials in one launch after warm ones (the code in the SM's
   * caches); cold 1: each trial the first execution in its launch, after other
   * code on every SM (pr_evict) */
  for (int cold = 0; cold < 2; cold++) {
    if (cold == 0) pr_k_prep<<<1, 512, smem, p->st>>>(a, PR_WARM, n, p->out);
    for (int t = 0; cold == 1 && t < n; t++) {
      pr_evict(p);
      pr_k_prep<<<1, 512, smem, p->st>>>(a, 0, 1, p->out + 4 * t);
    }
    pr_sync(p, "prep");
    /* each step's samples in turn where pr_row_cycles reads them */
    CK(cudaMemcpy(c, p->out, sizeof *c * 4 * (size_t)n, cudaMemcpyDeviceToHost));
    for (int j = 0; j < 4; j++) {
      char st[40], wh[200];
      snprintf(st, sizeof st, "%s%s", step[j], cold ? ".first" : "");
      snprintf(wh, sizeof wh,
               cold ? "%s as the first execution of its code in a launch, after other code on every SM (clock64)"
                    : "%s",
               cold ? step[j] : what[j]);
      for (int i = 0; i < n; i++) col[i] = c[4 * i + j];
      CK(cudaMemcpy(p->out, col, sizeof *col * (size_t)n, cudaMemcpyHostToDevice));
      pr_row_cycles(p, st, wh, n, 1);
    }
  }
  free(col);
  CK(cudaFree((void *)a.indices));
  CK(cudaFree((void *)a.weights));
  free(c);
  free(ids);
  free(w);
}

/* ---- 14. dispatch-recv's slot bases (mc_drecv_bases), once the metas'
 * words are in shared memory: a 512-thread block 0 (it stores the expert
 * counts and adds the load sums), one source and 256 local experts, a
 * barrier at its end. Thread 0 reads the clock after a barrier before and
 * at the end; out[trial], cycles. ---- */
static __global__ void __launch_bounds__(512) pr_k_bases(mc_kargs_t a, int warm, int trials, uint64_t *out) {
  const mc_shape_t *s = &a.s;
  const int W = s->world_size, L = mc_num_local_experts(s);
  extern __shared__ uint32_t smem[];
  uint32_t *base = smem, *prefix = base + W * L;
  for (int i = -warm; i < trials; i++) {
    for (int j = threadIdx.x; j < W * L; j += blockDim.x) base[j] = (uint32_t)(j % 3); /* records to each expert */
    if (threadIdx.x < W) prefix[threadIdx.x + 1] = (uint32_t)L;
    __syncthreads();
    const uint64_t c0 = pr_clock();
    mc_drecv_bases(a, 0, base, prefix, NULL);
    const uint64_t c1 = pr_clock();
    if (threadIdx.x == 0 && i >= 0) out[i] = c1 - c0;
  }
}

/* 14. at one rank of the DeepSeek-V3 layer (256 local experts) */
void pr_bases(pr_t *p) {
  const mc_shape_t s = mc_shape_make(1, 1, 256, 8, 128, 7168, 7168, 224, 2, MC_LAYOUT_BATCHED, 1);
  const int L = mc_num_local_experts(&s);
  mc_kargs_t a;
  memset(&a, 0, sizeof a);
  a.s = s;
  CK(cudaMalloc((void **)&a.ws, mc_ws_load_off(&s) + sizeof(uint64_t) * (size_t)L));
  CK(cudaMemset(a.ws, 0, mc_ws_load_off(&s) + sizeof(uint64_t) * (size_t)L));
  CK(cudaMalloc((void **)&a.expert_count, sizeof(int32_t) * (size_t)L));
  const size_t smem = sizeof(uint32_t) * ((size_t)s.world_size * L + (size_t)s.world_size + 1);
  pr_k_bases<<<1, 512, smem, p->st>>>(a, PR_WARM, p->trials, p->out);
  pr_sync(p, "slot bases");
  pr_row_cycles(p, "bases.256",
                "dispatch-recv's slot bases, one source, 256 local experts, block 0 of 512 threads (counts stored, "
                "load sums added), a barrier (clock64)",
                p->trials, 1);
  for (int t = 0; t < p->trials; t++) { /* the first execution in a launch, after other code on every SM */
    pr_evict(p);
    pr_k_bases<<<1, 512, smem, p->st>>>(a, 0, 1, p->out + t);
  }
  pr_sync(p, "slot bases, first execution");
  pr_row_cycles(p, "bases.256.first",
                "the same, the first execution of the code in its launch, after other code on every SM (clock64)", p->trials,
                1);
  CK(cudaFree(a.ws));
  CK(cudaFree(a.expert_count));
}

/* ---- 15. dispatch-send's sending block at 1 token: the one-warp prep
 * (mc_prep_tiny) and the steps to its sends' start, in block 1 of a grid
 * of two, as in the library's kernel (block 0, which publishes the round
 * into a peer's window, leaves here), with the diagnostic trace on: the
 * stamps a ledger's timeline reads (mc_dev.cuh). ---- */
static __global__ void pr_k_trace_init(uint64_t *tr) {
  if (threadIdx.x < MC_TK_N * MC_TRACE_SLOTS) tr[threadIdx.x] = threadIdx.x % MC_TRACE_SLOTS ? 0ull : ~0ull;
}
static __global__ void __launch_bounds__(512) pr_k_tiny(mc_kargs_t a) {
  if (blockIdx.x == 0) return;
  const int m = mc_prep_tiny(a, PR_PREP_K, 1, 1);
  if (m < 0) return;
  int begin, end; /* what mc_dispatch_send_one_body does next */
  mc_send_chunk(&a.s, m, a.rank % a.s.group_size, &begin, &end);
  mc_trace_start(&a, MC_TK_DSEND);
}

/* 15. one token of top-8 of 256 at one rank, max_tokens 128; each trial
 * the first execution in its launch after other code on every SM, then again in
 * the next launch */
void pr_tiny(pr_t *p) {
  const int K = PR_PREP_K, n = p->trials, TW = MC_TK_N * MC_TRACE_SLOTS;
  const mc_shape_t s = mc_shape_make(1, 1, 256, K, 128, 7168, 7168, 224, 2, MC_LAYOUT_BATCHED, 1);
  const int32_t ids[PR_PREP_K] = {201, 3, 77, 140, 9, 250, 64, 118};
  mc_kargs_t a;
  memset(&a, 0, sizeof a);
  a.s = s;
  a.m = 128;
  CK(cudaMalloc((void **)&a.indices, sizeof ids));
  CK(cudaMemcpy((void *)a.indices, ids, sizeof ids, cudaMemcpyHostToDevice));
  uint64_t *tr;
  CK(cudaMalloc(&tr, sizeof *tr * 2 * (size_t)TW * n));
  const size_t smem = mc_one_smem_bytes(&s);
  CK(cudaFuncSetAttribute(pr_k_tiny, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  for (int t = 0; t < n; t++) {
    pr_evict(p);
    for (int again = 0; again < 2; again++) {
      a.trace = tr + (size_t)(2 * t + again) * TW;
      pr_k_trace_init<<<1, TW, 0, p->st>>>(a.trace);
      pr_k_tiny<<<2, 512, smem, p->st>>>(a);
    }
  }
  pr_sync(p, "one-warp prep");
  uint64_t *h = (uint64_t *)pr_malloc(sizeof *h * 2 * (size_t)TW * n);
  double *ns = (double *)pr_malloc(sizeof *ns * (size_t)n);
  CK(cudaMemcpy(h, tr, sizeof *h * 2 * (size_t)TW * n, cudaMemcpyDeviceToHost));
  static const struct {
    const char *step;
    int to_k, to_s, from_k, from_s;
    const char *what;
  } r[3] = {
      {"tiny.zeroed", MC_TK_PREP, 3, MC_TK_PREP, 0, "prep start -> shared memory zeroed"},
      {"tiny.routed", MC_TK_PREP, 2, MC_TK_PREP, 0, "prep start -> routed and placed"},
      {"tiny.to_send", MC_TK_DSEND, 0, MC_TK_PREP, 2, "routed and placed -> its sends' start"},
  };
  for (int j = 0; j < 3; j++)
    for (int again = 0; again < 2; again++) {
      char st[40], wh[200];
      for (int t = 0; t < n; t++) {
        const uint64_t *x = h + (size_t)(2 * t + again) * TW;
        ns[t] = (double)(int64_t)(x[r[j].to_k * MC_TRACE_SLOTS + r[j].to_s] - x[r[j].from_k * MC_TRACE_SLOTS + r[j].from_s]);
      }
      snprintf(st, sizeof st, "%s.%s", r[j].step, again ? "again" : "first");
      snprintf(wh, sizeof wh,
               "1 token's sending block (one-warp prep, 512 threads, trace on): %s; %s (globaltimer)", r[j].what,
               again ? "the next launch" : "its code's first execution, after other code on every SM");
      pr_row(p, st, wh, ns, n);
    }
  free(h);
  free(ns);
  CK(cudaFree(tr));
  CK(cudaFree((void *)a.indices));
}
