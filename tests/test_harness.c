/* test_harness.c - the multi-rank harness itself: its checks still catch a
 * byte written past an expert's count, a slot left unwritten, a combined
 * value off by one bit and a row written past bound_m; and it touches of
 * the caller's buffers (sized as the API sizes them) only what a round
 * writes and the poisoned band past it, so that a large shape costs the
 * memory of its tokens, not of its capacity. */
#include <string.h>

#include "mc_dtype.h"
#include "mc_ref_rank.h"
#include "mc_test.h"

/* A small case with room for several blocks of combine rows. */
static void small_case(mc_case_t *c) {
  mc_ref_random_case(mc_test_seed, c);
  c->world_size = 2;
  c->group_size = 1;
  c->num_experts = 8;
  c->topk = 2;
  c->routing = MC_ROUTING_RANDOM; /* every expert gets tokens, none all of them */
  c->max_tokens = 2 * CHECK_ROWS + 9;
  c->fixed_m = 1;
  c->use_bound_m = 0;
  c->tokens = c->max_tokens - 5; /* rows past bound_m to keep poison */
}

/* Rank 0's outputs as a correct round leaves them: each expert's filled
 * slots from the reference, and the combined rows. */
static void correct_outputs(const mc_case_t *c, bufs_t *b) {
  const int L = mc_ref_local_experts(c), cap = mc_ref_capacity(c);
  for (int l = 0; l < L; l++) {
    b->count[l] = b->ref_count[l];
    for (int s = 0; s < b->count[l]; s++) {
      const size_t at = (size_t)l * cap + s;
      const mc_input_t *in = &b->ins[b->src_g[at]];
      memcpy(b->x + at * c->token_bytes, in->tokens + (size_t)b->src_t[at] * c->token_bytes, c->token_bytes);
      if (b->xs) memcpy(b->xs + at * c->scale_bytes, in->scales + (size_t)b->src_t[at] * c->scale_bytes, c->scale_bytes);
    }
  }
  mc_ref_combine(c, &b->ins[0], b->out);
}

/* What mc_rr_check_dispatch and mc_rr_check_combine say of rank 0's outputs
 * (NULL: nothing). */
static const char *verdict(const mc_case_t *c, bufs_t *b, mc_run_rank_t *me) {
  memset(me, 0, sizeof *me);
  mc_rr_check_dispatch(c, b, 0, 1, me);
  if (!me->failed) mc_rr_check_combine(c, b, 0, 1, me);
  return me->failed ? me->msg : NULL;
}

int test_harness_checks_catch(void) {
  mc_case_t c;
  small_case(&c);
  bufs_t b;
  dbufs_t d;
  MC_CHECK(mc_rr_alloc_bufs(&c, &b) == 0 && mc_rr_alloc_dbufs(&c, 0, 0, &b, &d) == 0);
  for (int g = 0; g < mc_ref_num_groups(&c); g++) {
    MC_CHECK(mc_ref_input(&c, 1, g, &b.ins[g]) == 0);
    mc_ref_input_payload(&c, &b.ins[g]);
  }
  MC_CHECK(mc_rr_poison_outputs(&c, &b, &d, 0) == 0);
  correct_outputs(&c, &b);
  mc_run_rank_t me;
  MC_CHECK_MSG(verdict(&c, &b, &me) == NULL, "%s", me.msg);
  /* an expert with room for the whole band after its count */
  const int L = mc_ref_local_experts(&c), cap = mc_ref_capacity(&c);
  int l = 0;
  while (l < L && (b.count[l] < 1 || b.count[l] + POISON_BAND > cap)) l++;
  MC_CHECK(l < L);
  const size_t first = (size_t)l * cap, last_band = first + (size_t)b.count[l] + POISON_BAND - 1;
  /* a byte in the band's last slot */
  b.x[last_band * c.token_bytes + c.token_bytes / 2] ^= 1;
  MC_CHECK(verdict(&c, &b, &me) != NULL && strstr(me.msg, "past count") != NULL);
  b.x[last_band * c.token_bytes + c.token_bytes / 2] ^= 1;
  /* a filled slot left with its poison */
  memset(b.x + first * c.token_bytes, POISON_X, c.token_bytes);
  MC_CHECK(verdict(&c, &b, &me) != NULL && strstr(me.msg, "should hold token") != NULL);
  correct_outputs(&c, &b);
  /* one bit of the last valid row (not in the first block of rows) */
  const size_t out_row = (size_t)c.hidden * mc_dtype_size(c.out_dtype);
  const int bound = b.ins[0].bound_m;
  MC_CHECK(bound > CHECK_ROWS && bound < c.max_tokens);
  b.out[(size_t)(bound - 1) * out_row] ^= 1;
  MC_CHECK(verdict(&c, &b, &me) != NULL && strstr(me.msg, "bits differ") != NULL);
  b.out[(size_t)(bound - 1) * out_row] ^= 1;
  /* a byte of the last row past bound_m */
  b.out[(size_t)c.max_tokens * out_row - 1] = 0;
  MC_CHECK(verdict(&c, &b, &me) != NULL && strstr(me.msg, "past bound_m") != NULL);
  mc_rr_free_dbufs(&d, &b);
  mc_rr_free_bufs(&b, mc_ref_num_groups(&c));
  return 0;
}

