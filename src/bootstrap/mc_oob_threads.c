/* mc_oob_threads.c - the out-of-band allgather for ranks that are threads of
 * one process: a shared buffer, a mutex and a condition variable.
 *
 * One allgather has two phases so that a fast thread's next call cannot
 * overwrite the buffer while a slow thread still copies out of it:
 * COLLECT (everyone deposits; the last one flips to DRAIN) and DRAIN
 * (everyone copies out; the last one flips back to COLLECT). Every wait is
 * bounded; a timeout poisons the group so that every thread, present or
 * late, fails instead of hanging. */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mc_error.h"

typedef struct rank_ctx {
  struct mc_oob_threads *group;
  int rank;
} rank_ctx_t;

struct mc_oob_threads {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int world_size, timeout_ms;
  int draining, arrived, departed, failed;
  unsigned long generation;
  size_t bytes, cap;
  unsigned char *buf;
  rank_ctx_t *ctx;
};

static void deadline_in(struct timespec *ts, int ms) {
  clock_gettime(CLOCK_MONOTONIC, ts);
  ts->tv_sec += ms / 1000;
  ts->tv_nsec += (long)(ms % 1000) * 1000000L;
  if (ts->tv_nsec >= 1000000000L) {
    ts->tv_sec++;
    ts->tv_nsec -= 1000000000L;
  }
}

/* Wait on the group's condition until woken or the deadline passes;
 * returns non-zero (and poisons the group) on timeout. */
static int wait_until(struct mc_oob_threads *g, const struct timespec *deadline) {
  int rc = pthread_cond_timedwait(&g->cv, &g->mu, deadline);
  if (rc == ETIMEDOUT) {
    g->failed = 1;
    pthread_cond_broadcast(&g->cv);
    return 1;
  }
  return 0;
}

static int threads_allgather(const void *send, void *recv, size_t bytes, void *user) {
  rank_ctx_t *me = user;
  struct mc_oob_threads *g = me->group;
  struct timespec deadline;
  deadline_in(&deadline, g->timeout_ms);
  int rc = -1;
  pthread_mutex_lock(&g->mu);
  while (!g->failed && g->draining)
    if (wait_until(g, &deadline)) goto out;
  if (g->failed) goto out;
  if (g->arrived == 0) {
    size_t need = bytes * (size_t)g->world_size;
    if (need > g->cap) {
      unsigned char *nb = realloc(g->buf, need ? need : 1);
      if (!nb) {
        g->failed = 1;
        pthread_cond_broadcast(&g->cv);
        goto out;
      }
      g->buf = nb;
      g->cap = need;
    }
    g->bytes = bytes;
  } else if (bytes != g->bytes) { /* ranks disagree on the size: nobody may proceed */
    g->failed = 1;
    pthread_cond_broadcast(&g->cv);
    goto out;
  }
  if (bytes) memcpy(g->buf + (size_t)me->rank * bytes, send, bytes);
  unsigned long gen = g->generation;
  if (++g->arrived == g->world_size) {
    g->draining = 1;
    g->generation++;
    pthread_cond_broadcast(&g->cv);
  }
  while (!g->failed && g->generation == gen)
    if (wait_until(g, &deadline)) goto out;
  if (g->failed) goto out;
  if (bytes) memcpy(recv, g->buf, bytes * (size_t)g->world_size);
  if (++g->departed == g->world_size) {
    g->draining = 0;
    g->arrived = g->departed = 0;
    pthread_cond_broadcast(&g->cv);
  }
  rc = 0;
out:
  pthread_mutex_unlock(&g->mu);
  return rc;
}

mc_result_t mc_oob_threads_create(int world_size, int timeout_ms, mc_oob_threads_t **out) {
  mc_clear_tls_error();
  if (!out) return mc_fail_tls(MC_ERR_INVALID_ARG, "out is NULL");
  *out = NULL;
  if (world_size < 1) return mc_fail_tls(MC_ERR_INVALID_ARG, "world_size=%d is < 1", world_size);
  if (timeout_ms <= 0) return mc_fail_tls(MC_ERR_INVALID_ARG, "timeout_ms=%d is <= 0", timeout_ms);
  struct mc_oob_threads *g = calloc(1, sizeof *g);
  if (g) g->ctx = calloc((size_t)world_size, sizeof *g->ctx);
  if (!g || !g->ctx) {
    free(g);
    return mc_fail_tls(MC_ERR_SYSTEM, "out of host memory");
  }
  pthread_condattr_t attr;
  pthread_condattr_init(&attr);
  pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
  pthread_cond_init(&g->cv, &attr);
  pthread_condattr_destroy(&attr);
  pthread_mutex_init(&g->mu, NULL);
  g->world_size = world_size;
  g->timeout_ms = timeout_ms;
  for (int r = 0; r < world_size; r++) g->ctx[r] = (rank_ctx_t){g, r};
  *out = g;
  return MC_SUCCESS;
}

mc_result_t mc_oob_threads_get(mc_oob_threads_t *g, int rank, mc_oob_t *out) {
  if (!g || !out) return mc_fail_tls(MC_ERR_INVALID_ARG, "group or out is NULL");
  if (rank < 0 || rank >= g->world_size)
    return mc_fail_tls(MC_ERR_INVALID_ARG, "rank=%d is not in 0..%d", rank, g->world_size - 1);
  *out = (mc_oob_t){threads_allgather, &g->ctx[rank], rank, g->world_size};
  return MC_SUCCESS;
}

void mc_oob_threads_destroy(mc_oob_threads_t *g) {
  if (!g) return;
  pthread_cond_destroy(&g->cv);
  pthread_mutex_destroy(&g->mu);
  free(g->buf);
  free(g->ctx);
  free(g);
}
