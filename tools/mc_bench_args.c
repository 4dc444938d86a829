/* mc_bench_args.c - mc-bench's options (see mc_bench_args.h). */
#include "mc_bench_args.h"

#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "mc_params.h"
#include "mc_quant.h"

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
      "      --timeout MS      the communicator's timeout: the longest any wait for a peer lasts\n"
      "                        [MC_TIMEOUT_MS, else 10000]\n"
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
      "      --layout L        the receive layout: batched, packed (a row per (token, rank)) or\n"
      "                        sorted (a row per (token, local expert), each expert's rows aligned)\n"
      "                        [batched]\n"
      "      --align A         sorted: each expert's rows start at a multiple of A, 1..1024  [1]\n"
      "      --capacity C      packed or sorted: rows each send half declares (a round that brings\n"
      "                        more fails on every rank); 0: mc_dispatch_counts between the halves\n"
      "                        sizes the buffers [0]\n"
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
      "\n"
      "Memory: expert_x, expert_scale and expert_y are as large as the API sizes them\n"
      "(local experts x ranks/group-size x max-tokens slots); on the cpu transport\n"
      "only the pages a round fills take memory. On a GPU they all do: where one\n"
      "GPU cannot hold its ranks' buffers, mc-bench says so before it starts.\n"
      "\n"
      "Exit status: 0 when every rank matched the reference; 1 when one did not, or\n"
      "the run never got through a round (the cause on stderr, no table); 2 for an\n"
      "argument that breaks a rule (one line names it) or a shape the GPU cannot hold.\n",
      f);
}

void mc_bench_defaults(bench_args_t *a, int have_nccl) {
  memset(a, 0, sizeof *a);
  a->dense = 1;
  a->have_nccl = have_nccl;
  mc_ref_deepseek_case(8, 128, &a->c);
  a->c.tokens = a->c.max_tokens;
  a->c.max_tokens = 0; /* --max-tokens, else --tokens (settle) */
  a->o = (mc_run_opts_t)MC_RUN_OPTS_DEFAULT;
  a->o.rounds = 20;
  a->o.warmup = 3;
  a->o.barrier = 1;
  a->o.check_first = 5;
}

/* The one parser of numbers: decimal digits only (no sign, no space,
 * nothing after them) of a value in lo..hi. 0 with *v set; else 2 after a
 * line on err naming the option and its text. */
static int number(FILE *err, const char *opt, const char *text, unsigned long long lo, unsigned long long hi,
                  unsigned long long *v) {
  char *end = NULL;
  errno = 0;
  unsigned long long x = text[0] >= '0' && text[0] <= '9' ? strtoull(text, &end, 10) : 0;
  if (!end || *end != '\0') return fprintf(err, "mc-bench: %s '%s': not a whole number\n", opt, text), 2;
  if (errno == ERANGE || x < lo || x > hi)
    return fprintf(err, "mc-bench: %s '%s': out of range %llu..%llu\n", opt, text, lo, hi), 2;
  *v = x;
  return 0;
}
/* The same into an int or a size_t. */
static int number_int(FILE *err, const char *opt, const char *text, int lo, int hi, int *v) {
  unsigned long long x;
  int rc = number(err, opt, text, (unsigned long long)lo, (unsigned long long)hi, &x);
  if (rc == 0) *v = (int)x;
  return rc;
}
static int number_size(FILE *err, const char *opt, const char *text, size_t hi, size_t *v) {
  unsigned long long x;
  int rc = number(err, opt, text, 0, hi, &x);
  if (rc == 0) *v = (size_t)x;
  return rc;
}

static int parse_dtype(const char *s, mc_dtype_t *d) {
  if (!strcmp(s, "fp32")) *d = MC_DTYPE_FP32;
  else if (!strcmp(s, "bf16")) *d = MC_DTYPE_BF16;
  else if (!strcmp(s, "fp16")) *d = MC_DTYPE_FP16;
  else return -1;
  return 0;
}

enum { MAX_ROUNDS = 1000000 };

