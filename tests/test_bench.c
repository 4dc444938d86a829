/* test_bench.c - mc-bench's command line and its GPU memory check: every
 * number through one strict parser, one line for each broken rule, naming
 * it, and exit status 2; --timeout and MC_TIMEOUT_MS reach the options the
 * communicator is made with; a shape whose buffers one GPU cannot hold is
 * refused with the bytes needed and free. */
#include <stdlib.h>
#include <string.h>

#include "mc_bench_args.h"
#include "mc_bench_fit.h"
#include "mc_dtype.h"
#include "mc_layout.h"
#include "mc_test.h"

/* mc_bench_args on mc-bench's arguments `words` (NULL-terminated): its
 * status, *a, and what it wrote on err into msg. */
static int bench_args(const char *const *words, bench_args_t *a, char *msg, size_t n) {
  char *argv[32] = {"mc-bench"};
  int argc = 1;
  for (; words[argc - 1] && argc < 31; argc++) argv[argc] = (char *)words[argc - 1];
  char *text = NULL, *help = NULL;
  size_t len = 0, help_len = 0;
  FILE *err = open_memstream(&text, &len), *out = open_memstream(&help, &help_len);
  if (!err || !out) return -2;
  mc_bench_defaults(a, 0);
  const int rc = mc_bench_args(argc, argv, a, out, err);
  fclose(err), fclose(out);
  snprintf(msg, n, "%s", text);
  free(text), free(help);
  return rc;
}
#define ARGS(a, msg, ...) bench_args((const char *const[]){__VA_ARGS__, NULL}, a, msg, sizeof msg)

