/* mc_probe.cu - mc-probe: the cost, on the GPU it runs on, of each
 * elementary step a latency-bound dispatch or combine phase is made of
 * (dependent loads, releases and fences, a flag round trip between SMs,
 * programmatic dependent launch, kernels in a CUDA graph, a warp's piece
 * copy, a combine segment's sums, a block barrier and count, code fetched
 * and a launch's first reads, the timer itself), so that a per-microsecond
 * ledger of a phase can cite a measurement of every step taken in the same
 * run. Median, p99 and minimum over many trials after warm-up. Needs
 * nothing of the library but its headers (the prep step runs its code).
 * This file: the SM clock, the timer's resolution, the table and main; the
 * steps are in mc_probe_memory.cu, mc_probe_bulk.cu, mc_probe_launch.cu
 * and mc_probe_prep.cu (mc_probe.h). */
#include <getopt.h>
#include <string.h>
#include <time.h>

#include "mc_probe.h"

/* ---- calibration: SM cycles against globaltimer nanoseconds ---- */
static __global__ void pr_k_clock(uint64_t *out, uint64_t ns) {
  const uint64_t g0 = pr_gtimer(), c0 = pr_clock();
  const uint64_t g1 = pr_spin_ns(ns), c1 = pr_clock();
  out[0] = g1 - g0;
  out[1] = c1 - c0;
}

/* Keeps the GPU busy while the host queues what follows, so that no
 * measured gap waits for the host. */
__global__ void pr_k_spin(uint64_t ns) { pr_spin_ns(ns); }

/* ---- 7. globaltimer: the steps it moves in, read back to back ---- */
static __global__ void pr_k_gtres(uint64_t *out, int n) {
  uint64_t prev = pr_gtimer();
  int got = 0;
  for (uint32_t it = 0; it < (1u << 26) && got < n; it++) {
    const uint64_t t = pr_gtimer();
    if (t != prev) out[1 + got++] = t - prev;
    prev = t;
  }
  out[0] = (uint64_t)got;
}

void pr_check(cudaError_t e, const char *what, const char *file, int line) {
  if (e == cudaSuccess) return;
  fprintf(stderr, "mc-probe: %s (%s:%d): %s\n", what, file, line, cudaGetErrorString(e));
  exit(1);
}
void *pr_malloc(size_t n) {
  void *p = malloc(n);
  if (!p) {
    fprintf(stderr, "mc-probe: out of host memory (%zu bytes)\n", n);
    exit(1);
  }
  return p;
}
void pr_sync(const pr_t *p, const char *step) {
  CK(cudaGetLastError());
  CK(cudaStreamSynchronize(p->st));
  uint32_t f = 0;
  CK(cudaMemcpy(&f, p->fail, sizeof f, cudaMemcpyDeviceToHost));
  if (f) {
    fprintf(stderr, "mc-probe: %s: a wait passed its %.0f s deadline\n", step, PR_DEADLINE_NS / 1e9);
    exit(1);
  }
}

static int pr_cmp(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}
void pr_row(pr_t *p, const char *step, const char *what, double *ns, int n) {
  if (p->nrows == PR_ROWS || n < 1) {
    fprintf(stderr, "mc-probe: %s: %s\n", step, n < 1 ? "no samples" : "too many rows");
    exit(1);
  }
  qsort(ns, (size_t)n, sizeof *ns, pr_cmp);
  pr_row_t *r = &p->rows[p->nrows++];
  snprintf(r->step, sizeof r->step, "%s", step);
  snprintf(r->what, sizeof r->what, "%s", what);
  r->med = n % 2 ? ns[n / 2] : (ns[n / 2 - 1] + ns[n / 2]) / 2;
  r->p99 = ns[(99 * n + 99) / 100 - 1];
  r->min = ns[0];
}
void pr_row_cycles(pr_t *p, const char *step, const char *what, int n, double per) {
  uint64_t *c = (uint64_t *)pr_malloc(sizeof *c * (size_t)n);
  double *ns = (double *)pr_malloc(sizeof *ns * (size_t)n);
  CK(cudaMemcpy(c, p->out, sizeof *c * (size_t)n, cudaMemcpyDeviceToHost));
  for (int i = 0; i < n; i++)
    ns[i] = (double)c[i] * 1000.0 / p->mhz / per;
  pr_row(p, step, what, ns, n);
  free(c);
  free(ns);
}

