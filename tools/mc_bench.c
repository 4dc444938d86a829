/* mc_bench.c - the main job: run an MoE layer's dispatch and combine on N
 * ranks, check every rank's result against the reference model every
 * round, and report per-phase latency, bytes on the wire against the
 * per-expert design, buffer bytes per rank, and a verdict. */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <time.h>

#include "mc_bench_nccl.h"
#include "mc_layout.h"
#include "mc_quant.h"
#include "mc_ref_run.h"

static void usage(FILE *f) {
  fputs(
      "mc-bench: dispatch + combine of one MoE layer on N ranks, checked and timed.\n"
      "\n"
      "Default: the DeepSeek-V3 layer (256 experts, top-8, hidden 7168, fp8 tokens\n"
      "with 56 float block scales, bf16 combine), 128 tokens per rank, 8 ranks,\n"
      "on the cpu transport (ranks as threads). With --transport nvshmem every rank\n"
      "is a process (several on one GPU: run it through scripts/mc-launch.sh, which\n"
      "starts MPS), and NVSHMEM's dense all-to-all of the padded payload is timed\n"
      "in the same run as the baseline.\n"
      "Outputs are compared with the reference model in the first --check-first\n"
      "rounds, which are warm-up, and in one more round after the timed ones: no\n"
      "timed round is checked (a check downloads and compares on the host).\n"
      "\n"
      "  -n, --ranks N         ranks (world_size)                         [8]\n"
      "  -g, --group-size G    ranks holding the same tokens              [1]\n"
      "  -t, --tokens T        tokens per group per call (m)              [128]\n"
      "      --max-tokens N    the handle's max_tokens, N >= T (what its buffers are sized for) [T]\n"
      "      --bound-m         pass m = max_tokens and the T tokens through bound_m, read on the\n"
      "                        device: the call an engine captures once in a CUDA graph\n"
      "  -e, --experts E       global experts                             [256]\n"
      "  -k, --topk K          experts per token                          [8]\n"
      "      --hidden H        combine row length                         [7168]\n"
      "      --token-bytes B   dispatch payload per token  [hidden: fp8]\n"
      "      --scale-bytes S   scale bytes per token       [hidden/128 floats]\n"
      "      --in-dtype D      expert output dtype: fp32, bf16, fp16      [bf16]\n"
      "      --out-dtype D     combine output dtype                       [bf16]\n"
      "  -r, --rounds R        timed rounds                               [20]\n"
      "  -w, --warmup W        untimed rounds first                       [3]\n"
      "  -s, --seed S          input seed                                 [1]\n"
      "      --transport T     cpu, nvshmem, p2p or auto                  [cpu]\n"
      "      --processes       ranks as processes (socket bootstrap), not threads\n"
      "      --threads         p2p: ranks as threads of this process (several on one GPU\n"
      "                        share it without MPS: run it as one process, mc-launch.sh 1)\n"
      "      --check-first N   check the first N rounds (N >= 1, within the warm-up,\n"
      "                        which grows to N) and one after the timed ones [5]\n"
      "      --no-dense        GPU: skip the dense all-to-all baselines\n"
      "      --nccl            GPU: also time NCCL's grouped send/recv all-to-all of the same\n"
      "                        padded payload (needs one GPU per rank)\n"
      "      --split           other work between each send and its recv\n"
      "      --whole           GPU: dispatch and combine each as one call (MC_SEND_RECV), timed\n"
      "                        as one span: what an engine runs when nothing goes between\n"
      "      --floor           GPU: also time the launch floor: per phase, an empty sending and an\n"
      "                        empty receiving kernel launched as the phase's kernels are (grid,\n"
      "                        block, shared memory, early launch), timed as the phase is (--whole\n"
      "                        or halves, --graph or eager): what no kernel work at all costs\n"
      "      --graph           GPU: time replays of one captured round (CUDA graph: no launch\n"
      "                        overhead on the host); the warm-up rounds run eagerly\n"
      "      --int64-ids       top-k ids as int64 (MC_INDEX_INT64, as torch.topk returns them)\n"
      "      --quantise F      tokens are bf16 rows that dispatch quantises to e4m3 with a scale\n"
      "                        per 128 values, F fp32 or ue8m0 (MC_INPUT_BF16_TO_E4M3; token and\n"
      "                        scale bytes follow from --hidden)\n"
      "      --quantise-apart  with --quantise: a kernel of its own quantises the rows before a\n"
      "                        dispatch of e4m3 bytes, timed with it (what quantising in\n"
      "                        dispatch saves)\n"
      "      --no-check        skip the reference comparison (timing only)\n"
      "      --json            one JSON object on stdout instead of the table\n"
      "      --sizes           print, as JSON, the buffer bytes per rank this shape needs at\n"
      "                        world sizes 1..256 (from the layout header; runs nothing)\n"
      "  -h, --help            this text\n"
      "\n"
      "Latencies: each phase timed on every rank after an out-of-band barrier,\n"
      "median and p99 over all ranks' samples. Bytes: what the library itself\n"
      "counted as sent (records with headers, meta, rows), per rank per round,\n"
      "beside the per-expert design (one copy per (token, expert), as pplx-kernels).\n"
      "Exit status: 0 when every rank matched the reference, 1 otherwise.\n",
      f);
}

