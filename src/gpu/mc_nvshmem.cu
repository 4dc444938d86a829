/* mc_nvshmem.cu - the nvshmem transport: NVSHMEM's put-with-signal, signal
 * and a bounded poll under the shared GPU kernels, plus the host side
 * (NVSHMEM start-up over the communicator's allgather, the symmetric
 * window, launches, device error reporting). Every NVSHMEM call of moecomm
 * lives in this file; the rest of the library sees extern "C" functions.
 *
 * The kernels put only to symmetric addresses and never load or store a
 * peer's memory directly, so NVSHMEM's network transports (IBGDA, IBRC,
 * libfabric/EFA) carry them unchanged. */
#include <cuda_runtime.h>
#include <nvshmem.h>
#include <nvshmemx.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

extern "C" {
#include "mc_internal.h"
#include "mc_gpu_host.h"
}

/* ---- the device-side transport interface ---- */
static __device__ __forceinline__ void mc_t_put_signal_warp(const mc_kargs_t *a, uint64_t dst_off, const void *src,
                                                            uint64_t bytes, int slot, uint64_t value, int op, int pe) {
  uint64_t *sig = (uint64_t *)(a->win + mc_sig_off(&a->s, slot, a->rank));
  nvshmemx_putmem_signal_nbi_warp(a->win + dst_off, src, bytes, sig, value,
                                  op == MC_SIG_ADD ? NVSHMEM_SIGNAL_ADD : NVSHMEM_SIGNAL_SET, pe);
}
static __device__ __forceinline__ void mc_t_signal(const mc_kargs_t *a, int slot, uint64_t value, int op, int pe) {
  uint64_t *sig = (uint64_t *)(a->win + mc_sig_off(&a->s, slot, a->rank));
  nvshmemx_signal_op(sig, value, op == MC_SIG_ADD ? NVSHMEM_SIGNAL_ADD : NVSHMEM_SIGNAL_SET, pe);
}

static __device__ __forceinline__ unsigned char *mc_t_peer_window(const mc_kargs_t *a, int pe) {
  return a->direct ? (unsigned char *)nvshmem_ptr(a->win, pe) : NULL;
}

#include "mc_gpu_table.cuh"
#include "mc_gpu_launch.cuh"

/* ---- start-up ---- */

extern "C" mc_result_t mc_nvshmem_comm_init(mc_comm_t *comm) {
  if (comm->device >= 0 && cudaSetDevice(comm->device) != cudaSuccess)
    return mc_fail(comm->err, MC_ERR_CUDA, "rank %d: cudaSetDevice(%d) failed", comm->rank, comm->device);
  if (nvshmemx_init_status() >= NVSHMEM_STATUS_IS_INITIALIZED) {
    /* The application started NVSHMEM itself: attach if it agrees with us.
     * Attaching is one more (collective, counted) nvshmem_init, matched by
     * our nvshmem_finalize at destroy. Why at all: NVSHMEM's init lives in
     * the device library every CUDA module links (nvshmemi_init_thread is
     * in libnvshmem_device.a), so it sets up the device state of the module
     * that calls it; this library's kernels read this module's. (The
     * version without this call was never run: tests/test_gpu.c's attach
     * test came with it.) */
    if (nvshmem_my_pe() != comm->rank || nvshmem_n_pes() != comm->world_size)
      return mc_fail(comm->err, MC_ERR_INVALID_ARG,
                     "NVSHMEM is already initialised as PE %d of %d, but this communicator is rank %d of %d",
                     nvshmem_my_pe(), nvshmem_n_pes(), comm->rank, comm->world_size);
    nvshmem_init();
    comm->owns_nvshmem = 1;
    return MC_SUCCESS;
  }
  /* Unique-id bootstrap over the caller's allgather: rank 0 draws the id. */
  nvshmemx_uniqueid_t id, *all = (nvshmemx_uniqueid_t *)malloc(sizeof id * (size_t)comm->world_size);
  if (!all) return mc_fail(comm->err, MC_ERR_SYSTEM, "out of host memory");
  memset(&id, 0, sizeof id);
  if (comm->rank == 0 && nvshmemx_get_uniqueid(&id) != 0) {
    free(all);
    return mc_fail(comm->err, MC_ERR_NVSHMEM, "rank 0: nvshmemx_get_uniqueid failed");
  }
  mc_result_t rc = mc_comm_allgather(comm, &id, all, sizeof id);
  if (rc != MC_SUCCESS) {
    free(all);
    return rc;
  }
  id = all[0];
  free(all);
  nvshmemx_init_attr_t attr = NVSHMEMX_INIT_ATTR_INITIALIZER;
  if (nvshmemx_set_attr_uniqueid_args(comm->rank, comm->world_size, &id, &attr) != 0 ||
      nvshmemx_init_attr(NVSHMEMX_INIT_WITH_UNIQUEID, &attr) != 0)
    return mc_fail(comm->err, MC_ERR_NVSHMEM, "rank %d: NVSHMEM initialisation (unique id, %d PEs) failed",
                   comm->rank, comm->world_size);
  comm->owns_nvshmem = 1;
  return MC_SUCCESS;
}

