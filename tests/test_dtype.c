/* test_dtype.c - the fp32 <-> bf16/fp16 conversions of src/core/mc_dtype.h, which
 * the library AND the reference model use: a rounding bug there would be
 * invisible to every comparison with the reference, so they are checked
 * here against independent definitions (the compiler's _Float16, and a
 * nearest-even rounding written out in double). */
#include <math.h>
#include <string.h>

#include "mc_dtype.h"
#include "mc_quant.h"
#include "mc_ref.h"
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

/* ---- fp8 e4m3 and block quantisation (src/core/mc_quant.h) against the
 * reference written apart from it (ref/mc_ref_quant.c) ---- */

/* Every bf16 value, and every float at and around each midpoint between
 * two neighbouring e4m3 values (where ties-to-even decides), converts to
 * the same code both ways; and every code decodes to a value that converts
 * back to itself. */
int test_quant_e4m3(void) {
  for (uint32_t h = 0; h < 0x10000u; h++) {
    const float f = mc_bf16_to_f32((uint16_t)h);
    MC_CHECK_MSG(mc_f32_to_e4m3(f) == mc_ref_e4m3(f), "bf16 0x%04x (%g): 0x%02x, reference 0x%02x", h, f,
                 mc_f32_to_e4m3(f), mc_ref_e4m3(f));
  }
  for (int c = 0; c < 0x7E; c++) {
    const float lo = mc_e4m3_to_f32((uint8_t)c), hi = mc_e4m3_to_f32((uint8_t)(c + 1));
    MC_CHECK(mc_f32_to_e4m3(lo) == c && mc_f32_to_e4m3(-lo) == (0x80 | c));
    const float mid = (float)(((double)lo + (double)hi) / 2); /* exact: e4m3 values are short */
    const float near[] = {mid, nextafterf(mid, 0.0f), nextafterf(mid, 1e9f)};
    for (int i = 0; i < 3; i++)
      MC_CHECK_MSG(mc_f32_to_e4m3(near[i]) == mc_ref_e4m3(near[i]) && mc_f32_to_e4m3(-near[i]) == mc_ref_e4m3(-near[i]),
                   "%a: 0x%02x, reference 0x%02x", near[i], mc_f32_to_e4m3(near[i]), mc_ref_e4m3(near[i]));
    MC_CHECK_MSG(mc_f32_to_e4m3(mid) == ((c & 1) ? c + 1 : c), "the tie %a between 0x%02x and 0x%02x", mid, c, c + 1);
  }
  MC_CHECK(mc_f32_to_e4m3(448.0f) == 0x7E && mc_f32_to_e4m3(1e30f) == 0x7E && mc_f32_to_e4m3(-INFINITY) == 0xFE);
  MC_CHECK(mc_f32_to_e4m3(NAN) == 0x7F && mc_f32_to_e4m3(-0.0f) == 0x80 && mc_f32_to_e4m3(0x1p-10f) == 0x00);
  MC_CHECK(isnan(mc_e4m3_to_f32(0x7F)) && isnan(mc_e4m3_to_f32(0xFF)) && mc_e4m3_to_f32(0x01) == 0x1p-9f);
  uint64_t r = mc_test_seed | 1;
  for (int i = 0; i < 1000000; i++) { /* random floats of every magnitude */
    r ^= r << 13, r ^= r >> 7, r ^= r << 17;
    const float f = mc_bits_f32((uint32_t)(r >> 20));
    MC_CHECK_MSG(mc_f32_to_e4m3(f) == mc_ref_e4m3(f), "%a: 0x%02x, reference 0x%02x", f, mc_f32_to_e4m3(f),
                 mc_ref_e4m3(f));
  }
  return 0;
}

/* Random blocks (magnitudes from tiny to huge, with zeros, NaN and Inf
 * among them, and all-zero blocks) quantise to the same bytes and scales as
 * the reference, in both scale formats; and dequantised values are within
 * half an e4m3 step of the input (where no value saturated). */
