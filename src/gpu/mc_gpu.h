/* mc_gpu.h - what the host side and the GPU kernels of both GPU transports
 * share: the kernel argument block, the device error slot, and the launch
 * entry points the transports' .cu files implement. Plain C. */
#ifndef MC_GPU_H
#define MC_GPU_H

#include <stdint.h>

#include "mc_layout.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Where a kernel failed. Lives in host-mapped pinned memory: the device
 * writes it and exits, the host reads it at the next call without a sync. */
enum { MC_PHASE_DSEND = 0, MC_PHASE_DRECV, MC_PHASE_CSEND, MC_PHASE_CRECV, MC_PHASE_BARRIER, MC_PHASE_MASK };
enum { MC_DEVERR_NONE = 0, MC_DEVERR_TIMEOUT = 1, MC_DEVERR_BAD_EXPERT = 2, MC_DEVERR_DUP_EXPERT = 3,
       MC_DEVERR_BAD_BOUND = 4, MC_DEVERR_GROUP_DIFFERS = 5 };

typedef struct mc_dev_error {
  int32_t code;  /* MC_DEVERR_*; 0 while nothing failed (written last) */
  int32_t phase; /* MC_PHASE_* */
  int32_t rank, peer, slot; /* timeout: who waited for whom, on which signal */
  int32_t token, k, value;  /* a group's inputs differ: ranks slot and peer of group value */
  uint64_t expected, seen;
  uint64_t round;
  int32_t claimed; /* 0 -> 1 by the first failing thread */
  /* the first call refused for its input (MC_DEVERR_BAD_EXPERT, _DUP_EXPERT, _BAD_BOUND: dispatch-send
   * checks it), apart from the failure above: a refusal ends no wait, so that calls queued behind it
   * before the host reads it (a graph replayed again) run as usual; ref_claimed 0 -> 1 by the first
   * refusing thread, ref_code written last: indices[ref_token][ref_k] (its full value in ref_seen),
   * or *bound_m = ref_value with m in ref_expected */
  int32_t ref_claimed, ref_code, ref_token, ref_k, ref_value;
  uint64_t ref_expected, ref_seen;
  /* the last round dropped over a declared capacity (mc_gpu_packed.cuh), apart from the claim
   * above (a drop is no failure: waits go on): rank drop_peer receives drop_rows rows, more than
   * its drop_limit; drop_seq counts the drops, written last */
  int32_t drop_peer;
  int64_t drop_rows, drop_limit;
  uint64_t drop_round, drop_seq;
} mc_dev_error_t;

/* Everything a kernel needs, passed by value. Pointers are device pointers;
 * win is this rank's window (symmetric: peers' windows carve the same). */
typedef struct mc_kargs {
  mc_shape_t s;
  int rank;
  int in_dtype, out_dtype;
  unsigned char *win;
  unsigned char *ws;
  const void *tokens, *scales;
  const void *indices; /* int32, or int64 where ids64 */
  const float *weights;
  int m;
  int ids64;
  const int32_t *bound_m;
  void *expert_x, *expert_scale;
  int32_t *expert_count;
  const void *expert_y;
  void *out;
  mc_dev_error_t *err;
  uint64_t timeout_ns;
  void *peers; /* transport-specific: p2p's table of peer window addresses */
  int direct;  /* 1: store into directly reachable peers; 0: always stage and put (tests: mc_testing.h) */
  int staged;  /* 1: some peer is reached only by puts (its metas come signalled: mc_wait_meta_word) */
  int gpu_scope; /* 1: every rank on this GPU, no NVSHMEM puts: signals at gpu scope (mc_dev.cuh) */
  int recv_pieces; /* dispatch-recv: payload pieces a warp copies per item (mc_gpu_kernels.cuh) */
  mc_fdiv_t div_items; /* dispatch-recv: by a record's items (mc_record_items) */
  int quant;       /* 0: tokens are the payload; 1, 2: bf16 rows quantised to e4m3 with fp32 (1)
                      or UE8M0 (2) scales on the way (mc_gpu_quant.cuh) */
  int nap_max;     /* ns: the longest nap between polls (mc_dev_wait_ge) */
  uint64_t *trace; /* MC_GPU_TRACE: per-kernel globaltimer stamps (mc_dev.cuh), else NULL */
  /* the packed layouts (mc_gpu_packed.cuh): the send half's declared capacity (0: none); the recv
   * half's rows beside expert_x (x), expert_scale (x_scale) and expert_count; the count step's
   * results (host-mapped) in rows_out and expert_count */
  int64_t limit;
  int32_t *row_expert;
  float *row_weight;
  int32_t *expert_offset, *src_count;
  int64_t *rows_out;
  /* where some rank is masked: the mask in the workspace (mc_ws_mask_off), else NULL; read only by
   * the kernels made for masked ranks (mc_masked). Last, so that no other field moves for it */
  const uint8_t *mask;
} mc_kargs_t;

/* The diagnostic trace: MC_TRACE_SLOTS stamps per kernel, see mc_trace_*. */
enum { MC_TK_PREP = 0, MC_TK_PACK, MC_TK_DSEND, MC_TK_DRECV, MC_TK_CSEND, MC_TK_CRECV, MC_TK_N };
#define MC_TRACE_SLOTS 12

#ifdef __cplusplus
}
#endif

#endif
