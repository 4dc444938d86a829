/* test_gpu.c - the GPU transports against the same reference model, ranks
 * as processes (several on one GPU under MPS: run through
 * scripts/mc-launch.sh). Each test skips (exit 77) where no CUDA device is
 * visible or the build has no GPU transport. Inputs are fresh per run; a
 * failure prints the seed and the case. Quantising in dispatch:
 * test_gpu_quant.c; what both share: mc_test_gpu.c. */
#include <stdlib.h>
#include <string.h>

#include "mc_ref_dev.h"
#include "mc_ref_run.h"
#include "mc_test.h"
#include "mc_test_gpu.h"

int test_gpu_ep_sizes(void) {
  REQUIRE_GPU();
  static const int worlds[] = {1, 2, 4, 8};
  for (int w = 0; w < 4; w++)
    for (int g = 1; g <= 2; g++) {
      if (worlds[w] % g || mc_tg_cap_world(worlds[w]) != worlds[w]) continue;
      mc_case_t c;
      mc_tg_small_case(&c, worlds[w], g, w * 2 + g);
      /* fp8 payload with block scales */
      c.token_bytes = 1024;
      c.scale_bytes = 32;
      c.in_dtype = MC_DTYPE_BF16;
      c.out_dtype = MC_DTYPE_BF16;
      mc_run_opts_t o = MC_RUN_OPTS_DEFAULT;
      o.rounds = 4;
      MC_CHECK(mc_tg_run(&c, &o) == 0);
      /* bf16 payload, no scales, other dtypes */
      c.token_bytes = 512;
      c.scale_bytes = 0;
      c.in_dtype = MC_DTYPE_FP32;
      c.out_dtype = MC_DTYPE_FP16;
      MC_CHECK(mc_tg_run(&c, &o) == 0);
    }
  return 0;
}

/* The packed layouts on the GPU against the reference: both layouts at
 * EP 1, 2, 4 and 8, the capacity counted between the halves or declared by
 * the send half (the harness's largest, or 20 rows that the skewed rounds
 * exceed: every rank must then fail with MC_ERR_CAPACITY naming the rank,
 * and the rounds after pass), groups of two, and the DeepSeek-V3 shape. */
int test_gpu_packed(void) {
  REQUIRE_GPU();
  static const int worlds[] = {1, 2, 4, 8};
  for (int i = 0; i < 8; i++) {
    const int w = worlds[i % 4];
    if (mc_tg_cap_world(w) != w) continue;
    mc_case_t c;
    mc_tg_small_case(&c, w, i >= 4 && w > 1 ? 2 : 1, 60 + i);
    c.token_bytes = 1024;
    c.scale_bytes = 32;
    c.layout = i % 2 ? MC_LAYOUT_EXPERT_SORTED : MC_LAYOUT_PACKED;
    c.expert_align = c.layout == MC_LAYOUT_EXPERT_SORTED ? 4 << (i % 3) : 1;
    c.routing = i % 3 == 2 ? MC_ROUTING_SKEWED : c.routing;
    c.declare = i % 3 == 0 ? 0 : i % 3 == 1 ? -1 : 20;
    mc_run_opts_t o = MC_RUN_OPTS_DEFAULT;
    o.rounds = 5;
    o.whole = 2;
    MC_CHECK(mc_tg_run(&c, &o) == 0);
  }
  for (int layout = MC_LAYOUT_PACKED; layout <= MC_LAYOUT_EXPERT_SORTED; layout++) {
    mc_case_t c;
    mc_ref_deepseek_case(mc_tg_cap_world(8), 64, &c);
    c.seed = mc_test_seed;
    c.layout = layout;
    c.expert_align = layout == MC_LAYOUT_EXPERT_SORTED ? 128 : 1;
    c.declare = layout == MC_LAYOUT_PACKED ? 0 : -1;
    mc_run_opts_t o = MC_RUN_OPTS_DEFAULT;
    o.rounds = 3;
    MC_CHECK(mc_tg_run(&c, &o) == 0);
  }
  return 0;
}

