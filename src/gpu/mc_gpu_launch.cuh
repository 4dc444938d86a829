/* mc_gpu_launch.cuh - the host side of the four halves and the barrier,
 * shared by the GPU transports: included by each transport's .cu after
 * mc_gpu_kernels.cuh (whose kernels are static: each transport compiles
 * its own copy over its own device interface). Defines mc_gpu_dsend,
 * mc_gpu_drecv, mc_gpu_csend, mc_gpu_crecv and mc_gpu_barrier for the
 * transport's ops table. */
#ifndef MC_GPU_LAUNCH_CUH
#define MC_GPU_LAUNCH_CUH

static mc_gpu_t *gpu(mc_a2a_t *a2a) { return (mc_gpu_t *)a2a->impl; }

static mc_result_t cuda_fail(mc_a2a_t *a2a, cudaError_t e, const char *what) {
  return mc_fail(a2a->err, MC_ERR_CUDA, "rank %d: %s: %s", a2a->comm->rank, what, cudaGetErrorString(e));
}

/* Load every kernel of this transport now, at create. CUDA loads a kernel
 * lazily at its first launch (the default since CUDA 12.2), and loading may
 * wait for every kernel of the context to finish: with ranks that are
 * threads of one process, a first launch in one thread then waits for a
 * peer thread's receiver, which spins until this thread's kernel runs. EP8
 * as 8 threads on one H200 hung so until the comm timeout (2026-11-29,
 * sixth session). Reading a kernel's attributes loads it. Then raise the
 * prep kernel's shared-memory limit where the shape needs more than the
 * default 48 KB (near 4096 experts and 1024 ranks). */
static mc_result_t mc_gpu_kernel_limits(mc_a2a_t *a2a) {
  static const void *const all[] = {
      (const void *)mc_k_dispatch_prep,    (const void *)mc_k_dispatch_prep_fix, (const void *)mc_k_dispatch_pack,
      (const void *)mc_k_dispatch_send,    (const void *)mc_k_dispatch_recv,     (const void *)mc_k_combine_send,
      (const void *)mc_k_combine_recv,     (const void *)mc_k_barrier,           (const void *)mc_k_prewait,
      (const void *)mc_k_zc_dispatch_send, (const void *)mc_k_zc_dispatch_recv,  (const void *)mc_k_zc_combine_send,
      (const void *)mc_k_zc_combine_recv,  (const void *)mc_k_dispatch_fused};
  cudaError_t e = cudaSuccess;
  for (size_t i = 0; e == cudaSuccess && i < sizeof all / sizeof all[0]; i++) {
    struct cudaFuncAttributes attr;
    e = cudaFuncGetAttributes(&attr, all[i]);
  }
  if (e != cudaSuccess) return cuda_fail(a2a, e, "loading the kernels");
  if (mc_prep_smem_bytes(&a2a->shape) > (48u << 10))
    e = cudaFuncSetAttribute(mc_k_dispatch_prep, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             (int)mc_prep_smem_bytes(&a2a->shape));
  return e == cudaSuccess ? MC_SUCCESS : cuda_fail(a2a, e, "raising the prep kernel's shared memory");
}

/* Check what the device recorded, then launch one half's kernels on the
 * caller's stream; a launch error is a CUDA failure of this call. */
