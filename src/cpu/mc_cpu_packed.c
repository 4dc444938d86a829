/* mc_cpu_packed.c - the packed receive layouts on the cpu transport
 * (MC_LAYOUT_PACKED, MC_LAYOUT_EXPERT_SORTED): the recv half of
 * mc_dispatch_packed and mc_dispatch_counts.
 *
 * The send half is the batched layout's (mc_cpu_dispatch.c), whose metas
 * then also carry the sender's declared capacity and its records to every
 * rank and to every expert: from the metas it receives, every rank computes
 * every rank's rows (mc_packed_rows) and all reach one verdict. A round in
 * which some rank's rows exceed the capacity it declared is dropped on every
 * rank: each consumes its records unread and enters the round barrier that
 * combine would have entered, so the next round starts on every rank from
 * the same place and no buffer of the dropped one is read again. */
#include <string.h>

#include "mc_cpu.h"

static const unsigned char *metas(mc_a2a_t *a2a) { return mc_cpu_mine(a2a) + mc_disp_meta_off(&a2a->shape, 0); }

static int over_capacity(mc_a2a_t *a2a, int64_t *rows, int64_t *limit);
static mc_result_t drop_round(mc_a2a_t *a2a, int q, int64_t rows, int64_t limit);

/* The count step; a round that exceeds a declared capacity is dropped here
 * already (a rank that counts learns it before it sizes any buffer). */
mc_result_t mc_cpu_dispatch_counts(mc_a2a_t *a2a, int64_t *rows, int32_t *expert_count, void *stream) {
  mc_cpu_t *c = mc_cpu(a2a);
  (void)stream;
  mc_result_t rc = mc_cpu_dispatch_metas(a2a, c->lcount);
  if (rc != MC_SUCCESS) return rc;
  int64_t over_rows = 0, over_limit = 0;
  const int q = over_capacity(a2a, &over_rows, &over_limit);
  if (q >= 0) return drop_round(a2a, q, over_rows, over_limit);
  *rows = mc_packed_rows(&a2a->shape, metas(a2a), a2a->masked, a2a->comm->rank);
  for (int l = 0; expert_count && l < mc_num_local_experts(&a2a->shape); l++) /* each expert's segment */
    expert_count[l] = (int32_t)mc_align_up((uint64_t)c->lcount[l], (uint64_t)a2a->shape.expert_align);
  return MC_SUCCESS;
}

/* The lowest rank whose rows exceed the capacity it declared, or -1. */
static int over_capacity(mc_a2a_t *a2a, int64_t *rows, int64_t *limit) {
  const mc_shape_t *s = &a2a->shape;
  for (int q = 0; q < s->world_size; q++) {
    if (a2a->masked[q]) continue;
    *limit = mc_packed_limit(s, metas(a2a), q);
    if (*limit > 0 && (*rows = mc_packed_rows(s, metas(a2a), a2a->masked, q)) > *limit) return q;
  }
  return -1;
}

/* A dropped round: every source's records consumed unread (the running
 * totals move on), then the round barrier. */
static mc_result_t drop_round(mc_a2a_t *a2a, int q, int64_t rows, int64_t limit) {
  const mc_shape_t *s = &a2a->shape;
  const int W = s->world_size;
  mc_result_t rc;
  uint32_t n;
  for (int src = 0; src < W; src++)
    if (!a2a->masked[src] && (rc = mc_cpu_take_records(a2a, src, &n)) != MC_SUCCESS) return rc;
  mc_cpu(a2a)->n_route = 0;
  for (int p = 0; p < W; p++)
    if (!a2a->masked[p]) mc_cpu_signal(a2a, p, MC_SIG_COMB_BAR, a2a->round, MC_SIG_SET);
  for (int p = 0; p < W; p++)
    if (!a2a->masked[p] && (rc = mc_cpu_wait_ge(a2a, "dispatch recv", MC_SIG_COMB_BAR, p, a2a->round, NULL)))
      return rc;
  return mc_fail(a2a->err, MC_ERR_CAPACITY,
                 "dispatch: rank %d receives %lld rows this round, more than the capacity of %lld it declared; the "
                 "round is dropped on every rank (nothing written; dispatch is next)",
                 q, (long long)rows, (long long)limit);
}

