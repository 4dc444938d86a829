/* mc_gpu_launch.cuh - the host side of the four halves and the barrier,
 * shared by the GPU transports: included by each transport's .cu after
 * mc_gpu_table.cuh (whose kernels are static: each transport compiles
 * its own copy over its own device interface). Defines mc_gpu_dsend,
 * mc_gpu_drecv, mc_gpu_csend, mc_gpu_crecv and mc_gpu_barrier for the
 * transport's ops table. */
#ifndef MC_GPU_LAUNCH_CUH
#define MC_GPU_LAUNCH_CUH

#include "mc_gpu_table.cuh"

static mc_gpu_t *gpu(mc_a2a_t *a2a) { return (mc_gpu_t *)a2a->impl; }

static mc_result_t cuda_fail(mc_a2a_t *a2a, cudaError_t e, const char *what) {
  return mc_fail(a2a->err, MC_ERR_CUDA, "rank %d: %s: %s", a2a->comm->rank, what, cudaGetErrorString(e));
}

/* Load every kernel of this transport now, at create. CUDA loads a kernel
 * lazily at its first launch (the default since CUDA 12.2), and loading may
 * wait for every kernel of the context to finish: with ranks that are
 * threads of one process, a first launch in one thread then waits for a
 * peer thread's receiver, which spins until this thread's kernel runs, and
 * both hang until the timeout. Reading a kernel's
 * attributes loads it. Then raise the shared-memory limits where the shape
 * needs more than the default 48 KB, and decide whether dispatch-send may
 * run as one kernel. */
static mc_result_t mc_gpu_kernel_limits(mc_a2a_t *a2a) {
  mc_gpu_t *g = gpu(a2a);
  const mc_shape_t *s = &a2a->shape;
  cudaError_t e = cudaSuccess;
  for (int i = 0; e == cudaSuccess && i < mc_kernel_nrows; i++) {
    struct cudaFuncAttributes attr;
    e = cudaFuncGetAttributes(&attr, mc_kernel_rows[i].fn);
  }
  if (e != cudaSuccess) return cuda_fail(a2a, e, "loading the kernels");
  int dev = 0, optin = 48 << 10;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
  /* each role's kernel for this handle, from the table (mc_gpu_table.cuh) */
  const int quant = a2a->cfg.dispatch_input == MC_INPUT_BF16_TO_E4M3;
  for (int r = 0; r < MC_KR_COUNT; r++)
    for (int m = 0; m < 2; m++)
      g->kern[r][m] = r == MC_KR_ONLY ? NULL
                                      : mc_kernel_pick(r, m, quant, s->topk, (int)a2a->cfg.combine_in_dtype,
                                                       (int)a2a->cfg.combine_out_dtype);
  for (int m = 0; m < 2 && mc_prep_smem_bytes(s) > (48u << 10) && e == cudaSuccess; m++)
    e = cudaFuncSetAttribute(g->kern[MC_KR_PREP][m], cudaFuncAttributeMaxDynamicSharedMemorySize,
                             (int)mc_prep_smem_bytes(s));
  if (e != cudaSuccess) return cuda_fail(a2a, e, "raising the prep kernel's shared memory");
  g->one = !g->staged && mc_one_smem_bytes(s) <= (size_t)optin;
  if (g->one && mc_one_smem_bytes(s) > (48u << 10)) {
    e = cudaFuncSetAttribute(g->kern[MC_KR_SEND_ONE][0], cudaFuncAttributeMaxDynamicSharedMemorySize,
                             (int)mc_one_smem_bytes(s));
    if (e == cudaSuccess) /* the launch floor's empty sender takes the same (mc_gpu_bench_floor) */
      e = cudaFuncSetAttribute(mc_k_floor_send, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)mc_one_smem_bytes(s));
  }
  if (e != cudaSuccess) return cuda_fail(a2a, e, "raising the dispatch kernel's shared memory");
  const size_t psmem = mc_packed_smem_bytes(s); /* the packed layouts' receiving kernels (mc_gpu_packed.cuh) */
  if (mc_packed_layout(s) && psmem > (size_t)optin)
    return mc_fail(a2a->err, MC_ERR_UNSUPPORTED,
                   "the packed layouts on a GPU need %zu bytes of shared memory a block for %d ranks and %d local "
                   "experts, more than the %d this GPU has",
                   psmem, s->world_size, mc_num_local_experts(s), optin);
  const void *const packed[] = {g->kern[MC_KR_DRECV_PACKED][0], g->kern[MC_KR_DRECV_PACKED][1],
                                (const void *)mc_k_dispatch_counts};
  for (size_t i = 0; mc_packed_layout(s) && psmem > (48u << 10) && e == cudaSuccess && i < 3; i++)
    e = cudaFuncSetAttribute(packed[i], cudaFuncAttributeMaxDynamicSharedMemorySize, (int)psmem);
  if (e != cudaSuccess) return cuda_fail(a2a, e, "raising the packed layouts' shared memory");
  int cc = 0;
  cudaDeviceGetAttribute(&cc, cudaDevAttrComputeCapabilityMajor, dev);
  g->pdl = g->alone && cc >= 9;
  if (mc_verbose() && a2a->comm->rank == 0)
    fprintf(stderr, "moecomm: dispatch-send in one launch up to %d tokens: %s; receivers launched early: %s\n",
            mc_prep_chunk(s), g->one ? "yes" : "no (a peer reached by puts)", g->pdl ? "yes" : "no");
  return MC_SUCCESS;
}

