/* mc_probe_memory.cu - mc-probe's steps of memory: dependent loads (1),
 * releases and fences (2), a flag between SMs (3), a warp's piece copy and
 * the block barrier (6), a combine segment's sums (9), a block's count
 * (10): their kernels, then the host side that runs them. */
#include "mc_probe.h"

/* ---- 1. dependent loads ----
 * Every word of the buffer is written, front to back as a grid-stride loop
 * goes; a node (every stride_words words, up to ring_words) holds the
 * address of the next, the last of the ring the first. A chase that starts
 * at the front of a buffer several times L2 finds it evicted by the rest. */
static __global__ void pr_k_chase_init(uint64_t *buf, uint64_t words, uint64_t stride_words, uint64_t ring_words) {
  for (uint64_t w = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; w < words; w += (uint64_t)gridDim.x * blockDim.x)
    buf[w] = w % stride_words || w >= ring_words ? w : (uint64_t)(buf + (w + stride_words) % ring_words);
}
/* One thread follows chain nodes per trial (ld.global.cg: L2, never L1),
 * continuing where the last trial stopped: through the small ring every
 * load hits L2; through the large buffer each node is new, a DRAM miss. */
static __global__ void pr_k_chase(const uint64_t *start, int chain, int trials, uint64_t *out) {
  const uint64_t *p = start;
  for (int i = -PR_WARM; i < trials; i++) {
    const uint64_t t0 = pr_clock();
    for (int j = 0; j < chain; j++)
      p = (const uint64_t *)pr_ld_cg(p);
    const uint64_t t1 = pr_clock_after((uint64_t)p);
    if (i >= 0) out[i] = t1 - t0;
  }
}

/* ---- 2. release operations and fences ----
 * Thread 0 reads the clock just before the operation and again once a
 * relaxed read of the signal word, issued after it, has returned. A
 * release is a fence (wait until this warp's earlier stores, and by
 * cumulativity those a bar.sync ordered before it, are performed at its
 * scope) and then the store or reduction, which the thread does not wait
 * for; the read after it must return the value just written, so it comes
 * back only once that write has reached L2. The span is therefore about when a poller on this
 * GPU could first see the signal: the fence's wait, the write's trip, the
 * read's round trip. The fences alone are followed by the same read, which
 * they hold back. PR_OP_READ is the read alone: subtract it for what an
 * operation adds. The operation is chosen before its clock read, so no
 * branch is timed but the join after it. */
enum {
  PR_OP_READ,
  PR_OP_ST_SYS,
  PR_OP_RED_SYS,
  PR_OP_ST_GPU,
  PR_OP_RED_GPU,
  PR_OP_FENCE_SC_SYS,
  PR_OP_FENCE_AR_GPU,
  PR_OPS
};
/* what the timed warp stored before: nothing, 2 KB (its own piece), or all
 * 16 warps of the block 2 KB each, then a block barrier */
enum { PR_CTX_NONE, PR_CTX_WARP, PR_CTX_BLOCK, PR_CTXS };

/* each case reads the clock, then issues its instruction */
#define PR_TIMED_REL(insn)                                                                                             \
  t0 = pr_clock();                                                                                                     \
  asm volatile(insn " [%0], %1;" ::"l"(p), "l"(v) : "memory");                                                         \
  break
#define PR_TIMED_FENCE(insn)                                                                                           \
  t0 = pr_clock();                                                                                                     \
  asm volatile(insn ";" ::: "memory");                                                                                 \
  break
PR_DEV uint64_t pr_op_timed(int op, uint64_t *p, uint64_t v) {
  uint64_t t0;
  switch (op) {
  case PR_OP_ST_SYS:
    PR_TIMED_REL("st.release.sys.global.u64");
  case PR_OP_RED_SYS:
    PR_TIMED_REL("red.release.sys.global.add.u64");
  case PR_OP_ST_GPU:
    PR_TIMED_REL("st.release.gpu.global.u64");
  case PR_OP_RED_GPU:
    PR_TIMED_REL("red.release.gpu.global.add.u64");
  case PR_OP_FENCE_SC_SYS:
    PR_TIMED_FENCE("fence.sc.sys");
  case PR_OP_FENCE_AR_GPU:
    PR_TIMED_FENCE("fence.acq_rel.gpu");
  default:
    t0 = pr_clock();
    break;
  }
  return t0;
}