int test_harness_touches_what_it_checks(void) {
  /* 2 ranks, 32 local experts of 2048 slots each: 256 MB of expert_x,
   * expert_scale and expert_y a rank, of which a round fills about 3% */
  mc_case_t c;
  memset(&c, 0, sizeof c);
  c.world_size = 2, c.group_size = 1, c.num_experts = 64, c.topk = 2, c.max_tokens = 1024;
  c.hidden = 1024, c.token_bytes = 1024, c.scale_bytes = 1024;
  c.in_dtype = MC_DTYPE_BF16, c.out_dtype = MC_DTYPE_BF16, c.seed = mc_test_seed;
  mc_run_opts_t o = MC_RUN_OPTS_DEFAULT;
  o.rounds = 3; /* every round checked */
  mc_run_result_t res;
  MC_CHECK(mc_run(&c, &o, &res) == 0);
  /* each expert's slots up to its largest count of the three rounds and
   * the band, in whole pages, and a page of allocator header a buffer */
  const int L = mc_ref_local_experts(&c), cap = mc_ref_capacity(&c), G = mc_ref_num_groups(&c);
  const uint64_t row = c.token_bytes + c.scale_bytes + (uint64_t)c.hidden * mc_dtype_size(c.in_dtype), page = 4096;
  mc_input_t ins[2];
  int32_t count[32], most[2][32] = {{0}}, *src = malloc(sizeof(int32_t) * (size_t)L * cap * 2);
  MC_CHECK(src != NULL && G == 2 && L == 32);
  for (uint64_t round = 1; round <= 3; round++) {
    for (int g = 0; g < G; g++) MC_CHECK(mc_ref_input(&c, round, g, &ins[g]) == 0);
    for (int r = 0; r < c.world_size; r++) {
      mc_ref_dispatch(&c, ins, r, count, src, src + (size_t)L * cap);
      for (int l = 0; l < L; l++)
        if (count[l] > most[r][l]) most[r][l] = count[l];
    }
    for (int g = 0; g < G; g++) mc_ref_input_free(&ins[g]);
  }
  free(src);
  const uint64_t whole = (uint64_t)L * cap * row;
  for (int r = 0; r < c.world_size; r++) {
    uint64_t bound = 3 * page, filled = 0;
    for (int l = 0; l < L; l++) {
      bound += (uint64_t)(most[r][l] + POISON_BAND) * row + 3 * 2 * page;
      filled += (uint64_t)most[r][l] * row;
    }
    const uint64_t got = res.ranks[r].touched_bytes;
    fprintf(stderr, "rank %d: %llu bytes of %llu in memory, at most %llu, filled %llu\n", r, (unsigned long long)got,
            (unsigned long long)whole, (unsigned long long)bound, (unsigned long long)filled);
    MC_CHECK_MSG(got <= bound, "rank %d touched %llu bytes of its buffers, more than %llu", r,
                 (unsigned long long)got, (unsigned long long)bound);
    MC_CHECK_MSG(got >= filled, "rank %d: %llu bytes in memory, the rounds filled %llu", r,
                 (unsigned long long)got, (unsigned long long)filled);
  }
  mc_run_free(&res);
  return 0;
}
