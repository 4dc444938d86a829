/* mc_cpu_mask.c - mc_a2a_mask_ranks on the cpu transport: the ranks the
 * mask keeps stop, agree on the round to go on from, and take in what is
 * left in their windows, so that later rounds start from the same counts.
 * Two steps, each a signal to every kept rank and a wait for theirs
 * (MC_SIG_RESYNC = 4 x the pair's attempt + the step). The rules, and why
 * retries and "gave up" work as they do: docs/protocol.md, "Going on
 * without a rank". */
#include "mc_cpu.h"

static uint64_t signal_from(mc_a2a_t *a2a, int slot, int peer) {
  uint64_t v = 0;
  (void)mc_cpu_wait_ge(a2a, "mc_a2a_mask_ranks", slot, peer, 0, &v); /* target 0: reads at once */
  return v;
}

/* What peer p holds, taken in once it has made step 1 of the pair's attempt. */
static void take_in(mc_a2a_t *a2a, int p) {
  const int W = a2a->shape.world_size;
  uint64_t *seen = mc_cpu_ws(a2a, mc_ws_seen_off(&a2a->shape)), *barriers = mc_cpu(a2a)->barriers;
  const uint64_t r = signal_from(a2a, MC_SIG_RESYNC_ROUND, p), b = signal_from(a2a, MC_SIG_BARRIER, p);
  if (r > a2a->round) a2a->round = r;
  /* its totals as read: a broken round leaves some counted but unread */
  seen[MC_SIG_DISP_RECS * W + p] = signal_from(a2a, MC_SIG_DISP_RECS, p);
  seen[MC_SIG_COMB_ROWS * W + p] = signal_from(a2a, MC_SIG_COMB_ROWS, p);
  if (b > barriers[p]) barriers[p] = b; /* a barrier that timed out counted on one side only */
}

/* Step k of the call, as peer p's slot value v says (docs/protocol.md):
 * 1 when the step is done with p; else 0 with the value that would be,
 * following p to a later attempt where it called again. */
typedef struct mask_step {
  mc_a2a_t *a2a;
  int k;
} mask_step_t;

static int step_done(void *ctx, int p, uint64_t v, uint64_t *expect) {
  const mask_step_t *st = ctx;
  mc_a2a_t *a2a = st->a2a;
  const uint64_t k = (uint64_t)st->k, a = a2a->mask_calls[p], b = v / 4;
  if (mc_resync_done(v, a, st->k)) return 1;
  if (b <= a) { /* not there yet */
    *expect = 4 * a + k;
    return 0;
  }
  if (v % 4 == 0) { /* it gave up on a call: wait for its next one */
    *expect = 4 * b + 1;
    return 0;
  }
  a2a->mask_calls[p] = b; /* it called again: join */
  if (k == 2) take_in(a2a, p); /* its rounds may have moved since */
  mc_cpu_signal(a2a, p, MC_SIG_RESYNC, 4 * b + k, MC_SIG_SET);
  *expect = 4 * b + k;
  return v >= *expect;
}

/* Every kept peer in the same wait: one at a time, three ranks can each
 * wait for the next until they time out. Twice the timeout: each rank comes
 * after its own failed call, and those end up to a timeout apart. */
static mc_result_t step(mc_a2a_t *a2a, const uint8_t *mask, int k) {
  const int W = a2a->shape.world_size;
  for (int p = 0; p < W; p++)
    if (!mask[p]) mc_cpu_signal(a2a, p, MC_SIG_RESYNC, 4 * a2a->mask_calls[p] + (uint64_t)k, MC_SIG_SET);
  mask_step_t st = {a2a, k};
  return mc_cpu_wait_each(a2a, "mc_a2a_mask_ranks", MC_SIG_RESYNC, mask, step_done, &st, 2 * a2a->comm->timeout_ms);
}

/* A failed call: the next one with each kept peer skips a number, left in
 * the peer's slot with step 0 ("gave up"), so that a late peer does not
 * take this call's stale step 1 for a live one. */
static mc_result_t used_up(mc_a2a_t *a2a, const uint8_t *mask, mc_result_t rc) {
  for (int p = 0; p < a2a->shape.world_size; p++)
    if (!mask[p]) mc_cpu_signal(a2a, p, MC_SIG_RESYNC, 4 * ++a2a->mask_calls[p], MC_SIG_SET);
  return rc;
}

mc_result_t mc_cpu_mask(mc_a2a_t *a2a, const uint8_t *mask) {
  const int W = a2a->shape.world_size;
  const uint64_t *barriers = mc_cpu(a2a)->barriers;
  for (int p = 0; p < W; p++)
    if (!mask[p]) {
      const uint64_t peers = signal_from(a2a, MC_SIG_RESYNC, p) / 4; /* the peer may be on a later attempt */
      a2a->mask_calls[p] = a2a->mask_calls[p] + 1 > peers ? a2a->mask_calls[p] + 1 : peers;
      mc_cpu_signal(a2a, p, MC_SIG_RESYNC_ROUND, a2a->round, MC_SIG_SET);
      mc_cpu_signal(a2a, p, MC_SIG_BARRIER, barriers[p], MC_SIG_SET);
    }
  mc_result_t rc = step(a2a, mask, 1); /* "stopped": nobody kept sends any more */
  for (int p = 0; p < W && rc == MC_SUCCESS; p++)
    if (!mask[p]) take_in(a2a, p);
  if (rc == MC_SUCCESS) rc = step(a2a, mask, 2); /* "taken in": nobody sends before all have */
  return rc == MC_SUCCESS ? rc : used_up(a2a, mask, rc);
}
