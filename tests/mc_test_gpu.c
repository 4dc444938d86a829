/* mc_test_gpu.c - what the GPU test files share (mc_test_gpu.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "mc_ref_dev.h"
#include "mc_ref_run.h"
#include "mc_test.h"
#include "mc_test_gpu.h"

/* Probe in a child: the parent must not start CUDA before it forks ranks. */
int mc_tg_usable(void) {
  pid_t p = fork();
  if (p == 0) _exit(mc_dev_have_cuda() ? 0 : 1);
  int st = 0;
  waitpid(p, &st, 0);
  return WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

mc_transport_t mc_tg_transport(void) {
  const char *t = getenv("MC_TEST_TRANSPORT");
  return t && strcmp(t, "p2p") == 0 ? MC_TRANSPORT_P2P : MC_TRANSPORT_NVSHMEM;
}

/* One run over `transport`, ranks as processes (or as threads of this
 * process), its verdict printed with the case. */
int mc_tg_run_as(mc_case_t *c, mc_run_opts_t *o, mc_transport_t transport, int processes) {
  o->processes = processes;
  o->transport = transport;
  if (!o->whole) o->whole = 2; /* every other round as one call: the one-launch kernels and the halves */
  mc_run_result_t res;
  int failed = mc_run(c, o, &res);
  char desc[400];
  mc_ref_describe(c, desc, sizeof desc);
  printf("%s: %s: %s\n", failed ? "FAILED" : "ok", processes ? "processes" : "threads", desc);
  if (failed) fprintf(stderr, "%s\n", failed < 0 ? "could not start" : mc_run_first_failure(&res));
  mc_run_free(&res);
  return failed != 0;
}

int mc_tg_run_on(mc_case_t *c, mc_run_opts_t *o, mc_transport_t transport) { return mc_tg_run_as(c, o, transport, 1); }

int mc_tg_run(mc_case_t *c, mc_run_opts_t *o) { return mc_tg_run_on(c, o, mc_tg_transport()); }

/* The same, keeping the per-rank results (the caller frees them). */
int mc_tg_run_result(mc_case_t *c, mc_run_opts_t *o, mc_run_result_t *res) {
  o->processes = 1;
  o->transport = mc_tg_transport();
  return mc_run(c, o, res);
}

/* MC_TEST_MAX_WORLD=N caps every test's ranks at N, rounded down to a power
 * of two: one rank per GPU on a machine of N GPUs (scripts/gpu-run.sh multi),
 * where more ranks than GPUs would share one without MPS. */
int mc_tg_cap_world(int world) {
  const char *s = getenv("MC_TEST_MAX_WORLD");
  int cap = s ? atoi(s) : 0, p2 = 1;
  while (p2 * 2 <= cap)
    p2 *= 2; /* a power of two: the tests' expert counts divide by it */
  return cap > 0 && world > p2 ? p2 : world;
}

void mc_tg_small_case(mc_case_t *c, int world, int group, int i) {
  mc_ref_random_case(mc_test_seed * 7919u + (uint64_t)i, c);
  world = mc_tg_cap_world(world);
  if (world % group) group = 1;
  c->world_size = world;
  c->group_size = group;
  c->num_experts = world * 8;
  c->topk = 4;
  c->max_tokens = 24;
  c->hidden = 256;
}
