/* mc_bench_nccl.c - see mc_bench_nccl.h. Built only with MC_BENCH_NCCL; the
 * library itself never links NCCL. */
#include "mc_bench_nccl.h"

#include <stdio.h>
#include <stdlib.h>

#ifdef MC_BENCH_NCCL
#include <cuda_runtime_api.h>
#include <nccl.h>

int mc_bench_have_nccl(void) { return 1; }

static int oob_barrier(const mc_oob_t *oob) {
  int one = 1, *all = malloc(sizeof(int) * (size_t)oob->world_size);
  int rc = all ? oob->allgather(&one, all, sizeof one, oob->user) : -1;
  free(all);
  return rc;
}

#define NCCL_TRY(call)                                                                             \
  do {                                                                                             \
    ncclResult_t r_ = (call);                                                                      \
    if (r_ != ncclSuccess) {                                                                       \
      fprintf(stderr, "rank %d: %s: %s\n", oob->rank, #call, ncclGetErrorString(r_));             \
      goto out;                                                                                    \
    }                                                                                              \
  } while (0)

int mc_bench_nccl_alltoall(const mc_oob_t *oob, size_t bytes_per_peer, int warmup, int iters, float *times_us) {
  const int W = oob->world_size;
  int rc = -1;
  ncclComm_t nc = NULL;
  char *src = NULL, *dst = NULL;
  cudaStream_t st = NULL;
  cudaEvent_t e0 = NULL, e1 = NULL;
  ncclUniqueId id, *ids = malloc(sizeof id * (size_t)W);
  if (!ids) return -1;
  if (oob->rank == 0 && ncclGetUniqueId(&id) != ncclSuccess) {
    fprintf(stderr, "rank 0: ncclGetUniqueId failed\n");
    /* still take part in the exchange so the others fail instead of waiting */
  }
  if (oob->allgather(&id, ids, sizeof id, oob->user) != 0) goto out;
  NCCL_TRY(ncclCommInitRank(&nc, W, ids[0], oob->rank));
  if (cudaMalloc((void **)&src, bytes_per_peer * (size_t)W) != cudaSuccess ||
      cudaMalloc((void **)&dst, bytes_per_peer * (size_t)W) != cudaSuccess || cudaStreamCreate(&st) != cudaSuccess ||
      cudaEventCreate(&e0) != cudaSuccess || cudaEventCreate(&e1) != cudaSuccess) {
    fprintf(stderr, "rank %d: CUDA allocation for the NCCL baseline failed\n", oob->rank);
    goto out;
  }
  cudaMemset(src, 0x5a, bytes_per_peer * (size_t)W);
  for (int i = 0; i < warmup + iters; i++) {
    cudaStreamSynchronize(st);
    if (oob_barrier(oob) != 0) goto out;
    cudaEventRecord(e0, st);
    NCCL_TRY(ncclGroupStart());
    for (int p = 0; p < W; p++) {
      NCCL_TRY(ncclSend(src + (size_t)p * bytes_per_peer, bytes_per_peer, ncclChar, p, nc, st));
      NCCL_TRY(ncclRecv(dst + (size_t)p * bytes_per_peer, bytes_per_peer, ncclChar, p, nc, st));
    }
    NCCL_TRY(ncclGroupEnd());
    cudaEventRecord(e1, st);
    cudaEventSynchronize(e1);
    if (i >= warmup) {
      float ms = 0;
      cudaEventElapsedTime(&ms, e0, e1);
      times_us[i - warmup] = ms * 1000.0f;
    }
  }
  rc = 0;
out:
  if (st) cudaStreamSynchronize(st);
  if (nc) ncclCommDestroy(nc);
  if (e0) cudaEventDestroy(e0);
  if (e1) cudaEventDestroy(e1);
  if (st) cudaStreamDestroy(st);
  cudaFree(src);
  cudaFree(dst);
  free(ids);
  return rc;
}
#else
int mc_bench_have_nccl(void) { return 0; }
int mc_bench_nccl_alltoall(const mc_oob_t *oob, size_t bytes_per_peer, int warmup, int iters, float *times_us) {
  (void)oob, (void)bytes_per_peer, (void)warmup, (void)iters, (void)times_us;
  fprintf(stderr, "mc-bench was built without NCCL\n");
  return -1;
}
#endif
