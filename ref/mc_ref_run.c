/* mc_ref_run.c - drive the library with one thread (or process) per rank and
 * check every round against the reference model.
 *
 * Each round every rank: draws all groups' inputs (a pure function of case,
 * round and group), poisons where its outputs land and a band past them,
 * dispatches, checks counts, payloads, scales and that the band keeps its
 * poison, runs the fake experts,
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

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

int mc_rr_oob_barrier(const mc_oob_t *oob) {
  int one = 1, all[4096];
  int *buf = oob->world_size <= 4096 ? all : malloc(sizeof(int) * (size_t)oob->world_size);
  int rc = oob->allgather(&one, buf, sizeof one, oob->user);
  if (buf != all) free(buf);
  return rc;
}

/* One rank's run: its handles, buffers and where it stands. */
/* Buffers, the communicator and the handles. 0, or -1 (recorded). */
static int rank_setup(rank_st_t *st) {
  const mc_case_t *c = st->c;
  const mc_run_opts_t *o = st->o;
  const int device = st->gpu ? mc_dev_select(st->rank) : -1;
  if (st->gpu && device < 0) {
    mc_rr_fail(st->me, 0, "rank %d: no CUDA device for a GPU transport", st->rank);
    return -1;
  }
  st->load = calloc(2 * (size_t)mc_ref_local_experts(c), sizeof *st->load);
  if (!st->load || mc_rr_alloc_bufs(c, &st->b) != 0 || mc_rr_alloc_dbufs(c, st->gpu, o->ids64, &st->b, &st->d) != 0) {
    mc_rr_fail(st->me, 0, "rank %d: out of memory for the test buffers", st->rank);
    return -1;
  }
  mc_comm_config_t cc = MC_COMM_CONFIG_INITIALIZER;
  cc.group_size = c->group_size;
  cc.transport = o->auto_transport ? MC_TRANSPORT_AUTO : o->transport;
  cc.timeout_ms = o->timeout_ms;
  cc.device = device;
  API(st, mc_comm_create(&st->ctx->oob, &cc, &st->comm));
  st->me->transport = (int)mc_comm_transport(st->comm);
  mc_a2a_config_t ac = MC_A2A_CONFIG_INITIALIZER;
  ac.max_tokens = c->max_tokens;
  ac.num_experts = c->num_experts;
  ac.experts_per_token = c->topk;
  ac.token_bytes = c->token_bytes;
  ac.scale_bytes = c->scale_bytes;
  ac.hidden = c->hidden;
  ac.combine_in_dtype = c->in_dtype;
  ac.combine_out_dtype = c->out_dtype;
  ac.index_dtype = o->ids64 ? MC_INDEX_INT64 : MC_INDEX_INT32;
  ac.dispatch_input = c->quant && !o->quant_apart ? MC_INPUT_BF16_TO_E4M3 : MC_INPUT_BYTES;
  ac.scale_format = c->quant == MC_REF_QUANT_UE8M0 ? MC_SCALE_UE8M0 : MC_SCALE_FP32;
  ac.recv_layout = (mc_recv_layout_t)c->layout;
  ac.expert_align = c->expert_align > 0 ? c->expert_align : 1;
  for (int h = 0; h < st->nh; h++) API(st, mc_a2a_create(st->comm, &ac, &st->hs[h]));
  st->obytes = (size_t)c->max_tokens * c->hidden * mc_dtype_size(c->out_dtype);
  return 0;
}

/* This round's inputs (every group's where the round is checked: the
 * reference needs them all), uploaded; outputs poisoned where checked. */
