/* mc_ref.h - the reference model: plain C, slow, obviously correct. From a
 * case (shape + seed) it draws every group's inputs for a round and computes
 * what every rank must get out of dispatch and combine, straight from the
 * definitions in moecomm.h, without the protocol (no records, no signals). */
#ifndef MC_REF_H
#define MC_REF_H

#include <stddef.h>
#include <stdint.h>

#include "moecomm.h"

enum { MC_ROUTING_RANDOM = 0, MC_ROUTING_ONE_EXPERT = 1, MC_ROUTING_SKEWED = 2 };

typedef struct mc_case {
  int world_size, group_size, num_experts, topk, max_tokens, hidden;
  size_t token_bytes, scale_bytes;
  mc_dtype_t in_dtype, out_dtype;
  uint64_t seed;
  int routing;        /* MC_ROUTING_* */
  int zero_tokens;    /* 1: some groups get m = 0 in some rounds */
  int use_bound_m;    /* 1: pass bound_m < m on some rounds */
  int no_weights;     /* 1: pass weights = NULL (all 1.0) */
  int fixed_m;        /* 1: every group passes the same m every round (benchmarks): `tokens` */
  int tokens;         /* fixed_m: valid tokens each group passes (0: max_tokens) */
  int bound_fixed;    /* fixed_m: m = max_tokens with `tokens` in bound_m, read on the device (the call a
                         CUDA graph captured once replays with every batch size) */
  int expert_identity; /* 1: tokens are hidden values in in_dtype and every expert returns its
                          input unchanged (a device copy can stand in for the experts) */
  int quant;          /* MC_REF_QUANT_*: dispatch quantises bf16 rows (MC_INPUT_BF16_TO_E4M3) */
  int layout;         /* MC_LAYOUT_*: the receive layout (mc_dispatch_packed where not batched) */
  int expert_align;   /* MC_LAYOUT_EXPERT_SORTED: each expert's rows from a multiple of it (0: 1) */
  int64_t declare;    /* packed layouts: the capacity each send half declares: 0 none (the count step
                         sizes the recv buffers), -1 the harness's buffers (never exceeded), else rows */
  int odd_counted;    /* packed layouts: the odd ranks declare none and count (ranks of both kinds in a round) */
  uint64_t masked;    /* bit r: rank r masked (mc_a2a_mask_ranks; groups of one, world_size <= 64): its
                         tokens are not sent and its experts drop out of every token */
} mc_case_t;

enum { MC_REF_QUANT_NONE = 0, MC_REF_QUANT_FP32 = 1, MC_REF_QUANT_UE8M0 = 2 };

/* One group's inputs for one round (all ranks of a group hold the same). */
typedef struct mc_input {
  int m;       /* rows passed */
  int bound_m; /* valid rows; == m when use_bound_m is off (then no pointer is passed) */
  int has_bound;
  uint8_t *tokens;  /* [m][token_bytes]: the payload expert_x must hold */
  uint8_t *scales;  /* [m][scale_bytes] or NULL: what expert_scale must hold */
  uint8_t *raw;     /* [m][mc_ref_in_row_bytes]: what mc_dispatch reads (tokens, or the bf16
                       rows that quantise to tokens and scales) */
  int32_t *indices; /* [m][topk] */
  float *weights;   /* [m][topk] or NULL */
  int payload_made; /* quantised cases: tokens and scales filled (mc_ref_input_payload) */
} mc_input_t;

/* Bytes of one row of mc_dispatch's tokens: token_bytes, or 2 x hidden (bf16) when quantised. */
size_t mc_ref_in_row_bytes(const mc_case_t *c);
/* Draw group g's inputs of `round` (pure function of case, round, group). */
int mc_ref_input(const mc_case_t *c, uint64_t round, int group, mc_input_t *in);
/* Quantised cases: the payload the rows quantise to (tokens, scales), by the
 * reference quantiser; apart from mc_ref_input because only checked rounds
 * need it, and it takes the host far longer than the GPU takes to send. */
void mc_ref_input_payload(const mc_case_t *c, mc_input_t *in);
void mc_ref_input_free(mc_input_t *in);

/* Expected dispatch output on `rank`: count[L], and for each slot < count
 * which (group, token) it must hold: src_group[L][cap], src_token[L][cap]
 * (the bytes are then ins[group].tokens/scales of that token). ins has one
 * entry per group. */
void mc_ref_dispatch(const mc_case_t *c, const mc_input_t *ins, int rank, int32_t *count, int32_t *src_group,
                     int32_t *src_token);

/* The packed layouts (case.layout): the rows rank `rank` receives, packed
 * one per (group, token) with an expert there, expert-sorted each local
 * expert's pairs rounded up to expert_align; count[L] (if not NULL) gets
 * the pairs per local expert. */
int64_t mc_ref_packed_rows(const mc_case_t *c, const mc_input_t *ins, int rank, int32_t *count);

/* The fake expert used by tests and the benchmark: row y (hidden elements in
 * in_dtype) from expert `expert` (global id) applied to one token's bytes. */
void mc_ref_expert(const mc_case_t *c, int expert, const uint8_t *x, void *y);

/* Expected combine output on any rank of group g: out[bound_m][hidden] in
 * out_dtype, with the rounding moecomm.h specifies. */
void mc_ref_combine(const mc_case_t *c, const mc_input_t *in, void *out);

/* The same sum in double precision without intermediate rounding: the ideal
 * value, to state how far the specified rounding lands from it; absum gets
 * the sum of |weight * y| per element, the scale an error is relative to. */
void mc_ref_combine_ideal(const mc_case_t *c, const mc_input_t *in, double *out, double *absum);

/* One copy per (token, destination rank): the records rank `rank` must send
 * for group input `in` (its chunk of the group's valid tokens). */
uint64_t mc_ref_records_sent(const mc_case_t *c, const mc_input_t *in, int rank);

int mc_ref_num_groups(const mc_case_t *c);
/* fixed_m: the valid tokens each group passes every round */
int mc_ref_tokens(const mc_case_t *c);
int mc_ref_capacity(const mc_case_t *c);
int mc_ref_local_experts(const mc_case_t *c);

uint64_t mc_ref_rand(uint64_t *state);
/* A random valid case from a seed, within the limits the tests use. */
void mc_ref_random_case(uint64_t seed, mc_case_t *c);
/* The DeepSeek-V3 layer: 256 experts, top-8, 7168 fp8 + 56 float scales, bf16. */
void mc_ref_deepseek_case(int world_size, int tokens, mc_case_t *c);
/* Short description for messages. */
void mc_ref_describe(const mc_case_t *c, char *buf, size_t n);

/* The reference quantiser (src/core/mc_quant.h states the rules): one float
 * to e4m3; one block of n bf16 values to n e4m3 bytes and its scale (fp32:
 * 4 bytes; ue8m0: 1 byte, the biased exponent). */
uint8_t mc_ref_e4m3(float x);
void mc_ref_quant_block(const uint16_t *x, int n, int ue8m0, uint8_t *q, uint8_t *scale);

#endif
