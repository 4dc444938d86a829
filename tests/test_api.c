/* test_api.c - the API surface: versions, strings, initializers, argument
 * rules of the create calls, ownership rules of destroy. */
#include <pthread.h>
#include <string.h>

#define MC_ERRTEXT_LEN_TEST 512

#include "mc_test.h"
#include "moecomm_bench.h"

int test_version_and_strings(void) {
  MC_CHECK(mc_version() == MC_VERSION);
  MC_CHECK(MC_VERSION == MC_VERSION_CODE(MC_VERSION_MAJOR, MC_VERSION_MINOR, MC_VERSION_PATCH));
  for (int r = MC_SUCCESS; r <= MC_ERR_INTERNAL; r++) {
    const char *s = mc_result_string((mc_result_t)r);
    MC_CHECK(s && strncmp(s, "MC_", 3) == 0 && strstr(s, "UNKNOWN") == NULL);
  }
  MC_CHECK(strstr(mc_result_string((mc_result_t)99), "UNKNOWN") != NULL);
  MC_CHECK(strcmp(mc_transport_name(MC_TRANSPORT_CPU), "cpu") == 0);
  MC_CHECK(mc_transport_name((mc_transport_t)42) == NULL);
  MC_CHECK(mc_dtype_size(MC_DTYPE_BF16) == 2 && mc_dtype_size(MC_DTYPE_FP32) == 4);
  MC_CHECK(mc_dtype_size((mc_dtype_t)9) == 0);
  mc_comm_config_t cc = MC_COMM_CONFIG_INITIALIZER;
  MC_CHECK(cc.size == sizeof cc && cc.group_size == 1 && cc.transport == MC_TRANSPORT_AUTO);
  mc_a2a_config_t ac = MC_A2A_CONFIG_INITIALIZER;
  MC_CHECK(ac.size == sizeof ac && ac.combine_in_dtype == MC_DTYPE_BF16);
  return 0;
}

/* One rank, for checks that need a live communicator. */
typedef struct solo {
  mc_oob_threads_t *g;
  mc_oob_t oob;
  mc_comm_t *comm;
} solo_t;

static int solo_open_on(solo_t *s, int group_size, mc_transport_t transport) {
  memset(s, 0, sizeof *s);
  if (mc_oob_threads_create(1, 1000, &s->g) != MC_SUCCESS) return 1;
  if (mc_oob_threads_get(s->g, 0, &s->oob) != MC_SUCCESS) return 1;
  mc_comm_config_t cc = MC_COMM_CONFIG_INITIALIZER;
  cc.group_size = group_size;
  cc.transport = transport;
  return mc_comm_create(&s->oob, &cc, &s->comm) != MC_SUCCESS;
}
static int solo_open(solo_t *s, int group_size) {
  return solo_open_on(s, group_size, MC_TRANSPORT_AUTO);
}
static void solo_close(solo_t *s) {
  mc_comm_destroy(s->comm);
  mc_oob_threads_destroy(s->g);
}

/* A small valid config (no scales, bf16 combine). */
static mc_a2a_config_t small_config(int max_tokens, int experts, int topk, size_t token_bytes, int hidden) {
  mc_a2a_config_t ac = MC_A2A_CONFIG_INITIALIZER;
  ac.max_tokens = max_tokens;
  ac.num_experts = experts;
  ac.experts_per_token = topk;
  ac.token_bytes = token_bytes;
  ac.hidden = hidden;
  return ac;
}

