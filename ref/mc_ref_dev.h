/* mc_ref_dev.h - where the harness keeps a rank's buffers: host memory for
 * the cpu transport, device memory for the GPU transports (then inputs are
 * uploaded and outputs downloaded for the checks). Timing marks are host
 * clock reads or CUDA events on the rank's stream (mc_dev_stream). */
#ifndef MC_REF_DEV_H
#define MC_REF_DEV_H

#include <stddef.h>
#include <stdint.h>

#define MC_DEV_MARKS 8

/* Select this rank's GPU (rank % device count) before any other CUDA call;
 * returns the device, or -1 without CUDA. */
int mc_dev_select(int rank);
int mc_dev_have_cuda(void); /* 1 if built with CUDA and a device is visible */
/* The free bytes of device 0 (cudaMemGetInfo) and how many devices this
 * process sees; 0, or -1 without CUDA or a device. Starts CUDA here. */
int mc_dev_mem_info(uint64_t *free_bytes, int *devices);
void *mc_dev_alloc(int gpu, size_t n);
void mc_dev_free(int gpu, void *p);
int mc_dev_put(int gpu, void *dst, const void *src, size_t n); /* host -> buffer */
int mc_dev_get(int gpu, void *dst, const void *src, size_t n); /* buffer -> host */
int mc_dev_fill(int gpu, void *p, int byte, size_t n); /* queued on mc_dev_stream() */
int mc_dev_sync(int gpu);                             /* mc_dev_stream(), not the device */
/* the stream every library call and device call of this rank goes to: the
 * calling thread's own (cudaStreamPerThread), so ranks that are threads of
 * one process on one GPU do not serialise on stream 0; NULL without CUDA */
void *mc_dev_stream(void);
/* m rows of `hidden` bf16 values into e4m3 rows q and a scale per 128
 * (fp32, or UE8M0 bytes), by src/core/mc_quant.h's rules: on the GPU a
 * kernel queued on mc_dev_stream() (mc_ref_quant_dev.cu), else on the
 * host. What a model runs where dispatch does not quantise. 0 on success. */
int mc_dev_quantise(int gpu, const void *x, int m, int hidden, int ue8m0, void *q, void *scales);
/* CUDA builds: q[i] = mc_f32_to_e4m3(x[i]) on the device (device buffers),
 * synchronised; 0 on success */
int mc_ref_e4m3_on_gpu(const float *x, size_t n, uint8_t *q);
/* CUDA builds: test quant_division on the device: for every finite bf16
 * amax and every bf16 value a block with it can hold, mc_quant_values'
 * fp32-format byte against the division's, both made on the device; the
 * count of bytes that differ into *bad, the first such (amax << 16 | x)
 * into *first. 0 on success */
int mc_ref_quant_division_on_gpu(unsigned long long *bad, unsigned long long *first);
/* other work on the stream between a send and its recv */
void mc_dev_busy(int gpu, void *scratch, size_t n);
void mc_dev_mark(int gpu, int k);
/* the same on a given stream, also while it is captured (an event record node) */
void mc_dev_mark_on(void *stream, int k);
double mc_dev_elapsed_us(int gpu, int k0, int k1); /* after mc_dev_sync */

/* CUDA graph of one layer: capture what `body` launches on the capture
 * stream (passed to it), then replay. Returns 0 on success. */
typedef int (*mc_dev_body_fn)(void *stream, void *arg);
int mc_dev_graph_capture(mc_dev_body_fn body, void *arg, void **graph_exec, void **stream);
int mc_dev_copy_async(void *dst, const void *src, size_t n, void *stream); /* device to device */
int mc_dev_graph_launch(void *graph_exec, void *stream);
void mc_dev_graph_free(void *graph_exec, void *stream);

/* mc_ref_nvshmem.cu (MC_REF_NVSHMEM builds): start NVSHMEM in this process
 * as PE 0 of 1 on `device`, as an application would; 0 on success */
int mc_ref_nvshmem_init_alone(int device);
int mc_ref_nvshmem_initialized(void);
void mc_ref_nvshmem_finalize(void);

#endif
