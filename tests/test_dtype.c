/* test_dtype.c - the fp32 <-> bf16/fp16 conversions of src/core/mc_dtype.h, which
 * the library AND the reference model use: a rounding bug there would be
 * invisible to every comparison with the reference, so they are checked
 * here against independent definitions (the compiler's _Float16, and a
 * nearest-even rounding written out in double). */
#include <math.h>
#include <string.h>

#include "mc_dtype.h"
#include "mc_test.h"

static uint16_t f16_bits(_Float16 h) {
  uint16_t u;
  memcpy(&u, &h, 2);
  return u;
}
static _Float16 bits_f16(uint16_t u) {
  _Float16 h;
  memcpy(&h, &u, 2);
  return h;
}

/* bf16 of f by definition: the nearer of the two bf16 neighbours, ties to
 * the even one, computed in double. */
static uint16_t bf16_ref(float f) {
  uint32_t u = mc_f32_bits(f);
  if (isnan(f)) return 0x7fc0;
  uint32_t lo = u & 0xffff0000u, hi = lo + 0x10000u; /* toward zero, and one step away */
  double dlo = fabs((double)mc_bits_f32(lo)), dhi = fabs((double)mc_bits_f32(hi)), d = fabs((double)f);
  /* past the largest finite value: the next step with an unbounded exponent
   * is 2^128; IEEE rounds there, then overflows to infinity */
  if ((hi & 0x7f800000u) == 0x7f800000u) dhi = 0x1p128;
  double to_lo = d - dlo, to_hi = dhi - d;
  if (to_lo < to_hi) return (uint16_t)(lo >> 16);
  if (to_hi < to_lo) return (uint16_t)(hi >> 16);
  return (uint16_t)(((lo >> 16) & 1u) ? hi >> 16 : lo >> 16);
}

int test_dtype_conversions(void) {
  /* every fp16 value: widening matches the compiler, narrowing gives it back */
  for (uint32_t h = 0; h < 65536; h++) {
    float want = (float)bits_f16((uint16_t)h), got = mc_f16_to_f32((uint16_t)h);
    if (isnan(want)) {
      MC_CHECK_MSG(isnan(got), "fp16 0x%04x: NaN expected", h);
      continue;
    }
    MC_CHECK_MSG(mc_f32_bits(got) == mc_f32_bits(want), "fp16 0x%04x -> %g, compiler %g", h, got, want);
    MC_CHECK_MSG(mc_f32_to_f16(got) == h, "fp16 0x%04x does not round-trip", h);
  }
  /* every bf16 value round-trips */
  for (uint32_t h = 0; h < 65536; h++) {
    float f = mc_bf16_to_f32((uint16_t)h);
    if (!isnan(f)) MC_CHECK_MSG(mc_f32_to_bf16(f) == h, "bf16 0x%04x does not round-trip", h);
  }
  /* random float bit patterns, ties and near-ties included by construction */
  uint64_t st = mc_test_seed;
  for (int i = 0; i < 4000000; i++) {
    uint32_t u = (uint32_t)mc_test_rand(&st);
    if (i % 4 == 1) u = (u & 0xffff0000u) | 0x8000u; /* exact bf16 ties */
    if (i % 4 == 2) u = (u & 0xffffe000u) | 0x1000u; /* exact fp16 ties (normal range) */
    float f = mc_bits_f32(u);
    uint16_t want16 = f16_bits((_Float16)f), got16 = mc_f32_to_f16(f);
    if (isnan(f))
      MC_CHECK_MSG(isnan(mc_f16_to_f32(got16)), "0x%08x: fp16 NaN expected", u);
    else
      MC_CHECK_MSG(got16 == want16, "0x%08x (%g): fp16 0x%04x, compiler 0x%04x", u, f, got16, want16);
    uint16_t wantb = bf16_ref(f), gotb = mc_f32_to_bf16(f);
    if (isnan(f))
      MC_CHECK_MSG(isnan(mc_bf16_to_f32(gotb)), "0x%08x: bf16 NaN expected", u);
    else
      MC_CHECK_MSG(gotb == wantb, "0x%08x (%g): bf16 0x%04x, by definition 0x%04x", u, f, gotb, wantb);
  }
  return 0;
}