static __global__ void __launch_bounds__(512)
    pr_k_release(int op, int ctx, uint64_t *flag, int4 *data, int trials, uint64_t *out) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int i = -PR_WARM; i < trials; i++) {
    /* a quiet start: the block's earlier stores performed, then a pause */
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) pr_spin_ns(2000);
    __syncthreads();
    if (ctx == PR_CTX_BLOCK || (ctx == PR_CTX_WARP && warp == 0))
      for (int q = 0; q < 4; q++)
        pr_st_v4(data + warp * 128 + lane + 32 * q, make_int4(i, lane, q, warp));
    if (ctx == PR_CTX_BLOCK)
      __syncthreads();
    else
      __syncwarp();
    if (threadIdx.x == 0) {
      asm volatile("" : "+l"(flag)); /* in a register before the clock is read */
      const uint64_t t0 = pr_op_timed(op, flag, (uint64_t)(i + PR_WARM + 1));
      const uint64_t t1 = pr_clock_after(pr_ld_relaxed_gpu(flag));
      if (i >= 0) out[i] = t1 - t0;
    }
  }
}

/* ---- 3. a flag round trip between two SMs ----
 * Wait until *p >= v: 0, or 1 once the deadline passed (said in *fail) or
 * the other side gave up. With nap, a __nanosleep between polls, doubling
 * from 32 to 128 ns, as mc_dev_wait_ge sleeps. The deadline is read only
 * every 256 polls, its clock started at the first such reading, so a quick
 * wait is the polls alone. */
PR_DEV int pr_wait_ge(const uint64_t *p, uint64_t v, int sys, int nap, uint32_t *fail) {
  unsigned ns = 32;
  uint64_t t0 = 0;
  for (uint32_t it = 1;; it++) {
    if (pr_ld_acquire(p, sys) >= v) return 0;
    if (nap) {
      __nanosleep(ns);
      if (ns < 128) ns *= 2;
    }
    if ((it & 255u) == 0) {
      if (*(volatile uint32_t *)fail) return 1;
      const uint64_t now = pr_gtimer();
      if (!t0)
        t0 = now;
      else if (now - t0 > PR_DEADLINE_NS) {
        *(volatile uint32_t *)fail = 1;
        return 1;
      }
    }
  }
}
/* Two blocks, each asking for more than half an SM's shared memory so that
 * they run on two SMs; one thread of each. Block 0 sets a = k and waits for
 * b >= k; block 1 waits for a >= k and sets b = k. Block 0 times each round
 * trip with its own clock, keeps PR_BATCH in shared memory (a global store
 * would be one more write for the next release to wait for) and copies
 * them out between batches, behind a fence. sm[] gets both SMs' ids. */
static __global__ void pr_k_pingpong(uint64_t *flags, int sys, int nap, int n, uint32_t *out, uint32_t *sm,
                                     uint32_t *fail) {
  extern __shared__ uint32_t rt[];
  if (threadIdx.x) return;
  uint64_t *a = flags, *b = flags + 16; /* two 128-byte lines */
  uint32_t id;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(id));
  sm[blockIdx.x] = id;
  for (int i = -100; i < n; i++) {
    const uint64_t k = (uint64_t)(i + 101);
    if (blockIdx.x == 1) {
      if (pr_wait_ge(a, k, sys, nap, fail)) return;
      pr_st_release(b, k, sys);
      continue;
    }
    const uint64_t c0 = pr_clock();
    pr_st_release(a, k, sys);
    if (pr_wait_ge(b, k, sys, nap, fail)) return;
    const uint64_t c1 = pr_clock();
    if (i < 0) continue;
    rt[i % PR_BATCH] = (uint32_t)(c1 - c0);
    if (i % PR_BATCH == PR_BATCH - 1 || i == n - 1) {
      for (int j = 0; j <= i % PR_BATCH; j++)
        out[i - i % PR_BATCH + j] = rt[j];
      __threadfence();
    }
  }
}