int test_gpu_deepseek_shape(void) {
  REQUIRE_GPU();
  mc_case_t c;
  mc_ref_deepseek_case(mc_tg_cap_world(8), 32, &c);
  c.seed = mc_test_seed;
  mc_run_opts_t o = MC_RUN_OPTS_DEFAULT;
  o.rounds = 3;
  MC_CHECK(mc_tg_run(&c, &o) == 0);
  return 0;
}

/* More tokens than one prep block scans (8 warps x 32), and so many experts
 * that its masks leave room for fewer warps (smaller chunks, more blocks):
 * record positions must carry from chunk to chunk (the last block's scan,
 * then the fix kernel), also where bound_m cuts a chunk or leaves it
 * empty. Top-k 8 and 4 (inlined copies) and 6 (the generic one). (A
 * missing barrier between passes once broke 512 tokens.) */
int test_gpu_prep_passes(void) {
  REQUIRE_GPU();
  static const struct {
    int world, group, experts, topk, tokens;
  } cases[] = {{2, 1, 32, 8, 700}, {4, 2, 64, 6, 530}, {4, 1, 2048, 4, 300}};
  for (int i = 0; i < 3; i++) {
    mc_case_t c;
    mc_tg_small_case(&c, cases[i].world, cases[i].group, 40 + i);
    c.num_experts = cases[i].experts;
    c.topk = cases[i].topk;
    c.max_tokens = cases[i].tokens;
    c.hidden = 64;
    c.use_bound_m = 1; /* some rounds: chunks the bound leaves empty, or cuts */
    mc_run_opts_t o = MC_RUN_OPTS_DEFAULT;
    o.rounds = 4;
    MC_CHECK(mc_tg_run(&c, &o) == 0);
  }
  return 0;
}

/* Every top-k the one-launch dispatch kernel has a kernel of its own for
 * (8, 6, 4, 2) and the generic one (1, 3, 5, 16), on random ids and
 * weights, EP2 (or what the machine allows), with and without groups. */
int test_gpu_topk_kernels(void) {
  REQUIRE_GPU();
  static const int topks[] = {1, 2, 3, 4, 5, 6, 8, 16};
  for (int i = 0; i < (int)(sizeof topks / sizeof topks[0]); i++) {
    mc_case_t c;
    mc_tg_small_case(&c, 2, 1 + i % 2, 60 + i);
    c.num_experts = 32;
    c.topk = topks[i];
    mc_run_opts_t o = MC_RUN_OPTS_DEFAULT;
    o.rounds = 3;
    MC_CHECK_MSG(mc_tg_run(&c, &o) == 0, "top-k %d", topks[i]);
  }
  return 0;
}

/* The ranks of a group must pass the same inputs: where one rank's weights
 * differ, every rank's round fails with MC_ERR_INVALID_USAGE naming the two
 * ranks and the group (the digest in the metas), as on the cpu transport. */
int test_gpu_group_inputs_differ(void) {
  REQUIRE_GPU();
  if (mc_tg_cap_world(2) != 2) {
    printf("skipped: needs 2 ranks\n");
    return MC_TEST_SKIP;
  }
  for (int pass = 0; pass < 2; pass++) { /* one launch; more tokens than a prep chunk (the chunked prep) */
    mc_case_t c;
    mc_tg_small_case(&c, 2, 2, 90 + pass);
    c.num_experts = 16;
    c.no_weights = 0;
    c.zero_tokens = 0;
    c.use_bound_m = 0;
    c.fixed_m = 1;
    c.max_tokens = pass ? 300 : 24;
    mc_run_opts_t o = MC_RUN_OPTS_DEFAULT;
    o.rounds = 3;
    o.timeout_ms = 3000;
    o.differ_round = 2;
    mc_run_result_t res;
    MC_CHECK(mc_tg_run_result(&c, &o, &res) == 2);
    for (int r = 0; r < 2; r++) {
      fprintf(stderr, "rank %d: %s\n", r, res.ranks[r].msg);
      MC_CHECK_MSG(res.ranks[r].api_rc == MC_ERR_INVALID_USAGE || res.ranks[r].api_rc == MC_ERR_ABORTED, "rank %d: %s",
                   r, res.ranks[r].msg);
      MC_CHECK_MSG(strstr(res.ranks[r].msg, "ranks 0 and 1 of group 0 passed different m, indices or weights"),
                   "rank %d: %s", r, res.ranks[r].msg);
    }
    mc_run_free(&res);
  }
  return 0;
}