int test_comm_rules(void) {
  mc_oob_threads_t *g;
  MC_CHECK_OK(mc_oob_threads_create(4, 1000, &g));
  mc_oob_t oob;
  MC_CHECK_OK(mc_oob_threads_get(g, 1, &oob));
  MC_CHECK_RC(mc_oob_threads_get(g, 4, &oob), MC_ERR_INVALID_ARG);
  MC_CHECK(strstr(mc_last_error(), "rank=4") != NULL);
  MC_CHECK_OK(mc_oob_threads_get(g, 1, &oob));
  mc_comm_t *comm = (mc_comm_t *)1;
  mc_comm_config_t cc = MC_COMM_CONFIG_INITIALIZER;
  cc.group_size = 3; /* does not divide 4 */
  MC_CHECK_RC(mc_comm_create(&oob, &cc, &comm), MC_ERR_INVALID_ARG);
  MC_CHECK(comm == NULL);
  MC_CHECK(strstr(mc_last_error(), "group_size=3") != NULL);
  cc = (mc_comm_config_t)MC_COMM_CONFIG_INITIALIZER;
  cc.size = 8; /* a caller built against another struct */
  MC_CHECK_RC(mc_comm_create(&oob, &cc, &comm), MC_ERR_INVALID_ARG);
  MC_CHECK(strstr(mc_last_error(), "MC_COMM_CONFIG_INITIALIZER") != NULL);
  cc = (mc_comm_config_t)MC_COMM_CONFIG_INITIALIZER;
  cc.transport = MC_TRANSPORT_NVSHMEM;
  MC_CHECK_RC(mc_comm_create(&oob, &cc, &comm), MC_ERR_UNSUPPORTED);
  MC_CHECK(strstr(mc_last_error(), "nvshmem") != NULL);
  cc.transport = MC_TRANSPORT_P2P; /* no GPU here (or no GPU build): refused the same way */
  MC_CHECK_RC(mc_comm_create(&oob, &cc, &comm), MC_ERR_UNSUPPORTED);
  MC_CHECK(strstr(mc_last_error(), "p2p") != NULL);
  cc.transport = (mc_transport_t)17;
  MC_CHECK_RC(mc_comm_create(&oob, &cc, &comm), MC_ERR_INVALID_ARG);
  MC_CHECK_RC(mc_comm_create(NULL, &cc, &comm), MC_ERR_INVALID_ARG);
  MC_CHECK_RC(mc_comm_create(&oob, NULL, &comm), MC_ERR_INVALID_ARG);
  MC_CHECK_OK(mc_comm_destroy(NULL));
  mc_oob_threads_destroy(g);
  return 0;
}

