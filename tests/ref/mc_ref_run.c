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

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "mc_dtype.h"
#include "mc_ref_dev.h"
#include "mc_testing.h"
#include "mc_ref_rank.h"

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

void mc_rr_store_samples(double *samples, int nsamples, int r, int gpu, int whole) {
  samples[MC_PH_DISPATCH_SEND * nsamples + r] = mc_dev_elapsed_us(gpu, 0, whole ? 3 : 1);
  samples[MC_PH_DISPATCH_RECV * nsamples + r] = whole ? 0 : mc_dev_elapsed_us(gpu, 2, 3);
  samples[MC_PH_COMBINE_SEND * nsamples + r] = mc_dev_elapsed_us(gpu, 4, whole ? 7 : 5);
  samples[MC_PH_COMBINE_RECV * nsamples + r] = whole ? 0 : mc_dev_elapsed_us(gpu, 6, 7);
}

int mc_rr_oob_barrier(const mc_oob_t *oob) {
  int one = 1, all[4096];
  int *buf = oob->world_size <= 4096 ? all : malloc(sizeof(int) * (size_t)oob->world_size);
  int rc = oob->allgather(&one, buf, sizeof one, oob->user);
  if (buf != all) free(buf);
  return rc;
}

#define API(call)                                                                                                      \
  do {                                                                                                                 \
    mc_result_t rc_ = (call);                                                                                          \
    if (rc_ != MC_SUCCESS) {                                                                                           \
      mc_rr_fail(me, rc_, "round %llu rank %d: %s -> %s: %s", (unsigned long long)round, rank, #call,                  \
                 mc_result_string(rc_),                                                                                \
                 a2a    ? mc_a2a_last_error(a2a)                                                                       \
                 : comm ? mc_comm_last_error(comm)                                                                     \
                        : mc_last_error());                                                                            \
      goto done;                                                                                                       \
    }                                                                                                                  \
  } while (0)

