/* test_mask.c - going on without a dead rank (mc_a2a_mask_ranks): ranks
 * as processes, one killed with SIGKILL in a round drawn from the seed (2
 * to 5), before its dispatch or between its dispatch and its combine (its
 * peers then hold rows of that round they never read); the others time out
 * in that round, mask it, and
 * run up to a thousand more rounds (after an mc_a2a_barrier of theirs),
 * each checked against the reference model without the dead rank's tokens
 * and experts (expert_x and counts byte for byte, combine bit for bit,
 * the records sent, the expert load). */
#include <stdio.h>

#include "mc_ref_run.h"
#include "mc_test.h"

int mc_test_run_masked(mc_transport_t transport, int world, int dead, int in_combine, int rounds, uint64_t seed,
                       int layout) {
  const int stall_round = 1 + (int)(seed % 4); /* 0-based: it breaks round stall_round + 1 */
  mc_case_t c;
  mc_ref_random_case(seed, &c);
  c.world_size = world;
  c.group_size = 1;
  c.num_experts = 4 * world;
  c.topk = c.topk < 4 ? c.topk : 4;
  c.max_tokens = 8;
  c.hidden = c.hidden > 128 ? 128 : c.hidden;
  c.layout = layout; /* packed layouts: the count step sizes the buffers */
  mc_run_opts_t o = MC_RUN_OPTS_DEFAULT;
  o.rounds = rounds;
  /* the cpu transport sees the dead process at once, so the timeout only
   * bounds waits for live ranks (which a loaded machine makes long); a GPU
   * kernel waits it out */
  o.timeout_ms = transport == MC_TRANSPORT_CPU ? MC_TEST_LIVE_MS : 1000;
  o.processes = 1;
  o.transport = transport;
  o.stall_rank = dead;
  o.stall_round = stall_round;
  o.mask_stalled = 1;
  o.stall_in_combine = in_combine;
  mc_run_result_t res;
  (void)mc_run(&c, &o, &res);
  for (int r = 0; r < world; r++) {
    if (r == dead) continue;
    const mc_run_rank_t *me = &res.ranks[r];
    MC_CHECK_MSG(!me->failed, "W=%d, rank %d dead (in combine: %d): rank %d: %s", world, dead, in_combine, r,
                 me->msg);
    MC_CHECK_MSG(me->masked_after == (uint64_t)stall_round + 1, "W=%d, rank %d dead in round %d: rank %d masked it "
                 "after round %llu", world, dead, stall_round + 1, r, (unsigned long long)me->masked_after);
  }
  mc_run_free(&res);
  return 0;
}

int test_mask_dead_rank(void) {
  const int world[] = {2, 4, 5, 3, 4, 6};
  for (int i = 0; i < 6; i++) {
    const int dead = (int)((mc_test_seed + (uint64_t)i) % (uint64_t)world[i]);
    MC_CHECK(mc_test_run_masked(MC_TRANSPORT_CPU, world[i], dead, i >= 3, i == 1 ? 1000 : 200,
                                mc_test_seed + (uint64_t)i, MC_LAYOUT_BATCHED) == 0);
  }
  return 0;
}
