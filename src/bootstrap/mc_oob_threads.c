/* mc_oob_threads.c - the out-of-band allgather for ranks that are threads of
 * one process: a shared buffer, a mutex and a condition variable.
 *
 * One allgather has two phases so that a fast thread's next call cannot
 * overwrite the buffer while a slow thread still copies out of it:
 * COLLECT (everyone deposits; the last one flips to DRAIN) and DRAIN
 * (everyone copies out; the last one flips back to COLLECT). Every wait is
 * bounded; a timeout poisons the group so that every thread, present or
 * late, fails instead of hanging, and every one of them says the same: the
 * ranks that had not come (deposited, or copied out of the previous call)
 * when the first thread's deadline passed, or why else the group failed. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mc_error.h"
#include "mc_oob.h"

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
  unsigned char *in; /* in[r]: rank r deposited in the call under way (COLLECT) or has yet to copy out (DRAIN) */
  char why[256];     /* failed: what every thread says */
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

/* Poison the group (under its mutex) with the first failure's text. */
static void fail_group(struct mc_oob_threads *g, const char *why) {
  if (!g->failed) snprintf(g->why, sizeof g->why, "%s", why);
  g->failed = 1;
  pthread_cond_broadcast(&g->cv);
}

/* The deadline passed: name the ranks this call still waits for, those
 * that have not deposited (COLLECT) or have not copied out of the
 * previous call (DRAIN: in[r] is still set for them). */
static void fail_late(struct mc_oob_threads *g) {
  char why[sizeof g->why];
  size_t off = (size_t)snprintf(why, sizeof why, "threads allgather: rank(s) ");
  for (int r = 0, listed = 0; r < g->world_size && off < sizeof why; r++)
    if (g->in[r] == g->draining)
      off += (size_t)snprintf(why + off, sizeof why - off, "%s%d", listed++ ? "," : "", r);
  if (off < sizeof why)
    snprintf(why + off, sizeof why - off, " did not come within %d ms (%s)", g->timeout_ms,
             g->draining ? "to copy out the previous call's result" : "to this call");
  fail_group(g, why);
}

/* Wait on the group's condition until woken or the deadline passes;
 * returns non-zero (and poisons the group) on timeout. */
static int wait_until(struct mc_oob_threads *g, const struct timespec *deadline) {
  int rc = pthread_cond_timedwait(&g->cv, &g->mu, deadline);
  if (rc == ETIMEDOUT) {
    if (!g->failed) fail_late(g);
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
  char why[sizeof g->why];
  if (g->arrived == 0) {
    size_t need = bytes * (size_t)g->world_size;
    if (need > g->cap) {
      unsigned char *nb = realloc(g->buf, need ? need : 1);
      if (!nb) {
        snprintf(why, sizeof why, "threads allgather: rank %d: out of host memory for %zu bytes", me->rank, need);
        fail_group(g, why);
        goto out;
      }
      g->buf = nb;
      g->cap = need;
    }
    g->bytes = bytes;
  } else if (bytes != g->bytes) { /* ranks disagree on the size: nobody may proceed */
    snprintf(why, sizeof why, "threads allgather: rank %d passed %zu bytes, the ranks before it %zu", me->rank, bytes,
             g->bytes);
    fail_group(g, why);
    goto out;
  }
  if (bytes) memcpy(g->buf + (size_t)me->rank * bytes, send, bytes);
  g->in[me->rank] = 1;
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
  g->in[me->rank] = 0;
  if (++g->departed == g->world_size) {
    g->draining = 0;
    g->arrived = g->departed = 0;
    pthread_cond_broadcast(&g->cv);
  }
  rc = 0;
out:
  if (rc != 0) mc_fail_tls(MC_ERR_BOOTSTRAP, "%s", g->why);
  pthread_mutex_unlock(&g->mu);
  return rc;
}

int mc_oob_threads_is(mc_allgather_fn fn) { return fn == threads_allgather; }

mc_result_t mc_oob_threads_create(int world_size, int timeout_ms, mc_oob_threads_t **out) {
  mc_clear_tls_error();
  if (!out) return mc_fail_tls(MC_ERR_INVALID_ARG, "out is NULL");
  *out = NULL;
  if (world_size < 1) return mc_fail_tls(MC_ERR_INVALID_ARG, "world_size=%d is < 1", world_size);
  if (timeout_ms <= 0) return mc_fail_tls(MC_ERR_INVALID_ARG, "timeout_ms=%d is <= 0", timeout_ms);
  struct mc_oob_threads *g = calloc(1, sizeof *g);
  if (g) g->ctx = calloc((size_t)world_size, sizeof *g->ctx);
  if (g) g->in = calloc((size_t)world_size, 1);
  if (!g || !g->ctx || !g->in) {
    if (g) free(g->ctx);
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
  free(g->in);
  free(g);
}