/* The options into *a. Returns -1 to go on, else the exit status. */
static int parse(int argc, char **argv, bench_args_t *a, FILE *out, FILE *err) {
  mc_case_t *c = &a->c;
  mc_run_opts_t *o = &a->o;
  int token_bytes_set = 0, scale_bytes_set = 0, timeout_set = 0;
  enum { O_HIDDEN = 256, O_TB, O_SB, O_IN, O_OUT, O_PROC, O_SPLIT, O_NOCHECK, O_JSON, O_TRANSPORT, O_CHECKFIRST,
         O_NODENSE, O_SIZES, O_NCCL, O_GRAPH, O_WHOLE, O_THREADS, O_FLOOR, O_IDS64, O_QUANT, O_QAPART, O_MAXTOK,
         O_BOUND, O_TIMEOUT, O_LAYOUT, O_ALIGN, O_CAPACITY };
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
      {"timeout", 1, 0, O_TIMEOUT}, {"layout", 1, 0, O_LAYOUT}, {"align", 1, 0, O_ALIGN},
      {"capacity", 1, 0, O_CAPACITY}, {0, 0, 0, 0}};
  int ch, rc = 0;
  unsigned long long seed;
  optind = 0; /* a fresh scan (glibc), also when called again */
  opterr = 0; /* the messages below name the rule instead */
  while (rc == 0 && (ch = getopt_long(argc, argv, ":n:g:t:e:k:r:w:s:h", longs, NULL)) != -1) {
    switch (ch) {
    /* the API's ranges (docs/api.md) where it has them */
    case 'n': rc = number_int(err, "--ranks", optarg, 1, 65535, &c->world_size); break;
    case 'g': rc = number_int(err, "--group-size", optarg, 1, 65535, &c->group_size); break;
    case 't': rc = number_int(err, "--tokens", optarg, 1, 1 << 20, &c->tokens); break;
    case O_MAXTOK: rc = number_int(err, "--max-tokens", optarg, 1, 1 << 20, &c->max_tokens); break;
    case O_BOUND: c->bound_fixed = 1; break;
    case 'e': rc = number_int(err, "--experts", optarg, 1, INT_MAX, &c->num_experts); break;
    case 'k': rc = number_int(err, "--topk", optarg, 1, MC_MAX_TOPK, &c->topk); break;
    case O_HIDDEN: rc = number_int(err, "--hidden", optarg, 8, 1 << 22, &c->hidden); break;
    case O_TB: rc = number_size(err, "--token-bytes", optarg, 1u << 24, &c->token_bytes), token_bytes_set = 1; break;
    case O_SB: rc = number_size(err, "--scale-bytes", optarg, 1u << 20, &c->scale_bytes), scale_bytes_set = 1; break;
    case O_IN:
      if (parse_dtype(optarg, &c->in_dtype)) return fprintf(err, "mc-bench: --in-dtype '%s': fp32, bf16 or fp16\n", optarg), 2;
      break;
    case O_OUT:
      if (parse_dtype(optarg, &c->out_dtype)) return fprintf(err, "mc-bench: --out-dtype '%s': fp32, bf16 or fp16\n", optarg), 2;
      break;
    case 'r': rc = number_int(err, "--rounds", optarg, 1, MAX_ROUNDS, &o->rounds); break;
    case 'w': rc = number_int(err, "--warmup", optarg, 0, MAX_ROUNDS, &o->warmup); break;
    case 's':
      if (!(rc = number(err, "--seed", optarg, 0, UINT64_MAX, &seed))) c->seed = seed;
      break;
    case O_TIMEOUT: rc = number_int(err, "--timeout", optarg, 1, MC_TIMEOUT_MS_MAX, &o->timeout_ms), timeout_set = 1; break;
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
      else return fprintf(err, "mc-bench: --quantise '%s': fp32 or ue8m0\n", optarg), 2;
      break;
    case O_QAPART: o->quant_apart = 1; break;
    case O_LAYOUT:
      if (!strcmp(optarg, "batched")) c->layout = MC_LAYOUT_BATCHED;
      else if (!strcmp(optarg, "packed")) c->layout = MC_LAYOUT_PACKED;
      else if (!strcmp(optarg, "sorted")) c->layout = MC_LAYOUT_EXPERT_SORTED;
      else return fprintf(err, "mc-bench: --layout '%s': batched, packed or sorted\n", optarg), 2;
      break;
    case O_ALIGN: rc = number_int(err, "--align", optarg, 1, 1024, &c->expert_align); break;
    case O_CAPACITY:
      if (!(rc = number(err, "--capacity", optarg, 0, (1ull << 40), &seed))) c->declare = (int64_t)seed;
      break;
    case O_NOCHECK: o->check = 0; break;
    case O_JSON: a->json = 1; break;
    case O_TRANSPORT:
      if (!strcmp(optarg, "cpu")) o->transport = MC_TRANSPORT_CPU;
      else if (!strcmp(optarg, "nvshmem")) o->transport = MC_TRANSPORT_NVSHMEM;
      else if (!strcmp(optarg, "p2p")) o->transport = MC_TRANSPORT_P2P;
      else if (!strcmp(optarg, "auto")) o->transport = MC_TRANSPORT_AUTO;
      else return fprintf(err, "mc-bench: --transport '%s': cpu, nvshmem, p2p or auto\n", optarg), 2;
      break;
    case O_CHECKFIRST: rc = number_int(err, "--check-first", optarg, 1, MAX_ROUNDS, &o->check_first); break;
    case O_NODENSE: a->dense = 0; break;
    case O_SIZES: a->sizes_only = 1; break;
    case O_NCCL:
      if (!a->have_nccl) return fprintf(err, "mc-bench: --nccl: this mc-bench was built without NCCL\n"), 2;
      a->nccl = 1;
      break;
    case 'h': usage(out); return 0;
    case ':': return fprintf(err, "mc-bench: %s needs a value\n", argv[optind - 1]), 2;
    default:
      if (optopt) return fprintf(err, "mc-bench: unknown option '-%c' (see --help)\n", optopt), 2;
      return fprintf(err, "mc-bench: unknown option '%s' (see --help)\n", argv[optind - 1]), 2;
    }
  }
  if (rc) return rc;
  if (optind < argc) return fprintf(err, "mc-bench: unexpected argument '%s' (see --help)\n", argv[optind]), 2;
  /* MC_TIMEOUT_MS where --timeout is absent; checked either way, as the
   * library reads it too (a malformed one fails every communicator) */
  const char *env = getenv("MC_TIMEOUT_MS");
  int env_ms = 0;
  if (env && *env && (rc = number_int(err, "MC_TIMEOUT_MS", env, 1, MC_TIMEOUT_MS_MAX, &env_ms)) != 0) return rc;
  if (env_ms && !timeout_set) o->timeout_ms = env_ms;
  if (!token_bytes_set) c->token_bytes = (size_t)c->hidden; /* fp8 */
  if (!scale_bytes_set) c->scale_bytes = mc_quant_scale_bytes(c->hidden, c->quant == MC_REF_QUANT_UE8M0); /* a scale a 128 */
  return -1;
}

