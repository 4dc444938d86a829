/* mc_probe_bulk.cu - mc-probe's step 12: the bulk of a 128-token phase,
 * each kernel's copies or sums on its own grid, and the sends beside
 * dispatch-recv's pollers: the kernels, then the host side. */
#include "mc_probe.h"

/* ---- 12. the bulk of a 128-token phase on one GPU: items of 2 KB over
 * a grid laid out as the phase's kernel is (blocks, threads, how items
 * are dealt). fan > 0: a piece loaded once and stored to fan places, the
 * places dealt among shares warps (dispatch-recv's copy into every local
 * expert's slot); fan 0: rows pieces summed in fp32 and stored once
 * (combine's sums), a warp each (two rows' loads in flight, as in step
 * 9). Units dealt to blocks first (dealt) or block by block. Sources in
 * L2 (src_pieces of them, a ring), as the senders' stores leave them.
 * Thread 0 of each block folds its start and end (%globaltimer) into
 * out[2 * trial] (minimum start) and out[2 * trial + 1] (the complement of
 * the latest end), both set to all ones before: first block start to last
 * block end. ---- */
typedef struct pr_bulk_shape {
  int items, rows, fan, shares, dealt;
} pr_bulk_shape_t;
static __global__ void __launch_bounds__(512) pr_k_bulk(const int4 *src, int src_pieces, pr_bulk_shape_t b, int4 *dst,
                                                      int trial, uint64_t *out) {
  const int lane = threadIdx.x & 31, wb = threadIdx.x >> 5, wpb = blockDim.x >> 5;
  const int first = b.dealt ? wb * (int)gridDim.x + (int)blockIdx.x : (int)blockIdx.x * wpb + wb;
  const int step = (int)gridDim.x * wpb;
  if (threadIdx.x == 0) atomicMin((unsigned long long *)&out[2 * trial], (unsigned long long)pr_gtimer());
  for (int u = first; u < b.items * b.shares; u += step) {
    const int it = u / b.shares, g = u % b.shares;
    if (b.fan > 0) {
      int4 v[4];
      const int4 *sp = src + (uint64_t)(it % src_pieces) * 128;
#pragma unroll
      for (int q = 0; q < 4; q++) v[q] = sp[lane + 32 * q];
      for (int j = g; j < b.fan; j += b.shares) {
        int4 *d = dst + ((uint64_t)j * b.items + it) * 128;
#pragma unroll
        for (int q = 0; q < 4; q++) d[lane + 32 * q] = v[q];
      }
      continue;
    }
    float acc[4][8];
#pragma unroll
    for (int q = 0; q < 4; q++)
#pragma unroll
      for (int e = 0; e < 8; e++) acc[q][e] = 0.0f;
    for (int r = 0; r < b.rows; r += 2) {
      int4 w[2][4];
#pragma unroll
      for (int j = 0; j < 2; j++)
        if (r + j < b.rows) {
          const int4 *sp = src + (uint64_t)(((uint64_t)it * b.rows + r + j) % src_pieces) * 128;
#pragma unroll
          for (int q = 0; q < 4; q++) w[j][q] = pr_ld_v4(sp + lane + 32 * q);
        }
#pragma unroll
      for (int j = 0; j < 2; j++)
        if (r + j < b.rows)
#pragma unroll
          for (int q = 0; q < 4; q++) pr_acc16(acc[q], 0.25f + (float)(r + j), w[j][q]);
    }
    int4 *d = dst + (uint64_t)it * 128;
#pragma unroll
    for (int q = 0; q < 4; q++) d[lane + 32 * q] = pr_pack_bf16(acc[q]);
  }
  __syncthreads();
  if (threadIdx.x == 0) atomicMin((unsigned long long *)&out[2 * trial + 1], ~(unsigned long long)pr_gtimer());
}

/* dispatch-recv's blocks waiting for the metas while dispatch-send sends:
 * threads below n poll a word each (relaxed, system scope, naps of 32 to
 * 128 ns as mc_dev_wait's where a rank has its GPU alone) for ns; no
 * word ever carries what they wait for */
