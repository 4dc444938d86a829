/* mc_bench.c - the main job: run an MoE layer's dispatch and combine on N
 * ranks, check every rank's result against the reference model every
 * round, and report per-phase latency, bytes on the wire against the
 * per-expert design, buffer bytes per rank, and a verdict. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <time.h>

#include "mc_bench_args.h"
#include "mc_bench_fit.h"
#include "mc_bench_nccl.h"
#include "mc_layout.h"

static const char *dtype_name(mc_dtype_t d) { return d == MC_DTYPE_FP32 ? "fp32" : d == MC_DTYPE_BF16 ? "bf16" : "fp16"; }

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}
/* Median and p99 of n samples (sorted in place). */
static void stats_of(double *v, int n, double *median, double *p99) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  *median = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
  int i = (int)ceil(0.99 * n) - 1;
  *p99 = v[i < 0 ? 0 : i];
}

/* --sizes: what the one layout header says a rank allocates. */
static void print_sizes(const mc_case_t *c) {
  printf("{\"tokens\": %d, \"experts\": %d, \"topk\": %d, \"hidden\": %d, \"token_bytes\": %zu, \"scale_bytes\": %zu, "
         "\"group_size\": %d, \"world_size\": [",
         c->max_tokens, c->num_experts, c->topk, c->hidden, c->token_bytes, c->scale_bytes, c->group_size);
  int first = 1;
  for (int w = 1; w <= 256; w *= 2)
    if (c->num_experts % w == 0 && w % c->group_size == 0) printf("%s%d", first ? "" : ", ", w), first = 0;
  printf("], \"buffer_bytes\": [");
  first = 1;
  for (int w = 1; w <= 256; w *= 2) {
    if (c->num_experts % w || w % c->group_size) continue;
    mc_shape_t sh = mc_shape_make(w, c->group_size, c->num_experts, c->topk, c->max_tokens, c->hidden, c->token_bytes,
                                  c->scale_bytes, mc_dtype_size(c->in_dtype), c->layout,
                                  c->expert_align > 0 ? c->expert_align : 1);
    printf("%s%llu", first ? "" : ", ", (unsigned long long)(mc_window_bytes(&sh) + mc_workspace_bytes(&sh)));
    first = 0;
  }
  printf("]}\n");
}

/* What a run comes to: the four halves, then the dispatch and combine pairs. */
enum { N_ROWS = MC_PH_COUNT + 2 };
typedef struct {
  double med[N_ROWS], p99[N_ROWS];
  double floor_med[N_ROWS], floor_p99[N_ROWS]; /* --floor: the same rows for the empty kernels */
  double dense_med, dense_p99, nccl_med, nccl_p99;
  double disp, comb, disp_pe, comb_pe, max_err; /* bytes per rank per round; combine error */
  uint64_t buffer;
  int failed;
  const char *verdict;
} bench_sum_t;

/* Median and p99 of n samples (copied into the scratch v). */
static void stats_of_copy(const float *x, double *v, int n, double *median, double *p99) {
  for (int i = 0; i < n; i++) v[i] = x[i];
  stats_of(v, n, median, p99);
}

/* Median and p99 of each row over every rank's samples ([W][MC_PH_COUNT][R]):
 * the four halves, then the per-round sums of each half pair. v: scratch of W x R. */
static void rows_of(const double *samples, int W, int R, double *v, double *med, double *p99) {
  for (int ph = 0; ph < N_ROWS; ph++) {
    for (int r = 0; r < W; r++)
      for (int i = 0; i < R; i++) {
        const double *s = samples + (size_t)r * MC_PH_COUNT * R;
        double x;
        if (ph < MC_PH_COUNT) x = s[ph * R + i];
        else if (ph == MC_PH_COUNT) x = s[MC_PH_DISPATCH_SEND * R + i] + s[MC_PH_DISPATCH_RECV * R + i];
        else x = s[MC_PH_COMBINE_SEND * R + i] + s[MC_PH_COMBINE_RECV * R + i];
        v[(size_t)r * R + i] = x;
      }
    stats_of(v, W * R, &med[ph], &p99[ph]);
  }
}