static int round_inputs(rank_st_t *st, int check, call_in_t *ci) {
  const mc_case_t *c = st->c;
  const int G = c->group_size;
  for (int g = 0; g < mc_ref_num_groups(c); g++) {
    if (!check && c->layout == MC_LAYOUT_BATCHED && g != st->rank / G) continue; /* packed: the verdict needs all */
    mc_ref_input_free(&st->b.ins[g]);
    if (mc_ref_input(c, st->round, g, &st->b.ins[g]) != 0) {
      mc_rr_fail(st->me, 0, "rank %d: out of host memory for inputs", st->rank);
      return -1;
    }
    if (check) mc_ref_input_payload(c, &st->b.ins[g]);
  }
  if (c->layout != MC_LAYOUT_BATCHED) mc_rr_packed_expect(c, &st->b, st->rank);
  mc_input_t *mine = &st->b.ins[st->rank / G];
  if (st->o->differ_round == (int)st->round && st->rank % G == G - 1 && G > 1 && mine->m > 0 && mine->weights)
    mine->weights[0] += 0.5f; /* this rank's copy only: its group's inputs now differ */
  if (mc_rr_upload_inputs(c, mine, &st->d, ci) != 0) {
    mc_rr_fail(st->me, 0, "round %llu rank %d: uploading inputs failed", (unsigned long long)st->round, st->rank);
    return -1;
  }
  if (check && mc_rr_poison_outputs(c, &st->b, &st->d, st->rank) != 0) {
    mc_rr_fail(st->me, 0, "round %llu rank %d: poisoning outputs failed", (unsigned long long)st->round, st->rank);
    return -1;
  }
  return 0;
}

/* Host barrier, then (GPU) the ranks' streams lined up on the device: the
 * host barrier leaves launch skew between processes. */
int mc_rr_round_barrier(rank_st_t *st) {
  if (mc_rr_oob_barrier(&st->ctx->oob) != 0) {
    mc_rr_fail(st->me, 0, "rank %d: host barrier failed: %s", st->rank, mc_last_error());
    return -1;
  }
  if (st->gpu) API(st, mc_a2a_barrier(st->a2a, mc_dev_stream()));
  return 0;
}

/* Dispatch as one call or two halves, between marks 0-3. */
static int round_dispatch(rank_st_t *st, const call_in_t *ci, int m, int one_call) {
  dbufs_t *d = &st->d;
  if (st->c->layout != MC_LAYOUT_BATCHED)
    return mc_rr_packed_dispatch(st->c, st->a2a, &st->b, &st->d, ci, m, one_call, st->rank, st->round, st->me);
  const void *tokens = ci->tokens, *scales = ci->scales;
#define DISPATCH(flags)                                                                                                \
  mc_dispatch(st->a2a, tokens, scales, ci->indices, ci->weights, m, ci->bound, d->x, d->xs, d->count, flags,          \
              mc_dev_stream())
  mc_dev_mark(st->gpu, 0);
  if (st->o->quant_apart) { /* the rows quantised first, then sent as bytes */
    if (mc_dev_quantise(st->gpu, ci->tokens, m, st->c->hidden, st->c->quant == MC_REF_QUANT_UE8M0, d->qx, d->qxs)) {
      mc_rr_fail(st->me, 0, "round %llu rank %d: quantising apart failed", (unsigned long long)st->round, st->rank);
      return -1;
    }
    tokens = d->qx, scales = d->qxs;
  }
  if (one_call) {
    API(st, DISPATCH(MC_SEND_RECV));
  } else {
    API(st, DISPATCH(MC_SEND));
    mc_dev_mark(st->gpu, 1);
    if (st->o->split) mc_dev_busy(st->gpu, d->scratch, 16u << 20);
    mc_dev_mark(st->gpu, 2);
    API(st, DISPATCH(MC_RECV));
  }
  mc_dev_mark(st->gpu, 3);
#undef DISPATCH
  return 0;
}

/* After dispatch: (checked rounds) the outputs against the reference; the
 * fake experts' outputs made and uploaded. */