/* An application that started NVSHMEM itself (here as PE 0 of 1): the
 * communicator attaches instead of starting it again, the kernels run on
 * that NVSHMEM and match the reference, and destroying the communicator
 * leaves NVSHMEM to the application, which finalises it. Ranks as threads:
 * the test process is the application. */
int test_gpu_nvshmem_attach(void) {
  REQUIRE_GPU();
#ifdef MC_REF_NVSHMEM
  if (mc_tg_transport() != MC_TRANSPORT_NVSHMEM) {
    printf("skipped: attach is an nvshmem transport matter\n");
    return MC_TEST_SKIP;
  }
  MC_CHECK(mc_ref_nvshmem_init_alone(0) == 0);
  mc_case_t c;
  mc_tg_small_case(&c, 1, 1, 50);
  mc_run_opts_t o = MC_RUN_OPTS_DEFAULT;
  o.rounds = 3;
  o.transport = MC_TRANSPORT_NVSHMEM; /* o.processes stays 0: ranks are threads of this process */
  mc_run_result_t res;
  int failed = mc_run(&c, &o, &res);
  MC_CHECK_MSG(failed == 0, "%s", failed < 0 ? "could not start" : mc_run_first_failure(&res));
  mc_run_free(&res);
  MC_CHECK_MSG(mc_ref_nvshmem_initialized(), "destroying the communicator finalised the application's NVSHMEM");
  mc_ref_nvshmem_finalize();
  return 0;
#else
  printf("skipped: built without NVSHMEM\n");
  return MC_TEST_SKIP;
#endif
}

/* p2p needs every peer mapped: ranks that claim two hosts (mc_testing_set_host, as
 * on two nodes) make mc_a2a_create fail on every rank, with a message that
 * names the peer, instead of a crash later. (With transport auto the same
 * ranks would get nvshmem.) */
int test_gpu_p2p_other_host(void) {
  REQUIRE_GPU();
  mc_case_t c;
  mc_tg_small_case(&c, 2, 1, 60);
  mc_run_opts_t o = MC_RUN_OPTS_DEFAULT;
  o.processes = 1;
  o.split_hosts = 1;
  o.transport = MC_TRANSPORT_P2P;
  o.timeout_ms = 5000;
  mc_run_result_t res;
  int failed = mc_run(&c, &o, &res);
  MC_CHECK(failed == 2);
  for (int r = 0; r < 2; r++) {
    const mc_run_rank_t *me = &res.ranks[r];
    fprintf(stderr, "rank %d: %s\n", r, me->msg);
    MC_CHECK_MSG(me->api_rc == MC_ERR_UNSUPPORTED, "rank %d: %s", r, me->msg);
    MC_CHECK_MSG(strstr(me->msg, "p2p") != NULL, "rank %d: %s", r, me->msg);
  }
  MC_CHECK_MSG(strstr(res.ranks[0].msg, "another host") != NULL, "rank 0: %s", res.ranks[0].msg);
  mc_run_free(&res);
  return 0;
}

/* Transport auto on GPUs: ranks on one host that can map each other's
 * memory (the probe at comm create) get p2p; ranks that claim two hosts get
 * nvshmem where this build has it. Either way every rank agrees, and the
 * rounds match the reference. */
int test_gpu_auto_transport(void) {
  REQUIRE_GPU();
  for (int split = 0; split <= 1; split++) {
    mc_case_t c;
    mc_tg_small_case(&c, 2, 1, 70 + split);
    mc_run_opts_t o = MC_RUN_OPTS_DEFAULT;
    o.processes = 1;
    o.rounds = 3;
    o.split_hosts = split;
    o.auto_transport = 1;
    o.transport = MC_TRANSPORT_P2P; /* device buffers: auto must pick a GPU transport */
#ifndef MC_REF_NVSHMEM
    if (split) {
      printf("two hosts: skipped (built without NVSHMEM)\n");
      continue;
    }
#endif
    const int want = split ? MC_TRANSPORT_NVSHMEM : MC_TRANSPORT_P2P;
    mc_run_result_t res;
    int failed = mc_run(&c, &o, &res);
    MC_CHECK_MSG(failed == 0, "%s", failed < 0 ? "could not start" : mc_run_first_failure(&res));
    for (int r = 0; r < 2; r++)
      MC_CHECK_MSG(res.ranks[r].transport == want, "%s: rank %d got transport %d, wanted %d",
                   split ? "two hosts" : "one host", r, res.ranks[r].transport, want);
    printf("ok: %s -> %s\n", split ? "two hosts" : "one host", mc_transport_name((mc_transport_t)want));
    mc_run_free(&res);
  }
  return 0;
}