static void summarize(const bench_args_t *a, const mc_run_result_t *res, int failed, bench_sum_t *m) {
  const mc_case_t *c = &a->c;
  const mc_run_opts_t *o = &a->o;
  const int W = c->world_size, R = o->rounds;
  memset(m, 0, sizeof *m);
  double *v = malloc(sizeof(double) * (size_t)W * R);
  rows_of(res->samples_us, W, R, v, m->med, m->p99);
  if (o->floor) rows_of(res->floor_us, W, R, v, m->floor_med, m->floor_p99);
  if (o->dense_bytes && res->dense_rc == MC_SUCCESS) stats_of_copy(res->dense_us, v, W * R, &m->dense_med, &m->dense_p99);
  if (o->extra_baseline && res->extra_rc == 0) stats_of_copy(res->extra_us, v, W * R, &m->nccl_med, &m->nccl_p99);
  free(v);

  /* Bytes per rank per round, as the library counted them (all rounds ran
   * the same m, so an average over the rounds is the per-round figure). */
  double rounds_run = (double)(o->rounds + o->warmup + (o->check && !o->graph_timed));
  m->buffer = res->ranks[0].stats.buffer_bytes;
  for (int r = 0; r < W; r++) {
    m->disp += (double)res->ranks[r].stats.dispatch_bytes_sent;
    m->comb += (double)res->ranks[r].stats.combine_bytes_sent;
    if (res->ranks[r].max_err > m->max_err) m->max_err = res->ranks[r].max_err;
  }
  m->disp /= W * rounds_run;
  m->comb /= W * rounds_run;
  double chunk = (double)c->tokens / c->group_size;
  double in_elem = (double)(c->in_dtype == MC_DTYPE_FP32 ? 4 : 2);
  m->disp_pe = chunk * c->topk * (double)(c->token_bytes + c->scale_bytes);
  m->comb_pe = chunk * c->topk * c->group_size * c->hidden * in_elem;
  m->failed = failed;
  m->verdict = failed == 0 ? (o->check ? "PASS" : "UNCHECKED") : "FAIL";
}

static const char *row_names[N_ROWS] = {"dispatch send", "dispatch recv", "combine send",
                                        "combine recv",  "dispatch",      "combine"};

/* A packed layout's row in the caller's buffers: the token and its scales, the
 * row's experts and weights, and the row combine reads back. */
static size_t packed_row_bytes(const mc_case_t *c) {
  const size_t cols = c->layout == MC_LAYOUT_EXPERT_SORTED ? 1 : (size_t)c->topk;
  return c->token_bytes + c->scale_bytes + cols * (sizeof(int32_t) + sizeof(float)) +
         (size_t)c->hidden * mc_dtype_size(c->in_dtype);
}