int test_a2a_config_rules(void) {
  solo_t s;
  MC_CHECK(solo_open(&s, 1) == 0);
  MC_CHECK(mc_comm_transport(s.comm) == MC_TRANSPORT_CPU); /* auto without a GPU */
  mc_a2a_config_t good = small_config(8, 8, 2, 64, 16);
  good.scale_bytes = 8;
  mc_a2a_t *a2a = (mc_a2a_t *)1;
  /* each broken rule: the code, and a message naming the field and value */
  mc_a2a_config_t c;
#define BAD(stmt, needle)                                                              \
  c = good;                                                                            \
  stmt;                                                                                \
  MC_CHECK_RC(mc_a2a_create(s.comm, &c, &a2a), MC_ERR_INVALID_ARG);                    \
  MC_CHECK(a2a == NULL);                                                               \
  MC_CHECK_MSG(strstr(mc_comm_last_error(s.comm), needle) != NULL, "%s", mc_comm_last_error(s.comm));
  BAD(c.max_tokens = 0, "max_tokens=0");
  BAD(c.num_experts = 0, "num_experts=0");
  BAD(c.experts_per_token = 0, "experts_per_token=0");
  BAD(c.experts_per_token = 9, "experts_per_token=9");
  BAD(c.experts_per_token = MC_MAX_TOPK + 1, "experts_per_token=17");
  BAD(c.token_bytes = 24, "token_bytes=24");
  BAD(c.scale_bytes = 6, "scale_bytes=6");
  BAD(c.hidden = 12, "hidden=12");
  BAD(c.combine_in_dtype = (mc_dtype_t)5, "combine_in_dtype=5");
  BAD(c.combine_out_dtype = (mc_dtype_t)5, "combine_out_dtype=5");
  BAD(c.index_dtype = (mc_index_dtype_t)2, "index_dtype=2");
  BAD(c.size = 4, "MC_A2A_CONFIG_INITIALIZER");
#undef BAD
  MC_CHECK_RC(mc_a2a_create(s.comm, NULL, &a2a), MC_ERR_INVALID_ARG);
  MC_CHECK_OK(mc_a2a_create(s.comm, &good, &a2a));
  MC_CHECK(mc_a2a_expert_capacity(a2a) == 8 && mc_a2a_num_local_experts(a2a) == 8);
  /* a communicator with a live handle refuses to go, and stays usable */
  MC_CHECK_RC(mc_comm_destroy(s.comm), MC_ERR_INVALID_USAGE);
  MC_CHECK(strstr(mc_comm_last_error(s.comm), "not destroyed") != NULL);
  mc_a2a_stats_t st = {.size = 3};
  MC_CHECK_RC(mc_a2a_get_stats(a2a, &st), MC_ERR_INVALID_ARG);
  st.size = sizeof st;
  MC_CHECK_OK(mc_a2a_get_stats(a2a, &st));
  MC_CHECK(st.buffer_bytes > 0 && st.rounds == 0);
  MC_CHECK_OK(mc_a2a_destroy(a2a));
  MC_CHECK_OK(mc_a2a_destroy(NULL));
  /* int64 ids must be 8-byte aligned: 4 is refused, naming the pointer */
  c = good;
  c.index_dtype = MC_INDEX_INT64;
  MC_CHECK_OK(mc_a2a_create(s.comm, &c, &a2a));
  _Alignas(16) unsigned char tok[2 * 64], sc[2 * 8], x[8 * 8 * 64], xs[8 * 8 * 8];
  _Alignas(16) int64_t ids[2 * 2 + 1] = {0, 1, 2, 3, 4};
  int32_t cnt[8];
  MC_CHECK_RC(mc_dispatch(a2a, tok, sc, (const char *)ids + 4, NULL, 2, NULL, x, xs, cnt, MC_SEND_RECV, NULL),
              MC_ERR_INVALID_ARG);
  MC_CHECK_MSG(strstr(mc_a2a_last_error(a2a), "indices=") && strstr(mc_a2a_last_error(a2a), "8-byte aligned"), "%s",
               mc_a2a_last_error(a2a));
  MC_CHECK_OK(mc_a2a_destroy(a2a));
  solo_close(&s);
  return 0;
}

/* mc_a2a_get_expert_load: the sums of expert_count over the accepted
 * rounds, a refused round adding nothing, reset, and its argument rules. */
