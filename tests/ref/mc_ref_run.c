/* mc_ref_run.c - drive the library with one thread (or process) per rank and
 * check every round against the reference model.
 *
 * Each round every rank: draws all groups' inputs (a pure function of case,
 * round and group), poisons its outputs, dispatches, checks counts, payloads,
 * scales and that unfilled slots keep their poison, runs the fake experts,
 * combines, checks every valid row bit for bit against the reference and
 * within the stated tolerance of the ideal sum, checks that rows past bound_m
 * keep their poison, and checks the library's own count of records sent
 * against one per (token, destination rank). */
#include "mc_ref_run.h"

#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "mc_dtype.h"
#include "mc_ref_dev.h"

#define POISON_X 0xA5
#define POISON_OUT 0xFF /* all-ones: a NaN in every dtype */

typedef struct run_ctx {
  const mc_case_t *c;
  const mc_run_opts_t *o;
  mc_run_result_t *res;
  int rank;
  mc_oob_t oob;
} run_ctx_t;

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static void fail(mc_run_rank_t *me, int api_rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void fail(mc_run_rank_t *me, int api_rc, const char *fmt, ...) {
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

typedef struct bufs {
  uint8_t *x, *xs, *y, *out;
  int32_t *count, *ref_count, *src_g, *src_t;
  uint8_t *ref_out;
  double *ideal, *absum;
  mc_input_t *ins;
} bufs_t;

static void free_bufs(bufs_t *b, int groups) {
  free(b->x), free(b->xs), free(b->y), free(b->out), free(b->count), free(b->ref_count);
  free(b->src_g), free(b->src_t), free(b->ref_out), free(b->ideal), free(b->absum);
  for (int g = 0; b->ins && g < groups; g++) mc_ref_input_free(&b->ins[g]);
  free(b->ins);
}

static void *xmalloc(size_t n) { return malloc(n ? n : 1); }

static int alloc_bufs(const mc_case_t *c, bufs_t *b) {
  size_t L = (size_t)mc_ref_local_experts(c), cap = (size_t)mc_ref_capacity(c), M = (size_t)c->max_tokens;
  size_t in_sz = mc_dtype_size(c->in_dtype), out_sz = mc_dtype_size(c->out_dtype), H = (size_t)c->hidden;
  memset(b, 0, sizeof *b);
  /* aligned_alloc gives the 16-byte alignment the API asks for */
  b->x = aligned_alloc(64, mc_align_up(L * cap * c->token_bytes, 64) + 64);
  b->xs = c->scale_bytes ? aligned_alloc(64, mc_align_up(L * cap * c->scale_bytes, 64) + 64) : NULL;
  b->y = aligned_alloc(64, mc_align_up(L * cap * H * in_sz, 64) + 64);
  b->out = aligned_alloc(64, mc_align_up(M * H * out_sz, 64) + 64);
  b->count = xmalloc(L * sizeof(int32_t));
  b->ref_count = xmalloc(L * sizeof(int32_t));
  b->src_g = xmalloc(L * cap * sizeof(int32_t));
  b->src_t = xmalloc(L * cap * sizeof(int32_t));
  b->ref_out = xmalloc(M * H * out_sz);
  b->ideal = xmalloc(M * H * sizeof(double));
  b->absum = xmalloc(M * H * sizeof(double));
  b->ins = calloc((size_t)mc_ref_num_groups(c), sizeof(mc_input_t));
  return b->x && (b->xs || !c->scale_bytes) && b->y && b->out && b->count && b->ref_count && b->src_g &&
                 b->src_t && b->ref_out && b->ideal && b->absum && b->ins
             ? 0
             : -1;
}

static void check_dispatch(const mc_case_t *c, const bufs_t *b, int rank, uint64_t round, mc_run_rank_t *me) {
  int L = mc_ref_local_experts(c), cap = mc_ref_capacity(c);
  mc_ref_dispatch(c, b->ins, rank, b->ref_count, b->src_g, b->src_t);
  for (int l = 0; l < L && !me->failed; l++) {
    if (b->count[l] != b->ref_count[l]) {
      fail(me, 0, "round %llu rank %d: expert_count[%d]=%d, reference %d", (unsigned long long)round, rank, l,
           b->count[l], b->ref_count[l]);
      return;
    }
    for (int s = 0; s < cap; s++) {
      size_t at = (size_t)l * cap + s;
      const uint8_t *x = b->x + at * c->token_bytes, *xs = b->xs ? b->xs + at * c->scale_bytes : NULL;
      if (s >= b->count[l]) { /* never written: still poison */
        if (!all_bytes(x, c->token_bytes, POISON_X) || (xs && !all_bytes(xs, c->scale_bytes, POISON_X)))
          fail(me, 0, "round %llu rank %d: expert %d slot %d past count %d was written", (unsigned long long)round,
               rank, l, s, b->count[l]);
        if (s > b->count[l] + 2) break; /* a few past the end is enough; the rest costs time */
        continue;
      }
      const mc_input_t *in = &b->ins[b->src_g[at]];
      int t = b->src_t[at];
      if (memcmp(x, in->tokens + (size_t)t * c->token_bytes, c->token_bytes) != 0 ||
          (xs && memcmp(xs, in->scales + (size_t)t * c->scale_bytes, c->scale_bytes) != 0)) {
        fail(me, 0, "round %llu rank %d: expert %d slot %d should hold token %d of group %d (payload/scale differ)",
             (unsigned long long)round, rank, l, s, t, b->src_g[at]);
        return;
      }
    }
  }
}

static void check_combine(const mc_case_t *c, bufs_t *b, int rank, uint64_t round, mc_run_rank_t *me) {
  const mc_input_t *in = &b->ins[rank / c->group_size];
  size_t H = (size_t)c->hidden, out_row = H * mc_dtype_size(c->out_dtype);
  mc_ref_combine(c, in, b->ref_out);
  mc_ref_combine_ideal(c, in, b->ideal, b->absum);
  double tol = mc_ref_tolerance(c);
  for (int t = 0; t < in->bound_m && !me->failed; t++) {
    const uint8_t *got = b->out + t * out_row, *want = b->ref_out + t * out_row;
    for (size_t h = 0; h < H; h++) {
      float g = mc_load_elem(got, (int64_t)h, c->out_dtype), w = mc_load_elem(want, (int64_t)h, c->out_dtype);
      if (memcmp(got + h * mc_dtype_size(c->out_dtype), want + h * mc_dtype_size(c->out_dtype),
                 mc_dtype_size(c->out_dtype)) != 0) {
        fail(me, 0, "round %llu rank %d: out[%d][%zu]=%.9g, reference %.9g (bits differ)", (unsigned long long)round,
             rank, t, h, g, w);
        return;
      }
      /* relative to sum |w y|, plus fp16's subnormal spacing twice (the wire
       * and the output may both round there) */
      double diff = fabs((double)g - b->ideal[(size_t)t * H + h]), scale = b->absum[(size_t)t * H + h];
      double err = scale > 0 ? diff / scale : diff;
      if (err > me->max_err && scale > 1e-3) me->max_err = err;
      if (diff > tol * scale + 0x1p-23) {
        fail(me, 0, "round %llu rank %d: out[%d][%zu]=%.9g is %.3g (relative) from the ideal %.9g, over %.3g",
             (unsigned long long)round, rank, t, h, g, err, b->ideal[(size_t)t * H + h], tol);
        return;
      }
    }
  }
  for (int t = in->bound_m; t < c->max_tokens && !me->failed; t++)
    if (!all_bytes(b->out + t * out_row, out_row, POISON_OUT))
      fail(me, 0, "round %llu rank %d: out row %d past bound_m=%d was written", (unsigned long long)round, rank, t,
           in->bound_m);
}

/* The fake experts: y = f(expert, x) on every filled slot. */
static void run_experts(const mc_case_t *c, bufs_t *b, int rank) {
  int L = mc_ref_local_experts(c), cap = mc_ref_capacity(c);
  size_t yrow = (size_t)c->hidden * mc_dtype_size(c->in_dtype);
  for (int l = 0; l < L; l++)
    for (int s = 0; s < b->count[l] && s < cap; s++)
      mc_ref_expert(c, rank * L + l, b->x + ((size_t)l * cap + s) * c->token_bytes, b->y + ((size_t)l * cap + s) * yrow);
}

/* A call that must fail with `want` and a message containing `needle`. */
static int expect_fail(mc_run_rank_t *me, mc_a2a_t *a2a, int rank, uint64_t round, const char *what, mc_result_t got,
                       mc_result_t want, const char *needle) {
  if (got == want && strstr(mc_a2a_last_error(a2a), needle)) return 0;
  fail(me, got, "round %llu rank %d: bad call '%s' returned %s (%s), wanted %s mentioning '%s'",
       (unsigned long long)round, rank, what, mc_result_string(got), mc_a2a_last_error(a2a), mc_result_string(want),
       needle);
  return 1;
}

/* Bad calls before a round: each must be refused and change nothing, which
 * the round that follows proves (any stray byte or count breaks its check).
 * Expert ids are checked on the host by the cpu transport (the call fails)
 * and on the device by GPU transports (the round is refused: the next call
 * reports it, and the next step is a new dispatch-send). */
typedef struct dbufs dbufs_t;
typedef struct call_in call_in_t;
static int inject_bad_calls(const mc_case_t *c, mc_a2a_t *a2a, const mc_input_t *in, const call_in_t *ci,
                            bufs_t *b, dbufs_t *d, int rank, uint64_t round, mc_run_rank_t *me);

static int oob_barrier(const mc_oob_t *oob) {
  int one = 1, all[4096];
  int *buf = oob->world_size <= 4096 ? all : malloc(sizeof(int) * (size_t)oob->world_size);
  int rc = oob->allgather(&one, buf, sizeof one, oob->user);
  if (buf != all) free(buf);
  return rc;
}

#define API(call)                                                                                    \
  do {                                                                                               \
    mc_result_t rc_ = (call);                                                                        \
    if (rc_ != MC_SUCCESS) {                                                                         \
      fail(me, rc_, "round %llu rank %d: %s -> %s: %s", (unsigned long long)round, rank, #call,       \
           mc_result_string(rc_), a2a ? mc_a2a_last_error(a2a) : comm ? mc_comm_last_error(comm) : mc_last_error()); \
      goto done;                                                                                     \
    }                                                                                                \
  } while (0)

/* A rank's buffers as the library sees them: host memory for the cpu
 * transport (then they are the check buffers themselves), device memory
 * for a GPU transport. */
struct dbufs {
  int gpu;
  void *tokens, *scales, *indices, *weights, *bound, *x, *xs, *count, *y, *out, *scratch;
};

static void free_dbufs(dbufs_t *d, const bufs_t *b) {
  if (!d->gpu) return; /* aliases of the host buffers */
  void *all[] = {d->tokens, d->scales, d->indices, d->weights, d->bound, d->x, d->xs, d->count, d->y, d->out, d->scratch};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) mc_dev_free(1, all[i]);
  (void)b;
}

static int alloc_dbufs(const mc_case_t *c, int gpu, bufs_t *b, dbufs_t *d) {
  size_t L = (size_t)mc_ref_local_experts(c), cap = (size_t)mc_ref_capacity(c), M = (size_t)c->max_tokens;
  size_t H = (size_t)c->hidden, K = (size_t)c->topk;
  memset(d, 0, sizeof *d);
  d->gpu = gpu;
  if (!gpu) { /* the library reads and writes the host buffers directly */
    d->x = b->x, d->xs = b->xs, d->count = b->count, d->y = b->y, d->out = b->out;
    return 0;
  }
  d->tokens = mc_dev_alloc(1, M * c->token_bytes);
  d->scales = c->scale_bytes ? mc_dev_alloc(1, M * c->scale_bytes) : NULL;
  d->indices = mc_dev_alloc(1, M * K * 4);
  d->weights = mc_dev_alloc(1, M * K * 4);
  d->bound = mc_dev_alloc(1, 4);
  d->x = mc_dev_alloc(1, L * cap * c->token_bytes);
  d->xs = c->scale_bytes ? mc_dev_alloc(1, L * cap * c->scale_bytes) : NULL;
  d->count = mc_dev_alloc(1, L * 4);
  d->y = mc_dev_alloc(1, L * cap * H * mc_dtype_size(c->in_dtype));
  d->out = mc_dev_alloc(1, M * H * mc_dtype_size(c->out_dtype));
  d->scratch = mc_dev_alloc(1, 16u << 20);
  return d->tokens && (d->scales || !c->scale_bytes) && d->indices && d->weights && d->bound && d->x &&
                 (d->xs || !c->scale_bytes) && d->count && d->y && d->out && d->scratch
             ? 0
             : -1;
}

/* Put this round's inputs where the library reads them; returns the
 * pointers to pass (host inputs themselves on the cpu transport). */
struct call_in {
  const void *tokens, *scales;
  const int32_t *indices;
  const float *weights;
  const int32_t *bound;
};

static int upload_inputs(const mc_case_t *c, const mc_input_t *in, dbufs_t *d, call_in_t *ci) {
  if (!d->gpu) {
    *ci = (call_in_t){in->tokens, in->scales, in->indices, in->weights, in->has_bound ? &in->bound_m : NULL};
    return 0;
  }
  size_t m = (size_t)in->m, K = (size_t)c->topk;
  int bad = mc_dev_put(1, d->tokens, in->tokens, m * c->token_bytes);
  if (c->scale_bytes) bad |= mc_dev_put(1, d->scales, in->scales, m * c->scale_bytes);
  bad |= mc_dev_put(1, d->indices, in->indices, m * K * 4);
  if (in->weights) bad |= mc_dev_put(1, d->weights, in->weights, m * K * 4);
  if (in->has_bound) bad |= mc_dev_put(1, d->bound, &in->bound_m, 4);
  *ci = (call_in_t){d->tokens, d->scales, d->indices, in->weights ? d->weights : NULL, in->has_bound ? d->bound : NULL};
  return bad;
}

/* Fake experts on the host over the downloaded slots; upload the rows. */
static int experts_roundtrip(const mc_case_t *c, bufs_t *b, dbufs_t *d, int rank) {
  int L = mc_ref_local_experts(c), cap = mc_ref_capacity(c);
  size_t yrow = (size_t)c->hidden * mc_dtype_size(c->in_dtype);
  run_experts(c, b, rank);
  int bad = 0;
  for (int l = 0; l < L && d->gpu; l++)
    if (b->count[l] > 0)
      bad |= mc_dev_put(1, (char *)d->y + (size_t)l * cap * yrow, b->y + (size_t)l * cap * yrow,
                        (size_t)b->count[l] * yrow);
  return bad;
}

static int inject_bad_calls(const mc_case_t *c, mc_a2a_t *a2a, const mc_input_t *in, const call_in_t *ci,
                            bufs_t *b, dbufs_t *d, int rank, uint64_t round, mc_run_rank_t *me) {
  const int K = c->topk;
  int bad = 0;
  (void)b;
  /* The bad calls carry the tokens with every byte inverted: a record that
   * leaked out of a refused call would differ from the good round's and
   * fail its check, instead of hiding among identical bytes. */
  size_t tb = (size_t)(in->m > 0 ? in->m : 1) * c->token_bytes;
  unsigned char *inv = malloc(tb);
  void *inv_buf = d->gpu ? mc_dev_alloc(1, tb) : inv;
  if (!inv || !inv_buf) return 1;
  for (size_t i = 0; i < (size_t)in->m * c->token_bytes; i++) inv[i] = (unsigned char)~in->tokens[i];
  if (d->gpu) mc_dev_put(1, inv_buf, inv, tb);
  const void *bad_tokens = in->m > 0 ? inv_buf : ci->tokens;
#define D(tok, sc, idx, m, bnd, flags)                                                               \
  mc_dispatch(a2a, (tok) == ci->tokens ? bad_tokens : (tok), sc, idx, ci->weights, m, bnd, d->x, d->xs, \
              (int32_t *)d->count, flags, NULL)
  bad |= expect_fail(me, a2a, rank, round, "combine first", mc_combine(a2a, d->y, d->out, MC_SEND_RECV, NULL),
                     MC_ERR_INVALID_USAGE, "next step is the dispatch send");
  bad |= expect_fail(me, a2a, rank, round, "recv before send", D(ci->tokens, ci->scales, ci->indices, in->m, ci->bound, MC_RECV),
                     MC_ERR_INVALID_USAGE, "dispatch recv");
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
    if (c->scale_bytes)
      bad |= expect_fail(me, a2a, rank, round, "NULL scales", D(ci->tokens, NULL, ci->indices, in->m, ci->bound, MC_SEND),
                         MC_ERR_INVALID_ARG, "scales is NULL");
  }
  /* values read where the data lives: host (cpu) or device (GPU) */
  int32_t over = in->m + 1;
  size_t n = (size_t)in->m * K;
  int32_t *idx = malloc((n ? n : 1) * sizeof *idx);
  void *bad_idx = d->gpu ? mc_dev_alloc(1, (n ? n : 1) * 4) : idx, *bad_bound = d->gpu ? mc_dev_alloc(1, 4) : &over;
  if (!idx || !bad_idx || !bad_bound) return 1;
  if (d->gpu) mc_dev_put(1, bad_bound, &over, 4);
  typedef struct {
    const char *what, *needle;
    const int32_t *indices, *bound;
  } bad_case_t;
  bad_case_t cases[4];
  int nc = 0;
  if (in->m > 0) cases[nc++] = (bad_case_t){"bound_m > m", "bound_m", ci->indices, bad_bound};
  if (in->bound_m > 0) {
    /* a bad expert id in the last valid row: earlier rows are fine, so a
     * transport that sent as it checked would already have sent them */
    memcpy(idx, in->indices, n * sizeof *idx);
    size_t last = (size_t)(in->bound_m - 1) * K;
    idx[last + K - 1] = c->num_experts;
    cases[nc++] = (bad_case_t){"expert out of range", "is not an expert id", bad_idx, ci->bound};
    if (K >= 2) cases[nc++] = (bad_case_t){"duplicate expert", "twice", bad_idx, ci->bound};
  }
  for (int i = 0; i < nc && !bad; i++) {
    if (strcmp(cases[i].what, "duplicate expert") == 0) /* the last id repeats the row's first */
      idx[(size_t)(in->bound_m - 1) * K + K - 1] = idx[(size_t)(in->bound_m - 1) * K];
    if (d->gpu && cases[i].indices == bad_idx) mc_dev_put(1, bad_idx, idx, n * 4);
    mc_result_t rc = D(ci->tokens, ci->scales, cases[i].indices, in->m, cases[i].bound, MC_SEND);
    if (d->gpu && rc == MC_SUCCESS) { /* refused on the device: learnt after a sync */
      mc_dev_sync(1);
      rc = mc_a2a_check(a2a);
    }
    bad |= expect_fail(me, a2a, rank, round, cases[i].what, rc, MC_ERR_INVALID_ARG, cases[i].needle);
  }
  if (d->gpu) mc_dev_free(1, bad_idx), mc_dev_free(1, bad_bound), mc_dev_free(1, inv_buf);
  free(idx);
  free(inv);
#undef D
  return bad;
}

