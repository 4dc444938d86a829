/* mc_probe.cu - mc-probe: the cost, on the GPU it runs on, of each
 * elementary step a latency-bound dispatch or combine phase is made of
 * (dependent loads, releases and fences, a flag round trip between SMs,
 * programmatic dependent launch, kernels in a CUDA graph, a warp's piece
 * copy, a combine segment's sums, a block barrier and count, the timer
 * itself), so that a per-microsecond
 * ledger of a phase can cite a measurement of every step taken in the same
 * run. Median, p99 and minimum over many trials after warm-up. Needs
 * nothing of the library; the kernels are in mc_probe_kernels.cuh. */
#include <cuda_runtime.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mc_probe_kernels.cuh"

#define PR_ROWS 64
#define PR_PDL_SPIN_NS 20000
#define PR_CHASE_STRIDE 4160 /* bytes between nodes: a few KB, not a power of two (no shared cache sets) */
#define PR_SMALL_BYTES (2u << 20)
#define PR_GRAPH_BATCH 50 /* replays queued behind one spin */

typedef struct {
  char step[40];
  double med, p99, min;
  char what[200];
} pr_row_t;

typedef struct {
  int dev, sms, cc_major, trials, json, rt_ver, drv_ver;
  double mhz, mhz_after, mhz_peak; /* SM clock: measured before and after the measurements, reported peak */
  size_t l2;
  char name[256];
  cudaStream_t st;
  uint64_t *out;   /* device samples, room for every step's */
  uint32_t *fail;  /* set by a wait that passed its deadline */
  uint64_t *small; /* PR_SMALL_BYTES, resident in L2 */
  int4 *dst;       /* 32 KB written by the copies and release contexts */
  uint64_t *flags; /* signal words, each on its own 128-byte line */
  pr_row_t rows[PR_ROWS];
  int nrows;
} pr_t;

/* A tool, not the library: a failed CUDA call ends the run. */
#define CK(call) pr_check((call), #call, __LINE__)
static void pr_check(cudaError_t e, const char *what, int line) {
  if (e == cudaSuccess) return;
  fprintf(stderr, "mc-probe: %s (mc_probe.cu:%d): %s\n", what, line, cudaGetErrorString(e));
  exit(1);
}
static void *pr_malloc(size_t n) {
  void *p = malloc(n);
  if (!p) {
    fprintf(stderr, "mc-probe: out of host memory (%zu bytes)\n", n);
    exit(1);
  }
  return p;
}
/* wait for the stream; a kernel that gave up on a wait ends the run */
static void pr_sync(const pr_t *p, const char *step) {
  CK(cudaGetLastError());
  CK(cudaStreamSynchronize(p->st));
  uint32_t f = 0;
  CK(cudaMemcpy(&f, p->fail, sizeof f, cudaMemcpyDeviceToHost));
  if (f) {
    fprintf(stderr, "mc-probe: %s: a wait passed its %.0f s deadline\n", step, PR_DEADLINE_NS / 1e9);
    exit(1);
  }
}

static int pr_cmp(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}
/* one table row from n samples in ns (sorted here) */
static void pr_row(pr_t *p, const char *step, const char *what, double *ns, int n) {
  if (p->nrows == PR_ROWS || n < 1) {
    fprintf(stderr, "mc-probe: %s: %s\n", step, n < 1 ? "no samples" : "too many rows");
    exit(1);
  }
  qsort(ns, (size_t)n, sizeof *ns, pr_cmp);
  pr_row_t *r = &p->rows[p->nrows++];
  snprintf(r->step, sizeof r->step, "%s", step);
  snprintf(r->what, sizeof r->what, "%s", what);
  r->med = n % 2 ? ns[n / 2] : (ns[n / 2 - 1] + ns[n / 2]) / 2;
  r->p99 = ns[(99 * n + 99) / 100 - 1];
  r->min = ns[0];
}
/* a row from n device samples of cycles, each per steps in ns */
static void pr_row_cycles(pr_t *p, const char *step, const char *what, int n, double per) {
  uint64_t *c = (uint64_t *)pr_malloc(sizeof *c * (size_t)n);
  double *ns = (double *)pr_malloc(sizeof *ns * (size_t)n);
  CK(cudaMemcpy(c, p->out, sizeof *c * (size_t)n, cudaMemcpyDeviceToHost));
  for (int i = 0; i < n; i++)
    ns[i] = (double)c[i] * 1000.0 / p->mhz / per;
  pr_row(p, step, what, ns, n);
  free(c);
  free(ns);
}