int test_expert_load(void) {
  solo_t s;
  MC_CHECK(solo_open_on(&s, 1, MC_TRANSPORT_CPU) == 0);
  mc_a2a_config_t ac = small_config(6, 8, 2, 16, 8);
  mc_a2a_t *a2a;
  MC_CHECK_OK(mc_a2a_create(s.comm, &ac, &a2a));
  const int L = mc_a2a_num_local_experts(a2a), cap = mc_a2a_expert_capacity(a2a);
  MC_CHECK(L == 8);
  _Alignas(16) unsigned char tok[6 * 16], x[8 * 64 * 16], y[8 * 64 * 8 * 4], out[6 * 8 * 4];
  MC_CHECK((size_t)cap * 16 * L <= sizeof x);
  memset(tok, 0x11, sizeof tok), memset(y, 0, sizeof y);
  int32_t cnt[8], ids[6 * 2];
  int64_t want[8] = {0}, got[8];
  uint64_t r = mc_test_seed * 2654435761u + 1;
  for (int round = 0; round < 5; round++) {
    const int m = 1 + round % 6;
    for (int t = 0; t < m; t++) { /* two distinct experts a token */
      r = r * 6364136223846793005ull + 1442695040888963407ull;
      ids[2 * t] = (int)(r >> 33) % 8;
      ids[2 * t + 1] = (ids[2 * t] + 1 + (int)(r >> 45) % 7) % 8;
    }
    if (round == 2) { /* refused before anything is sent: counts nothing */
      ids[0] = 8;
      MC_CHECK_RC(mc_dispatch(a2a, tok, NULL, ids, NULL, m, NULL, x, NULL, cnt, MC_SEND_RECV, NULL),
                  MC_ERR_INVALID_ARG);
      continue;
    }
    MC_CHECK_OK(mc_dispatch(a2a, tok, NULL, ids, NULL, m, NULL, x, NULL, cnt, MC_SEND_RECV, NULL));
    for (int l = 0; l < L; l++) want[l] += cnt[l];
    MC_CHECK_OK(mc_combine(a2a, y, out, MC_SEND_RECV, NULL));
    MC_CHECK_OK(mc_a2a_get_expert_load(a2a, got, 0));
    for (int l = 0; l < L; l++) MC_CHECK_MSG(got[l] == want[l], "round %d expert %d: %lld, want %lld", round, l,
                                             (long long)got[l], (long long)want[l]);
  }
  int64_t total = 0;
  for (int l = 0; l < L; l++) total += want[l];
  MC_CHECK(total == 2 * (1 + 2 + 4 + 5)); /* rounds 0, 1, 3, 4: m tokens of two experts each */
  MC_CHECK_OK(mc_a2a_get_expert_load(a2a, got, 1)); /* the sums, then zero */
  for (int l = 0; l < L; l++) MC_CHECK(got[l] == want[l]);
  MC_CHECK_OK(mc_a2a_get_expert_load(a2a, got, 0));
  for (int l = 0; l < L; l++) MC_CHECK(got[l] == 0);
  MC_CHECK_RC(mc_a2a_get_expert_load(a2a, NULL, 0), MC_ERR_INVALID_ARG);
  MC_CHECK(strstr(mc_a2a_last_error(a2a), "counts is NULL") != NULL);
  MC_CHECK_OK(mc_a2a_destroy(a2a));
  MC_CHECK_RC(mc_a2a_get_expert_load(a2a, got, 0), MC_ERR_INVALID_USAGE);
  MC_CHECK_RC(mc_a2a_get_expert_load(NULL, got, 0), MC_ERR_INVALID_ARG);
  solo_close(&s);
  return 0;
}

typedef struct three {
  mc_oob_threads_t *g;
  int rank;
  mc_result_t rc;
  char msg[MC_ERRTEXT_LEN_TEST];
} three_t;

static void *three_main(void *arg) {
  three_t *t = arg;
  mc_oob_t oob;
  mc_comm_t *comm = NULL;
  mc_comm_config_t cc = MC_COMM_CONFIG_INITIALIZER;
  mc_oob_threads_get(t->g, t->rank, &oob);
  t->rc = mc_comm_create(&oob, &cc, &comm);
  if (t->rc != MC_SUCCESS) return NULL;
  mc_a2a_config_t ac = small_config(4, 8, 2, 16, 8); /* 8 experts: not a multiple of 3 ranks */
  mc_a2a_t *a2a = NULL;
  t->rc = mc_a2a_create(comm, &ac, &a2a);
  snprintf(t->msg, sizeof t->msg, "%s", mc_comm_last_error(comm));
  mc_a2a_destroy(a2a);
  mc_comm_destroy(comm);
  return NULL;
}

