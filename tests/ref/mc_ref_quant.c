/* mc_ref_quant.c - the reference for src/core/mc_quant.h, written apart
 * from it on purpose: decoding every e4m3 code and choosing the nearest in
 * double precision, scales from ldexp, so that the two agree only where the
 * rules (stated in mc_quant.h) are met by both. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "mc_ref.h"

static double e4m3_value(int c) { /* c in 0..0x7E */
  const int e = (c >> 3) & 15, m = c & 7;
  return e ? ldexp(1.0 + m / 8.0, e - 7) : ldexp((double)m, -9);
}

uint8_t mc_ref_e4m3(float x) {
  if (isnan(x)) return 0x7F;
  const uint8_t sign = signbit(x) ? 0x80 : 0;
  const double a = fabs((double)x);
  if (a >= 448.0) return (uint8_t)(sign | 0x7E);
  int best = 0;
  for (int c = 1; c <= 0x7E; c++) {
    const double d = fabs(e4m3_value(c) - a), db = fabs(e4m3_value(best) - a);
    if (d < db || (d == db && (c & 1) == 0 && (best & 1) == 1)) best = c;
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