int test_gpu_bound_m(void) {
  REQUIRE_GPU();
  mc_case_t c;
  mc_tg_small_case(&c, 4, 2, 1);
  c.use_bound_m = 1;
  c.zero_tokens = 1;
  mc_run_opts_t o = MC_RUN_OPTS_DEFAULT;
  o.rounds = 12;
  MC_CHECK(mc_tg_run(&c, &o) == 0);
  return 0;
}

int test_gpu_split(void) {
  REQUIRE_GPU();
  mc_case_t c;
  mc_tg_small_case(&c, 4, 1, 2);
  mc_run_opts_t o = MC_RUN_OPTS_DEFAULT;
  o.rounds = 6;
  o.split = 1; /* device work queued between each send and its recv */
  MC_CHECK(mc_tg_run(&c, &o) == 0);
  return 0;
}

int test_gpu_many_rounds(void) {
  REQUIRE_GPU();
  mc_case_t c;
  mc_tg_small_case(&c, 4, 2, 3);
  c.max_tokens = 16;
  c.token_bytes = 64;
  c.scale_bytes = 8;
  c.hidden = 64;
  c.zero_tokens = 1;
  c.use_bound_m = 1;
  mc_run_opts_t o = MC_RUN_OPTS_DEFAULT;
  o.rounds = 1000; /* fresh routing every round, every round checked */
  o.barrier = 1;   /* and mc_a2a_barrier's kernel before each: 1000 of them */
  MC_CHECK(mc_tg_run(&c, &o) == 0);
  return 0;
}

int test_gpu_bad_input(void) {
  REQUIRE_GPU();
  mc_case_t c;
  mc_tg_small_case(&c, 2, 1, 4);
  mc_run_opts_t o = MC_RUN_OPTS_DEFAULT;
  o.rounds = 3;
  o.inject_bad = 1; /* host-checked and device-checked refusals, then good rounds */
  MC_CHECK(mc_tg_run(&c, &o) == 0);
  /* the bad row (the last valid one) in a later prep block than the first:
   * the verdict reaches the last block, and is cleared for the next round */
  mc_tg_small_case(&c, 2, 1, 5);
  c.max_tokens = 600;
  c.hidden = 64;
  MC_CHECK(mc_tg_run(&c, &o) == 0);
  return 0;
}

/* Decode batches: a call of at most 32 (token, k) pairs where a group is
 * one rank has a prep of its own on the GPU (a warp, a lane a pair): its
 * slots, its refusals of bad ids (out of range, twice, past 2^32 with
 * int64 ids) and the good rounds after them, at top-k 8, 2, 16, 6 and 3
 * with m and bound_m drawn up to two past that size (calls of either
 * prep, none too), on 1, 2 and 8 ranks; and groups of two at the same
 * sizes, which take the general prep. */
int test_gpu_few_tokens(void) {
  REQUIRE_GPU();
  /* top-k of the kernels of their own (8, 6, 2) and of the generic one (16, 3); max_tokens two past
   * the one-warp prep's most, so that the calls switch between the two preps */
  static const int ks[] = {8, 2, 16, 6, 3};
  for (int g = 1; g <= 2; g++)
    for (int i = 0; i < 5; i++) {
      mc_case_t c;
      mc_tg_small_case(&c, g == 2 ? 2 : i % 3 == 0 ? 1 : i % 3 == 1 ? 2 : 8, g, 40 + 5 * g + i); /* a rank alone too */
      c.topk = ks[i];
      c.max_tokens = 32 / ks[i] + 2;
      c.zero_tokens = 1;
      c.num_experts = c.world_size * 16;
      c.use_bound_m = 1;
      mc_run_opts_t o = MC_RUN_OPTS_DEFAULT;
      o.rounds = 6;
      o.inject_bad = 1;
      o.ids64 = i == 0;
      MC_CHECK(mc_tg_run(&c, &o) == 0);
    }
  return 0;
}

