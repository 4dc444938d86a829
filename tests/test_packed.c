/* test_packed.c - the packed receive layouts (MC_LAYOUT_PACKED,
 * MC_LAYOUT_EXPERT_SORTED) on the cpu transport against the reference
 * model: the random cases of the batched layout run on them, with the
 * capacity declared by the send half or counted between the halves; the
 * edges (every token to one expert, ranks that receive nothing, a declared
 * capacity that some rounds exceed, groups of several ranks, processes);
 * and the rules of the calls. Inputs are drawn fresh from the run's seed; a
 * failure prints the seed and the case. */
#include <stdlib.h>
#include <string.h>

#include "mc_ref_run.h"
#include "mc_test.h"

static uint64_t case_seed(int i) { return mc_test_seed * 1000003ull + 7919u * (uint64_t)i; }

/* The batched layout's random cases, each in both packed layouts; the
 * capacity declared (the harness's buffers) or counted; one call or halves. */
int test_random_packed(void) {
  static const int aligns[] = {1, 4, 128};
  for (int i = 0; i < 16; i++) {
    mc_case_t c;
    mc_ref_random_case(case_seed(i), &c);
    c.layout = i % 2 ? MC_LAYOUT_EXPERT_SORTED : MC_LAYOUT_PACKED;
    c.expert_align = c.layout == MC_LAYOUT_EXPERT_SORTED ? aligns[(i / 2) % 3] : 1;
    c.declare = i % 4 < 2 ? 0 : -1;
    mc_run_opts_t o = MC_RUN_OPTS_DEFAULT;
    o.rounds = 3;
    o.whole = 2;
    o.split = i % 8 == 7;
    MC_CHECK(mc_test_run_case(&c, &o) == 0);
  }
  return 0;
}

/* The edges: every token of every group to the same experts (one rank gets
 * them all, the others nothing), a declared capacity that the rounds with
 * many tokens exceed (every rank fails those with MC_ERR_CAPACITY naming
 * the rank; the rounds after pass), groups of two, ranks as processes. */
int test_packed_edges(void) {
  for (int i = 0; i < 10; i++) {
    mc_case_t c;
    mc_ref_random_case(case_seed(100 + i), &c);
    c.world_size = 4;
    c.group_size = i % 4 == 3 ? 2 : 1;
    c.num_experts = 16;
    c.topk = 1 + i % 4;
    c.max_tokens = 24;
    c.routing = i % 2 ? MC_ROUTING_ONE_EXPERT : MC_ROUTING_SKEWED;
    c.zero_tokens = 1;
    c.layout = i % 4 < 2 ? MC_LAYOUT_PACKED : MC_LAYOUT_EXPERT_SORTED;
    c.expert_align = c.layout == MC_LAYOUT_EXPERT_SORTED ? 8 : 1;
    /* about a group's tokens: one-expert routing sends the hot rank every token of every group;
     * 6, 7: the odd ranks count while the even ones declare (a round both kinds drop);
     * 8, 9: two handles in turn, one's rounds between the other's halves */
    c.declare = i < 4 || i == 6 || i == 7 ? 20 : i >= 8 ? -1 : 0;
    c.odd_counted = i == 6 || i == 7;
    mc_run_opts_t o = MC_RUN_OPTS_DEFAULT;
    o.rounds = 8;
    o.whole = 2;
    o.processes = i == 5;
    o.handles = i >= 8 ? 2 : 1;
    o.split = i == 9;
    MC_CHECK(mc_test_run_case(&c, &o) == 0);
  }
  return 0;
}

/* A rank killed in a round; the others mask it and go on in the packed
 * layouts, checked against the reference without it (test_mask.c). */
int test_packed_mask_dead_rank(void) {
  for (int i = 0; i < 2; i++) {
    const int world = 3 + i, dead = (int)((mc_test_seed + (uint64_t)i) % (uint64_t)world);
    MC_CHECK(mc_test_run_masked(MC_TRANSPORT_CPU, world, dead, i == 1, 40, mc_test_seed + (uint64_t)i,
                                i ? MC_LAYOUT_EXPERT_SORTED : MC_LAYOUT_PACKED) == 0);
  }
  return 0;
}

/* One rank's handle and its inputs for the rules below. */
typedef struct one {
  mc_oob_threads_t *g;
  mc_comm_t *comm;
  mc_a2a_t *a2a;
} one_t;

