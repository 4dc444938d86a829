/* mc_p2p.cu - the p2p transport: each rank's window is device memory it
 * allocates itself and exports with a CUDA IPC handle; every other rank of
 * the communicator opens it once (or, for ranks that are threads of one
 * process, uses its address directly) at create, and the shared kernels
 * store straight into peers' windows through a table of their addresses.
 * No NVSHMEM anywhere: a single-node user needs nothing but CUDA.
 *
 * Every peer must be mapped: one that cannot be (another host, no peer
 * access between two GPUs) fails mc_a2a_create on every rank with its name,
 * never a crash later. So the kernels never take the put path, and the
 * interface's put/signal calls below are unreachable. */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

extern "C" {
#include "mc_internal.h"
#include "mc_gpu_host.h"
}

/* ---- the device-side transport interface ---- */
static __device__ __forceinline__ unsigned char *mc_t_peer_window(const mc_kargs_t *a, int pe) {
  return ((unsigned char *const *)a->peers)[pe]; /* a small table: cached after the first look */
}
/* Unreachable (every peer is mapped, see above); present because the
 * kernels are written once for both transports. */
static __device__ __forceinline__ void mc_t_put_signal_warp(const mc_kargs_t *, uint64_t, const void *, uint64_t, int,
                                                            uint64_t, int, int) {}
static __device__ __forceinline__ void mc_t_signal(const mc_kargs_t *, int, uint64_t, int, int) {}

#include "mc_gpu_table.cuh"
#include "mc_gpu_launch.cuh"

/* What a rank tells the others about its window (one allgather). */
typedef struct p2p_card {
  cudaIpcMemHandle_t ipc;
  uint64_t base;  /* the buffer's address in its owner's process */
  uint64_t offset; /* from the start of the allocation the IPC handle names (0 for the window) */
  uint64_t host;  /* host name hash: IPC handles only open on their host */
  int32_t pid;    /* same pid and host: a thread of this process, the address works as is */
  int32_t device; /* CUDA ordinal in its owner's process */
  int32_t ok;     /* 0: this rank could not export its window */
} p2p_card_t;

typedef struct p2p_state {
  unsigned char **peer;  /* [W] each peer's window as this process addresses it */
  unsigned char *opened; /* [W] 1: mapped by cudaIpcOpenMemHandle (closed at destroy) */
  unsigned char **table; /* the same table in device memory (kernel argument) */
} p2p_state_t;

/* rank r's window as this process addresses it (after a timeout: whom r waits for) */
static unsigned char *p2p_peer_window(mc_a2a_t *a2a, int r) {
  const p2p_state_t *p = (const p2p_state_t *)gpu(a2a)->tstate;
  return p && p->peer ? p->peer[r] : NULL;
}

static mc_result_t p2p_comm_init(mc_comm_t *comm) {
  if (comm->device >= 0 && cudaSetDevice(comm->device) != cudaSuccess)
    return mc_fail(comm->err, MC_ERR_CUDA, "rank %d: cudaSetDevice(%d) failed", comm->rank, comm->device);
  return MC_SUCCESS;
}

static void p2p_a2a_destroy(mc_a2a_t *a2a) {
  mc_gpu_t *g = gpu(a2a);
  if (!g) return;
  p2p_state_t *p = (p2p_state_t *)g->tstate;
  cudaDeviceSynchronize();
  /* Peers write into this window until their last combine: free it only
   * once every rank is here (each synchronised its device first). After a
   * timeout a peer may be dead or still writing: then the window is left
   * mapped to process exit, as the other transports do. */
  int all_here = !a2a->aborted && mc_comm_barrier(a2a->comm) == MC_SUCCESS;
  if (p) {
    for (int r = 0; p->peer && r < a2a->comm->world_size; r++)
      if (p->opened[r]) cudaIpcCloseMemHandle(p->peer[r]);
    if (p->table) cudaFree(p->table);
    free(p->peer);
    free(p->opened);
    free(p);
  }
  /* and once every rank has closed its mappings of this window: freeing
   * an allocation a peer still has open is undefined */
  if (all_here) all_here = mc_comm_barrier(a2a->comm) == MC_SUCCESS;
  if (g->win && all_here) cudaFree(g->win);
  mc_gpu_free(g);
  a2a->impl = NULL;
}

