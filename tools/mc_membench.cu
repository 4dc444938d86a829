/* mc_membench.cu - the ceiling under moecomm's kernels: how fast can N
 * processes sharing one GPU under MPS move rows the way the copying kernels
 * do? Each process copies M rows of B bytes, a warp per row with four
 * 16-byte loads in flight per lane (mc_warp_copy16_to's pattern), between
 * contiguous rows and R regions S bytes apart: --scatter writes row i into
 * region i % R (dispatch-recv filling expert_x), --gather reads it from
 * there (combine reading expert_y). With R = 1 both ends are contiguous.
 * --peers spreads the rows over every process's regions instead, mapped
 * with CUDA IPC (row i to process i % N), as direct dispatch stores into
 * the peers' expert_x and the registered combine reads their expert_y.
 * The processes meet at a file barrier, then each times I launches in a row
 * with CUDA events and prints one JSON line: perf-notes 25 reads the sum
 * over processes as the GPU's rate, since they run at the same time. The
 * line also lists the SMs (%smid) the process's blocks ran on, so that what
 * MPS's share means (a count of SMs, or a fixed set, shared or not between
 * processes) can be read off: perf-notes 37.
 *
 *   mc-membench --procs N --rank r --dir D [--rows M] [--row-bytes B]
 *               [--regions R] [--stride S] [--gather] [--peers] [--iters I] [--blocks G]
 *
 * Not part of the library, not run by CI (it needs a GPU); built with the
 * other tools when CUDA is on. */
#include <cuda_runtime.h>
#include <getopt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define CHECK(x)                                                                                                       \
  do {                                                                                                                 \
    cudaError_t e_ = (x);                                                                                              \
    if (e_ != cudaSuccess) {                                                                                           \
      fprintf(stderr, "mc-membench: %s: %s\n", #x, cudaGetErrorString(e_));                                           \
      exit(1);                                                                                                         \
    }                                                                                                                  \
  } while (0)

/* row i: contiguous at lin + i * B; spread: k = i / P at process i % P, in
 * region k % R at slot k / R + first (first: this process's share of each
 * region, so processes do not write the same rows) */
static __global__ void __launch_bounds__(512) rows_copy(const unsigned char *lin, unsigned char *const *spr, int procs,
                                                        int64_t first, int rows, int64_t row_bytes, int regions,
                                                        int64_t stride, int gather, unsigned int *sms) {
  const int lane = threadIdx.x & 31;
  if (threadIdx.x == 0) { /* which SMs this process's blocks ran on (MPS: a count of SMs, or a set?) */
    unsigned int id;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(id));
    atomicOr(&sms[(id >> 5) & 7], 1u << (id & 31));
  }
  const int gw = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, nw = (gridDim.x * blockDim.x) >> 5;
  const int64_t cnt = row_bytes / 16;
  for (int r = gw; r < rows; r += nw) {
    const int k = r / procs;
    unsigned char *far = spr[r % procs] + (int64_t)(k % regions) * stride + (k / regions + first) * row_bytes;
    const int4 *s = (const int4 *)(gather ? far : lin + (int64_t)r * row_bytes);
    int4 *d = (int4 *)(gather ? (unsigned char *)lin + (int64_t)r * row_bytes : far);
    int64_t i = lane;
    for (; i + 96 < cnt; i += 128) {
      int4 a = s[i], b = s[i + 32], c = s[i + 64], e = s[i + 96];
      d[i] = a, d[i + 32] = b, d[i + 64] = c, d[i + 96] = e;
    }
    for (; i < cnt; i += 32) d[i] = s[i];
  }
}

/* one clock for every process on the host: the script takes the span
 * from the first start to the last end for the rate of all of them */
static double host_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return 1e9 * (double)ts.tv_sec + (double)ts.tv_nsec;
}

