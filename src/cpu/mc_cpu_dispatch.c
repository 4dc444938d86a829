/* mc_cpu_dispatch.c - dispatch on the cpu transport: the protocol's
 * reference implementation, step for step what the GPU kernels do.
 *
 * Send: check every token's top-k (before anything leaves), pack each of
 * this rank's tokens once into a record, put it to every destination rank
 * (one copy per (token, rank)), each put adding 1 to the receiver's record
 * counter for this source; then put to every rank, even those receiving
 * nothing, the meta (record count, per-expert counts) with the signal SET
 * to the round number.
 *
 * Recv: wait for every source's meta of this round, compute where each
 * (source, local expert) starts in expert_x (sources ascending, and a group's
 * members send contiguous chunks, so slots are ordered by (group, token)),
 * wait until each source's record counter reaches its running total, copy
 * payloads and scales to their slots, and note each record's route for
 * combine.
 *
 * Round i+1 cannot overwrite what a peer still reads from round i: a rank
 * sends again only after its combine-recv(i) saw every rank enter
 * combine-send(i), which each does once its dispatch-recv(i) has read its
 * records and metas. Nothing is reset: counters are running totals, the
 * meta signal carries the round. In full: docs/protocol.md. */
#include <string.h>

#include "mc_cpu.h"
#include "mc_quant.h"
#include "mc_route.h"

static int ids64(const mc_a2a_t *a2a) { return a2a->cfg.index_dtype == MC_INDEX_INT64; }

/* A token's n destination ranks less the masked ones (mc_a2a_mask_ranks):
 * its experts there are dropped. Returns how many are left. */
static int masked_out(const mc_a2a_t *a2a, uint16_t *d, int n) {
  int kept = 0;
  for (int j = 0; j < n; j++)
    if (!a2a->masked[d[j]]) d[kept++] = d[j];
  return kept;
}


/* Token t's ids as int32 (the round was checked: they are valid). */
static void load_ids(const mc_a2a_t *a2a, const mc_dispatch_args_t *args, int t, int32_t *idx) {
  int bad_k;
  int64_t bad_v;
  (void)mc_route_load(args->indices, ids64(a2a), t, a2a->shape.topk, a2a->shape.num_experts, idx, &bad_k, &bad_v);
}

static mc_result_t check_routing(mc_a2a_t *a2a, const mc_dispatch_args_t *args, int m_eff) {
  const mc_shape_t *s = &a2a->shape;
  for (int t = 0; t < m_eff; t++) {
    int bad = 0;
    int64_t v = 0;
    int32_t idx[MC_MAX_TOPK];
    int why = mc_route_load(args->indices, ids64(a2a), t, s->topk, s->num_experts, idx, &bad, &v);
    if (why == MC_ROUTE_OUT_OF_RANGE)
      return mc_fail(a2a->err, MC_ERR_INVALID_ARG,
                     "mc_dispatch: indices[%d][%d]=%lld is not an expert id in 0..%d", t, bad, (long long)v,
                     s->num_experts - 1);
    if (why == MC_ROUTE_DUPLICATE)
      return mc_fail(a2a->err, MC_ERR_INVALID_ARG,
                     "mc_dispatch: indices[%d] names expert %lld twice (position %d); a token's top-k "
                     "experts must be distinct",
                     t, (long long)v, bad);
  }
  return MC_SUCCESS;
}

/* FNV-1a over the round's inputs that every rank of a group must share:
 * m (bound_m applied), the indices and the weights (NULL: weights of 1). */
static uint64_t fnv1a(uint64_t h, const void *p, size_t n) {
  const unsigned char *b = p;
  for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}
static uint64_t group_digest(const mc_dispatch_args_t *args, int m_eff, int K, int wide) {
  uint64_t h = fnv1a(1469598103934665603ull, &m_eff, sizeof m_eff);
  h = fnv1a(h, args->indices, mc_index_size(wide) * (size_t)m_eff * (size_t)K);
  return args->weights ? fnv1a(h, args->weights, sizeof(float) * (size_t)m_eff * (size_t)K) : fnv1a(h, "1", 1);
}