/* One layer captured as a CUDA graph: dispatch, the identity experts as a
 * device copy of expert_x into expert_y, combine. Inputs change between
 * replays in place (same buffers), bound_m too: what a captured engine does. */
typedef struct graph_ctx {
  mc_a2a_t *a2a;
  const mc_case_t *c;
  dbufs_t *d;
  int m;
  mc_result_t rc;
} graph_ctx_t;

static int graph_body(void *stream, void *arg) {
  graph_ctx_t *g = arg;
  dbufs_t *d = g->d;
  size_t ybytes = (size_t)mc_ref_local_experts(g->c) * mc_ref_capacity(g->c) * g->c->hidden * mc_dtype_size(g->c->in_dtype);
  g->rc = mc_dispatch(g->a2a, d->tokens, d->scales, d->indices, g->c->no_weights ? NULL : d->weights, g->m, d->bound,
                      d->x, d->xs, d->count, MC_SEND_RECV, stream);
  if (g->rc != MC_SUCCESS) return 1;
  if (mc_dev_copy_async(d->y, d->x, ybytes, stream)) return 1;
  g->rc = mc_combine(g->a2a, d->y, d->out, MC_SEND_RECV, stream);
  return g->rc != MC_SUCCESS;
}

static void run_graph_rounds(const mc_case_t *c, const mc_run_opts_t *o, int rank, mc_a2a_t *a2a, bufs_t *b,
                             dbufs_t *d, mc_run_rank_t *me) {
  const int L = mc_ref_local_experts(c), cap = mc_ref_capacity(c), groups = mc_ref_num_groups(c);
  const size_t xbytes = (size_t)L * cap * c->token_bytes, sbytes = (size_t)L * cap * c->scale_bytes;
  const size_t obytes = (size_t)c->max_tokens * c->hidden * mc_dtype_size(c->out_dtype);
  graph_ctx_t g = {a2a, c, d, c->max_tokens, MC_SUCCESS};
  void *exec = NULL, *stream = NULL;
  if (mc_dev_graph_capture(graph_body, &g, &exec, &stream) != 0) {
    fail(me, g.rc, "rank %d: capturing the layer failed: %s", rank, mc_a2a_last_error(a2a));
    return;
  }
  for (int i = 0; i < o->rounds && !me->failed; i++) {
    uint64_t round = (uint64_t)i + 1;
    for (int gi = 0; gi < groups; gi++) {
      mc_ref_input_free(&b->ins[gi]);
      mc_ref_input(c, round, gi, &b->ins[gi]);
    }
    mc_input_t *in = &b->ins[rank / c->group_size];
    call_in_t ci;
    upload_inputs(c, in, d, &ci);
    mc_dev_put(1, d->bound, &in->bound_m, 4); /* captured with a bound pointer: always valid */
    mc_dev_fill(1, d->x, POISON_X, xbytes);
    if (d->xs) mc_dev_fill(1, d->xs, POISON_X, sbytes);
    mc_dev_fill(1, d->out, POISON_OUT, obytes);
    mc_dev_sync(1);
    if (mc_dev_graph_launch(exec, stream) != 0) {
      fail(me, 0, "round %llu rank %d: graph replay failed", (unsigned long long)round, rank);
      break;
    }
    mc_result_t crc = mc_a2a_check(a2a);
    if (crc != MC_SUCCESS) {
      fail(me, crc, "round %llu rank %d: %s", (unsigned long long)round, rank, mc_a2a_last_error(a2a));
      break;
    }
    mc_dev_get(1, b->count, d->count, (size_t)L * 4);
    mc_dev_get(1, b->x, d->x, xbytes);
    if (d->xs) mc_dev_get(1, b->xs, d->xs, sbytes);
    mc_dev_get(1, b->out, d->out, obytes);
    check_dispatch(c, b, rank, round, me);
    check_combine(c, b, rank, round, me);
  }
  mc_dev_graph_free(exec, stream);
}