static int round_experts(rank_st_t *st, int check) {
  const mc_case_t *c = st->c;
  bufs_t *b = &st->b;
  dbufs_t *d = &st->d;
  mc_dev_sync(st->gpu);
  API(st, mc_a2a_check(st->a2a)); /* a GPU transport's failure shows after the sync */
  if (mc_rr_get_dispatch_outputs(c, b, d) != 0) {
    mc_rr_fail(st->me, 0, "round %llu rank %d: downloading dispatch outputs failed", (unsigned long long)st->round,
               st->rank);
    return -1;
  }
  if (c->layout != MC_LAYOUT_BATCHED && b->prows > st->me->recv_rows_max) st->me->recv_rows_max = b->prows;
  if (check && c->layout != MC_LAYOUT_BATCHED && mc_rr_packed_unpack(c, b, st->rank, st->round, st->me) != 0)
    return -1; /* the packed rows checked, and back in batched slots for the checks below */
  if (check) mc_rr_check_dispatch(c, b, st->rank, st->round, st->me);
  if (c->layout != MC_LAYOUT_BATCHED) { /* outputs as rows */
    mc_rr_packed_rows_y(c, b, st->rank);
    const size_t yrow = (size_t)c->hidden * mc_dtype_size(c->in_dtype);
    if (d->gpu && b->prows > 0 && mc_dev_put(1, d->py, b->py, (size_t)b->prows * yrow)) {
      mc_rr_fail(st->me, 0, "round %llu rank %d: uploading the rows combine takes failed", (unsigned long long)st->round,
                 st->rank);
      return -1;
    }
    return 0;
  }
  if (mc_rr_experts_roundtrip(c, b, d, st->rank)) {
    mc_rr_fail(st->me, 0, "round %llu rank %d: uploading expert outputs failed", (unsigned long long)st->round,
               st->rank);
    return -1;
  }
  return 0;
}

/* Combine as one call or two halves, between marks 4-7. */
static int round_combine(rank_st_t *st, int one_call) {
  dbufs_t *d = &st->d;
  const void *y = st->c->layout != MC_LAYOUT_BATCHED ? d->py : d->y;
  mc_dev_mark(st->gpu, 4);
  if (one_call) {
    API(st, mc_combine(st->a2a, y, d->out, MC_SEND_RECV, mc_dev_stream()));
  } else {
    API(st, mc_combine(st->a2a, y, d->out, MC_SEND, mc_dev_stream()));
    mc_dev_mark(st->gpu, 5);
    if (st->o->split) mc_dev_busy(st->gpu, d->scratch, 16u << 20);
    mc_dev_mark(st->gpu, 6);
    API(st, mc_combine(st->a2a, y, d->out, MC_RECV, mc_dev_stream()));
  }
  mc_dev_mark(st->gpu, 7);
  mc_dev_sync(st->gpu);
  return 0;
}

/* A checked round's end: the combined rows against the reference, the
 * library's count of records sent against one per (token, rank), and its
 * per-expert load sums grown by this round's expert_count (checked against
 * the reference already). */
static int round_check_combine(rank_st_t *st, const mc_input_t *in, const mc_a2a_stats_t *before) {
  if (st->gpu && mc_dev_get(1, st->b.out, st->d.out, st->obytes)) {
    mc_rr_fail(st->me, 0, "round %llu rank %d: downloading combine output failed", (unsigned long long)st->round,
               st->rank);
    return -1;
  }
  mc_rr_check_combine(st->c, &st->b, st->rank, st->round, st->me);
  mc_a2a_stats_t after = {.size = sizeof after};
  mc_a2a_get_stats(st->a2a, &after);
  uint64_t want = mc_ref_records_sent(st->c, in, st->rank),
           got = after.dispatch_records_sent - before->dispatch_records_sent;
  st->me->expected_records += want;
  if (got != want)
    mc_rr_fail(st->me, 0, "round %llu rank %d: sent %llu dispatch records, one per (token, rank) is %llu",
               (unsigned long long)st->round, st->rank, (unsigned long long)got, (unsigned long long)want);
  const int L = mc_ref_local_experts(st->c);
  int64_t *load0 = st->load, *load1 = st->load + L;
  API(st, mc_a2a_get_expert_load(st->a2a, load1, 0));
  for (int l = 0; l < L; l++)
    if (load1[l] - load0[l] != st->b.count[l]) {
      mc_rr_fail(st->me, 0, "round %llu rank %d: expert load of local expert %d grew by %lld, expert_count is %d",
                 (unsigned long long)st->round, st->rank, l, (long long)(load1[l] - load0[l]), st->b.count[l]);
      break;
    }
  return 0;
}

