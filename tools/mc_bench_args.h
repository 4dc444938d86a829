/* mc_bench_args.h - mc-bench's command line: its options, the rules they
 * must keep, and what follows from them. Apart from the tool so that the
 * test suite can run it on argument lists of its own. */
#ifndef MC_BENCH_ARGS_H
#define MC_BENCH_ARGS_H

#include <stdio.h>

#include "mc_ref_run.h"

/* What the command line asks for. */
typedef struct {
  mc_case_t c;
  mc_run_opts_t o;
  int json, threads, sizes_only, dense;
  int nccl;      /* the NCCL baseline is run (asked for, on a GPU transport with the dense baselines) */
  int have_nccl; /* this mc-bench was built with the NCCL baseline */
} bench_args_t;

/* Without options: the DeepSeek-V3 layer, 128 tokens, 8 ranks as threads on
 * the cpu transport, 20 rounds after 3 warm-up, the first 5 checked. */
void mc_bench_defaults(bench_args_t *a, int have_nccl);

/* argv into *a, every number through one strict parser, MC_TIMEOUT_MS where
 * --timeout is absent; then the rules the options must keep together, and
 * what follows from them. Returns -1 to go on, else the exit status: 0
 * after --help (the text on out), 2 after one line on err that names the
 * option, its text and the rule it breaks. */
int mc_bench_args(int argc, char **argv, bench_args_t *a, FILE *out, FILE *err);

#endif
