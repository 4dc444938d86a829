/* test_faults.c - ranks as processes (socket bootstrap, cpu transport),
 * one of them killed (SIGKILL) or stopped (SIGSTOP) at a random moment of
 * create, the rounds or destroy, trial after trial. Every other rank must
 * end by itself within its timeouts plus a margin - finished, or with an
 * error - never hang and never crash, and nothing may be left in
 * /dev/shm. MC_FAULT_TRIALS sets the number of trials (default 16); the
 * figures are printed at the end. */
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "mc_test.h"

/* The margin is what a survivor may take beyond its own waits to end
 * (exit, under load): a hang is a rank that never ends, and a short margin
 * would call a slow machine's survivor hung. */
enum { FT_OOB_MS = 1500, FT_TIMEOUT_MS = 300, FT_MARGIN_MS = 30000 };

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int shm_entries(void) {
  DIR *d = opendir("/dev/shm");
  if (!d) return 0;
  int n = 0;
  for (struct dirent *e; (e = readdir(d));) n += strncmp(e->d_name, "moecomm", 7) == 0;
  closedir(d);
  return n;
}

/* One rank: create, `rounds` rounds of dispatch and combine on valid
 * random inputs, destroy. Exit 0 when all went through, 1 on an error
 * (its text to fd), 2 if the bootstrap failed. */
static void rank_main(const mc_unique_id_t *id, int rank, int world, int rounds, uint64_t seed, int fd) {
  mc_oob_socket_t *sock = NULL;
  mc_oob_t oob;
  mc_comm_t *comm = NULL;
  mc_a2a_t *a2a = NULL;
  char msg[600] = "";
  int code = 0;
  mc_comm_config_t cc = MC_COMM_CONFIG_INITIALIZER;
  cc.transport = MC_TRANSPORT_CPU;
  cc.timeout_ms = FT_TIMEOUT_MS;
  mc_a2a_config_t ac = MC_A2A_CONFIG_INITIALIZER;
  ac.max_tokens = 8;
  ac.num_experts = 2 * world;
  ac.experts_per_token = 2;
  ac.token_bytes = 128;
  ac.hidden = 32;
  ac.combine_in_dtype = MC_DTYPE_FP32;
  ac.combine_out_dtype = MC_DTYPE_FP32;
  if (mc_oob_socket_create(id, rank, world, FT_OOB_MS, &sock) != MC_SUCCESS ||
      mc_oob_socket_get(sock, &oob) != MC_SUCCESS) {
    snprintf(msg, sizeof msg, "bootstrap: %s", mc_last_error());
    code = 2;
  } else if (mc_comm_create(&oob, &cc, &comm) != MC_SUCCESS || mc_a2a_create(comm, &ac, &a2a) != MC_SUCCESS) {
    snprintf(msg, sizeof msg, "create: %s", mc_last_error());
    code = 1;
  }
  const int L = 2, cap = world * 8;
  int32_t idx[16], count[2];
  float w[16], y[2 * 64 * 32], out[8 * 32];
  unsigned char tok[8 * 128], x[2 * 64 * 128];
  for (int i = 0; code == 0 && i < rounds; i++) {
    for (int t = 0; t < 8; t++) {
      idx[2 * t] = (int)(mc_test_rand(&seed) % (uint64_t)(2 * world));
      idx[2 * t + 1] = (idx[2 * t] + 1 + (int)(mc_test_rand(&seed) % (uint64_t)(2 * world - 1))) % (2 * world);
      w[2 * t] = w[2 * t + 1] = 0.5f;
    }
    memset(tok, i, sizeof tok);
    memset(y, 0, sizeof(float) * (size_t)L * (size_t)cap * 32);
    mc_result_t rc = mc_dispatch(a2a, tok, NULL, idx, w, 8, NULL, x, NULL, count, MC_SEND_RECV, NULL);
    if (rc == MC_SUCCESS) rc = mc_combine(a2a, y, out, MC_SEND_RECV, NULL);
    if (rc != MC_SUCCESS) {
      snprintf(msg, sizeof msg, "round %d: %s", i, mc_a2a_last_error(a2a));
      code = 1;
    }
  }
  if (a2a && mc_a2a_destroy(a2a) != MC_SUCCESS && code == 0) code = 1;
  if (comm && mc_comm_destroy(comm) != MC_SUCCESS && code == 0) code = 1;
  mc_oob_socket_destroy(sock);
  if (msg[0] && write(fd, msg, strlen(msg)) < 0) code = 3;
  _exit(code);
}