static void print_json(int argc, char **argv, const bench_args_t *a, const mc_run_result_t *res, const bench_sum_t *m) {
  const mc_case_t *c = &a->c;
  const mc_run_opts_t *o = &a->o;
  const int W = c->world_size;
  char when[64];
  time_t now = time(NULL);
  strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
  struct utsname un;
  uname(&un);
  printf("{\"tool\": \"mc-bench\", \"version\": %d, \"date\": \"%s\", \"host\": \"%s\", \"command\": \"", mc_version(),
         when, un.nodename);
  for (int i = 0; i < argc; i++) printf("%s%s", i ? " " : "", argv[i]);
  printf("\", \"transport\": \"%s\", \"ranks_as\": \"%s\",\n", mc_transport_name(o->transport),
         o->processes ? "processes" : "threads");
  printf(" \"config\": {\"world_size\": %d, \"group_size\": %d, \"tokens\": %d, \"max_tokens\": %d, "
         "\"bound_m\": %s, \"experts\": %d, \"topk\": %d, "
         "\"hidden\": %d, \"token_bytes\": %zu, \"scale_bytes\": %zu, \"in_dtype\": \"%s\", \"out_dtype\": \"%s\", "
         "\"rounds\": %d, \"warmup\": %d, \"seed\": %llu, \"timeout_ms\": %d, \"graph\": %s, \"whole\": %s, \"index_dtype\": \"%s\", "
         "\"quantise\": \"%s\", \"quantise_apart\": %s},\n",
         c->world_size, c->group_size, c->tokens, c->max_tokens, c->bound_fixed ? "true" : "false", c->num_experts,
         c->topk, c->hidden, c->token_bytes, c->scale_bytes, dtype_name(c->in_dtype), dtype_name(c->out_dtype), o->rounds, o->warmup,
         (unsigned long long)c->seed, o->timeout_ms, o->graph_timed ? "true" : "false", o->whole ? "true" : "false",
         o->ids64 ? "int64" : "int32", c->quant == MC_REF_QUANT_FP32 ? "fp32" : c->quant ? "ue8m0" : "no",
         o->quant_apart ? "true" : "false");
  const int first = o->whole ? MC_PH_COUNT : 0; /* --whole: no halves */
  for (int f = 0; f <= o->floor; f++) {
    const double *med = f ? m->floor_med : m->med, *p99 = f ? m->floor_p99 : m->p99;
    printf(" \"%s\": {", f ? "floor_us" : "latency_us");
    for (int ph = first; ph < N_ROWS; ph++)
      printf("%s\"%s\": {\"median\": %.2f, \"p99\": %.2f}", ph > first ? ", " : "", row_names[ph], med[ph], p99[ph]);
    printf("},\n");
  }
  printf(" \"bytes_per_rank_per_round\": {\"dispatch\": %.0f, \"dispatch_per_expert_design\": %.0f, "
         "\"combine\": %.0f, \"combine_per_expert_design\": %.0f},\n",
         m->disp, m->disp_pe, m->comb, m->comb_pe);
  if (o->dense_bytes)
    printf(" \"dense_alltoall\": {\"bytes_per_rank\": %zu, \"padded\": %s, \"median_us\": %.2f, \"p99_us\": %.2f, "
           "\"rc\": %d},\n",
           o->dense_bytes * (size_t)W, c->layout == MC_LAYOUT_BATCHED ? "true" : "false", m->dense_med, m->dense_p99,
           res->dense_rc);
  if (o->extra_baseline)
    printf(" \"nccl_alltoall\": {\"bytes_per_rank\": %zu, \"median_us\": %.2f, \"p99_us\": %.2f, \"rc\": %d},\n",
           o->dense_bytes * (size_t)W, m->nccl_med, m->nccl_p99, res->extra_rc);
  /* bytes this rank sent per round over the median time of the phase pair */
  printf(" \"GBps_per_rank\": {\"dispatch\": %.2f, \"combine\": %.2f},\n", m->disp / m->med[MC_PH_COUNT] / 1e3,
         m->comb / m->med[MC_PH_COUNT + 1] / 1e3);
  if (c->layout != MC_LAYOUT_BATCHED) {
    printf(" \"rounds_dropped\": %llu,\n", (unsigned long long)res->ranks[0].dropped);
    /* the caller's buffers: the rows given to the recv half, against the rows that arrived */
    int64_t rows = 0, given = 0;
    for (int r = 0; r < W; r++) {
      if (res->ranks[r].recv_rows_max > rows) rows = res->ranks[r].recv_rows_max;
      if (res->ranks[r].recv_capacity_max > given) given = res->ranks[r].recv_capacity_max;
    }
    const double row = (double)packed_row_bytes(c), L = c->num_experts / W;
    printf(" \"packed\": {\"layout\": \"%s\", \"align\": %d, \"declared\": %lld, \"rows_max\": %lld, "
           "\"rows_given_max\": %lld, \"row_bytes\": %.0f, \"caller_bytes\": %.0f, \"caller_bytes_batched\": %.0f},\n",
           c->layout == MC_LAYOUT_PACKED ? "packed" : "sorted", c->expert_align > 0 ? c->expert_align : 1,
           (long long)c->declare, (long long)rows, (long long)given, row, row * (double)given,
           L * mc_ref_capacity(c) * (double)(c->token_bytes + c->scale_bytes + (size_t)c->hidden * mc_dtype_size(c->in_dtype)));
  }
  printf(" \"buffer_bytes_per_rank\": %llu, \"max_rel_err_vs_ideal\": %.3g, \"failed_ranks\": %d, \"verdict\": \"%s\"",
         (unsigned long long)m->buffer, m->max_err, m->failed, m->verdict);
  if (m->failed) printf(", \"first_failure\": \"%s\"", mc_run_first_failure(res));
  printf("}\n");
}

