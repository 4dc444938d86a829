/* mc_ref_packed.c - the packed receive layouts in the harness (case.layout
 * MC_LAYOUT_PACKED or MC_LAYOUT_EXPERT_SORTED).
 *
 * What only these layouts have is checked here: the rows and their order,
 * each row's local experts and weights, the offsets, the rows per source,
 * the padding, and nothing written past the rows. In a checked round the
 * rows then go back into the batched layout's slots (an expert's slots are
 * in (group, token) order, as the rows are), so that the batched layout's
 * checks serve every layout. The rows combine takes are made from the
 * received rows by the batched layout's fake experts: expert-sorted, each
 * row's own expert's output; packed, the engine's sum over the row's
 * experts, weighted, in the order and rounding combine uses for the batched
 * layout, so the combined output matches the batched reference bit for bit.
 * No batched expert output is made: at 4096 tokens on 8 ranks of one host
 * it would not fit beside the windows. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mc_dtype.h"
#include "mc_ref_dev.h"
#include "mc_ref_rank.h"

static int sorted(const mc_case_t *c) { return c->layout == MC_LAYOUT_EXPERT_SORTED; }
static int align_of(const mc_case_t *c) { return c->expert_align > 0 ? c->expert_align : 1; }
/* row_expert and row_weight entries per row */
static int cols(const mc_case_t *c) { return sorted(c) ? 1 : c->topk; }

/* The most rows a round can bring, and a band past them for the poison. */
static int64_t max_rows(const mc_case_t *c) {
  const int64_t L = mc_ref_local_experts(c), cap = mc_ref_capacity(c), K = c->topk;
  return sorted(c) ? cap * (K < L ? K : L) + L * (align_of(c) - 1) : cap;
}

int64_t mc_rr_packed_max_rows(const mc_case_t *c) { return max_rows(c); }
int mc_rr_packed_cols(const mc_case_t *c) { return cols(c); }

int mc_rr_packed_alloc(const mc_case_t *c, bufs_t *b) {
  const int64_t rows = max_rows(c) + POISON_BAND, L = mc_ref_local_experts(c);
  const size_t yrow = (size_t)c->hidden * mc_dtype_size(c->in_dtype);
  b->prow_max = max_rows(c);
  b->px = aligned_alloc(64, mc_align_up((uint64_t)rows * c->token_bytes, 64));
  b->pxs = c->scale_bytes ? malloc((size_t)rows * c->scale_bytes) : NULL;
  b->py = aligned_alloc(64, mc_align_up((uint64_t)rows * yrow, 64));
  b->pre = malloc(sizeof(int32_t) * (size_t)(rows * cols(c)));
  b->prw = malloc(sizeof(float) * (size_t)(rows * cols(c)));
  b->pcnt = malloc(sizeof(int32_t) * (size_t)L);
  b->poff = malloc(sizeof(int32_t) * (size_t)(L + 1));
  b->psrc = malloc(sizeof(int32_t) * (size_t)c->world_size);
  b->pwant_cnt = malloc(sizeof(int32_t) * (size_t)L);
  return b->px && (b->pxs || !c->scale_bytes) && b->py && b->pre && b->prw && b->pcnt && b->poff && b->psrc &&
                 b->pwant_cnt
             ? 0
             : -1;
}

void mc_rr_packed_free(bufs_t *b) {
  free(b->px), free(b->pxs), free(b->py), free(b->pre), free(b->prw);
  free(b->pcnt), free(b->poff), free(b->psrc), free(b->pwant_cnt);
}

/* Before a round, after mc_rr_packed_expect: the rows it will write and a
 * band past them, and every count, hold poison (uploaded where the
 * transport is a GPU one). */