/* The SM clock in MHz: cycles over %globaltimer nanoseconds across 20 ms. */
static double pr_clock_mhz(pr_t *p) {
  uint64_t r[2];
  pr_k_clock<<<1, 1, 0, p->st>>>(p->out, 20000000ull);
  pr_sync(p, "clock");
  CK(cudaMemcpy(r, p->out, sizeof r, cudaMemcpyDeviceToHost));
  return r[0] ? (double)r[1] * 1000.0 / (double)r[0] : 0.0;
}

/* 7. the smallest non-zero step of %globaltimer seen, and how often */
static void pr_gtimer_res(pr_t *p) {
  const int n = p->trials;
  uint64_t *h = (uint64_t *)pr_malloc(sizeof *h * (size_t)(n + 1));
  double *ns = (double *)pr_malloc(sizeof *ns * (size_t)n);
  pr_k_gtres<<<1, 1, 0, p->st>>>(p->out, n);
  pr_sync(p, "globaltimer");
  CK(cudaMemcpy(h, p->out, sizeof *h * (size_t)(n + 1), cudaMemcpyDeviceToHost));
  const int got = (int)h[0];
  for (int i = 0; i < got; i++)
    ns[i] = (double)h[1 + i];
  pr_row(p, "globaltimer.step", "non-zero differences of back-to-back %globaltimer reads (min: its resolution)", ns,
         got);
  free(h);
  free(ns);
}

/* 1. dependent loads: a ring of 2 MB (L2 hits) and a fresh walk through a
 * buffer of four times L2 and more (DRAM misses). Also 6: a warp's piece
 * copy from either, and the block barrier. */
