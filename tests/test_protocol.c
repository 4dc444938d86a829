/* test_protocol.c - the protocol on the cpu transport against the reference
 * model: random shapes, every group size, every dtype pair, edge routings,
 * split halves, thousands of rounds, several handles, processes. Inputs are
 * drawn fresh from the run's seed; a failure prints the seed and the case. */
#include <string.h>

#include "mc_quant.h"
#include "mc_ref_run.h"
#include "mc_test.h"

int mc_test_run_case(const mc_case_t *c, const mc_run_opts_t *o) {
  mc_run_result_t res;
  int failed = mc_run(c, o, &res);
  char desc[400];
  mc_ref_describe(c, desc, sizeof desc);
  if (failed != 0) {
    fprintf(stderr, "case: %s\n%s\n", desc, failed < 0 ? "could not start" : mc_run_first_failure(&res));
    mc_run_free(&res);
    return 1;
  }
  mc_run_free(&res);
  return 0;
}

static uint64_t case_seed(int i) { return mc_test_seed * 1000003ull + (uint64_t)i; }

int test_random_configs(void) {
  for (int i = 0; i < 24; i++) {
    mc_case_t c;
    mc_ref_random_case(case_seed(i), &c);
    mc_run_opts_t o = MC_RUN_OPTS_DEFAULT;
    o.rounds = 3;
    o.split = i % 2;
    MC_CHECK(mc_test_run_case(&c, &o) == 0);
  }
  return 0;
}

int test_world_sizes(void) {
  for (int w = 1; w <= 16; w++) {
    mc_case_t c;
    mc_ref_random_case(case_seed(w), &c);
    c.world_size = w;
    c.group_size = w % 4 == 0 ? 4 : w % 2 == 0 ? 2 : 1;
    c.num_experts = w * (1 + (int)(case_seed(w) % 8));
    if (c.topk > c.num_experts) c.topk = c.num_experts;
    mc_run_opts_t o = MC_RUN_OPTS_DEFAULT;
    o.rounds = 2;
    MC_CHECK(mc_test_run_case(&c, &o) == 0);
  }
  return 0;
}

/* MC_INPUT_BF16_TO_E4M3: dispatch quantises bf16 rows in its send half;
 * expert_x and expert_scale must hold, byte for byte, what the reference
 * quantiser (ref/mc_ref_quant.c) makes of them, in both scale
 * formats, over world and group sizes, with refused calls among the rounds
 * (scales passed while quantising among them) and as processes too; and
 * the way it replaces, rows quantised apart first (mc_dev_quantise, the
 * same rules) and dispatched as bytes. */
int test_quant_dispatch(void) {
  for (int i = 0; i < 12; i++) {
    mc_case_t c;
    mc_ref_random_case(case_seed(100 + i), &c);
    c.world_size = 1 + i % 4 + (i >= 8 ? 4 : 0);
    c.group_size = c.world_size % 2 == 0 && i % 3 == 0 ? 2 : 1;
    c.num_experts = c.world_size * 4;
    c.topk = c.topk < c.num_experts ? c.topk : c.num_experts;
    c.quant = i % 2 ? MC_REF_QUANT_UE8M0 : MC_REF_QUANT_FP32;
    c.hidden = 512 * (1 + i % 3);
    c.token_bytes = (size_t)c.hidden;
    c.scale_bytes = mc_quant_scale_bytes(c.hidden, c.quant == MC_REF_QUANT_UE8M0);
    c.expert_identity = 0;
    mc_run_opts_t o = MC_RUN_OPTS_DEFAULT;
    o.rounds = 3;
    o.inject_bad = i % 4 == 1;
    o.processes = i % 5 == 2;
    o.quant_apart = i % 4 == 3;
    MC_CHECK(mc_test_run_case(&c, &o) == 0);
  }
  return 0;
}

