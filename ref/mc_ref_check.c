/* mc_ref_check.c - a rank's outputs against the reference model (counts,
 * payload and scale bytes, poison left where nothing may be written, combine
 * bit for bit and within the stated tolerance of the exact sum), and the bad
 * calls that must be refused without changing anything. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mc_dtype.h"
#include "mc_ref_dev.h"
#include "mc_ref_rank.h"

void mc_rr_fail(mc_run_rank_t *me, int api_rc, const char *fmt, ...) {
  if (me->failed) return; /* keep the first */
  me->failed = 1;
  me->api_rc = api_rc;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(me->msg, sizeof me->msg, fmt, ap);
  va_end(ap);
}

double mc_ref_tolerance(const mc_case_t *c) {
  /* Unit roundoff of a dtype (half its spacing at 1.0: bf16 keeps 7 mantissa
   * bits, fp16 10). The wire rounds each rank's partial sum once (error at
   * most u_in of that partial's sum |w y|), the output rounds once (u_out of
   * the result); fp32 accumulation adds about one 2^-24 per term. Twice
   * that is the stated tolerance, relative to sum |w y|. */
  double u_in = c->in_dtype == MC_DTYPE_FP32 ? 0x1p-24 : c->in_dtype == MC_DTYPE_BF16 ? 0x1p-8 : 0x1p-11;
  double u_out = c->out_dtype == MC_DTYPE_FP32 ? 0x1p-24 : c->out_dtype == MC_DTYPE_BF16 ? 0x1p-8 : 0x1p-11;
  return 2 * u_in + 2 * u_out + (c->topk + 2) * 0x1p-24;
}

static int all_bytes(const uint8_t *p, size_t n, uint8_t v) {
  for (size_t i = 0; i < n; i++)
    if (p[i] != v) return 0;
  return 1;
}

/* The round's dispatch outputs against the reference mc_rr_poison_outputs
 * drew before the call: each count, each filled slot's payload and scale
 * bytes, and the poisoned band past each count untouched. */
void mc_rr_check_dispatch(const mc_case_t *c, const bufs_t *b, int rank, uint64_t round, mc_run_rank_t *me) {
  int L = mc_ref_local_experts(c), cap = mc_ref_capacity(c);
  for (int l = 0; l < L && !me->failed; l++) {
    if (b->count[l] != b->ref_count[l]) {
      mc_rr_fail(me, 0, "round %llu rank %d: expert_count[%d]=%d, reference %d", (unsigned long long)round, rank, l,
                 b->count[l], b->ref_count[l]);
      return;
    }
    for (int s = 0; s < cap && s < b->count[l] + POISON_BAND; s++) {
      size_t at = (size_t)l * cap + s;
      const uint8_t *x = b->x + at * c->token_bytes, *xs = b->xs ? b->xs + at * c->scale_bytes : NULL;
      if (s >= b->count[l]) { /* never written: still poison */
        if (!all_bytes(x, c->token_bytes, POISON_X) || (xs && !all_bytes(xs, c->scale_bytes, POISON_X))) {
          mc_rr_fail(me, 0, "round %llu rank %d: expert %d slot %d past count %d was written",
                     (unsigned long long)round, rank, l, s, b->count[l]);
          return;
        }
        continue;
      }
      const mc_input_t *in = &b->ins[b->src_g[at]];
      int t = b->src_t[at];
      if (memcmp(x, in->tokens + (size_t)t * c->token_bytes, c->token_bytes) != 0 ||
          (xs && memcmp(xs, in->scales + (size_t)t * c->scale_bytes, c->scale_bytes) != 0)) {
        mc_rr_fail(me, 0,
                   "round %llu rank %d: expert %d slot %d should hold token %d of group %d (payload/scale differ)",
                   (unsigned long long)round, rank, l, s, t, b->src_g[at]);
        return;
      }
    }
  }
}

/* Rows t0 .. t0 + n - 1 of a group's input, as an input of their own: the
 * reference combines them alone, into CHECK_ROWS rows at a time. */