/* Map every peer's window into peer[] (opened[r] = 1 where it took
 * cudaIpcOpenMemHandle); on failure *why names the peer and the reason. */
static int map_peers(const mc_comm_t *comm, const p2p_card_t *cards, unsigned char **peer, unsigned char *opened,
                     char *why, size_t n) {
  const int me = comm->rank, W = comm->world_size;
  const p2p_card_t *mine = &cards[me];
  for (int r = 0; r < W; r++) {
    const p2p_card_t *c = &cards[r];
    if (r == me) {
      peer[r] = (unsigned char *)(uintptr_t)c->base;
      continue;
    }
    if (!c->ok) return snprintf(why, n, "rank %d could not export its window", r), 1;
    if (c->host != mine->host)
      return snprintf(why, n, "rank %d is on another host: p2p needs every rank on one node (use nvshmem)", r), 1;
    if (c->pid == mine->pid) { /* a thread of this process: its address works here */
      if (c->device != mine->device) {
        int can = 0;
        cudaDeviceCanAccessPeer(&can, mine->device, c->device);
        if (!can) return snprintf(why, n, "GPU %d cannot access rank %d's GPU %d", mine->device, r, c->device), 1;
        cudaError_t e = cudaDeviceEnablePeerAccess(c->device, 0);
        if (e != cudaSuccess && e != cudaErrorPeerAccessAlreadyEnabled)
          return snprintf(why, n, "enabling access to GPU %d (rank %d): %s", c->device, r, cudaGetErrorString(e)), 1;
        cudaGetLastError(); /* "already enabled" is not an error here */
      }
      peer[r] = (unsigned char *)(uintptr_t)c->base;
      continue;
    }
    void *ptr = NULL;
    cudaError_t e = cudaIpcOpenMemHandle(&ptr, c->ipc, cudaIpcMemLazyEnablePeerAccess);
    if (e != cudaSuccess)
      return snprintf(why, n, "opening rank %d's window (cudaIpcOpenMemHandle): %s", r, cudaGetErrorString(e)), 1;
    peer[r] = (unsigned char *)ptr + c->offset;
    opened[r] = 1;
  }
  return 0;
}

/* A rank's verdict after mapping: the reason is its own, so that every
 * rank can report the first failing rank's reason, not just its number. */
typedef struct p2p_verdict {
  int32_t bad;     /* this rank cannot map every peer */
  int32_t threads; /* another rank is a thread of this rank's process */
  char why[120];
} p2p_verdict_t;

/* Everyone's card, then everyone's verdict, so that all ranks decide
 * together: map every peer (peer[], opened[]); with close_first (the probe)
 * close what was opened before the verdicts, so that each owner may free
 * its buffer once they are in. A local failure (mine->ok = 0, mine_why) is
 * a verdict, never an early return: every rank makes both allgathers; out
 * of host memory ends it before them, as anywhere at create (the error
 * into err; the allgathers' into comm->err). On return
 * *first_bad is the first rank that could not map every peer (-1: none),
 * why that rank's reason (the same on every rank), *threads whether some
 * ranks are threads of one process. */
