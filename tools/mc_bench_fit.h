/* mc_bench_fit.h - whether a GPU can hold the buffers of the ranks mc-bench
 * puts on it, asked before anything is made: a shape too large for it
 * would otherwise fail inside the first allocation or the bootstrap, with
 * a message that does not say why. */
#ifndef MC_BENCH_FIT_H
#define MC_BENCH_FIT_H

#include <stdint.h>
#include <stdio.h>

#include "mc_ref_run.h"

/* The decision from the numbers alone: ranks_on_gpu ranks of case c run
 * with options o (mc_run_gpu_bytes each) on a GPU with free_bytes free.
 * 0 where they fit; else 2 with one line in why (n bytes) that names the
 * bytes a rank needs and the bytes free. */
int mc_bench_gpu_fit(const mc_case_t *c, const mc_run_opts_t *o, int ranks_on_gpu, uint64_t free_bytes, char *why,
                     size_t n);

/* GPU transports: the free memory of the first GPU, asked by a child
 * process (the ranks are forked later, and CUDA must not have started in
 * their parent), against the ranks mc_run puts there (rank % devices).
 * -1 to go on (also where no GPU answers: the run then says why), else 2
 * after the line on err. */
int mc_bench_gpu_check(const mc_case_t *c, const mc_run_opts_t *o, FILE *err);

#endif
