/* mc_ref_graph.c - the CUDA-graph mode of the harness. */
#include <string.h>

#include "mc_dtype.h"
#include "moecomm_bench.h"
#include "mc_ref_dev.h"
#include "mc_ref_rank.h"

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
  size_t ybytes =
      (size_t)mc_ref_local_experts(g->c) * mc_ref_capacity(g->c) * g->c->hidden * mc_dtype_size(g->c->in_dtype);
  g->rc = mc_dispatch(g->a2a, d->tokens, d->scales, d->indices, g->c->no_weights ? NULL : d->weights, g->m, d->bound,
                      d->x, d->xs, d->count, MC_SEND_RECV, stream);
  if (g->rc != MC_SUCCESS) return 1;
  if (mc_dev_copy_async(d->y, d->x, ybytes, stream)) return 1;
  g->rc = mc_combine(g->a2a, d->y, d->out, MC_SEND_RECV, stream);
  return g->rc != MC_SUCCESS;
}

void mc_rr_run_graph_rounds(const mc_case_t *c, const mc_run_opts_t *o, int rank, mc_a2a_t *a2a, bufs_t *b, dbufs_t *d,
                            mc_run_rank_t *me) {
  const int groups = mc_ref_num_groups(c);
  const size_t obytes = (size_t)c->max_tokens * c->hidden * mc_dtype_size(c->out_dtype);
  graph_ctx_t g = {a2a, c, d, c->bound_fixed ? c->max_tokens : mc_ref_tokens(c), MC_SUCCESS};
  void *exec = NULL, *stream = NULL;
  if (mc_dev_graph_capture(graph_body, &g, &exec, &stream) != 0) {
    mc_rr_fail(me, g.rc, "rank %d: capturing the layer failed: %s", rank, mc_a2a_last_error(a2a));
    return;
  }
  for (int i = 0; i < o->rounds && !me->failed; i++) {
    uint64_t round = (uint64_t)i + 1;
    for (int gi = 0; gi < groups; gi++) {
      mc_ref_input_free(&b->ins[gi]);
      mc_ref_input(c, round, gi, &b->ins[gi]);
      mc_ref_input_payload(c, &b->ins[gi]);
    }
    mc_input_t *in = &b->ins[rank / c->group_size];
    call_in_t ci;
    mc_rr_upload_inputs(c, in, d, &ci);
    if (o->graph_refused) {
      /* refused on the device; its record waits for the host's next look,
       * after the good replay below */
      const int32_t past = g.m + 1;
      if (mc_dev_put(1, d->bound, &past, 4) != 0 || mc_dev_graph_launch(exec, stream) != 0) {
        mc_rr_fail(me, 0, "round %llu rank %d: the refused replay failed to launch", (unsigned long long)round, rank);
        break;
      }
    }
    mc_dev_put(1, d->bound, &in->bound_m, 4); /* captured with a bound pointer: always valid */
    mc_rr_poison_outputs(c, b, d, rank);
    mc_dev_sync(1);
    if (mc_dev_graph_launch(exec, stream) != 0) {
      mc_rr_fail(me, 0, "round %llu rank %d: graph replay failed", (unsigned long long)round, rank);
      break;
    }
    mc_result_t crc = mc_a2a_check(a2a);
    if (o->graph_refused) {
      if (crc != MC_ERR_INVALID_ARG || !strstr(mc_a2a_last_error(a2a), "*bound_m=")) {
        mc_rr_fail(me, crc, "round %llu rank %d: the refused replay's report expected, got %d: %s",
                   (unsigned long long)round, rank, (int)crc, mc_a2a_last_error(a2a));
        break;
      }
      crc = mc_a2a_check(a2a); /* reported once */
    }
    if (crc != MC_SUCCESS) {
      mc_rr_fail(me, crc, "round %llu rank %d: %s", (unsigned long long)round, rank, mc_a2a_last_error(a2a));
      break;
    }
    mc_rr_get_dispatch_outputs(c, b, d);
    mc_dev_get(1, b->out, d->out, obytes);
    mc_rr_check_dispatch(c, b, rank, round, me);
    mc_rr_check_combine(c, b, rank, round, me);
  }
  mc_dev_graph_free(exec, stream);
}