static void rank_main(run_ctx_t *ctx) {
  const mc_case_t *c = ctx->c;
  const mc_run_opts_t *o = ctx->o;
  const int rank = ctx->rank, G = c->group_size, groups = mc_ref_num_groups(c);
  const int nh = o->handles > 0 ? o->handles : 1;
  const int gpu = o->transport == MC_TRANSPORT_NVSHMEM || o->transport == MC_TRANSPORT_P2P;
  mc_run_rank_t *me = &ctx->res->ranks[rank];
  double *samples = ctx->res->samples_us + (size_t)rank * MC_PH_COUNT * (size_t)ctx->res->rounds;
  mc_comm_t *comm = NULL;
  mc_a2a_t *hs[64] = {0}, *a2a = NULL;
  bufs_t b;
  dbufs_t d = {0};
  uint64_t round = 0;
  double t_start = now_us();
  int device = gpu ? mc_dev_select(rank) : -1;
  if (gpu && device < 0) {
    fail(me, 0, "rank %d: no CUDA device for a GPU transport", rank);
    memset(&b, 0, sizeof b);
    goto done;
  }
  if (alloc_bufs(c, &b) != 0 || alloc_dbufs(c, gpu, &b, &d) != 0) {
    fail(me, 0, "rank %d: out of memory for the test buffers", rank);
    goto done;
  }
  mc_comm_config_t cc = MC_COMM_CONFIG_INITIALIZER;
  cc.group_size = G;
  cc.transport = o->transport;
  cc.timeout_ms = o->timeout_ms;
  cc.device = device;
  API(mc_comm_create(&ctx->oob, &cc, &comm));
  mc_a2a_config_t ac = MC_A2A_CONFIG_INITIALIZER;
  ac.max_tokens = c->max_tokens;
  ac.num_experts = c->num_experts;
  ac.experts_per_token = c->topk;
  ac.token_bytes = c->token_bytes;
  ac.scale_bytes = c->scale_bytes;
  ac.hidden = c->hidden;
  ac.combine_in_dtype = c->in_dtype;
  ac.combine_out_dtype = c->out_dtype;
  for (int h = 0; h < nh && h < 64; h++) {
    API(mc_a2a_create(comm, &ac, &hs[h]));
  }
  const int L = mc_ref_local_experts(c), cap = mc_ref_capacity(c);
  const size_t xbytes = (size_t)L * cap * c->token_bytes, sbytes = (size_t)L * cap * c->scale_bytes;
  const size_t ybytes = (size_t)L * cap * c->hidden * mc_dtype_size(c->in_dtype);
  const size_t obytes = (size_t)c->max_tokens * c->hidden * mc_dtype_size(c->out_dtype);
  if (gpu) mc_dev_fill(1, d.y, POISON_OUT, ybytes); /* rows of unfilled slots stay poison */
  if (gpu && o->graph) {
    a2a = hs[0];
    run_graph_rounds(c, o, rank, a2a, &b, &d, me);
    goto done;
  }
  const int total = o->warmup + o->rounds;
  for (int i = 0; i < total; i++) {
    round = (uint64_t)i + 1;
    a2a = hs[i % nh];
    /* on a GPU, checking means downloads: check_first limits it to the first rounds and the last */
    const int check = o->check && (!gpu || o->check_first <= 0 || i < o->check_first || i == total - 1);
    if (rank == o->stall_rank && i == o->stall_round) {
      if (o->processes) raise(SIGKILL); /* a rank that dies */
      goto done;                        /* a rank that goes silent */
    }
    /* Inputs: every group's, since the reference needs them all. */
    for (int g = 0; g < groups; g++) {
      if (!check && g != rank / G) continue;
      mc_ref_input_free(&b.ins[g]);
      if (mc_ref_input(c, round, g, &b.ins[g]) != 0) {
        fail(me, 0, "rank %d: out of host memory for inputs", rank);
        goto done;
      }
    }
    const mc_input_t *in = &b.ins[rank / G];
    call_in_t ci;
    if (upload_inputs(c, in, &d, &ci) != 0) {
      fail(me, 0, "round %llu rank %d: uploading inputs failed", (unsigned long long)round, rank);
      goto done;
    }
    if (check) {
      mc_dev_fill(gpu, d.x, POISON_X, xbytes);
      if (d.xs) mc_dev_fill(gpu, d.xs, POISON_X, sbytes);
      if (!gpu) mc_dev_fill(0, d.y, POISON_OUT, ybytes);
      mc_dev_fill(gpu, d.out, POISON_OUT, obytes);
      mc_dev_fill(gpu, d.count, 0xF9, (size_t)L * 4); /* -7ish */
    }
    mc_a2a_stats_t before = {.size = sizeof before};
    if (check) mc_a2a_get_stats(a2a, &before);
    if (o->inject_bad && inject_bad_calls(c, a2a, in, &ci, &b, &d, rank, round, me)) goto done;
    mc_dev_sync(gpu);
    if (o->barrier && oob_barrier(&ctx->oob) != 0) {
      fail(me, 0, "rank %d: barrier failed", rank);
      goto done;
    }
#define DISPATCH(flags) \
  mc_dispatch(a2a, ci.tokens, ci.scales, ci.indices, ci.weights, in->m, ci.bound, d.x, d.xs, d.count, flags, NULL)
    mc_dev_mark(gpu, 0);
    API(DISPATCH(MC_SEND));
    mc_dev_mark(gpu, 1);
    if (o->split) mc_dev_busy(gpu, d.scratch, 16u << 20);
    mc_dev_mark(gpu, 2);
    API(DISPATCH(MC_RECV));
    mc_dev_mark(gpu, 3);
#undef DISPATCH
    if (check || !gpu) {
      mc_dev_sync(gpu);
      API(mc_a2a_check(a2a)); /* a GPU transport's failure shows after the sync */
      if (gpu && (mc_dev_get(1, b.count, d.count, (size_t)L * 4) || mc_dev_get(1, b.x, d.x, xbytes) ||
                  (d.xs && mc_dev_get(1, b.xs, d.xs, sbytes)))) {
        fail(me, 0, "round %llu rank %d: downloading dispatch outputs failed", (unsigned long long)round, rank);
        goto done;
      }
      if (check) check_dispatch(c, &b, rank, round, me);
      if (experts_roundtrip(c, &b, &d, rank)) {
        fail(me, 0, "round %llu rank %d: uploading expert outputs failed", (unsigned long long)round, rank);
        goto done;
      }
    }
    mc_dev_mark(gpu, 4);
    API(mc_combine(a2a, d.y, d.out, MC_SEND, NULL));
    mc_dev_mark(gpu, 5);
    if (o->split) mc_dev_busy(gpu, d.scratch, 16u << 20);
    mc_dev_mark(gpu, 6);
    API(mc_combine(a2a, d.y, d.out, MC_RECV, NULL));
    mc_dev_mark(gpu, 7);
    mc_dev_sync(gpu);
    if (i >= o->warmup) {
      int r = i - o->warmup;
      samples[MC_PH_DISPATCH_SEND * ctx->res->rounds + r] = mc_dev_elapsed_us(gpu, 0, 1);
      samples[MC_PH_DISPATCH_RECV * ctx->res->rounds + r] = mc_dev_elapsed_us(gpu, 2, 3);
      samples[MC_PH_COMBINE_SEND * ctx->res->rounds + r] = mc_dev_elapsed_us(gpu, 4, 5);
      samples[MC_PH_COMBINE_RECV * ctx->res->rounds + r] = mc_dev_elapsed_us(gpu, 6, 7);
    }
    API(mc_a2a_check(a2a));
    if (check) {
      if (gpu && mc_dev_get(1, b.out, d.out, obytes)) {
        fail(me, 0, "round %llu rank %d: downloading combine output failed", (unsigned long long)round, rank);
        goto done;
      }
      check_combine(c, &b, rank, round, me);
      mc_a2a_stats_t after = {.size = sizeof after};
      mc_a2a_get_stats(a2a, &after);
      uint64_t want = mc_ref_records_sent(c, in, rank), got = after.dispatch_records_sent - before.dispatch_records_sent;
      me->expected_records += want;
      if (got != want)
        fail(me, 0, "round %llu rank %d: sent %llu dispatch records, one per (token, rank) is %llu",
             (unsigned long long)round, rank, (unsigned long long)got, (unsigned long long)want);
    }
  }
  if (o->dense_bytes && !me->failed) {
    mc_dev_sync(gpu);
    mc_result_t drc = mc_comm_bench_dense_alltoall(comm, o->dense_bytes, o->warmup, o->rounds,
                                                   ctx->res->dense_us + (size_t)rank * ctx->res->rounds);
    if (rank == 0) ctx->res->dense_rc = drc;
  }
done:
  if (me->api_rc == MC_ERR_TIMEOUT && a2a) me->rc_after_timeout = mc_combine(a2a, d.y, d.out, MC_SEND_RECV, NULL);
  if (hs[0]) {
    me->stats.size = sizeof me->stats;
    mc_a2a_get_stats(hs[0], &me->stats);
  }
  /* Threads share one address space: nobody unmaps a window while a peer
   * may still write into it. (Processes map separately: no wait needed.)
   * NVSHMEM's free is collective: every live rank must reach it. */
  if ((!o->processes || (gpu && !me->failed)) && comm) oob_barrier(&ctx->oob);
  if (!(gpu && me->failed))
    for (int h = 0; h < nh && h < 64; h++) mc_a2a_destroy(hs[h]);
  if (comm && !(gpu && me->failed) && mc_comm_destroy(comm) != MC_SUCCESS)
    fail(me, 0, "rank %d: mc_comm_destroy failed", rank);
  free_dbufs(&d, &b);
  free_bufs(&b, groups);
  me->wall_s = (now_us() - t_start) / 1e6;
}

