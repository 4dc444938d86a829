/* mc_ref_quant.c - the reference for src/core/mc_quant.h, written apart
 * from it on purpose: decoding every e4m3 code and choosing the nearest in
 * double precision, scales from ldexp, so that the two agree only where the
 * rules (stated in mc_quant.h) are met by both. */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "mc_ref.h"

static double e4m3_value(int c) { /* c in 0..0x7E */
  const int e = (c >> 3) & 15, m = c & 7;
  return e ? ldexp(1.0 + m / 8.0, e - 7) : ldexp((double)m, -9);
}

/* The values of codes 0..0x7E (they grow with the code), decoded once:
 * pthread_once, as ranks may be threads. */
static double code_value[0x7F];
static void fill_values(void) {
  for (int c = 0; c <= 0x7E; c++) code_value[c] = e4m3_value(c);
}

uint8_t mc_ref_e4m3(float x) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, fill_values);
  if (isnan(x)) return 0x7F;
  const uint8_t sign = signbit(x) ? 0x80 : 0;
  const double a = fabs((double)x);
  if (a >= 448.0) return (uint8_t)(sign | 0x7E);
  /* the last code not above a (a search: the harness quantises whole
   * batches every round), then the nearer of it and the next; a tie goes
   * to the even code */
  int lo = 0, hi = 0x7E;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (code_value[mid] <= a) lo = mid;
    else hi = mid - 1;
  }
  int best = lo;
  if (lo < 0x7E) {
    const double d0 = a - code_value[lo], d1 = code_value[lo + 1] - a;
    if (d1 < d0 || (d1 == d0 && (lo & 1))) best = lo + 1;
  }
  return (uint8_t)(sign | best);
}

static float bf16(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

void mc_ref_quant_block(const uint16_t *x, int n, int ue8m0, uint8_t *q, uint8_t *scale) {
  double amax = 0.0;
  for (int i = 0; i < n; i++)
    if (isfinite(bf16(x[i])) && fabs((double)bf16(x[i])) > amax) amax = fabs((double)bf16(x[i]));
  if (!ue8m0) {
    const float s = amax > 0.0 ? (float)amax / 448.0f : 1.0f;
    for (int i = 0; i < n; i++) q[i] = mc_ref_e4m3(bf16(x[i]) / s);
    memcpy(scale, &s, sizeof s);
    return;
  }
  int e = 0;
  if (amax > 0.0) {
    e = -127;
    while (e < 127 && ldexp(448.0, e) < amax) e++;
  }
  const float inv = (float)ldexp(1.0, -e); /* exact: 2^-127 is a float subnormal */
  for (int i = 0; i < n; i++) q[i] = mc_ref_e4m3(bf16(x[i]) * inv);
  scale[0] = (uint8_t)(e + 127);
}
