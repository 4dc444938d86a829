/* mc_gpu_host.c - the host side the GPU transports share: memory the
 * kernels need besides the window, the grid, and device failures reported
 * as results with the same words as the cpu transport's. */
#include "mc_gpu_host.h"

#include "mc_params.h"
#include "mc_testing.h"

#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int mc_gpu_present(void) {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

/* Blocks of MC_THREADS per big kernel (the 256-thread kernels launch
 * twice as many): one per SM this process may use when it has the GPU to
 * itself; 7 per 10 SMs when other ranks share the GPU, whose kernels need
 * room beside this rank's receivers spinning on their signals. Under MPS
 * (CUDA 13, H200) the SM count the device reports is already the client's
 * share (16 SMs at CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=12.5), but not a
 * private set: every client's blocks run on the same 16 SMs, so room beside
 * the spinning receivers is room on the same SMs. A full wave there leaves
 * the other ranks' senders waiting for SMs and stretches the tail. */
static int grid_size(int sms, int shared) {
  const int g = shared ? (7 * sms + 9) / 10 : sms;
  return g < 1 ? 1 : g;
}

/* The trace's resting state: first-start slots at the maximum (atomicMin),
 * the rest at zero (atomicMax). */
static cudaError_t trace_reset(mc_gpu_t *g) {
  uint64_t init[MC_TK_N * MC_TRACE_SLOTS] = {0};
  for (int k = 0; k < MC_TK_N; k++) init[k * MC_TRACE_SLOTS] = UINT64_MAX;
  return cudaMemcpy(g->trace, init, sizeof init, cudaMemcpyHostToDevice);
}

/* MC_GPU_TRACE=prefix: stamps go to prefix.<rank>, one line per check:
 * the round count, then MC_TK_N x MC_TRACE_SLOTS nanosecond stamps. */
static mc_result_t trace_open(mc_a2a_t *a2a, mc_gpu_t *g) {
  const mc_params_t *params = mc_params(NULL); /* MC_GPU_TRACE */
  const char *prefix = params ? params->gpu_trace : "";
  if (!*prefix) return MC_SUCCESS;
  char path[4096];
  snprintf(path, sizeof path, "%s.%d", prefix, a2a->comm->rank);
  g->trace_file = fopen(path, "w");
  if (!g->trace_file) return mc_fail(a2a->err, MC_ERR_SYSTEM, "MC_GPU_TRACE: cannot write %s", path);
  cudaError_t e = cudaMalloc((void **)&g->trace, sizeof(uint64_t) * MC_TK_N * MC_TRACE_SLOTS);
  if (e == cudaSuccess) e = trace_reset(g);
  if (e != cudaSuccess) return mc_fail(a2a->err, MC_ERR_CUDA, "MC_GPU_TRACE: %s", cudaGetErrorString(e));
  return MC_SUCCESS;
}

static void trace_dump(mc_gpu_t *g) {
  uint64_t t[MC_TK_N * MC_TRACE_SLOTS];
  if (cudaDeviceSynchronize() != cudaSuccess ||
      cudaMemcpy(t, g->trace, sizeof t, cudaMemcpyDeviceToHost) != cudaSuccess)
    return;
  FILE *f = g->trace_file;
  fprintf(f, "%llu", (unsigned long long)++g->trace_rounds);
  for (int i = 0; i < MC_TK_N * MC_TRACE_SLOTS; i++)
    fprintf(f, " %llu", (unsigned long long)(t[i] == UINT64_MAX ? 0 : t[i]));
  fputc('\n', f);
  fflush(f);
  trace_reset(g);
}

void mc_gpu_free(mc_gpu_t *g) {
  if (!g) return;
  if (g->trace) cudaFree(g->trace);
  if (g->trace_file) fclose(g->trace_file);
  if (g->ws) cudaFree(g->ws);
  if (g->err_h) cudaFreeHost(g->err_h);
  if (g->counts_h) cudaFreeHost(g->counts_h);
  free(g->pid);
  free(g->host);
  free(g); /* g->peers is the transport's to free */
}

