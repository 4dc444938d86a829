/* mc_probe_launch.cu - mc-probe's steps of launching: programmatic
 * dependent launch (4), graph replays of empty kernels (5), code fetched
 * once per launch (8) and past a far jump (8b), a launch's first reads
 * (11): their kernels, then the host side that runs them. */
#include <string.h>

#include "mc_probe.h"

/* ---- 4. programmatic dependent launch ----
 * rec per trial: [0] the primary's last launch_dependents, [1] its last
 * block's end, [2] and [3] the secondary's first and last block start, [4]
 * the last of its griddepcontrol.wait to return; all %globaltimer. Each
 * primary block below stay triggers at its start and then spins spin_ns;
 * the others leave at once. */
static __global__ void __launch_bounds__(512) pr_k_primary(uint64_t *rec, uint64_t spin_ns, unsigned stay) {
  if (blockIdx.x >= stay) return; /* a block a call does not need: its exit lets the secondary start */
  if (threadIdx.x == 0) atomicMax((unsigned long long *)&rec[0], (unsigned long long)pr_gtimer());
  pr_launch_dependents();
  if (threadIdx.x == 0) pr_spin_ns(spin_ns);
  __syncthreads();
  if (threadIdx.x == 0) atomicMax((unsigned long long *)&rec[1], (unsigned long long)pr_gtimer());
}
static __global__ void __launch_bounds__(512) pr_k_secondary(uint64_t *rec) {
  if (threadIdx.x == 0) {
    const unsigned long long t = pr_gtimer();
    atomicMin((unsigned long long *)&rec[2], t);
    atomicMax((unsigned long long *)&rec[3], t);
  }
  pr_dep_wait();
  if (threadIdx.x == 0) atomicMax((unsigned long long *)&rec[4], (unsigned long long)pr_gtimer());
}

/* ---- 5. graph replays: an empty kernel. Its trigger at the start and wait
 * at the end are no-ops unless it is launched as half of a programmatic
 * pair, where they are what the library's pair does. ---- */
static __global__ void pr_k_empty(void) {
  pr_launch_dependents();
  pr_dep_wait();
}

/* ---- 8. code fetched: one warp through N steps of straight-line code, a
 * dependent rotate and add each, twice in one launch: the first pass
 * fetches the code, the second runs it from the SM's instruction caches,
 * where it fits. The difference is what a kernel pays for its code once
 * per launch (the chain is dependent, so the fetcher may run ahead of it:
 * a lower bound). out[2 * trial + pass], cycles; the chain starts after the
 * first clock read (it takes in a bit of it) and the second waits for its
 * end.
 * 8b. far jumps: the same with each step followed by P steps it jumps over
 * (a branch on an argument that is never true, as a kernel's common path
 * jumps over its rare cases' code). Against P = 0, what a jump to code not
 * yet fetched costs: straight-line code is fetched ahead of the warp, a
 * jump's target past what was fetched is not. ---- */
#define PR_FETCH_KERNEL(name, N, P)                                                                                  \
  static __global__ void __launch_bounds__(32) name(uint32_t seed, int trial, uint64_t *out, int never) {            \
    uint32_t x = seed + threadIdx.x;                                                                                 \
    _Pragma("unroll 1") for (int pass = 0; pass < 2; pass++) {                                                       \
      const uint64_t c0 = pr_clock();                                                                                \
      x += (uint32_t)(c0 >> 63);                                                                                     \
      _Pragma("unroll") for (int j = 0; j < (N); j++) {                                                              \
        x = __funnelshift_l(x, x, 1 + j % 31) + j * 2654435761u;                                                     \
        if ((P) > 0 && never == j + 1)                                                                               \
          _Pragma("unroll") for (int i = 0; i < (P); i++) x = __funnelshift_l(x, x, 1 + (i + j) % 31) +              \
                                                               (uint32_t)(i * 40503 + j) * 2246822519u;              \
      }                                                                                                              \
      const uint64_t c1 = pr_clock_after(x);                                                                         \
      if (threadIdx.x == 0) out[2 * trial + pass] = c1 - c0;                                                         \
    }                                                                                                                \
  }
