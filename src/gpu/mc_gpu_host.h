/* mc_gpu_host.h - host-side state and helpers shared by the two GPU
 * transports (nvshmem, p2p): the workspace, the mapped error slot, grid
 * sizing, kernel argument blocks, device errors turned into results. */
#ifndef MC_GPU_HOST_H
#define MC_GPU_HOST_H

#include "mc_internal.h"
#include "mc_gpu.h"

/* What a launch chooses among a half's variants (mc_gpu_table.cuh); ONLY:
 * a kernel with none, launched by its name. */
typedef enum mc_kernel_role {
  MC_KR_ONLY,
  MC_KR_PREP,
  MC_KR_SEND,
  MC_KR_SEND_ONE,
  MC_KR_DRECV,
  MC_KR_DRECV_PACKED,
  MC_KR_CSEND,
  MC_KR_CRECV,
  MC_KR_COUNT
} mc_kernel_role_t;

typedef struct mc_gpu {
  unsigned char *win;      /* this rank's window (symmetric heap or IPC-exported) */
  unsigned char *ws;       /* device workspace */
  mc_dev_error_t *err_h;   /* host view of the mapped error slot */
  mc_dev_error_t *err_d;   /* device view */
  int sms;                 /* SMs this process may use (the MPS share, where there is one) */
  /* the launch plan, decided once at create (mc_gpu_decide_scope, mc_gpu_kernel_limits) */
  int grid;                /* blocks of the big kernels (MC_THREADS each; combine-send twice as many of half;
                              decode batches on a GPU of its own: mc_gpu_launch.cuh) */
  int alone;               /* no other rank on this GPU */
  int one;                 /* dispatch-send may run as one kernel (calls of up to one prep chunk) */
  const void *kern[MC_KR_COUNT][2]; /* each role's kernel for this handle (its top-k, quantising or not, its
                                       combine dtypes), not masked and masked: mc_kernel_pick at create, NULL
                                       where there is none */
  int pdl;                 /* receiving kernels launched early (mc_gpu_launch.cuh) */
  int recv_owed;           /* a refused round's dispatch-recv was never launched (mc_k_drecv_skip) */
  int staged;              /* some peer is reached only by puts: stage records first */
  int direct;              /* store into directly reachable peers (else: stage and put to all) */
  int gpu_scope;           /* signals at gpu scope: see mc_gpu_decide_scope */
  void *peers;             /* kernel argument: p2p's device table of peer windows */
  /* who waits for whom, after a timeout (mc_gpu_host.c): each rank's process
   * and host, and its window as this process may copy from it (NULL: not) */
  int64_t *pid;
  uint64_t *host;
  unsigned char *(*peer_window)(mc_a2a_t *a2a, int r);
  void *tstate;            /* the transport's own host state (p2p: mappings) */
  int64_t *counts_h;       /* the packed layouts' count step: rows, then [L] int32 expert rows (host-mapped) */
  int64_t *counts_d;       /* the same, as the device sees it */
  uint64_t drop_seen;      /* the drops over a declared capacity reported so far (mc_dev_error_t drop_seq) */
  int drop_ack;            /* one reported: the next dispatch-send launch clears MC_WS_DROP first */
  uint64_t *trace;         /* MC_GPU_TRACE: device stamps, MC_TK_N x MC_TRACE_SLOTS */
  void *trace_file;        /* FILE *: one line per mc_a2a_check */
  uint64_t trace_rounds;
} mc_gpu_t;

/* Allocate workspace and error slot, size the grid. a2a->impl is set. */
mc_result_t mc_gpu_create(mc_a2a_t *a2a);
void mc_gpu_free(mc_gpu_t *g);
/* Report a failure the device recorded since the last call (and clear a
 * refused-input record: the handle stays usable). Then fill a kernel
 * argument block from the call's arguments (either may be NULL). */
mc_result_t mc_gpu_prepare(mc_a2a_t *a2a, mc_kargs_t *ka, const mc_dispatch_args_t *d, const mc_combine_args_t *c);
/* Report (and for refused input, clear) what the device recorded. With
 * MC_GPU_TRACE set, also synchronise the device and append the kernels'
 * stamps to the trace file (a diagnostic: the benchmark checks after every
 * round; scripts/mc_report.py trace reads the files). */
mc_result_t mc_gpu_check(mc_a2a_t *a2a);
/* What the device recorded, as a result (mc_gpu_check without the trace's dump). */
mc_result_t mc_gpu_failure(mc_a2a_t *a2a);
/* Collective: set g->gpu_scope when every rank of the communicator runs on
 * this very GPU (device UUIDs agree) and no peer needs staged puts, unless
 * the test suite forces system scope (mc_testing.h); g->alone when no other
 * rank runs on this GPU; and g->grid, smaller where other ranks share it. */
mc_result_t mc_gpu_decide_scope(mc_a2a_t *a2a);
/* mc_a2a_get_expert_load: the workspace's sums out, then zeroed if reset. */
mc_result_t mc_gpu_expert_load(mc_a2a_t *a2a, int64_t *counts, int reset);
/* Copy the device-side counters into a2a->stats (synchronises the device). */
void mc_gpu_refresh_stats(mc_a2a_t *a2a);
/* 1 if this process sees at least one CUDA device. */
int mc_gpu_present(void);

#endif