mc_result_t mc_gpu_create(mc_a2a_t *a2a) {
  const mc_shape_t *s = &a2a->shape;
  /* the prep kernel keeps per-warp masks of every expert and rank in shared
   * memory (mc_gpu_prep.cuh): beyond these it would not fit one block */
  if (s->num_experts > 4096 || s->world_size > 1024)
    return mc_fail(a2a->err, MC_ERR_UNSUPPORTED,
                   "GPU transports support up to 4096 experts and 1024 ranks (num_experts=%d, world_size=%d)",
                   s->num_experts, s->world_size);
  mc_gpu_t *g = calloc(1, sizeof *g);
  if (!g) return mc_fail(a2a->err, MC_ERR_SYSTEM, "out of host memory");
  a2a->impl = g;
  int dev = 0;
  cudaGetDevice(&dev);
  if (cudaDeviceGetAttribute(&g->sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || g->sms < 1) g->sms = 1;
  /* g->grid: once the ranks sharing this GPU are known (mc_gpu_decide_scope, before any launch) */
  /* tests: stage and put even to reachable peers (the path a network takes, run on one node) */
  g->direct = !mc_testing_forced(MC_TESTING_STAGED);
  cudaError_t e = cudaMalloc((void **)&g->ws, mc_workspace_bytes(s));
  if (e == cudaSuccess) e = cudaMemset(g->ws, 0, mc_workspace_bytes(s));
  if (e == cudaSuccess) e = cudaHostAlloc((void **)&g->err_h, sizeof(mc_dev_error_t), cudaHostAllocMapped);
  if (e == cudaSuccess) {
    memset(g->err_h, 0, sizeof *g->err_h);
    e = cudaHostGetDevicePointer((void **)&g->err_d, g->err_h, 0);
  }
  const size_t counts = sizeof(int64_t) + sizeof(int32_t) * (size_t)mc_num_local_experts(s);
  if (e == cudaSuccess && mc_packed_layout(s)) e = cudaHostAlloc((void **)&g->counts_h, counts, cudaHostAllocMapped);
  if (e == cudaSuccess && g->counts_h) e = cudaHostGetDevicePointer((void **)&g->counts_d, g->counts_h, 0);
  if (e != cudaSuccess)
    return mc_fail(a2a->err, MC_ERR_CUDA, "rank %d: allocating the GPU workspace (%llu bytes): %s", a2a->comm->rank,
                   (unsigned long long)mc_workspace_bytes(s), cudaGetErrorString(e));
  return trace_open(a2a, g);
}

mc_result_t mc_gpu_decide_scope(mc_a2a_t *a2a) {
  mc_gpu_t *g = a2a->impl;
  mc_comm_t *comm = a2a->comm;
  int dev = 0;
  struct cudaDeviceProp p;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&p, dev) != cudaSuccess)
    return mc_fail(a2a->err, MC_ERR_CUDA, "rank %d: cannot read the device's properties", comm->rank);
  struct {
    unsigned char uuid[sizeof p.uuid.bytes];
    uint64_t host;
    int32_t pid;
  } mine, *all = malloc(sizeof mine * (size_t)comm->world_size);
  if (!all) return mc_fail(a2a->err, MC_ERR_SYSTEM, "out of host memory");
  memset(&mine, 0, sizeof mine);
  memcpy(mine.uuid, p.uuid.bytes, sizeof mine.uuid);
  mine.host = mc_host_id();
  mine.pid = (int32_t)getpid();
  mc_result_t rc = mc_comm_allgather(comm, &mine, all, sizeof mine);
  int same = rc == MC_SUCCESS, on_mine = 0, threads_here = 0;
  g->pid = calloc((size_t)comm->world_size, sizeof *g->pid);
  g->host = calloc((size_t)comm->world_size, sizeof *g->host);
  if (rc == MC_SUCCESS && (!g->pid || !g->host)) rc = mc_fail(a2a->err, MC_ERR_SYSTEM, "out of host memory");
  for (int r = 0; rc == MC_SUCCESS && r < comm->world_size; r++) g->pid[r] = all[r].pid, g->host[r] = all[r].host;
  for (int r = 0; rc == MC_SUCCESS && r < comm->world_size; r++) {
    const int here = memcmp(all[r].uuid, mine.uuid, sizeof mine.uuid) == 0;
    same &= here;
    on_mine += here;
    threads_here += here && all[r].host == mine.host && all[r].pid == mine.pid;
  }
  free(all);
  /* Ranks that are threads of this process on this GPU split the SMs the
   * device reports between them (MPS limits processes, not threads): without
   * that each launched a grid for the whole GPU, and 8 ranks' spinning
   * receivers could hold every SM while a sender's kernel waited. */
  const int sms = threads_here > 1 ? (g->sms + threads_here - 1) / threads_here : g->sms;
  g->grid = grid_size(sms, on_mine > 1);
  g->alone = on_mine == 1;
  if (rc == MC_SUCCESS && mc_verbose() && comm->rank == 0)
    fprintf(stderr, "moecomm: %d blocks per kernel (%d SMs; %d ranks on this GPU, %d of them threads of this process)\n",
            g->grid, g->sms, on_mine, threads_here);
  /* tests: system scope even where every rank shares this GPU (the signals several GPUs need) */
  g->gpu_scope = same && !g->staged && !mc_testing_forced(MC_TESTING_SYS_SCOPE);
  return rc;
}