extern "C" void mc_nvshmem_comm_fini(mc_comm_t *comm) {
  /* our init, started or attached, is matched here (an application's own
   * init stays: NVSHMEM counts them). nvshmem_finalize is collective: after
   * a peer failed it would wait for that peer forever, so then NVSHMEM is
   * left to process exit */
  if (comm->owns_nvshmem && !comm->peer_failed) nvshmem_finalize();
  comm->owns_nvshmem = 0;
}

/* ---- the a2a handle ---- */

static void nvshmem_a2a_destroy(mc_a2a_t *a2a) {
  mc_gpu_t *g = gpu(a2a);
  if (!g) return;
  cudaDeviceSynchronize();
  /* nvshmem_free is collective: every rank destroys its handle. After a
   * timeout the peers are out of step (one may be dead), and a masked rank
   * may be dead: it would never return. The window is then leaked, not
   * freed, and the comm remembers (no nvshmem_finalize either). */
  if (a2a->aborted || a2a->any_masked) a2a->comm->peer_failed = 1;
  else if (g->win) nvshmem_free(g->win);
  mc_gpu_free(g);
  a2a->impl = NULL;
}

/* rank r's window where this process may copy from it (NVLink), else NULL */
static unsigned char *nvshmem_peer_window(mc_a2a_t *a2a, int r) {
  return (unsigned char *)nvshmem_ptr(gpu(a2a)->win, r);
}

static mc_result_t nvshmem_a2a_create(mc_a2a_t *a2a) {
  mc_result_t rc = mc_gpu_create(a2a);
  if (rc != MC_SUCCESS) return rc;
  mc_gpu_t *g = gpu(a2a);
  g->win = (unsigned char *)nvshmem_malloc(mc_window_bytes(&a2a->shape));
  g->peer_window = nvshmem_peer_window;
  if (!g->win) {
    nvshmem_a2a_destroy(a2a);
    return mc_fail(a2a->err, MC_ERR_NVSHMEM,
                   "rank %d: nvshmem_malloc(%llu) failed: raise NVSHMEM_SYMMETRIC_SIZE", a2a->comm->rank,
                   (unsigned long long)mc_window_bytes(&a2a->shape));
  }
  /* signals start at zero on every rank before anyone can signal */
  cudaError_t e = cudaMemset(g->win, 0, mc_window_bytes(&a2a->shape));
  if (e == cudaSuccess) e = cudaDeviceSynchronize();
  if (e != cudaSuccess) {
    nvshmem_a2a_destroy(a2a);
    return cuda_fail(a2a, e, "clearing the window");
  }
  nvshmem_barrier_all();
  /* peers reached only through puts need records staged first */
  for (int pe = 0; pe < a2a->comm->world_size; pe++)
    if (!g->direct || !nvshmem_ptr(g->win, pe)) g->staged = 1;
  rc = mc_gpu_decide_scope(a2a);
  if (rc == MC_SUCCESS) rc = mc_gpu_kernel_limits(a2a);
  if (rc != MC_SUCCESS) {
    nvshmem_a2a_destroy(a2a);
    return rc;
  }
  a2a->stats.buffer_bytes = mc_window_bytes(&a2a->shape) + mc_workspace_bytes(&a2a->shape);
  return MC_SUCCESS;
}

/* Auto's question: NVSHMEM reaches peers anywhere, but takes one PE per
 * process: ranks that are threads of one process cannot use it. */
static mc_result_t nvshmem_probe(mc_comm_t *comm, int *reachable, char *why, size_t why_n) {
  struct { uint64_t host; int64_t pid; } mine = {mc_host_id(), (int64_t)getpid()};
  const int W = comm->world_size;
  void *all = malloc(sizeof mine * (size_t)W);
  if (!all) return mc_fail(comm->err, MC_ERR_SYSTEM, "out of host memory");
  mc_result_t rc = mc_comm_allgather(comm, &mine, all, sizeof mine);
  *reachable = rc == MC_SUCCESS;
  for (int r = 0; rc == MC_SUCCESS && r < W && *reachable; r++)
    if (r != comm->rank && memcmp((char *)all + r * sizeof mine, &mine, sizeof mine) == 0) {
      *reachable = 0;
      snprintf(why, why_n, "ranks %d and %d are threads of one process (NVSHMEM takes one PE per process)",
               r < comm->rank ? r : comm->rank, r < comm->rank ? comm->rank : r);
    }
  free(all);
  return rc;
}