int test_experts_not_divisible(void) {
  three_t t[3];
  pthread_t th[3];
  mc_oob_threads_t *g;
  MC_CHECK_OK(mc_oob_threads_create(3, MC_TEST_LIVE_MS, &g));
  for (int r = 0; r < 3; r++) {
    t[r] = (three_t){g, r, MC_SUCCESS, {0}};
    MC_CHECK(pthread_create(&th[r], NULL, three_main, &t[r]) == 0);
  }
  for (int r = 0; r < 3; r++) pthread_join(th[r], NULL);
  mc_oob_threads_destroy(g);
  for (int r = 0; r < 3; r++) {
    MC_CHECK_MSG(t[r].rc == MC_ERR_INVALID_ARG, "rank %d: %s", r, mc_result_string(t[r].rc));
    MC_CHECK_MSG(strstr(t[r].msg, "num_experts=8") && strstr(t[r].msg, "world_size=3"), "%s", t[r].msg);
  }
  return 0;
}

int test_create_destroy_loop(void) {
  /* handles come and go as an engine reloads: no leak, no stale state
   * (run under ASan/valgrind in CI) */
  solo_t s;
  MC_CHECK(solo_open(&s, 1) == 0);
  mc_a2a_config_t ac = small_config(16, 32, 4, 256, 64);
  for (int i = 0; i < 200; i++) {
    mc_a2a_t *h[3];
    for (int j = 0; j < 3; j++) MC_CHECK_OK(mc_a2a_create(s.comm, &ac, &h[j]));
    for (int j = 2; j >= 0; j--) MC_CHECK_OK(mc_a2a_destroy(h[j]));
  }
  solo_close(&s);
  for (int i = 0; i < 50; i++) {
    MC_CHECK(solo_open(&s, 1) == 0);
    solo_close(&s);
  }
  return 0;
}


/* mc_a2a_mask_ranks and mc_a2a_get_mask: what is refused (and changes
 * nothing), and a clear that lets rounds go on, on a rank alone (the
 * agreement with other ranks: test mask_dead_rank). */
int test_mask_rules(void) {
  solo_t s;
  MC_CHECK(solo_open_on(&s, 1, MC_TRANSPORT_CPU) == 0);
  mc_a2a_config_t ac = small_config(4, 8, 2, 16, 8);
  mc_a2a_t *a2a;
  MC_CHECK_OK(mc_a2a_create(s.comm, &ac, &a2a));
  _Alignas(16) unsigned char tok[4 * 16], x[8 * 64 * 16], y[8 * 64 * 8 * 4], out[4 * 8 * 4];
  memset(tok, 0x22, sizeof tok), memset(y, 0, sizeof y);
  int32_t cnt[8], ids[4 * 2] = {0, 1, 2, 3, 4, 5, 6, 7};
  uint8_t mask[1] = {1}, got[1] = {7};
  MC_CHECK_OK(mc_a2a_get_mask(a2a, got));
  MC_CHECK(got[0] == 0);
  MC_CHECK_RC(mc_a2a_mask_ranks(a2a, NULL), MC_ERR_INVALID_ARG);
  MC_CHECK(strstr(mc_a2a_last_error(a2a), "mask is NULL") != NULL);
  MC_CHECK_RC(mc_a2a_mask_ranks(a2a, mask), MC_ERR_INVALID_ARG); /* a rank never masks itself */
  MC_CHECK(strstr(mc_a2a_last_error(a2a), "rank 0 itself") != NULL);
  MC_CHECK_RC(mc_a2a_get_mask(a2a, NULL), MC_ERR_INVALID_ARG);
  MC_CHECK_OK(mc_dispatch(a2a, tok, NULL, ids, NULL, 4, NULL, x, NULL, cnt, MC_SEND, NULL));
  mask[0] = 0;
  MC_CHECK_RC(mc_a2a_mask_ranks(a2a, mask), MC_ERR_INVALID_USAGE); /* mid-round */
  MC_CHECK(strstr(mc_a2a_last_error(a2a), "next step is the dispatch recv") != NULL);
  MC_CHECK_OK(mc_dispatch(a2a, tok, NULL, ids, NULL, 4, NULL, x, NULL, cnt, MC_RECV, NULL));
  MC_CHECK_OK(mc_combine(a2a, y, out, MC_SEND_RECV, NULL));
  MC_CHECK_OK(mc_a2a_mask_ranks(a2a, mask)); /* at a round's end: the clear mask, agreed with itself */
  MC_CHECK_OK(mc_a2a_get_mask(a2a, got));
  MC_CHECK(got[0] == 0);
  for (int round = 0; round < 3; round++) { /* and rounds go on */
    MC_CHECK_OK(mc_dispatch(a2a, tok, NULL, ids, NULL, 4, NULL, x, NULL, cnt, MC_SEND_RECV, NULL));
    MC_CHECK(cnt[0] == 1 && cnt[7] == 1);
    MC_CHECK_OK(mc_combine(a2a, y, out, MC_SEND_RECV, NULL));
  }
  MC_CHECK_OK(mc_a2a_destroy(a2a));
  MC_CHECK_RC(mc_a2a_mask_ranks(a2a, mask), MC_ERR_INVALID_USAGE);
  MC_CHECK_RC(mc_a2a_get_mask(a2a, got), MC_ERR_INVALID_USAGE);
  MC_CHECK_RC(mc_a2a_mask_ranks(NULL, mask), MC_ERR_INVALID_ARG);
  solo_close(&s);
  return 0;
}

