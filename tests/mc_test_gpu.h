/* mc_test_gpu.h - what the GPU test files share: the skip where no GPU
 * transport runs, the transport the tests use (MC_TEST_TRANSPORT), runs
 * against the reference with their verdict printed, and small cases. */
#ifndef MC_TEST_GPU_H
#define MC_TEST_GPU_H

#include "mc_ref_run.h"

#define MC_TEST_SKIP 77

/* 1 where a GPU transport can run here (probed in a child: the parent must
 * not start CUDA before it forks ranks) */
int mc_tg_usable(void);
#define REQUIRE_GPU()                                                                                                  \
  do {                                                                                                                 \
    if (!mc_tg_usable()) {                                                                                             \
      printf("skipped: no CUDA device visible, or this build has no GPU transport\n");                                 \
      return MC_TEST_SKIP;                                                                                             \
    }                                                                                                                  \
  } while (0)

/* nvshmem, or p2p with MC_TEST_TRANSPORT=p2p */
mc_transport_t mc_tg_transport(void);
/* one run over transport, ranks as processes (or threads), its verdict
 * printed with the case; 0 where it passed */
int mc_tg_run_as(mc_case_t *c, mc_run_opts_t *o, mc_transport_t transport, int processes);
int mc_tg_run_on(mc_case_t *c, mc_run_opts_t *o, mc_transport_t transport); /* processes */
int mc_tg_run(mc_case_t *c, mc_run_opts_t *o);                              /* processes, mc_tg_transport */
/* the same, keeping the per-rank results (the caller frees them) */
int mc_tg_run_result(mc_case_t *c, mc_run_opts_t *o, mc_run_result_t *res);
/* MC_TEST_MAX_WORLD=N caps a test's ranks at N, rounded down to a power of two */
int mc_tg_cap_world(int world);
/* a small random case of world ranks in groups of group (i: which case of a test) */
void mc_tg_small_case(mc_case_t *c, int world, int group, int i);

#endif