static mc_input_t input_rows(const mc_case_t *c, const mc_input_t *in, int t0, int n) {
  mc_input_t part = *in;
  part.m = part.bound_m = n;
  part.tokens = in->tokens + (size_t)t0 * c->token_bytes;
  part.indices = in->indices + (size_t)t0 * c->topk;
  if (in->weights) part.weights = in->weights + (size_t)t0 * c->topk;
  return part;
}

void mc_rr_check_combine(const mc_case_t *c, bufs_t *b, int rank, uint64_t round, mc_run_rank_t *me) {
  const mc_input_t *in = &b->ins[rank / c->group_size];
  size_t H = (size_t)c->hidden, out_row = H * mc_dtype_size(c->out_dtype);
  double tol = mc_ref_tolerance(c);
  for (int t0 = 0; t0 < in->bound_m && !me->failed; t0 += CHECK_ROWS) {
    const int n = in->bound_m - t0 < CHECK_ROWS ? in->bound_m - t0 : CHECK_ROWS;
    const mc_input_t part = input_rows(c, in, t0, n);
    mc_ref_combine(c, &part, b->ref_out);
    mc_ref_combine_ideal(c, &part, b->ideal, b->absum);
    for (int t = t0; t < t0 + n && !me->failed; t++) {
      const size_t r = (size_t)(t - t0); /* the row in the block */
      const uint8_t *got = b->out + t * out_row, *want = b->ref_out + r * out_row;
      for (size_t h = 0; h < H; h++) {
        float g = mc_load_elem(got, (int64_t)h, c->out_dtype), w = mc_load_elem(want, (int64_t)h, c->out_dtype);
        if (memcmp(got + h * mc_dtype_size(c->out_dtype), want + h * mc_dtype_size(c->out_dtype),
                   mc_dtype_size(c->out_dtype)) != 0) {
          mc_rr_fail(me, 0, "round %llu rank %d: out[%d][%zu]=%.9g, reference %.9g (bits differ)",
                     (unsigned long long)round, rank, t, h, g, w);
          return;
        }
        /* relative to sum |w y|, plus fp16's subnormal spacing twice (the wire
         * and the output may both round there) */
        double diff = fabs((double)g - b->ideal[r * H + h]), scale = b->absum[r * H + h];
        double err = scale > 0 ? diff / scale : diff;
        if (err > me->max_err && scale > 1e-3) me->max_err = err;
        if (diff > tol * scale + 0x1p-23) {
          mc_rr_fail(me, 0, "round %llu rank %d: out[%d][%zu]=%.9g is %.3g (relative) from the ideal %.9g, over %.3g",
                     (unsigned long long)round, rank, t, h, g, err, b->ideal[r * H + h], tol);
          return;
        }
      }
    }
  }
  for (int t = in->bound_m; t < c->max_tokens && !me->failed; t++)
    if (!all_bytes(b->out + t * out_row, out_row, POISON_OUT))
      mc_rr_fail(me, 0, "round %llu rank %d: out row %d past bound_m=%d was written", (unsigned long long)round, rank,
                 t, in->bound_m);
}

/* A call that must fail with `want` and a message containing `needle`. */
static int expect_fail(mc_run_rank_t *me, mc_a2a_t *a2a, int rank, uint64_t round, const char *what, mc_result_t got,
                       mc_result_t want, const char *needle) {
  if (got == want && strstr(mc_a2a_last_error(a2a), needle)) return 0;
  mc_rr_fail(me, got, "round %llu rank %d: bad call '%s' returned %s (%s), wanted %s mentioning '%s'",
             (unsigned long long)round, rank, what, mc_result_string(got), mc_a2a_last_error(a2a),
             mc_result_string(want), needle);
  return 1;
}

/* Bad calls before a round: each must be refused and change nothing, which
 * the round that follows proves (any stray byte or count breaks its check).
 * Expert ids are checked on the host by the cpu transport (the call fails)
 * and on the device by GPU transports (the round is refused: the next call
 * reports it, and the next step is a new dispatch-send). */
