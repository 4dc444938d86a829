/* mc_quant.h - bf16 -> fp8 e4m3 in blocks of 128 values with one scale a
 * block, in plain bit arithmetic, host and device (MC_HD), so that every
 * transport quantises identically. ref/mc_ref_quant.c is an
 * independent implementation of the same rules, and the tests check that
 * the two agree bit for bit.
 *
 * The format: OCP fp8 e4m3 ("e4m3fn"): sign, 4 exponent bits (bias 7), 3
 * mantissa bits; no infinities; largest finite 448 (0x7E); NaN 0x7F (with
 * either sign); subnormals down to 2^-9.
 *
 * The rules, for a block of bf16 values x[0..n):
 * - amax: the largest |x| over the finite values (NaN and +-Inf skipped);
 * - fp32 scale: s = amax / 448, one IEEE division rounded to nearest even;
 *   s = 1 where amax is 0 (or no value is finite);
 * - UE8M0 scale: s = 2^e, e the smallest integer with 448 * 2^e >= amax,
 *   at least -127 (at most 120 for a finite bf16 amax), e = 0 where amax is
 *   0; stored as the byte e + 127
 *   (the biased exponent of s as a float: what block-scaled fp8 matrix
 *   multiplies on Blackwell read);
 * - each value: q = x / s, one IEEE division rounded to nearest even (for
 *   UE8M0, the exact multiplication by 2^-e; for fp32 the same bytes are
 *   made without a division, mc_quant_values), then e4m3 by round to nearest,
 *   ties to even; |q| > 448 saturates to +-448 (so do +-Inf); NaN gives 0x7F;
 *   -0 gives 0x80. Dequantised: x ~ e4m3(q) * s. */
#ifndef MC_QUANT_H
#define MC_QUANT_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "mc_dtype.h"

#define MC_QBLOCK 128       /* values per scale */
#define MC_E4M3_MAX 448.0f  /* largest finite e4m3 value */
#define MC_E4M3_NAN 0x7Fu

/* Scale bytes of one token of `hidden` values: a scale per block, 4 bytes
 * (fp32) or 1 (UE8M0). */
MC_HD size_t mc_quant_scale_bytes(int hidden, int ue8m0) {
  return (size_t)(hidden / MC_QBLOCK) * (ue8m0 ? 1u : 4u);
}

/* float -> e4m3, round to nearest even, saturating. On sm_89 and later
 * devices the hardware conversion (cvt.rn.satfinite) does it in one
 * instruction where the bit arithmetic below takes dozens, which would
 * make a quantising dispatch-send far slower. It must give the same bits
 * (test gpu_quant_values: every bf16 value, every tie and a million random
 * floats); a NaN is made 0x7F here whatever the hardware makes of it. */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
MC_HD uint8_t mc_f32_to_e4m3(float x) {
  unsigned short r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(0.0f), "f"(x));
  return x != x ? (uint8_t)MC_E4M3_NAN : (uint8_t)(r & 0xFFu);
}
#else
MC_HD uint8_t mc_f32_to_e4m3(float x) {
  const uint32_t u = mc_f32_bits(x), a = u & 0x7fffffffu;
  const uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
  if (a > 0x7f800000u) return MC_E4M3_NAN;
  if (a >= 0x43e00000u) return (uint8_t)(sign | 0x7Eu); /* >= 448 (0x43e00000), Inf included */
  const int exp = (int)(a >> 23) - 127;               /* a float subnormal (field 0) reads as -127 */
  const uint32_t mant = (a & 0x7fffffu) | (a >> 23 ? 0x800000u : 0u); /* with the implicit 1 */
  if (exp >= -6) { /* an e4m3 normal: keep 3 of the 23 fraction bits */
    uint32_t r = (mant >> 20) & 7u, rem = mant & 0xfffffu, e = (uint32_t)(exp + 7);
    if (rem > 0x80000u || (rem == 0x80000u && (r & 1u))) r++;
    if (r == 8u) r = 0, e++; /* rounded up into the next binade (at most 448: a < 448) */
    return (uint8_t)(sign | (e << 3) | r);
  }
  /* an e4m3 subnormal: q units of 2^-9, q = mant * 2^(exp - 23 + 9) rounded */
  const int shift = 14 - exp; /* >= 21 */
  if (shift > 24 || !(a >> 23)) return sign; /* below 2^-10, half the smallest step: rounds to 0 */
  uint32_t q = mant >> shift;
  const uint32_t rem = mant & ((1u << shift) - 1u), half = 1u << (shift - 1);
  if (rem > half || (rem == half && (q & 1u))) q++;
  return (uint8_t)(sign | q); /* q == 8 is 2^-6, the smallest normal: code 0x08 */
}
#endif