/* A refusal: status 2 and one line that holds `needle`. */
#define REFUSED(needle, ...)                                                                                           \
  do {                                                                                                                 \
    bench_args_t a_;                                                                                                   \
    char m_[256];                                                                                                      \
    const int rc_ = ARGS(&a_, m_, __VA_ARGS__);                                                                        \
    MC_CHECK_MSG(rc_ == 2 && strstr(m_, needle) && strchr(m_, '\n') == m_ + strlen(m_) - 1,                            \
                 "%s: status %d, '%s'", #__VA_ARGS__, rc_, m_);                                                        \
  } while (0)

int test_bench_args(void) {
  unsetenv("MC_TIMEOUT_MS");
  bench_args_t a;
  char msg[256];
  MC_CHECK(ARGS(&a, msg, "-n", "4", "-t", "64", "-w", "1") == -1 && msg[0] == '\0');
  MC_CHECK(a.c.world_size == 4 && a.c.tokens == 64 && a.c.max_tokens == 64 && a.o.timeout_ms == 10000);
  MC_CHECK(a.o.warmup == 5); /* grown to the checked rounds */
  MC_CHECK(ARGS(&a, msg, "--seed", "18446744073709551615") == -1 && a.c.seed == UINT64_MAX);
  MC_CHECK(ARGS(&a, msg, "--help") == 0);
  /* numbers: the option and its text named, once */
  REFUSED("mc-bench: --tokens 'abc': not a whole number\n", "-t", "abc");
  REFUSED("--tokens '': not a whole number", "-t", "");
  REFUSED("--tokens '12x': not a whole number", "--tokens", "12x");
  REFUSED("--tokens ' 12': not a whole number", "-t", " 12");
  REFUSED("--tokens '+12': not a whole number", "-t", "+12");
  REFUSED("--rounds '-1': not a whole number", "-r", "-1");
  REFUSED("--tokens '0': out of range 1..1048576", "-t", "0");
  REFUSED("--tokens '99999999999999999999999': out of range", "-t", "99999999999999999999999");
  REFUSED("--ranks '4294967297': out of range 1..65535", "-n", "4294967297");
  REFUSED("--seed '18446744073709551616': out of range", "--seed", "18446744073709551616");
  REFUSED("--rounds '0': out of range", "-r", "0");
  REFUSED("--topk '17': out of range 1..16", "-k", "17");
  REFUSED("--timeout '0': out of range 1..86400000", "--timeout", "0");
  REFUSED("--token-bytes '16777217': out of range", "--token-bytes", "16777217");
  /* the rules, one line each */
  REFUSED("mc-bench: --ranks 6: num_experts 256 is not a multiple of 6\n", "-n", "6");
  REFUSED("--group-size 3: ranks 8 is not a multiple of 3", "-g", "3");
  REFUSED("--max-tokens 32: below --tokens 64", "-t", "64", "--max-tokens", "32");
  REFUSED("--floor: a GPU timing mode", "--floor");
  REFUSED("--graph: a GPU timing mode", "--graph");
  REFUSED("--quantise-apart: needs --quantise", "--quantise-apart");
  REFUSED("--quantise-apart: not with --graph", "--transport", "p2p", "--quantise", "fp32", "--quantise-apart",
          "--graph");
  REFUSED("--threads: needs --transport p2p", "--transport", "nvshmem", "--threads");
  REFUSED("--nccl: this mc-bench was built without NCCL", "--nccl");
  REFUSED("--transport 'gpu': cpu, nvshmem, p2p or auto", "--transport", "gpu");
  REFUSED("unknown option '--tokns'", "--tokns", "4");
  REFUSED("unknown option '-x'", "-x");
  REFUSED("-t needs a value", "-t");
  REFUSED("unexpected argument '8'", "-n", "2", "8");
  return 0;
}

int test_bench_timeout(void) {
  bench_args_t a;
  char msg[256];
  unsetenv("MC_TIMEOUT_MS");
  MC_CHECK(ARGS(&a, msg, "--timeout", "2500") == -1 && a.o.timeout_ms == 2500);
  setenv("MC_TIMEOUT_MS", "3000", 1);
  MC_CHECK(ARGS(&a, msg, "-n", "2") == -1 && a.o.timeout_ms == 3000);
  MC_CHECK(ARGS(&a, msg, "--timeout", "2500") == -1 && a.o.timeout_ms == 2500); /* the option wins */
  setenv("MC_TIMEOUT_MS", "", 1); /* empty: unset, as the library reads it */
  MC_CHECK(ARGS(&a, msg, "-n", "2") == -1 && a.o.timeout_ms == 10000);
  setenv("MC_TIMEOUT_MS", "3s", 1); /* the library would refuse every communicator */
  REFUSED("MC_TIMEOUT_MS '3s': not a whole number", "-n", "2");
  REFUSED("MC_TIMEOUT_MS '3s': not a whole number", "--timeout", "2500");
  unsetenv("MC_TIMEOUT_MS");
  /* what the options set is what the communicator is made with: a stalled
   * rank makes the others time out after the timeout the option gave */
  MC_CHECK(ARGS(&a, msg, "-n", "2", "-t", "4", "-e", "4", "-k", "2", "--hidden", "64", "--timeout", "300") == -1);
  a.o.stall_rank = 1;
  a.o.stall_round = 0;
  a.o.warmup = 0, a.o.rounds = 1, a.o.barrier = 0;
  mc_run_result_t res;
  MC_CHECK(mc_run(&a.c, &a.o, &res) >= 1);
  fprintf(stderr, "rank 0: %s\n", res.ranks[0].msg);
  MC_CHECK_MSG(res.ranks[0].api_rc == MC_ERR_TIMEOUT && strstr(res.ranks[0].msg, "300 ms"), "%s", res.ranks[0].msg);
  mc_run_free(&res);
  return 0;
}

int test_bench_gpu_fit(void) {
  /* the DeepSeek-V3 layer at EP8, 4096 tokens: expert_x, expert_scale and
   * expert_y of 32 experts x 8 x 4096 slots are 22.8 GB a rank */
  mc_case_t c;
  mc_ref_deepseek_case(8, 4096, &c);
  mc_run_opts_t o = MC_RUN_OPTS_DEFAULT;
  o.transport = MC_TRANSPORT_P2P;
  uint64_t library;
  const uint64_t rank = mc_run_gpu_bytes(&c, &o, &library), slots = 32ull * 8 * 4096;
  const mc_shape_t sh = mc_shape_make(8, 1, 256, 8, 4096, 7168, 7168, 224, 2, 0, 1);
  MC_CHECK(library == mc_window_bytes(&sh) + mc_workspace_bytes(&sh));
  const uint64_t caller = rank - library, slot_bytes = slots * (7168 + 224 + 7168 * 2);
  /* besides the slots: out, the inputs and 16 MB of scratch, under 1 GB */
  MC_CHECK_MSG(caller > slot_bytes && caller - slot_bytes < (1ull << 30), "%llu of %llu", (unsigned long long)caller,
               (unsigned long long)slot_bytes);
  /* one H200's free memory (about 140 GB): eight ranks on it cannot fit,
   * one can */
  const uint64_t h200 = 140000000000ull;
  char why[512], num[32];
  MC_CHECK(mc_bench_gpu_fit(&c, &o, 8, h200, why, sizeof why) == 2);
  fprintf(stderr, "%s\n", why);
  snprintf(num, sizeof num, "needs %llu bytes", (unsigned long long)rank);
  MC_CHECK(strstr(why, num) != NULL);
  snprintf(num, sizeof num, "%llu bytes", (unsigned long long)h200);
  MC_CHECK(strstr(why, num) != NULL && strstr(why, "32 experts x 32768 slots") != NULL);
  MC_CHECK(mc_bench_gpu_fit(&c, &o, 1, h200, why, sizeof why) == 0);
  /* the edge: exactly enough fits, a byte less does not */
  MC_CHECK(mc_bench_gpu_fit(&c, &o, 8, 8 * rank, why, sizeof why) == 0);
  MC_CHECK(mc_bench_gpu_fit(&c, &o, 8, 8 * rank - 1, why, sizeof why) == 2);
  /* each handle has its own library buffers */
  o.handles = 3;
  uint64_t three;
  MC_CHECK(mc_run_gpu_bytes(&c, &o, &three) == caller + 3 * library && three == 3 * library);
  /* the default shape, 128 tokens: eight ranks share one H200 */
  mc_ref_deepseek_case(8, 128, &c);
  o.handles = 1;
  MC_CHECK(mc_bench_gpu_fit(&c, &o, 8, h200, why, sizeof why) == 0);
  return 0;
}