mc_result_t mc_cpu_dispatch_send(mc_a2a_t *a2a, const mc_dispatch_args_t *args) {
  const mc_shape_t *s = &a2a->shape;
  mc_cpu_t *c = mc_cpu(a2a);
  const int me = a2a->comm->rank, W = s->world_size, K = s->topk, L = mc_num_local_experts(s);
  int m_eff = args->m;
  if (args->bound_m) {
    int b = *args->bound_m;
    if (b < 0 || b > args->m)
      return mc_fail(a2a->err, MC_ERR_INVALID_ARG, "mc_dispatch: *bound_m=%d is not in 0..m=%d", b, args->m);
    m_eff = b;
  }
  mc_result_t rc = check_routing(a2a, args, m_eff);
  if (rc != MC_SUCCESS) return rc;

  /* Checked: from here on the round is under way. */
  const uint64_t round = ++a2a->round;
  c->m_eff = m_eff;
  uint16_t *dests = mc_cpu_ws(a2a, mc_ws_dests_off(s)), *n_dests = mc_cpu_ws(a2a, mc_ws_ndests_off(s));
  uint32_t *expect = mc_cpu_ws(a2a, mc_ws_expect_off(s));
  memset(expect, 0, sizeof(uint32_t) * (size_t)W);
  /* Every member of the group learns every token's destinations: each of them
   * receives every combined row. */
  for (int t = 0; t < m_eff; t++) {
    int32_t idx[MC_MAX_TOPK];
    load_ids(a2a, args, t, idx);
    n_dests[t] = (uint16_t)masked_out(a2a, dests + (int64_t)t * K, mc_route_dests(idx, K, L, dests + (int64_t)t * K));
    for (int j = 0; j < n_dests[t]; j++) expect[dests[(int64_t)t * K + j]]++;
  }

  uint32_t *nrec = mc_cpu_ws(a2a, mc_ws_sendcnt_off(s)), *npos = nrec + W;
  memset(nrec, 0, sizeof(uint32_t) * ((size_t)W + (size_t)s->num_experts));
  int begin, end;
  mc_send_chunk(s, m_eff, me % s->group_size, &begin, &end);
  unsigned char *win = mc_cpu_mine(a2a);
  const uint64_t rec_bytes = mc_record_bytes(s);
  for (int t = begin; t < end; t++) {
    unsigned char *rec = win + mc_disp_send_off(s, t - begin);
    mc_record_header_t *h = (mc_record_header_t *)rec;
    int32_t idx[MC_MAX_TOPK];
    load_ids(a2a, args, t, idx);
    int order[MC_MAX_TOPK];
    mc_route_sorted(idx, K, order);
    h->token = t;
    h->n_targets = K;
    for (int k = 0; k < K; k++) {
      int e = idx[order[k]];
      h->targets[k] = (mc_target_t){e, (int32_t)npos[e]++,
                                    args->weights ? args->weights[(int64_t)t * K + order[k]] : 1.0f};
    }
    if (a2a->cfg.dispatch_input == MC_INPUT_BF16_TO_E4M3) {
      /* MC_INPUT_BF16_TO_E4M3: the token's bf16 row into the record's e4m3 payload and scales */
      mc_quant_blocks((const uint16_t *)args->tokens + (uint64_t)t * s->hidden, (size_t)(s->hidden / MC_QBLOCK),
                      a2a->cfg.scale_format == MC_SCALE_UE8M0, rec + mc_record_payload_off(s),
                      rec + mc_record_scale_off(s));
    } else {
      memcpy(rec + mc_record_payload_off(s), (const unsigned char *)args->tokens + (uint64_t)t * s->token_bytes,
             s->token_bytes);
      if (s->scale_bytes)
        memcpy(rec + mc_record_scale_off(s), (const unsigned char *)args->scales + (uint64_t)t * s->scale_bytes,
               s->scale_bytes);
    }
    const uint16_t *d = dests + (int64_t)t * K;
    for (int j = 0; j < n_dests[t]; j++)
      mc_cpu_put_signal(a2a, d[j], mc_disp_recv_off(s, me, (int)nrec[d[j]]++), rec, rec_bytes,
                        MC_SIG_DISP_RECS, 1, MC_SIG_ADD);
  }
  /* Meta to every rank, so every receiver knows this round's count from us,
   * zero included, and can compare our inputs' digest with our group's. */
  const uint64_t digest = s->group_size > 1 ? group_digest(args, m_eff, K, ids64(a2a)) : 0;
  const uint64_t limit = args->recv ? (uint64_t)args->recv->capacity : 0;
  for (int d = 0; d < W; d++) {
    if (a2a->masked[d]) continue;
    uint64_t *meta = (uint64_t *)(win + mc_meta_send_off(s, d));
    for (int w = 0; w < mc_meta_words(s); w++) /* with the packed layouts, the words mc_packed_rows reads too */
      meta[w] = mc_meta_pack(round, mc_meta_value(s, nrec, npos, d, w, digest, limit));
    mc_cpu_put_signal(a2a, d, mc_disp_meta_off(s, me), meta, mc_meta_bytes(s), MC_SIG_DISP_META, round,
                      MC_SIG_SET);
    a2a->stats.dispatch_records_sent += nrec[d];
    a2a->stats.dispatch_bytes_sent += nrec[d] * rec_bytes + mc_meta_bytes(s);
  }
  return MC_SUCCESS;
}