/* ---- the timed graph mode ---- */
typedef struct timed_ctx {
  mc_a2a_t *a2a;
  dbufs_t *d;
  const call_in_t *ci;
  int m;
  int whole;
  int floor;
  mc_result_t rc;
} timed_ctx_t;

static int timed_body(void *stream, void *arg) {
  timed_ctx_t *g = arg;
  const call_in_t *ci = g->ci;
  dbufs_t *d = g->d;
  if ((g->rc = mc_a2a_barrier(g->a2a, stream)) != MC_SUCCESS) return 1;
  /* whole: marks 0, 3, 4, 7 only (no event between a send and its recv) */
#define HALF(k, call)                                                                                                  \
  mc_dev_mark_on(stream, k);                                                                                          \
  if ((g->rc = (call)) != MC_SUCCESS) return 1;                                                                       \
  mc_dev_mark_on(stream, g->whole ? k + 3 : k + 1);
#define DISPATCH(flags)                                                                                                \
  (g->floor ? mc_a2a_bench_floor(g->a2a, MC_BENCH_DISPATCH, g->m, flags, stream)                                      \
            : mc_dispatch(g->a2a, ci->tokens, ci->scales, ci->indices, ci->weights, g->m, ci->bound, d->x, d->xs,      \
                          d->count, flags, stream))
#define COMBINE(flags)                                                                                                 \
  (g->floor ? mc_a2a_bench_floor(g->a2a, MC_BENCH_COMBINE, g->m, flags, stream)                                       \
            : mc_combine(g->a2a, d->y, d->out, flags, stream))
  if (g->whole) { /* a phase in one call (MC_SEND_RECV), as an engine makes it and the eager rounds do */
    HALF(0, DISPATCH(MC_SEND_RECV))
    HALF(4, COMBINE(MC_SEND_RECV))
  } else {
    HALF(0, DISPATCH(MC_SEND))
    HALF(2, DISPATCH(MC_RECV))
    HALF(4, COMBINE(MC_SEND))
    HALF(6, COMBINE(MC_RECV))
  }
#undef HALF
#undef DISPATCH
#undef COMBINE
  return 0;
}

void mc_rr_time_graph(const mc_run_opts_t *o, int rank, mc_a2a_t *a2a, dbufs_t *d, const call_in_t *ci, int m,
                      const mc_oob_t *oob, int floor, double *samples, int nsamples, mc_run_rank_t *me) {
  timed_ctx_t g = {a2a, d, ci, m, o->whole, floor, MC_SUCCESS};
  void *exec = NULL, *stream = NULL;
  if (mc_dev_graph_capture(timed_body, &g, &exec, &stream) != 0) {
    mc_rr_fail(me, g.rc, "rank %d: capturing the timed round failed: %s", rank, mc_a2a_last_error(a2a));
    return;
  }
  const int warm = o->warmup > 0 ? o->warmup : 1;
  for (int i = 0; i < warm + nsamples && !me->failed; i++) {
    mc_dev_sync(1);
    if (mc_rr_oob_barrier(oob) != 0 || mc_dev_graph_launch(exec, stream) != 0 || mc_dev_sync(1) != 0) {
      mc_rr_fail(me, 0, "rank %d: timed graph replay %d failed", rank, i);
      break;
    }
    mc_result_t crc = mc_a2a_check(a2a);
    if (crc != MC_SUCCESS) {
      mc_rr_fail(me, crc, "rank %d: timed graph replay %d: %s", rank, i, mc_a2a_last_error(a2a));
      break;
    }
    if (i < warm) continue;
    const int r = i - warm;
    mc_rr_store_samples(samples, nsamples, r, 1, o->whole);
  }
  mc_dev_graph_free(exec, stream);
}