/* int64 top-k ids read in place by the prep: good rounds against the
 * reference, and refusals where an id is past 2^32 (the device must check
 * the full width before narrowing), at the DeepSeek-V3 shape too. */
int test_gpu_int64_ids(void) {
  REQUIRE_GPU();
  mc_case_t c;
  mc_tg_small_case(&c, 2, 1, 6);
  c.use_bound_m = 1;
  mc_run_opts_t o = MC_RUN_OPTS_DEFAULT;
  o.rounds = 3;
  o.ids64 = 1;
  o.inject_bad = 1;
  MC_CHECK(mc_tg_run(&c, &o) == 0);
  mc_ref_deepseek_case(mc_tg_cap_world(8), 32, &c);
  c.seed = mc_test_seed;
  o.inject_bad = 0;
  MC_CHECK(mc_tg_run(&c, &o) == 0);
  return 0;
}

int test_gpu_stall(void) {
  REQUIRE_GPU();
  /* a killed process; timeouts found on the device */
  return mc_test_check_stall(mc_tg_transport(), 1, 500, mc_tg_cap_world(4));
}

/* A rank killed, the others mask it and go on (mc_a2a_mask_ranks): a
 * thousand checked rounds after, as on the cpu transport (test_mask.c),
 * the rank dying before its dispatch and between dispatch and combine. */
int test_gpu_mask_dead_rank(void) {
  REQUIRE_GPU();
  const int world = mc_tg_cap_world(4);
  if (world < 2) {
    printf("skipped: needs 2 ranks\n");
    return MC_TEST_SKIP;
  }
  for (int in_combine = 0; in_combine < 2; in_combine++)
    MC_CHECK(mc_test_run_masked(mc_tg_transport(), world,
                                (int)((mc_test_seed + (uint64_t)in_combine) % (uint64_t)world), in_combine,
                                in_combine ? 200 : 1000, mc_test_seed + (uint64_t)in_combine, MC_LAYOUT_BATCHED) == 0);
  return 0;
}

int test_gpu_graph(void) {
  REQUIRE_GPU();
  mc_case_t c;
  mc_tg_small_case(&c, 4, 2, 6);
  c.in_dtype = MC_DTYPE_BF16;
  c.token_bytes = (size_t)c.hidden * 2; /* bf16 tokens: the identity expert is a copy */
  c.scale_bytes = 16;
  c.expert_identity = 1;
  c.fixed_m = 1;
  c.use_bound_m = 1; /* bound_m changes between replays of the same graph */
  mc_run_opts_t o = MC_RUN_OPTS_DEFAULT;
  o.rounds = 20;
  o.graph = 1;
  MC_CHECK(mc_tg_run(&c, &o) == 0);
  return 0;
}

/* A replay the device refuses (bound_m past m) and a good one queued
 * behind it before the host looks, every round: the refusal sends nothing
 * and stops nothing else, so the good replay's outputs are checked against
 * the reference; the next check reports the refusal, once. Groups of two
 * ranks (the general prep) and of one (the good replay takes the one-warp
 * prep; a count past m is refused by the general one). */
int test_gpu_graph_refused(void) {
  REQUIRE_GPU();
  for (int g = 2; g >= 1; g--) {
    mc_case_t c;
    mc_tg_small_case(&c, mc_tg_cap_world(4), g, 60 + g);
    c.in_dtype = MC_DTYPE_BF16;
    c.token_bytes = (size_t)c.hidden * 2;
    c.scale_bytes = 16;
    c.expert_identity = 1;
    c.fixed_m = 1;
    c.use_bound_m = 1;
    if (g == 1) c.max_tokens = 3; /* at most 32 (token, k) pairs: the one-warp prep */
    mc_run_opts_t o = MC_RUN_OPTS_DEFAULT;
    o.rounds = 30;
    o.graph = 1;
    o.graph_refused = 1;
    MC_CHECK(mc_tg_run(&c, &o) == 0);
  }
  return 0;
}