static mc_result_t run_half(mc_a2a_t *a2a, int half, const mc_dispatch_args_t *d, const mc_combine_args_t *c) {
  mc_kargs_t ka;
  mc_result_t rc = mc_gpu_prepare(a2a, &ka, d, c);
  if (rc != MC_SUCCESS) return rc;
  mc_gpu_t *g = gpu(a2a);
  cudaStream_t st = (cudaStream_t)(d ? d->stream : c->stream);
  switch (half) {
  case MC_PHASE_DSEND: {
    /* a prep block per chunk of the call's tokens; the fix only where there
     * are several chunks (bound_m may leave some empty: they count zero) */
    const int chunk = mc_prep_chunk(&a2a->shape), chunks = ka.m > chunk ? (ka.m + chunk - 1) / chunk : 1;
    if (g->fuse && !g->staged && !g->pull && mc_fused_fits(&a2a->shape, ka.m)) { /* one launch: mc_gpu_fused.cuh */
      mc_k_dispatch_fused<<<g->grid, MC_THREADS, mc_fused_smem_bytes(&a2a->shape, ka.zc == MC_ZC_DIRECT), st>>>(ka);
      break;
    }
    mc_k_dispatch_prep<<<chunks, MC_PREP_THREADS, mc_prep_smem_bytes(&a2a->shape), st>>>(ka);
    if (chunks > 1) mc_k_dispatch_prep_fix<<<g->grid, MC_PREP_THREADS, 0, st>>>(ka);
    if (ka.zc == MC_ZC_DIRECT) { /* registered expert buffers, stored into directly: mc_gpu_zc.cuh */
      mc_k_zc_dispatch_send<<<g->grid, MC_THREADS, mc_zc_send_smem_bytes(&a2a->shape), st>>>(ka);
      break;
    }
    if (g->staged || g->pull) mc_k_dispatch_pack<<<g->grid, MC_THREADS, 0, st>>>(ka);
    mc_k_dispatch_send<<<g->grid, MC_THREADS, mc_send_smem_bytes(&a2a->shape), st>>>(ka);
    break;
  }
  case MC_PHASE_DRECV:
    if (ka.zc == MC_ZC_DIRECT) { /* one block: nothing to copy */
      mc_k_zc_dispatch_recv<<<1, MC_THREADS, 0, st>>>(ka);
      break;
    }
    if (g->prewait & MC_PREWAIT_DRECV) mc_k_prewait<<<1, MC_THREADS, 0, st>>>(ka, MC_PHASE_DRECV); /* mc_gpu_prewait.cuh */
    mc_k_dispatch_recv<<<g->grid, MC_THREADS, mc_drecv_smem_bytes(&a2a->shape), st>>>(ka);
    break;
  case MC_PHASE_CSEND:
    if (ka.zc) mc_k_zc_combine_send<<<1, MC_THREADS, 0, st>>>(ka); /* registered: combine pulls */
    else mc_k_combine_send<<<2 * g->grid, MC_CSEND_THREADS, mc_send_smem_bytes(&a2a->shape), st>>>(ka);
    break;
  case MC_PHASE_CRECV:
    if ((g->prewait & MC_PREWAIT_CRECV) || ((g->prewait & MC_PREWAIT_ZC_CRECV) && ka.zc))
      mc_k_prewait<<<1, MC_THREADS, 0, st>>>(ka, MC_PHASE_CRECV);
    if (ka.zc) mc_k_zc_combine_recv<<<2 * g->zc_crecv_grid, MC_CSEND_THREADS, mc_zc_crecv_smem_bytes(&a2a->shape), st>>>(ka);
    else mc_k_combine_recv<<<g->grid, MC_THREADS, 0, st>>>(ka);
    break;
  }
  cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? MC_SUCCESS : cuda_fail(a2a, e, "kernel launch");
}

static mc_result_t mc_gpu_dsend(mc_a2a_t *a2a, const mc_dispatch_args_t *d) {
  return run_half(a2a, MC_PHASE_DSEND, d, NULL);
}
static mc_result_t mc_gpu_drecv(mc_a2a_t *a2a, const mc_dispatch_args_t *d) {
  return run_half(a2a, MC_PHASE_DRECV, d, NULL);
}
static mc_result_t mc_gpu_csend(mc_a2a_t *a2a, const mc_combine_args_t *c) {
  return run_half(a2a, MC_PHASE_CSEND, NULL, c);
}
static mc_result_t mc_gpu_crecv(mc_a2a_t *a2a, const mc_combine_args_t *c) {
  return run_half(a2a, MC_PHASE_CRECV, NULL, c);
}
static mc_result_t mc_gpu_barrier(mc_a2a_t *a2a, void *stream) {
  mc_kargs_t ka;
  mc_result_t rc = mc_gpu_prepare(a2a, &ka, NULL, NULL);
  if (rc != MC_SUCCESS) return rc;
  int threads = a2a->shape.world_size < MC_THREADS ? (a2a->shape.world_size + 31) / 32 * 32 : MC_THREADS;
  mc_k_barrier<<<1, threads, 0, (cudaStream_t)stream>>>(ka);
  cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? MC_SUCCESS : cuda_fail(a2a, e, "barrier kernel launch");
}

#endif
