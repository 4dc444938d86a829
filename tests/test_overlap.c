/* test_overlap.c - two micro-batches in flight at once, as an engine that
 * overlaps one batch's attention with the other's MoE does: two handles,
 * their halves interleaved (A send, B send, A recv, B recv, ...), each
 * checked against the reference model. Handles must not share anything.
 * Also mc_a2a_barrier on the cpu transport: nobody leaves before the last arrives. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "mc_ref.h"
#include "mc_test.h"

enum { OV_WORLD = 4, OV_ROUNDS = 6 };

typedef struct ov_rank {
  mc_oob_threads_t *group;
  const mc_case_t *cases; /* [2]: the two micro-batches' shapes and seeds */
  int rank, failed;
  double before_barrier, after_barrier; /* mc_a2a_barrier, checked by the main thread */
  char msg[256];
} ov_rank_t;

static double ov_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct ov_batch {
  mc_a2a_t *a2a;
  mc_input_t ins[OV_WORLD];
  uint8_t *x, *y, *out, *ref_out;
  float *xs;
  int32_t *count, *ref_count, *src_g, *src_t;
} ov_batch_t;

static int ov_fail(ov_rank_t *r, const char *what) {
  if (!r->failed) snprintf(r->msg, sizeof r->msg, "rank %d: %s", r->rank, what);
  r->failed = 1;
  return 1;
}

static void *ov_main(void *p) {
  ov_rank_t *r = p;
  mc_oob_t oob;
  mc_comm_t *comm = NULL;
  ov_batch_t b[2];
  memset(b, 0, sizeof b);
  mc_oob_threads_get(r->group, r->rank, &oob);
  mc_comm_config_t cc = MC_COMM_CONFIG_INITIALIZER;
  cc.transport = MC_TRANSPORT_CPU;
  cc.timeout_ms = MC_TEST_LIVE_MS;
  if (mc_comm_create(&oob, &cc, &comm) != MC_SUCCESS) return ov_fail(r, "comm"), NULL;
  for (int k = 0; k < 2; k++) {
    const mc_case_t *c = &r->cases[k];
    mc_a2a_config_t ac = MC_A2A_CONFIG_INITIALIZER;
    ac.max_tokens = c->max_tokens, ac.num_experts = c->num_experts, ac.experts_per_token = c->topk;
    ac.token_bytes = c->token_bytes, ac.scale_bytes = c->scale_bytes, ac.hidden = c->hidden;
    ac.combine_in_dtype = c->in_dtype, ac.combine_out_dtype = c->out_dtype;
    if (mc_a2a_create(comm, &ac, &b[k].a2a) != MC_SUCCESS) {
      ov_fail(r, mc_comm_last_error(comm));
      goto out;
    }
    size_t L = (size_t)mc_ref_local_experts(c), cap = (size_t)mc_ref_capacity(c);
    b[k].x = aligned_alloc(16, L * cap * c->token_bytes + 16);
    b[k].xs = malloc(L * cap * c->scale_bytes + 16);
    b[k].y = aligned_alloc(16, L * cap * c->hidden * mc_dtype_size(c->in_dtype) + 16);
    b[k].out = aligned_alloc(16, (size_t)c->max_tokens * c->hidden * mc_dtype_size(c->out_dtype) + 16);
    b[k].ref_out = malloc((size_t)c->max_tokens * c->hidden * mc_dtype_size(c->out_dtype) + 16);
    b[k].count = malloc(L * 4), b[k].ref_count = malloc(L * 4);
    b[k].src_g = malloc(L * cap * 4), b[k].src_t = malloc(L * cap * 4);
  }
  /* mc_a2a_barrier: ranks arrive 10 ms apart; nobody may leave before the last arrived */
  usleep(10000u * (unsigned)r->rank);
  r->before_barrier = ov_now();
  if (mc_a2a_barrier(b[0].a2a, NULL) != MC_SUCCESS) ov_fail(r, mc_a2a_last_error(b[0].a2a));
  r->after_barrier = ov_now();
  for (uint64_t round = 1; round <= OV_ROUNDS && !r->failed; round++) {
    for (int k = 0; k < 2; k++)
      for (int g = 0; g < OV_WORLD; g++) {
        mc_ref_input_free(&b[k].ins[g]);
        mc_ref_input(&r->cases[k], round, g, &b[k].ins[g]);
        mc_ref_input_payload(&r->cases[k], &b[k].ins[g]);
      }
#define DISP(k, flags)                                                                                                 \
  mc_dispatch(b[k].a2a, b[k].ins[r->rank].tokens, b[k].ins[r->rank].scales, b[k].ins[r->rank].indices,                 \
              b[k].ins[r->rank].weights, b[k].ins[r->rank].m,                                                          \
              b[k].ins[r->rank].has_bound ? &b[k].ins[r->rank].bound_m : NULL, b[k].x,                                 \
              r->cases[k].scale_bytes ? b[k].xs : NULL, b[k].count, flags, NULL)
    /* interleaved halves of the two micro-batches */
    if (DISP(0, MC_SEND) || DISP(1, MC_SEND) || DISP(0, MC_RECV) || DISP(1, MC_RECV)) {
      ov_fail(r, "dispatch");
      break;
    }
#undef DISP
    for (int k = 0; k < 2; k++) { /* the experts of each batch */
      const mc_case_t *c = &r->cases[k];
      int L = mc_ref_local_experts(c), cap = mc_ref_capacity(c);
      size_t yrow = (size_t)c->hidden * mc_dtype_size(c->in_dtype);
      mc_ref_dispatch(c, b[k].ins, r->rank, b[k].ref_count, b[k].src_g, b[k].src_t);
      for (int l = 0; l < L; l++) {
        if (b[k].count[l] != b[k].ref_count[l]) ov_fail(r, "expert_count differs from the reference");
        for (int s = 0; s < b[k].count[l] && s < cap; s++) {
          const mc_input_t *src = &b[k].ins[b[k].src_g[(size_t)l * cap + s]];
          if (memcmp(b[k].x + ((size_t)l * cap + s) * c->token_bytes,
                     src->tokens + (size_t)b[k].src_t[(size_t)l * cap + s] * c->token_bytes, c->token_bytes) != 0)
            ov_fail(r, "expert_x slot holds the wrong token");
          mc_ref_expert(c, r->rank * L + l, b[k].x + ((size_t)l * cap + s) * c->token_bytes,
                        b[k].y + ((size_t)l * cap + s) * yrow);
        }
      }
    }
    if (mc_combine(b[0].a2a, b[0].y, b[0].out, MC_SEND, NULL) ||
        mc_combine(b[1].a2a, b[1].y, b[1].out, MC_SEND, NULL) ||
        mc_combine(b[0].a2a, b[0].y, b[0].out, MC_RECV, NULL) ||
        mc_combine(b[1].a2a, b[1].y, b[1].out, MC_RECV, NULL)) {
      ov_fail(r, "combine");
      break;
    }
    for (int k = 0; k < 2; k++) {
      const mc_case_t *c = &r->cases[k];
      const mc_input_t *in = &b[k].ins[r->rank];
      mc_ref_combine(c, in, b[k].ref_out);
      if (memcmp(b[k].out, b[k].ref_out, (size_t)in->bound_m * c->hidden * mc_dtype_size(c->out_dtype)) != 0)
        ov_fail(r, k ? "micro-batch B: combine differs from the reference" : "micro-batch A: combine differs");
    }
  }
out:;
  int one = 1, all[OV_WORLD];
  oob.allgather(&one, all, sizeof one, oob.user); /* nobody unmaps while a peer writes */
  for (int k = 0; k < 2; k++) {
    mc_a2a_destroy(b[k].a2a);
    for (int g = 0; g < OV_WORLD; g++)
      mc_ref_input_free(&b[k].ins[g]);
    free(b[k].x), free(b[k].xs), free(b[k].y), free(b[k].out), free(b[k].ref_out);
    free(b[k].count), free(b[k].ref_count), free(b[k].src_g), free(b[k].src_t);
  }
  mc_comm_destroy(comm);
  return NULL;
}