static void *thread_main(void *arg) {
  rank_main(arg);
  return NULL;
}

static int run_threads(const mc_case_t *c, const mc_run_opts_t *o, mc_run_result_t *res) {
  int W = c->world_size;
  mc_oob_threads_t *group = NULL;
  /* the bootstrap outlives the slowest failure path: a few comm timeouts */
  int oob_ms = o->timeout_ms * 6 > 60000 ? o->timeout_ms * 6 : 60000;
  if (mc_oob_threads_create(W, oob_ms, &group) != MC_SUCCESS) return -1;
  run_ctx_t *ctx = calloc((size_t)W, sizeof *ctx);
  pthread_t *th = calloc((size_t)W, sizeof *th);
  int started = 0;
  for (int r = 0; ctx && th && r < W; r++) {
    ctx[r] = (run_ctx_t){c, o, res, r, {0}};
    mc_oob_threads_get(group, r, &ctx[r].oob);
    if (pthread_create(&th[r], NULL, thread_main, &ctx[r]) != 0) break;
    started++;
  }
  for (int r = 0; r < started; r++) pthread_join(th[r], NULL);
  free(ctx);
  free(th);
  mc_oob_threads_destroy(group);
  return started == W ? 0 : -1;
}

static int run_processes(const mc_case_t *c, const mc_run_opts_t *o, mc_run_result_t *res) {
  int W = c->world_size;
  mc_unique_id_t id;
  if (mc_unique_id_create(&id) != MC_SUCCESS) {
    fprintf(stderr, "mc_unique_id_create: %s\n", mc_last_error());
    return -1;
  }
  pid_t *pids = calloc((size_t)W, sizeof *pids);
  if (!pids) return -1;
  fflush(NULL);
  for (int r = 0; r < W; r++) {
    pids[r] = fork();
    if (pids[r] == 0) {
      mc_oob_socket_t *sock = NULL;
      int oob_ms = o->timeout_ms * 6 > 60000 ? o->timeout_ms * 6 : 60000;
      run_ctx_t ctx = {c, o, res, r, {0}};
      if (mc_oob_socket_create(&id, r, W, oob_ms, &sock) != MC_SUCCESS || mc_oob_socket_get(sock, &ctx.oob) != MC_SUCCESS) {
        fail(&res->ranks[r], 0, "rank %d: socket bootstrap failed: %s", r, mc_last_error());
        _exit(1);
      }
      rank_main(&ctx);
      mc_oob_socket_destroy(sock);
      _exit(0);
    }
  }
  for (int r = 0; r < W; r++) {
    int st = 0;
    if (pids[r] > 0) waitpid(pids[r], &st, 0);
    if (pids[r] <= 0 || (WIFSIGNALED(st) && r != o->stall_rank))
      fail(&res->ranks[r], 0, "rank %d: process %s", r, pids[r] <= 0 ? "could not start" : "was killed");
  }
  free(pids);
  return 0;
}