/* ---- 6. a warp's 2 KB piece, global to global, and the block barrier ----
 * Trial i copies piece i % pieces (step16 16-byte units apart) to dst: each
 * lane's four 16-byte loads in flight together, then its four stores, a
 * __threadfence (the stores performed at GPU scope), then a relaxed read of
 * a stored word to hold the clock until the fence has passed (the read
 * alone is step 2's PR_OP_READ row). */
static __global__ void pr_k_copy(const int4 *src, uint64_t step16, int pieces, int4 *dst, int trials, uint64_t *out) {
  const int lane = threadIdx.x & 31;
  for (int i = -PR_WARM; i < trials; i++) {
    const int4 *s = src + (uint64_t)((i + PR_WARM) % pieces) * step16;
    int4 v[4];
    asm volatile("" : "+l"(s)); /* the address made before the clock is read */
    __syncwarp();
    const uint64_t t0 = pr_clock();
#pragma unroll
    for (int q = 0; q < 4; q++)
      v[q] = pr_ld_v4(s + lane + 32 * q);
#pragma unroll
    for (int q = 0; q < 4; q++)
      pr_st_v4(dst + lane + 32 * q, v[q]);
    __threadfence();
    const uint64_t t1 = pr_clock_after(pr_ld_relaxed_gpu((const uint64_t *)(dst + lane)));
    if (lane == 0 && i >= 0) out[i] = t1 - t0;
  }
}
/* n __syncthreads of the whole block back to back, timed by thread 0 */
static __global__ void __launch_bounds__(512) pr_k_barrier(int n, int trials, uint64_t *out) {
  for (int i = -PR_WARM; i < trials; i++) {
    __syncthreads();
    const uint64_t t0 = pr_clock();
    for (int j = 0; j < n; j++)
      __syncthreads();
    const uint64_t t1 = pr_clock();
    if (threadIdx.x == 0 && i >= 0) out[i] = t1 - t0;
  }
}

/* ---- 9. a combine segment's sums: one warp, rows of 2 KB of bf16 (8
 * values a 16-byte load, four a lane), summed in fp32 as the kernels do
 * (each w * x rounded, then added: no fused multiply-add), two rows' loads
 * in flight at a time as combine-send keeps them; then rounded to bf16
 * (nearest even), stored, __threadfence, and a stored word read back as
 * in step 6. Trial i sums rows i * rows .. of pieces in a ring (step16
 * 16-byte units apart): from L2 where the ring is, never from L1. ---- */
static __global__ void pr_k_sum(const int4 *src, uint64_t step16, int pieces, int rows, int4 *dst, int trials,
                                uint64_t *out) {
  const int lane = threadIdx.x & 31;
  for (int i = -PR_WARM; i < trials; i++) {
    const int first = (int)((uint64_t)(i + PR_WARM) * (uint64_t)rows % (uint64_t)pieces);
    float acc[4][8];
#pragma unroll
    for (int q = 0; q < 4; q++)
#pragma unroll
      for (int e = 0; e < 8; e++) acc[q][e] = 0.0f;
    __syncwarp();
    const uint64_t t0 = pr_clock();
    for (int r = 0; r < rows; r += 2) {
      int4 v[2][4];
#pragma unroll
      for (int j = 0; j < 2; j++)
        if (r + j < rows) {
          const int4 *s = src + (uint64_t)((first + r + j) % pieces) * step16;
#pragma unroll
          for (int q = 0; q < 4; q++) v[j][q] = pr_ld_v4(s + lane + 32 * q);
        }
#pragma unroll
      for (int j = 0; j < 2; j++)
        if (r + j < rows)
#pragma unroll
          for (int q = 0; q < 4; q++) pr_acc16(acc[q], 0.25f + (float)(r + j), v[j][q]);
    }
#pragma unroll
    for (int q = 0; q < 4; q++) pr_st_v4(dst + lane + 32 * q, pr_pack_bf16(acc[q]));
    __threadfence();
    const uint64_t t1 = pr_clock_after(pr_ld_relaxed_gpu((const uint64_t *)(dst + lane)));
    if (lane == 0 && i >= 0) out[i] = t1 - t0;
  }
}

