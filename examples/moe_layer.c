/* moe_layer.c - one MoE layer on 2 ranks (threads of this process, cpu
 * transport): route, dispatch, run toy experts on the batched layout,
 * combine, and check one output row by hand. Built and run by `make test`
 * (ctest: example_moe_layer), so it keeps compiling and working. */
#include <moecomm.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

enum { WORLD = 2, EXPERTS = 8, TOPK = 2, TOKENS = 4, HIDDEN = 16 };

typedef struct rank_arg {
  mc_oob_threads_t *group;
  int rank, ok;
} rank_arg_t;

#define TRY(call)                                                                            \
  do {                                                                                       \
    mc_result_t rc_ = (call);                                                                \
    if (rc_ != MC_SUCCESS) {                                                                 \
      fprintf(stderr, "rank %d: %s: %s (%s)\n", a->rank, #call, mc_result_string(rc_),      \
              a2a ? mc_a2a_last_error(a2a) : comm ? mc_comm_last_error(comm) : mc_last_error()); \
      goto out;                                                                              \
    }                                                                                        \
  } while (0)

static void *rank_main(void *p) {
  rank_arg_t *a = p;
  mc_comm_t *comm = NULL;
  mc_a2a_t *a2a = NULL;
  float *expert_x = NULL, *expert_y = NULL; /* [local expert][slot][hidden] */
  int32_t *count = NULL;                    /* [local expert] */
  mc_oob_t oob;
  mc_oob_threads_get(a->group, a->rank, &oob);
  mc_comm_config_t cc = MC_COMM_CONFIG_INITIALIZER; /* group_size 1, transport auto */
  cc.transport = MC_TRANSPORT_CPU;
  TRY(mc_comm_create(&oob, &cc, &comm));

  mc_a2a_config_t ac = MC_A2A_CONFIG_INITIALIZER;
  ac.max_tokens = TOKENS;
  ac.num_experts = EXPERTS;
  ac.experts_per_token = TOPK;
  ac.token_bytes = HIDDEN * sizeof(float); /* tokens travel as fp32 here */
  ac.hidden = HIDDEN;
  ac.combine_in_dtype = MC_DTYPE_FP32;
  ac.combine_out_dtype = MC_DTYPE_FP32;
  TRY(mc_a2a_create(comm, &ac, &a2a));
  const int L = mc_a2a_num_local_experts(a2a), cap = mc_a2a_expert_capacity(a2a);

  /* this rank's tokens and the router's choice: token t goes to experts t and t+3 */
  _Alignas(16) float tokens[TOKENS][HIDDEN], out[TOKENS][HIDDEN];
  int32_t idx[TOKENS][TOPK];
  float w[TOKENS][TOPK];
  for (int t = 0; t < TOKENS; t++) {
    for (int h = 0; h < HIDDEN; h++) tokens[t][h] = (float)(a->rank * 100 + t) + h / 100.0f;
    idx[t][0] = t, idx[t][1] = t + 3;
    w[t][0] = 0.75f, w[t][1] = 0.25f;
  }
  expert_x = aligned_alloc(16, sizeof(float) * (size_t)L * cap * HIDDEN);
  expert_y = aligned_alloc(16, sizeof(float) * (size_t)L * cap * HIDDEN);
  count = malloc(sizeof(int32_t) * (size_t)L);
  if (!expert_x || !expert_y || !count) goto out;

  TRY(mc_dispatch(a2a, tokens, NULL, &idx[0][0], &w[0][0], TOKENS, NULL, expert_x, NULL, count, MC_SEND_RECV, NULL));
  /* toy experts: global expert e multiplies by (e + 1) */
  for (int l = 0; l < L; l++)
    for (int s = 0; s < count[l]; s++)
      for (int h = 0; h < HIDDEN; h++)
        expert_y[((size_t)l * cap + s) * HIDDEN + h] =
            (float)(a->rank * L + l + 1) * expert_x[((size_t)l * cap + s) * HIDDEN + h];
  TRY(mc_combine(a2a, expert_y, out, MC_SEND_RECV, NULL));

  /* out[t] = 0.75 (t + 1) x + 0.25 (t + 4) x */
  float want = (0.75f * 2 + 0.25f * 5) * tokens[1][3];
  a->ok = out[1][3] > want * 0.99999f && out[1][3] < want * 1.00001f; /* fp32 sums in another order */
  printf("rank %d: out[1][3] = %g (expected %g): %s\n", a->rank, out[1][3], want, a->ok ? "ok" : "WRONG");
out:;
  /* destroy after every rank's last combine: a barrier over the same allgather */
  int one = 1, all[WORLD];
  oob.allgather(&one, all, sizeof one, oob.user);
  mc_a2a_destroy(a2a);
  mc_comm_destroy(comm);
  free(expert_x);
  free(expert_y);
  free(count);
  return NULL;
}

int main(void) {
  mc_oob_threads_t *group;
  if (mc_oob_threads_create(WORLD, 10000, &group) != MC_SUCCESS) return 1;
  pthread_t th[WORLD];
  rank_arg_t args[WORLD];
  for (int r = 0; r < WORLD; r++) {
    args[r] = (rank_arg_t){group, r, 0};
    pthread_create(&th[r], NULL, rank_main, &args[r]);
  }
  int ok = 1;
  for (int r = 0; r < WORLD; r++) pthread_join(th[r], NULL), ok &= args[r].ok;
  mc_oob_threads_destroy(group);
  return ok ? 0 : 1;
}
