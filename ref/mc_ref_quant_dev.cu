/* mc_ref_quant_dev.cu - quantisation as a kernel of its own: what a model
 * runs before an fp8 dispatch where dispatch does not quantise, and so the
 * cost that quantising inside dispatch must beat (mc-bench
 * --quantise-apart). The rules and functions of src/core/mc_quant.h; a
 * thread makes 16 values, the 8 threads of a block of 128 share its amax
 * by shuffles, every load and store is 16 bytes. */
#include <cuda_runtime.h>
#include <string.h>

#include "mc_quant.h"

/* parts: values / 16 (a multiple of 8: whole blocks); x bf16, q e4m3, one
 * scale a block (fp32, or the UE8M0 byte) */
__global__ void mc_ref_k_quantise(const uint16_t *x, size_t parts, int ue8m0, uint8_t *q, uint8_t *scales) {
  const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  uint32_t w[8];
  uint32_t amax = 0;
  if (i < parts) {
    const int4 lo = ((const int4 *)x)[2 * i], hi = ((const int4 *)x)[2 * i + 1];
    memcpy(w, &lo, 16);
    memcpy(w + 4, &hi, 16);
    amax = mc_quant_amax16(w);
  }
  /* the 8 parts of a block are 8 neighbouring lanes (i % 8 == lane % 8) */
#pragma unroll
  for (int o = 1; o < 8; o <<= 1) amax = max(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  if (i >= parts) return;
  int4 o4;
  const uint32_t sc = mc_quant_values16(w, mc_bits_f32(amax), ue8m0, (uint32_t *)&o4);
  if (i % 8 == 0) {
    if (ue8m0) scales[i / 8] = (uint8_t)sc;
    else ((uint32_t *)scales)[i / 8] = sc;
  }
  ((int4 *)q)[i] = o4;
}

extern "C" int mc_ref_quantise_on_gpu(const void *x, int m, int hidden, int ue8m0, void *q, void *scales,
                                      void *stream) {
  const size_t parts = (size_t)m * (size_t)hidden / 16;
  if (parts == 0) return 0;
  const unsigned threads = 256, blocks = (unsigned)((parts + threads - 1) / threads);
  mc_ref_k_quantise<<<blocks, threads, 0, (cudaStream_t)stream>>>((const uint16_t *)x, parts, ue8m0, (uint8_t *)q,
                                                                   (uint8_t *)scales);
  return cudaGetLastError() != cudaSuccess;
}

/* mc_f32_to_e4m3 as the device runs it, over n floats (test gpu_quant_values) */
__global__ void mc_ref_k_e4m3(const float *x, size_t n, uint8_t *q) {
  const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) q[i] = mc_f32_to_e4m3(x[i]);
}

extern "C" int mc_ref_e4m3_on_gpu(const float *x, size_t n, uint8_t *q) {
  if (n == 0) return 0;
  mc_ref_k_e4m3<<<(unsigned)((n + 255) / 256), 256>>>(x, n, q);
  return cudaDeviceSynchronize() != cudaSuccess;
}

/* one block per bf16 amax, its threads over the 65536 bf16 values 16 at a
 * time (a thread's 16 consecutive codes, of which those a block with this
 * amax can hold): the fp32 format's bytes against the division, and the
 * packed functions the kernels use (mc_quant_amax16, mc_quant_values16)
 * against the scalar ones, both formats, scales included */
__global__ void mc_ref_k_quant_division(unsigned long long *bad, unsigned long long *first) {
  const uint32_t ah = blockIdx.x;
  const float amax = mc_bf16_to_f32((uint16_t)ah), s = ah ? amax / MC_E4M3_MAX : 1.0f;
  for (uint32_t base = threadIdx.x * 16u; base < 0x10000u; base += blockDim.x * 16u) {
    uint16_t x[16];
    int n = 0;
#pragma unroll
    for (int i = 0; i < 16; i++) {
      const uint32_t h = base + (uint32_t)i, a = h & 0x7fffu;
      x[i] = (uint16_t)h;
      n += a <= ah || a >= 0x7f80u;
    }
    if (n < 16) { /* values above amax (not in such a block): replace them by amax itself */
#pragma unroll
      for (int i = 0; i < 16; i++) {
        const uint32_t a = x[i] & 0x7fffu;
        if (a > ah && a < 0x7f80u) x[i] = (uint16_t)ah;
      }
    }
    uint8_t q[16], u[16];
    uint32_t w[8], qw[4], uw[4];
    memcpy(w, x, sizeof w);
    const int scales_differ = mc_quant_values(x, 16, amax, 0, q) != mc_quant_values16(w, amax, 0, qw) ||
                              mc_quant_values(x, 16, amax, 1, u) != mc_quant_values16(w, amax, 1, uw);
    const uint8_t *qb = (const uint8_t *)qw, *ub = (const uint8_t *)uw;
    const uint32_t a16 = mc_quant_amax16(w), a = mc_quant_amax_bits(x, 16);
#pragma unroll
    for (int i = 0; i < 16; i++)
      if (q[i] != mc_f32_to_e4m3(mc_bf16_to_f32(x[i]) / s) || qb[i] != q[i] || ub[i] != u[i] || a16 != a ||
          scales_differ) {
        atomicAdd(bad, 1ull);
        atomicMin(first, (unsigned long long)ah << 16 | x[i]);
      }
  }
}

extern "C" int mc_ref_quant_division_on_gpu(unsigned long long *bad, unsigned long long *first) {
  unsigned long long *d = NULL, h[2] = {0, ~0ull};
  if (cudaMalloc((void **)&d, sizeof h) != cudaSuccess) return 1;
  int rc = cudaMemcpy(d, h, sizeof h, cudaMemcpyHostToDevice) != cudaSuccess;
  if (!rc) mc_ref_k_quant_division<<<0x7f80u, 256>>>(d, d + 1);
  rc = rc || cudaDeviceSynchronize() != cudaSuccess || cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost) != cudaSuccess;
  cudaFree(d);
  *bad = h[0];
  *first = h[1];
  return rc;
}