extern "C" mc_result_t mc_nvshmem_dense_alltoall(mc_comm_t *comm, size_t bytes_per_peer, int iters, int warmup,
                                                 float *times_us);

/* in the order of mc_transport_ops_t (designated initialisers are C++20) */
extern "C" const mc_transport_ops_t mc_nvshmem_ops = {
    MC_TRANSPORT_NVSHMEM, "nvshmem", mc_gpu_present, nvshmem_probe, mc_nvshmem_comm_init, mc_nvshmem_comm_fini,
    nvshmem_a2a_create, nvshmem_a2a_destroy,
    mc_gpu_dsend, mc_gpu_drecv, mc_gpu_csend, mc_gpu_crecv,
    mc_gpu_refresh_stats, mc_gpu_check, mc_gpu_barrier, mc_nvshmem_dense_alltoall, mc_gpu_expert_load, mc_gpu_mask,
    mc_gpu_bench_floor, mc_gpu_dcounts,
};

/* ---- the dense baseline: NVSHMEM's own all-to-all of padded blocks ---- */

extern "C" mc_result_t mc_nvshmem_dense_alltoall(mc_comm_t *comm, size_t bytes_per_peer, int iters, int warmup,
                                                 float *times_us) {
  size_t total = bytes_per_peer * (size_t)comm->world_size;
  void *src = nvshmem_malloc(total), *dst = nvshmem_malloc(total);
  if (!src || !dst) {
    if (src) nvshmem_free(src);
    if (dst) nvshmem_free(dst);
    return mc_fail(comm->err, MC_ERR_NVSHMEM, "nvshmem_malloc of 2 x %zu bytes failed (NVSHMEM_SYMMETRIC_SIZE)", total);
  }
  cudaMemset(src, 0x5a, total);
  cudaMemset(dst, 0, total);
  cudaStream_t st;
  cudaEvent_t e0, e1;
  cudaStreamCreate(&st);
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  mc_result_t rc = MC_SUCCESS;
  for (int i = 0; i < warmup + iters && rc == MC_SUCCESS; i++) {
    nvshmemx_barrier_all_on_stream(st);
    cudaEventRecord(e0, st);
    if (nvshmemx_alltoallmem_on_stream(NVSHMEM_TEAM_WORLD, dst, src, bytes_per_peer, st) != 0)
      rc = mc_fail(comm->err, MC_ERR_NVSHMEM, "nvshmemx_alltoallmem_on_stream failed");
    cudaEventRecord(e1, st);
    cudaEventSynchronize(e1);
    if (i >= warmup) cudaEventElapsedTime(&times_us[i - warmup], e0, e1), times_us[i - warmup] *= 1000.0f;
  }
  cudaStreamSynchronize(st);
  /* When MPS shares on the GPU add up past 100% (8 ranks at 13%) NVSHMEM
   * runs in "limited MPG" mode: it prints "not supported" for this call,
   * returns success, and the events see no time pass. So a baseline counts
   * only with a time for every iteration and every peer's block arrived. */
  for (int i = 0; rc == MC_SUCCESS && i < iters; i++)
    if (!(times_us[i] > 0.0f))
      rc = mc_fail(comm->err, MC_ERR_NVSHMEM,
                   "nvshmemx_alltoallmem_on_stream took no measurable time (MPS shares past 100%% of the GPU: "
                   "NVSHMEM's limited MPG mode)");
  for (int p = 0; rc == MC_SUCCESS && p < comm->world_size; p++) {
    unsigned char got[16] = {0}, want[16];
    const size_t n = bytes_per_peer < sizeof got ? bytes_per_peer : sizeof got;
    memset(want, 0x5a, sizeof want);
    if (cudaMemcpy(got, (unsigned char *)dst + (size_t)p * bytes_per_peer, n, cudaMemcpyDeviceToHost) != cudaSuccess ||
        memcmp(got, want, n) != 0)
      rc = mc_fail(comm->err, MC_ERR_NVSHMEM,
                   "nvshmemx_alltoallmem_on_stream moved nothing from rank %d (MPS shares past 100%% of the GPU: "
                   "NVSHMEM's limited MPG mode runs no collectives)", p);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaStreamDestroy(st);
  nvshmem_free(src);
  nvshmem_free(dst);
  return rc;
}