static void rank_main(run_ctx_t *ctx) {
  const mc_case_t *c = ctx->c;
  const mc_run_opts_t *o = ctx->o;
  const int rank = ctx->rank, G = c->group_size, groups = mc_ref_num_groups(c);
  const int nh = o->handles > 0 ? o->handles : 1;
  const int gpu = o->transport == MC_TRANSPORT_NVSHMEM || o->transport == MC_TRANSPORT_P2P;
  mc_run_rank_t *me = &ctx->res->ranks[rank];
  me->transport = -1; /* until a communicator exists */
  double *samples = ctx->res->samples_us + (size_t)rank * MC_PH_COUNT * (size_t)ctx->res->rounds;
  mc_comm_t *comm = NULL;
  mc_a2a_t *hs[64] = {0}, *a2a = NULL;
  bufs_t b;
  dbufs_t d = {0};
  uint64_t round = 0;
  double t_start = now_us();
  int device = gpu ? mc_dev_select(rank) : -1;
  if (gpu && device < 0) {
    mc_rr_fail(me, 0, "rank %d: no CUDA device for a GPU transport", rank);
    memset(&b, 0, sizeof b);
    goto done;
  }
  if (mc_rr_alloc_bufs(c, &b) != 0 || mc_rr_alloc_dbufs(c, gpu, &b, &d) != 0) {
    mc_rr_fail(me, 0, "rank %d: out of memory for the test buffers", rank);
    goto done;
  }
  mc_comm_config_t cc = MC_COMM_CONFIG_INITIALIZER;
  cc.group_size = G;
  cc.transport = o->auto_transport ? MC_TRANSPORT_AUTO : o->transport;
  cc.timeout_ms = o->timeout_ms;
  cc.device = device;
  API(mc_comm_create(&ctx->oob, &cc, &comm));
  me->transport = (int)mc_comm_transport(comm);
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
    mc_rr_run_graph_rounds(c, o, rank, a2a, &b, &d, me);
    goto done;
  }
  /* timed graph mode: the eager rounds are the warm-up (and the checks),
   * the timed rounds are replays of a captured round */
  const int timed_graph = gpu && o->graph_timed;
  /* With check_first > 0 the checked rounds are the first check_first and
   * one more after the timed ones (on a GPU a check means downloads and
   * host work: only the first rounds and the final state are looked at).
   * A caller that times keeps check_first <= warmup, so that no sample
   * comes from a checked round (mc-bench does). */
  const int tail = o->check && o->check_first > 0 && !timed_graph;
  const int total = o->warmup + (timed_graph ? 0 : o->rounds) + tail;
  call_in_t last_in = {0};
  int last_m = 0;
  for (int i = 0; i < total; i++) {
    round = (uint64_t)i + 1;
    a2a = hs[i % nh];
    const int check = o->check && (o->check_first <= 0 || i < o->check_first || i == total - 1);
    if (rank == o->stall_rank && i == o->stall_round) {
      if (o->processes) raise(SIGKILL); /* a rank that dies */
      goto done;                        /* a rank that goes silent */
    }
    /* Inputs: every group's, since the reference needs them all. */
    for (int g = 0; g < groups; g++) {
      if (!check && g != rank / G) continue;
      mc_ref_input_free(&b.ins[g]);
      if (mc_ref_input(c, round, g, &b.ins[g]) != 0) {
        mc_rr_fail(me, 0, "rank %d: out of host memory for inputs", rank);
        goto done;
      }
    }
    const mc_input_t *in = &b.ins[rank / G];
    call_in_t ci;
    if (mc_rr_upload_inputs(c, in, &d, &ci) != 0) {
      mc_rr_fail(me, 0, "round %llu rank %d: uploading inputs failed", (unsigned long long)round, rank);
      goto done;
    }
    last_in = ci, last_m = in->m;
    if (check) {
      mc_dev_fill(gpu, d.x, POISON_X, xbytes);
      if (d.xs) mc_dev_fill(gpu, d.xs, POISON_X, sbytes);
      if (!gpu) mc_dev_fill(0, d.y, POISON_OUT, ybytes);
      mc_dev_fill(gpu, d.out, POISON_OUT, obytes);
      mc_dev_fill(gpu, d.count, 0xF9, (size_t)L * 4); /* -7ish */
    }
    mc_a2a_stats_t before = {.size = sizeof before};
    if (check) mc_a2a_get_stats(a2a, &before);
    if (o->inject_bad && mc_rr_inject_bad_calls(c, a2a, in, &ci, &b, &d, rank, round, me)) goto done;
    mc_dev_sync(gpu);
    if (o->barrier && mc_rr_oob_barrier(&ctx->oob) != 0) {
      mc_rr_fail(me, 0, "rank %d: barrier failed", rank);
      goto done;
    }
    /* on a GPU the host barrier leaves launch skew between processes: line
     * the ranks' streams up on the device as well */
    if (o->barrier && gpu) API(mc_a2a_barrier(a2a, mc_dev_stream()));
#define DISPATCH(flags)                                                                                                \
  mc_dispatch(a2a, ci.tokens, ci.scales, ci.indices, ci.weights, in->m, ci.bound, d.x, d.xs, d.count, flags, mc_dev_stream())
    /* each phase as one call (MC_SEND_RECV) or as two halves: whole 1 every
     * round, 2 every other round (tests: both paths, and the switch
     * between them), 0 never; split always calls the halves */
    const int one_call = !o->split && (o->whole == 1 || (o->whole == 2 && i % 2 == 1));
    mc_dev_mark(gpu, 0);
    if (one_call) {
      API(DISPATCH(MC_SEND_RECV));
    } else {
      API(DISPATCH(MC_SEND));
      mc_dev_mark(gpu, 1);
      if (o->split) mc_dev_busy(gpu, d.scratch, 16u << 20);
      mc_dev_mark(gpu, 2);
      API(DISPATCH(MC_RECV));
    }
    mc_dev_mark(gpu, 3);
#undef DISPATCH
    if (check || !gpu) {
      mc_dev_sync(gpu);
      API(mc_a2a_check(a2a)); /* a GPU transport's failure shows after the sync */
      if (gpu && (mc_dev_get(1, b.count, d.count, (size_t)L * 4) || mc_dev_get(1, b.x, d.x, xbytes) ||
                  (d.xs && mc_dev_get(1, b.xs, d.xs, sbytes)))) {
        mc_rr_fail(me, 0, "round %llu rank %d: downloading dispatch outputs failed", (unsigned long long)round, rank);
        goto done;
      }
      if (check) mc_rr_check_dispatch(c, &b, rank, round, me);
      if (mc_rr_experts_roundtrip(c, &b, &d, rank)) {
        mc_rr_fail(me, 0, "round %llu rank %d: uploading expert outputs failed", (unsigned long long)round, rank);
        goto done;
      }
    }
    mc_dev_mark(gpu, 4);
    if (one_call) {
      API(mc_combine(a2a, d.y, d.out, MC_SEND_RECV, mc_dev_stream()));
    } else {
      API(mc_combine(a2a, d.y, d.out, MC_SEND, mc_dev_stream()));
      mc_dev_mark(gpu, 5);
      if (o->split) mc_dev_busy(gpu, d.scratch, 16u << 20);
      mc_dev_mark(gpu, 6);
      API(mc_combine(a2a, d.y, d.out, MC_RECV, mc_dev_stream()));
    }
    mc_dev_mark(gpu, 7);
    mc_dev_sync(gpu);
    if (i >= o->warmup && i < o->warmup + o->rounds) {
      int r = i - o->warmup;
      mc_rr_store_samples(samples, ctx->res->rounds, r, gpu, gpu && one_call);
    }
    API(mc_a2a_check(a2a));
    if (check) {
      if (gpu && mc_dev_get(1, b.out, d.out, obytes)) {
        mc_rr_fail(me, 0, "round %llu rank %d: downloading combine output failed", (unsigned long long)round, rank);
        goto done;
      }
      mc_rr_check_combine(c, &b, rank, round, me);
      mc_a2a_stats_t after = {.size = sizeof after};
      mc_a2a_get_stats(a2a, &after);
      uint64_t want = mc_ref_records_sent(c, in, rank),
               got = after.dispatch_records_sent - before.dispatch_records_sent;
      me->expected_records += want;
      if (got != want)
        mc_rr_fail(me, 0, "round %llu rank %d: sent %llu dispatch records, one per (token, rank) is %llu",
                   (unsigned long long)round, rank, (unsigned long long)got, (unsigned long long)want);
    }
  }
  if (timed_graph && !me->failed && a2a)
    mc_rr_time_graph(o, rank, a2a, &d, &last_in, last_m, &ctx->oob, samples, ctx->res->rounds, me);
  for (int i = 0; o->floor && gpu && !me->failed && i < o->warmup + o->rounds; i++) {
    mc_dev_sync(gpu); /* as before a round: host barrier, then the ranks' streams lined up */
    if (mc_rr_oob_barrier(&ctx->oob) != 0) {
      mc_rr_fail(me, 0, "rank %d: barrier failed", rank);
      goto done;
    }
    API(mc_a2a_barrier(a2a, mc_dev_stream()));
    mc_dev_mark(gpu, 0);
    API(mc_a2a_barrier(a2a, mc_dev_stream()));
    mc_dev_mark(gpu, 1);
    mc_dev_sync(gpu);
    if (i >= o->warmup) ctx->res->floor_us[(size_t)rank * ctx->res->rounds + (size_t)(i - o->warmup)] =
        (float)mc_dev_elapsed_us(gpu, 0, 1);
  }
  if (o->dense_bytes && !me->failed) {
    mc_dev_sync(gpu);
    mc_result_t drc = mc_comm_bench_dense_alltoall(comm, o->dense_bytes, o->warmup, o->rounds,
                                                   ctx->res->dense_us + (size_t)rank * ctx->res->rounds);
    if (rank == 0) ctx->res->dense_rc = drc;
    if (rank == 0 && drc != MC_SUCCESS) fprintf(stderr, "dense baseline: %s\n", mc_comm_last_error(comm));
    if (o->extra_baseline) {
      int xrc = o->extra_baseline(&ctx->oob, o->dense_bytes, o->warmup, o->rounds,
                                  ctx->res->extra_us + (size_t)rank * ctx->res->rounds);
      if (rank == 0) ctx->res->extra_rc = xrc;
    }
  }
