/* mc_probe.h - what the files of mc-probe share. mc-probe times, on the
 * GPU it runs on, each elementary step a latency-bound dispatch or combine
 * phase is made of, performed with the instructions src/gpu/mc_dev.cuh
 * uses; each kernel writes one sample per trial after PR_WARM untimed ones.
 * Steps on one SM are timed with %clock64 (SM cycles; the host converts
 * them with the SM clock it measures against %globaltimer); steps that span
 * SMs or kernels with %globaltimer, one clock for the whole GPU. Every wait
 * ends: polls give up after PR_DEADLINE_NS and say so in *fail, timed spins
 * stop by %globaltimer or after as many polls as nanoseconds.
 *   mc_probe.cu         the run: the SM clock, the timer's resolution, the table, main
 *   mc_probe_memory.cu  loads (a launch's first too), releases and fences, flags, copies, sums, counts
 *   mc_probe_bulk.cu    the bulk of a phase on each kernel's grid, also beside pollers
 *   mc_probe_launch.cu  dependent launches, graph replays, code fetched, a launch's first reads
 *   mc_probe_prep.cu    the block prep, the slot bases and a 1-token sending block, by the
 *                       library's own functions, warm and as their code's first execution */
#ifndef MC_PROBE_H
#define MC_PROBE_H

#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>

#define PR_DEV __device__ __forceinline__
#define PR_DEADLINE_NS 1000000000ull
#define PR_WARM 16
#define PR_BATCH 1000 /* round trips kept in shared memory between copies out */

/* Timer reads are asm volatile with a memory clobber: the compiler keeps
 * every memory access on its side of them. */
PR_DEV uint64_t pr_clock(void) {
  uint64_t t;
  asm volatile("mov.u64 %0, %%clock64;" : "=l"(t)::"memory");
  return t;
}
PR_DEV uint64_t pr_gtimer(void) {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)::"memory");
  return t;
}
/* The clock once v has arrived. A clock read does not wait for a load in
 * flight; the shared store reads v, so the warp stalls there until the load
 * that produced v returns, and the clock is read after it. */
PR_DEV uint64_t pr_clock_after(uint64_t v) {
  __shared__ uint64_t sink;
  asm volatile("st.volatile.shared.u64 [%0], %1;" ::"r"((uint32_t)__cvta_generic_to_shared(&sink)), "l"(v) : "memory");
  return pr_clock();
}
/* Wait ns by %globaltimer (at most ns polls, should it stand still);
 * returns the last reading. */
PR_DEV uint64_t pr_spin_ns(uint64_t ns) {
  const uint64_t t0 = pr_gtimer();
  uint64_t t = t0;
  for (uint64_t it = 0; it < ns && t - t0 < ns; it++)
    t = pr_gtimer();
  return t;
}

PR_DEV uint64_t pr_ld_cg(const uint64_t *p) {
  uint64_t v;
  asm volatile("ld.global.cg.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
PR_DEV uint64_t pr_ld_relaxed_gpu(const uint64_t *p) {
  uint64_t v;
  asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
/* a meta word's poll (mc_word_load), at system scope */
PR_DEV uint64_t pr_ld_relaxed_sys(const uint64_t *p) {
  uint64_t v;
  asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
/* the signal operations of mc_dev.cuh, at the scope sys asks for */
PR_DEV uint64_t pr_ld_acquire(const uint64_t *p, int sys) {
  uint64_t v;
  if (sys)
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  else
    asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
PR_DEV void pr_st_release(uint64_t *p, uint64_t v, int sys) {
  if (sys)
    asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
  else
    asm volatile("st.release.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
/* 16-byte accesses as a piece copy makes them (plain ld.global: through L1) */
PR_DEV int4 pr_ld_v4(const int4 *p) {
  int4 v;
  asm volatile("ld.global.v4.s32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p)
               : "memory");
  return v;
}
PR_DEV void pr_st_v4(int4 *p, int4 v) {
  asm volatile("st.global.v4.s32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
}
PR_DEV void pr_launch_dependents(void) {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
PR_DEV void pr_dep_wait(void) {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}


/* bf16 as the kernels treat it (steps 9 and 12): a word's two values
 * widened to fp32, rounding to nearest even, 8 values of a 16-byte load
 * each w * x rounded then added (no fused multiply-add) */
PR_DEV float pr_bf16_lo(int w) { return __int_as_float(w << 16); }
PR_DEV float pr_bf16_hi(int w) { return __int_as_float(w & (int)0xffff0000); }
PR_DEV uint32_t pr_to_bf16(float f) {
  const uint32_t u = (uint32_t)__float_as_int(f);
  return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
}
PR_DEV void pr_acc16(float acc[8], float w, int4 v) {
  const int x[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int e = 0; e < 4; e++) {
    acc[2 * e] = __fadd_rn(acc[2 * e], __fmul_rn(w, pr_bf16_lo(x[e])));
    acc[2 * e + 1] = __fadd_rn(acc[2 * e + 1], __fmul_rn(w, pr_bf16_hi(x[e])));
  }
}
/* a lane's 8 sums rounded to bf16, two a word */
PR_DEV int4 pr_pack_bf16(const float acc[8]) {
  int4 o;
  o.x = (int)(pr_to_bf16(acc[0]) | pr_to_bf16(acc[1]) << 16);
  o.y = (int)(pr_to_bf16(acc[2]) | pr_to_bf16(acc[3]) << 16);
  o.z = (int)(pr_to_bf16(acc[4]) | pr_to_bf16(acc[5]) << 16);
  o.w = (int)(pr_to_bf16(acc[6]) | pr_to_bf16(acc[7]) << 16);
  return o;
}

/* ---- the host side ---- */
#define PR_ROWS 128
#define PR_PDL_SPIN_NS 20000
#define PR_POLL_NS 30000 /* the pollers beside a bulk row: past the spin before it and the row */
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
#define CK(call) pr_check((call), #call, __FILE__, __LINE__)
void pr_check(cudaError_t e, const char *what, const char *file, int line);
void *pr_malloc(size_t n);
/* wait for the stream; a kernel that gave up on a wait ends the run */
void pr_sync(const pr_t *p, const char *step);
/* one table row from n samples in ns (sorted here) */
void pr_row(pr_t *p, const char *step, const char *what, double *ns, int n);
/* a row from n device samples of cycles, each per steps in ns */
void pr_row_cycles(pr_t *p, const char *step, const char *what, int n, double per);
/* keeps the GPU busy while the host queues what follows, so that no
 * measured gap waits for the host */
__global__ void pr_k_spin(uint64_t ns);

/* mc_probe_memory.cu: steps 1, 6, 9 and 10; 2; 3; 16 */
void pr_loads_copy(pr_t *p);
void pr_release(pr_t *p);
void pr_flags(pr_t *p);
void pr_first_loads(pr_t *p);
/* mc_probe_bulk.cu: step 12 */
void pr_bulk(pr_t *p);
/* mc_probe_launch.cu: steps 4; 5; 8; 8b; 11 */
void pr_pdl(pr_t *p);
void pr_graphs(pr_t *p);
void pr_code(pr_t *p);
void pr_jump(pr_t *p);
void pr_first(pr_t *p);
/* other code run on every SM, as a round's other kernels leave the SMs'
 * instruction caches: before a step timed as its code's first execution */
void pr_evict(pr_t *p);
/* mc_probe_prep.cu: steps 13, 14 and 15 */
void pr_prep(pr_t *p);
void pr_bases(pr_t *p);
void pr_tiny(pr_t *p);

#endif