static void pr_loads_copy(pr_t *p) {
  const int n = p->trials, chain_l2 = 64, chain_dram = 32;
  const uint64_t sw = PR_CHASE_STRIDE / 8, nodes = (uint64_t)(n + PR_WARM) * chain_dram;
  const uint64_t copy_off = (nodes * PR_CHASE_STRIDE + 4095) / 4096 * 4096; /* bytes: the copies' fresh pieces */
  const uint64_t words = ((copy_off + (uint64_t)(n + PR_WARM) * 4096 + 4 * p->l2) / 8 / sw + 1) * sw;
  uint64_t *big;
  char what[200];
  CK(cudaMalloc(&big, words * 8));
  pr_k_chase_init<<<4 * p->sms, 512, 0, p->st>>>(big, words, sw, words);
  pr_k_chase_init<<<p->sms, 512, 0, p->st>>>(p->small, PR_SMALL_BYTES / 8, sw, PR_SMALL_BYTES / 8 / sw * sw);
  pr_k_chase<<<1, 1, 0, p->st>>>(p->small, chain_l2, n, p->out);
  pr_sync(p, "chase L2");
  snprintf(what, sizeof what, "one thread, ld.global.cg, chain of %d through a 2 MB ring, per load (clock64)",
           chain_l2);
  pr_row_cycles(p, "load.l2_hit", what, n, chain_l2);
  pr_k_chase<<<1, 1, 0, p->st>>>(big, chain_dram, n, p->out);
  pr_sync(p, "chase DRAM");
  snprintf(what, sizeof what, "the same, chain of %d, %d B apart, never revisited, buffer %.0f MB (L2 %.0f MB)",
           chain_dram, PR_CHASE_STRIDE, words * 8 / 1e6, p->l2 / 1e6);
  pr_row_cycles(p, "load.dram_miss", what, n, chain_dram);

  pr_k_copy<<<1, 32, 0, p->st>>>((const int4 *)p->small, 128, PR_SMALL_BYTES / 2048, p->dst, n, p->out);
  pr_sync(p, "copy L2");
  pr_row_cycles(p, "copy2K.src_l2",
                "warp: 4x16 B loads a lane in flight, 4 stores, __threadfence, read of a stored word (clock64)", n, 1);
  pr_k_copy<<<1, 32, 0, p->st>>>((const int4 *)((char *)big + copy_off), 256, n + PR_WARM, p->dst, n, p->out);
  pr_sync(p, "copy DRAM");
  pr_row_cycles(p, "copy2K.src_dram", "the same, each source a fresh piece of the DRAM buffer", n, 1);
  CK(cudaFree(big));

  /* 9: a combine segment's sums, one row (combine-recv's, one source) and
   * eight (combine-send's, top-k 8 on one rank) */
  for (int rows = 1; rows <= 8; rows += 7) {
    char step[40];
    pr_k_sum<<<1, 32, 0, p->st>>>((const int4 *)p->small, 128, PR_SMALL_BYTES / 2048, rows, p->dst, n, p->out);
    pr_sync(p, "sums");
    snprintf(step, sizeof step, "sum%d.2K.src_l2", rows);
    snprintf(what, sizeof what,
             "warp: %d row%s of 2 KB bf16 from L2 summed in fp32 (%s), rounded, stored, __threadfence, read back "
             "(clock64)",
             rows, rows > 1 ? "s" : "", rows > 1 ? "two rows' loads in flight" : "its loads in flight");
    pr_row_cycles(p, step, what, n, 1);
  }

  pr_k_barrier<<<1, 512, 0, p->st>>>(1000, n, p->out);
  pr_sync(p, "barrier");
  pr_row_cycles(p, "syncthreads.512", "__syncthreads of 512 threads, chain of 1000, per barrier (clock64)", n, 1000);
  /* 10: the count every block makes at a kernel's end (a fresh word: the
   * counter of p->flags' last line) */
  pr_k_count<<<1, 512, 0, p->st>>>((unsigned *)(p->flags + 16), n, p->out);
  pr_sync(p, "count");
  pr_row_cycles(p, "count.block",
                "thread 0: a __syncthreads of 512, then an atomicAdd on a global word until its value is back "
                "(clock64)",
                n, 1);
}

/* 2. releases and fences, after nothing, a warp's 2 KB, a block's 32 KB */
static void pr_release(pr_t *p) {
  static const char *const op[PR_OPS] = {"ld.relaxed.gpu",  "st.release.sys", "red.release.sys",  "st.release.gpu",
                                         "red.release.gpu", "fence.sc.sys",   "fence.acq_rel.gpu"};
  static const char *const ctx[PR_CTXS] = {"", "/warp2K", "/block32K"};
  static const char *const ctx_what[PR_CTXS] = {"", " after its warp stored 2 KB (__syncwarp)",
                                                " after 16 warps stored 2 KB each (__syncthreads)"};
  for (int c = 0; c < PR_CTXS; c++)
    for (int o = c ? 1 : 0; o < PR_OPS; o++) {
      char step[40], what[200];
      pr_k_release<<<1, 512, 0, p->st>>>(o, c, p->flags, p->dst, p->trials, p->out);
      pr_sync(p, "release");
      snprintf(step, sizeof step, "%s%s", op[o], ctx[c]);
      snprintf(what, sizeof what, "%s, thread 0%s (clock64)",
               o ? "the op, then a relaxed read of its word" : "a relaxed read of a word alone", ctx_what[c]);
      pr_row_cycles(p, step, what, p->trials, 1);
    }
}