static const char *phase_name(int p) {
  static const char *n[] = {"dispatch send", "dispatch recv", "combine send", "combine recv", "mc_a2a_barrier",
                            "mc_a2a_mask_ranks"};
  return p >= 0 && p < 6 ? n[p] : "?";
}

/* Who waits for whom after a timeout (mc_describe_wait_root): a rank's
 * process where it runs on this host, its "waiting for" word (set by a
 * wait that lasted, mc_dev.cuh) copied from its window where this process
 * maps it. */
typedef struct gpu_view {
  mc_a2a_t *a2a;
  cudaStream_t st;
} gpu_view_t;
static int gpu_gone(void *ctx, int r, int64_t *pid) {
  mc_a2a_t *a2a = ((gpu_view_t *)ctx)->a2a;
  mc_gpu_t *g = a2a->impl;
  *pid = g->pid[r];
  return g->host[r] == g->host[a2a->comm->rank] && mc_pid_gone(g->pid[r]);
}
static int gpu_waiting(void *ctx, int r, uint64_t *word) {
  gpu_view_t *v = ctx;
  unsigned char *win = ((mc_gpu_t *)v->a2a->impl)->peer_window(v->a2a, r);
  return win &&
         cudaMemcpyAsync(word, win + mc_sig_off(&v->a2a->shape, MC_SIG_WAITING, r), sizeof *word,
                         cudaMemcpyDeviceToHost, v->st) == cudaSuccess &&
         cudaStreamSynchronize(v->st) == cudaSuccess;
}
static void describe_root(mc_a2a_t *a2a, int peer, char *out, size_t n) {
  mc_gpu_t *g = a2a->impl;
  gpu_view_t v = {a2a, NULL};
  out[0] = '\0';
  if (!g->pid || !g->peer_window || cudaStreamCreateWithFlags(&v.st, cudaStreamNonBlocking) != cudaSuccess) return;
  const mc_wait_view_t view = {&v, gpu_gone, gpu_waiting};
  mc_describe_wait_root(a2a->comm->world_size, a2a->comm->rank, peer, &view, out, n);
  cudaStreamDestroy(v.st);
}