/* every process touches dir/rank, then waits for all N files */
static void file_barrier(const char *dir, int procs, int rank, const char *tag) {
  char p[512];
  snprintf(p, sizeof p, "%s/%s.%d", dir, tag, rank);
  FILE *f = fopen(p, "w");
  if (!f) {
    perror(p);
    exit(1);
  }
  fclose(f);
  for (int r = 0; r < procs; r++) {
    snprintf(p, sizeof p, "%s/%s.%d", dir, tag, r);
    for (int spins = 0; access(p, F_OK) != 0; spins++) {
      if (spins > 600000) { /* 60 s */
        fprintf(stderr, "mc-membench: rank %d: %s never appeared\n", rank, p);
        exit(1);
      }
      usleep(100);
    }
  }
}

/* the library's grid (grid_size in src/gpu/mc_gpu_host.c): a block per SM
 * the process may use, 7 per 10 when other processes share the GPU (runs
 * 2-3 of perf-notes 25 used the formula before: 6 blocks at EP8) */
static int default_blocks(int procs) {
  int sms = 1;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const int g = procs > 1 ? (7 * sms + 9) / 10 : sms;
  return g < 1 ? 1 : g;
}

int main(int argc, char **argv) {
  int procs = 1, rank = 0, rows = 1024, regions = 1, gather = 0, peers = 0, iters = 2000, blocks = 0;
  int64_t row_bytes = 7168, stride = 0;
  const char *dir = "/tmp";
  static const struct option lo[] = {{"procs", 1, 0, 'n'},   {"rank", 1, 0, 'r'},   {"dir", 1, 0, 'd'},
                                     {"rows", 1, 0, 'm'},    {"row-bytes", 1, 0, 'b'}, {"regions", 1, 0, 'R'},
                                     {"stride", 1, 0, 'S'},  {"gather", 0, 0, 'g'}, {"iters", 1, 0, 'i'},
                                     {"blocks", 1, 0, 'G'},  {"peers", 0, 0, 'p'},  {0, 0, 0, 0}};
  for (int c; (c = getopt_long(argc, argv, "", lo, NULL)) != -1;) {
    switch (c) {
    case 'n': procs = atoi(optarg); break;
    case 'r': rank = atoi(optarg); break;
    case 'd': dir = optarg; break;
    case 'm': rows = atoi(optarg); break;
    case 'b': row_bytes = atoll(optarg); break;
    case 'R': regions = atoi(optarg); break;
    case 'S': stride = atoll(optarg); break;
    case 'g': gather = 1; break;
    case 'i': iters = atoi(optarg); break;
    case 'G': blocks = atoi(optarg); break;
    case 'p': peers = 1; break;
    default: fprintf(stderr, "usage: see the comment at the top of tools/mc_membench.cu\n"); return 2;
    }
  }
  if (rows < 1 || row_bytes < 16 || row_bytes % 16 || regions < 1 || iters < 1 || procs < 1) {
    fprintf(stderr, "mc-membench: rows >= 1, row bytes a multiple of 16, regions >= 1, iters >= 1\n");
    return 2;
  }
  /* default stride: a region holds every row (expert capacity = all of them) */
  if (stride <= 0) stride = (int64_t)rows * row_bytes;
  if (blocks <= 0) blocks = default_blocks(procs);
  const int P = peers ? procs : 1; /* processes whose regions the rows spread over */
  const int64_t share = ((rows + P - 1) / P + regions - 1) / regions; /* rows per region from one process */
  const int64_t per_region = share * P * row_bytes;
  if (stride < per_region) stride = per_region;
  const int64_t spr_bytes = (int64_t)(regions - 1) * stride + per_region;
  unsigned char *lin, *spr, **tab_h = (unsigned char **)calloc((size_t)P, sizeof *tab_h), **tab;
  CHECK(cudaMalloc(&lin, (size_t)rows * row_bytes));
  CHECK(cudaMalloc(&spr, (size_t)spr_bytes));
  CHECK(cudaMemset(lin, 0x5a, (size_t)rows * row_bytes));
  CHECK(cudaMemset(spr, 0xa5, (size_t)spr_bytes));
  tab_h[0] = spr;
  if (P > 1) { /* every process's regions, through CUDA IPC handles left in dir */
    cudaIpcMemHandle_t h;
    CHECK(cudaIpcGetMemHandle(&h, spr));
    char path[512];
    snprintf(path, sizeof path, "%s/handle.%d", dir, rank);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(&h, sizeof h, 1, f) != 1) {
      perror(path);
      return 1;
    }
    fclose(f);
    file_barrier(dir, procs, rank, "handles");
    for (int p = 0; p < P; p++) {
      if (p == rank) {
        tab_h[p] = spr;
        continue;
      }
      snprintf(path, sizeof path, "%s/handle.%d", dir, p);
      f = fopen(path, "rb");
      if (!f || fread(&h, sizeof h, 1, f) != 1) {
        perror(path);
        return 1;
      }
      fclose(f);
      void *peer = NULL;
      CHECK(cudaIpcOpenMemHandle(&peer, h, cudaIpcMemLazyEnablePeerAccess));
      tab_h[p] = (unsigned char *)peer;
    }
  }
  CHECK(cudaMalloc(&tab, sizeof *tab * (size_t)P));
  CHECK(cudaMemcpy(tab, tab_h, sizeof *tab * (size_t)P, cudaMemcpyHostToDevice));
  const int64_t first = P > 1 ? (int64_t)rank * share : 0;
  unsigned int *sms;
  CHECK(cudaMalloc(&sms, 8 * sizeof *sms));
  CHECK(cudaMemset(sms, 0, 8 * sizeof *sms));
  cudaStream_t st;
  CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  for (int i = 0; i < 50; i++) rows_copy<<<blocks, 512, 0, st>>>(lin, tab, P, first, rows, row_bytes, regions, stride, gather, sms);
  CHECK(cudaStreamSynchronize(st));
  CHECK(cudaMemset(sms, 0, 8 * sizeof *sms)); /* the timed launches' SMs only: all processes run then */
  file_barrier(dir, procs, rank, "go");
  const double t0 = host_ns();
  CHECK(cudaEventRecord(e0, st));
  for (int i = 0; i < iters; i++)
    rows_copy<<<blocks, 512, 0, st>>>(lin, tab, P, first, rows, row_bytes, regions, stride, gather, sms);
  CHECK(cudaEventRecord(e1, st));
  CHECK(cudaStreamSynchronize(st));
  const double t1 = host_ns();
  CHECK(cudaGetLastError());
  float ms = 0;
  CHECK(cudaEventElapsedTime(&ms, e0, e1));
  if (P > 1) { /* close the peers' mappings, then let no process free its regions before all have */
    for (int p = 0; p < P; p++)
      if (p != rank) CHECK(cudaIpcCloseMemHandle(tab_h[p]));
    file_barrier(dir, procs, rank, "done");
  }
  unsigned int mask[8];
  CHECK(cudaMemcpy(mask, sms, sizeof mask, cudaMemcpyDeviceToHost));
  char list[1024] = "";
  int nsm = 0;
  for (int i = 0; i < 256; i++) { /* as ranges: "0-15,32-47" */
    if (!(mask[i >> 5] >> (i & 31) & 1u)) continue;
    int j = i;
    while (j + 1 < 256 && (mask[(j + 1) >> 5] >> ((j + 1) & 31) & 1u)) j++;
    size_t n = strlen(list);
    snprintf(list + n, sizeof list - n, n ? ",%d-%d" : "%d-%d", i, j);
    nsm += j - i + 1;
    i = j;
  }
  const double us = 1e3 * ms / iters, bytes = 2.0 * rows * (double)row_bytes; /* read + written */
  printf("{\"rank\": %d, \"procs\": %d, \"rows\": %d, \"row_bytes\": %lld, \"regions\": %d, \"stride\": %lld, "
         "\"gather\": %d, \"peers\": %d, \"blocks\": %d, \"iters\": %d, \"us_per_iter\": %.3f, \"gbps\": %.1f, "
         "\"t0_ns\": %.0f, \"t1_ns\": %.0f, \"sms_used\": %d, \"sm_ids\": \"%s\"}\n",
         rank, procs, rows, (long long)row_bytes, regions, (long long)stride, gather, peers, blocks, iters, us,
         bytes / us / 1e3, t0, t1, nsm, list);
  return 0;
}