/* The packed layouts' baseline: the bytes (token + scale) of the records
 * the first timed round's inputs make, summed over every rank and spread
 * evenly over every (rank, peer) pair: an all-to-all of the same bytes with
 * none of the padding a dense design needs. */
static size_t unpadded_bytes(const mc_case_t *c) {
  uint64_t records = 0;
  for (int g = 0; g < mc_ref_num_groups(c); g++) {
    mc_input_t in;
    if (mc_ref_input(c, 1, g, &in) != 0) return 16;
    for (int r = g * c->group_size; r < (g + 1) * c->group_size; r++) records += mc_ref_records_sent(c, &in, r);
    mc_ref_input_free(&in);
  }
  const uint64_t pairs = (uint64_t)c->world_size * (uint64_t)c->world_size;
  const uint64_t bytes = (records * (uint64_t)(c->token_bytes + c->scale_bytes) + pairs - 1) / pairs;
  return (size_t)mc_align_up(bytes ? bytes : 16, 16);
}

/* Checks what the options combine to, a message a rule, and fills in what
 * follows from them. Returns -1 to go on, else the exit status. */
static int settle(bench_args_t *a, FILE *err) {
  mc_case_t *c = &a->c;
  mc_run_opts_t *o = &a->o;
  if (c->max_tokens == 0) c->max_tokens = c->tokens; /* no --max-tokens: the handle holds -t tokens */
  if (c->max_tokens < c->tokens)
    return fprintf(err, "mc-bench: --max-tokens %d: below --tokens %d\n", c->max_tokens, c->tokens), 2;
  if (c->world_size % c->group_size)
    return fprintf(err, "mc-bench: --group-size %d: ranks %d is not a multiple of %d\n", c->group_size,
                   c->world_size, c->group_size), 2;
  if (c->num_experts % c->world_size)
    return fprintf(err, "mc-bench: --ranks %d: num_experts %d is not a multiple of %d\n", c->world_size,
                   c->num_experts, c->world_size), 2;
  if (o->warmup < o->check_first) o->warmup = o->check_first; /* the checked rounds stay out of the samples */
  const struct { int on; const char *name; } gpu_modes[] = {
      {o->graph_timed, "--graph"}, {o->whole, "--whole"}, {o->floor, "--floor"}};
  for (size_t i = 0; i < sizeof gpu_modes / sizeof gpu_modes[0]; i++)
    if (gpu_modes[i].on && o->transport == MC_TRANSPORT_CPU)
      return fprintf(err, "mc-bench: %s: a GPU timing mode (--transport nvshmem or p2p)\n", gpu_modes[i].name), 2;
  if (o->quant_apart && !c->quant) return fprintf(err, "mc-bench: --quantise-apart: needs --quantise\n"), 2;
  if (o->quant_apart && o->graph_timed) return fprintf(err, "mc-bench: --quantise-apart: not with --graph\n"), 2;
  if (c->expert_align > 1 && c->layout != MC_LAYOUT_EXPERT_SORTED)
    return fprintf(err, "mc-bench: --align %d: only with --layout sorted\n", c->expert_align), 2;
  if (c->declare && c->layout == MC_LAYOUT_BATCHED)
    return fprintf(err, "mc-bench: --capacity: only with --layout packed or sorted\n"), 2;
  if (c->layout != MC_LAYOUT_BATCHED && (o->graph_timed || o->floor || c->bound_fixed))
    return fprintf(err, "mc-bench: --layout %s: not with --graph, --floor or --bound-m (the count step synchronises "
                   "the host)\n", c->layout == MC_LAYOUT_PACKED ? "packed" : "sorted"), 2;
  if (a->sizes_only) return -1;
  const int gpu = o->transport == MC_TRANSPORT_NVSHMEM || o->transport == MC_TRANSPORT_P2P;
  if (o->transport == MC_TRANSPORT_P2P) a->dense = 0; /* the dense baselines are NVSHMEM's and NCCL's: run those */
  if (gpu) {
    o->processes = 1; /* one process per rank, as an engine runs them (NVSHMEM: one PE each) */
    if (a->threads && o->transport != MC_TRANSPORT_P2P)
      return fprintf(err, "mc-bench: --threads: needs --transport p2p (NVSHMEM: one PE per process)\n"), 2;
    if (a->threads) o->processes = 0;
    /* the dense baseline: every rank sends every peer num_local_experts x
     * max_tokens padded records (token + scale bytes); for the packed
     * layouts, which do not pad, the records' bytes unpadded */
    if (a->dense)
      o->dense_bytes = c->layout == MC_LAYOUT_BATCHED ? (size_t)(c->num_experts / c->world_size) * c->max_tokens *
                                                             (c->token_bytes + c->scale_bytes)
                                                       : unpadded_bytes(c);
  }
  a->nccl = a->nccl && gpu && a->dense;
  return -1;
}

int mc_bench_args(int argc, char **argv, bench_args_t *a, FILE *out, FILE *err) {
  int rc = parse(argc, argv, a, out, err);
  return rc < 0 ? settle(a, err) : rc;
}