int test_quant_blocks(void) {
  uint64_t r = mc_test_seed * 0x9E3779B97F4A7C15ull + 1;
  uint16_t x[MC_QBLOCK];
  uint8_t q[MC_QBLOCK], qr[MC_QBLOCK], sr[4];
  for (int b = 0; b < 20000; b++) {
    const int n = 1 + (int)(mc_ref_rand(&r) % MC_QBLOCK), mag = (int)(mc_ref_rand(&r) % 254) + 1;
    const int kind = (int)(mc_ref_rand(&r) % 8);
    for (int i = 0; i < n; i++) {
      /* bf16 with exponent near `mag` (a block's values share a scale) */
      const uint32_t e = (uint32_t)(mag - (int)(mc_ref_rand(&r) % 12));
      x[i] = (uint16_t)((mc_ref_rand(&r) & 0x807fu) | ((e > 0 && e < 255 ? e : 0u) << 7));
      if (kind == 0) x[i] = 0;
      if (kind == 1 && i % 17 == 3) x[i] = 0x7fc0;                   /* NaN */
      if (kind == 2 && i % 29 == 5) x[i] = (i & 1) ? 0xff80 : 0x7f80; /* -Inf, +Inf */
    }
    for (int ue = 0; ue <= 1; ue++) {
      uint8_t s8 = 0;
      float sf = 0.0f;
      if (ue) s8 = mc_quant_block_ue8m0(x, n, q);
      else sf = mc_quant_block_fp32(x, n, q);
      mc_ref_quant_block(x, n, ue, qr, sr);
      MC_CHECK_MSG(memcmp(q, qr, (size_t)n) == 0, "block %d (n %d, %s): e4m3 bytes differ from the reference", b, n,
                   ue ? "ue8m0" : "fp32");
      MC_CHECK_MSG(ue ? s8 == sr[0] : memcmp(&sf, sr, 4) == 0, "block %d (%s): scale differs from the reference", b,
                   ue ? "ue8m0" : "fp32");
      const float s = ue ? ldexpf(1.0f, (int)s8 - 127) : sf;
      for (int i = 0; i < n; i++) {
        const double v = mc_bf16_to_f32(x[i]), d = (double)mc_e4m3_to_f32(q[i]) * s; /* double: no overflow */
        if (!isfinite(v) || (q[i] & 0x7F) == 0x7E) continue;
        /* half a step of e4m3 near |v / s|, or of its subnormals (2^-10), times s */
        const double step = fmax(fabs(v / s) / 16.0, 0x1p-10) * s;
        MC_CHECK_MSG(fabs(d - v) <= step * 1.0001, "block %d value %d: %g -> %g (scale %g)", b, i, v, d, (double)s);
      }
    }
  }
  /* a block of zeros: scale 1 (fp32) or 2^0 (byte 127), codes 0 */
  memset(x, 0, sizeof x);
  MC_CHECK(mc_quant_block_fp32(x, MC_QBLOCK, q) == 1.0f && q[0] == 0 && q[MC_QBLOCK - 1] == 0);
  MC_CHECK(mc_quant_block_ue8m0(x, MC_QBLOCK, q) == 127);
  /* amax exactly 448 * 2^k: scale 2^k, the value itself the largest code */
  x[5] = mc_f32_to_bf16(448.0f * 4.0f);
  MC_CHECK(mc_quant_block_ue8m0(x, MC_QBLOCK, q) == 129 && q[5] == 0x7E);
  MC_CHECK(mc_quant_block_fp32(x, MC_QBLOCK, q) == 4.0f && q[5] == 0x7E);
  return 0;
}

/* mc_quant_values makes the fp32 format's q = x / s without a division
 * (mc_quant.h): for every finite bf16 amax (hence every scale s a block can
 * have) and every bf16 value a block with that amax can hold (finite ones
 * no larger than amax, and +-Inf and NaN), in blocks of 16 as the GPU
 * kernels call it, its e4m3 byte is the division's. 2^30 values. Under a
 * sanitizer, which checks memory and threads, not arithmetic, and runs
 * this loop 5-30 times slower, every 61st amax; the plain suite sweeps
 * them all. */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define MC_QDIV_STEP 61u
#else
#define MC_QDIV_STEP 1u
#endif
int test_quant_division(void) {
  uint16_t x[16];
  uint8_t q[16];
  for (uint32_t ah = 0; ah < 0x7f80u; ah += MC_QDIV_STEP) {
    const float amax = mc_bf16_to_f32((uint16_t)ah), s = ah ? amax / MC_E4M3_MAX : 1.0f;
    int n = 0;
    for (uint32_t h = 0; h <= 0x10000u; h++) {
      const int held = h < 0x10000u && ((h & 0x7fffu) <= ah || (h & 0x7fffu) >= 0x7f80u);
      if (held) x[n++] = (uint16_t)h;
      if (n < 16 && h < 0x10000u) continue;
      MC_CHECK(mc_quant_values(x, n, amax, 0, q) == mc_f32_bits(s));
      for (int i = 0; i < n; i++) {
        const uint8_t want = mc_f32_to_e4m3(mc_bf16_to_f32(x[i]) / s);
        MC_CHECK_MSG(q[i] == want, "amax %a (bf16 0x%04x), x bf16 0x%04x: 0x%02x, the division gives 0x%02x", amax,
                     ah, x[i], q[i], want);
      }
      n = 0;
    }
  }
  return 0;
}