/* A round dropped over a declared capacity (the packed layouts), reported
 * once: from the device's record, apart from the failures above (a drop
 * is none: the handle goes on). Dispatch-send refuses on the device until
 * the first one launched after this report clears the mark, in stream
 * order (mc_gpu_launch.cuh); one launched before, and not received yet,
 * is owed its recv half's count. */
static mc_result_t drop_report(mc_a2a_t *a2a) {
  mc_gpu_t *g = a2a->impl;
  volatile mc_dev_error_t *e = g->err_h;
  const uint64_t seq = e->drop_seq;
  if (seq == g->drop_seen) return MC_SUCCESS;
  __sync_synchronize();
  g->drop_seen = seq;
  g->drop_ack = 1;
  if (a2a->next == MC_NEXT_DISPATCH_RECV) g->recv_owed = 1;
  return mc_fail(a2a->err, MC_ERR_CAPACITY,
                 "dispatch: rank %d receives %lld rows in round %llu, more than the capacity of %lld it declared; the "
                 "round is dropped on every rank (nothing written; dispatch is next; a dispatch queued before this "
                 "report was refused too)",
                 e->drop_peer, (long long)e->drop_rows, (unsigned long long)e->drop_round, (long long)e->drop_limit);
}

/* A failure the device recorded: a wait that timed out, or a group whose
 * ranks passed different inputs; the round cannot finish. */
static mc_result_t failure_recorded(mc_a2a_t *a2a, volatile mc_dev_error_t *e, int code) {
  __sync_synchronize();
  if (code == MC_DEVERR_TIMEOUT && e->slot < 0) /* a wait for the kernel's own blocks (mc_recv_all_arrived) */
    return mc_fail(a2a->err, MC_ERR_TIMEOUT,
                   "%s: rank %d timed out after %d ms waiting for its own kernel's blocks (%llu of %llu had read "
                   "the round's state) in round %llu",
                   phase_name(e->phase), e->rank, a2a->comm->timeout_ms, (unsigned long long)e->seen,
                   (unsigned long long)e->expected, (unsigned long long)e->round);
  if (code == MC_DEVERR_TIMEOUT) {
    char root[256];
    describe_root(a2a, e->peer, root, sizeof root);
    return mc_fail(a2a->err, MC_ERR_TIMEOUT,
                   "%s: rank %d timed out after %d ms waiting for rank %d (%s: expected %llu, saw %llu) in round "
                   "%llu%s",
                   phase_name(e->phase), e->rank, a2a->comm->timeout_ms, e->peer, mc_sig_name(e->slot),
                   (unsigned long long)e->expected, (unsigned long long)e->seen, (unsigned long long)e->round, root);
  }
  if (code == MC_DEVERR_GROUP_DIFFERS) { /* as the cpu transport says it; the handle is done */
    a2a->aborted = 1;
    return mc_fail(a2a->err, MC_ERR_INVALID_USAGE,
                   "mc_dispatch: ranks %d and %d of group %d passed different m, indices or weights (every rank "
                   "of a group must pass the same); the round cannot finish",
                   e->slot, e->peer, e->value);
  }
  return mc_fail(a2a->err, MC_ERR_INTERNAL, "the device recorded failure code %d in %s (a bug: please report)", code,
                 phase_name(e->phase));
}

/* A call the device refused for its input (the first one, where several
 * were refused before the host looked): nothing was sent, and calls queued
 * behind it ran as usual. Reported once, then cleared. */
