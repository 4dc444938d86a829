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
 * the number after its own and leaves that number with step 0 in every
 * kept peer's slot: "gave up, not in a call". Without it, a late peer
 * would take the stale step 1 of a call that had failed (its maker may
 * have masked it since, and run rounds) for a live one. A wait that sees
 * the peer on a later number:
 * - step 0: the peer gave up: wait for its next call. (Two or more on in
 *   step 2 may also be a peer that saw step 2, left, and failed a later
 *   call; that needs this rank not to read for twice the timeout, while
 *   a peer that gave up, called again and failed again within the same
 *   wait is ordinary timing, so the wait goes on.)
 * - step 1 or 2, one on while in step 2: the peer saw this step, left the
 *   call and made its next one; this call is done too.
 * - otherwise the peer called again: join that attempt and signal this
 *   step again under its number; in step 2 take in what the peer holds
 *   again first (it may have run rounds since the attempt whose state was
 *   taken in). Without joining, a retry leaves the two numbers apart.
 * A value of the pair's attempt is current: a peer that left a call made
 * with this rank saw this rank's step 2 of that attempt, so this rank's
 * next call has a larger number; one that gave up has said so. But a peer
 * a step was done with may give up on the call later (it timed out on a
 * third rank), and call again: so a step is over only when one look at
 * every kept peer finds it done with all of them (mc_cpu_wait_each reads
 * them all again in each pass), and a peer that moved on is followed by
 * the rules above. Without it, a rank could take in a peer's state of a
 * call that peer gave up, pair its next call with the others' and succeed
 * where they time out.
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

/* What peer p holds, taken in once it has made step 1 of the pair's attempt. */
static void take_in(mc_a2a_t *a2a, int p) {
  const int W = a2a->shape.world_size;
  uint64_t *seen = mc_cpu_ws(a2a, mc_ws_seen_off(&a2a->shape)), *barriers = mc_cpu(a2a)->barriers;
  const uint64_t r = signal_from(a2a, MC_SIG_RESYNC_ROUND, p), b = signal_from(a2a, MC_SIG_BARRIER, p);
  if (r > a2a->round) a2a->round = r;
  seen[MC_SIG_DISP_RECS * W + p] = signal_from(a2a, MC_SIG_DISP_RECS, p);
  seen[MC_SIG_COMB_ROWS * W + p] = signal_from(a2a, MC_SIG_COMB_ROWS, p);
  if (b > barriers[p]) barriers[p] = b;
}

/* Step k of the call, as peer p's slot value v says (the header gives
 * the rules): 1 when the step is done with p; else 0 with the value that
 * would be, following p to a later attempt where it called again. */
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
  if (k == 2) take_in(a2a, p);
  mc_cpu_signal(a2a, p, MC_SIG_RESYNC, 4 * b + k, MC_SIG_SET);
  *expect = 4 * b + k;
  return v >= *expect;
}

/* Every kept peer is waited for in the same loop: a rank that waited for
 * one peer at a time would join a peer's new attempt only once the peers
 * before it were done, and three ranks can each wait for the next that
 * way until they time out. */
static mc_result_t step(mc_a2a_t *a2a, const uint8_t *mask, int k) {
  const int W = a2a->shape.world_size;
  for (int p = 0; p < W; p++)
    if (!mask[p]) mc_cpu_signal(a2a, p, MC_SIG_RESYNC, 4 * a2a->mask_calls[p] + (uint64_t)k, MC_SIG_SET);
  mask_step_t st = {a2a, k};
  return mc_cpu_wait_each(a2a, "mc_a2a_mask_ranks", MC_SIG_RESYNC, mask, step_done, &st, 2 * a2a->comm->timeout_ms);
}

/* A failed call: the next one with each kept peer skips a number, left in
 * the peer's slot with step 0 ("gave up"). */
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
      const uint64_t peers = signal_from(a2a, MC_SIG_RESYNC, p) / 4;
      a2a->mask_calls[p] = a2a->mask_calls[p] + 1 > peers ? a2a->mask_calls[p] + 1 : peers;
      mc_cpu_signal(a2a, p, MC_SIG_RESYNC_ROUND, a2a->round, MC_SIG_SET);
      mc_cpu_signal(a2a, p, MC_SIG_BARRIER, barriers[p], MC_SIG_SET);
    }
  mc_result_t rc = step(a2a, mask, 1);
  for (int p = 0; p < W && rc == MC_SUCCESS; p++)
    if (!mask[p]) take_in(a2a, p);
  if (rc == MC_SUCCESS) rc = step(a2a, mask, 2);
  return rc == MC_SUCCESS ? rc : used_up(a2a, mask, rc);
}