/* e4m3 -> float (exact). */
MC_HD float mc_e4m3_to_f32(uint8_t c) {
  const uint32_t e = (c >> 3) & 15u, m = c & 7u;
  if ((c & 0x7Fu) == MC_E4M3_NAN) return mc_bits_f32(0x7fc00000u);
  const float v = e ? mc_bits_f32(((e + 120u) << 23) | (m << 20)) : (float)m * mc_bits_f32(0x3b000000u); /* 2^-9 */
  return (c & 0x80u) ? -v : v;
}

/* Device loops over a part of a block (16 values) must unroll, or the
 * values would live in local memory. */
#ifdef __CUDACC__
#define MC_QUANT_UNROLL _Pragma("unroll")
#else
#define MC_QUANT_UNROLL
#endif

/* amax over the finite values of n bf16 values, as float bits (the bits of
 * non-negative floats order as the floats do: parts of a block combine by
 * an integer max) */
MC_HD uint32_t mc_quant_amax_bits(const uint16_t *x, int n) {
  uint32_t amax = 0;
  MC_QUANT_UNROLL
  for (int i = 0; i < n; i++) {
    const uint32_t a = ((uint32_t)x[i] << 16) & 0x7fffffffu;
    if (a < 0x7f800000u && a > amax) amax = a;
  }
  return amax;
}
MC_HD float mc_quant_amax(const uint16_t *x, int n) { return mc_bits_f32(mc_quant_amax_bits(x, n)); }

/* The UE8M0 exponent of a block whose amax is `amax`: the smallest e with
 * 448 * 2^e >= amax. amax = 1.f * 2^E: 448 = 1.75 * 2^8, so e = E - 8,
 * or E - 7 where 1.f > 1.75. */
MC_HD int mc_ue8m0_exp(float amax) {
  const uint32_t a = mc_f32_bits(amax);
  if (a == 0) return 0;
  if (!(a >> 23)) return -127; /* a float subnormal: far below 448 * 2^-127 */
  const int e = (int)(a >> 23) - 127 - 8 + ((a & 0x7fffffu) > 0x600000u);
  return e < -127 ? -127 : e;
}

/* n values of a block whose amax is `amax` (the whole block, or a part of
 * it: the GPU kernels make 16 values a thread) into n e4m3 bytes. Returns
 * the block's scale as it is stored: the float's bits (fp32 format), or
 * its biased exponent byte (UE8M0). */
MC_HD uint32_t mc_quant_values(const uint16_t *x, int n, float amax, int ue8m0, uint8_t *q) {
  if (ue8m0) {
    const int e = mc_ue8m0_exp(amax);
    /* 2^-e as a float, a normal: e <= 120 for any finite bf16 amax (3.4e38) */
    const float inv = mc_bits_f32((uint32_t)(127 - e) << 23);
    MC_QUANT_UNROLL
    for (int i = 0; i < n; i++) q[i] = mc_f32_to_e4m3(mc_bf16_to_f32(x[i]) * inv);
    return (uint32_t)(e + 127);
  }
  const float s = amax > 0.0f ? amax / MC_E4M3_MAX : 1.0f;
  /* x / s without a division a value: with r = 1 / s rounded, q0 = x r and
   * the exact remainder x - q0 s (one fused multiply-add), q0 + remainder x r
   * is the rounded quotient (Markstein's correction), save where the
   * quotient is zero, infinite or NaN (then q0 is it) or below float's
   * normal range (there it may differ in its last bits, but every such
   * quotient is far below half the smallest e4m3 step and makes +-0 either
   * way). A block with a tiny s (amax below 2^-100 x 448) is scaled by 2^64
   * first, which is exact (every finite value of the block is at most amax)
   * and keeps r finite. Test quant_division checks the e4m3 bytes against
   * the division's for every bf16 amax and every bf16 value a block with it
   * can hold. On a GPU a division is a dozen instructions and a branch;
   * sixteen of them a thread would make the fp32 quantising dispatch slow. */
  const float k = s < 0x1p-100f ? 0x1p64f : 1.0f, sk = s * k, r = 1.0f / sk;
  MC_QUANT_UNROLL
  for (int i = 0; i < n; i++) {
    const float xk = mc_bf16_to_f32(x[i]) * k, q0 = xk * r;
    const uint32_t b = mc_f32_bits(q0) & 0x7fffffffu;
    q[i] = mc_f32_to_e4m3(b != 0 && b < 0x7f800000u ? fmaf(fmaf(-q0, sk, xk), r, q0) : q0);
  }
  return mc_f32_bits(s);
}

