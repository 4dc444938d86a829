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

/* Something to do between a send and its recv, as an engine would. */
static _Thread_local volatile double sink;
static void other_work(void) {
  double a = 0;
  for (int i = 0; i < 20000; i++) a += (double)i * 1e-9;
  sink = a;
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
 * the round that follows proves (any stray byte or count breaks its check). */
static int inject_bad_calls(const mc_case_t *c, mc_a2a_t *a2a, const mc_input_t *in, bufs_t *b, int rank,
                            uint64_t round, mc_run_rank_t *me) {
  const int K = c->topk;
  const int32_t *bound = in->has_bound ? &in->bound_m : NULL;
  int bad = 0;
#define D(tok, sc, idx, m, bnd, flags)                                                               \
  mc_dispatch(a2a, tok, sc, idx, in->weights, m, bnd, b->x, b->xs, b->count, flags, NULL)
  bad |= expect_fail(me, a2a, rank, round, "combine first", mc_combine(a2a, b->y, b->out, MC_SEND_RECV, NULL),
                     MC_ERR_INVALID_USAGE, "next step is the dispatch send");
  bad |= expect_fail(me, a2a, rank, round, "recv before send", D(in->tokens, in->scales, in->indices, in->m, bound, MC_RECV),
                     MC_ERR_INVALID_USAGE, "dispatch recv");
  bad |= expect_fail(me, a2a, rank, round, "flags 0", D(in->tokens, in->scales, in->indices, in->m, bound, 0),
                     MC_ERR_INVALID_ARG, "flags=0x0");
  bad |= expect_fail(me, a2a, rank, round, "m too large",
                     D(in->tokens, in->scales, in->indices, c->max_tokens + 1, bound, MC_SEND), MC_ERR_INVALID_ARG,
                     "m=");
  if (in->m > 0) {
    int32_t over = in->m + 1;
    bad |= expect_fail(me, a2a, rank, round, "bound_m > m", D(in->tokens, in->scales, in->indices, in->m, &over, MC_SEND),
                       MC_ERR_INVALID_ARG, "bound_m");
    bad |= expect_fail(me, a2a, rank, round, "misaligned tokens",
                       D(in->tokens + 8, in->scales, in->indices, in->m, bound, MC_SEND), MC_ERR_INVALID_ARG, "aligned");
    bad |= expect_fail(me, a2a, rank, round, "NULL indices", D(in->tokens, in->scales, NULL, in->m, bound, MC_SEND),
                       MC_ERR_INVALID_ARG, "indices is NULL");
    if (c->scale_bytes)
      bad |= expect_fail(me, a2a, rank, round, "NULL scales", D(in->tokens, NULL, in->indices, in->m, bound, MC_SEND),
                         MC_ERR_INVALID_ARG, "scales is NULL");
  }
  if (in->bound_m > 0) {
    /* a bad expert id in the last valid row: earlier rows are fine, so a
     * transport that sent as it checked would already have sent them */
    size_t n = (size_t)in->m * K;
    int32_t *idx = malloc(n * sizeof *idx);
    if (!idx) return 1;
    memcpy(idx, in->indices, n * sizeof *idx);
    size_t last = (size_t)(in->bound_m - 1) * K;
    idx[last + K - 1] = c->num_experts;
    bad |= expect_fail(me, a2a, rank, round, "expert out of range", D(in->tokens, in->scales, idx, in->m, bound, MC_SEND),
                       MC_ERR_INVALID_ARG, "is not an expert id");
    idx[last + K - 1] = -1;
    bad |= expect_fail(me, a2a, rank, round, "negative expert", D(in->tokens, in->scales, idx, in->m, bound, MC_SEND),
                       MC_ERR_INVALID_ARG, "is not an expert id");
    if (K >= 2) {
      idx[last + K - 1] = idx[last];
      bad |= expect_fail(me, a2a, rank, round, "duplicate expert", D(in->tokens, in->scales, idx, in->m, bound, MC_SEND),
                         MC_ERR_INVALID_ARG, "twice");
    }
    free(idx);
  }
#undef D
  return bad;
}

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

static void rank_main(run_ctx_t *ctx) {
  const mc_case_t *c = ctx->c;
  const mc_run_opts_t *o = ctx->o;
  const int rank = ctx->rank, G = c->group_size, groups = mc_ref_num_groups(c);
  const int nh = o->handles > 0 ? o->handles : 1;
  mc_run_rank_t *me = &ctx->res->ranks[rank];
  double *samples = ctx->res->samples_us + (size_t)rank * MC_PH_COUNT * (size_t)ctx->res->rounds;
  mc_comm_t *comm = NULL;
  mc_a2a_t *hs[64] = {0}, *a2a = NULL;
  bufs_t b;
  uint64_t round = 0;
  double t_start = now_us();
  if (alloc_bufs(c, &b) != 0) {
    fail(me, 0, "rank %d: out of host memory for the test buffers", rank);
    goto done;
  }
  mc_comm_config_t cc = MC_COMM_CONFIG_INITIALIZER;
  cc.group_size = G;
  cc.transport = o->transport;
  cc.timeout_ms = o->timeout_ms;
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
  const int total = o->warmup + o->rounds;
  for (int i = 0; i < total; i++) {
    round = (uint64_t)i + 1;
    a2a = hs[i % nh];
    if (rank == o->stall_rank && i == o->stall_round) {
      if (o->processes) raise(SIGKILL); /* a rank that dies */
      goto done;                        /* a rank that goes silent */
    }
    /* Inputs: every group's, since the reference needs them all. */
    for (int g = 0; g < groups; g++) {
      if (!o->check && g != rank / G) continue;
      mc_ref_input_free(&b.ins[g]);
      if (mc_ref_input(c, round, g, &b.ins[g]) != 0) {
        fail(me, 0, "rank %d: out of host memory for inputs", rank);
        goto done;
      }
    }
    const mc_input_t *in = &b.ins[rank / G];
    memset(b.x, POISON_X, xbytes);
    if (b.xs) memset(b.xs, POISON_X, sbytes);
    memset(b.y, POISON_OUT, ybytes);
    memset(b.out, POISON_OUT, obytes);
    for (int l = 0; l < L; l++) b.count[l] = -7;
    mc_a2a_stats_t before = {.size = sizeof before};
    mc_a2a_get_stats(a2a, &before);
    if (o->barrier && oob_barrier(&ctx->oob) != 0) {
      fail(me, 0, "rank %d: barrier failed", rank);
      goto done;
    }
    if (o->inject_bad && inject_bad_calls(c, a2a, in, &b, rank, round, me)) goto done;
    const int32_t *bound = in->has_bound ? &in->bound_m : NULL;
    double t[5];
    t[0] = now_us();
    if (o->split) {
      API(mc_dispatch(a2a, in->tokens, in->scales, in->indices, in->weights, in->m, bound, b.x, b.xs, b.count,
                      MC_SEND, NULL));
      t[1] = now_us();
      other_work();
      double t1b = now_us();
      API(mc_dispatch(a2a, in->tokens, in->scales, in->indices, in->weights, in->m, bound, b.x, b.xs, b.count,
                      MC_RECV, NULL));
      t[2] = now_us() - (t1b - t[1]);
    } else {
      API(mc_dispatch(a2a, in->tokens, in->scales, in->indices, in->weights, in->m, bound, b.x, b.xs, b.count,
                      MC_SEND, NULL));
      t[1] = now_us();
      API(mc_dispatch(a2a, in->tokens, in->scales, in->indices, in->weights, in->m, bound, b.x, b.xs, b.count,
                      MC_RECV, NULL));
      t[2] = now_us();
    }
    if (o->check) check_dispatch(c, &b, rank, round, me);
    run_experts(c, &b, rank);
    double t3a = now_us();
    API(mc_combine(a2a, b.y, b.out, MC_SEND, NULL));
    t[3] = now_us();
    if (o->split) other_work();
    double t3b = now_us();
    API(mc_combine(a2a, b.y, b.out, MC_RECV, NULL));
    t[4] = now_us();
    if (i >= o->warmup) {
      int r = i - o->warmup;
      samples[MC_PH_DISPATCH_SEND * ctx->res->rounds + r] = t[1] - t[0];
      samples[MC_PH_DISPATCH_RECV * ctx->res->rounds + r] = t[2] - t[1];
      samples[MC_PH_COMBINE_SEND * ctx->res->rounds + r] = t[3] - t3a;
      samples[MC_PH_COMBINE_RECV * ctx->res->rounds + r] = t[4] - t3b;
    }
    if (o->check) {
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
done:
  if (me->api_rc == MC_ERR_TIMEOUT && a2a)
    me->rc_after_timeout = mc_combine(a2a, b.y, b.out, MC_SEND_RECV, NULL);
  if (hs[0]) {
    me->stats.size = sizeof me->stats;
    mc_a2a_get_stats(hs[0], &me->stats);
  }
  /* Threads share one address space: nobody unmaps a window while a peer
   * may still write into it. (Processes map separately: no wait needed.) */
  if (!o->processes && comm) oob_barrier(&ctx->oob);
  for (int h = 0; h < nh && h < 64; h++) mc_a2a_destroy(hs[h]);
  if (comm && mc_comm_destroy(comm) != MC_SUCCESS) fail(me, 0, "rank %d: mc_comm_destroy failed", rank);
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
  size_t sample_bytes = sizeof(double) * (size_t)c->world_size * MC_PH_COUNT * (size_t)res->rounds;
  /* Shared anonymous memory, so forked ranks can report back. */
  void *p = mmap(NULL, rank_bytes + sample_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return -1;
  res->ranks = p;
  res->samples_us = (double *)((char *)p + rank_bytes);
  int rc = o->processes ? run_processes(c, o, res) : run_threads(c, o, res);
  if (rc != 0) return -1;
  int failed = 0;
  for (int r = 0; r < c->world_size; r++) failed += res->ranks[r].failed;
  return failed;
}

void mc_run_free(mc_run_result_t *res) {
  if (!res->ranks) return;
  size_t bytes = sizeof(mc_run_rank_t) * (size_t)res->world_size +
                 sizeof(double) * (size_t)res->world_size * MC_PH_COUNT * (size_t)res->rounds;
  munmap(res->ranks, bytes);
  res->ranks = NULL;
}

const char *mc_run_first_failure(const mc_run_result_t *res) {
  for (int r = 0; r < res->world_size; r++)
    if (res->ranks[r].failed) return res->ranks[r].msg;
  return "";
}