static __global__ void pr_k_poll(const uint64_t *words, int n, uint64_t ns) {
  const uint64_t t0 = pr_gtimer();
  if ((int)threadIdx.x >= n) return;
  unsigned nap = 32;
  for (uint32_t it = 1;; it++) {
    if (pr_ld_relaxed_sys(words + threadIdx.x) == ~0ull) return;
    __nanosleep(nap);
    if (nap < 128) nap *= 2;
    if ((it & 15u) == 0 && pr_gtimer() - t0 > ns) return;
  }
}

/* ---- the host side ---- */

/* 12. the bulk of a 128-token phase of the DeepSeek-V3 layer on one GPU,
 * each on the grid its kernel has at 128 tokens on a GPU alone:
 * dispatch-send's stores (512 pieces, a warp each, on a quarter of the
 * SMs, to one rank), dispatch-recv's copy (128 fp8 records of 4 pieces
 * into 8 local experts each, two warps a piece, on half the SMs),
 * combine-send's sums (128 tokens of 7 segments of bf16, 8 experts' rows
 * each, a block of 256 an SM) and combine-recv's (one source's row each,
 * on half the SMs); an empty grid of each for the span of starting and
 * ending the blocks */
void pr_bulk(pr_t *p) {
  const int n = p->trials, all = n + PR_WARM, src_pieces = 8192; /* 16 MB of sources: the rows, in L2 */
  int4 *src, *dst;
  uint64_t *words;
  CK(cudaMalloc(&src, (size_t)src_pieces * 2048));
  CK(cudaMalloc(&dst, (size_t)16 << 20));
  CK(cudaMalloc(&words, 4096));
  CK(cudaMemsetAsync(src, 0x3c, (size_t)src_pieces * 2048, p->st));
  CK(cudaMemsetAsync(words, 0, 4096, p->st));
  /* polled rows: room for one block an SM only, so that senders and
   * pollers hold SMs apart, as the library's kernels' registers make them */
  const int apart = 120 << 10, meta_words = 257; /* one source's meta at 256 local experts */
  CK(cudaFuncSetAttribute(pr_k_bulk, cudaFuncAttributeMaxDynamicSharedMemorySize, apart));
  CK(cudaFuncSetAttribute(pr_k_poll, cudaFuncAttributeMaxDynamicSharedMemorySize, apart));
  cudaStream_t st2;
  cudaEvent_t e1, e2;
  CK(cudaStreamCreateWithFlags(&st2, cudaStreamNonBlocking));
  CK(cudaEventCreateWithFlags(&e1, cudaEventDisableTiming));
  CK(cudaEventCreateWithFlags(&e2, cudaEventDisableTiming));
  uint64_t *c = (uint64_t *)pr_malloc(sizeof *c * 2 * (size_t)all);
  double *ns = (double *)pr_malloc(sizeof *ns * (size_t)n);
  static const struct {
    const char *step;
    int div, blocks, threads, polled; /* the grid: blocks, or the SMs / div; polled: 1 beside pollers, 2 the
                                         same shared memory alone */
    pr_bulk_shape_t b;
    const char *what;
  } b[14] = {
      {"bulk.send.512", 4, 0, 512, 0, {512, 1, 1, 1, 0}, "512 pieces of 2 KB from L2, each stored once (1 MB), a warp a piece"},
      {"bulk.send.512.polled", 4, 0, 512, 1, {512, 1, 1, 1, 0},
       "the same beside dispatch-recv's pollers (half the SMs, 257 words a block), one block an SM"},
      {"bulk.send.512.apart", 4, 0, 512, 2, {512, 1, 1, 1, 0}, "the same with no pollers, one block an SM"},
      {"bulk.send_empty", 4, 0, 512, 0, {0, 1, 1, 1, 0}, "the same grid, no items"},
      {"bulk.send.4", 0, 1, 512, 0, {4, 1, 1, 1, 0}, "1 token's 4 pieces of 2 KB from L2, each stored once, a warp a piece"},
      {"bulk.send.4.polled", 0, 1, 512, 1, {4, 1, 1, 1, 0},
       "the same beside dispatch-recv's pollers (half the SMs, 257 words a block), one block an SM"},
      {"bulk.send.4.apart", 0, 1, 512, 2, {4, 1, 1, 1, 0}, "the same with no pollers, one block an SM"},
      {"bulk.fan8.512", 2, 0, 512, 0, {512, 1, 8, 2, 1},
       "512 pieces of 2 KB from L2, each stored to 8 places (8 MB), two warps a piece (4 places each), dealt to "
       "blocks first"},
      {"bulk.fan_empty", 2, 0, 512, 0, {0, 1, 8, 2, 1}, "the same grid, no items"},
      {"bulk.sum8.896", 1, 0, 256, 0, {896, 8, 0, 1, 1},
       "896 sums of 8 pieces of 2 KB from L2 (14.7 MB) in fp32, each stored once, a warp a sum, dealt to blocks first"},
      {"bulk.sum8_empty", 1, 0, 256, 0, {0, 8, 0, 1, 1}, "the same grid, no items"},
      {"bulk.sum1.896", 2, 0, 512, 0, {896, 1, 0, 1, 0},
       "896 pieces of 2 KB from L2 converted to fp32 and back, stored once, a warp a piece"},
      {"bulk.sum1_empty", 2, 0, 512, 0, {0, 1, 0, 1, 0}, "the same grid, no items"},
      {NULL, 0, 0, 0, 0, {0, 0, 0, 0, 0}, NULL},
  };
  for (int k = 0; b[k].step; k++) {
    const unsigned grid = b[k].blocks ? (unsigned)b[k].blocks : (unsigned)(p->sms + b[k].div - 1) / (unsigned)b[k].div;
    const unsigned pollers = (unsigned)(p->sms + 1) / 2;
    char what[200];
    CK(cudaMemsetAsync(p->out, 0xff, sizeof *c * 2 * (size_t)all, p->st));
    for (int t = 0; t < all; t++) {
      if (b[k].polled == 1) { /* the pollers first, for PR_POLL_NS; the senders after a spin, on a stream of their own */
        CK(cudaEventRecord(e1, p->st));
        CK(cudaStreamWaitEvent(st2, e1, 0));
        pr_k_poll<<<pollers, 512, apart, p->st>>>(words, meta_words, PR_POLL_NS);
        pr_k_spin<<<1, 1, 0, st2>>>(5000);
        pr_k_bulk<<<grid, (unsigned)b[k].threads, apart, st2>>>(src, src_pieces, b[k].b, dst, t, p->out);
        CK(cudaEventRecord(e2, st2));
        CK(cudaStreamWaitEvent(p->st, e2, 0));
        continue;
      }
      pr_k_spin<<<1, 1, 0, p->st>>>(5000); /* the previous trial's stores drained */
      pr_k_bulk<<<grid, (unsigned)b[k].threads, b[k].polled ? apart : 0, p->st>>>(src, src_pieces, b[k].b, dst, t,
                                                                                p->out);
    }
    pr_sync(p, "bulk");
    CK(cudaMemcpy(c, p->out, sizeof *c * 2 * (size_t)all, cudaMemcpyDeviceToHost));
    for (int t = 0; t < n; t++)
      ns[t] = (double)(~c[2 * (t + PR_WARM) + 1] - c[2 * (t + PR_WARM)]);
    snprintf(what, sizeof what, "%s, %u blocks x %d: first block start to last block end (globaltimer)", b[k].what,
             grid, b[k].threads);
    pr_row(p, b[k].step, what, ns, n);
  }
  CK(cudaStreamDestroy(st2));
  CK(cudaEventDestroy(e1));
  CK(cudaEventDestroy(e2));
  CK(cudaFree(words));
  CK(cudaFree(src));
  CK(cudaFree(dst));
  free(c);
  free(ns);
}