/* the same eight rows summed by a block instead of a warp: 256 threads,
 * 8 bytes of each row a thread, every row's loads in flight, then a
 * barrier; thread 0 times it (what a segment's sums cost spread wider) */
static __global__ void __launch_bounds__(256) pr_k_sum8_block(const int4 *src, uint64_t step16, int pieces, int4 *dst,
                                                              int trials, uint64_t *out) {
  for (int i = -PR_WARM; i < trials; i++) {
    const int first = (int)((uint64_t)(i + PR_WARM) * 8u % (uint64_t)pieces);
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    __syncthreads();
    const uint64_t t0 = pr_clock();
    uint2 v[8];
#pragma unroll
    for (int r = 0; r < 8; r++)
      v[r] = *(const uint2 *)((const char *)(src + (uint64_t)((first + r) % pieces) * step16) + 8 * threadIdx.x);
#pragma unroll
    for (int r = 0; r < 8; r++) {
      const float w = 0.25f + (float)r;
      acc[0] = __fadd_rn(acc[0], __fmul_rn(w, pr_bf16_lo((int)v[r].x)));
      acc[1] = __fadd_rn(acc[1], __fmul_rn(w, pr_bf16_hi((int)v[r].x)));
      acc[2] = __fadd_rn(acc[2], __fmul_rn(w, pr_bf16_lo((int)v[r].y)));
      acc[3] = __fadd_rn(acc[3], __fmul_rn(w, pr_bf16_hi((int)v[r].y)));
    }
    uint2 *d = (uint2 *)((char *)dst + 8 * threadIdx.x);
    *d = make_uint2(pr_to_bf16(acc[0]) | pr_to_bf16(acc[1]) << 16, pr_to_bf16(acc[2]) | pr_to_bf16(acc[3]) << 16);
    __threadfence();
    const uint64_t t1 = pr_clock_after(pr_ld_relaxed_gpu((const uint64_t *)d));
    __syncthreads();
    const uint64_t t2 = pr_clock_after(t1);
    if (threadIdx.x == 0 && i >= 0) out[i] = t2 - t0;
  }
}

/* ---- 10. a block's count at a kernel's end: thread 0 reads the clock,
 * the block's barrier, then its atomicAdd on a global counter, until the
 * old value is back (the last block out learns it is last from it) ---- */
static __global__ void __launch_bounds__(512) pr_k_count(unsigned *ctr, int trials, uint64_t *out) {
  for (int i = -PR_WARM; i < trials; i++) {
    __syncthreads();
    if (threadIdx.x == 0) pr_spin_ns(1000);
    __syncthreads();
    const uint64_t t0 = pr_clock();
    __syncthreads();
    if (threadIdx.x == 0) {
      const unsigned v = atomicAdd(ctr, 1u);
      const uint64_t t1 = pr_clock_after(v);
      if (i >= 0) out[i] = t1 - t0;
    }
  }
}

/* ---- 16. a launch's first loads ----
 * One warp of a fresh launch of one block (its lanes on one word: one
 * request) reads a word of a 2 MB page that is in L2 (the launch before
 * read it too), then a word of another line of that page (its address
 * depends on the first's value, 0), then the first word again;
 * ld.global.cg, so L2 every time, never L1. Timed after a launch that read
 * a word of each of 256 other 2 MB pages on every SM, as a round's other
 * kernels read their own buffers, and after nothing but its own launch
 * before. */