static int parse_dtype(const char *s, mc_dtype_t *d) {
  if (!strcmp(s, "fp32")) *d = MC_DTYPE_FP32;
  else if (!strcmp(s, "bf16")) *d = MC_DTYPE_BF16;
  else if (!strcmp(s, "fp16")) *d = MC_DTYPE_FP16;
  else return -1;
  return 0;
}
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

/* What the command line asks for. */
typedef struct {
  mc_case_t c;
  mc_run_opts_t o;
  int json, threads, nccl, sizes_only, dense;
} bench_args_t;

/* Parses the options into *a. Returns -1 to go on, else the exit status. */
static int parse_args(int argc, char **argv, bench_args_t *a) {
  mc_case_t *c = &a->c;
  mc_run_opts_t *o = &a->o;
  int token_bytes_set = 0, scale_bytes_set = 0;
  enum { O_HIDDEN = 256, O_TB, O_SB, O_IN, O_OUT, O_PROC, O_SPLIT, O_NOCHECK, O_JSON, O_TRANSPORT, O_CHECKFIRST,
         O_NODENSE, O_SIZES, O_NCCL, O_GRAPH, O_WHOLE, O_THREADS, O_FLOOR, O_IDS64, O_QUANT, O_QAPART, O_MAXTOK,
         O_BOUND };
  static const struct option longs[] = {
      {"ranks", 1, 0, 'n'},       {"group-size", 1, 0, 'g'}, {"tokens", 1, 0, 't'},   {"experts", 1, 0, 'e'},
      {"topk", 1, 0, 'k'},        {"hidden", 1, 0, O_HIDDEN}, {"token-bytes", 1, 0, O_TB},
      {"scale-bytes", 1, 0, O_SB}, {"in-dtype", 1, 0, O_IN},  {"out-dtype", 1, 0, O_OUT}, {"rounds", 1, 0, 'r'},
      {"warmup", 1, 0, 'w'},      {"seed", 1, 0, 's'},       {"processes", 0, 0, O_PROC}, {"split", 0, 0, O_SPLIT},
      {"threads", 0, 0, O_THREADS},
      {"no-check", 0, 0, O_NOCHECK}, {"json", 0, 0, O_JSON}, {"help", 0, 0, 'h'},     {"transport", 1, 0, O_TRANSPORT},
      {"check-first", 1, 0, O_CHECKFIRST}, {"no-dense", 0, 0, O_NODENSE}, {"sizes", 0, 0, O_SIZES}, {"nccl", 0, 0, O_NCCL},
      {"graph", 0, 0, O_GRAPH},   {"whole", 0, 0, O_WHOLE},
      {"floor", 0, 0, O_FLOOR},   {"int64-ids", 0, 0, O_IDS64}, {"quantise", 1, 0, O_QUANT},
      {"quantise-apart", 0, 0, O_QAPART}, {"max-tokens", 1, 0, O_MAXTOK}, {"bound-m", 0, 0, O_BOUND},
      {0, 0, 0, 0}};
  int ch;
  while ((ch = getopt_long(argc, argv, "n:g:t:e:k:r:w:s:h", longs, NULL)) != -1) {
    switch (ch) {
    case 'n': c->world_size = atoi(optarg); break;
    case 'g': c->group_size = atoi(optarg); break;
    case 't': c->tokens = atoi(optarg); break;
    case O_MAXTOK: c->max_tokens = atoi(optarg); break;
    case O_BOUND: c->bound_fixed = 1; break;
    case 'e': c->num_experts = atoi(optarg); break;
    case 'k': c->topk = atoi(optarg); break;
    case O_HIDDEN: c->hidden = atoi(optarg); break;
    case O_TB: c->token_bytes = strtoull(optarg, NULL, 10), token_bytes_set = 1; break;
    case O_SB: c->scale_bytes = strtoull(optarg, NULL, 10), scale_bytes_set = 1; break;
    case O_IN:
      if (parse_dtype(optarg, &c->in_dtype)) return fprintf(stderr, "--in-dtype: fp32, bf16 or fp16\n"), 2;
      break;
    case O_OUT:
      if (parse_dtype(optarg, &c->out_dtype)) return fprintf(stderr, "--out-dtype: fp32, bf16 or fp16\n"), 2;
      break;
    case 'r': o->rounds = atoi(optarg); break;
    case 'w': o->warmup = atoi(optarg); break;
    case 's': c->seed = strtoull(optarg, NULL, 10); break;
    case O_PROC: o->processes = 1; break;
    case O_THREADS: a->threads = 1; break;
    case O_SPLIT: o->split = 1; break;
    case O_GRAPH: o->graph_timed = 1; break;
    case O_WHOLE: o->whole = 1; break;
    case O_FLOOR: o->floor = 1; break;
    case O_IDS64: o->ids64 = 1; break;
    case O_QUANT:
      if (!strcmp(optarg, "fp32")) c->quant = MC_REF_QUANT_FP32;
      else if (!strcmp(optarg, "ue8m0")) c->quant = MC_REF_QUANT_UE8M0;
      else return fprintf(stderr, "--quantise: fp32 or ue8m0\n"), 2;
      break;
    case O_QAPART: o->quant_apart = 1; break;
    case O_NOCHECK: o->check = 0; break;
    case O_JSON: a->json = 1; break;
    case O_TRANSPORT:
      if (!strcmp(optarg, "cpu")) o->transport = MC_TRANSPORT_CPU;
      else if (!strcmp(optarg, "nvshmem")) o->transport = MC_TRANSPORT_NVSHMEM;
      else if (!strcmp(optarg, "p2p")) o->transport = MC_TRANSPORT_P2P;
      else if (!strcmp(optarg, "auto")) o->transport = MC_TRANSPORT_AUTO;
      else return fprintf(stderr, "--transport: cpu, nvshmem, p2p or auto\n"), 2;
      break;
    case O_CHECKFIRST: o->check_first = atoi(optarg); break;
    case O_NODENSE: a->dense = 0; break;
    case O_SIZES: a->sizes_only = 1; break;
    case O_NCCL:
      if (!mc_bench_have_nccl()) return fprintf(stderr, "--nccl: this mc-bench was built without NCCL\n"), 2;
      a->nccl = 1;
      break;
    case 'h': usage(stdout); return 0;
    default: usage(stderr); return 2;
    }
  }
  if (!token_bytes_set) c->token_bytes = (size_t)c->hidden; /* fp8 */
  if (!scale_bytes_set) c->scale_bytes = mc_quant_scale_bytes(c->hidden, c->quant == MC_REF_QUANT_UE8M0); /* a scale a 128 */
  return -1;
}