static mc_result_t refusal_recorded(mc_a2a_t *a2a, volatile mc_dev_error_t *e, int code) {
  __sync_synchronize();
  mc_result_t rc;
  if (code == MC_DEVERR_BAD_EXPERT)
    rc = mc_fail(a2a->err, MC_ERR_INVALID_ARG,
                 "mc_dispatch (checked on the device): indices[%d][%d]=%lld is not an expert id in 0..%d; "
                 "the round was not sent",
                 e->ref_token, e->ref_k, (long long)(int64_t)e->ref_seen, a2a->shape.num_experts - 1);
  else if (code == MC_DEVERR_DUP_EXPERT)
    rc = mc_fail(a2a->err, MC_ERR_INVALID_ARG,
                 "mc_dispatch (checked on the device): indices[%d] names expert %d twice (position %d); "
                 "the round was not sent",
                 e->ref_token, e->ref_value, e->ref_k);
  else if (code == MC_DEVERR_BAD_BOUND)
    rc = mc_fail(a2a->err, MC_ERR_INVALID_ARG,
                 "mc_dispatch (checked on the device): *bound_m=%d is not in 0..m=%llu; the round was not sent",
                 e->ref_value, (unsigned long long)e->ref_expected);
  else
    return mc_fail(a2a->err, MC_ERR_INTERNAL, "the device recorded refusal code %d (a bug: please report)", code);
  /* a refused round changed nothing on the device (but the count of
   * calls): clear and go on; if its dispatch-recv was never launched, the
   * next dispatch-send first moves dispatch-recv's count past it */
  e->ref_code = 0;
  __sync_synchronize();
  e->ref_claimed = 0;
  a2a->refused = 1;
  if (a2a->next == MC_NEXT_DISPATCH_RECV) ((mc_gpu_t *)a2a->impl)->recv_owed = 1;
  return rc;
}

/* What the device recorded since the last look: a failure first (it ends
 * the round), then a refusal. */
static mc_result_t device_recorded(mc_a2a_t *a2a) {
  mc_gpu_t *g = a2a->impl;
  volatile mc_dev_error_t *e = g->err_h;
  const int code = e->code;
  if (code != MC_DEVERR_NONE) return failure_recorded(a2a, e, code);
  const int ref = e->ref_code;
  if (ref != MC_DEVERR_NONE) return refusal_recorded(a2a, e, ref);
  return MC_SUCCESS;
}

mc_result_t mc_gpu_failure(mc_a2a_t *a2a) {
  const mc_result_t rc = device_recorded(a2a);
  return rc != MC_SUCCESS ? rc : drop_report(a2a);
}

mc_result_t mc_gpu_check(mc_a2a_t *a2a) {
  mc_gpu_t *g = a2a->impl;
  if (g->trace) trace_dump(g);
  return mc_gpu_failure(a2a);
}