static __global__ void pr_k_touch(const uint64_t *buf, uint64_t stride_words, int pages, uint64_t *sink) {
  uint64_t acc = 0;
  for (int i = threadIdx.x; i < pages; i += blockDim.x)
    acc += pr_ld_cg(buf + (uint64_t)i * stride_words + 16u * blockIdx.x);
  if (acc == 0x9e3779b97f4a7c15ull) *sink = acc;
}
static __global__ void pr_k_first_load(const uint64_t *a, int n, int i, uint64_t *out) {
  const uint64_t t0 = pr_clock();
  const uint64_t v = pr_ld_cg(a);
  const uint64_t t1 = pr_clock_after(v);
  const uint64_t w = pr_ld_cg(a + 16 + v);
  const uint64_t t2 = pr_clock_after(w);
  const uint64_t x = pr_ld_cg(a + w);
  const uint64_t t3 = pr_clock_after(x);
  if (threadIdx.x == 0 && i >= 0) out[i] = t1 - t0, out[n + i] = t2 - t1, out[2 * n + i] = t3 - t2;
}

/* ---- the host side ---- */

/* 1. dependent loads: a ring of 2 MB (L2 hits) and a fresh walk through a
 * buffer of four times L2 and more (DRAM misses). Also 6: a warp's piece
 * copy from either, and the block barrier. */
void pr_loads_copy(pr_t *p) {
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

  pr_k_sum8_block<<<1, 256, 0, p->st>>>((const int4 *)p->small, 128, PR_SMALL_BYTES / 2048, p->dst, n, p->out);
  pr_sync(p, "sums, a block");
  pr_row_cycles(p, "sum8.2K.block",
                "block of 256: 8 rows of 2 KB bf16 from L2, 8 bytes of each a thread, every row's loads in flight, "
                "summed in fp32, rounded, stored, __threadfence, read back, a barrier (clock64)",
                n, 1);

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

/* 16. a launch's first loads, after other pages were read and after nothing */
void pr_first_loads(pr_t *p) {
  const int n = p->trials, pages = 256;
  const uint64_t page = 2u << 20;
  uint64_t *a, *other;
  CK(cudaMalloc(&a, page)); /* a page of its own */
  CK(cudaMemset(a, 0, page));
  CK(cudaMalloc(&other, pages * page));
  CK(cudaMemset(other, 0, pages * page));
  static const char *const after[2] = {"after_others", "alone"};
  static const char *const what[2] = {"after a launch that read a word of 256 other 2 MB pages on every SM",
                                      "after its own launch before, nothing between"};
  for (int v = 0; v < 2; v++) {
    for (int i = -PR_WARM; i < n; i++) {
      if (v == 0) pr_k_touch<<<p->sms, 256, 0, p->st>>>(other, page / 8, pages, p->out + 3 * n);
      pr_k_first_load<<<1, 32, 0, p->st>>>(a, n, i, p->out);
    }
    pr_sync(p, "first loads");
    static const char *const step[3] = {"load.first", "load.next_line", "load.same_line"};
    static const char *const which[3] = {"a launch's first load (ld.global.cg, the line in L2)",
                                         "then a word of another line of the same 2 MB page, in L2",
                                         "then the first word again"};
    for (int k = 0; k < 3; k++) {
      char st[40], wh[200];
      if (k) CK(cudaMemcpy(p->out, p->out + (size_t)k * n, sizeof *p->out * (size_t)n, cudaMemcpyDeviceToDevice));
      snprintf(st, sizeof st, "%s.%s", step[k], after[v]);
      snprintf(wh, sizeof wh, "one warp: %s, %s (clock64)", which[k], what[v]);
      pr_row_cycles(p, st, wh, n, 1);
    }
  }
  CK(cudaFree(a));
  CK(cudaFree(other));
}

/* 2. releases and fences, after nothing, a warp's 2 KB, a block's 32 KB */
void pr_release(pr_t *p) {
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
void pr_flags(pr_t *p) {
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