mc_result_t mc_cpu_dispatch_recv_packed(mc_a2a_t *a2a, const mc_dispatch_args_t *args) {
  const mc_shape_t *s = &a2a->shape;
  mc_cpu_t *c = mc_cpu(a2a);
  const mc_packed_recv_t *out = args->recv;
  const int me = a2a->comm->rank, W = s->world_size, K = s->topk, L = mc_num_local_experts(s);
  const int sorted = s->layout == MC_LAYOUT_EXPERT_SORTED;
  unsigned char *win = mc_cpu_mine(a2a);
  const uint32_t *base = mc_cpu_ws(a2a, mc_ws_base_off(s));
  mc_result_t rc;

  /* 1. The metas; the verdict every rank reaches alike. */
  if ((rc = mc_cpu_dispatch_metas(a2a, c->lcount)) != MC_SUCCESS) return rc;
  int64_t over_rows = 0, over_limit = 0;
  const int q = over_capacity(a2a, &over_rows, &over_limit);
  if (q >= 0) return drop_round(a2a, q, over_rows, over_limit);

  /* 2. Where each local expert's rows start (sorted), padding marked. */
  c->loff[0] = 0;
  for (int l = 0; l < L; l++)
    c->loff[l + 1] = c->loff[l] + (sorted ? (int64_t)mc_align_up((uint64_t)c->lcount[l], (uint64_t)s->expert_align)
                                          : (int64_t)c->lcount[l]);
  const int64_t rows = mc_packed_rows(s, metas(a2a), a2a->masked, me);
  if (rows > out->capacity) /* the API layer's checks rule it out */
    return mc_fail(a2a->err, MC_ERR_INTERNAL, "dispatch recv: %lld rows > capacity %lld", (long long)rows,
                   (long long)out->capacity);
  for (int l = 0; sorted && l < L; l++)
    for (int64_t r = c->loff[l] + c->lcount[l]; r < c->loff[l + 1]; r++) {
      out->row_expert[r] = -1;
      if (out->row_weight) out->row_weight[r] = 0.0f;
    }
  uint64_t *load = mc_cpu_ws(a2a, mc_ws_load_off(s)); /* mc_a2a_get_expert_load's sums */
  for (int l = 0; l < L; l++) load[l] += (uint64_t)c->lcount[l];

  /* 3. Each source's records, in order: packed, a row each (rows ordered
   * by source, then record: by group, then token); sorted, a row per
   * (record, local expert) at the expert's offset plus the batched slot. */
  c->n_route = 0;
  int64_t next = 0;
  for (int src = 0; src < W; src++) {
    if (out->src_count) out->src_count[src] = 0;
    if (a2a->masked[src]) continue;
    uint32_t n;
    if ((rc = mc_cpu_take_records(a2a, src, &n)) != MC_SUCCESS) return rc;
    for (uint32_t i = 0; i < n; i++) {
      const unsigned char *rec = win + mc_disp_recv_off(s, src, (int)i);
      const mc_record_header_t *h = (const mc_record_header_t *)rec;
      mc_route_entry_t *r = mc_cpu_route_next(a2a, src, h);
      const int64_t prow = sorted ? -1 : next++;
      for (int k = 0; k < K; k++) {
        const mc_target_t tg = h->targets[k];
        if (tg.expert / L != me) continue;
        const int l = tg.expert - me * L;
        const int64_t row = sorted ? c->loff[l] + (int64_t)base[src * L + l] + tg.pos : prow;
        if (sorted || r->n_targets == 0) {
          memcpy((unsigned char *)out->x + (uint64_t)row * s->token_bytes, rec + mc_record_payload_off(s),
                 s->token_bytes);
          if (s->scale_bytes)
            memcpy((unsigned char *)out->x_scale + (uint64_t)row * s->scale_bytes, rec + mc_record_scale_off(s),
                   s->scale_bytes);
        }
        const int64_t at = sorted ? row : row * K + r->n_targets;
        out->row_expert[at] = l;
        if (out->row_weight) out->row_weight[at] = tg.weight;
        r->targets[r->n_targets++] = (mc_target_t){l, (int32_t)row, tg.weight};
      }
      for (int j = r->n_targets; !sorted && j < K; j++) {
        out->row_expert[prow * K + j] = -1;
        if (out->row_weight) out->row_weight[prow * K + j] = 0.0f;
      }
      if (out->src_count) out->src_count[src] += sorted ? r->n_targets : 1;
    }
  }
  if (out->expert_count) memcpy(out->expert_count, c->lcount, sizeof(int32_t) * (size_t)L);
  for (int l = 0; out->expert_offset && l <= L; l++) out->expert_offset[l] = (int32_t)c->loff[l];
  if (out->rows) *out->rows = rows;
  return MC_SUCCESS;
}