/* How one kernel of a half is launched. The halves (run_half) and the
 * launch floor (mc_gpu_bench_floor) both take it from the plans below, so
 * the floor's empty kernels are launched exactly as the phase's are. */
typedef struct mc_launch {
  int grid, threads;
  size_t smem;
  int early; /* a receiving kernel: launched as a programmatic dependent where g->pdl */
} mc_launch_t;

/* Dispatch-send runs as one kernel where the call's tokens fit one prep
 * chunk, no rank is masked and every peer is mapped. */
static int dsend_one(const mc_gpu_t *g, const mc_shape_t *s, int m, int masked) {
  return g->one && !masked && m <= mc_prep_chunk(s);
}
/* dispatch-send's sending kernel: the one-launch kernel on the blocks the
 * most tokens a call may pass need (mc_one_blocks; a call given fewer
 * through bound_m leaves the rest at once), or the chunked path's send kernel.
 * Never launched early: its metas, stored without a release, must follow the
 * end of the combine-recv before it (mc_gpu_kernels.cuh). */
static mc_launch_t plan_dsend(const mc_gpu_t *g, const mc_shape_t *s, int m, int quant, int masked) {
  if (dsend_one(g, s, m, masked)) return mc_launch_t{mc_one_blocks(s, m, quant, g->grid), MC_THREADS, mc_one_smem_bytes(s), 0};
  return mc_launch_t{g->grid, MC_THREADS, mc_send_smem_bytes(s), 0};
}
/* A decode batch on a GPU of its own (calls of up to one prep chunk, m the
 * host's count: with bound_m, the most a call may pass): the receiving
 * kernels on half the SMs, combine-send on one block per SM. A receiving
 * kernel lasts as long as its slowest block, whose fixed steps (the metas
 * or rows awaited) every block repeats, and blocks wait for SMs that
 * sending blocks still hold; a decode batch's records and rows keep far
 * fewer warps busy than the whole grid holds.
 * Elsewhere (ranks sharing a GPU, large batches) the grid is the big
 * kernels' (mc_gpu_host.c). */
static int decode_batch(const mc_gpu_t *g, const mc_shape_t *s, int m) { return g->alone && m <= mc_prep_chunk(s); }
static mc_launch_t plan_drecv(const mc_gpu_t *g, const mc_shape_t *s, int m) {
  const size_t smem = mc_packed_layout(s) ? mc_packed_smem_bytes(s) : mc_drecv_smem_bytes(s);
  return mc_launch_t{decode_batch(g, s, m) ? (g->grid + 1) / 2 : g->grid, MC_THREADS, smem, 1};
}
static mc_launch_t plan_csend(const mc_gpu_t *g, const mc_shape_t *s, int m) {
  return mc_launch_t{decode_batch(g, s, m) ? g->grid : 2 * g->grid, MC_CSEND_THREADS, mc_send_smem_bytes(s), 0};
}
static mc_launch_t plan_crecv(const mc_gpu_t *g, const mc_shape_t *s, int m) {
  return mc_launch_t{decode_batch(g, s, m) ? (g->grid + 1) / 2 : g->grid, MC_THREADS, 0, 1};
}

/* Launch fn as planned. A receiving kernel, with g->pdl, is a programmatic
 * dependent of the kernel before it on the stream (mc_pdl_wait, mc_dev.cuh);
 * only where this rank has its GPU alone: ranks sharing a GPU would hold SMs
 * with waiting blocks that another rank's sender needs. */