int test_fault_injection(void) {
  const char *env = getenv("MC_FAULT_TRIALS");
  const int trials = env && atoi(env) > 0 ? atoi(env) : 16;
  uint64_t st = mc_test_seed;
  int hangs = 0, crashes = 0, leaked = 0, errors = 0, finished = 0;
  double worst = 0, sum = 0;
  const int shm_before = shm_entries();
  for (int trial = 0; trial < trials; trial++) {
    const int W = mc_test_range(&st, 2, 4), victim = mc_test_range(&st, 0, W - 1);
    const int sig = mc_test_range(&st, 0, 2) == 0 ? SIGSTOP : SIGKILL;
    /* where the fault lands: create (a few ms in), the rounds (endless
     * rounds, later), or the end of a short run (destroy) */
    const int when = mc_test_range(&st, 0, 4);
    const int rounds = when == 4 ? mc_test_range(&st, 1, 40) : 1000000;
    const int delay_ms = when <= 1 ? mc_test_range(&st, 0, 8) : when <= 3 ? mc_test_range(&st, 10, 150)
                                                                          : mc_test_range(&st, 0, 30);
    mc_unique_id_t id;
    MC_CHECK_OK(mc_unique_id_create(&id));
    pid_t pid[4];
    int fds[4][2];
    fflush(NULL);
    for (int r = 0; r < W; r++) {
      MC_CHECK(pipe(fds[r]) == 0);
      pid[r] = fork();
      MC_CHECK(pid[r] >= 0);
      if (pid[r] == 0) {
        close(fds[r][0]);
        rank_main(&id, r, W, rounds, st + (uint64_t)r, fds[r][1]);
      }
      close(fds[r][1]);
    }
    struct timespec pause = {delay_ms / 1000, (long)(delay_ms % 1000) * 1000000L};
    nanosleep(&pause, NULL);
    const double fault = now_s();
    kill(pid[victim], sig);
    /* every other rank must end by itself: create's bootstrap, or a wait,
     * each bounded by its timeout */
    const double deadline = fault + (FT_OOB_MS + FT_TIMEOUT_MS + FT_MARGIN_MS) / 1000.0;
    for (int r = 0; r < W; r++) {
      if (r == victim) continue;
      int status = 0;
      pid_t got = 0;
      while ((got = waitpid(pid[r], &status, WNOHANG)) == 0 && now_s() < deadline) usleep(2000);
      char msg[600] = "";
      if (got == 0) {
        hangs++;
        kill(pid[r], SIGKILL);
        waitpid(pid[r], &status, 0);
        fprintf(stderr, "trial %d: rank %d did not end %.1f s after rank %d got signal %d\n", trial, r,
                deadline - fault, victim, sig);
      } else if (WIFSIGNALED(status)) {
        crashes++;
        fprintf(stderr, "trial %d: rank %d died of signal %d\n", trial, r, WTERMSIG(status));
      } else {
        ssize_t n = read(fds[r][0], msg, sizeof msg - 1);
        msg[n > 0 ? n : 0] = '\0';
        const double took = now_s() - fault;
        if (WEXITSTATUS(status) == 0) {
          finished++;
        } else {
          errors++;
          sum += took;
          if (took > worst) worst = took;
          if (errors <= 3 || took > 2.0)
            fprintf(stderr, "trial %d (W=%d, rank %d got %s after %d ms): rank %d ended after %.2f s: %s\n", trial, W,
                    victim, sig == SIGKILL ? "SIGKILL" : "SIGSTOP", delay_ms, r, took, msg);
        }
      }
      close(fds[r][0]);
    }
    kill(pid[victim], SIGKILL);
    waitpid(pid[victim], NULL, 0);
    close(fds[victim][0]);
  }
  leaked = shm_entries() - shm_before;
  fprintf(stderr,
          "fault injection: %d trials; survivors: %d finished, %d ended with an error (fault to error: mean %.2f s, "
          "worst %.2f s); hangs %d, crashes %d, segments left in /dev/shm %d\n",
          trials, finished, errors, errors ? sum / errors : 0.0, worst, hangs, crashes, leaked);
  MC_CHECK(hangs == 0);
  MC_CHECK(crashes == 0);
  MC_CHECK(leaked <= 0);
  return 0;
}
