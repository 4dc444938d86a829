/* mc_dev.cuh - device helpers every GPU kernel uses: memory-ordering
 * operations named after the PTX they emit, the bounded wait, failure
 * recording, and 16-byte copies. */
#ifndef MC_DEV_CUH
#define MC_DEV_CUH

#include <stdint.h>

#include "mc_gpu.h"

#define MC_DEV static __device__ __forceinline__

/* ld.acquire.sys: a load that later loads cannot pass; sees the writes a
 * peer released before it updated this word (a signal), from any GPU. */
MC_DEV uint64_t mc_ld_acquire_sys_u64(const uint64_t *p) {
  uint64_t v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
MC_DEV uint32_t mc_ld_volatile_u32(const volatile uint32_t *p) { return *p; }

/* red.release.sys / st.release.sys: update a peer's signal after the data.
 * Release is cumulative: stores of other lanes that happen before it (a
 * __syncwarp orders them) become visible to whoever acquires the signal. */
MC_DEV void mc_red_release_sys_add_u64(uint64_t *p, uint64_t v) {
  asm volatile("red.release.sys.global.add.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
MC_DEV void mc_st_release_sys_u64(uint64_t *p, uint64_t v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

/* The same at GPU scope: enough when every rank runs on this GPU (ranks
 * under MPS, or threads), and cheaper: a system-scope release must also
 * order this SM's stores for other GPUs and the host. */
MC_DEV uint64_t mc_ld_acquire_gpu_u64(const uint64_t *p) {
  uint64_t v;
  asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
MC_DEV void mc_red_release_gpu_add_u64(uint64_t *p, uint64_t v) {
  asm volatile("red.release.gpu.global.add.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
MC_DEV void mc_st_release_gpu_u64(uint64_t *p, uint64_t v) {
  asm volatile("st.release.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

/* Signals between ranks at the narrowest scope that covers them all:
 * a->gpu_scope is set by the host when every rank shares this GPU and no
 * peer is reached through NVSHMEM puts (mc_gpu_host.c). */
MC_DEV void mc_sig_add(const mc_kargs_t *a, uint64_t *p, uint64_t v) {
  if (a->gpu_scope) mc_red_release_gpu_add_u64(p, v);
  else mc_red_release_sys_add_u64(p, v);
}
MC_DEV void mc_sig_set(const mc_kargs_t *a, uint64_t *p, uint64_t v) {
  if (a->gpu_scope) mc_st_release_gpu_u64(p, v);
  else mc_st_release_sys_u64(p, v);
}
MC_DEV uint64_t mc_sig_load(const mc_kargs_t *a, const uint64_t *p) {
  return a->gpu_scope ? mc_ld_acquire_gpu_u64(p) : mc_ld_acquire_sys_u64(p);
}
/* A word that carries its round beside its value (a meta word,
 * mc_layout.h): stored and polled relaxed, at the same scope as the
 * signals; nothing else is ordered by it, so nothing waits for it. */
MC_DEV void mc_word_store(const mc_kargs_t *a, uint64_t *p, uint64_t v) {
  if (a->gpu_scope) asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
  else asm volatile("st.relaxed.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
/* A load issued where it stands in the code, before a branch that follows
 * it: a relaxed load at gpu scope in asm volatile, which neither compiler
 * sinks past the branch (ptxas issues weak loads beside an early return on
 * one of them only after it: a second round trip). For words written by
 * kernels launched before. */
MC_DEV uint32_t mc_ld_now_u32(const void *p) {
  uint32_t v;
  asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p));
  return v;
}
MC_DEV uint64_t mc_ld_now_u64(const void *p) {
  uint64_t v;
  asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p));
  return v;
}
MC_DEV uint64_t mc_word_load(const mc_kargs_t *a, const uint64_t *p) {
  uint64_t v;
  if (a->gpu_scope) asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  else asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
/* a fence (fence.sc) at the same scope: other warps' stores, seen through a
 * counter, ordered before a signal this thread sends */
MC_DEV void mc_fence_peers(const mc_kargs_t *a) {
  if (a->gpu_scope) __threadfence();
  else __threadfence_system();
}

/* Programmatic dependent launch (sm_90 on): a receiving kernel launched
 * with the attribute (mc_gpu_launch.cuh) is scheduled once every block of
 * the sending kernel before it has passed mc_pdl_launch_dependents, and
 * waits in mc_pdl_wait until that kernel has finished and its memory is
 * visible. Both receiving kernels wait at their end: what they read of
 * their sender's work is signalled or carries its round (dispatch-recv
 * learns the call's outcome from MC_WS_OUTCOME, and polls the metas' words,
 * this rank's own among them), so they work while it runs, and later work
 * on the stream still comes after both. Without the attribute both are no-ops. */
MC_DEV void mc_pdl_launch_dependents(void) {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
MC_DEV void mc_pdl_wait(void) {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

/* %globaltimer: nanoseconds, coarse but monotone: enough for timeouts. */
MC_DEV uint64_t mc_globaltimer_ns(void) {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

/* The diagnostic trace (MC_GPU_TRACE=file, see mc_gpu_host.c): per kernel,
 * slot 0 the first block's start and 1 the last block's (how long blocks
 * waited for SMs), 2..10 checkpoints c0..c8 (the last block to pass each),
 * 11 the last block's end (after a block barrier: a stamp per warp,
 * thousands of atomics on one word, would take microseconds of its own).
 * globaltimer is one clock for every process on a GPU, so ranks sharing a
 * GPU line up. Off (a->trace NULL) it costs one branch. */
MC_DEV void mc_trace_start(const mc_kargs_t *a, int k) {
  if (a->trace && threadIdx.x == 0) {
    unsigned long long t = mc_globaltimer_ns();
    atomicMin((unsigned long long *)&a->trace[k * MC_TRACE_SLOTS], t);
    atomicMax((unsigned long long *)&a->trace[k * MC_TRACE_SLOTS + 1], t);
  }
}
/* point c of kernel k, by the thread that calls it (mc_trace_point: thread 0's) */
MC_DEV void mc_trace_stamp(const mc_kargs_t *a, int k, int c) {
  if (a->trace)
    atomicMax((unsigned long long *)&a->trace[k * MC_TRACE_SLOTS + 2 + c], (unsigned long long)mc_globaltimer_ns());
}
MC_DEV void mc_trace_point(const mc_kargs_t *a, int k, int c) {
  if (threadIdx.x == 0) mc_trace_stamp(a, k, c);
}
/* the same once v is in hand: a branch on v comes before the stamp, so
 * that a load's return (or a store that waits for its data) is timed, not
 * its issue (a stamp is skipped where v happens to be the constant) */
MC_DEV void mc_trace_after(const mc_kargs_t *a, int k, int c, uint32_t v) {
  if (a->trace && v != 0x9e3779b9u) mc_trace_stamp(a, k, c);
}
/* every thread of the block calls it (a barrier where tracing) */
MC_DEV void mc_trace_end(const mc_kargs_t *a, int k) {
  if (!a->trace) return;
  __syncthreads();
  if (threadIdx.x == 0)
    atomicMax((unsigned long long *)&a->trace[k * MC_TRACE_SLOTS + MC_TRACE_SLOTS - 1],
              (unsigned long long)mc_globaltimer_ns());
}

/* Record the first failure of this round and make every later wait bail.
 * The code is written last, after a system-scope fence, so the host never
 * reads half a record. */
MC_DEV void mc_dev_fail(mc_dev_error_t *e, int code, int phase, int rank, int peer, int slot, int token,
                        int k, int value, uint64_t expected, uint64_t seen, uint64_t round) {
  if (atomicCAS((int *)&e->claimed, 0, 1) != 0) return;
  e->phase = phase;
  e->rank = rank;
  e->peer = peer;
  e->slot = slot;
  e->token = token;
  e->k = k;
  e->value = value;
  e->expected = expected;
  e->seen = seen;
  e->round = round;
  __threadfence_system();
  *(volatile int32_t *)&e->code = code;
  __threadfence_system();
}

MC_DEV int mc_dev_failed(const mc_dev_error_t *e) { return *(const volatile int32_t *)&e->claimed != 0; }

/* Record the first refused call (bad input, found by dispatch-send): the
 * call sends nothing, and nothing else stops (mc_dev_failed stays 0). */
MC_DEV void mc_dev_refuse(mc_dev_error_t *e, int code, int token, int k, int value, uint64_t expected, uint64_t seen) {
  if (atomicCAS((int *)&e->ref_claimed, 0, 1) != 0) return;
  e->ref_token = token;
  e->ref_k = k;
  e->ref_value = value;
  e->ref_expected = expected;
  e->ref_seen = seen;
  __threadfence_system();
  *(volatile int32_t *)&e->ref_code = code;
  __threadfence_system();
}

/* One poll of a wait: a signal (word 0), acquired, has reached target; a
 * word that carries its round (word 1: a meta word, mc_layout.h), loaded
 * relaxed, carries round target (its high half: the round modulo 2^32; no
 * sender is a round ahead of its receiver, so equal is the test, and a
 * word left from long before passes only at a multiple of 2^32 rounds).
 * Each poll of a signal acquires: a relaxed poll with one fence.acq_rel
 * after it is slower. */
MC_DEV bool mc_dev_poll(const mc_kargs_t *a, const uint64_t *p, uint64_t target, int word, uint64_t *v) {
  if (!word) return (*v = mc_sig_load(a, p)) >= target;
  *v = mc_word_load(a, p);
  return (uint32_t)(*v >> 32) == (uint32_t)target;
}

/* Wait until the poll above passes, for at most a->timeout_ns; *got: what
 * the last poll read. Returns 0 when it passed, 1 when this or another
 * thread failed (the caller exits), 2 when *quit (shared memory, where not
 * NULL) was set by another thread of the block: what it waited for will
 * not come, and that is no failure (a refused call's metas). own: the word
 * is written on this rank by work that waits for no peer (the call's
 * outcome, by the kernel before; the arrivals of this kernel's own
 * blocks): it comes whatever failed elsewhere, a failure recorded
 * meanwhile does not end the wait, and no peer is named as the one
 * waited for. */
MC_DEV int mc_dev_wait(const mc_kargs_t *a, const uint64_t *sig, uint64_t target, int word, int phase, int peer,
                       int slot, uint64_t round, uint64_t *got, const volatile int *quit, bool own) {
  if (mc_dev_poll(a, sig, target, word, got)) return 0;
  const uint64_t t0 = mc_globaltimer_ns(), deadline = t0 + a->timeout_ns;
  /* this rank's "waiting for" word (MC_SIG_WAITING, in its own window): set
   * by a wait that has lasted 1 ms (never by the quick ones, which would
   * all write one word), cleared by it if no other wait wrote it since; a
   * rank that times out reads its peers' to name the one at the root */
  uint64_t *waiting = (uint64_t *)(a->win + mc_sig_off(&a->s, MC_SIG_WAITING, a->rank));
  const uint64_t mine = (uint64_t)peer + 1;
  bool marked = false;
  unsigned nap = 32;
  for (uint32_t it = 1;; it++) {
    if (mc_dev_poll(a, sig, target, word, got)) {
      if (marked) atomicCAS((unsigned long long *)waiting, mine, 0ull);
      return 0;
    }
    /* back off: hundreds of pollers in tight loops (other ranks' receive
     * kernels on the same GPU) load the memory system the senders need;
     * a->nap_max is shorter where this rank has its GPU alone (mc_gpu_host.c) */
    __nanosleep(nap);
    if (nap < (unsigned)a->nap_max) nap *= 2;
    if ((it & 15u) == 0) {
      if (quit && *quit) { /* no failure, and nothing awaited: the mark goes */
        if (marked) atomicCAS((unsigned long long *)waiting, mine, 0ull);
        return 2;
      }
      if (!own && mc_dev_failed(a->err)) return 1;
      const uint64_t now = mc_globaltimer_ns();
      if (!own && now > t0 + 1000000u) { /* lasting: say whom this rank waits for (again: another wait may have cleared it) */
        *(volatile uint64_t *)waiting = mine;
        marked = true;
      }
      if (now > deadline) {
        mc_dev_fail(a->err, MC_DEVERR_TIMEOUT, phase, a->rank, peer, slot, -1, -1, 0, target, word ? *got >> 32 : *got,
                    round);
        return 1;
      }
    }
  }
}
/* Wait until *sig >= target. */
MC_DEV int mc_dev_wait_ge(const mc_kargs_t *a, const uint64_t *sig, uint64_t target, int phase, int peer, int slot,
                          uint64_t round) {
  uint64_t v;
  return mc_dev_wait(a, sig, target, 0, phase, peer, slot, round, &v, NULL, false);
}

/* Copy one piece (bytes <= MC_SEG_BYTES, a multiple of 16, both ends
 * 16-byte aligned) with a warp to n destinations (dst[j] + off): each lane
 * loads its up to four 16-byte parts at once, then stores each n times. A
 * copy is a chain of memory latencies unless its loads are in flight
 * together (the compiler may not hoist a load above a store that could
 * alias it); the piece is read once for all the ranks, or all the local
 * experts, it goes to. */
MC_DEV void mc_warp_piece_load(int4 *v, const void *src, uint32_t bytes, int lane) {
  const int4 *s = (const int4 *)src;
  const uint32_t cnt = bytes / 16;
#pragma unroll
  for (int q = 0; q < 4; q++)
    if (lane + 32u * q < cnt) v[q] = s[lane + 32 * q];
}
MC_DEV void mc_warp_piece_store(unsigned char *const *dst, int n, uint64_t off, const int4 *v, uint32_t bytes,
                                int lane) {
  const uint32_t cnt = bytes / 16;
  for (int j = 0; j < n; j++) {
    int4 *d = (int4 *)(dst[j] + off);
#pragma unroll
    for (int q = 0; q < 4; q++)
      if (lane + 32u * q < cnt) d[lane + 32 * q] = v[q];
  }
}
MC_DEV void mc_warp_piece16_to(unsigned char *const *dst, int n, uint64_t off, const void *src, uint32_t bytes,
                               int lane) {
  int4 v[4];
  mc_warp_piece_load(v, src, bytes, lane);
  mc_warp_piece_store(dst, n, off, v, bytes, lane);
}
/* The same for bytes a multiple of 4 (scales), 512 bytes a pass: the
 * words [b, b + 128) of cnt, 4 a lane. The first pass may be loaded early
 * (mc_warp_scales_first), beside a piece's payload, and handed in as
 * first: a load after the payload's stores would be one more memory
 * latency on the copy's path (NULL: loaded here). */
MC_DEV void mc_warp_pass4_load(int *v, const int *s, uint64_t b, uint64_t cnt, int lane, const int *first) {
#pragma unroll
  for (int q = 0; q < 4; q++)
    if (b + lane + 32u * q < cnt) v[q] = b == 0 && first ? first[q] : s[b + lane + 32 * q];
}
MC_DEV void mc_warp_scales_first(int *v, const void *src, uint64_t bytes, int lane) {
  mc_warp_pass4_load(v, (const int *)src, 0, bytes / 4, lane, NULL);
}
MC_DEV void mc_warp_piece4_to(unsigned char *const *dst, int n, uint64_t off, const void *src, uint64_t bytes,
                              int lane, const int *first) {
  const uint64_t cnt = bytes / 4;
  for (uint64_t b = 0; b < cnt; b += 128) {
    int v[4];
    mc_warp_pass4_load(v, (const int *)src, b, cnt, lane, first);
    for (int j = 0; j < n; j++) {
      int *d = (int *)(dst[j] + off);
#pragma unroll
      for (int q = 0; q < 4; q++)
        if (b + lane + 32u * q < cnt) d[b + lane + 32 * q] = v[q];
    }
  }
}
/* A whole buffer with a warp to one destination, a piece at a time. */
MC_DEV void mc_warp_copy16(void *dst, const void *src, uint64_t bytes, int lane) {
  unsigned char *d = (unsigned char *)dst;
  for (uint64_t o = 0; o < bytes; o += MC_SEG_BYTES)
    mc_warp_piece16_to(&d, 1, o, (const unsigned char *)src + o,
                       (uint32_t)(bytes - o < MC_SEG_BYTES ? bytes - o : MC_SEG_BYTES), lane);
}
MC_DEV void mc_warp_copy4(void *dst, const void *src, uint64_t bytes, int lane) {
  unsigned char *d = (unsigned char *)dst;
  mc_warp_piece4_to(&d, 1, 0, src, bytes, lane, NULL);
}

MC_DEV uint32_t *mc_ws_u32(const mc_kargs_t *a, uint64_t off) { return (uint32_t *)(a->ws + off); }
MC_DEV uint64_t *mc_ws_round(const mc_kargs_t *a) { return (uint64_t *)(a->ws + mc_ws_round_off(&a->s)); }
/* 1 where rank p is masked (mc_a2a_mask_ranks). masking is a constant of
 * the kernel: the kernels of the hot path are compiled with 0 and hold no
 * trace of the mask; once a rank is masked the launcher picks the ones
 * compiled with 1 (mc_gpu_launch.cuh) */
MC_DEV bool mc_masked(const int masking, const mc_kargs_t *a, int p) { return masking && a->mask[p]; }
/* a uint64 among the workspace scalars (MC_WS_DIGEST, MC_WS_DRECV_ROUND and those after it) */
MC_DEV uint64_t *mc_ws_scalar64(const mc_kargs_t *a, int i) {
  return (uint64_t *)(mc_ws_u32(a, mc_ws_scalars_off(&a->s)) + i);
}
MC_DEV uint64_t *mc_sig_local(const mc_kargs_t *a, int slot, int peer) {
  return (uint64_t *)(a->win + mc_sig_off(&a->s, slot, peer));
}

#endif