/* Round i of total. 0: go on; -1: stop (failed, or this rank stalls). */
static int rank_round(rank_st_t *st, int i, int total, call_in_t *ci) {
  const mc_run_opts_t *o = st->o;
  st->round = (uint64_t)i + 1;
  st->a2a = st->hs[i % st->nh];
  const int check = o->check && (o->check_first <= 0 || i < o->check_first || i == total - 1);
  const int stall_here = st->rank == o->stall_rank && i == o->stall_round;
  if (stall_here && !o->stall_in_combine) {
    if (o->processes) raise(SIGKILL); /* a rank that dies */
    return -1;                        /* a rank that goes silent */
  }
  if (round_inputs(st, check, ci) != 0) return -1;
  const mc_input_t *in = &st->b.ins[st->rank / st->c->group_size];
  mc_a2a_stats_t before = {.size = sizeof before};
  if (check) {
    mc_a2a_get_stats(st->a2a, &before);
    API(st, mc_a2a_get_expert_load(st->a2a, st->load, 0));
  }
  if (o->inject_bad &&
      mc_rr_inject_bad_calls(st->c, st->a2a, in, ci, &st->b, &st->d, st->rank, st->round, st->me))
    return -1;
  mc_dev_sync(st->gpu);
  if (o->barrier && mc_rr_round_barrier(st) != 0) return -1;
  /* each phase as one call (MC_SEND_RECV) or as two halves: whole 1 every
   * round, 2 every other round (tests: both paths, and the switch
   * between them), 0 never; split always calls the halves */
  const int one_call = !o->split && (o->whole == 1 || (o->whole == 2 && i % 2 == 1));
  const int dropped = round_dispatch(st, ci, in->m, one_call); /* 1: every rank dropped it (MC_ERR_CAPACITY) */
  if (dropped != 0) return dropped < 0 ? -1 : 0;
  if ((check || !st->gpu) && round_experts(st, check) != 0) return -1;
  if (stall_here) { /* stall_in_combine: its peers have its records, not its rows */
    if (o->processes) raise(SIGKILL);
    return -1;
  }
  if (round_combine(st, one_call) != 0) return -1;
  if (i >= o->warmup && i < o->warmup + o->rounds)
    mc_rr_store_samples(st->samples, st->ctx->res->rounds, i - o->warmup, st->gpu, st->gpu && one_call);
  API(st, mc_a2a_check(st->a2a));
  return check ? round_check_combine(st, in, &before) : 0;
}

/* mask_stalled: the round the stalled rank broke ended in a timeout (or in
 * the refusal of a handle a timeout aborted); the others mask it on every
 * handle and go on from the next round. -1 where that is not the case or
 * the masking failed. */
static int rank_mask_stalled(rank_st_t *st, int i) {
  const mc_run_opts_t *o = st->o;
  mc_run_rank_t *me = st->me;
  if (!o->mask_stalled || st->c == &st->masked_case || st->rank == o->stall_rank || i < o->stall_round ||
      st->c->world_size > 64 || (me->api_rc != MC_ERR_TIMEOUT && me->api_rc != MC_ERR_ABORTED))
    return -1;
  uint8_t mask[64] = {0};
  mask[o->stall_rank] = 1;
  me->failed = 0, me->api_rc = 0, me->msg[0] = '\0'; /* the expected failure */
  for (int h = 0; h < st->nh; h++) API(st, mc_a2a_mask_ranks(st->hs[h], mask));
  for (int h = 0; h < st->nh; h++) API(st, mc_a2a_barrier(st->hs[h], mc_dev_stream())); /* the others only */
  uint8_t got[64];
  API(st, mc_a2a_get_mask(st->hs[0], got));
  if (memcmp(got, mask, (size_t)st->c->world_size) != 0) {
    mc_rr_fail(me, 0, "rank %d: mc_a2a_get_mask does not give back the mask just set", st->rank);
    return -1;
  }
  st->masked_case = *st->c;
  st->masked_case.masked = 1ull << o->stall_rank;
  st->c = &st->masked_case;
  me->masked_after = st->round;
  return 0;
}

