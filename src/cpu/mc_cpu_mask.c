/* mc_cpu_mask.c - setting a mask of ranks on the cpu transport: the ranks
 * it keeps stop, agree on the round to go on from, and take in what is
 * left in their windows, so that later rounds start from the same counts.
 *
 * Two steps, each a signal to every kept rank and a wait for theirs (slot
 * MC_SIG_RESYNC, value 4 x the pair's attempt + the step). Each pair of
 * ranks numbers its attempts (mask_calls): a call takes the number after
 * its own last one, or the peer's if that is larger (a rank masked for a
 * while has made fewer calls with this one; a call that timed out may be
 * retried while the peer is still on its first). A call that fails uses up
 * the number after its own as well, so that a peer can tell the two ways
 * of seeing it on a later number:
 * - one on, while the wait is in step 2: the peer saw this step, left the
 *   call and made its next one; this call is done too (the peer's step 2
 *   was overwritten before it was read);
 * - otherwise (two or more on, or one on in step 1, where the peer cannot
 *   have seen step 2): the peer timed out and called again, and has done
 *   nothing in between, so what was taken in from it still holds; the wait
 *   joins that attempt and signals its step again under the new number.
 *   Without that, a retry leaves the two numbers apart for good.
 * A value of the pair's attempt is current: a peer that left a call made
 * with this rank saw this rank's step 2 of that attempt, so this rank's
 * next call has a larger number; one that timed out has stopped too.
 * 1. "stopped": before it, each writes its last round (MC_SIG_RESYNC_ROUND).
 *    Once every kept rank has signalled it, none of them sends a record or
 *    row any more, and what they sent has landed (the puts are copies made
 *    before the signal, with release order). Each rank then takes every
 *    kept peer's running totals as consumed (a round cut short leaves
 *    records or rows counted but unread) and goes on from the largest
 *    round any of them reached.
 *    Barrier counts are lined up the same way: each rank writes its count
 *    with each kept peer (MC_SIG_BARRIER) before step 1 and then takes the
 *    larger of its own and the peer's, the same number on both sides (a
 *    barrier that timed out counted on one side only).
 * 2. "taken in": nobody sends again before every kept rank has done that,
 *    or a fast rank's next round would be swallowed by a slow one's step.
 * The waits last up to twice the comm's timeout: each rank comes here
 * after its own failed call, which may have ended up to a timeout later
 * than another's (it waited for a rank that was itself waiting).
 * A masked rank's slots are never read while it is masked: whatever it
 * still writes (a rank stopped, then resumed) lands in its own regions. */
#include "mc_cpu.h"

static uint64_t signal_from(mc_a2a_t *a2a, int slot, int peer) {
  uint64_t v = 0;
  (void)mc_cpu_wait_ge(a2a, "mc_a2a_mask_ranks", slot, peer, 0, &v); /* target 0: reads at once */
  return v;
}

static mc_result_t step(mc_a2a_t *a2a, const uint8_t *mask, int k) {
  const int W = a2a->shape.world_size;
  uint64_t *attempt = a2a->mask_calls;
  for (int p = 0; p < W; p++)
    if (!mask[p]) mc_cpu_signal(a2a, p, MC_SIG_RESYNC, 4 * attempt[p] + (uint64_t)k, MC_SIG_SET);
  for (int p = 0; p < W; p++) {
    if (mask[p]) continue;
    for (;;) {
      uint64_t v = 0;
      mc_result_t rc = mc_cpu_wait_ge_for(a2a, "mc_a2a_mask_ranks", MC_SIG_RESYNC, p, 4 * attempt[p] + (uint64_t)k, &v,
                                          2 * a2a->comm->timeout_ms);
      if (rc != MC_SUCCESS) return rc;
      if (v / 4 <= attempt[p] || (k == 2 && v / 4 == attempt[p] + 1)) break;
      attempt[p] = v / 4; /* the peer called again: join its attempt */
      mc_cpu_signal(a2a, p, MC_SIG_RESYNC, 4 * attempt[p] + (uint64_t)k, MC_SIG_SET);
    }
  }
  return MC_SUCCESS;
}

/* A failed call: the next one with each kept peer skips a number. */
static mc_result_t used_up(mc_a2a_t *a2a, const uint8_t *mask, mc_result_t rc) {
  for (int p = 0; p < a2a->shape.world_size; p++)
    if (!mask[p]) a2a->mask_calls[p]++;
  return rc;
}

mc_result_t mc_cpu_mask(mc_a2a_t *a2a, const uint8_t *mask) {
  const mc_shape_t *s = &a2a->shape;
  const int W = s->world_size;
  uint64_t *barriers = mc_cpu(a2a)->barriers;
  for (int p = 0; p < W; p++)
    if (!mask[p]) {
      const uint64_t peers = signal_from(a2a, MC_SIG_RESYNC, p) / 4;
      a2a->mask_calls[p] = a2a->mask_calls[p] + 1 > peers ? a2a->mask_calls[p] + 1 : peers;
      mc_cpu_signal(a2a, p, MC_SIG_RESYNC_ROUND, a2a->round, MC_SIG_SET);
      mc_cpu_signal(a2a, p, MC_SIG_BARRIER, barriers[p], MC_SIG_SET);
    }
  mc_result_t rc = step(a2a, mask, 1);
  if (rc != MC_SUCCESS) return used_up(a2a, mask, rc);
  uint64_t *seen = mc_cpu_ws(a2a, mc_ws_seen_off(s)), round = a2a->round;
  for (int p = 0; p < W; p++) {
    if (mask[p]) continue;
    const uint64_t r = signal_from(a2a, MC_SIG_RESYNC_ROUND, p);
    if (r > round) round = r;
    seen[MC_SIG_DISP_RECS * W + p] = signal_from(a2a, MC_SIG_DISP_RECS, p);
    seen[MC_SIG_COMB_ROWS * W + p] = signal_from(a2a, MC_SIG_COMB_ROWS, p);
    const uint64_t b = signal_from(a2a, MC_SIG_BARRIER, p);
    if (b > barriers[p]) barriers[p] = b;
  }
  a2a->round = round;
  rc = step(a2a, mask, 2);
  return rc == MC_SUCCESS ? rc : used_up(a2a, mask, rc);
}
