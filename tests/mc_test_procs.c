/* mc_test_procs.c - worlds of fork()ed processes for the bootstrap tests
 * (mc_test_procs.h). */
#include "mc_test_procs.h"

#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "mc_ref_dev.h"
#include "mc_test.h"

int64_t mc_proc_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void mc_proc_sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0) {
  }
}

static _Atomic int *steps; /* [MC_PROC_STEPS], shared with the children */

void mc_proc_mark(int k) { atomic_fetch_add(&steps[k], 1); }

void mc_proc_await(int k, int n) {
  while (atomic_load(&steps[k]) < n) mc_proc_sleep_ms(1);
}

/* Fork c->nprocs children running fn; codes[p] = exit status, -1 if it was
 * killed. Waits at most wait_ms in all, then kills what is left; returns 0 if
 * every child ended by itself in time. */
int mc_proc_run(const mc_proc_ctx_t *c, mc_proc_fn fn, int wait_ms, int *codes) {
  pid_t pid[MC_PROC_MAX];
  int alive = 0, late = 0;
  if (!steps) {
    void *m = mmap(NULL, sizeof(int) * MC_PROC_STEPS, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return -1;
    steps = m;
  }
  for (int k = 0; k < MC_PROC_STEPS; k++) atomic_store(&steps[k], 0);
  fflush(stdout);
  fflush(stderr);
  for (int p = 0; p < c->nprocs; p++) {
    codes[p] = -1;
    pid[p] = fork();
    if (pid[p] == 0) {
      if (c->delay_ms[p] > 0) mc_proc_sleep_ms(c->delay_ms[p]);
      int rc = fn(c, p);
      fflush(stderr);
      _exit(rc);
    }
    if (pid[p] > 0) alive++;
  }
  int64_t deadline = mc_proc_now_ms() + wait_ms;
  while (alive > 0) {
    for (int p = 0; p < c->nprocs; p++) {
      int st;
      if (pid[p] > 0 && waitpid(pid[p], &st, WNOHANG) == pid[p]) {
        codes[p] = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
        pid[p] = 0;
        alive--;
      }
    }
    if (alive > 0 && mc_proc_now_ms() > deadline) {
      for (int p = 0; p < c->nprocs; p++)
        if (pid[p] > 0) {
          fprintf(stderr, "process %d (rank %d) still running after %d ms: killed\n", p,
                  c->rank[p], wait_ms);
          kill(pid[p], SIGKILL);
          waitpid(pid[p], NULL, 0);
        }
      late = 1;
      break;
    }
    if (alive > 0) mc_proc_sleep_ms(2);
  }
  for (int p = 0; p < c->nprocs; p++)
    if (pid[p] < 0) return -1; /* fork failed */
  return late ? -1 : 0;
}

uint16_t mc_proc_id_port(const mc_unique_id_t *id) {
  uint16_t port; /* after u32 magic, u32 version, u32 address (mc_oob_socket.c) */
  memcpy(&port, id->internal + 12, sizeof port);
  return port;
}

int mc_proc_await_connection(const mc_unique_id_t *id) {
  for (int fd = 3; fd < 1024; fd++) {
    struct sockaddr_in sa;
    socklen_t len = sizeof sa;
    int listening = 0;
    socklen_t ll = sizeof listening;
    if (getsockname(fd, (struct sockaddr *)&sa, &len) != 0 || sa.sin_family != AF_INET ||
        sa.sin_port != mc_proc_id_port(id) || getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &ll) != 0 ||
        !listening)
      continue;
    struct pollfd p = {fd, POLLIN, 0};
    while (poll(&p, 1, -1) != 1) {
    }
    return 0;
  }
  return -1;
}

/* One world: process p is rank p, no delays. */
void mc_proc_world(mc_proc_ctx_t *c, int world, int timeout_ms) {
  memset(c, 0, sizeof *c);
  c->world = c->nprocs = world;
  c->timeout_ms = timeout_ms;
  for (int p = 0; p < world; p++) c->rank[p] = p;
}

/* Bytes that rank `rank` contributes to call `iter`, reproducible anywhere. */
void mc_proc_fill(unsigned char *b, size_t n, int rank, int iter) {
  uint64_t st = mc_test_seed ^ ((uint64_t)(rank + 1) << 40) ^ ((uint64_t)iter << 20), v = 0;
  for (size_t i = 0; i < n; i++) {
    if (i % 8 == 0) v = mc_test_rand(&st);
    b[i] = (unsigned char)(v >> (8 * (i % 8)));
  }
}

/* One allgather of `bytes` and a check of every rank's part. */
int mc_proc_gather_check(const mc_oob_t *oob, size_t bytes, int iter) {
  size_t n = (size_t)oob->world_size;
  unsigned char *send = malloc(bytes + 1), *recv = malloc(n * bytes + 1), *want = malloc(bytes + 1);
  MC_CHECK(send && recv && want);
  mc_proc_fill(send, bytes, oob->rank, iter);
  memset(recv, 0xa5, n * bytes);
  MC_CHECK_MSG(oob->allgather(send, recv, bytes, oob->user) == 0, "rank %d: allgather of %zu bytes",
               oob->rank, bytes);
  for (size_t r = 0; r < n; r++) {
    mc_proc_fill(want, bytes, (int)r, iter);
    MC_CHECK_MSG(memcmp(recv + r * bytes, want, bytes) == 0,
                 "rank %d: part of rank %zu wrong (%zu bytes)", oob->rank, r, bytes);
  }
  free(send);
  free(recv);
  free(want);
  return 0;
}

int mc_proc_cuda_seen(void) {
  fflush(stdout);
  fflush(stderr);
  pid_t probe = fork();
  if (probe == 0) _exit(mc_dev_have_cuda() ? 0 : 1);
  int st = 1;
  if (probe < 0 || waitpid(probe, &st, 0) != probe) return 0;
  return WIFEXITED(st) && WEXITSTATUS(st) == 0;
}
