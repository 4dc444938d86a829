/* mc_ref.c - the reference model. It knows nothing of records, windows,
 * signals or chunks: it computes outputs from the definitions alone, so a
 * protocol bug cannot hide in shared code. Rounding is spelled out in the
 * same order moecomm.h documents (experts of a rank ascending, then ranks
 * ascending, fp32 accumulation). */
#include "mc_ref.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mc_dtype.h"

uint64_t mc_ref_rand(uint64_t *state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
static int rnd_range(uint64_t *st, int lo, int hi) { return lo + (int)(mc_ref_rand(st) % (uint64_t)(hi - lo + 1)); }

int mc_ref_num_groups(const mc_case_t *c) { return c->world_size / c->group_size; }
int mc_ref_capacity(const mc_case_t *c) { return mc_ref_num_groups(c) * c->max_tokens; }
int mc_ref_local_experts(const mc_case_t *c) { return c->num_experts / c->world_size; }

size_t mc_ref_in_row_bytes(const mc_case_t *c) { return c->quant ? 2 * (size_t)c->hidden : c->token_bytes; }

/* Quantised cases: bf16 rows whose magnitudes differ from block to block
 * (the scales matter), with some zeros (their payload: mc_ref_input_payload). */
static void quant_rows(const mc_case_t *c, uint64_t *st, int m, mc_input_t *in) {
  uint16_t *x = (uint16_t *)in->raw;
  const int blocks = c->hidden / 128;
  for (int t = 0; t < m; t++)
    for (int b = 0; b < blocks; b++) {
      const uint32_t center = 100 + (uint32_t)(mc_ref_rand(st) % 60); /* bf16 exponents around 2^-27 .. 2^32 */
      for (int i = 0; i < 128; i++) {
        const uint64_t r = mc_ref_rand(st);
        const uint32_t e = center - (uint32_t)(r % 10);
        x[((size_t)t * c->hidden) + (size_t)b * 128 + i] = r % 41 == 0 ? 0 : (uint16_t)(((r >> 8) & 0x807fu) | (e << 7));
      }
    }
}

void mc_ref_input_payload(const mc_case_t *c, mc_input_t *in) {
  if (!c->quant || in->payload_made) return;
  const uint16_t *x = (const uint16_t *)in->raw;
  for (int t = 0; t < in->m; t++)
    for (int b = 0; b < c->hidden / 128; b++)
      mc_ref_quant_block(x + (size_t)t * c->hidden + (size_t)b * 128, 128, c->quant == MC_REF_QUANT_UE8M0,
                         in->tokens + (size_t)t * c->token_bytes + (size_t)b * 128,
                         in->scales + (size_t)t * c->scale_bytes + (size_t)b * (c->quant == MC_REF_QUANT_UE8M0 ? 1 : 4));
  in->payload_made = 1;
}

int mc_ref_input(const mc_case_t *c, uint64_t round, int group, mc_input_t *in) {
  uint64_t st = c->seed ^ (round * 0x100000001b3ull) ^ ((uint64_t)group << 48) ^ 0x5eedull;
  memset(in, 0, sizeof *in);
  int m = c->max_tokens;
  uint64_t pick = mc_ref_rand(&st) % 8;
  if (c->fixed_m) m = c->bound_fixed ? c->max_tokens : mc_ref_tokens(c);
  else if (c->zero_tokens && pick == 0) m = 0;
  else if (pick < 4) m = rnd_range(&st, 0, c->max_tokens);
  in->m = m;
  in->bound_m = m;
  if (c->fixed_m && c->bound_fixed) {
    in->has_bound = 1;
    in->bound_m = mc_ref_tokens(c);
  } else if (c->use_bound_m && m > 0 && mc_ref_rand(&st) % 2) {
    in->has_bound = 1;
    in->bound_m = rnd_range(&st, 0, m);
  }
  size_t rows = m > 0 ? (size_t)m : 1;
  in->tokens = malloc(rows * c->token_bytes);
  in->scales = c->scale_bytes ? malloc(rows * c->scale_bytes) : NULL;
  in->raw = c->quant ? malloc(rows * mc_ref_in_row_bytes(c)) : in->tokens;
  in->indices = malloc(rows * (size_t)c->topk * sizeof(int32_t));
  in->weights = c->no_weights ? NULL : malloc(rows * (size_t)c->topk * sizeof(float));
  if (!in->tokens || !in->raw || (c->scale_bytes && !in->scales) || !in->indices || (!c->no_weights && !in->weights)) {
    mc_ref_input_free(in);
    return -1;
  }
  if (c->quant)
    quant_rows(c, &st, m, in);
  else if (c->expert_identity) /* finite values in in_dtype: the expert returns them as they are */
    for (size_t i = 0; i < (size_t)m * (size_t)c->hidden; i++)
      mc_store_elem(in->tokens, (int64_t)i, c->in_dtype, (float)((int)(mc_ref_rand(&st) % 2001) - 1000) / 500.0f);
  else
    for (size_t i = 0; i < (size_t)m * c->token_bytes; i++) in->tokens[i] = (uint8_t)mc_ref_rand(&st);
  for (size_t i = 0; !c->quant && i < (size_t)m * c->scale_bytes / 4; i++)
    ((float *)in->scales)[i] = (float)(mc_ref_rand(&st) % 1000) / 256.0f;
  int hot = (int)(mc_ref_rand(&st) % (uint64_t)c->num_experts);
  for (int t = 0; t < m; t++) {
    int32_t *idx = in->indices + (size_t)t * c->topk;
    for (int k = 0; k < c->topk; k++) {
      int e, dup;
      do {
        if (c->routing == MC_ROUTING_ONE_EXPERT) e = (hot + k) % c->num_experts; /* every token: same experts */
        else if (c->routing == MC_ROUTING_SKEWED && mc_ref_rand(&st) % 2)
          e = rnd_range(&st, 0, (c->num_experts - 1) / 4 > c->topk ? (c->num_experts - 1) / 4 : c->num_experts - 1);
        else e = rnd_range(&st, 0, c->num_experts - 1);
        dup = 0;
        for (int j = 0; j < k; j++) dup |= idx[j] == e;
      } while (dup);
      idx[k] = e;
      if (in->weights) in->weights[(size_t)t * c->topk + k] = (float)rnd_range(&st, 1, 1000) / 1000.0f;
    }
  }
  return 0;
}

void mc_ref_input_free(mc_input_t *in) {
  if (in->raw != in->tokens) free(in->raw);
  free(in->tokens);
  free(in->scales);
  free(in->indices);
  free(in->weights);
  memset(in, 0, sizeof *in);
}

static int rank_masked(const mc_case_t *c, int r) { return r < 64 && (c->masked >> r & 1u); }

static int token_has(const mc_case_t *c, const mc_input_t *in, int t, int expert) {
  for (int k = 0; k < c->topk; k++)
    if (in->indices[(size_t)t * c->topk + k] == expert) return 1;
  return 0;
}

void mc_ref_dispatch(const mc_case_t *c, const mc_input_t *ins, int rank, int32_t *count, int32_t *src_group,
                     int32_t *src_token) {
  int L = mc_ref_local_experts(c), cap = mc_ref_capacity(c);
  for (int l = 0; l < L; l++) {
    int expert = rank * L + l, n = 0;
    /* Slots in (source group, token) order, by definition. */
    for (int g = 0; g < mc_ref_num_groups(c); g++)
      for (int t = 0; t < ins[g].bound_m && !rank_masked(c, g * c->group_size); t++) {
        if (!token_has(c, &ins[g], t, expert)) continue;
        src_group[(size_t)l * cap + n] = g;
        src_token[(size_t)l * cap + n] = t;
        n++;
      }
    count[l] = n;
  }
}

int64_t mc_ref_packed_rows(const mc_case_t *c, const mc_input_t *ins, int rank, int32_t *count) {
  const int L = mc_ref_local_experts(c), align = c->expert_align > 0 ? c->expert_align : 1;
  int32_t *n = count ? count : malloc(sizeof(int32_t) * (size_t)L);
  if (!n) return -1;
  memset(n, 0, sizeof(int32_t) * (size_t)L);
  int64_t rows = 0; /* packed: a row per (group, token) with an expert here */
  for (int g = 0; g < mc_ref_num_groups(c); g++)
    for (int t = 0; t < ins[g].bound_m && !rank_masked(c, g * c->group_size); t++) {
      int any = 0;
      for (int l = 0; l < L; l++)
        if (token_has(c, &ins[g], t, rank * L + l)) any = 1, n[l]++;
      rows += any;
    }
  if (c->layout == MC_LAYOUT_EXPERT_SORTED) /* each expert's pairs, rounded up */
    for (int l = rows = 0; l < L; l++) rows += (n[l] + align - 1) / align * align;
  if (!count) free(n);
  return rows;
}

void mc_ref_expert(const mc_case_t *c, int expert, const uint8_t *x, void *y) {
  if (c->expert_identity) {
    memcpy(y, x, (size_t)c->hidden * mc_dtype_size(c->in_dtype));
    return;
  }
  for (int h = 0; h < c->hidden; h++) {
    int b = x[((size_t)h * 7 + (size_t)expert) % c->token_bytes];
    float v = (float)(b - 128) / 64.0f + (float)(expert % 5) * 0.25f;
    mc_store_elem(y, h, c->in_dtype, v);
  }
}

/* Expert e's output row for token t, as fp32 values of what in_dtype stores. */
static void expert_row(const mc_case_t *c, const mc_input_t *in, int t, int e, void *tmp, float *row) {
  mc_ref_expert(c, e, in->tokens + (size_t)t * c->token_bytes, tmp);
  for (int h = 0; h < c->hidden; h++) row[h] = mc_load_elem(tmp, h, c->in_dtype);
}

void mc_ref_combine(const mc_case_t *c, const mc_input_t *in, void *out) {
  int L = mc_ref_local_experts(c), K = c->topk;
  size_t out_row = (size_t)c->hidden * mc_dtype_size(c->out_dtype);
  float *ys = malloc(sizeof(float) * (size_t)K * c->hidden);
  void *tmp = malloc((size_t)c->hidden * 4);
  for (int t = 0; t < in->bound_m; t++) {
    const int32_t *idx = in->indices + (size_t)t * K;
    for (int k = 0; k < K; k++) expert_row(c, in, t, idx[k], tmp, ys + (size_t)k * c->hidden);
    /* the token's experts by ascending id: ranks ascending, a rank's experts ascending */
    int order[MC_MAX_TOPK];
    for (int k = 0; k < K; k++) order[k] = k;
    for (int i = 1; i < K; i++)
      for (int j = i; j > 0 && idx[order[j - 1]] > idx[order[j]]; j--) {
        int tmp_k = order[j];
        order[j] = order[j - 1];
        order[j - 1] = tmp_k;
      }
    for (int h = 0; h < c->hidden; h++) {
      float acc = 0.0f;
      for (int i = 0; i < K;) {
        int r = idx[order[i]] / L;
        float part = 0.0f; /* the partial sum rank r sends back */
        for (; i < K && idx[order[i]] / L == r; i++) {
          float w = in->weights ? in->weights[(size_t)t * K + order[i]] : 1.0f;
          part += w * ys[(size_t)order[i] * c->hidden + h];
        }
        if (rank_masked(c, r)) continue; /* its experts drop out */
        float wire;
        mc_store_elem(&wire, 0, c->in_dtype, part); /* rounded as it travels */
        acc += mc_load_elem(&wire, 0, c->in_dtype);
      }
      mc_store_elem((uint8_t *)out + (size_t)t * out_row, h, c->out_dtype, acc);
    }
  }
  free(ys);
  free(tmp);
}

void mc_ref_combine_ideal(const mc_case_t *c, const mc_input_t *in, double *out, double *absum) {
  int K = c->topk;
  void *tmp = malloc((size_t)c->hidden * 4);
  float *row = malloc(sizeof(float) * (size_t)c->hidden);
  for (int t = 0; t < in->bound_m; t++) {
    for (int h = 0; h < c->hidden; h++) out[(size_t)t * c->hidden + h] = absum[(size_t)t * c->hidden + h] = 0;
    for (int k = 0; k < K; k++) {
      if (rank_masked(c, in->indices[(size_t)t * K + k] / mc_ref_local_experts(c))) continue;
      double w = in->weights ? in->weights[(size_t)t * K + k] : 1.0;
      expert_row(c, in, t, in->indices[(size_t)t * K + k], tmp, row);
      for (int h = 0; h < c->hidden; h++) {
        out[(size_t)t * c->hidden + h] += w * row[h];
        absum[(size_t)t * c->hidden + h] += fabs(w * row[h]);
      }
    }
  }
  free(row);
  free(tmp);
}

uint64_t mc_ref_records_sent(const mc_case_t *c, const mc_input_t *in, int rank) {
  int G = c->group_size, member = rank % G, L = mc_ref_local_experts(c);
  int chunk = (in->bound_m + G - 1) / G, b = member * chunk, e = b + chunk;
  if (b > in->bound_m) b = in->bound_m;
  if (e > in->bound_m) e = in->bound_m;
  uint64_t n = 0;
  for (int t = b; t < e; t++)
    for (int r = 0; r < c->world_size; r++) {
      if (rank_masked(c, r)) continue; /* nothing goes to a masked rank */
      int hit = 0;
      for (int l = 0; l < L; l++) hit |= token_has(c, in, t, r * L + l);
      n += (uint64_t)hit;
    }
  return n;
}

void mc_ref_random_case(uint64_t seed, mc_case_t *c) {
  uint64_t st = seed;
  memset(c, 0, sizeof *c);
  c->seed = seed;
  static const int gs[] = {1, 2, 4};
  do {
    c->world_size = rnd_range(&st, 1, 16);
    c->group_size = gs[rnd_range(&st, 0, 2)];
  } while (c->world_size % c->group_size);
  int lo = (8 + c->world_size - 1) / c->world_size, hi = 256 / c->world_size;
  c->num_experts = c->world_size * rnd_range(&st, lo, hi);
  c->topk = rnd_range(&st, 1, c->num_experts < 8 ? c->num_experts : 8);
  if (c->num_experts >= 16 && mc_ref_rand(&st) % 4 == 0) c->topk = rnd_range(&st, 9, MC_MAX_TOPK); /* up to the API's limit */
  c->max_tokens = rnd_range(&st, 1, 48);
  c->token_bytes = 16 * (size_t)rnd_range(&st, 1, mc_ref_rand(&st) % 4 ? 64 : 448); /* up to 7168 */
  c->scale_bytes = mc_ref_rand(&st) % 3 ? 4 * (c->token_bytes / 128 + 1) : 0;
  c->hidden = 8 * rnd_range(&st, 1, 96);
  c->in_dtype = (mc_dtype_t)rnd_range(&st, 0, 2);
  c->out_dtype = (mc_dtype_t)rnd_range(&st, 0, 2);
  c->routing = rnd_range(&st, 0, 2);
  c->zero_tokens = rnd_range(&st, 0, 1);
  c->use_bound_m = rnd_range(&st, 0, 1);
  c->no_weights = rnd_range(&st, 0, 5) == 0;
}

int mc_ref_tokens(const mc_case_t *c) { return c->tokens > 0 ? c->tokens : c->max_tokens; }

void mc_ref_deepseek_case(int world_size, int tokens, mc_case_t *c) {
  memset(c, 0, sizeof *c);
  c->world_size = world_size;
  c->group_size = 1;
  c->num_experts = 256;
  c->topk = 8;
  c->max_tokens = tokens;
  c->hidden = 7168;
  c->token_bytes = 7168;    /* fp8 */
  c->scale_bytes = 56 * 4;  /* one float per 128 values */
  c->in_dtype = MC_DTYPE_BF16;
  c->out_dtype = MC_DTYPE_BF16;
  c->seed = 1;
  c->fixed_m = 1;
}

void mc_ref_describe(const mc_case_t *c, char *buf, size_t n) {
  static const char *dt[] = {"fp32", "bf16", "fp16"};
  snprintf(buf, n,
           "world=%d group=%d experts=%d topk=%d max_tokens=%d token_bytes=%zu scale_bytes=%zu hidden=%d "
           "%s->%s routing=%d zero=%d bound=%d noweights=%d%s seed=%llu",
           c->world_size, c->group_size, c->num_experts, c->topk, c->max_tokens, c->token_bytes, c->scale_bytes,
           c->hidden, dt[c->in_dtype], dt[c->out_dtype], c->routing, c->zero_tokens, c->use_bound_m,
           c->no_weights, c->quant == MC_REF_QUANT_FP32 ? " quant=fp32" : c->quant ? " quant=ue8m0" : "",
           (unsigned long long)c->seed);
  const size_t used = strlen(buf);
  if (c->layout != 0 && used < n) /* the packed layouts (MC_LAYOUT_BATCHED is 0) */
    snprintf(buf + used, n - used, " layout=%s align=%d declare=%lld odd_counted=%d",
             c->layout == 1 ? "packed" : "sorted", c->expert_align, (long long)c->declare, c->odd_counted);
}