/* 3. one-way flag latency between two SMs: half a round trip */
static void pr_flags(pr_t *p) {
  int per_sm = 0, optin = 0;
  CK(cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, p->dev));
  CK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, p->dev));
  int smem = per_sm / 2 + 1024;
  if (smem > optin) smem = optin;
  if (smem < PR_BATCH * 4) smem = PR_BATCH * 4;
  CK(cudaFuncSetAttribute(pr_k_pingpong, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  const int n = (p->trials + PR_BATCH - 1) / PR_BATCH * PR_BATCH; /* at least 1000 exchanges */
  uint32_t *c = (uint32_t *)pr_malloc(sizeof *c * (size_t)n);
  double *ns = (double *)pr_malloc(sizeof *ns * (size_t)n);
  for (int v = 0; v < 4; v++) {
    const int sys = v < 2, nap = v & 1;
    uint32_t sm[2];
    char step[40], what[200];
    CK(cudaMemsetAsync(p->flags, 0, 256, p->st));
    pr_k_pingpong<<<2, 32, (size_t)smem, p->st>>>(p->flags, sys, nap, n, (uint32_t *)p->out, (uint32_t *)(p->out + n),
                                                  p->fail);
    pr_sync(p, "flag round trip");
    CK(cudaMemcpy(c, p->out, sizeof *c * (size_t)n, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(sm, p->out + n, sizeof sm, cudaMemcpyDeviceToHost));
    for (int i = 0; i < n; i++)
      ns[i] = c[i] * 1000.0 / p->mhz / 2;
    snprintf(step, sizeof step, "flag.one_way.%s%s", sys ? "sys" : "gpu", nap ? ".nap" : "");
    snprintf(what, sizeof what, "round trip / 2, st.release.%s + ld.acquire.%s polls%s, SMs %u and %u%s (clock64)",
             sys ? "sys" : "gpu", sys ? "sys" : "gpu", nap ? " with __nanosleep 32..128 ns" : "", sm[0], sm[1],
             sm[0] == sm[1] ? " (ONE SM: not what is meant)" : "");
    pr_row(p, step, what, ns, n);
  }
  free(c);
  free(ns);
}

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

/* 4. programmatic dependent launch: a primary of a block per SM that
 * triggers at its start and spins, then a secondary of grid blocks, with
 * the attribute (pdl) or without */
static void pr_pdl_pair(pr_t *p, int grid, int pdl, uint64_t *rec) {
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
    pr_k_primary<<<p->sms, 512, 0, p->st>>>(r, PR_PDL_SPIN_NS);
    pr_launch(p, (const void *)pr_k_secondary, (unsigned)grid, 512, 0, pdl, args);
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
static void pr_pdl(pr_t *p) {
  uint64_t *rec = (uint64_t *)pr_malloc(sizeof *rec * 5 * (size_t)(p->trials + PR_WARM));
  const int grids[2] = {1, p->sms};
  for (int g = 0; g < 2; g++) {
    char step[40], what[200];
    pr_pdl_pair(p, grids[g], 1, rec);
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
    pr_pdl_pair(p, grids[g], 0, rec);
    snprintf(step, sizeof step, "launch_gap.%d", grids[g]);
    snprintf(what, sizeof what,
             "no attribute: primary's last block end -> secondary (%d x 512) first block start "
             "(globaltimer)",
             grids[g]);
    pr_pdl_row(p, rec, 2, 1, step, what);
  }
  free(rec);
}

/* 8. code fetched once per launch: straight-line code of 128, 512 and
 * 2048 steps (nvcc 13 for sm_90: 2.7, 8.8 and 33 KB), its first pass in
 * each launch and its second, each launch after 8192 steps of other code
 * on every SM (the code itself stays in L2, as a round's kernels do) */
static void pr_code(pr_t *p) {
  static const struct {
    const void *fn;
    int steps;
  } k[3] = {{(const void *)pr_k_code128, 128}, {(const void *)pr_k_code512, 512}, {(const void *)pr_k_code2048, 2048}};
  const int n = p->trials, all = n + PR_WARM;
  uint64_t *c = (uint64_t *)pr_malloc(sizeof *c * 2 * (size_t)all);
  double *ns = (double *)pr_malloc(sizeof *ns * (size_t)n);
  for (int j = 0; j < 3; j++) {
    for (int t = 0; t < all; t++) {
      uint32_t seed = (uint32_t)t;
      int spare = all; /* the evicting kernel's samples go past the trials' */
      void *args[] = {&seed, &t, &p->out}, *eargs[] = {&seed, &spare, &p->out};
      CK(cudaLaunchKernel((const void *)pr_k_code_evict, dim3((unsigned)p->sms), dim3(32), eargs, 0, p->st));
      CK(cudaLaunchKernel(k[j].fn, dim3(1), dim3(32), args, 0, p->st));
    }
    pr_sync(p, "code");
    CK(cudaMemcpy(c, p->out, sizeof *c * 2 * (size_t)all, cudaMemcpyDeviceToHost));
    for (int pass = 0; pass < 2; pass++) {
      char step[40], what[200];
      for (int t = 0; t < n; t++)
        ns[t] = (double)c[2 * (t + PR_WARM) + pass] * 1000.0 / p->mhz;
      snprintf(step, sizeof step, "code.%s.%d", pass ? "second" : "first", k[j].steps);
      snprintf(what, sizeof what,
               "one warp, %d dependent rotate+add steps of straight-line code, %s pass in its launch, after other "
               "code on every SM (clock64)",
               k[j].steps, pass ? "second" : "first");
      pr_row(p, step, what, ns, n);
    }
  }
  free(c);
  free(ns);
}

/* 11. a launch's first reads: the parameters (a fresh launch each trial,
 * after other code on every SM, as in step 8) and a poll's one read */
static void pr_first(pr_t *p) {
  const int n = p->trials, all = n + PR_WARM;
  uint64_t *c = (uint64_t *)pr_malloc(sizeof *c * 3 * (size_t)all);
  double *ns = (double *)pr_malloc(sizeof *ns * (size_t)n);
  static pr_params_t prm;
  for (int t = 0; t < all; t++) {
    uint32_t seed = (uint32_t)t;
    int spare = 2 * all; /* the evicting kernel's samples go past the trials' */
    void *eargs[] = {&seed, &spare, &p->out};
    for (int w = 0; w < PR_PARAM_WORDS; w++)
      prm.w[w] = (uint64_t)t * PR_PARAM_WORDS + (uint64_t)w;
    CK(cudaLaunchKernel((const void *)pr_k_code_evict, dim3((unsigned)p->sms), dim3(32), eargs, 0, p->st));
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

/* 12. the bulk of a 128-token phase of the DeepSeek-V3 layer on one GPU:
 * a copy as dispatch-recv's (128 fp8 records of 4 pieces into 8 local
 * experts each, on a grid of half the SMs, of which the first 32 blocks
 * take the pieces) and combine-send's sums (128 tokens of 7 segments of
 * bf16, 8 experts' rows each, on a block per SM, of which the first 56
 * take them); an empty grid of each for the span of starting and ending
 * the blocks alone */
static void pr_bulk(pr_t *p) {
  const int n = p->trials, all = n + PR_WARM, src_pieces = 8192; /* 16 MB of sources: the rows, in L2 */
  int4 *src, *dst;
  CK(cudaMalloc(&src, (size_t)src_pieces * 2048));
  CK(cudaMalloc(&dst, (size_t)16 << 20));
  CK(cudaMemsetAsync(src, 0x3c, (size_t)src_pieces * 2048, p->st));
  uint64_t *c = (uint64_t *)pr_malloc(sizeof *c * 2 * (size_t)all);
  double *ns = (double *)pr_malloc(sizeof *ns * (size_t)n);
  static const struct {
    const char *step;
    int half, items, rows, fan;
    const char *what;
  } b[4] = {
      {"bulk.fan8.512", 1, 512, 1, 8, "512 pieces of 2 KB from L2, each stored to 8 places (8 MB)"},
      {"bulk.fan_empty", 1, 0, 1, 8, "the same grid, no items"},
      {"bulk.sum8.896", 0, 896, 8, 1, "896 sums of 8 pieces of 2 KB from L2 (14.7 MB) in fp32, each stored once"},
      {"bulk.sum_empty", 0, 0, 8, 1, "the same grid, no items"},
  };
  for (int k = 0; k < 4; k++) {
    const unsigned grid = b[k].half ? (unsigned)(p->sms + 1) / 2 : (unsigned)p->sms;
    char what[200];
    CK(cudaMemsetAsync(p->out, 0xff, sizeof *c * 2 * (size_t)all, p->st));
    for (int t = 0; t < all; t++) {
      pr_k_spin<<<1, 1, 0, p->st>>>(5000); /* the previous trial's stores drained */
      pr_k_bulk<<<grid, 512, 0, p->st>>>(src, src_pieces, b[k].items, b[k].rows, b[k].fan, dst, t, p->out);
    }
    pr_sync(p, "bulk");
    CK(cudaMemcpy(c, p->out, sizeof *c * 2 * (size_t)all, cudaMemcpyDeviceToHost));
    for (int t = 0; t < n; t++)
      ns[t] = (double)(~c[2 * (t + PR_WARM) + 1] - c[2 * (t + PR_WARM)]);
    snprintf(what, sizeof what, "%s, a warp an item, %u blocks x 512: first block start to last block end (globaltimer)",
             b[k].what, grid);
    pr_row(p, b[k].step, what, ns, n);
  }
  CK(cudaFree(src));
  CK(cudaFree(dst));
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
static void pr_graphs(pr_t *p) {
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

static void pr_json_str(const char *s) {
  putchar('"');
  for (; *s; s++)
    if (*s == '"' || *s == '\\')
      printf("\\%c", *s);
    else if ((unsigned char)*s >= 0x20)
      putchar(*s);
  putchar('"');
}
static void pr_print(const pr_t *p) {
  char date[32];
  const time_t now = time(NULL);
  struct tm tm;
  strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", gmtime_r(&now, &tm));
  const char *timer =
      "ns; clock64 rows converted with the SM clock measured against globaltimer over 20 ms before them";
  if (p->json) {
    printf("{\"tool\":\"mc-probe\",\"device\":");
    pr_json_str(p->name);
    printf(",\"sm_count\":%d,\"compute_capability\":%d,\"l2_bytes\":%zu,\"sm_clock_mhz_measured\":%.1f,"
           "\"sm_clock_mhz_measured_after\":%.1f,\"sm_clock_mhz_peak\":%.1f,\"cuda_runtime\":\"%d.%d\","
           "\"cuda_driver\":\"%d.%d\",\"date\":\"%s\",\"trials\":%d,\"times\":",
           p->sms, p->cc_major, p->l2, p->mhz, p->mhz_after, p->mhz_peak, p->rt_ver / 1000, p->rt_ver % 1000 / 10,
           p->drv_ver / 1000, p->drv_ver % 1000 / 10, date, p->trials);
    pr_json_str(timer);
    printf(",\"steps\":[");
    for (int i = 0; i < p->nrows; i++) {
      const pr_row_t *r = &p->rows[i];
      printf("%s{\"step\":", i ? "," : "");
      pr_json_str(r->step);
      printf(",\"median_ns\":%.1f,\"p99_ns\":%.1f,\"min_ns\":%.1f,\"what\":", r->med, r->p99, r->min);
      pr_json_str(r->what);
      putchar('}');
    }
    printf("]}\n");
    return;
  }
  printf("mc-probe: %s, %d SMs, L2 %.0f MB, SM clock %.0f MHz measured (%.0f after), %.0f MHz peak; CUDA %d.%d, "
         "driver %d.%d; %s; %d trials\ntimes in %s\n\n",
         p->name, p->sms, p->l2 / 1e6, p->mhz, p->mhz_after, p->mhz_peak, p->rt_ver / 1000, p->rt_ver % 1000 / 10,
         p->drv_ver / 1000, p->drv_ver % 1000 / 10, date, p->trials, timer);
  printf("%-30s %9s %9s %9s  %s\n", "step", "median", "p99", "min", "what");
  for (int i = 0; i < p->nrows; i++) {
    const pr_row_t *r = &p->rows[i];
    printf("%-30s %9.1f %9.1f %9.1f  %s\n", r->step, r->med, r->p99, r->min, r->what);
  }
}

static void pr_usage(FILE *f) {
  fputs("mc-probe: the cost of each elementary step of a latency-bound dispatch or combine\n"
        "phase on this GPU: dependent loads (L2, DRAM), releases and fences at system and\n"
        "GPU scope, a flag round trip between SMs, programmatic dependent launch, kernels\n"
        "in a CUDA graph, a warp's 2 KB copy, a combine segment's sums, a block barrier\n"
        "and count, code fetched at a launch, a launch's first reads (its parameters, a\n"
        "poll's one read), the bulk of a 128-token phase, globaltimer's resolution.\n"
        "\n"
        "  --trials N   samples per step after warm-up (10..100000)   [200]\n"
        "  --json       one JSON object on stdout instead of the table\n"
        "  -h, --help   this text\n"
        "\n"
        "Exit status: 0, or 1 when a CUDA call fails or a wait passes its deadline.\n",
        f);
}

int main(int argc, char **argv) {
  static pr_t p;
  p.trials = 200;
  static const struct option longs[] = {{"trials", 1, 0, 't'}, {"json", 0, 0, 'j'}, {"help", 0, 0, 'h'}, {0, 0, 0, 0}};
  int ch;
  while ((ch = getopt_long(argc, argv, "h", longs, NULL)) != -1) {
    switch (ch) {
    case 't': {
      char *end;
      const long v = strtol(optarg, &end, 10);
      if (*end || v < 10 || v > 100000) {
        fprintf(stderr, "mc-probe: --trials wants 10..100000, not %s\n", optarg);
        return 2;
      }
      p.trials = (int)v;
      break;
    }
    case 'j':
      p.json = 1;
      break;
    case 'h':
      pr_usage(stdout);
      return 0;
    default:
      pr_usage(stderr);
      return 2;
    }
  }
  if (optind < argc) {
    pr_usage(stderr);
    return 2;
  }
  int l2 = 0, khz = 0;
  struct cudaDeviceProp prop;
  CK(cudaGetDevice(&p.dev));
  CK(cudaGetDeviceProperties(&prop, p.dev));
  snprintf(p.name, sizeof p.name, "%s", prop.name);
  CK(cudaDeviceGetAttribute(&p.sms, cudaDevAttrMultiProcessorCount, p.dev));
  CK(cudaDeviceGetAttribute(&p.cc_major, cudaDevAttrComputeCapabilityMajor, p.dev));
  CK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, p.dev));
  CK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, p.dev));
  CK(cudaRuntimeGetVersion(&p.rt_ver));
  CK(cudaDriverGetVersion(&p.drv_ver));
  p.l2 = (size_t)l2;
  p.mhz_peak = khz / 1000.0;
  CK(cudaStreamCreateWithFlags(&p.st, cudaStreamNonBlocking));
  const size_t out_words = 5 * (size_t)(p.trials + PR_WARM) + (size_t)p.trials + PR_BATCH + 16;
  CK(cudaMalloc(&p.out, out_words * 8));
  CK(cudaMalloc(&p.fail, sizeof *p.fail));
  CK(cudaMemset(p.fail, 0, sizeof *p.fail));
  CK(cudaMalloc(&p.small, PR_SMALL_BYTES));
  CK(cudaMalloc(&p.dst, 32 << 10));
  CK(cudaMalloc(&p.flags, 256));
  CK(cudaMemset(p.flags, 0, 256));

  pr_gtimer_res(&p);
  p.mhz = pr_clock_mhz(&p);
  if (p.mhz <= 0) {
    fprintf(stderr, "mc-probe: globaltimer did not advance: no clock to convert cycles with\n");
    return 1;
  }
  pr_loads_copy(&p);
  pr_release(&p);
  pr_flags(&p);
  if (p.cc_major >= 9) pr_pdl(&p); /* griddepcontrol needs sm_90 */
  pr_graphs(&p);
  pr_code(&p);
  pr_first(&p);
  pr_bulk(&p);
  p.mhz_after = pr_clock_mhz(&p);
  pr_print(&p);
  if (p.mhz_after < 0.98 * p.mhz || p.mhz_after > 1.02 * p.mhz)
    fprintf(stderr, "mc-probe: the SM clock moved during the run (%.0f -> %.0f MHz): clock64 rows are approximate\n",
            p.mhz, p.mhz_after);
  CK(cudaFree(p.out));
  CK(cudaFree(p.fail));
  CK(cudaFree(p.small));
  CK(cudaFree(p.dst));
  CK(cudaFree(p.flags));
  CK(cudaStreamDestroy(p.st));
  return 0;
}