/* The benchmark's view of a captured engine call and of the launch floor:
 * m = max_tokens with the valid tokens in bound_m (fewer than max_tokens),
 * timed as graph replays and eagerly, halves and whole, with each phase's
 * empty kernels (mc_a2a_bench_floor) timed the same way after the rounds;
 * the checked rounds before and the one after match the reference, and
 * every floor sample is a time (the empty kernels ran and were timed). */
int test_gpu_bench_floor(void) {
  REQUIRE_GPU();
  for (int mode = 0; mode < 3; mode++) { /* graph whole, eager whole, eager halves */
    mc_case_t c;
    mc_ref_deepseek_case(mc_tg_cap_world(2), 32, &c);
    c.seed = mc_test_seed + (uint64_t)mode;
    c.tokens = 3;
    c.bound_fixed = 1;
    mc_run_opts_t o = MC_RUN_OPTS_DEFAULT;
    o.rounds = 20;
    o.warmup = 3;
    o.check_first = 2;
    o.barrier = 1;
    o.floor = 1;
    o.graph_timed = mode == 0;
    o.whole = mode < 2 ? 1 : 0;
    mc_run_result_t res;
    const int failed = mc_tg_run_result(&c, &o, &res);
    MC_CHECK_MSG(failed == 0, "mode %d: %s", mode, failed < 0 ? "could not start" : mc_run_first_failure(&res));
    for (int r = 0; r < c.world_size; r++)
      for (int ph = 0; ph < MC_PH_COUNT; ph++) {
        const int timed = !o.whole || ph == MC_PH_DISPATCH_SEND || ph == MC_PH_COMBINE_SEND;
        for (int i = 0; i < o.rounds; i++) {
          const double f = res.floor_us[((size_t)r * MC_PH_COUNT + (size_t)ph) * (size_t)o.rounds + (size_t)i];
          MC_CHECK_MSG(timed ? f > 0.5 && f < 1e5 : f == 0, "mode %d rank %d phase %d sample %d: floor %g us", mode,
                       r, ph, i, f);
        }
      }
    mc_run_free(&res);
  }
  return 0;
}

/* p2p with ranks as threads of one process (what an engine that drives its
 * GPUs from threads runs): peers' windows used at their own addresses, no
 * IPC; on a machine of fewer GPUs than ranks several threads share a GPU,
 * each with its own stream, and the library splits the SMs between them.
 * EP 2-8, with and without work between the halves. Run it
 * as one process on the whole GPU (scripts/mc-launch.sh 1 --): under MPS
 * the process gets one rank's share for all its threads. */
int test_gpu_p2p_threads(void) {
  REQUIRE_GPU();
  static const int worlds[] = {2, 4, 8};
  for (int w = 0; w < 3; w++)
    for (int split = 0; split <= 1; split++) {
      mc_case_t c;
      mc_tg_small_case(&c, worlds[w], 1, 70 + w * 2 + split);
      c.token_bytes = 1024; /* fp8 payload with block scales */
      c.scale_bytes = 32;
      c.in_dtype = MC_DTYPE_BF16;
      c.out_dtype = MC_DTYPE_BF16;
      c.use_bound_m = split;
      mc_run_opts_t o = MC_RUN_OPTS_DEFAULT;
      o.rounds = 6;
      o.split = split;
      o.barrier = worlds[w] == 8; /* mc_a2a_barrier's kernel first: the first launch that waits for peers */
      MC_CHECK(mc_tg_run_as(&c, &o, MC_TRANSPORT_P2P, 0) == 0);
    }
  /* the DeepSeek-V3 shape, 8 threads, a few rounds, as mc-bench runs them
   * (a barrier kernel before each round). With the kernels loaded lazily at
   * their first launch this hung: mc_gpu_kernel_limits loads them all. */
  mc_case_t c;
  mc_ref_deepseek_case(mc_tg_cap_world(8), 32, &c);
  c.seed = mc_test_seed + 2;
  mc_run_opts_t o = MC_RUN_OPTS_DEFAULT;
  o.rounds = 3;
  o.barrier = 1;
  MC_CHECK(mc_tg_run_as(&c, &o, MC_TRANSPORT_P2P, 0) == 0);
  return 0;
}
