/* mc_gpu_quant.cuh - dispatch-send's quantisation (MC_INPUT_BF16_TO_E4M3):
 * one payload piece (MC_SEG_BYTES e4m3 values, 16 blocks of 128) made by a
 * warp from the token's bf16 row, in the lane layout the copies use (lane l
 * holds the 16-byte parts l, l + 32, l + 64, l + 96 of the piece), with the
 * rules and the very functions of src/core/mc_quant.h, so the bytes and
 * scales are the cpu transport's. A block of 128 values is 8 parts, held by
 * 8 neighbouring lanes for one q: its amax is a max over those lanes
 * (order-free, so the same bits as a sequential max). Part of
 * mc_gpu_kernels.cuh. */
#ifndef MC_GPU_QUANT_CUH
#define MC_GPU_QUANT_CUH

#include "mc_quant.h"

/* Piece j of token t: v[q] the 16 e4m3 bytes of part lane + 32 q; sc[q]
 * the scale (fp32 bits, or the UE8M0 byte) of the block that part lies in.
 * Every lane of the warp calls it (shuffles); parts past the piece's bytes
 * are zero and their lanes hold no block. */
MC_DEV void mc_quant_piece(const mc_kargs_t &a, int t, int j, uint32_t bytes, int4 *v, uint32_t *sc, int lane) {
  const uint16_t *row = (const uint16_t *)a.tokens + (uint64_t)t * a.s.hidden + (uint64_t)j * MC_SEG_BYTES;
  const uint32_t cnt = bytes / 16;
  uint32_t w[4][8]; /* every load in flight first */
#pragma unroll
  for (int q = 0; q < 4; q++) {
    const uint32_t part = lane + 32u * q;
    int4 lo = make_int4(0, 0, 0, 0), hi = lo;
    if (part < cnt) {
      const int4 *src = (const int4 *)(row + (uint64_t)part * 16);
      lo = src[0], hi = src[1];
    }
    memcpy(w[q], &lo, 16);
    memcpy(w[q] + 4, &hi, 16);
  }
  /* then a part a turn, in a loop not unrolled: a warp runs this code once
   * a piece, so its time goes in fetching instructions, and a loop fetches
   * them once for the four parts (12.5 against 13.1 us of the top-8 send
   * kernel with UE8M0 scales, 13.6 against 13.9 with fp32, one H200,
   * docs/performance.md). The parts move down a place each turn (a
   * register array indexed by the turn would live in local memory). */
#pragma unroll 1
  for (int q = 0; q < 4; q++) {
    const uint32_t part = lane + 32u * q;
    uint32_t amax = part < cnt ? mc_quant_amax16(w[0]) : 0u;
#pragma unroll
    for (int o = 1; o < 8; o <<= 1) amax = max(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    uint32_t out[4] = {0, 0, 0, 0}, scale = 0;
    if (part < cnt) scale = mc_quant_values16(w[0], mc_bits_f32(amax), a.quant == 2, out);
#pragma unroll
    for (int i = 0; i < 3; i++) {
#pragma unroll
      for (int k = 0; k < 8; k++) w[i][k] = w[i + 1][k];
      v[i] = v[i + 1];
      sc[i] = sc[i + 1];
    }
    v[3] = make_int4((int)out[0], (int)out[1], (int)out[2], (int)out[3]);
    sc[3] = scale;
  }
}

/* The scales of a piece made by mc_quant_piece into a record's scale area
 * at rec_scales: one store per block, by the first of its 8 lanes. */
MC_DEV void mc_quant_piece_scales(const mc_kargs_t &a, int j, uint32_t bytes, const uint32_t *sc,
                                  unsigned char *rec_scales, int lane) {
  const uint32_t cnt = bytes / 16;
#pragma unroll
  for (int q = 0; q < 4; q++) {
    const uint32_t part = lane + 32u * q;
    if (part >= cnt || (lane & 7)) continue;
    const uint32_t block = (uint32_t)j * (MC_SEG_BYTES / MC_QBLOCK) + part / 8;
    if (a.quant == 2) rec_scales[block] = (uint8_t)sc[q];
    else ((uint32_t *)rec_scales)[block] = sc[q];
  }
}

#endif
