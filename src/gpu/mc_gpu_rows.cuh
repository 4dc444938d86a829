/* mc_gpu_rows.cuh - what the kernels do to a row: 8 elements at a time in
 * each dtype (fp16 through the hardware's conversions), and a warp's share
 * of one row segment with its loads in flight. Part of mc_gpu_kernels.cuh. */
#ifndef MC_GPU_ROWS_CUH
#define MC_GPU_ROWS_CUH

#include "mc_dtype.h"
#include "mc_dev.cuh"

#include <cuda_fp16.h>

/* fp16 through the hardware's cvt instructions: the bit-arithmetic versions
 * of mc_dtype.h held 70 more registers per thread in combine-send. Round to
 * nearest even like them; NaN (the one case where cvt's canonical NaN could
 * differ) takes mc_dtype.h's path, so the bits match the cpu's everywhere. */
MC_DEV uint16_t mc_dev_f32_to_f16(float f) {
  const uint16_t h = __half_as_ushort(__float2half_rn(f));
  const uint16_t nan = (uint16_t)(((__float_as_uint(f) >> 16) & 0x8000u) | 0x7e00u);
  return f != f ? nan : h; /* a select, not a branch: no call inlined 32 times */
}
MC_DEV float mc_dev_f16_to_f32(uint16_t h) {
  const float v = __half2float(__ushort_as_half(h));
  const uint32_t nan = ((uint32_t)(h & 0x8000u) << 16) | 0x7f800000u | ((uint32_t)(h & 0x3ffu) << 13);
  return ((h & 0x7c00u) == 0x7c00u && (h & 0x3ffu)) ? __uint_as_float(nan) : v;
}
/* ---- 8 elements at a time: 16 bytes of bf16/fp16, 32 of fp32 ---- */
MC_DEV void mc_store8(void *row, int64_t i8, int dt, const float v[8]) {
  if (dt == MC_DTYPE_FP32) {
    float4 *p = (float4 *)row + 2 * i8;
    p[0] = make_float4(v[0], v[1], v[2], v[3]);
    p[1] = make_float4(v[4], v[5], v[6], v[7]);
  } else {
    int4 q;
    uint16_t *h = (uint16_t *)&q;
#pragma unroll
    for (int j = 0; j < 8; j++) h[j] = dt == MC_DTYPE_BF16 ? mc_f32_to_bf16(v[j]) : mc_dev_f32_to_f16(v[j]);
    ((int4 *)row)[i8] = q;
  }
}

/* The same 8 elements as raw bits (two int4 for fp32, one for 16-bit), so a
 * lane can keep several loads in flight in few registers, then fold them
 * into fp32 accumulators: acc += w * x (w = 1: acc += x, the same bits). */
typedef struct mc_raw8 {
  int4 lo, hi;
} mc_raw8_t;
MC_DEV mc_raw8_t mc_load8_raw(const void *row, int64_t i8, int dt) {
  mc_raw8_t r;
  if (dt == MC_DTYPE_FP32) {
    const int4 *p = (const int4 *)row + 2 * i8;
    r.lo = p[0];
    r.hi = p[1];
  } else {
    r.lo = ((const int4 *)row)[i8];
    r.hi = make_int4(0, 0, 0, 0);
  }
  return r;
}
MC_DEV float mc_raw8_elem(const mc_raw8_t &r, int e, int dt) {
  if (dt == MC_DTYPE_FP32) {
    const int w = e < 4 ? (e == 0 ? r.lo.x : e == 1 ? r.lo.y : e == 2 ? r.lo.z : r.lo.w)
                        : (e == 4 ? r.hi.x : e == 5 ? r.hi.y : e == 6 ? r.hi.z : r.hi.w);
    return __int_as_float(w);
  }
  const int w = (e >> 1) == 0 ? r.lo.x : (e >> 1) == 1 ? r.lo.y : (e >> 1) == 2 ? r.lo.z : r.lo.w;
  const uint16_t h = (uint16_t)((e & 1) ? ((unsigned)w >> 16) : ((unsigned)w & 0xffffu));
  return dt == MC_DTYPE_BF16 ? mc_bf16_to_f32(h) : mc_dev_f16_to_f32(h);
}
MC_DEV void mc_acc8(float acc[8], float w, const mc_raw8_t &r, int dt) {
#pragma unroll
  for (int e = 0; e < 8; e++) acc[e] = __fadd_rn(acc[e], __fmul_rn(w, mc_raw8_elem(r, e, dt)));
}

/* ---- 8 bytes at a time (4 bf16/fp16 values, 2 fp32): combine-send's
 * block path, a thread's share of a segment ---- */
/* acc += w * x, element by element, as mc_acc8 (the 8 bytes are the first
 * of a raw group) */