static void print_table(const bench_args_t *a, const mc_run_result_t *res, const bench_sum_t *m) {
  const mc_case_t *c = &a->c;
  const mc_run_opts_t *o = &a->o;
  const int W = c->world_size;
  const double pair = m->med[MC_PH_COUNT] + m->med[MC_PH_COUNT + 1];
  printf("mc-bench  %d ranks (%s, %s transport)  group_size %d  %d tokens/rank (max_tokens %d%s)  %d experts top-%d\n",
         W, o->processes ? "processes" : "threads", mc_transport_name(o->transport), c->group_size, c->tokens,
         c->max_tokens, c->bound_fixed ? ", through bound_m" : "", c->num_experts, c->topk);
  printf("          token %zu B + scales %zu B, combine %s -> %s, hidden %d; %d rounds after %d warm-up\n\n",
         c->token_bytes, c->scale_bytes, dtype_name(c->in_dtype), dtype_name(c->out_dtype), c->hidden, o->rounds,
         o->warmup);
  printf("  %-16s %12s %12s%s\n", "phase", "median us", "p99 us", o->floor ? "   floor: median, p99 (empty kernels)" : "");
  for (int ph = o->whole ? MC_PH_COUNT : 0; ph < N_ROWS; ph++) {
    if (ph == MC_PH_COUNT && !o->whole) printf("  %-16s %12s %12s\n", "", "", "");
    printf("  %-16s %12.1f %12.1f", row_names[ph], m->med[ph], m->p99[ph]);
    if (o->floor) printf("   %12.1f %12.1f", m->floor_med[ph], m->floor_p99[ph]);
    printf("\n");
  }
  printf("\n  bytes sent per rank per round   ours        per-expert design   ratio\n");
  printf("    dispatch                    %10.0f   %10.0f          %.2f\n", m->disp, m->disp_pe, m->disp / m->disp_pe);
  printf("    combine                     %10.0f   %10.0f          %.2f\n", m->comb, m->comb_pe, m->comb / m->comb_pe);
  if (o->dense_bytes) {
    if (res->dense_rc == MC_SUCCESS)
      printf("\n  %s all-to-all baseline    %12.1f %12.1f   (%.0f MB per rank; %.1fx dispatch+combine)\n",
             c->layout == MC_LAYOUT_BATCHED ? "dense   " : "unpadded", m->dense_med, m->dense_p99,
             (double)o->dense_bytes * W / 1e6, m->dense_med / pair);
    else
      printf("\n  dense all-to-all baseline: failed (%s)\n", mc_result_string((mc_result_t)res->dense_rc));
  }
  if (o->extra_baseline) {
    if (res->extra_rc == 0)
      printf("  NCCL send/recv baseline        %12.1f %12.1f   (%.1fx dispatch+combine)\n", m->nccl_med, m->nccl_p99,
             m->nccl_med / pair);
    else
      printf("  NCCL send/recv baseline: failed (see stderr)\n");
  }
  printf("  receive buffers per rank      %10llu B (%.1f MiB)\n", (unsigned long long)m->buffer,
         (double)m->buffer / 1048576.0);
  if (c->layout != MC_LAYOUT_BATCHED) {
    int64_t rows = 0, given = 0;
    for (int r = 0; r < W; r++) {
      if (res->ranks[r].recv_rows_max > rows) rows = res->ranks[r].recv_rows_max;
      if (res->ranks[r].recv_capacity_max > given) given = res->ranks[r].recv_capacity_max;
    }
    const double row = (double)packed_row_bytes(c), L = c->num_experts / W;
    printf("  caller's buffers (%s)     %lld rows given for at most %lld arriving: %.1f MiB, batched %.1f MiB\n",
           c->layout == MC_LAYOUT_PACKED ? "packed" : "sorted", (long long)given, (long long)rows,
           row * (double)given / 1048576.0,
           L * mc_ref_capacity(c) * (double)(c->token_bytes + c->scale_bytes + (size_t)c->hidden * mc_dtype_size(c->in_dtype)) /
               1048576.0);
  }
  if (o->check)
    printf("  combine error vs exact sum    %.3g of sum|w*y| (tolerance %.3g)\n", m->max_err, mc_ref_tolerance(c));
  printf("\n  verdict: %s", m->verdict);
  if (m->failed) printf(" (%d rank(s)): %s", m->failed, mc_run_first_failure(res));
  printf("\n");
}

/* A run none of whose ranks got through a round (the handles were never
 * made, or every rank failed in the first one) has nothing to tabulate.
 * 0 where one did; else the exit status: 2 where the library refused the
 * arguments (a rule of docs/api.md), 1 otherwise. */
static int never_started(const mc_run_result_t *res) {
  for (int r = 0; r < res->world_size; r++)
    if (res->ranks[r].stats.rounds > 0) return 0;
  for (int r = 0; r < res->world_size; r++)
    if (res->ranks[r].failed) return res->ranks[r].api_rc == MC_ERR_INVALID_ARG ? 2 : 1;
  if (res->ranks[0].dropped)
    fprintf(stderr, "mc-bench: every round brought some rank more rows than --capacity: each failed with "
                    "MC_ERR_CAPACITY on every rank, as it must\n");
  return 1;
}

int main(int argc, char **argv) {
  bench_args_t a;
  mc_bench_defaults(&a, mc_bench_have_nccl());
  int rc = mc_bench_args(argc, argv, &a, stdout, stderr);
  if (rc >= 0) return rc;
  if (a.sizes_only) {
    print_sizes(&a.c);
    return 0;
  }
  if ((rc = mc_bench_gpu_check(&a.c, &a.o, stderr)) >= 0) return rc;
  if (a.nccl) a.o.extra_baseline = mc_bench_nccl_alltoall;
  mc_run_result_t res;
  int failed = mc_run(&a.c, &a.o, &res);
  if (failed < 0) {
    fprintf(stderr, "mc-bench: the run could not start\n");
    return 1;
  }
  if ((rc = never_started(&res)) != 0) {
    fprintf(stderr, "mc-bench: %s: %s\n", rc == 2 ? "the library refused the arguments" : "the run never got through a round",
            mc_run_first_failure(&res));
    mc_run_free(&res);
    return rc;
  }
  bench_sum_t m;
  summarize(&a, &res, failed, &m);
  if (a.json) print_json(argc, argv, &a, &res, &m);
  else print_table(&a, &res, &m);
  mc_run_free(&res);
  return failed == 0 ? 0 : 1;
}
