/* mc_ref_dev.c - host or device buffers for the harness (see mc_ref_dev.h). */
#include "mc_ref_dev.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mc_quant.h"

#ifdef MC_REF_CUDA
#include <cuda_runtime_api.h>
static _Thread_local cudaEvent_t marks[MC_DEV_MARKS]; /* per rank: ranks may be threads */
static _Thread_local int marks_made;
#endif
static _Thread_local double host_marks[MC_DEV_MARKS]; /* per rank: ranks may be threads */

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

int mc_dev_have_cuda(void) {
#ifdef MC_REF_CUDA
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
#else
  return 0;
#endif
}

int mc_dev_mem_info(uint64_t *free_bytes, int *devices) {
#ifdef MC_REF_CUDA
  int n = 0;
  size_t fr = 0, total = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n < 1 || cudaSetDevice(0) != cudaSuccess ||
      cudaMemGetInfo(&fr, &total) != cudaSuccess)
    return -1;
  *free_bytes = fr;
  *devices = n;
  return 0;
#else
  (void)free_bytes, (void)devices;
  return -1;
#endif
}

int mc_dev_select(int rank) {
#ifdef MC_REF_CUDA
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n < 1) return -1;
  int d = rank % n;
  return cudaSetDevice(d) == cudaSuccess ? d : -1;
#else
  (void)rank;
  return -1;
#endif
}

void *mc_dev_alloc(int gpu, size_t n) {
  size_t sz = (n + 63) / 64 * 64 + 64;
#ifdef MC_REF_CUDA
  if (gpu) {
    void *p = NULL;
    return cudaMalloc(&p, sz) == cudaSuccess ? p : NULL;
  }
#endif
  (void)gpu;
  return aligned_alloc(64, sz);
}

void mc_dev_free(int gpu, void *p) {
  if (!p) return;
#ifdef MC_REF_CUDA
  if (gpu) {
    cudaFree(p);
    return;
  }
#endif
  (void)gpu;
  free(p);
}

/* Every device call of the harness goes to the calling thread's default
 * stream (cudaStreamPerThread), never the legacy stream 0: when ranks are
 * threads of one process on one GPU, work on stream 0 (or a device-wide
 * synchronisation) waits for the other ranks' kernels, whose receivers wait
 * for this rank's next send: a hang. As processes it changes nothing. */
void *mc_dev_stream(void) {
#ifdef MC_REF_CUDA
  return (void *)cudaStreamPerThread;
#else
  return NULL;
#endif
}

#ifdef MC_REF_CUDA
static int copy_sync(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind) {
  return cudaMemcpyAsync(dst, src, n, kind, cudaStreamPerThread) != cudaSuccess ||
         cudaStreamSynchronize(cudaStreamPerThread) != cudaSuccess;
}
#endif

/* to_dev: host to device, else device to host (both host memory without a GPU) */
static int dev_copy(int gpu, void *dst, const void *src, size_t n, int to_dev) {
  if (dst == src || n == 0) return 0;
#ifdef MC_REF_CUDA
  if (gpu) return copy_sync(dst, src, n, to_dev ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost);
#endif
  (void)gpu, (void)to_dev;
  memcpy(dst, src, n);
  return 0;
}
int mc_dev_put(int gpu, void *dst, const void *src, size_t n) { return dev_copy(gpu, dst, src, n, 1); }
int mc_dev_get(int gpu, void *dst, const void *src, size_t n) { return dev_copy(gpu, dst, src, n, 0); }

int mc_dev_fill(int gpu, void *p, int byte, size_t n) {
#ifdef MC_REF_CUDA
  if (gpu) return cudaMemsetAsync(p, byte, n, cudaStreamPerThread) != cudaSuccess;
#endif
  (void)gpu;
  memset(p, byte, n);
  return 0;
}

int mc_dev_sync(int gpu) {
#ifdef MC_REF_CUDA
  if (gpu) return cudaStreamSynchronize(cudaStreamPerThread) != cudaSuccess;
#endif
  (void)gpu;
  return 0;
}

static _Thread_local volatile double sink_;
#ifdef MC_REF_CUDA
int mc_ref_quantise_on_gpu(const void *x, int m, int hidden, int ue8m0, void *q, void *scales, void *stream);
#endif