PR_FETCH_KERNEL(pr_k_code128, 128, 0)
PR_FETCH_KERNEL(pr_k_code512, 512, 0)
PR_FETCH_KERNEL(pr_k_code2048, 2048, 0)
#define PR_JUMPS 16
PR_FETCH_KERNEL(pr_k_jump0, PR_JUMPS, 0)
PR_FETCH_KERNEL(pr_k_jump16, PR_JUMPS, 16)
PR_FETCH_KERNEL(pr_k_jump128, PR_JUMPS, 128)
PR_FETCH_KERNEL(pr_k_jump1024, PR_JUMPS, 1024)
/* other code, launched on every SM before each trial: what a round's other
 * kernels do to the SM's instruction caches */
PR_FETCH_KERNEL(pr_k_code_evict, 8192, 0)
static __device__ uint64_t pr_evict_sink[2]; /* its samples, never read */
void pr_evict(pr_t *p) {
  uint64_t *sink;
  uint32_t seed = 1;
  int t = 0, never = 0;
  CK(cudaGetSymbolAddress((void **)&sink, pr_evict_sink));
  void *args[] = {&seed, &t, &sink, &never};
  CK(cudaLaunchKernel((const void *)pr_k_code_evict, dim3((unsigned)p->sms), dim3(32), args, 0, p->st));
}

/* ---- 11. a launch's first reads ----
 * A kernel's parameters sit in a constant bank written for each launch:
 * the first read of a line of them in a launch misses the SM's constant
 * cache. One thread reads the clock, then a parameter word at an index
 * known only at run time (the clock's top bit, always 0), so that the read
 * cannot be moved above the clock, 128 bytes in (away from the line the
 * compiler reads before the clock); then a word 256 bytes further (another
 * line), then the first word again (a hit). out[3 * trial + j], cycles.
 * The parameters are as large as the library's argument block (304 bytes
 * with nvcc 13) rounded up to 512. */
#define PR_PARAM_WORDS 64
typedef struct pr_params {
  uint64_t w[PR_PARAM_WORDS];
} pr_params_t;
static __global__ void pr_k_param(pr_params_t prm, int trial, uint64_t *out) {
  if (threadIdx.x) return;
  const uint64_t c0 = pr_clock();
  const int i = (int)(c0 >> 63);
  const uint64_t v0 = prm.w[i + 16];
  const uint64_t c1 = pr_clock_after(v0);
  const uint64_t v1 = prm.w[i + 48 + (int)(v0 >> 63)];
  const uint64_t c2 = pr_clock_after(v1);
  const uint64_t v2 = prm.w[i + 16 + (int)(v1 >> 63)];
  const uint64_t c3 = pr_clock_after(v2);
  out[3 * trial] = c1 - c0;
  out[3 * trial + 1] = c2 - c1;
  out[3 * trial + 2] = c3 - c2;
}
/* A poll that finds its value at once: one read of a word in L2 (written
 * before the pause), with the instruction each of the library's polls
 * uses: ld.acquire (signals: sys, or gpu where all ranks share a GPU) and
 * ld.relaxed (the metas' words, which carry their round). */
static __global__ void pr_k_poll1(const uint64_t *flag, int op, int trials, uint64_t *out) {
  for (int i = -PR_WARM; i < trials; i++) {
    pr_spin_ns(2000);
    asm volatile("" : "+l"(flag)); /* in a register before the clock is read */
    uint64_t v, t0; /* the read chosen before the clock: no branch timed but the join after it */
    if (op == 0) {
      t0 = pr_clock();
      asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(flag) : "memory");
    } else if (op == 1) {
      t0 = pr_clock();
      asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(flag) : "memory");
    } else {
      t0 = pr_clock();
      asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(flag) : "memory");
    }
    const uint64_t t1 = pr_clock_after(v);
    if (i >= 0) out[i] = t1 - t0;
  }
}

/* ---- the host side ---- */

/* Launch fn on the stream, as a programmatic dependent of the kernel
 * before it where pdl, the way the library launches a receiving kernel
 * (launch_recv, src/gpu/mc_gpu_launch.cuh). */