/* mc_a2a_bench_floor: its arguments checked like a call's, the cpu
 * transport (no kernels) refused by name, and the round untouched. */
int test_bench_floor_rules(void) {
  solo_t s;
  MC_CHECK(solo_open_on(&s, 1, MC_TRANSPORT_CPU) == 0);
  mc_a2a_config_t ac = small_config(4, 8, 2, 16, 8);
  mc_a2a_t *a2a;
  MC_CHECK_OK(mc_a2a_create(s.comm, &ac, &a2a));
  MC_CHECK_RC(mc_a2a_bench_floor(a2a, 2, 1, MC_SEND_RECV, NULL), MC_ERR_INVALID_ARG);
  MC_CHECK(strstr(mc_a2a_last_error(a2a), "phase=2") != NULL);
  MC_CHECK_RC(mc_a2a_bench_floor(a2a, MC_BENCH_DISPATCH, 1, 4u, NULL), MC_ERR_INVALID_ARG);
  MC_CHECK(strstr(mc_a2a_last_error(a2a), "flags=0x4") != NULL);
  MC_CHECK_RC(mc_a2a_bench_floor(a2a, MC_BENCH_COMBINE, 5, MC_SEND, NULL), MC_ERR_INVALID_ARG);
  MC_CHECK(strstr(mc_a2a_last_error(a2a), "m=5") != NULL);
  MC_CHECK_RC(mc_a2a_bench_floor(a2a, MC_BENCH_DISPATCH, 1, MC_SEND_RECV, NULL), MC_ERR_UNSUPPORTED);
  MC_CHECK(strstr(mc_a2a_last_error(a2a), "cpu transport") != NULL);
  MC_CHECK_RC(mc_a2a_bench_floor(NULL, MC_BENCH_DISPATCH, 1, MC_SEND, NULL), MC_ERR_INVALID_ARG);
  _Alignas(16) unsigned char tok[4 * 16], x[8 * 64 * 16], y[8 * 64 * 8 * 4], out[4 * 8 * 4];
  memset(tok, 0x22, sizeof tok), memset(y, 0, sizeof y);
  int32_t cnt[8], ids[4 * 2] = {0, 1, 2, 3, 4, 5, 6, 7};
  MC_CHECK_OK(mc_dispatch(a2a, tok, NULL, ids, NULL, 4, NULL, x, NULL, cnt, MC_SEND_RECV, NULL));
  MC_CHECK(cnt[0] == 1 && cnt[7] == 1);
  MC_CHECK_OK(mc_combine(a2a, y, out, MC_SEND_RECV, NULL));
  MC_CHECK_OK(mc_a2a_destroy(a2a));
  solo_close(&s);
  return 0;
}