/* The SM clock in MHz: cycles over %globaltimer nanoseconds across 20 ms. */
static double pr_clock_mhz(pr_t *p) {
  uint64_t r[2];
  pr_k_clock<<<1, 1, 0, p->st>>>(p->out, 20000000ull);
  pr_sync(p, "clock");
  CK(cudaMemcpy(r, p->out, sizeof r, cudaMemcpyDeviceToHost));
  return r[0] ? (double)r[1] * 1000.0 / (double)r[0] : 0.0;
}

/* 7. the smallest non-zero step of %globaltimer seen, and how often */
static void pr_gtimer_res(pr_t *p) {
  const int n = p->trials;
  uint64_t *h = (uint64_t *)pr_malloc(sizeof *h * (size_t)(n + 1));
  double *ns = (double *)pr_malloc(sizeof *ns * (size_t)n);
  pr_k_gtres<<<1, 1, 0, p->st>>>(p->out, n);
  pr_sync(p, "globaltimer");
  CK(cudaMemcpy(h, p->out, sizeof *h * (size_t)(n + 1), cudaMemcpyDeviceToHost));
  const int got = (int)h[0];
  for (int i = 0; i < got; i++)
    ns[i] = (double)h[1 + i];
  pr_row(p, "globaltimer.step", "non-zero differences of back-to-back %globaltimer reads (min: its resolution)", ns,
         got);
  free(h);
  free(ns);
}

static void pr_json_str(const char *s) {
  putchar('"');
  for (; *s; s++)
    if (*s == '"' || *s == '\\')
      printf("\\%c", *s);
    else if ((unsigned char)*s >= 0x20)
      putchar(*s);
  putchar('"');
}
static void pr_print(const pr_t *p) {
  char date[32];
  const time_t now = time(NULL);
  struct tm tm;
  strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", gmtime_r(&now, &tm));
  const char *timer =
      "ns; clock64 rows converted with the SM clock measured against globaltimer over 20 ms before them";
  if (p->json) {
    printf("{\"tool\":\"mc-probe\",\"device\":");
    pr_json_str(p->name);
    printf(",\"sm_count\":%d,\"compute_capability\":%d,\"l2_bytes\":%zu,\"sm_clock_mhz_measured\":%.1f,"
           "\"sm_clock_mhz_measured_after\":%.1f,\"sm_clock_mhz_peak\":%.1f,\"cuda_runtime\":\"%d.%d\","
           "\"cuda_driver\":\"%d.%d\",\"date\":\"%s\",\"trials\":%d,\"times\":",
           p->sms, p->cc_major, p->l2, p->mhz, p->mhz_after, p->mhz_peak, p->rt_ver / 1000, p->rt_ver % 1000 / 10,
           p->drv_ver / 1000, p->drv_ver % 1000 / 10, date, p->trials);
    pr_json_str(timer);
    printf(",\"steps\":[");
    for (int i = 0; i < p->nrows; i++) {
      const pr_row_t *r = &p->rows[i];
      printf("%s{\"step\":", i ? "," : "");
      pr_json_str(r->step);
      printf(",\"median_ns\":%.1f,\"p99_ns\":%.1f,\"min_ns\":%.1f,\"what\":", r->med, r->p99, r->min);
      pr_json_str(r->what);
      putchar('}');
    }
    printf("]}\n");
    return;
  }
  printf("mc-probe: %s, %d SMs, L2 %.0f MB, SM clock %.0f MHz measured (%.0f after), %.0f MHz peak; CUDA %d.%d, "
         "driver %d.%d; %s; %d trials\ntimes in %s\n\n",
         p->name, p->sms, p->l2 / 1e6, p->mhz, p->mhz_after, p->mhz_peak, p->rt_ver / 1000, p->rt_ver % 1000 / 10,
         p->drv_ver / 1000, p->drv_ver % 1000 / 10, date, p->trials, timer);
  printf("%-30s %9s %9s %9s  %s\n", "step", "median", "p99", "min", "what");
  for (int i = 0; i < p->nrows; i++) {
    const pr_row_t *r = &p->rows[i];
    printf("%-30s %9.1f %9.1f %9.1f  %s\n", r->step, r->med, r->p99, r->min, r->what);
  }
}