int test_group_sizes(void) {
  static const int gs[] = {1, 2, 4, 8};
  for (int i = 0; i < 4; i++) {
    mc_case_t c;
    mc_ref_random_case(case_seed(i), &c);
    c.world_size = 8;
    c.group_size = gs[i];
    c.num_experts = 64;
    c.topk = 6;
    mc_run_opts_t o = MC_RUN_OPTS_DEFAULT;
    o.rounds = 3;
    MC_CHECK(mc_test_run_case(&c, &o) == 0);
  }
  return 0;
}

int test_dtypes(void) {
  for (int in = 0; in < 3; in++)
    for (int out = 0; out < 3; out++) {
      mc_case_t c;
      mc_ref_random_case(case_seed(in * 3 + out), &c);
      c.world_size = 4;
      c.group_size = 2;
      c.num_experts = 32;
      c.topk = 4;
      c.in_dtype = (mc_dtype_t)in;
      c.out_dtype = (mc_dtype_t)out;
      mc_run_opts_t o = MC_RUN_OPTS_DEFAULT;
      o.rounds = 2;
      MC_CHECK(mc_test_run_case(&c, &o) == 0);
    }
  return 0;
}

int test_payload_sizes(void) {
  static const size_t tb[] = {16, 48, 2048, 7168};
  for (int i = 0; i < 4; i++) {
    mc_case_t c;
    mc_ref_random_case(case_seed(i), &c);
    c.world_size = 4;
    c.group_size = 1;
    c.num_experts = 32;
    c.topk = 8;
    c.max_tokens = 16;
    c.token_bytes = tb[i];
    c.scale_bytes = i % 2 ? tb[i] / 128 * 4 + 4 : 0;
    c.hidden = 64;
    mc_run_opts_t o = MC_RUN_OPTS_DEFAULT;
    o.rounds = 2;
    MC_CHECK(mc_test_run_case(&c, &o) == 0);
  }
  return 0;
}

int test_deepseek_shape(void) {
  mc_case_t c;
  mc_ref_deepseek_case(8, 4, &c); /* the real shape, few tokens to stay quick */
  c.seed = mc_test_seed;
  mc_run_opts_t o = MC_RUN_OPTS_DEFAULT;
  o.rounds = 2;
  MC_CHECK(mc_test_run_case(&c, &o) == 0);
  return 0;
}

int test_zero_tokens(void) {
  for (int i = 0; i < 4; i++) {
    mc_case_t c;
    mc_ref_random_case(case_seed(i), &c);
    c.world_size = 6;
    c.group_size = i % 2 ? 2 : 1;
    c.num_experts = 24;
    c.topk = 3;
    c.zero_tokens = 1;
    c.max_tokens = 1 + i; /* small: m = 0 comes often, and m = 1 */
    mc_run_opts_t o = MC_RUN_OPTS_DEFAULT;
    o.rounds = 12;
    MC_CHECK(mc_test_run_case(&c, &o) == 0);
  }
  return 0;
}

int test_one_expert(void) {
  mc_case_t c;
  mc_ref_random_case(case_seed(0), &c);
  c.world_size = 4;
  c.group_size = 1;
  c.num_experts = 16;
  c.topk = 1;
  c.max_tokens = 32;
  c.routing = MC_ROUTING_ONE_EXPERT; /* every token of a round to the same expert */
  c.zero_tokens = 0;
  c.use_bound_m = 0;
  mc_run_opts_t o = MC_RUN_OPTS_DEFAULT;
  o.rounds = 3;
  MC_CHECK(mc_test_run_case(&c, &o) == 0);
  c.topk = 4; /* and every token to the same four experts */
  MC_CHECK(mc_test_run_case(&c, &o) == 0);
  return 0;
}

int test_bound_m(void) {
  for (int i = 0; i < 3; i++) {
    mc_case_t c;
    mc_ref_random_case(case_seed(i), &c);
    c.world_size = 4;
    c.group_size = i == 2 ? 2 : 1;
    c.num_experts = 16;
    c.topk = 2;
    c.use_bound_m = 1;
    mc_run_opts_t o = MC_RUN_OPTS_DEFAULT;
    o.rounds = 8;
    MC_CHECK(mc_test_run_case(&c, &o) == 0);
  }
  return 0;
}