int mc_rr_inject_bad_calls(const mc_case_t *c, mc_a2a_t *a2a, const mc_input_t *in, const call_in_t *ci, bufs_t *b,
                           dbufs_t *d, int rank, uint64_t round, mc_run_rank_t *me) {
  const int K = c->topk;
  int bad = 0;
  (void)b;
  /* The bad calls carry the tokens with every byte inverted: a record that
   * leaked out of a refused call would differ from the good round's and
   * fail its check, instead of hiding among identical bytes. */
  size_t tb = (size_t)(in->m > 0 ? in->m : 1) * mc_ref_in_row_bytes(c);
  unsigned char *inv = malloc(tb);
  void *inv_buf = d->gpu ? mc_dev_alloc(1, tb) : inv;
  /* the id buffers, allocated below; everything is freed at the end */
  int32_t *idx = NULL;
  int64_t *wide = NULL;
  void *bad_idx = NULL, *bad_bound = NULL;
  if (!inv || !inv_buf) {
    bad = 1;
    goto done;
  }
  for (size_t i = 0; i < (size_t)in->m * mc_ref_in_row_bytes(c); i++)
    inv[i] = (unsigned char)~in->raw[i];
  if (d->gpu) mc_dev_put(1, inv_buf, inv, tb);
  const void *bad_tokens = in->m > 0 ? inv_buf : ci->tokens;
#define D(tok, sc, idx, m, bnd, flags)                                                                                 \
  mc_dispatch(a2a, (tok) == ci->tokens ? bad_tokens : (tok), sc, idx, ci->weights, m, bnd, d->x, d->xs,                \
              (int32_t *)d->count, flags, mc_dev_stream())
  bad |= expect_fail(me, a2a, rank, round, "combine first", mc_combine(a2a, d->y, d->out, MC_SEND_RECV, mc_dev_stream()),
                     MC_ERR_INVALID_USAGE, "next step is the dispatch send");
  bad |= expect_fail(me, a2a, rank, round, "recv before send",
                     D(ci->tokens, ci->scales, ci->indices, in->m, ci->bound, MC_RECV), MC_ERR_INVALID_USAGE,
                     "dispatch recv");
  bad |= expect_fail(me, a2a, rank, round, "flags 0", D(ci->tokens, ci->scales, ci->indices, in->m, ci->bound, 0),
                     MC_ERR_INVALID_ARG, "flags=0x0");
  bad |= expect_fail(me, a2a, rank, round, "m too large",
                     D(ci->tokens, ci->scales, ci->indices, c->max_tokens + 1, ci->bound, MC_SEND), MC_ERR_INVALID_ARG,
                     "m=");
  if (in->m > 0) {
    bad |= expect_fail(me, a2a, rank, round, "misaligned tokens",
                       D((const char *)ci->tokens + 8, ci->scales, ci->indices, in->m, ci->bound, MC_SEND),
                       MC_ERR_INVALID_ARG, "aligned");
    bad |= expect_fail(me, a2a, rank, round, "NULL indices", D(ci->tokens, ci->scales, NULL, in->m, ci->bound, MC_SEND),
                       MC_ERR_INVALID_ARG, "indices is NULL");
    if (c->scale_bytes && !c->quant)
      bad |=
          expect_fail(me, a2a, rank, round, "NULL scales", D(ci->tokens, NULL, ci->indices, in->m, ci->bound, MC_SEND),
                      MC_ERR_INVALID_ARG, "scales is NULL");
    if (c->quant) /* the send half makes the scales */
      bad |= expect_fail(me, a2a, rank, round, "scales while quantising",
                         D(ci->tokens, ci->indices, ci->indices, in->m, ci->bound, MC_SEND), MC_ERR_INVALID_ARG,
                         "pass NULL");
  }
  /* values read where the data lives: host (cpu) or device (GPU); ids at
   * the width the handle takes (idx is edited, wide its int64 copy) */
  int32_t over = in->m + 1;
  size_t n = (size_t)in->m * K, w = d->ids64 ? 8 : 4;
  idx = malloc((n ? n : 1) * sizeof *idx);
  wide = d->ids64 ? malloc((n ? n : 1) * sizeof *wide) : NULL;
  void *host_idx = d->ids64 ? (void *)wide : (void *)idx;
  bad_idx = d->gpu ? mc_dev_alloc(1, (n ? n : 1) * w) : host_idx;
  bad_bound = d->gpu ? mc_dev_alloc(1, 4) : &over;
  if (!idx || (d->ids64 && !wide) || !bad_idx || !bad_bound) {
    bad = 1;
    goto done;
  }
  if (d->gpu) mc_dev_put(1, bad_bound, &over, 4);
  typedef struct {
    const char *what, *needle;
    const void *indices;
    const int32_t *bound;
  } bad_case_t;
  bad_case_t cases[5];
  char past[64];
  int nc = 0;
  const size_t last = in->bound_m > 0 ? (size_t)(in->bound_m - 1) * K : 0;
  if (in->m > 0) cases[nc++] = (bad_case_t){"bound_m > m", "bound_m", ci->indices, bad_bound};
  if (in->bound_m > 0) {
    /* a bad expert id in the last valid row: earlier rows are fine, so a
     * transport that sent as it checked would already have sent them */
    memcpy(idx, in->indices, n * sizeof *idx);
    cases[nc++] = (bad_case_t){"expert out of range", "is not an expert id", bad_idx, ci->bound};
    if (K >= 2) cases[nc++] = (bad_case_t){"duplicate expert", "twice", bad_idx, ci->bound};
    /* int64: a valid id plus 2^32, which narrowing would take for the
     * valid one; the refusal must quote it whole */
    snprintf(past, sizeof past, "=%lld is not an expert id",
             (long long)in->indices[last + K - 1] + ((long long)1 << 32));
    if (d->ids64) cases[nc++] = (bad_case_t){"int64 id past 2^32", past, bad_idx, ci->bound};
  }
  for (int i = 0; i < nc && !bad; i++) {
    if (strcmp(cases[i].what, "expert out of range") == 0) idx[last + K - 1] = c->num_experts;
    if (strcmp(cases[i].what, "duplicate expert") == 0) /* the last id repeats the row's first */
      idx[last + K - 1] = idx[last];
    if (strcmp(cases[i].what, "int64 id past 2^32") == 0) idx[last + K - 1] = in->indices[last + K - 1];
    if (cases[i].indices == bad_idx) { /* the edited ids, at the handle's width, where the library reads them */
      for (size_t j = 0; d->ids64 && j < n; j++) wide[j] = idx[j];
      if (strcmp(cases[i].what, "int64 id past 2^32") == 0) wide[last + K - 1] += (int64_t)1 << 32;
      if (d->gpu) mc_dev_put(1, bad_idx, host_idx, n * w);
    }
    /* on a GPU every other refusal comes from a whole call: its receiving
     * kernel, already running, must learn of it and let the round go */
    const int flags = d->gpu && (round + (uint64_t)i) % 2 ? MC_SEND_RECV : MC_SEND;
    mc_result_t rc = D(ci->tokens, ci->scales, cases[i].indices, in->m, cases[i].bound, flags);
    if (d->gpu && rc == MC_SUCCESS) { /* refused on the device: learnt after a sync */
      mc_dev_sync(1);
      rc = mc_a2a_check(a2a);
    }
    bad |= expect_fail(me, a2a, rank, round, cases[i].what, rc, MC_ERR_INVALID_ARG, cases[i].needle);
  }
done:
  if (d->gpu) mc_dev_free(1, bad_idx), mc_dev_free(1, bad_bound), mc_dev_free(1, inv_buf);
  free(idx);
  free(wide);
  free(inv);
#undef D
  return bad;
}