MC_DEV void mc_acc4(float acc[4], float w, const uint2 &r, int dt) {
  const mc_raw8_t r8 = {make_int4((int)r.x, (int)r.y, 0, 0), make_int4(0, 0, 0, 0)};
#pragma unroll
  for (int e = 0; e < 4; e++)
    if (dt != MC_DTYPE_FP32 || e < 2) acc[e] = __fadd_rn(acc[e], __fmul_rn(w, mc_raw8_elem(r8, e, dt)));
}
/* the sums rounded to dt as mc_store8 rounds them */
MC_DEV uint2 mc_pack4(const float v[4], int dt) {
  if (dt == MC_DTYPE_FP32) return make_uint2(__float_as_uint(v[0]), __float_as_uint(v[1]));
  uint16_t h[4];
#pragma unroll
  for (int j = 0; j < 4; j++) h[j] = dt == MC_DTYPE_BF16 ? mc_f32_to_bf16(v[j]) : mc_dev_f32_to_f16(v[j]);
  return make_uint2((uint32_t)h[0] | (uint32_t)h[1] << 16, (uint32_t)h[2] | (uint32_t)h[3] << 16);
}

/* ---- a warp's share of one row segment (MC_SEG_BYTES): lane owns the
 * 8-element groups g0 + lane + 32 q, four loads in flight per lane ---- */
#define MC_SEG_GROUPS_PER_LANE 4 /* 32 lanes x 4 groups x 8 bf16 = MC_SEG_BYTES */
#define MC_SEG_ROWS 2 /* rows whose loads combine-send keeps in flight at once: more spill its registers */
typedef struct mc_seg {
  int64_t g0, seg_groups, row_groups; /* first group, groups per segment, groups per row */
  int lane;
} mc_seg_t;
/* 8-element groups per segment of a row of dt (the wire's dtype, whose
 * size the shape's in_elem_bytes is): a constant where dt is */
MC_DEV int mc_seg_groups(int dt) { return (int)MC_SEG_BYTES / (8 * (dt == MC_DTYPE_FP32 ? 4 : 2)); }
MC_DEV bool mc_seg_owns(const mc_seg_t &sg, int q, int64_t *g) {
  *g = sg.g0 + sg.lane + 32 * q;
  return 32 * q + sg.lane < sg.seg_groups && *g < sg.row_groups;
}
/* fp32 segments hold half the groups: with the dtype a constant (the
 * kernels inline one copy per dtype) the unused half costs no registers */
MC_DEV bool mc_seg_q_used(int q, int dt) { return dt != MC_DTYPE_FP32 || q < MC_SEG_GROUPS_PER_LANE / 2; }
MC_DEV void mc_seg_zero(float acc[MC_SEG_GROUPS_PER_LANE][8]) {
#pragma unroll
  for (int q = 0; q < MC_SEG_GROUPS_PER_LANE; q++)
#pragma unroll
    for (int e = 0; e < 8; e++) acc[q][e] = 0.0f;
}
/* acc += w * row over the segment: all loads first, then the sums */
MC_DEV void mc_seg_axpy(float acc[MC_SEG_GROUPS_PER_LANE][8], float w, const void *row, const mc_seg_t &sg, int dt) {
  mc_raw8_t v[MC_SEG_GROUPS_PER_LANE];
  int64_t g;
#pragma unroll
  for (int q = 0; q < MC_SEG_GROUPS_PER_LANE; q++)
    if (mc_seg_q_used(q, dt) && mc_seg_owns(sg, q, &g)) v[q] = mc_load8_raw(row, g, dt);
#pragma unroll
  for (int q = 0; q < MC_SEG_GROUPS_PER_LANE; q++)
    if (mc_seg_q_used(q, dt)) mc_acc8(acc[q], w, v[q], dt);
}
/* acc += w[j] * row[j] for j < min(nr, MC_SEG_ROWS), in that order (the
 * bits of one row at a time): every row's loads in flight first */
MC_DEV void mc_seg_axpy_rows(float acc[MC_SEG_GROUPS_PER_LANE][8], const float w[MC_SEG_ROWS],
                             const void *const row[MC_SEG_ROWS], int nr, const mc_seg_t &sg, int dt) {
  const int R = MC_SEG_ROWS;
  mc_raw8_t v[MC_SEG_ROWS][MC_SEG_GROUPS_PER_LANE];
  int64_t g;
#pragma unroll
  for (int j = 0; j < R; j++)
#pragma unroll
    for (int q = 0; q < MC_SEG_GROUPS_PER_LANE; q++)
      if (j < nr && mc_seg_q_used(q, dt) && mc_seg_owns(sg, q, &g)) v[j][q] = mc_load8_raw(row[j], g, dt);
#pragma unroll
  for (int j = 0; j < R; j++)
    if (j < nr)
#pragma unroll
      for (int q = 0; q < MC_SEG_GROUPS_PER_LANE; q++)
        if (mc_seg_q_used(q, dt)) mc_acc8(acc[q], w[j], v[j][q], dt);
}
/* seg_dt: the dtype the segment was cut for (the wire's); dt: the row's */
MC_DEV void mc_seg_store(void *row, const float acc[MC_SEG_GROUPS_PER_LANE][8], const mc_seg_t &sg, int seg_dt,
                         int dt) {
  int64_t g;
#pragma unroll
  for (int q = 0; q < MC_SEG_GROUPS_PER_LANE; q++)
    if (mc_seg_q_used(q, seg_dt) && mc_seg_owns(sg, q, &g)) mc_store8(row, g, dt, acc[q]);
}

MC_DEV uint32_t mc_lanemask_lt(void) {
  uint32_t m;
  asm("mov.u32 %0, %%lanemask_lt;" : "=r"(m));
  return m;
}

#endif