int test_overlapped_batches(void) {
  mc_case_t cases[2];
  for (int k = 0; k < 2; k++) { /* two different shapes, one world */
    mc_ref_random_case(mc_test_seed * 31u + (uint64_t)k, &cases[k]);
    cases[k].world_size = OV_WORLD;
    cases[k].group_size = 1;
    cases[k].num_experts = OV_WORLD * (k ? 3 : 8);
    if (cases[k].topk > cases[k].num_experts) cases[k].topk = cases[k].num_experts;
  }
  mc_oob_threads_t *group;
  MC_CHECK_OK(mc_oob_threads_create(OV_WORLD, 20000, &group));
  ov_rank_t ranks[OV_WORLD];
  pthread_t th[OV_WORLD];
  for (int r = 0; r < OV_WORLD; r++) {
    ranks[r] = (ov_rank_t){.group = group, .cases = cases, .rank = r};
    MC_CHECK(pthread_create(&th[r], NULL, ov_main, &ranks[r]) == 0);
  }
  for (int r = 0; r < OV_WORLD; r++)
    pthread_join(th[r], NULL);
  mc_oob_threads_destroy(group);
  for (int r = 0; r < OV_WORLD; r++)
    MC_CHECK_MSG(!ranks[r].failed, "%s", ranks[r].msg);
  for (int r = 0; r < OV_WORLD; r++)
    for (int q = 0; q < OV_WORLD; q++)
      MC_CHECK_MSG(ranks[r].after_barrier >= ranks[q].before_barrier,
                   "rank %d left mc_a2a_barrier %.3f ms before rank %d arrived", r,
                   1e3 * (ranks[q].before_barrier - ranks[r].after_barrier), q);
  MC_CHECK(mc_a2a_barrier(NULL, NULL) == MC_ERR_INVALID_ARG);
  return 0;
}