static int one_open(one_t *h, mc_recv_layout_t layout, int align) {
  memset(h, 0, sizeof *h);
  mc_oob_t oob;
  mc_comm_config_t cc = MC_COMM_CONFIG_INITIALIZER;
  cc.transport = MC_TRANSPORT_CPU;
  mc_a2a_config_t ac = MC_A2A_CONFIG_INITIALIZER;
  ac.max_tokens = 4;
  ac.num_experts = 4;
  ac.experts_per_token = 2;
  ac.token_bytes = 32;
  ac.hidden = 8;
  ac.recv_layout = layout;
  ac.expert_align = align;
  if (mc_oob_threads_create(1, 5000, &h->g) || mc_oob_threads_get(h->g, 0, &oob) ||
      mc_comm_create(&oob, &cc, &h->comm))
    return -1;
  return mc_a2a_create(h->comm, &ac, &h->a2a) == MC_SUCCESS ? 0 : -1;
}

static void one_close(one_t *h) {
  mc_a2a_destroy(h->a2a);
  mc_comm_destroy(h->comm);
  mc_oob_threads_destroy(h->g);
}

/* The calls' rules, one rank: configs, which dispatch call a layout takes,
 * the count step's place, buffers too small for the counted rows (refused,
 * nothing changed, the same call then succeeds), a recv half below the
 * declared capacity, and a combine of the rows. */