static mc_result_t p2p_agree(mc_comm_t *comm, char *err, const p2p_card_t *mine, const char *mine_why,
                             unsigned char **peer, unsigned char *opened, int close_first, int *first_bad, int *threads,
                             char *why, size_t why_n) {
  const int W = comm->world_size;
  *first_bad = -1;
  *threads = 0;
  why[0] = 0;
  p2p_verdict_t v;
  memset(&v, 0, sizeof v);
  p2p_card_t *cards = (p2p_card_t *)calloc((size_t)W, sizeof *cards);
  p2p_verdict_t *all = (p2p_verdict_t *)calloc((size_t)W, sizeof *all);
  mc_result_t rc = MC_SUCCESS;
  if (!cards || !all) rc = mc_fail(err, MC_ERR_SYSTEM, "out of host memory");
  if (rc == MC_SUCCESS) rc = mc_comm_allgather(comm, mine, cards, sizeof *mine);
  if (rc == MC_SUCCESS) { /* a broken allgather is the out-of-band's failure: nothing more to agree on */
    for (int r = 0; r < W; r++)
      v.threads |= r != comm->rank && cards[r].host == mine->host && cards[r].pid == mine->pid;
    v.bad = 1;
    if (!mine->ok)
      snprintf(v.why, sizeof v.why, "%s", mine_why);
    else
      v.bad = map_peers(comm, cards, peer, opened, v.why, sizeof v.why);
    for (int r = 0; close_first && r < W; r++)
      if (opened[r]) cudaIpcCloseMemHandle(peer[r]), opened[r] = 0;
    cudaGetLastError();
    rc = mc_comm_allgather(comm, &v, all, sizeof v);
  }
  for (int r = 0; rc == MC_SUCCESS && r < W; r++) {
    *threads |= all[r].threads;
    if (all[r].bad && *first_bad < 0) *first_bad = r;
  }
  if (rc == MC_SUCCESS && *first_bad >= 0)
    snprintf(why, why_n, "rank %d: %.*s", *first_bad, (int)sizeof all[0].why, all[*first_bad].why);
  free(cards);
  free(all);
  return rc;
}

static mc_result_t p2p_a2a_create(mc_a2a_t *a2a) {
  mc_result_t rc = mc_gpu_create(a2a);
  if (rc != MC_SUCCESS) return rc;
  mc_gpu_t *g = gpu(a2a);
  mc_comm_t *comm = a2a->comm;
  const int W = comm->world_size;
  const uint64_t bytes = mc_window_bytes(&a2a->shape);
  p2p_state_t *p = (p2p_state_t *)calloc(1, sizeof *p);
  g->tstate = p;
  g->peer_window = p2p_peer_window;
  if (p) {
    p->peer = (unsigned char **)calloc((size_t)W, sizeof *p->peer);
    p->opened = (unsigned char *)calloc((size_t)W, 1);
  }
  if (!p || !p->peer || !p->opened) {
    a2a->aborted = 1; /* destroy's barriers would meet the peers' allgathers of create */
    p2p_a2a_destroy(a2a);
    return mc_fail(a2a->err, MC_ERR_SYSTEM, "out of host memory");
  }
  /* this rank's window, zeroed (signals start at zero) before anyone can
   * have its handle, then exported */
  p2p_card_t mine;
  memset(&mine, 0, sizeof mine);
  mine.host = mc_host_id();
  mine.pid = (int32_t)getpid();
  cudaGetDevice(&mine.device);
  cudaError_t e = cudaMalloc((void **)&g->win, bytes);
  if (e == cudaSuccess) e = cudaMemset(g->win, 0, bytes);
  if (e == cudaSuccess) e = cudaDeviceSynchronize();
  if (e == cudaSuccess) e = cudaIpcGetMemHandle(&mine.ipc, g->win);
  mine.ok = e == cudaSuccess;
  mine.base = (uint64_t)(uintptr_t)g->win;
  char mine_why[120] = "", why[160];
  if (!mine.ok)
    snprintf(mine_why, sizeof mine_why, "allocating or exporting its window (%llu bytes): %s",
             (unsigned long long)bytes, cudaGetErrorString(e));
  /* all ranks fail together, each with the first failing rank's reason */
  int first_bad = -1, threads = 0;
  rc = p2p_agree(comm, a2a->err, &mine, mine_why, p->peer, p->opened, 0, &first_bad, &threads, why, sizeof why);
  if (rc == MC_SUCCESS && first_bad >= 0)
    rc = mc_fail(a2a->err, MC_ERR_UNSUPPORTED, "p2p: %s", why);
  if (rc == MC_SUCCESS) {
    e = cudaMalloc((void **)&p->table, sizeof(unsigned char *) * (size_t)W);
    if (e == cudaSuccess)
      e = cudaMemcpy(p->table, p->peer, sizeof(unsigned char *) * (size_t)W, cudaMemcpyHostToDevice);
    if (e != cudaSuccess) rc = cuda_fail(a2a, e, "the peer table");
  }
  g->peers = p->table;
  g->direct = 1; /* staging has no meaning here: there is nothing to put with */
  g->staged = 0;
  if (rc == MC_SUCCESS) rc = mc_gpu_decide_scope(a2a);
  if (rc == MC_SUCCESS) rc = mc_gpu_kernel_limits(a2a);
  if (rc != MC_SUCCESS) {
    a2a->aborted = 1; /* peers may have mapped this window: do not free it under them */
    p2p_a2a_destroy(a2a);
    return rc;
  }
  a2a->stats.buffer_bytes = bytes + mc_workspace_bytes(&a2a->shape);
  return MC_SUCCESS;
}