static void pr_usage(FILE *f) {
  fputs("mc-probe: the cost of each elementary step of a latency-bound dispatch or combine\n"
        "phase on this GPU: dependent loads (L2, DRAM), releases and fences at system and\n"
        "GPU scope, a flag round trip between SMs, programmatic dependent launch, kernels\n"
        "in a CUDA graph, a warp's 2 KB copy, a combine segment's sums, a block barrier\n"
        "and count, code fetched at a launch, a launch's first reads (its parameters, a\n"
        "poll's one read), the bulk of a 128-token phase, globaltimer's resolution.\n"
        "\n"
        "  --trials N   samples per step after warm-up (10..100000)   [200]\n"
        "  --json       one JSON object on stdout instead of the table\n"
        "  -h, --help   this text\n"
        "\n"
        "Exit status: 0, or 1 when a CUDA call fails or a wait passes its deadline.\n",
        f);
}

int main(int argc, char **argv) {
  static pr_t p;
  p.trials = 200;
  static const struct option longs[] = {{"trials", 1, 0, 't'}, {"json", 0, 0, 'j'}, {"help", 0, 0, 'h'}, {0, 0, 0, 0}};
  int ch;
  while ((ch = getopt_long(argc, argv, "h", longs, NULL)) != -1) {
    switch (ch) {
    case 't': {
      char *end;
      const long v = strtol(optarg, &end, 10);
      if (*end || v < 10 || v > 100000) {
        fprintf(stderr, "mc-probe: --trials wants 10..100000, not %s\n", optarg);
        return 2;
      }
      p.trials = (int)v;
      break;
    }
    case 'j':
      p.json = 1;
      break;
    case 'h':
      pr_usage(stdout);
      return 0;
    default:
      pr_usage(stderr);
      return 2;
    }
  }
  if (optind < argc) {
    pr_usage(stderr);
    return 2;
  }
  int l2 = 0, khz = 0;
  struct cudaDeviceProp prop;
  CK(cudaGetDevice(&p.dev));
  CK(cudaGetDeviceProperties(&prop, p.dev));
  snprintf(p.name, sizeof p.name, "%s", prop.name);
  CK(cudaDeviceGetAttribute(&p.sms, cudaDevAttrMultiProcessorCount, p.dev));
  CK(cudaDeviceGetAttribute(&p.cc_major, cudaDevAttrComputeCapabilityMajor, p.dev));
  CK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, p.dev));
  CK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, p.dev));
  CK(cudaRuntimeGetVersion(&p.rt_ver));
  CK(cudaDriverGetVersion(&p.drv_ver));
  p.l2 = (size_t)l2;
  p.mhz_peak = khz / 1000.0;
  CK(cudaStreamCreateWithFlags(&p.st, cudaStreamNonBlocking));
  const size_t out_words = 5 * (size_t)(p.trials + PR_WARM) + (size_t)p.trials + PR_BATCH + 16;
  CK(cudaMalloc(&p.out, out_words * 8));
  CK(cudaMalloc(&p.fail, sizeof *p.fail));
  CK(cudaMemset(p.fail, 0, sizeof *p.fail));
  CK(cudaMalloc(&p.small, PR_SMALL_BYTES));
  CK(cudaMalloc(&p.dst, 32 << 10));
  CK(cudaMalloc(&p.flags, 256));
  CK(cudaMemset(p.flags, 0, 256));

  pr_gtimer_res(&p);
  p.mhz = pr_clock_mhz(&p);
  if (p.mhz <= 0) {
    fprintf(stderr, "mc-probe: globaltimer did not advance: no clock to convert cycles with\n");
    return 1;
  }
  pr_loads_copy(&p);
  pr_first_loads(&p);
  pr_release(&p);
  pr_flags(&p);
  if (p.cc_major >= 9) pr_pdl(&p); /* griddepcontrol needs sm_90 */
  pr_graphs(&p);
  pr_code(&p);
  pr_jump(&p);
  pr_first(&p);
  pr_bulk(&p);
  pr_prep(&p);
  pr_bases(&p);
  pr_tiny(&p);
  p.mhz_after = pr_clock_mhz(&p);
  pr_print(&p);
  if (p.mhz_after < 0.98 * p.mhz || p.mhz_after > 1.02 * p.mhz)
    fprintf(stderr, "mc-probe: the SM clock moved during the run (%.0f -> %.0f MHz): clock64 rows are approximate\n",
            p.mhz, p.mhz_after);
  CK(cudaFree(p.out));
  CK(cudaFree(p.fail));
  CK(cudaFree(p.small));
  CK(cudaFree(p.dst));
  CK(cudaFree(p.flags));
  CK(cudaStreamDestroy(p.st));
  return 0;
}