int test_packed_rules(void) {
  one_t h;
  mc_comm_t *comm = NULL;
  mc_oob_threads_t *g = NULL;
  mc_oob_t oob;
  mc_comm_config_t cc = MC_COMM_CONFIG_INITIALIZER;
  cc.transport = MC_TRANSPORT_CPU;
  MC_CHECK(mc_oob_threads_create(1, 5000, &g) == 0 && mc_oob_threads_get(g, 0, &oob) == 0);
  MC_CHECK(mc_comm_create(&oob, &cc, &comm) == MC_SUCCESS);
  mc_a2a_config_t ac = MC_A2A_CONFIG_INITIALIZER;
  ac.max_tokens = 4, ac.num_experts = 4, ac.experts_per_token = 2, ac.token_bytes = 32, ac.hidden = 8;
  mc_a2a_t *bad = NULL;
  ac.recv_layout = (mc_recv_layout_t)3;
  MC_CHECK(mc_a2a_create(comm, &ac, &bad) == MC_ERR_INVALID_ARG && strstr(mc_last_error(), "recv_layout"));
  ac.recv_layout = MC_LAYOUT_PACKED, ac.expert_align = 8;
  MC_CHECK(mc_a2a_create(comm, &ac, &bad) == MC_ERR_INVALID_ARG && strstr(mc_last_error(), "expert_align"));
  ac.recv_layout = MC_LAYOUT_EXPERT_SORTED, ac.expert_align = 2048;
  MC_CHECK(mc_a2a_create(comm, &ac, &bad) == MC_ERR_INVALID_ARG && strstr(mc_last_error(), "expert_align"));
  /* rows are int32: 2.2 million experts padded to 1024 rows each could need more */
  ac.expert_align = 1024, ac.num_experts = 2200000, ac.experts_per_token = 1;
  MC_CHECK(mc_a2a_create(comm, &ac, &bad) == MC_ERR_INVALID_ARG && strstr(mc_last_error(), "2^31 - 1"));
  ac.num_experts = 4, ac.experts_per_token = 2;
  mc_comm_destroy(comm);
  mc_oob_threads_destroy(g);

  for (int sorted = 0; sorted < 2; sorted++) {
    MC_CHECK(one_open(&h, sorted ? MC_LAYOUT_EXPERT_SORTED : MC_LAYOUT_PACKED, sorted ? 4 : 1) == 0);
    uint8_t tokens[4 * 32], x[64 * 32];
    int32_t idx[8] = {0, 1, 2, 3, 1, 2, 3, 0}, re[64 * 2], cnt[4], off[5], src[1], hc[4];
    float w[8] = {1, 2, 3, 4, 5, 6, 7, 8}, rw[64 * 2];
    int64_t rows = -1, hrows = -1;
    for (int i = 0; i < (int)sizeof tokens; i++) tokens[i] = (uint8_t)(i * 7 + 1);
    mc_packed_recv_t r = {sizeof r, 0, x, NULL, re, rw, cnt, off, src, &rows};
    /* the batched call is refused; counts before the send half are refused */
    MC_CHECK(mc_dispatch(h.a2a, tokens, NULL, idx, w, 4, NULL, x, NULL, cnt, MC_SEND, NULL) == MC_ERR_INVALID_USAGE);
    MC_CHECK(mc_dispatch_counts(h.a2a, &hrows, hc, NULL) == MC_ERR_INVALID_USAGE);
    /* counted: no capacity declared, the recv half needs the count step first */
    MC_CHECK(mc_dispatch_packed(h.a2a, tokens, NULL, idx, w, 4, NULL, NULL, MC_SEND, NULL) == MC_SUCCESS);
    r.capacity = 64;
    MC_CHECK(mc_dispatch_packed(h.a2a, NULL, NULL, NULL, NULL, 0, NULL, &r, MC_RECV, NULL) == MC_ERR_INVALID_USAGE);
    MC_CHECK(mc_dispatch_counts(h.a2a, &hrows, hc, NULL) == MC_SUCCESS);
    /* one rank holds every expert: packed, a row a token; sorted, a row a pair, each expert padded to 4 */
    MC_CHECK(hrows == (sorted ? 16 : 4));
    /* each expert's rows: its two pairs, padded to 4 where sorted */
    for (int l = 0; l < 4; l++) MC_CHECK(hc[l] == (sorted ? 4 : 2));
    r.capacity = hrows - 1;
    memset(re, 0x5A, sizeof re);
    MC_CHECK(mc_dispatch_packed(h.a2a, NULL, NULL, NULL, NULL, 0, NULL, &r, MC_RECV, NULL) == MC_ERR_INVALID_ARG);
    MC_CHECK(re[0] == 0x5A5A5A5A); /* nothing written */
    r.capacity = hrows;
    MC_CHECK(mc_dispatch_packed(h.a2a, NULL, NULL, NULL, NULL, 0, NULL, &r, MC_RECV, NULL) == MC_SUCCESS);
    MC_CHECK(rows == hrows && src[0] == (sorted ? 8 : 4) && off[4] == (sorted ? 16 : 8));
    if (!sorted) { /* token 1 (ids 2, 3): its row names them in ascending id with their weights */
      MC_CHECK(re[2] == 2 && re[3] == 3 && rw[2] == 3.0f && rw[3] == 4.0f);
      MC_CHECK(memcmp(x + 32, tokens + 32, 32) == 0);
    } else { /* expert 1: tokens 0 and 2 from row 4, then two padding rows */
      MC_CHECK(off[1] == 4 && re[4] == 1 && re[5] == 1 && re[6] == -1 && re[7] == -1 && rw[6] == 0.0f);
      MC_CHECK(memcmp(x + 5 * 32, tokens + 2 * 32, 32) == 0);
    }
    uint16_t y[64 * 8], out[4 * 8];
    for (int i = 0; i < 64 * 8; i++) y[i] = 0x3f80; /* bf16 1.0 */
    MC_CHECK(mc_combine(h.a2a, y, out, MC_SEND_RECV, NULL) == MC_SUCCESS);
    /* packed: each token's one row as given (1.0); sorted: its two experts weighted (1+2, 3+4, ...) */
    MC_CHECK(out[0] == (sorted ? 0x4040 : 0x3f80)); /* 3.0 or 1.0 */
    /* declared: a recv half below the declared capacity is refused, the declared one passes */
    r.capacity = 64;
    MC_CHECK(mc_dispatch_packed(h.a2a, tokens, NULL, idx, w, 4, NULL, &r, MC_SEND, NULL) == MC_SUCCESS);
    r.capacity = 63;
    MC_CHECK(mc_dispatch_packed(h.a2a, NULL, NULL, NULL, NULL, 0, NULL, &r, MC_RECV, NULL) == MC_ERR_INVALID_ARG);
    r.capacity = 64;
    MC_CHECK(mc_dispatch_packed(h.a2a, NULL, NULL, NULL, NULL, 0, NULL, &r, MC_RECV, NULL) == MC_SUCCESS);
    MC_CHECK(mc_combine(h.a2a, y, out, MC_SEND_RECV, NULL) == MC_SUCCESS);
    /* declared and exceeded: the round is dropped, dispatch is next */
    r.capacity = hrows - 1;
    MC_CHECK(mc_dispatch_packed(h.a2a, tokens, NULL, idx, w, 4, NULL, &r, MC_SEND_RECV, NULL) == MC_ERR_CAPACITY);
    MC_CHECK(strstr(mc_a2a_last_error(h.a2a), "rank 0 receives") != NULL);
    MC_CHECK(mc_combine(h.a2a, y, out, MC_SEND, NULL) == MC_ERR_INVALID_USAGE);
    r.capacity = hrows;
    MC_CHECK(mc_dispatch_packed(h.a2a, tokens, NULL, idx, w, 4, NULL, &r, MC_SEND_RECV, NULL) == MC_SUCCESS);
    MC_CHECK(mc_combine(h.a2a, y, out, MC_SEND_RECV, NULL) == MC_SUCCESS);
    one_close(&h);
  }
  MC_CHECK(one_open(&h, MC_LAYOUT_BATCHED, 1) == 0);
  MC_CHECK(mc_dispatch_packed(h.a2a, NULL, NULL, NULL, NULL, 0, NULL, NULL, MC_SEND, NULL) == MC_ERR_INVALID_USAGE);
  int64_t n = 0;
  MC_CHECK(mc_dispatch_counts(h.a2a, &n, NULL, NULL) == MC_ERR_INVALID_USAGE);
  one_close(&h);
  return 0;
}
