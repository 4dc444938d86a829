/* mc_ref_bench.c - what mc-bench times beside the checked rounds: each
 * round's phase times from the device marks, the launch floor (the
 * phases' empty kernels) and the dense all-to-all baselines of the same
 * payload. */
#include <stdio.h>

#include "moecomm_bench.h"
#include "mc_ref_dev.h"
#include "mc_ref_rank.h"

void mc_rr_store_samples(double *samples, int nsamples, int r, int gpu, int whole) {
  samples[MC_PH_DISPATCH_SEND * nsamples + r] = mc_dev_elapsed_us(gpu, 0, whole ? 3 : 1);
  samples[MC_PH_DISPATCH_RECV * nsamples + r] = whole ? 0 : mc_dev_elapsed_us(gpu, 2, 3);
  samples[MC_PH_COMBINE_SEND * nsamples + r] = mc_dev_elapsed_us(gpu, 4, whole ? 7 : 5);
  samples[MC_PH_COMBINE_RECV * nsamples + r] = whole ? 0 : mc_dev_elapsed_us(gpu, 6, 7);
}

/* --floor, eager: each phase's empty kernels (mc_a2a_bench_floor) for a
 * call of m tokens, between the marks of a round, after the same host and
 * device alignment. */
int mc_rr_floor(rank_st_t *st, int m) {
  const mc_run_opts_t *o = st->o;
  mc_run_result_t *res = st->ctx->res;
  double *samples = res->floor_us + (size_t)st->rank * MC_PH_COUNT * (size_t)res->rounds;
  const int whole = o->whole == 1;
  void *s = mc_dev_stream();
  for (int i = 0; i < o->warmup + o->rounds; i++) {
    mc_dev_sync(st->gpu); /* as before a round */
    if (mc_rr_round_barrier(st) != 0) return -1;
    for (int ph = MC_BENCH_DISPATCH; ph <= MC_BENCH_COMBINE; ph++) {
      const int k = 4 * ph; /* marks k..k+3, as round_dispatch and round_combine */
      mc_dev_mark(st->gpu, k);
      if (whole) {
        API(st, mc_a2a_bench_floor(st->a2a, ph, m, MC_SEND_RECV, s));
      } else {
        API(st, mc_a2a_bench_floor(st->a2a, ph, m, MC_SEND, s));
        mc_dev_mark(st->gpu, k + 1);
        mc_dev_mark(st->gpu, k + 2);
        API(st, mc_a2a_bench_floor(st->a2a, ph, m, MC_RECV, s));
      }
      mc_dev_mark(st->gpu, k + 3);
    }
    mc_dev_sync(st->gpu);
    if (i >= o->warmup) mc_rr_store_samples(samples, res->rounds, i - o->warmup, st->gpu, whole);
  }
  return 0;
}

/* The dense all-to-all baselines of the same payload. */
void mc_rr_baselines(rank_st_t *st) {
  const mc_run_opts_t *o = st->o;
  mc_run_result_t *res = st->ctx->res;
  mc_dev_sync(st->gpu);
  mc_result_t drc = mc_comm_bench_dense_alltoall(st->comm, o->dense_bytes, o->warmup, o->rounds,
                                                 res->dense_us + (size_t)st->rank * res->rounds);
  if (st->rank == 0) res->dense_rc = drc;
  if (st->rank == 0 && drc != MC_SUCCESS) fprintf(stderr, "dense baseline: %s\n", mc_comm_last_error(st->comm));
  if (o->extra_baseline) {
    int xrc = o->extra_baseline(&st->ctx->oob, o->dense_bytes, o->warmup, o->rounds,
                                res->extra_us + (size_t)st->rank * res->rounds);
    if (st->rank == 0) res->extra_rc = xrc;
  }
}