mc_result_t mc_cpu_dispatch_recv(mc_a2a_t *a2a, const mc_dispatch_args_t *args) {
  const mc_shape_t *s = &a2a->shape;
  mc_cpu_t *c = mc_cpu(a2a);
  const int me = a2a->comm->rank, W = s->world_size, K = s->topk, L = mc_num_local_experts(s);
  const int cap = mc_expert_capacity(s);
  unsigned char *win = mc_cpu_mine(a2a);
  uint32_t *base = mc_cpu_ws(a2a, mc_ws_base_off(s));
  mc_result_t rc;
  if (mc_packed_layout(s)) return mc_cpu_dispatch_recv_packed(a2a, args);

  /* 1. Every source's meta of this round; slot bases by (source, expert). */
  if ((rc = mc_cpu_dispatch_metas(a2a, args->expert_count)) != MC_SUCCESS) return rc;
  for (int l = 0; l < L; l++)
    if (args->expert_count[l] > cap)
      return mc_fail(a2a->err, MC_ERR_INTERNAL, "dispatch recv: local expert %d got %d tokens > capacity %d",
                     l, args->expert_count[l], cap);
  uint64_t *load = mc_cpu_ws(a2a, mc_ws_load_off(s)); /* mc_a2a_get_expert_load's sums */
  for (int l = 0; l < L; l++) load[l] += (uint64_t)args->expert_count[l];

  /* 2. Each source's records, in order, into their slots. */
  c->n_route = 0;
  for (int src = 0; src < W; src++) {
    if (a2a->masked[src]) continue;
    uint32_t n;
    if ((rc = mc_cpu_take_records(a2a, src, &n)) != MC_SUCCESS) return rc;
    for (uint32_t i = 0; i < n; i++) {
      const unsigned char *rec = win + mc_disp_recv_off(s, src, (int)i);
      const mc_record_header_t *h = (const mc_record_header_t *)rec;
      mc_route_entry_t *r = mc_cpu_route_next(a2a, src, h);
      for (int k = 0; k < K; k++) {
        mc_target_t tg = h->targets[k];
        if (tg.expert / L != me) continue;
        int l = tg.expert - me * L, slot = (int)base[src * L + l] + tg.pos;
        memcpy((unsigned char *)args->expert_x + ((uint64_t)l * cap + slot) * s->token_bytes,
               rec + mc_record_payload_off(s), s->token_bytes);
        if (s->scale_bytes)
          memcpy((unsigned char *)args->expert_scale + ((uint64_t)l * cap + slot) * s->scale_bytes,
                 rec + mc_record_scale_off(s), s->scale_bytes);
        r->targets[r->n_targets++] = (mc_target_t){l, slot, tg.weight};
      }
    }
  }
  return MC_SUCCESS;
}