/* Auto's question at comm create: can every rank map every peer's memory
 * (every rank on one host)? Each rank exports a small buffer; p2p_agree
 * opens every peer's as a2a create would, closes them, and the ranks agree. */
static mc_result_t p2p_probe(mc_comm_t *comm, int *reachable, char *why, size_t why_n) {
  const int W = comm->world_size;
  *reachable = 0;
  p2p_card_t mine;
  memset(&mine, 0, sizeof mine);
  mine.host = mc_host_id();
  mine.pid = (int32_t)getpid();
  void *buf = NULL;
  cudaError_t e = comm->device >= 0 ? cudaSetDevice(comm->device) : cudaSuccess;
  if (e == cudaSuccess) e = cudaGetDevice(&mine.device);
  if (e == cudaSuccess) e = cudaMalloc(&buf, 256);
  if (e == cudaSuccess) e = cudaIpcGetMemHandle(&mine.ipc, buf);
  mine.ok = e == cudaSuccess;
  mine.base = (uint64_t)(uintptr_t)buf;
  char mine_why[120] = "";
  if (!mine.ok) snprintf(mine_why, sizeof mine_why, "cannot export device memory: %s", cudaGetErrorString(e));
  cudaGetLastError();
  unsigned char **peer = (unsigned char **)calloc((size_t)W, sizeof *peer);
  unsigned char *opened = (unsigned char *)calloc((size_t)W, 1);
  int first_bad = -1, threads = 0;
  mc_result_t rc = peer && opened
                       ? p2p_agree(comm, comm->err, &mine, mine_why, peer, opened, 1, &first_bad, &threads, why, why_n)
                       : mc_fail(comm->err, MC_ERR_SYSTEM, "out of host memory");
  if (rc == MC_SUCCESS) *reachable = first_bad < 0;
  /* every peer closed its mapping of buf before the verdicts */
  if (buf) cudaFree(buf);
  cudaGetLastError();
  free(peer);
  free(opened);
  return rc;
}

/* in the order of mc_transport_ops_t (designated initialisers are C++20) */
extern "C" const mc_transport_ops_t mc_p2p_ops = {
    MC_TRANSPORT_P2P, "p2p", mc_gpu_present, p2p_probe, p2p_comm_init, NULL, p2p_a2a_create, p2p_a2a_destroy,
    mc_gpu_dsend, mc_gpu_drecv, mc_gpu_csend, mc_gpu_crecv,
    mc_gpu_refresh_stats, mc_gpu_check, mc_gpu_barrier, NULL, mc_gpu_expert_load, mc_gpu_mask,
    mc_gpu_bench_floor, mc_gpu_dcounts,
};