done:
  if (me->api_rc == MC_ERR_TIMEOUT && a2a) me->rc_after_timeout = mc_combine(a2a, d.y, d.out, MC_SEND_RECV, mc_dev_stream());
  if (hs[0]) {
    me->stats.size = sizeof me->stats;
    mc_a2a_get_stats(hs[0], &me->stats);
  }
  /* Threads share one address space: nobody unmaps a window while a peer
   * may still write into it. (Processes map separately: no wait needed.)
   * NVSHMEM's free is collective: every live rank must reach it. */
  if ((!o->processes || (gpu && !me->failed)) && comm) mc_rr_oob_barrier(&ctx->oob);
  if (!(gpu && me->failed))
    for (int h = 0; h < nh && h < 64; h++)
      mc_a2a_destroy(hs[h]);
  if (comm && !(gpu && me->failed) && mc_comm_destroy(comm) != MC_SUCCESS)
    mc_rr_fail(me, 0, "rank %d: mc_comm_destroy failed", rank);
  mc_rr_free_dbufs(&d, &b);
  mc_rr_free_bufs(&b, groups);
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
  for (int r = 0; r < started; r++)
    pthread_join(th[r], NULL);
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
      if (o->split_hosts) setenv("MC_HOST_ID", r % 2 ? "mc-test-host-b" : "mc-test-host-a", 1);
      if (mc_oob_socket_create(&id, r, W, oob_ms, &sock) != MC_SUCCESS ||
          mc_oob_socket_get(sock, &ctx.oob) != MC_SUCCESS) {
        mc_rr_fail(&res->ranks[r], 0, "rank %d: socket bootstrap failed: %s", r, mc_last_error());
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
      mc_rr_fail(&res->ranks[r], 0, "rank %d: process %s", r, pids[r] <= 0 ? "could not start" : "was killed");
  }
  free(pids);
  return 0;
}