/* The scalar ways for a part, out of line on a device: one copy in a
 * kernel's code, not one for each part a thread makes, as they are rare
 * there (a part holding Inf or NaN, a block of fp32 scale below 2^-100);
 * inlined, they would grow the kernel's code and its waits for
 * instruction fetch. */
#ifdef __CUDA_ARCH__
#define MC_QUANT_COLD static __host__ __device__ __noinline__
#else
#define MC_QUANT_COLD static inline
#endif
/* passed and returned by value: a pointer would put the caller's words in
 * local memory, stored and loaded again for every part */
typedef struct mc_qpart {
  uint32_t w[8];
} mc_qpart_t;
typedef struct mc_qbytes {
  uint32_t q[4], scale;
} mc_qbytes_t;
MC_QUANT_COLD uint32_t mc_quant_amax16_scalar(mc_qpart_t p) {
  uint16_t x[16];
  memcpy(x, p.w, sizeof x);
  return mc_quant_amax_bits(x, 16);
}
MC_QUANT_COLD mc_qbytes_t mc_quant_values16_scalar(mc_qpart_t p, float amax, int ue8m0) {
  uint16_t x[16];
  mc_qbytes_t r;
  memcpy(x, p.w, sizeof x);
  r.scale = mc_quant_values(x, 16, amax, ue8m0, (uint8_t *)r.q);
  return r;
}

/* A part of a block as the GPU kernels hold it: 16 bf16 values in 8 words,
 * two a word (the lower half first). The same amax, bytes and scale as
 * mc_quant_amax_bits and mc_quant_values, two values an instruction where
 * the device has them (sm_89 and later): the bf16x2 maximum of the
 * magnitudes (it skips a NaN operand; a part whose maximum is Inf or NaN
 * takes the scalar way), and the conversion of two floats to two e4m3
 * bytes in one instruction, whose NaN (0xFF for a negative one) is made
 * 0x7F on four bytes at once (no finite value gives 0xFF or 0x7F: they
 * saturate to +-448); the scalar ways are out of line and take a part by
 * value. Tests gpu_quant_division (every bf16 amax and every value a block
 * with it can hold, both formats) and gpu_quant_dispatch. */
MC_HD uint32_t mc_quant_amax16(const uint32_t w[8]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  uint32_t m = w[0] & 0x7fff7fffu;
  MC_QUANT_UNROLL
  for (int i = 1; i < 8; i++) asm("max.bf16x2 %0, %0, %1;" : "+r"(m) : "r"(w[i] & 0x7fff7fffu));
  const uint32_t hi = m >> 16, lo = m & 0xffffu, top = hi > lo ? hi : lo;
  if (top < 0x7f80u) return top << 16;
#endif
  mc_qpart_t p;
  MC_QUANT_UNROLL
  for (int i = 0; i < 8; i++) p.w[i] = w[i];
  return mc_quant_amax16_scalar(p);
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
/* two floats to their e4m3 bytes, a the lower */
MC_HD uint32_t mc_e4m3x2(float a, float b) {
  unsigned short r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(b), "f"(a));
  return r;
}
/* four e4m3 bytes whose 0xFF (a NaN) become 0x7F: a byte's top bit stays
 * where its low 7 bits are not all ones (no carry leaves a byte) */
MC_HD uint32_t mc_e4m3x4_nan(uint32_t q) {
  return q & (((~q & 0x7f7f7f7fu) + 0x7f7f7f7fu) | 0x7f7f7f7fu);
}
/* whether a part's 16 values are all finite: the bf16x2 maximum of the
 * magnitudes that keeps a NaN is below Inf in both halves */