/* Every round, then what was asked besides. -1 where a step stopped. */
static int rank_work(rank_st_t *st) {
  const mc_run_opts_t *o = st->o;
  if (rank_setup(st) != 0) return -1;
  if (st->gpu && o->graph) {
    st->a2a = st->hs[0];
    mc_rr_run_graph_rounds(st->c, o, st->rank, st->a2a, &st->b, &st->d, st->me);
    return 0;
  }
  /* timed graph mode: the eager rounds are the warm-up (and the checks),
   * the timed rounds are replays of a captured round */
  const int timed_graph = st->gpu && o->graph_timed;
  /* With check_first > 0 the checked rounds are the first check_first and
   * one more after the timed ones (on a GPU a check means downloads and
   * host work: only the first rounds and the final state are looked at).
   * A caller that times keeps check_first <= warmup, so that no sample
   * comes from a checked round (mc-bench does). */
  const int tail = o->check && o->check_first > 0 && !timed_graph;
  const int total = o->warmup + (timed_graph ? 0 : o->rounds) + tail;
  call_in_t ci = {0};
  for (int i = 0; i < total; i++)
    if (rank_round(st, i, total, &ci) != 0 && rank_mask_stalled(st, i) != 0) return -1;
  const int m = st->b.ins[st->rank / st->c->group_size].m;
  mc_run_result_t *res = st->ctx->res;
  if (timed_graph && !st->me->failed && st->a2a)
    mc_rr_time_graph(o, st->rank, st->a2a, &st->d, &ci, m, &st->ctx->oob, 0, st->samples, res->rounds, st->me);
  if (o->floor && timed_graph && !st->me->failed && st->a2a)
    mc_rr_time_graph(o, st->rank, st->a2a, &st->d, &ci, m, &st->ctx->oob, 1,
                     res->floor_us + (size_t)st->rank * MC_PH_COUNT * (size_t)res->rounds, res->rounds, st->me);
  if (o->floor && st->gpu && !timed_graph && !st->me->failed && mc_rr_floor(st, m) != 0) return -1;
  if (o->dense_bytes && !st->me->failed) mc_rr_baselines(st);
  return 0;
}

/* What every rank does last, however its work ended. */
static void rank_teardown(rank_st_t *st) {
  mc_run_rank_t *me = st->me;
  const int gpu = st->gpu;
  if (me->api_rc == MC_ERR_TIMEOUT && st->a2a)
    me->rc_after_timeout = mc_combine(st->a2a, st->d.y, st->d.out, MC_SEND_RECV, mc_dev_stream());
  if (st->hs[0]) {
    me->stats.size = sizeof me->stats;
    mc_a2a_get_stats(st->hs[0], &me->stats);
  }
  /* Threads share one address space: nobody unmaps a window while a peer
   * may still write into it. (Processes map separately: no wait needed.)
   * NVSHMEM's free is collective: every live rank must reach it. */
  if ((!st->o->processes || (gpu && !me->failed)) && st->comm) mc_rr_oob_barrier(&st->ctx->oob);
  if (!(gpu && me->failed))
    for (int h = 0; h < st->nh; h++) mc_a2a_destroy(st->hs[h]);
  if (st->comm && !(gpu && me->failed) && mc_comm_destroy(st->comm) != MC_SUCCESS)
    mc_rr_fail(me, 0, "rank %d: mc_comm_destroy failed", st->rank);
  free(st->load);
  mc_rr_free_dbufs(&st->d, &st->b);
  mc_rr_free_bufs(&st->b, mc_ref_num_groups(st->c));
}