int mc_run(const mc_case_t *c, const mc_run_opts_t *o, mc_run_result_t *res) {
  /* the GPU paths one machine's defaults never take, for the test suite:
   * MC_TEST_STAGED=1 (puts from staging, a network's path), MC_TEST_SYS_SCOPE=1 */
  const char *staged = getenv("MC_TEST_STAGED"), *sys = getenv("MC_TEST_SYS_SCOPE");
  mc_testing_force(MC_TESTING_STAGED, staged && strcmp(staged, "1") == 0);
  mc_testing_force(MC_TESTING_SYS_SCOPE, sys && strcmp(sys, "1") == 0);
  memset(res, 0, sizeof *res);
  res->world_size = c->world_size;
  res->rounds = o->rounds > 0 ? o->rounds : 1;
  size_t rank_bytes = sizeof(mc_run_rank_t) * (size_t)c->world_size;
  size_t sample_bytes = sizeof(double) * (size_t)c->world_size * MC_PH_COUNT * (size_t)res->rounds +
                        3 * sizeof(float) * (size_t)c->world_size * (size_t)res->rounds;
  /* Shared anonymous memory, so forked ranks can report back. */
  void *p = mmap(NULL, rank_bytes + sample_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return -1;
  res->ranks = p;
  res->samples_us = (double *)((char *)p + rank_bytes);
  res->dense_us = (float *)(res->samples_us + (size_t)c->world_size * MC_PH_COUNT * (size_t)res->rounds);
  res->extra_us = res->dense_us + (size_t)c->world_size * (size_t)res->rounds;
  res->floor_us = res->extra_us + (size_t)c->world_size * (size_t)res->rounds;
  int rc = o->processes ? run_processes(c, o, res) : run_threads(c, o, res);
  if (rc != 0) return -1;
  int failed = 0;
  for (int r = 0; r < c->world_size; r++)
    failed += res->ranks[r].failed;
  return failed;
}

void mc_run_free(mc_run_result_t *res) {
  if (!res->ranks) return;
  size_t bytes = sizeof(mc_run_rank_t) * (size_t)res->world_size +
                 sizeof(double) * (size_t)res->world_size * MC_PH_COUNT * (size_t)res->rounds +
                 3 * sizeof(float) * (size_t)res->world_size * (size_t)res->rounds;
  munmap(res->ranks, bytes);
  res->ranks = NULL;
}

const char *mc_run_first_failure(const mc_run_result_t *res) {
  for (int r = 0; r < res->world_size; r++)
    if (res->ranks[r].failed) return res->ranks[r].msg;
  return "";
}