int mc_rr_packed_poison(const mc_case_t *c, bufs_t *b, dbufs_t *d) {
  const int64_t want = b->pwant;
  const int64_t n = want + POISON_BAND < b->prow_max + POISON_BAND ? want + POISON_BAND : b->prow_max + POISON_BAND;
  const int L = mc_ref_local_experts(c);
  memset(b->px, POISON_X, (size_t)n * c->token_bytes);
  if (b->pxs) memset(b->pxs, POISON_X, (size_t)n * c->scale_bytes);
  memset(b->pre, 0x5A, sizeof(int32_t) * (size_t)(n * cols(c)));
  memset(b->prw, 0x5A, sizeof(float) * (size_t)(n * cols(c)));
  memset(b->pcnt, 0xF9, sizeof(int32_t) * (size_t)L);
  memset(b->poff, 0xF9, sizeof(int32_t) * (size_t)(L + 1));
  memset(b->psrc, 0xF9, sizeof(int32_t) * (size_t)c->world_size);
  b->prows = -7;
  if (!d->gpu) return 0;
  int bad = mc_dev_put(1, d->px, b->px, (size_t)n * c->token_bytes);
  if (b->pxs) bad |= mc_dev_put(1, d->pxs, b->pxs, (size_t)n * c->scale_bytes);
  bad |= mc_dev_put(1, d->pre, b->pre, sizeof(int32_t) * (size_t)(n * cols(c)));
  bad |= mc_dev_put(1, d->prw, b->prw, sizeof(float) * (size_t)(n * cols(c)));
  bad |= mc_dev_put(1, d->pcnt, b->pcnt, sizeof(int32_t) * (size_t)L);
  bad |= mc_dev_put(1, d->poff, b->poff, sizeof(int32_t) * (size_t)(L + 1));
  bad |= mc_dev_put(1, d->psrc, b->psrc, sizeof(int32_t) * (size_t)c->world_size);
  bad |= mc_dev_put(1, d->prows, &b->prows, sizeof b->prows);
  return bad ? -1 : 0;
}

/* After the recv half on a GPU transport: the rows it says it wrote and
 * the band past them, and the counts, into the host buffers. */
int mc_rr_packed_get(const mc_case_t *c, bufs_t *b, const dbufs_t *d) {
  const int L = mc_ref_local_experts(c);
  if (mc_dev_get(1, &b->prows, d->prows, sizeof b->prows)) return -1;
  const int64_t most = b->prow_max + POISON_BAND;
  const int64_t n = b->prows < 0 ? POISON_BAND : b->prows + POISON_BAND < most ? b->prows + POISON_BAND : most;
  int bad = mc_dev_get(1, b->px, d->px, (size_t)n * c->token_bytes);
  if (b->pxs) bad |= mc_dev_get(1, b->pxs, d->pxs, (size_t)n * c->scale_bytes);
  bad |= mc_dev_get(1, b->pre, d->pre, sizeof(int32_t) * (size_t)(n * cols(c)));
  bad |= mc_dev_get(1, b->prw, d->prw, sizeof(float) * (size_t)(n * cols(c)));
  bad |= mc_dev_get(1, b->pcnt, d->pcnt, sizeof(int32_t) * (size_t)L);
  bad |= mc_dev_get(1, b->poff, d->poff, sizeof(int32_t) * (size_t)(L + 1));
  bad |= mc_dev_get(1, b->psrc, d->psrc, sizeof(int32_t) * (size_t)c->world_size);
  return bad ? -1 : 0;
}

static int all_bytes(const void *p, size_t n, uint8_t v) {
  const uint8_t *q = p;
  for (size_t i = 0; i < n; i++)
    if (q[i] != v) return 0;
  return 1;
}

/* The weight of (group g, token t) for global expert e, as dispatch sends it. */
static float weight_of(const mc_case_t *c, const mc_input_t *in, int t, int e) {
  for (int k = 0; k < c->topk; k++)
    if (in->indices[(size_t)t * c->topk + k] == e) return in->weights ? in->weights[(size_t)t * c->topk + k] : 1.0f;
  return -1.0f;
}

/* The rank of group g that sends token t (a group's members send contiguous chunks). */
static int sender_of(const mc_case_t *c, const mc_input_t *in, int g, int t) {
  const int chunk = (in->bound_m + c->group_size - 1) / c->group_size;
  return g * c->group_size + t / chunk;
}

#define FAIL(...)                                                                                                      \
  do {                                                                                                                 \
    mc_rr_fail(me, 0, __VA_ARGS__);                                                                                    \
    return -1;                                                                                                         \
  } while (0)