int mc_run(const mc_case_t *c, const mc_run_opts_t *o, mc_run_result_t *res) {
  memset(res, 0, sizeof *res);
  res->world_size = c->world_size;
  res->rounds = o->rounds > 0 ? o->rounds : 1;
  size_t rank_bytes = sizeof(mc_run_rank_t) * (size_t)c->world_size;
  size_t sample_bytes = sizeof(double) * (size_t)c->world_size * MC_PH_COUNT * (size_t)res->rounds +
                        sizeof(float) * (size_t)c->world_size * (size_t)res->rounds;
  /* Shared anonymous memory, so forked ranks can report back. */
  void *p = mmap(NULL, rank_bytes + sample_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return -1;
  res->ranks = p;
  res->samples_us = (double *)((char *)p + rank_bytes);
  res->dense_us = (float *)(res->samples_us + (size_t)c->world_size * MC_PH_COUNT * (size_t)res->rounds);
  int rc = o->processes ? run_processes(c, o, res) : run_threads(c, o, res);
  if (rc != 0) return -1;
  int failed = 0;
  for (int r = 0; r < c->world_size; r++) failed += res->ranks[r].failed;
  return failed;
}

void mc_run_free(mc_run_result_t *res) {
  if (!res->ranks) return;
  size_t bytes = sizeof(mc_run_rank_t) * (size_t)res->world_size +
                 sizeof(double) * (size_t)res->world_size * MC_PH_COUNT * (size_t)res->rounds +
                 sizeof(float) * (size_t)res->world_size * (size_t)res->rounds;
  munmap(res->ranks, bytes);
  res->ranks = NULL;
}

const char *mc_run_first_failure(const mc_run_result_t *res) {
  for (int r = 0; r < res->world_size; r++)
    if (res->ranks[r].failed) return res->ranks[r].msg;
  return "";
}