/* Checks what the options combine to and fills in what follows from them.
 * Returns -1 to go on, else the exit status. */
static int settle_args(bench_args_t *a) {
  mc_case_t *c = &a->c;
  mc_run_opts_t *o = &a->o;
  if (c->max_tokens == 0) c->max_tokens = c->tokens; /* no --max-tokens: the handle holds -t tokens */
  if (c->tokens < 1 || c->max_tokens < c->tokens)
    return fprintf(stderr, "mc-bench: need 1 <= --tokens <= --max-tokens (see --help)\n"), 2;
  if (c->world_size < 1 || c->group_size < 1 || c->world_size % c->group_size || c->num_experts % c->world_size ||
      o->rounds < 1 || o->warmup < 0) {
    fprintf(stderr, "mc-bench: need ranks %% group-size == 0, experts %% ranks == 0, rounds >= 1 (see --help)\n");
    return 2;
  }
  if (o->check_first < 1) return fprintf(stderr, "--check-first: at least 1 (checked rounds are never timed)\n"), 2;
  if (o->warmup < o->check_first) o->warmup = o->check_first; /* the checked rounds stay out of the samples */
  if ((o->graph_timed || o->whole || o->floor) && o->transport == MC_TRANSPORT_CPU)
    return fprintf(stderr, "--graph, --whole, --floor: GPU timing modes (--transport nvshmem or p2p)\n"), 2;
  if (o->quant_apart && (!c->quant || o->graph_timed))
    return fprintf(stderr, "--quantise-apart: with --quantise, and not with --graph\n"), 2;
  if (a->sizes_only) return -1;
  const int gpu = o->transport == MC_TRANSPORT_NVSHMEM || o->transport == MC_TRANSPORT_P2P;
  if (o->transport == MC_TRANSPORT_P2P) a->dense = 0; /* the dense baselines are NVSHMEM's and NCCL's: run those */
  if (gpu) {
    o->processes = 1; /* one process per rank, as an engine runs them (NVSHMEM: one PE each) */
    if (a->threads && o->transport != MC_TRANSPORT_P2P)
      return fprintf(stderr, "mc-bench: --threads needs --transport p2p (NVSHMEM: one PE per process)\n"), 2;
    if (a->threads) o->processes = 0;
    /* the dense baseline: every rank sends every peer num_local_experts x
     * max_tokens padded records (token + scale bytes) */
    if (a->dense)
      o->dense_bytes = (size_t)(c->num_experts / c->world_size) * c->max_tokens * (c->token_bytes + c->scale_bytes);
    if (a->dense && a->nccl) o->extra_baseline = mc_bench_nccl_alltoall;
  }
  return -1;
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
                                  c->scale_bytes, mc_dtype_size(c->in_dtype));
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
         "\"rounds\": %d, \"warmup\": %d, \"seed\": %llu, \"graph\": %s, \"whole\": %s, \"index_dtype\": \"%s\", "
         "\"quantise\": \"%s\", \"quantise_apart\": %s},\n",
         c->world_size, c->group_size, c->tokens, c->max_tokens, c->bound_fixed ? "true" : "false", c->num_experts,
         c->topk, c->hidden, c->token_bytes, c->scale_bytes, dtype_name(c->in_dtype), dtype_name(c->out_dtype), o->rounds, o->warmup,
         (unsigned long long)c->seed, o->graph_timed ? "true" : "false", o->whole ? "true" : "false",
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
    printf(" \"dense_alltoall\": {\"bytes_per_rank\": %zu, \"median_us\": %.2f, \"p99_us\": %.2f, \"rc\": %d},\n",
           o->dense_bytes * (size_t)W, m->dense_med, m->dense_p99, res->dense_rc);
  if (o->extra_baseline)
    printf(" \"nccl_alltoall\": {\"bytes_per_rank\": %zu, \"median_us\": %.2f, \"p99_us\": %.2f, \"rc\": %d},\n",
           o->dense_bytes * (size_t)W, m->nccl_med, m->nccl_p99, res->extra_rc);
  /* bytes this rank sent per round over the median time of the phase pair */
  printf(" \"GBps_per_rank\": {\"dispatch\": %.2f, \"combine\": %.2f},\n", m->disp / m->med[MC_PH_COUNT] / 1e3,
         m->comb / m->med[MC_PH_COUNT + 1] / 1e3);
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
      printf("\n  dense all-to-all baseline       %12.1f %12.1f   (%.0f MB per rank; %.1fx dispatch+combine)\n",
             m->dense_med, m->dense_p99, (double)o->dense_bytes * W / 1e6, m->dense_med / pair);
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
  if (o->check)
    printf("  combine error vs exact sum    %.3g of sum|w*y| (tolerance %.3g)\n", m->max_err, mc_ref_tolerance(c));
  printf("\n  verdict: %s", m->verdict);
  if (m->failed) printf(" (%d rank(s)): %s", m->failed, mc_run_first_failure(res));
  printf("\n");
}

int main(int argc, char **argv) {
  bench_args_t a = {.dense = 1};
  mc_ref_deepseek_case(8, 128, &a.c);
  a.c.tokens = a.c.max_tokens;
  a.c.max_tokens = 0; /* --max-tokens, else --tokens (settle_args) */
  a.o = (mc_run_opts_t)MC_RUN_OPTS_DEFAULT;
  a.o.rounds = 20;
  a.o.warmup = 3;
  a.o.barrier = 1;
  a.o.check_first = 5;
  int rc = parse_args(argc, argv, &a);
  if (rc < 0) rc = settle_args(&a);
  if (rc >= 0) return rc;
  if (a.sizes_only) {
    print_sizes(&a.c);
    return 0;
  }
  mc_run_result_t res;
  int failed = mc_run(&a.c, &a.o, &res);
  if (failed < 0) {
    fprintf(stderr, "mc-bench: the run could not start\n");
    return 1;
  }
  bench_sum_t m;
  summarize(&a, &res, failed, &m);
  if (a.json) print_json(argc, argv, &a, &res, &m);
  else print_table(&a, &res, &m);
  mc_run_free(&res);
  return failed == 0 ? 0 : 1;
}