int mc_dev_quantise(int gpu, const void *x, int m, int hidden, int ue8m0, void *q, void *scales) {
#ifdef MC_REF_CUDA
  if (gpu) return mc_ref_quantise_on_gpu(x, m, hidden, ue8m0, q, scales, cudaStreamPerThread);
#endif
  (void)gpu;
  mc_quant_blocks(x, (size_t)m * (size_t)(hidden / MC_QBLOCK), ue8m0, q, scales); /* rows one after another */
  return 0;
}

void mc_dev_busy(int gpu, void *scratch, size_t n) {
#ifdef MC_REF_CUDA
  if (gpu) { /* a few passes over a scratch buffer, queued on the stream */
    for (int i = 0; i < 4; i++) cudaMemsetAsync(scratch, i, n, cudaStreamPerThread);
    return;
  }
#endif
  (void)gpu, (void)scratch, (void)n;
  double a = 0;
  for (int i = 0; i < 20000; i++) a += (double)i * 1e-9;
  sink_ = a;
}

void mc_dev_mark(int gpu, int k) {
#ifdef MC_REF_CUDA
  if (gpu) {
    if (!marks_made) {
      for (int i = 0; i < MC_DEV_MARKS; i++) cudaEventCreate(&marks[i]);
      marks_made = 1;
    }
    cudaEventRecord(marks[k], cudaStreamPerThread);
    return;
  }
#endif
  (void)gpu;
  host_marks[k] = now_us();
}

void mc_dev_mark_on(void *stream, int k) {
#ifdef MC_REF_CUDA
  if (!marks_made) {
    for (int i = 0; i < MC_DEV_MARKS; i++) cudaEventCreate(&marks[i]);
    marks_made = 1;
  }
  cudaEventRecordWithFlags(marks[k], (cudaStream_t)stream, cudaEventRecordExternal);
#else
  (void)stream, (void)k;
#endif
}

double mc_dev_elapsed_us(int gpu, int k0, int k1) {
#ifdef MC_REF_CUDA
  if (gpu) {
    float ms = 0;
    cudaEventElapsedTime(&ms, marks[k0], marks[k1]);
    return (double)ms * 1000.0;
  }
#endif
  (void)gpu;
  return host_marks[k1] - host_marks[k0];
}

int mc_dev_graph_capture(mc_dev_body_fn body, void *arg, void **graph_exec, void **stream) {
#ifdef MC_REF_CUDA
  cudaStream_t st;
  cudaGraph_t g;
  cudaGraphExec_t ge;
  if (cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking) != cudaSuccess) return 1;
  if (cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal) != cudaSuccess) return 1;
  int brc = body((void *)st, arg);
  if (cudaStreamEndCapture(st, &g) != cudaSuccess || brc != 0) return 1;
  if (cudaGraphInstantiate(&ge, g, 0) != cudaSuccess) return 1;
  cudaGraphDestroy(g);
  *graph_exec = (void *)ge;
  *stream = (void *)st;
  return 0;
#else
  (void)body, (void)arg, (void)graph_exec, (void)stream;
  return 1;
#endif
}

int mc_dev_copy_async(void *dst, const void *src, size_t n, void *stream) {
#ifdef MC_REF_CUDA
  return cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, (cudaStream_t)stream) != cudaSuccess;
#else
  (void)dst, (void)src, (void)n, (void)stream;
  return 1;
#endif
}

int mc_dev_graph_launch(void *graph_exec, void *stream) {
#ifdef MC_REF_CUDA
  return cudaGraphLaunch((cudaGraphExec_t)graph_exec, (cudaStream_t)stream) != cudaSuccess ||
         cudaStreamSynchronize((cudaStream_t)stream) != cudaSuccess;
#else
  (void)graph_exec, (void)stream;
  return 1;
#endif
}

void mc_dev_graph_free(void *graph_exec, void *stream) {
#ifdef MC_REF_CUDA
  if (graph_exec) cudaGraphExecDestroy((cudaGraphExec_t)graph_exec);
  if (stream) cudaStreamDestroy((cudaStream_t)stream);
#else
  (void)graph_exec, (void)stream;
#endif
}