MC_HD int mc_quant_finite16(const uint32_t w[8]) {
  uint32_t m = w[0] & 0x7fff7fffu;
  MC_QUANT_UNROLL
  for (int i = 1; i < 8; i++) asm("max.NaN.bf16x2 %0, %0, %1;" : "+r"(m) : "r"(w[i] & 0x7fff7fffu));
  return (m & 0x7f80u) != 0x7f80u && (m & 0x7f800000u) != 0x7f800000u;
}
#endif

MC_HD uint32_t mc_quant_values16(const uint32_t w[8], float amax, int ue8m0, uint32_t q[4]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  if (ue8m0) {
    const int e = mc_ue8m0_exp(amax);
    const float inv = mc_bits_f32((uint32_t)(127 - e) << 23);
    MC_QUANT_UNROLL
    for (int i = 0; i < 4; i++) {
      const uint32_t a = w[2 * i], b = w[2 * i + 1];
      const uint32_t lo = mc_e4m3x2(mc_bits_f32(a << 16) * inv, mc_bits_f32(a & 0xffff0000u) * inv);
      const uint32_t hi = mc_e4m3x2(mc_bits_f32(b << 16) * inv, mc_bits_f32(b & 0xffff0000u) * inv);
      q[i] = mc_e4m3x4_nan(lo | hi << 16);
    }
    return (uint32_t)(e + 127);
  }
  const float s = amax > 0.0f ? amax / MC_E4M3_MAX : 1.0f;
  if (s >= 0x1p-100f && mc_quant_finite16(w)) {
    /* mc_quant_values' quotient, k = 1, with its remainder as -(q0 s - x):
     * the same value, but a zero x keeps its sign through it (for x = -0,
     * x - q0 s is +0, and so is the quotient), so finite values need none
     * of the checks there, and their bytes hold no NaN. Every finite bf16
     * value of every block of such a scale gives the division's byte
     * (test gpu_quant_division). */
    const float r = 1.0f / s;
    float y[16];
    MC_QUANT_UNROLL
    for (int i = 0; i < 16; i++) {
      const float x = mc_bits_f32(i & 1 ? w[i / 2] & 0xffff0000u : w[i / 2] << 16), q0 = x * r;
      y[i] = fmaf(-fmaf(q0, s, -x), r, q0);
    }
    MC_QUANT_UNROLL
    for (int i = 0; i < 4; i++)
      q[i] = mc_e4m3x2(y[4 * i], y[4 * i + 1]) | mc_e4m3x2(y[4 * i + 2], y[4 * i + 3]) << 16;
    return mc_f32_bits(s);
  }
#endif
  mc_qpart_t p;
  MC_QUANT_UNROLL
  for (int i = 0; i < 8; i++) p.w[i] = w[i];
  const mc_qbytes_t r = mc_quant_values16_scalar(p, amax, ue8m0);
  MC_QUANT_UNROLL
  for (int i = 0; i < 4; i++) q[i] = r.q[i];
  return r.scale;
}

/* One block of n <= MC_QBLOCK bf16 values into n e4m3 bytes; the scale as
 * a float (fp32 format) or as its biased exponent byte (UE8M0). */
MC_HD float mc_quant_block_fp32(const uint16_t *x, int n, uint8_t *q) {
  return mc_bits_f32(mc_quant_values(x, n, mc_quant_amax(x, n), 0, q));
}
MC_HD uint8_t mc_quant_block_ue8m0(const uint16_t *x, int n, uint8_t *q) {
  return (uint8_t)mc_quant_values(x, n, mc_quant_amax(x, n), 1, q);
}

/* nblocks consecutive blocks of MC_QBLOCK values (a token's row, or rows
 * one after another) into e4m3 bytes and their scales, one after another. */
MC_HD void mc_quant_blocks(const uint16_t *x, size_t nblocks, int ue8m0, uint8_t *q, uint8_t *scales) {
  for (size_t b = 0; b < nblocks; b++) {
    const uint16_t *xb = x + b * MC_QBLOCK;
    const uint32_t sc = mc_quant_values(xb, MC_QBLOCK, mc_quant_amax(xb, MC_QBLOCK), ue8m0, q + b * MC_QBLOCK);
    if (ue8m0) scales[b] = (uint8_t)sc;
    else memcpy(scales + b * 4, &sc, sizeof sc);
  }
}

#endif