static void pr_launch(const pr_t *p, const void *fn, unsigned grid, unsigned block, size_t smem, int pdl, void **args) {
  cudaLaunchAttribute at[1] = {};
  at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  at[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(grid);
  cfg.blockDim = dim3(block);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = p->st;
  cfg.attrs = at;
  cfg.numAttrs = pdl ? 1 : 0;
  CK(cudaLaunchKernelExC(&cfg, fn, args));
}

/* 4. programmatic dependent launch: a primary of pgrid blocks, of which
 * the first stay trigger at their start and spin and the others leave,
 * then a secondary of grid blocks with smem bytes of dynamic shared
 * memory, with the attribute (pdl) or without */
static void pr_pdl_pair(pr_t *p, unsigned pgrid, unsigned stay, int grid, size_t smem, int pdl, uint64_t *rec) {
  const int n = p->trials + PR_WARM;
  for (int t = 0; t < n; t++) {
    uint64_t *r = rec + 5 * t;
    r[0] = r[1] = r[3] = r[4] = 0;
    r[2] = ~0ull;
  }
  CK(cudaMemcpyAsync(p->out, rec, sizeof *rec * 5 * (size_t)n, cudaMemcpyHostToDevice, p->st));
  pr_k_spin<<<1, 1, 0, p->st>>>(1000000ull);
  for (int t = 0; t < n; t++) {
    uint64_t *r = p->out + 5 * t;
    void *args[] = {&r};
    pr_k_primary<<<pgrid, 512, 0, p->st>>>(r, PR_PDL_SPIN_NS, stay);
    pr_launch(p, (const void *)pr_k_secondary, (unsigned)grid, 512, smem, pdl, args);
  }
  pr_sync(p, "programmatic launch");
  CK(cudaMemcpy(rec, p->out, sizeof *rec * 5 * (size_t)n, cudaMemcpyDeviceToHost));
}
/* a row of rec[to] - rec[from] over the timed trials (signed: a negative
 * gap is the timer's resolution or an ordering the row does not expect) */
static void pr_pdl_row(pr_t *p, const uint64_t *rec, int to, int from, const char *step, const char *what) {
  double *ns = (double *)pr_malloc(sizeof *ns * (size_t)p->trials);
  for (int t = 0; t < p->trials; t++) {
    const uint64_t *r = rec + 5 * (t + PR_WARM);
    ns[t] = (double)(int64_t)(r[to] - r[from]);
  }
  pr_row(p, step, what, ns, p->trials);
  free(ns);
}
void pr_pdl(pr_t *p) {
  uint64_t *rec = (uint64_t *)pr_malloc(sizeof *rec * 5 * (size_t)(p->trials + PR_WARM));
  const int grids[2] = {1, p->sms};
  for (int g = 0; g < 2; g++) {
    char step[40], what[200];
    pr_pdl_pair(p, (unsigned)p->sms, (unsigned)p->sms, grids[g], 0, 1, rec);
    int overlap = 0;
    for (int t = PR_WARM; t < p->trials + PR_WARM; t++)
      overlap += rec[5 * t + 2] < rec[5 * t + 1];
    snprintf(step, sizeof step, "pdl.first_start.%d", grids[g]);
    snprintf(what, sizeof what,
             "primary (%d x 512, %d us spin) last launch_dependents -> secondary (%d x 512) first block start; "
             "started before the primary ended in %d of %d (globaltimer)",
             p->sms, PR_PDL_SPIN_NS / 1000, grids[g], overlap, p->trials);
    pr_pdl_row(p, rec, 2, 0, step, what);
    if (grids[g] > 1) {
      snprintf(step, sizeof step, "pdl.last_start.%d", grids[g]);
      pr_pdl_row(p, rec, 3, 0, step, "the same, to its last block start (globaltimer)");
    }
    snprintf(step, sizeof step, "pdl.wait_return.%d", grids[g]);
    pr_pdl_row(p, rec, 4, 1, step, "primary's last block end -> last griddepcontrol.wait returns (globaltimer)");
    pr_pdl_pair(p, (unsigned)p->sms, (unsigned)p->sms, grids[g], 0, 0, rec);
    snprintf(step, sizeof step, "launch_gap.%d", grids[g]);
    snprintf(what, sizeof what,
             "no attribute: primary's last block end -> secondary (%d x 512) first block start "
             "(globaltimer)",
             grids[g]);
    pr_pdl_row(p, rec, 2, 1, step, what);
  }
  /* a decode call's pair: dispatch-send's grid sized for 128 tokens (a
   * quarter of the SMs), one block staying, the others leaving at once;
   * dispatch-recv's grid of half the SMs with its dynamic shared memory
   * (DeepSeek-V3 at one rank: 1040 bytes) */
  const unsigned pgrid = (unsigned)p->sms / 4, rgrid = (unsigned)(p->sms + 1) / 2;
  pr_pdl_pair(p, pgrid, 1, (int)rgrid, 1040, 1, rec);
  {
    char what[200];
    snprintf(what, sizeof what,
             "primary %u x 512, block 0 staying (trigger, %d us spin), the others leaving at once -> secondary "
             "(%u x 512, 1040 B smem) first block start (globaltimer)",
             pgrid, PR_PDL_SPIN_NS / 1000, rgrid);
    pr_pdl_row(p, rec, 2, 0, "pdl.first_start.decode", what);
    pr_pdl_row(p, rec, 3, 0, "pdl.last_start.decode", "the same, to its last block start (globaltimer)");
  }
  free(rec);
}

/* 8 and 8b: a row for each pass of each kernel (its steps), each launch
 * alone after other code on every SM (the code itself stays in L2, as a
 * round's kernels do); what: the rows' text, taking the steps and the pass */
typedef struct pr_fetch_kernel {
  const void *fn;
  int steps;
} pr_fetch_kernel_t;
static void pr_fetch_rows(pr_t *p, const pr_fetch_kernel_t *k, int nk, const char *tag, const char *what_fmt) {
  const int n = p->trials, all = n + PR_WARM;
  uint64_t *c = (uint64_t *)pr_malloc(sizeof *c * 2 * (size_t)all);
  double *ns = (double *)pr_malloc(sizeof *ns * (size_t)n);
  for (int j = 0; j < nk; j++) {
    for (int t = 0; t < all; t++) {
      uint32_t seed = (uint32_t)t;
      int never = 0;
      void *args[] = {&seed, &t, &p->out, &never};
      pr_evict(p);
      CK(cudaLaunchKernel(k[j].fn, dim3(1), dim3(32), args, 0, p->st));
    }
    pr_sync(p, tag);
    CK(cudaMemcpy(c, p->out, sizeof *c * 2 * (size_t)all, cudaMemcpyDeviceToHost));
    for (int pass = 0; pass < 2; pass++) {
      char step[40], what[200];
      for (int t = 0; t < n; t++)
        ns[t] = (double)c[2 * (t + PR_WARM) + pass] * 1000.0 / p->mhz;
      snprintf(step, sizeof step, "%s.%s.%d", tag, pass ? "second" : "first", k[j].steps);
      snprintf(what, sizeof what, what_fmt, k[j].steps, pass ? "second" : "first");
      pr_row(p, step, what, ns, n);
    }
  }
  free(c);
  free(ns);
}

/* 8. code fetched once per launch: straight-line code of 128, 512 and
 * 2048 steps (nvcc 13 for sm_90: 2.7, 8.8 and 33 KB) */
void pr_code(pr_t *p) {
  static const pr_fetch_kernel_t k[3] = {
      {(const void *)pr_k_code128, 128}, {(const void *)pr_k_code512, 512}, {(const void *)pr_k_code2048, 2048}};
  pr_fetch_rows(p, k, 3, "code",
                "one warp, %d dependent rotate+add steps of straight-line code, %s pass in its launch, after other "
                "code on every SM (clock64)");
}

/* 8b. far jumps: PR_JUMPS of them over 0, 16, 128 and 1024 steps of code
 * each (nvcc 13 for sm_90: 0, 0.3, 2.5 and 20 KB) */
static_assert(PR_JUMPS == 16, "the jump rows' text says 16 jumps");
void pr_jump(pr_t *p) {
  static const pr_fetch_kernel_t k[4] = {{(const void *)pr_k_jump0, 0},
                                         {(const void *)pr_k_jump16, 16},
                                         {(const void *)pr_k_jump128, 128},
                                         {(const void *)pr_k_jump1024, 1024}};
  pr_fetch_rows(p, k, 4, "jump",
                "one warp, 16 dependent steps, each then jumping over %d steps of code, %s pass in its launch, "
                "after other code on every SM (clock64)");
}

/* 11. a launch's first reads: the parameters (a fresh launch each trial,
 * after other code on every SM, as in step 8) and a poll's one read */
void pr_first(pr_t *p) {
  const int n = p->trials, all = n + PR_WARM;
  uint64_t *c = (uint64_t *)pr_malloc(sizeof *c * 3 * (size_t)all);
  double *ns = (double *)pr_malloc(sizeof *ns * (size_t)n);
  static pr_params_t prm;
  for (int t = 0; t < all; t++) {
    for (int w = 0; w < PR_PARAM_WORDS; w++)
      prm.w[w] = (uint64_t)t * PR_PARAM_WORDS + (uint64_t)w;
    pr_evict(p);
    pr_k_param<<<1, 32, 0, p->st>>>(prm, t, p->out);
  }
  pr_sync(p, "parameters");
  CK(cudaMemcpy(c, p->out, sizeof *c * 3 * (size_t)all, cudaMemcpyDeviceToHost));
  static const char *const step[3] = {"param.first", "param.other_line", "param.again"};
  static const char *const what[3] = {
      "one thread, the first read of a kernel parameter in a fresh launch (512 B of parameters; clock64)",
      "the same launch, then a parameter word 256 B further (another line)",
      "the same launch, then the first word again (a constant cache hit)"};
  for (int j = 0; j < 3; j++) {
    for (int t = 0; t < n; t++)
      ns[t] = (double)c[3 * (t + PR_WARM) + j] * 1000.0 / p->mhz;
    pr_row(p, step[j], what[j], ns, n);
  }
  static const char *const pstep[3] = {"poll1.acquire.sys", "poll1.acquire.gpu", "poll1.relaxed.sys"};
  for (int op = 0; op < 3; op++) {
    char pw[200];
    CK(cudaMemsetAsync(p->flags, 0x11, 64, p->st));
    pr_k_poll1<<<1, 1, 0, p->st>>>(p->flags, op, n, p->out);
    pr_sync(p, "poll");
    snprintf(pw, sizeof pw, "one thread, one %s read of a word in L2 that holds its value already (clock64)",
             pstep[op] + 6);
    pr_row_cycles(p, pstep[op], pw, n, 1);
  }
  free(c);
  free(ns);
}

/* 5. a captured graph of one or two empty kernels: 1 x 32, or a block per
 * SM of 512 threads with 40 KB of dynamic shared memory; the second
 * launched as a programmatic dependent where pdl */
static void pr_empty(const pr_t *p, int big, int pdl) {
  pr_launch(p, (const void *)pr_k_empty, big ? (unsigned)p->sms : 1u, big ? 512u : 32u, big ? 40u << 10 : 0u, pdl,
            NULL);
}
void pr_graphs(pr_t *p) {
  static const char *const step[4] = {"graph.1_empty", "graph.2_empty", "graph.1_full", "graph.2_full_pdl"};
  const int reps = p->trials > 300 ? p->trials : 300, batch = PR_GRAPH_BATCH;
  double *ns = (double *)pr_malloc(sizeof *ns * (size_t)reps);
  cudaEvent_t ev[2 * PR_GRAPH_BATCH];
  for (int i = 0; i < 2 * batch; i++)
    CK(cudaEventCreate(&ev[i]));
  for (int k = 0; k < 4; k++) {
    if (k == 3 && p->cc_major < 9) continue;
    cudaGraph_t g;
    cudaGraphExec_t ge;
    char what[200];
    CK(cudaStreamBeginCapture(p->st, cudaStreamCaptureModeThreadLocal));
    pr_empty(p, k >= 2, 0);
    if (k & 1) pr_empty(p, k >= 2, k == 3);
    CK(cudaStreamEndCapture(p->st, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    CK(cudaGraphUpload(ge, p->st));
    /* batches behind a spin, so the GPU never waits for the host to queue
     * a replay; the first batch is warm-up */
    for (int done = -batch; done < reps; done += batch) {
      pr_k_spin<<<1, 1, 0, p->st>>>(2000000ull);
      for (int j = 0; j < batch; j++) {
        CK(cudaEventRecord(ev[2 * j], p->st));
        CK(cudaGraphLaunch(ge, p->st));
        CK(cudaEventRecord(ev[2 * j + 1], p->st));
      }
      pr_sync(p, "graph replay");
      for (int j = 0; j < batch && done >= 0 && done + j < reps; j++) {
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, ev[2 * j], ev[2 * j + 1]));
        ns[done + j] = ms * 1e6;
      }
    }
    snprintf(what, sizeof what, "CUDA events around one replay of %s%s kernel%s (queued back to back)",
             k & 1 ? "two" : "one", k >= 2 ? " empty 1 block per SM x 512 thread, 40 KB smem" : " empty 1 x 32",
             k == 3 ? "s, the second programmatic (wait at its end)" : (k & 1 ? "s" : ""));
    pr_row(p, step[k], what, ns, reps);
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(g));
  }
  for (int i = 0; i < 2 * batch; i++)
    CK(cudaEventDestroy(ev[i]));
  free(ns);
}