int mc_rr_packed_unpack(const mc_case_t *c, bufs_t *b, int rank, uint64_t round, mc_run_rank_t *me) {
  const int L = mc_ref_local_experts(c), cap = mc_ref_capacity(c), K = cols(c), W = c->world_size;
  const unsigned long long rd = (unsigned long long)round;
  const int64_t rows = b->prows;
  int32_t *src = calloc((size_t)W, sizeof *src);
  if (!src) FAIL("round %llu rank %d: out of host memory", rd, rank);
  const int32_t *cnt = b->ref_count; /* each expert's rows, as the reference has them */
  int bad = 0;
  const int64_t want = b->pwant;
  if (rows != want) {
    free(src);
    FAIL("round %llu rank %d: recv->rows=%lld, reference %lld", rd, rank, (long long)rows, (long long)want);
  }
  /* row r of expert l's slot: packed, by the order of the rows; sorted, from the offsets */
  for (int l = 0; l < L; l++) b->count[l] = 0;
  int64_t expect_off = 0;
  for (int l = 0; sorted(c) && l <= L && !bad; l++) {
    if (b->poff[l] != expect_off) {
      mc_rr_fail(me, 0, "round %llu rank %d: expert_offset[%d]=%d, reference %lld", rd, rank, l, b->poff[l],
                 (long long)expect_off);
      bad = 1;
    }
    if (l < L) expect_off += (b->ref_count[l] + align_of(c) - 1) / align_of(c) * align_of(c);
  }
  int prev_g = -1, prev_t = -1;
  for (int64_t r = 0; r < rows && !bad; r++) {
    int g = -1, t = -1, n = 0;
    for (int j = 0; j < K && !bad; j++) {
      const int l = b->pre[r * K + j];
      const float w = b->prw[r * K + j];
      if (l < 0) {
        if ((l != -1 || w != 0.0f || (!sorted(c) && j == 0))) {
          mc_rr_fail(me, 0, "round %llu rank %d: row %lld column %d: expert %d weight %g (want -1 and 0 after the "
                     "row's experts)", rd, rank, (long long)r, j, l, (double)w);
          bad = 1;
        }
        continue;
      }
      if (l >= L || (j > 0 && l <= b->pre[r * K + j - 1]) ||
          (sorted(c) && !(r >= b->poff[l] && r < b->poff[l] + cnt[l]))) {
        mc_rr_fail(me, 0, "round %llu rank %d: row %lld column %d names local expert %d (out of order or range)", rd,
                   rank, (long long)r, j, l);
        bad = 1;
        continue;
      }
      const int slot = sorted(c) ? (int)(r - b->poff[l]) : b->count[l];
      if (slot >= cnt[l]) {
        mc_rr_fail(me, 0, "round %llu rank %d: expert %d gets more than its %d rows", rd, rank, l, cnt[l]);
        bad = 1;
        continue;
      }
      b->count[l] = slot + 1 > b->count[l] ? slot + 1 : b->count[l];
      const size_t at = (size_t)l * cap + (size_t)slot;
      /* one row, one token: every expert of a packed row names the same (group, token) */
      if (n++ == 0) g = b->src_g[at], t = b->src_t[at];
      if ((b->src_g[at] != g || b->src_t[at] != t || w != weight_of(c, &b->ins[g], t, rank * L + l))) {
        mc_rr_fail(me, 0, "round %llu rank %d: row %lld column %d: expert %d weight %g, reference token %d of group "
                   "%d weight %g", rd, rank, (long long)r, j, l, (double)w, b->src_t[at], b->src_g[at],
                   (double)weight_of(c, &b->ins[b->src_g[at]], b->src_t[at], rank * L + l));
        bad = 1;
        continue;
      }
      memcpy(b->x + at * c->token_bytes, b->px + (size_t)r * c->token_bytes, c->token_bytes);
      if (b->xs) memcpy(b->xs + at * c->scale_bytes, b->pxs + (size_t)r * c->scale_bytes, c->scale_bytes);
    }
    if (n == 0) continue; /* padding (sorted), checked above */
    if (!sorted(c) && (g < prev_g || (g == prev_g && t <= prev_t))) {
      mc_rr_fail(me, 0, "round %llu rank %d: row %lld holds token %d of group %d after token %d of group %d", rd, rank,
                 (long long)r, t, g, prev_t, prev_g);
      bad = 1;
    }
    prev_g = g, prev_t = t;
    src[sender_of(c, &b->ins[g], g, t)] += sorted(c) ? n : 1;
  }
  if (!bad) {
    for (int l = 0; l < L && !bad; l++)
      if (b->pcnt[l] != b->ref_count[l] || b->count[l] != b->ref_count[l]) {
        mc_rr_fail(me, 0, "round %llu rank %d: expert %d: expert_count %d, rows %d, reference %d", rd, rank, l,
                   b->pcnt[l], b->count[l], b->ref_count[l]);
        bad = 1;
      }
    for (int s = 0; s < W && !bad; s++)
      if (b->psrc[s] != src[s]) {
        mc_rr_fail(me, 0, "round %llu rank %d: src_count[%d]=%d, the rows hold %d from it", rd, rank, s, b->psrc[s],
                   src[s]);
        bad = 1;
      }
    for (int l = 0; !sorted(c) && l <= L && !bad; l++) /* packed: the prefix sums of expert_count */
      if (b->poff[l] != (l ? b->poff[l - 1] + b->pcnt[l - 1] : 0)) {
        mc_rr_fail(me, 0, "round %llu rank %d: expert_offset[%d]=%d is not the sum of the counts before", rd, rank, l,
                   b->poff[l]);
        bad = 1;
      }
    for (int64_t r = rows; r < rows + POISON_BAND && r < b->prow_max + POISON_BAND && !bad; r++)
      if (!all_bytes(b->px + (size_t)r * c->token_bytes, c->token_bytes, POISON_X) ||
          (b->pxs && !all_bytes(b->pxs + (size_t)r * c->scale_bytes, c->scale_bytes, POISON_X)) ||
          !all_bytes(b->pre + r * K, sizeof(int32_t) * (size_t)K, 0x5A)) {
        mc_rr_fail(me, 0, "round %llu rank %d: row %lld past the %lld rows was written", rd, rank, (long long)r,
                   (long long)rows);
        bad = 1;
      }
  }
  free(src);
  return bad ? -1 : 0;
}

