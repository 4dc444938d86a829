/* test_gpu_quant.c - quantising in dispatch on the GPU: the send kernels'
 * e4m3 rows and scales against the reference quantiser, and the device's
 * conversion and division-free quotient against the host's. Each test
 * skips (exit 77) where no CUDA device is visible. */
#include <math.h>
#include <stdlib.h>

#include "mc_quant.h"
#include "mc_ref_dev.h"
#include "mc_ref_run.h"
#include "mc_test.h"
#include "mc_test_gpu.h"

/* MC_INPUT_BF16_TO_E4M3 on the GPU: the send kernels quantise (a warp a
 * piece of 2048 values, scales from 8 lanes' amax); expert_x and
 * expert_scale must match the reference quantiser byte for byte. Both
 * scale formats; the DeepSeek-V3 width (3.5 pieces a token: a short last
 * piece); the one-launch kernels of top-8 and of any top-k; more tokens
 * than one prep chunk (the chunked send kernel); groups. (Under
 * MC_TEST_STAGED=1 the staging pack kernel quantises too.) */
int test_gpu_quant_dispatch(void) {
  REQUIRE_GPU();
  static const struct {
    int world, group, experts, topk, tokens, hidden, ue8m0;
  } cases[] = {{2, 1, 16, 8, 24, 7168, 0}, {2, 1, 16, 8, 24, 7168, 1}, {4, 2, 32, 6, 40, 1024, 1},
               {2, 1, 32, 4, 300, 512, 0}, {8, 1, 64, 8, 16, 2048, 0}, {1, 1, 8, 3, 20, 512, 1}};
  for (int i = 0; i < (int)(sizeof cases / sizeof cases[0]); i++) {
    if (mc_tg_cap_world(cases[i].world) != cases[i].world) continue;
    mc_case_t c;
    mc_tg_small_case(&c, cases[i].world, cases[i].group, 80 + i);
    c.num_experts = cases[i].experts;
    c.topk = cases[i].topk;
    c.max_tokens = cases[i].tokens;
    c.hidden = cases[i].hidden;
    c.quant = cases[i].ue8m0 ? MC_REF_QUANT_UE8M0 : MC_REF_QUANT_FP32;
    c.token_bytes = (size_t)c.hidden;
    c.scale_bytes = mc_quant_scale_bytes(c.hidden, cases[i].ue8m0);
    c.expert_identity = 0; /* the experts read the e4m3 payload as bytes */
    mc_run_opts_t o = MC_RUN_OPTS_DEFAULT;
    o.rounds = 3;
    MC_CHECK_MSG(mc_tg_run(&c, &o) == 0, "case %d", i);
    o.quant_apart = 1; /* and mc-bench's baseline: the harness's quantising kernel, then bytes */
    if (i < 2) MC_CHECK_MSG(mc_tg_run(&c, &o) == 0, "case %d, quantised apart", i);
  }
  return 0;
}

/* The e4m3 conversion as the GPU runs it (the hardware's, on sm_89 and
 * later) gives the host's bits, which test quant_e4m3 checks against the
 * reference: every bf16 value, each midpoint between neighbouring codes and
 * the floats either side of it, both signs, NaN and Inf, a million random
 * floats. */
int test_gpu_quant_values(void) {
  REQUIRE_GPU();
#ifdef MC_REF_CUDA
  const size_t n = 0x10000 + 2 * 3 * 0x7E + 1000000;
  float *x = malloc(n * sizeof *x);
  uint8_t *q = malloc(n);
  MC_CHECK(x && q);
  size_t i = 0;
  for (uint32_t h = 0; h < 0x10000u; h++)
    x[i++] = mc_bf16_to_f32((uint16_t)h);
  for (int c = 0; c < 0x7E; c++) {
    const float mid = (float)(((double)mc_e4m3_to_f32((uint8_t)c) + (double)mc_e4m3_to_f32((uint8_t)(c + 1))) / 2);
    const float near[] = {mid, nextafterf(mid, 0.0f), nextafterf(mid, 1e9f)};
    for (int j = 0; j < 3; j++)
      x[i++] = near[j], x[i++] = -near[j];
  }
  uint64_t r = mc_test_seed | 1;
  while (i < n) {
    r ^= r << 13, r ^= r >> 7, r ^= r << 17;
    x[i++] = mc_bits_f32((uint32_t)(r >> 20));
  }
  MC_CHECK(mc_dev_select(0) == 0);
  float *dx = mc_dev_alloc(1, n * sizeof *x);
  uint8_t *dq = mc_dev_alloc(1, n);
  MC_CHECK(dx && dq);
  MC_CHECK(mc_dev_put(1, dx, x, n * sizeof *x) == 0);
  MC_CHECK(mc_dev_fill(1, dq, 0xA5, n) == 0 && mc_dev_sync(1) == 0); /* poisoned */
  MC_CHECK(mc_ref_e4m3_on_gpu(dx, n, dq) == 0);
  MC_CHECK(mc_dev_get(1, q, dq, n) == 0);
  size_t bad = 0;
  for (size_t k = 0; k < n; k++)
    if (q[k] != mc_f32_to_e4m3(x[k]) && bad++ < 8)
      fprintf(stderr, "%a (bits 0x%08x): device 0x%02x, host 0x%02x\n", x[k], mc_f32_bits(x[k]), q[k],
              mc_f32_to_e4m3(x[k]));
  MC_CHECK_MSG(bad == 0, "%zu of %zu floats convert differently on the device", bad, n);
  mc_dev_free(1, dx);
  mc_dev_free(1, dq);
  free(x);
  free(q);
  return 0;
#else
  printf("skipped: a build without CUDA\n");
  return MC_TEST_SKIP;
#endif
}

/* The fp32 format's division-free quotient (mc_quant.h) as the GPU runs it,
 * against the division run there too, over every pair test quant_division
 * checks on the host; and there the packed part functions of the kernels
 * against the scalar ones, both formats. */
int test_gpu_quant_division(void) {
  REQUIRE_GPU();
#ifdef MC_REF_CUDA
  unsigned long long bad = 0, first = 0;
  MC_CHECK(mc_dev_select(0) == 0);
  MC_CHECK(mc_ref_quant_division_on_gpu(&bad, &first) == 0);
  MC_CHECK_MSG(bad == 0, "%llu bytes differ from the division's; the first: amax bf16 0x%04llx, x bf16 0x%04llx", bad,
               first >> 16, first & 0xffffull);
  return 0;
#else
  printf("skipped: a build without CUDA\n");
  return MC_TEST_SKIP;
#endif
}