int test_split_halves(void) {
  mc_case_t c;
  mc_ref_random_case(case_seed(0), &c);
  c.world_size = 5;
  c.group_size = 1;
  c.num_experts = 40;
  c.topk = 5;
  mc_run_opts_t o = MC_RUN_OPTS_DEFAULT;
  o.rounds = 6;
  o.split = 1; /* other work between each send and its recv */
  MC_CHECK(mc_test_run_case(&c, &o) == 0);
  return 0;
}

int test_many_rounds(void) {
  /* Buffer reuse: 2000 rounds, new routing and token counts every round,
   * small payloads so that the rounds, not the bytes, take the time. */
  mc_case_t c;
  mc_ref_random_case(case_seed(0), &c);
  c.world_size = 4;
  c.group_size = 2;
  c.num_experts = 16;
  c.topk = 3;
  c.max_tokens = 12;
  c.token_bytes = 32;
  c.scale_bytes = 8;
  c.hidden = 16;
  c.zero_tokens = 1;
  c.use_bound_m = 1;
  mc_run_opts_t o = MC_RUN_OPTS_DEFAULT;
  o.rounds = 2000;
  o.split = 1;
  MC_CHECK(mc_test_run_case(&c, &o) == 0);
  return 0;
}

int test_many_handles(void) {
  mc_case_t c;
  mc_ref_random_case(case_seed(0), &c);
  c.world_size = 4;
  c.group_size = 1;
  c.num_experts = 8;
  c.topk = 2;
  mc_run_opts_t o = MC_RUN_OPTS_DEFAULT;
  o.rounds = 9;
  o.handles = 3; /* three layers' handles alive, used in turn */
  MC_CHECK(mc_test_run_case(&c, &o) == 0);
  return 0;
}

int test_processes(void) {
  mc_case_t c;
  mc_ref_random_case(case_seed(0), &c);
  c.world_size = 4;
  c.group_size = 2;
  c.num_experts = 32;
  c.topk = 4;
  mc_run_opts_t o = MC_RUN_OPTS_DEFAULT;
  o.rounds = 20;
  o.processes = 1;
  o.split = 1;
  MC_CHECK(mc_test_run_case(&c, &o) == 0);
  return 0;
}

/* int64 top-k ids (as torch.topk returns them), read in place: random
 * shapes and groups, bound_m, bad calls (an id of 2^32 plus a valid one
 * included: narrowing would take it for the valid one), threads and
 * processes. */
int test_int64_ids(void) {
  for (int i = 0; i < 4; i++) {
    mc_case_t c;
    mc_ref_random_case(case_seed(300 + i), &c);
    if (c.world_size > 6) {
      c.world_size = 6;
      c.group_size = i % 2 ? 2 : 1;
      c.num_experts = 24;
      if (c.topk > 4) c.topk = 4;
    }
    c.use_bound_m = 1;
    mc_run_opts_t o = MC_RUN_OPTS_DEFAULT;
    o.rounds = 3;
    o.ids64 = 1;
    o.inject_bad = 1;
    o.processes = i == 3;
    MC_CHECK(mc_test_run_case(&c, &o) == 0);
  }
  return 0;
}

int test_bad_calls_change_nothing(void) {
  for (int i = 0; i < 6; i++) {
    mc_case_t c;
    mc_ref_random_case(case_seed(i), &c);
    if (c.world_size > 6) { /* keep it quick: every rank makes a dozen bad calls a round */
      c.world_size = 6;
      c.group_size = 2;
      c.num_experts = 24;
      if (c.topk > 4) c.topk = 4;
    }
    mc_run_opts_t o = MC_RUN_OPTS_DEFAULT;
    o.rounds = 3;
    o.inject_bad = 1;
    MC_CHECK(mc_test_run_case(&c, &o) == 0);
  }
  return 0;
}