static cudaError_t launch(const mc_gpu_t *g, const void *fn, mc_launch_t l, cudaStream_t st, mc_kargs_t *ka) {
  cudaLaunchConfig_t cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.gridDim = dim3(l.grid);
  cfg.blockDim = dim3(l.threads);
  cfg.dynamicSmemBytes = l.smem;
  cfg.stream = st;
  cudaLaunchAttribute at[1];
  at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  at[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = at;
  cfg.numAttrs = l.early && g->pdl ? 1 : 0;
  void *args[] = {ka};
  return cudaLaunchKernelExC(&cfg, fn, args);
}

/* Check what the device recorded, then launch one half's kernels on the
 * caller's stream; a launch error is a CUDA failure of this call. */
static mc_result_t run_half(mc_a2a_t *a2a, int half, const mc_dispatch_args_t *d, const mc_combine_args_t *c) {
  mc_kargs_t ka;
  mc_result_t rc = mc_gpu_prepare(a2a, &ka, d, c);
  if (rc != MC_SUCCESS) return rc;
  mc_gpu_t *g = gpu(a2a);
  const mc_shape_t *s = &a2a->shape;
  cudaStream_t st = (cudaStream_t)(d ? d->stream : c->stream);
  cudaError_t e = cudaSuccess;
  /* with a rank masked, kernels compiled to skip it (mc_masked, mc_dev.cuh);
   * the others hold no trace of the mask. Dispatch-send is then chunked. */
  const int masked = ka.mask != NULL;
  switch (half) {
  case MC_PHASE_DSEND: {
    if (g->drop_ack) { /* a drop reported: dispatch-sends launched from now on go out */
      mc_k_drop_ack<<<1, 1, 0, st>>>(ka);
      g->drop_ack = 0;
    }
    if (g->recv_owed) {
      mc_k_drecv_skip<<<1, 1, 0, st>>>(ka);
      g->recv_owed = 0;
    }
    const mc_launch_t l = plan_dsend(g, s, ka.m, ka.quant, masked);
    if (dsend_one(g, s, ka.m, masked)) { /* one launch, the kernel of this top-k */
      e = launch(g, g->kern[MC_KR_SEND_ONE][0], l, st, &ka);
      break;
    }
    /* chunked: a prep block per chunk of the call's tokens; the fix only where there are several */
    const int chunk = mc_prep_chunk(s), chunks = ka.m > chunk ? (ka.m + chunk - 1) / chunk : 1;
    e = launch(g, g->kern[MC_KR_PREP][masked], mc_launch_t{chunks, MC_PREP_THREADS, mc_prep_smem_bytes(s), 0}, st,
               &ka);
    if (e != cudaSuccess) break;
    if (chunks > 1) mc_k_dispatch_prep_fix<<<g->grid, MC_PREP_THREADS, 0, st>>>(ka);
    if (g->staged) mc_k_dispatch_pack<<<g->grid, MC_THREADS, 0, st>>>(ka);
    e = launch(g, g->kern[MC_KR_SEND][masked], l, st, &ka);
    break;
  }
  case MC_PHASE_DRECV: {
    e = launch(g, g->kern[mc_packed_layout(s) ? MC_KR_DRECV_PACKED : MC_KR_DRECV][masked], plan_drecv(g, s, ka.m), st,
               &ka);
    break;
  }
  case MC_PHASE_CSEND:
    e = launch(g, g->kern[MC_KR_CSEND][masked], plan_csend(g, s, a2a->round_m), st, &ka);
    break;
  case MC_PHASE_CRECV:
    e = launch(g, g->kern[MC_KR_CRECV][masked], plan_crecv(g, s, a2a->round_m), st, &ka);
    break;
  }
  if (e == cudaSuccess) e = cudaGetLastError();
  else (void)cudaGetLastError(); /* a failed launch's error is this call's, not the next one's */
  return e == cudaSuccess ? MC_SUCCESS : cuda_fail(a2a, e, "kernel launch");
}

/* mc_a2a_bench_floor: the phase's sending and receiving kernels' plans,
 * for two empty kernels (mc_k_floor_send, mc_k_floor_recv) given the same
 * argument block; the round is not touched. */
static mc_result_t mc_gpu_bench_floor(mc_a2a_t *a2a, int combine, int m, unsigned int flags, void *stream) {
  mc_kargs_t ka;
  mc_result_t rc = mc_gpu_prepare(a2a, &ka, NULL, NULL);
  if (rc != MC_SUCCESS) return rc;
  mc_gpu_t *g = gpu(a2a);
  const mc_shape_t *s = &a2a->shape;
  cudaStream_t st = (cudaStream_t)stream;
  const int masked = ka.mask != NULL;
  cudaError_t e = cudaSuccess;
  if (flags & MC_SEND)
    e = launch(g, (const void *)mc_k_floor_send, combine ? plan_csend(g, s, m) : plan_dsend(g, s, m, ka.quant, masked), st,
               &ka);
  if (e == cudaSuccess && (flags & MC_RECV))
    e = launch(g, (const void *)mc_k_floor_recv, combine ? plan_crecv(g, s, m) : plan_drecv(g, s, m), st, &ka);
  if (e == cudaSuccess) e = cudaGetLastError();
  return e == cudaSuccess ? MC_SUCCESS : cuda_fail(a2a, e, "mc_a2a_bench_floor: kernel launch");
}

/* mc_dispatch_counts: one block on the caller's stream, then the stream
 * synchronised and the host-mapped results read (mc_k_dispatch_counts). */
static mc_result_t mc_gpu_dcounts(mc_a2a_t *a2a, int64_t *rows, int32_t *expert_count, void *stream) {
  mc_kargs_t ka;
  mc_result_t rc = mc_gpu_prepare(a2a, &ka, NULL, NULL);
  if (rc != MC_SUCCESS) return rc;
  mc_gpu_t *g = gpu(a2a);
  const mc_shape_t *s = &a2a->shape;
  const int L = mc_num_local_experts(s);
  ka.rows_out = g->counts_d;
  ka.expert_count = (int32_t *)(g->counts_d + 1);
  mc_k_dispatch_counts<<<1, MC_THREADS, mc_packed_smem_bytes(s), (cudaStream_t)stream>>>(ka);
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) e = cudaStreamSynchronize((cudaStream_t)stream);
  if (e != cudaSuccess) return cuda_fail(a2a, e, "mc_dispatch_counts");
  if ((rc = mc_gpu_failure(a2a)) != MC_SUCCESS) return rc; /* refused on the device, or dropped */
  const volatile int64_t *h = g->counts_h;
  if (h[0] < 0)
    return mc_fail(a2a->err, MC_ERR_INTERNAL, "mc_dispatch_counts: the round was refused, but no refusal or drop was recorded");
  *rows = h[0];
  for (int l = 0; expert_count && l < L; l++) expert_count[l] = ((const volatile int32_t *)(h + 1))[l];
  return MC_SUCCESS;
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

/* mc_a2a_mask_ranks on a GPU: every kernel of the broken round has ended
 * (each waits at most the timeout; a device-wide synchronisation, as this
 * is no hot path), its failure is over, the mask goes into the workspace,
 * and one block agrees with the kept ranks (mc_k_mask), waiting up to twice
 * the timeout: they come after their own failed calls. */
static mc_result_t mc_gpu_mask(mc_a2a_t *a2a, const uint8_t *mask) {
  mc_gpu_t *g = gpu(a2a);
  const int W = a2a->shape.world_size;
  cudaError_t e = cudaDeviceSynchronize();
  if (e != cudaSuccess) return cuda_fail(a2a, e, "mc_a2a_mask_ranks: waiting for the broken round's kernels");
  volatile mc_dev_error_t *err = g->err_h;
  err->code = 0;
  err->ref_code = 0;
  __sync_synchronize();
  err->claimed = 0;
  err->ref_claimed = 0;
  e = cudaMemcpy(g->ws + mc_ws_mask_off(&a2a->shape), mask, (size_t)W, cudaMemcpyHostToDevice);
  if (e != cudaSuccess) return cuda_fail(a2a, e, "mc_a2a_mask_ranks: copying the mask");
  mc_kargs_t ka;
  mc_result_t rc = mc_gpu_prepare(a2a, &ka, NULL, NULL);
  if (rc != MC_SUCCESS) return rc;
  ka.mask = g->ws + mc_ws_mask_off(&a2a->shape);
  ka.timeout_ns *= 2;
  const int threads = W < MC_THREADS ? (W + 31) / 32 * 32 : MC_THREADS;
  mc_k_mask<<<1, threads>>>(ka);
  if ((e = cudaGetLastError()) != cudaSuccess || (e = cudaDeviceSynchronize()) != cudaSuccess)
    return cuda_fail(a2a, e, "mc_a2a_mask_ranks: the agreement kernel");
  if ((rc = mc_gpu_check(a2a)) != MC_SUCCESS) return rc;
  g->recv_owed = 0; /* the caller then keeps the mask (mc_a2a_t masked, any_masked) */
  return MC_SUCCESS;
}

#endif