int mc_rr_packed_rows_y(const mc_case_t *c, bufs_t *b, int rank) {
  const int L = mc_ref_local_experts(c), K = cols(c), H = c->hidden;
  const size_t yrow = (size_t)H * mc_dtype_size(c->in_dtype);
  float *acc = malloc(sizeof(float) * (size_t)H);
  uint8_t *ey = malloc(yrow);
  if (!acc || !ey) abort();
  for (int64_t r = 0; r < b->prows; r++) {
    uint8_t *y = b->py + (size_t)r * yrow;
    const uint8_t *x = b->px + (size_t)r * c->token_bytes;
    memset(acc, 0, sizeof(float) * (size_t)H);
    int n = 0;
    for (int j = 0; j < K; j++) {
      const int l = b->pre[r * K + j];
      if (l < 0) continue;
      /* the fake expert of the batched layout, on the row's bytes: the same output */
      mc_ref_expert(c, rank * L + l, x, sorted(c) ? (void *)y : (void *)ey);
      if (!sorted(c)) mc_row_axpy(acc, b->prw[r * K + j], ey, H, c->in_dtype);
      n++;
    }
    if (n == 0) memset(y, POISON_OUT, yrow); /* padding: a combine that read it would sum NaN */
    else if (!sorted(c)) mc_row_store(y, acc, H, c->in_dtype);
  }
  free(acc);
  free(ey);
  return 0;
}

void mc_rr_packed_expect(const mc_case_t *c, bufs_t *b, int rank) {
  const int64_t all = c->declare < 0 ? b->prow_max : c->declare; /* what the declaring ranks declare */
  const int L = mc_ref_local_experts(c), align = align_of(c);
  b->pover = -1;
  b->pover_rows = 0;
  for (int q = 0; q < c->world_size && all > 0 && b->pover < 0; q++)
    if (!(c->odd_counted && q % 2) && !(q < 64 && (c->masked >> q & 1)) &&
        (b->pover_rows = mc_ref_packed_rows(c, b->ins, q, NULL)) > all)
      b->pover = q;
  b->pwant = mc_ref_packed_rows(c, b->ins, rank, b->pwant_cnt);
  for (int l = 0; l < L; l++) b->pwant_cnt[l] = (b->pwant_cnt[l] + align - 1) / align * align;
}

/* A call that must succeed: 1, else 0 with the failure recorded. */
static int ok(mc_run_rank_t *me, mc_a2a_t *a2a, int rank, unsigned long long round, const char *what, mc_result_t rc) {
  if (rc != MC_SUCCESS)
    mc_rr_fail(me, rc, "round %llu rank %d: %s -> %s: %s", round, rank, what, mc_result_string(rc),
               mc_a2a_last_error(a2a));
  return rc == MC_SUCCESS;
}

/* The packed layouts' dispatch, between marks 0-3: with a declared
 * capacity (one call or two halves), or the count step between the halves
 * with the buffers sized from it (a recv half given one row too few must be
 * refused first, changing nothing). A round the reference says overflows a
 * rank's declared capacity must fail on every rank with MC_ERR_CAPACITY
 * naming the lowest such rank: 1 then (the round is over), 0 when done,
 * -1 on a failure (recorded). */
