/* mc_cpu_combine.c - combine on the cpu transport, step for step what the
 * GPU kernels do.
 *
 * Send: tell every rank "I entered combine-send of this round" (the round
 * barrier), then for each record dispatch-recv took in, sum its experts'
 * outputs here (fp32, experts ascending, weighted), round once to the wire
 * dtype and put that one row to every rank of the token's group, adding 1
 * to their row counter for this rank.
 * One row per (token, expert rank) instead of one per (token, expert).
 *
 * Recv: wait until each rank's row counter reaches its running total plus
 * the rows expected from it (known from our own routing), sum each token's
 * rows in ascending rank order in fp32, round once to the output dtype;
 * then wait for every rank's barrier signal of this round.
 *
 * Round i+1 cannot overwrite what a peer still reads from round i: a rank
 * puts rows of round i+1 into our comb_recv only after it got our meta of
 * round i+1, which we send once our combine-recv(i) has read comb_recv.
 * Nothing is reset: row counters are running totals, barrier signals carry
 * the round. In full: docs/protocol.md. */
#include <string.h>

#include "mc_cpu.h"
#include "mc_dtype.h"

mc_result_t mc_cpu_combine_send(mc_a2a_t *a2a, const mc_combine_args_t *args) {
  const mc_shape_t *s = &a2a->shape;
  mc_cpu_t *c = mc_cpu(a2a);
  const int W = s->world_size, G = s->group_size, H = s->hidden, cap = mc_expert_capacity(s);
  const mc_dtype_t in = a2a->cfg.combine_in_dtype;
  const uint64_t row_bytes = mc_row_bytes(s);
  unsigned char *win = mc_cpu_mine(a2a);
  float *acc = mc_cpu_ws(a2a, mc_ws_acc_off(s));

  for (int p = 0; p < W; p++)
    if (!a2a->masked[p]) mc_cpu_signal(a2a, p, MC_SIG_COMB_BAR, a2a->round, MC_SIG_SET);
  const unsigned char *y = args->expert_y;
  for (int i = 0; i < c->n_route; i++) {
    const mc_route_entry_t *r = mc_cpu_ws(a2a, mc_ws_route_off(s, i));
    unsigned char *row = win + mc_comb_send_off(s, i);
    if (s->layout == MC_LAYOUT_PACKED) { /* the caller's row for the record, weighted and summed already */
      memcpy(row, y + (uint64_t)r->targets[0].pos * row_bytes, row_bytes);
    } else {
      /* element by element the same sum as 0 + w0*y0 + w1*y1 + ..., a row at a time;
       * a target's row: batched, its expert's slot; sorted, the row itself */
      memset(acc, 0, sizeof(float) * (size_t)H);
      for (int k = 0; k < r->n_targets; k++) {
        const mc_target_t *tg = &r->targets[k];
        const uint64_t at = s->layout == MC_LAYOUT_BATCHED ? (uint64_t)tg->expert * cap + (uint64_t)tg->pos
                                                           : (uint64_t)tg->pos;
        mc_row_axpy(acc, tg->weight, y + at * row_bytes, H, in);
      }
      mc_row_store(row, acc, H, in);
    }
    int first = (r->src_rank / G) * G;
    for (int p = first; p < first + G; p++) {
      mc_cpu_put_signal(a2a, p, mc_comb_recv_off(s, a2a->comm->rank, r->token), row, row_bytes,
                        MC_SIG_COMB_ROWS, 1, MC_SIG_ADD);
      a2a->stats.combine_rows_sent++;
      a2a->stats.combine_bytes_sent += row_bytes;
    }
  }
  return MC_SUCCESS;
}

mc_result_t mc_cpu_combine_recv(mc_a2a_t *a2a, const mc_combine_args_t *args) {
  const mc_shape_t *s = &a2a->shape;
  mc_cpu_t *c = mc_cpu(a2a);
  const int W = s->world_size, K = s->topk, H = s->hidden;
  const mc_dtype_t in = a2a->cfg.combine_in_dtype, out_dt = a2a->cfg.combine_out_dtype;
  const uint64_t out_row = (uint64_t)H * mc_dtype_size(out_dt);
  unsigned char *win = mc_cpu_mine(a2a);
  const uint16_t *dests = mc_cpu_ws(a2a, mc_ws_dests_off(s)), *n_dests = mc_cpu_ws(a2a, mc_ws_ndests_off(s));
  const uint32_t *expect = mc_cpu_ws(a2a, mc_ws_expect_off(s));
  uint64_t *seen = mc_cpu_ws(a2a, mc_ws_seen_off(s));
  float *acc = mc_cpu_ws(a2a, mc_ws_acc_off(s));
  mc_result_t rc;

  for (int src = 0; src < W; src++) {
    if (a2a->masked[src]) continue; /* expects nothing from it: its rows were routed away */
    uint64_t *total = &seen[MC_SIG_COMB_ROWS * W + src];
    if ((rc = mc_cpu_wait_ge(a2a, "combine recv", MC_SIG_COMB_ROWS, src, *total + expect[src], NULL)))
      return rc;
    *total += expect[src];
  }
  for (int t = 0; t < c->m_eff; t++) {
    unsigned char *o = (unsigned char *)args->out + (uint64_t)t * out_row;
    const uint16_t *d = dests + (int64_t)t * K;
    memset(acc, 0, sizeof(float) * (size_t)H);
    for (int j = 0; j < n_dests[t]; j++) mc_row_axpy(acc, 1.0f, win + mc_comb_recv_off(s, d[j], t), H, in);
    mc_row_store(o, acc, H, out_dt);
  }
  for (int p = 0; p < W; p++)
    if (!a2a->masked[p] && (rc = mc_cpu_wait_ge(a2a, "combine recv", MC_SIG_COMB_BAR, p, a2a->round, NULL)))
      return rc;
  return MC_SUCCESS;
}