static void rank_main(run_ctx_t *ctx) {
  const double t_start = now_us();
  const mc_run_opts_t *o = ctx->o;
  rank_st_t st;
  memset(&st, 0, sizeof st);
  st.ctx = ctx;
  st.c = ctx->c;
  st.o = o;
  st.rank = ctx->rank;
  st.me = &ctx->res->ranks[ctx->rank];
  st.me->transport = -1; /* until a communicator exists */
  st.gpu = o->transport == MC_TRANSPORT_NVSHMEM || o->transport == MC_TRANSPORT_P2P;
  st.nh = o->handles > 0 ? (o->handles < 64 ? o->handles : 64) : 1;
  st.samples = ctx->res->samples_us + (size_t)ctx->rank * MC_PH_COUNT * (size_t)ctx->res->rounds;
  (void)rank_work(&st);
  st.me->touched_bytes = mc_rr_resident_bytes(st.c, &st.b);
  rank_teardown(&st);
  st.me->wall_s = (now_us() - t_start) / 1e6;
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

static const char *signal_name(int sig) {
  switch (sig) {
  case SIGKILL: return "SIGKILL";
  case SIGSEGV: return "SIGSEGV";
  case SIGBUS: return "SIGBUS";
  case SIGABRT: return "SIGABRT";
  case SIGTERM: return "SIGTERM";
  default: return strsignal(sig);
  }
}

/* A rank whose process a signal ended: its failure is that signal, named,
 * with what the rank had said before it. SIGKILL is what the out-of-memory
 * killer sends; nothing in a run sends it but a planned stall, which the
 * text then owns to. */
static void rank_killed(mc_run_rank_t *me, int r, int sig, int planned) {
  char before[sizeof me->msg] = "";
  if (me->failed) snprintf(before, sizeof before, "; before that: %.600s", me->msg);
  me->failed = 0; /* the signal comes first */
  mc_rr_fail(me, 0, "rank %d: process killed by signal %d (%s%s)%s%s", r, sig, signal_name(sig),
             sig == SIGKILL ? ": likely the out-of-memory killer; the kernel log (dmesg) says" : "",
             planned ? "; here the run's stall_rank raised it" : "", before);
  me->signal = sig;
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
      if (o->split_hosts) mc_testing_set_host(r % 2 ? "mc-test-host-b" : "mc-test-host-a");
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
    if (pids[r] <= 0) mc_rr_fail(&res->ranks[r], 0, "rank %d: process could not start", r);
    else if (WIFSIGNALED(st)) rank_killed(&res->ranks[r], r, WTERMSIG(st), r == o->stall_rank);
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
  size_t sample_bytes = 2 * sizeof(double) * (size_t)c->world_size * MC_PH_COUNT * (size_t)res->rounds +
                        2 * sizeof(float) * (size_t)c->world_size * (size_t)res->rounds;
  /* Shared anonymous memory, so forked ranks can report back. */
  void *p = mmap(NULL, rank_bytes + sample_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return -1;
  res->ranks = p;
  res->samples_us = (double *)((char *)p + rank_bytes);
  res->dense_us = (float *)(res->samples_us + (size_t)c->world_size * MC_PH_COUNT * (size_t)res->rounds);
  res->extra_us = res->dense_us + (size_t)c->world_size * (size_t)res->rounds;
  res->floor_us = (double *)(res->extra_us + (size_t)c->world_size * (size_t)res->rounds);
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
                 2 * sizeof(double) * (size_t)res->world_size * MC_PH_COUNT * (size_t)res->rounds +
                 2 * sizeof(float) * (size_t)res->world_size * (size_t)res->rounds;
  munmap(res->ranks, bytes);
  res->ranks = NULL;
}

const char *mc_run_first_failure(const mc_run_result_t *res) {
  for (int r = 0; r < res->world_size; r++) /* a rank a signal killed: the others' failures follow from it */
    if (res->ranks[r].failed && res->ranks[r].signal) return res->ranks[r].msg;
  for (int r = 0; r < res->world_size; r++)
    if (res->ranks[r].failed) return res->ranks[r].msg;
  return "";
}