int mc_rr_packed_dispatch(const mc_case_t *c, mc_a2a_t *a2a, bufs_t *b, const dbufs_t *d, const call_in_t *ci, int m,
                          int one_call, int rank, uint64_t round, mc_run_rank_t *me) {
  const int gpu = d->gpu;
  const unsigned long long rd = (unsigned long long)round;
  const int64_t all = c->declare < 0 ? b->prow_max : c->declare; /* what the declaring ranks declare */
  const int64_t declared = c->odd_counted && rank % 2 ? 0 : all;
  mc_packed_recv_t r = {sizeof r, declared, d->px,   d->pxs,  (int32_t *)d->pre, (float *)d->prw,
                        (int32_t *)d->pcnt, (int32_t *)d->poff, (int32_t *)d->psrc, (int64_t *)d->prows};
  const int over = b->pover; /* the lowest declaring rank (not masked) whose rows exceed its capacity */
  const int64_t over_rows = b->pover_rows;
#define PACKED(recv, flags)                                                                                            \
  mc_dispatch_packed(a2a, ci->tokens, ci->scales, ci->indices, ci->weights, m, ci->bound, recv, flags,             \
                     mc_dev_stream())
  mc_result_t rc;
  mc_dev_mark(gpu, 0);
  if (declared > 0 && one_call) {
    rc = PACKED(&r, MC_SEND_RECV);
  } else {
    if (!ok(me, a2a, rank, rd, "mc_dispatch_packed (send)", PACKED(declared > 0 ? &r : NULL, MC_SEND))) return -1;
    mc_dev_mark(gpu, 1);
    if (declared == 0) {
      int64_t rows = -1;
      if (over >= 0) { /* the count step drops the round already */
        rc = mc_dispatch_counts(a2a, &rows, b->pcnt, mc_dev_stream());
        goto verdict;
      }
      if (!ok(me, a2a, rank, rd, "mc_dispatch_counts", mc_dispatch_counts(a2a, &rows, b->pcnt, mc_dev_stream())))
        return -1;
      /* the rows, and each expert's rows (its pairs rounded up to expert_align) */
      const int L = mc_ref_local_experts(c);
      const int64_t want = b->pwant;
      int bad_l = -1;
      for (int l = 0; l < L && bad_l < 0; l++)
        if (b->pcnt[l] != b->pwant_cnt[l]) bad_l = l;
      if (rows != want || bad_l >= 0) {
        mc_rr_fail(me, 0, "round %llu rank %d: mc_dispatch_counts says %lld rows (reference %lld)%s", rd, rank,
                   (long long)rows, (long long)want,
                   bad_l >= 0 ? ", and a local expert's rows differ from its pairs rounded up" : "");
        return -1;
      }
      r.capacity = rows - 1;
      if (rows > 0 && (rc = PACKED(&r, MC_RECV)) != MC_ERR_INVALID_ARG) {
        mc_rr_fail(me, rc, "round %llu rank %d: a recv half with capacity %lld for %lld rows returned %s", rd, rank,
                   (long long)r.capacity, (long long)rows, mc_result_string(rc));
        return -1;
      }
      r.capacity = rows;
    }
    mc_dev_mark(gpu, 2);
    rc = PACKED(&r, MC_RECV);
  }
verdict:
  mc_dev_mark(gpu, 3);
#undef PACKED
  /* a GPU transport's recv half returns before the device has reached its
   * verdict: a dropped round shows at a later call. In odd rounds the
   * caller queues the round's combine first, as an engine does without
   * synchronising: the device makes it a no-op (it must not wait for rows
   * nobody sends), and the drop shows from it or after it */
  if (over >= 0 && gpu && rc == MC_SUCCESS && round % 2)
    rc = mc_combine(a2a, d->py, d->out, MC_SEND_RECV, mc_dev_stream());
  if (over >= 0 && gpu && rc == MC_SUCCESS) {
    mc_dev_sync(gpu);
    rc = mc_a2a_check(a2a);
  }
  if (over >= 0) {
    char want[64];
    snprintf(want, sizeof want, "rank %d receives %lld rows", over, (long long)over_rows);
    if (rc != MC_ERR_CAPACITY || !strstr(mc_a2a_last_error(a2a), want)) {
      mc_rr_fail(me, rc, "round %llu rank %d: rank %d receives %lld rows over the %lld declared: wanted "
                 "MC_ERR_CAPACITY naming it, got %s: %s", rd, rank, over, (long long)over_rows, (long long)all,
                 mc_result_string(rc), mc_a2a_last_error(a2a));
      return -1;
    }
    me->dropped++;
    return 1;
  }
  if (!ok(me, a2a, rank, rd, "mc_dispatch_packed (recv)", rc)) return -1;
  if (r.capacity > me->recv_capacity_max) me->recv_capacity_max = r.capacity;
  return 0;
}