mc_result_t mc_gpu_prepare(mc_a2a_t *a2a, mc_kargs_t *ka, const mc_dispatch_args_t *d, const mc_combine_args_t *c) {
  mc_result_t rc = mc_gpu_failure(a2a);
  if (rc != MC_SUCCESS) return rc;
  mc_gpu_t *g = a2a->impl;
  memset(ka, 0, sizeof *ka);
  ka->s = a2a->shape;
  ka->rank = a2a->comm->rank;
  ka->in_dtype = (int)a2a->cfg.combine_in_dtype;
  ka->out_dtype = (int)a2a->cfg.combine_out_dtype;
  ka->win = g->win;
  ka->ws = g->ws;
  ka->err = g->err_d;
  ka->timeout_ns = (uint64_t)a2a->comm->timeout_ms * 1000000ull;
  ka->peers = g->peers;
  ka->direct = g->direct;
  ka->staged = g->staged;
  ka->gpu_scope = g->gpu_scope;
  /* a warp per payload piece where this rank has its GPU alone (latency:
   * more warps in flight); where ranks share it, a warp per record (the
   * pieces' extra header reads cost more than the extra warps bring);
   * either way the grid's spare warps share an item's slots */
  ka->recv_pieces = g->alone ? 1 : mc_token_segs(&a2a->shape);
  ka->div_items = mc_fdiv_make((uint32_t)mc_record_items(&a2a->shape, ka->recv_pieces));
  ka->quant = a2a->cfg.dispatch_input != MC_INPUT_BF16_TO_E4M3 ? 0 : a2a->cfg.scale_format == MC_SCALE_UE8M0 ? 2 : 1;
  ka->mask = a2a->any_masked ? g->ws + mc_ws_mask_off(&a2a->shape) : NULL;
  ka->trace = g->trace;
  /* naps between polls up to 128 ns where this rank has its GPU alone (a
   * signal is seen sooner), 512 where ranks share it (there, hundreds of
   * pollers with short naps slow the other ranks' senders) */
  ka->nap_max = g->alone ? 128 : 512;
  if (d) {
    ka->tokens = d->tokens;
    ka->scales = d->scales;
    ka->indices = d->indices;
    ka->ids64 = a2a->cfg.index_dtype == MC_INDEX_INT64;
    ka->weights = d->weights;
    ka->m = d->m;
    ka->bound_m = d->bound_m;
    ka->expert_x = d->expert_x;
    ka->expert_scale = d->expert_scale;
    ka->expert_count = d->expert_count;
    if (d->recv) { /* the packed layouts: the send half's declared capacity, the recv half's rows */
      ka->limit = d->recv->capacity;
      ka->expert_x = d->recv->x;
      ka->expert_scale = d->recv->x_scale;
      ka->expert_count = d->recv->expert_count;
      ka->row_expert = d->recv->row_expert;
      ka->row_weight = d->recv->row_weight;
      ka->expert_offset = d->recv->expert_offset;
      ka->src_count = d->recv->src_count;
      ka->rows_out = d->recv->rows;
    }
  }
  if (c) {
    ka->expert_y = c->expert_y;
    ka->out = c->out;
  }
  return MC_SUCCESS;
}

/* The counters as the finished halves left them, copied on a stream of its
 * own: no device-wide synchronisation, which with ranks that are threads of
 * one process on one GPU would wait for a peer's receiver that waits for
 * this thread's next send (the caller synchronises its own stream first). */
mc_result_t mc_gpu_expert_load(mc_a2a_t *a2a, int64_t *counts, int reset) {
  mc_gpu_t *g = a2a->impl;
  const size_t bytes = sizeof(uint64_t) * (size_t)mc_num_local_experts(&a2a->shape);
  unsigned char *load = g->ws + mc_ws_load_off(&a2a->shape);
  cudaStream_t s;
  cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  if (e != cudaSuccess) return mc_fail(a2a->err, MC_ERR_CUDA, "mc_a2a_get_expert_load: %s", cudaGetErrorString(e));
  e = cudaMemcpyAsync(counts, load, bytes, cudaMemcpyDeviceToHost, s);
  if (e == cudaSuccess && reset) e = cudaMemsetAsync(load, 0, bytes, s);
  if (e == cudaSuccess) e = cudaStreamSynchronize(s);
  cudaStreamDestroy(s);
  return e == cudaSuccess ? MC_SUCCESS
                          : mc_fail(a2a->err, MC_ERR_CUDA, "mc_a2a_get_expert_load: %s", cudaGetErrorString(e));
}

void mc_gpu_refresh_stats(mc_a2a_t *a2a) {
  mc_gpu_t *g = a2a->impl;
  uint64_t st[MC_WS_NSTATS];
  cudaStream_t s;
  if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) return;
  cudaError_t e = cudaMemcpyAsync(st, g->ws + mc_ws_stats_off(&a2a->shape), sizeof st, cudaMemcpyDeviceToHost, s);
  if (e == cudaSuccess) e = cudaStreamSynchronize(s);
  cudaStreamDestroy(s);
  if (e != cudaSuccess) return;
  a2a->stats.dispatch_records_sent = st[MC_STAT_DREC];
  a2a->stats.dispatch_bytes_sent = st[MC_STAT_DBYTES];
  a2a->stats.combine_rows_sent = st[MC_STAT_CROWS];
  a2a->stats.combine_bytes_sent = st[MC_STAT_CBYTES];
}