/* The next route entry of this round (combine-send's list of what this
 * rank received), for a record from src, with no target yet. */
mc_route_entry_t *mc_cpu_route_next(mc_a2a_t *a2a, int src, const mc_record_header_t *h) {
  mc_route_entry_t *r = mc_cpu_ws(a2a, mc_ws_route_off(&a2a->shape, mc_cpu(a2a)->n_route++));
  r->src_rank = src;
  r->token = h->token;
  r->n_targets = 0;
  return r;
}

/* Source src's records of this round, every one arrived (its RECS signal
 * at the running total plus its meta's count), and the total moved on; *n:
 * how many. */
mc_result_t mc_cpu_take_records(mc_a2a_t *a2a, int src, uint32_t *n) {
  const mc_shape_t *s = &a2a->shape;
  uint64_t *total = (uint64_t *)mc_cpu_ws(a2a, mc_ws_seen_off(s)) + MC_SIG_DISP_RECS * s->world_size + src;
  *n = mc_meta_get(s, mc_cpu_mine(a2a) + mc_disp_meta_off(s, 0), src, 0);
  mc_result_t rc = mc_cpu_wait_ge(a2a, "dispatch recv", MC_SIG_DISP_RECS, src, *total + *n, NULL);
  if (rc == MC_SUCCESS) *total += *n;
  return rc;
}

/* Step 1 of every layout's recv half, and mc_dispatch_counts: every
 * unmasked source's meta of this round; the slot bases by (source, local
 * expert) into the workspace, and (count, if not NULL) the pairs per local
 * expert. Then the group digests: the ranks of a group must pass the same
 * m, indices and weights (each sends its share of the same tokens); every
 * rank sees every rank's meta, so every rank finds a disagreement, and none
 * goes on with the round. */
mc_result_t mc_cpu_dispatch_metas(mc_a2a_t *a2a, int32_t *count) {
  const mc_shape_t *s = &a2a->shape;
  const int W = s->world_size, L = mc_num_local_experts(s);
  const uint64_t round = a2a->round;
  unsigned char *win = mc_cpu_mine(a2a);
  uint32_t *base = mc_cpu_ws(a2a, mc_ws_base_off(s));
  mc_result_t rc;
  for (int src = 0; src < W; src++) {
    if (a2a->masked[src]) continue; /* masked: it sends nothing, nothing is awaited */
    uint64_t got;
    if ((rc = mc_cpu_wait_ge(a2a, "dispatch recv", MC_SIG_DISP_META, src, round, &got))) return rc;
    if (got != round)
      return mc_fail(a2a->err, MC_ERR_INTERNAL, "dispatch recv: rank %d sent meta of round %llu in round %llu",
                     src, (unsigned long long)got, (unsigned long long)round);
  }
  for (int l = 0; l < L; l++) { /* sources ascending: slots ordered by (group, token) */
    uint32_t run = 0;
    for (int src = 0; src < W; src++) {
      base[src * L + l] = run;
      if (!a2a->masked[src]) run += mc_meta_get(s, win + mc_disp_meta_off(s, 0), src, 1 + l);
    }
    if (count) count[l] = (int32_t)run;
  }
  for (int src = 0; src < W && s->group_size > 1; src++) {
    const int first = src / s->group_size * s->group_size;
    const unsigned char *meta0 = win + mc_disp_meta_off(s, 0);
    const int dw = mc_meta_digest_word(s);
    const uint64_t d0 = mc_meta_get(s, meta0, first, dw) | (uint64_t)mc_meta_get(s, meta0, first, dw + 1) << 32;
    const uint64_t d1 = mc_meta_get(s, meta0, src, dw) | (uint64_t)mc_meta_get(s, meta0, src, dw + 1) << 32;
    if (d0 != d1) {
      a2a->aborted = 1;
      return mc_fail(a2a->err, MC_ERR_INVALID_USAGE,
                     "mc_dispatch: ranks %d and %d of group %d passed different m, indices or weights (every rank "
                     "of a group must pass the same); the round cannot finish",
                     first, src, src / s->group_size);
    }
  }
  return MC_SUCCESS;
}
