/* mc_gpu_quant.cuh - dispatch-send's quantisation (MC_INPUT_BF16_TO_E4M3):
 * a payload piece (MC_SEG_BYTES e4m3 values, 16 blocks of 128) is 128
 * parts of 16 values; warp qq of the piece's MC_QUANT_WARPS makes parts
 * qq x 32 to qq x 32 + 31 from the token's bf16 row, a lane each, with the
 * rules and the very functions of src/core/mc_quant.h, so the bytes and
 * scales are the cpu transport's. A block of 128 values is 8 parts, held by
 * 8 neighbouring lanes: its amax is a max over those lanes (order-free, so
 * the same bits as a sequential max). Used by mc_gpu_kernels.cuh. */
#ifndef MC_GPU_QUANT_CUH
#define MC_GPU_QUANT_CUH

#include "mc_dev.cuh"
#include "mc_quant.h"

/* Warps that quantise a piece together, a part (16 values) a lane each;
 * the dispatch-send kernels give each piece that many warps of one block. */
#define MC_QUANT_WARPS 4
static_assert(MC_SEG_BYTES / 16 == MC_QUANT_WARPS * 32, "a piece's parts: a lane each of MC_QUANT_WARPS warps");

/* Part lane + 32 qq of piece j of token t: v its 16 e4m3 bytes, sc the
 * scale (fp32 bits, or the UE8M0 byte) of the block it lies in. Every lane
 * of the warp calls it (shuffles); a part past the piece's bytes is zero
 * and holds no block. A warp makes one part each, not the piece's four: a
 * warp runs this code once a piece, so its time goes in fetching
 * instructions and in the chain of each part's steps, and four warps a
 * piece run the four chains at once. */
MC_DEV void mc_quant_part(const mc_kargs_t &a, int t, int j, uint32_t bytes, int qq, int lane, int4 *v, uint32_t *sc) {
  const uint16_t *row = (const uint16_t *)a.tokens + (uint64_t)t * a.s.hidden + (uint64_t)j * MC_SEG_BYTES;
  const uint32_t part = lane + 32u * qq;
  const bool mine = part < bytes / 16;
  uint32_t w[8], amax = 0;
  if (mine) {
    const int4 *src = (const int4 *)(row + (uint64_t)part * 16);
    const int4 lo = src[0], hi = src[1];
    memcpy(w, &lo, 16);
    memcpy(w + 4, &hi, 16);
    amax = mc_quant_amax16(w);
  }
#pragma unroll
  for (int o = 1; o < 8; o <<= 1) amax = max(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  *v = make_int4(0, 0, 0, 0);
  *sc = 0;
  if (!mine) return;
  uint32_t out[4];
  *sc = mc_quant_values16(w, mc_bits_f32(amax), a.quant == 2, out);
  memcpy(v, out, 16);
}

/* The part's 16 bytes into a record's payload piece at piece (lane
 * + 32 qq, as mc_quant_part), and its block's scale into the record's
 * scale area at rec_scales, by the first of the block's 8 lanes. */
MC_DEV void mc_quant_part_store(const mc_kargs_t &a, int j, uint32_t bytes, int qq, int lane, const int4 &v,
                                uint32_t sc, unsigned char *piece, unsigned char *rec_scales) {
  const uint32_t part = lane + 32u * qq;
  if (part >= bytes / 16) return;
  ((int4 *)piece)[part] = v;
  if (lane & 7) return;
  const uint32_t block = (uint32_t)j * (MC_SEG_BYTES / MC_QBLOCK) + part / 8;
  if (a.quant == 2) rec_scales[block] = (uint8_t)sc;
  else ((uint32_t *)rec_scales)[block] = sc;
}

#endif
