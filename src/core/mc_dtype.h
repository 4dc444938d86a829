/* mc_dtype.h - fp32 <-> bf16/fp16 conversions in plain bit arithmetic,
 * usable on host and device, round-to-nearest-even like the CUDA
 * intrinsics, so the CPU transport, the reference model and the GPU
 * kernels round identically. */
#ifndef MC_DTYPE_H
#define MC_DTYPE_H

#include <stdint.h>
#include <string.h>

#include "mc_layout.h" /* MC_HD */
#include "moecomm.h"

MC_HD uint32_t mc_f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}
MC_HD float mc_bits_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

MC_HD uint16_t mc_f32_to_bf16(float f) {
  uint32_t u = mc_f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* quiet NaN */
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}
MC_HD float mc_bf16_to_f32(uint16_t h) { return mc_bits_f32((uint32_t)h << 16); }

MC_HD float mc_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  if (exp == 0x1fu) return mc_bits_f32(sign | 0x7f800000u | (man << 13));
  if (exp == 0) {
    if (man == 0) return mc_bits_f32(sign);
    /* subnormal: value = man * 2^-24 */
    float v = (float)man * (1.0f / 16777216.0f);
    return sign ? -v : v;
  }
  return mc_bits_f32(sign | ((exp + 112u) << 23) | (man << 13));
}

MC_HD uint16_t mc_f32_to_f16(float f) {
  uint32_t u = mc_f32_bits(f);
  uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);  /* NaN */
  if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* rounds to inf */
  if (a < 0x38800000u) {                                   /* subnormal or zero in fp16 */
    if (a < 0x33000000u) return sign;                      /* below half the smallest subnormal */
    uint32_t man = (a & 0x7fffffu) | 0x800000u;
    int shift = 126 - (int)(a >> 23); /* 14..24 */
    uint32_t q = man >> shift, rem = man & ((1u << shift) - 1u), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u))) q++;
    return (uint16_t)(sign | q);
  }
  uint32_t r = a - 0x38000000u; /* rebias exponent 127 -> 15 */
  r += 0xfffu + ((r >> 13) & 1u);
  return (uint16_t)(sign | (r >> 13));
}

/* Element i of a row in dtype, as fp32. */
MC_HD float mc_load_elem(const void *row, int64_t i, mc_dtype_t dt) {
  if (dt == MC_DTYPE_FP32) return ((const float *)row)[i];
  uint16_t h = ((const uint16_t *)row)[i];
  return dt == MC_DTYPE_BF16 ? mc_bf16_to_f32(h) : mc_f16_to_f32(h);
}
MC_HD void mc_store_elem(void *row, int64_t i, mc_dtype_t dt, float v) {
  if (dt == MC_DTYPE_FP32) ((float *)row)[i] = v;
  else ((uint16_t *)row)[i] = dt == MC_DTYPE_BF16 ? mc_f32_to_bf16(v) : mc_f32_to_f16(v);
}

/* acc[i] += w * row[i] (w == 1: acc[i] += row[i], the same bits as 1 * x)
 * for a whole row: the dtype switch once per row, not per element. */
static inline void mc_row_axpy(float *acc, float w, const void *row, int64_t n, mc_dtype_t dt) {
  if (dt == MC_DTYPE_FP32) {
    const float *r = (const float *)row;
    for (int64_t i = 0; i < n; i++) acc[i] += w * r[i];
  } else if (dt == MC_DTYPE_BF16) {
    const uint16_t *r = (const uint16_t *)row;
    for (int64_t i = 0; i < n; i++) acc[i] += w * mc_bf16_to_f32(r[i]);
  } else {
    const uint16_t *r = (const uint16_t *)row;
    for (int64_t i = 0; i < n; i++) acc[i] += w * mc_f16_to_f32(r[i]);
  }
}

/* row[i] = acc[i] rounded to dt. */
static inline void mc_row_store(void *row, const float *acc, int64_t n, mc_dtype_t dt) {
  if (dt == MC_DTYPE_FP32) memcpy(row, acc, (size_t)n * sizeof(float));
  else if (dt == MC_DTYPE_BF16)
    for (int64_t i = 0; i < n; i++) ((uint16_t *)row)[i] = mc_f32_to_bf16(acc[i]);
  else
    for (int64_t i = 0; i < n; i++) ((uint16_t *)row)[i] = mc_f32_to_f16(acc[i]);
}

#endif
