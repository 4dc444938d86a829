/* mc_cpu_window.c - the cpu transport's windows and primitives.
 *
 * Each rank makes one window (mc_window_bytes) of shared memory
 * (mc_cpu_shm.c: anonymous, reserved in full, nothing left behind by a
 * killed process) and announces it through the allgather; every rank maps
 * every peer's, then a second allgather says that all did, and owners
 * close their descriptors.
 *
 * Memory order: the writer copies with plain stores, then updates the
 * signal with a release RMW/store; the reader loads the signal with
 * acquire before touching the data ("flags after data"). Signals are
 * 8-byte aligned uint64 in shared memory; lock-free C11 atomics on them
 * are valid across processes. */
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "mc_cpu.h"
#include "mc_cpu_shm.h"

static _Atomic uint64_t *sig_at(unsigned char *window, const mc_shape_t *s, int slot, int peer) {
  return (_Atomic uint64_t *)(void *)(window + mc_sig_off(s, slot, peer));
}

void mc_cpu_signal(mc_a2a_t *a2a, int peer, int slot, uint64_t value, int op) {
  _Atomic uint64_t *sig = sig_at(mc_cpu(a2a)->peer[peer], &a2a->shape, slot, a2a->comm->rank);
  if (op == MC_SIG_ADD) atomic_fetch_add_explicit(sig, value, memory_order_release);
  else atomic_store_explicit(sig, value, memory_order_release);
}

void mc_cpu_put_signal(mc_a2a_t *a2a, int peer, uint64_t dst_off, const void *src, uint64_t bytes,
                       int slot, uint64_t value, int op) {
  memcpy(mc_cpu(a2a)->peer[peer] + dst_off, src, bytes);
  mc_cpu_signal(a2a, peer, slot, value, op);
}

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Rank r's own "waiting for" word (MC_SIG_WAITING), in its window. */
static _Atomic uint64_t *waiting_word(mc_a2a_t *a2a, int r) {
  return sig_at(mc_cpu(a2a)->peer[r], &a2a->shape, MC_SIG_WAITING, r);
}

/* Who waits for whom (mc_describe_wait_root): a rank's process from its
 * pid (a peer in another process only: a thread of this one cannot be told
 * dead from stalled), its word in its window. */
static int cpu_gone(void *ctx, int r, int64_t *pid) {
  *pid = mc_cpu((mc_a2a_t *)ctx)->pid[r];
  return mc_pid_gone(*pid);
}
static int cpu_waiting(void *ctx, int r, uint64_t *word) {
  *word = atomic_load_explicit(waiting_word((mc_a2a_t *)ctx, r), memory_order_relaxed);
  return 1;
}

/* A wait that expired: the handle's text names the phase, this rank, the
 * peer, the values and, where it can be told, the rank at the root. */
static mc_result_t timed_out(mc_a2a_t *a2a, const char *phase, int slot, int peer, uint64_t target,
                             uint64_t v, int timeout_ms) {
  char root[256];
  const mc_wait_view_t view = {a2a, cpu_gone, cpu_waiting};
  mc_describe_wait_root(a2a->comm->world_size, a2a->comm->rank, peer, &view, root, sizeof root);
  return mc_fail(a2a->err, MC_ERR_TIMEOUT, "%s: rank %d timed out after %d ms waiting for rank %d (%s: expected %llu, saw %llu)%s",
                 phase, a2a->comm->rank, timeout_ms, peer, mc_sig_name(slot), (unsigned long long)target,
                 (unsigned long long)v, root);
}

/* How often a wait looks whether the process of a peer it waits for is
 * gone: a look costs a kill() and a read of /proc, a wait lasts up to the
 * timeout. */
#define LOOK_NS 50000000ull

/* A wait that ended early: the peer's process is gone (looked at before
 * its signal was read for the last time, so nothing more can come). Still
 * MC_ERR_TIMEOUT, as if the wait had run its course: the caller's way on
 * (destroy, or mask the rank) is the same. */
static mc_result_t peer_gone(mc_a2a_t *a2a, const char *phase, int slot, int peer, uint64_t target, uint64_t v,
                             uint64_t t0) {
  char root[256];
  const mc_wait_view_t view = {a2a, cpu_gone, cpu_waiting};
  mc_describe_wait_root(a2a->comm->world_size, a2a->comm->rank, peer, &view, root, sizeof root);
  return mc_fail(a2a->err, MC_ERR_TIMEOUT,
                 "%s: rank %d stopped waiting for rank %d after %llu ms (%s: expected %llu, saw %llu)%s", phase,
                 a2a->comm->rank, peer, (unsigned long long)((now_ns() - t0) / 1000000ull), mc_sig_name(slot),
                 (unsigned long long)target, (unsigned long long)v, root);
}

mc_result_t mc_cpu_wait_ge(mc_a2a_t *a2a, const char *phase, int slot, int peer, uint64_t target,
                           uint64_t *seen) {
  const int timeout_ms = a2a->comm->timeout_ms;
  _Atomic uint64_t *sig = sig_at(mc_cpu_mine(a2a), &a2a->shape, slot, peer);
  uint64_t v = atomic_load_explicit(sig, memory_order_acquire);
  if (v >= target) goto done;
  _Atomic uint64_t *waiting = waiting_word(a2a, a2a->comm->rank);
  atomic_store_explicit(waiting, (uint64_t)peer + 1, memory_order_relaxed);
  /* Spin briefly (the peer is usually a few microseconds away), then yield:
   * ranks often outnumber cores, and a spinning rank would starve the one it
   * waits for. The clock is read every 64 polls to keep polling cheap; every
   * LOOK_NS the peer's process is looked at, so that a dead peer ends the
   * wait at once rather than at the timeout. */
  const uint64_t t0 = now_ns(), deadline = t0 + (uint64_t)timeout_ms * 1000000ull;
  uint64_t look = t0 + LOOK_NS;
  for (unsigned it = 1;; it++) {
    int gone = 0;
    if (it % 64 == 0 && now_ns() > look) { /* looked at before the signal is read */
      int64_t pid;
      look = now_ns() + LOOK_NS;
      gone = cpu_gone(a2a, peer, &pid);
    }
    v = atomic_load_explicit(sig, memory_order_acquire);
    if (v >= target) break;
    if (gone) return peer_gone(a2a, phase, slot, peer, target, v, t0);
    if (it > 32) sched_yield();
    if (it % 64 == 0 && now_ns() > deadline) return timed_out(a2a, phase, slot, peer, target, v, timeout_ms);
  }
  atomic_store_explicit(waiting, 0, memory_order_relaxed);
done:
  if (seen) *seen = v;
  return MC_SUCCESS;
}

typedef struct mc_cpu_wait {
  uint64_t until;  /* its deadline in ns; 0: check said 1 for it in the last pass */
  uint64_t expect; /* what check expects of it, as check last said */
} mc_cpu_wait_t;

mc_result_t mc_cpu_wait_each(mc_a2a_t *a2a, const char *phase, int slot, const uint8_t *skip,
                             mc_cpu_check_fn check, void *ctx, int timeout_ms) {
  const int W = a2a->comm->world_size;
  unsigned char *mine = mc_cpu_mine(a2a);
  mc_cpu_wait_t *w = mc_cpu(a2a)->waits;
  const uint64_t span = (uint64_t)timeout_ms * 1000000ull, t0 = now_ns();
  for (int p = 0; p < W; p++) {
    w[p].until = t0 + span;
    w[p].expect = 0;
  }
  _Atomic uint64_t *waiting = waiting_word(a2a, a2a->comm->rank);
  /* Every peer in each pass: a peer's value may ask this rank to act (the
   * mask steps join a peer's new attempt), and doing so only once the
   * peers before it are done can leave ranks waiting on each other in a
   * ring. A peer check has said 1 for is read again in every pass, and the
   * wait is over when one pass finds every peer done: until then the peer
   * may move on (a mask step's peer that gave up on the call after this
   * rank saw its step, then called again), and what was seen of it would
   * be stale. Spin, then yield, as mc_cpu_wait_ge does. */
  uint64_t look = t0 + LOOK_NS; /* the next look at the pending peers' processes, as in mc_cpu_wait_ge */
  for (unsigned it = 1;; it++) {
    const uint64_t now = it > 32 ? now_ns() : t0;
    const int looking = now > look;
    if (looking) look = now + LOOK_NS;
    int first = -1;
    for (int p = 0; p < W; p++) {
      if (skip[p]) continue;
      int64_t pid;
      const int gone = looking && w[p].until != 0 && cpu_gone(a2a, p, &pid);
      _Atomic uint64_t *sig = sig_at(mine, &a2a->shape, slot, p);
      const uint64_t v = atomic_load_explicit(sig, memory_order_acquire), before = w[p].expect;
      const int was_done = w[p].until == 0;
      if (check(ctx, p, v, &w[p].expect)) {
        w[p].until = 0;
        continue;
      }
      if (gone) return peer_gone(a2a, phase, slot, p, w[p].expect, v, t0);
      if (was_done || w[p].expect != before) w[p].until = now_ns() + span;
      else if (now > w[p].until) return timed_out(a2a, phase, slot, p, w[p].expect, v, timeout_ms);
      if (first < 0) first = p;
    }
    atomic_store_explicit(waiting, first < 0 ? 0 : (uint64_t)first + 1, memory_order_relaxed);
    if (first < 0) return MC_SUCCESS;
    if (it > 32) sched_yield();
  }
}

/* Let go of every window this rank uses (the last user in this process
 * unmaps each: a peer thread may still write into ours), and the rest. */
static void release_all(mc_a2a_t *a2a) {
  mc_cpu_t *c = mc_cpu(a2a);
  for (int r = 0; c->peer && r < a2a->comm->world_size; r++) mc_shm_release(c->peer[r]);
  free(c->peer);
  free(c->pid);
  free(c->barriers);
  free(c->waits);
  free(c->lcount);
  free(c->loff);
  free(c->ws);
  free(c);
  a2a->impl = NULL;
}

/* A rank's verdict after mapping, with its reason for the others' texts. */
typedef struct map_verdict {
  int32_t ok;
  char why[124];
} map_verdict_t;

static mc_result_t cpu_a2a_create(mc_a2a_t *a2a) {
  const mc_shape_t *s = &a2a->shape;
  mc_comm_t *comm = a2a->comm;
  const int me = comm->rank, W = comm->world_size;
  mc_cpu_t *c = calloc(1, sizeof *c);
  if (!c) return mc_fail(a2a->err, MC_ERR_SYSTEM, "out of host memory");
  a2a->impl = c;
  c->window_bytes = mc_window_bytes(s);
  c->peer = calloc((size_t)W, sizeof *c->peer);
  c->pid = calloc((size_t)W, sizeof *c->pid);
  c->ws = calloc(1, mc_workspace_bytes(s));
  c->barriers = calloc((size_t)W, sizeof *c->barriers);
  c->waits = calloc((size_t)W, sizeof *c->waits);
  c->lcount = calloc((size_t)mc_num_local_experts(s), sizeof *c->lcount);
  c->loff = calloc((size_t)mc_num_local_experts(s) + 1, sizeof *c->loff);
  mc_shm_card_t mine, *all = calloc((size_t)W, sizeof mine);
  map_verdict_t verdict = {1, ""}, *verdicts = calloc((size_t)W, sizeof verdict);
  if (!c->peer || !c->pid || !c->ws || !c->barriers || !c->waits || !c->lcount || !c->loff || !all || !verdicts) {
    /* without a place to receive, we cannot take part in the exchange; the
     * peers' allgather fails on its own timeout */
    free(all);
    free(verdicts);
    release_all(a2a);
    return mc_fail(a2a->err, MC_ERR_SYSTEM, "out of host memory");
  }
  void *p = NULL;
  mc_result_t rc = mc_shm_create(c->window_bytes, me, &mine, &p, a2a->err);
  c->peer[me] = p;
  /* Allgather even after a local failure (the card says why) so peers
   * learn of it instead of waiting for us until their timeout. */
  mc_result_t grc = mc_comm_allgather(comm, &mine, all, sizeof mine);
  if (grc != MC_SUCCESS) {
    if (rc == MC_SUCCESS) rc = mc_fail(a2a->err, grc, "creating the windows: %s", comm->err);
  } else {
    for (int r = 0; r < W; r++) c->pid[r] = all[r].pid;
    for (int r = 0; rc == MC_SUCCESS && r < W; r++) {
      if (all[r].addr == 0)
        rc = mc_fail(a2a->err, MC_ERR_SYSTEM, "rank %d could not make its window: %s", r, all[r].why);
      else if (r != me)
        rc = mc_shm_open(&all[r], c->window_bytes, (void **)&c->peer[r], a2a->err);
    }
    /* Everyone has mapped (or failed): owners close their descriptors. A
     * rank that failed says why, so that every rank names it. */
    verdict.ok = rc == MC_SUCCESS;
    if (!verdict.ok) snprintf(verdict.why, sizeof verdict.why, "%.*s", (int)sizeof verdict.why - 1, a2a->err);
    grc = mc_comm_allgather(comm, &verdict, verdicts, sizeof verdict);
    if (rc == MC_SUCCESS && grc != MC_SUCCESS) rc = mc_fail(a2a->err, grc, "creating the windows: %s", comm->err);
    for (int r = 0; rc == MC_SUCCESS && r < W; r++)
      if (!verdicts[r].ok)
        rc = mc_fail(a2a->err, MC_ERR_SYSTEM, "rank %d could not map the windows: %s", r, verdicts[r].why);
  }
  mc_shm_close_fd(&mine);
  free(all);
  free(verdicts);
  if (rc != MC_SUCCESS) {
    release_all(a2a);
    return rc;
  }
  a2a->stats.buffer_bytes = c->window_bytes + mc_workspace_bytes(s);
  return MC_SUCCESS;
}

static void cpu_a2a_destroy(mc_a2a_t *a2a) { release_all(a2a); }

/* mc_a2a_barrier: every rank not masked SETs each other's BARRIER[me] to the
 * count of barriers the two have made together, and waits for the same. */
static mc_result_t cpu_barrier(mc_a2a_t *a2a, void *stream) {
  mc_cpu_t *c = mc_cpu(a2a);
  const int W = a2a->comm->world_size;
  (void)stream;
  for (int p = 0; p < W; p++)
    if (!a2a->masked[p]) mc_cpu_signal(a2a, p, MC_SIG_BARRIER, ++c->barriers[p], MC_SIG_SET);
  for (int p = 0; p < W; p++) {
    mc_result_t rc;
    if (!a2a->masked[p] &&
        (rc = mc_cpu_wait_ge(a2a, "mc_a2a_barrier", MC_SIG_BARRIER, p, c->barriers[p], NULL)) != MC_SUCCESS)
      return rc;
  }
  return MC_SUCCESS;
}

static int cpu_usable(void) { return 1; }

static mc_result_t cpu_expert_load(mc_a2a_t *a2a, int64_t *counts, int reset) {
  uint64_t *load = mc_cpu_ws(a2a, mc_ws_load_off(&a2a->shape));
  for (int l = 0; l < mc_num_local_experts(&a2a->shape); l++) {
    counts[l] = (int64_t)load[l];
    if (reset) load[l] = 0;
  }
  return MC_SUCCESS;
}

const mc_transport_ops_t mc_cpu_ops = {
    .id = MC_TRANSPORT_CPU,
    .name = "cpu",
    .usable = cpu_usable,
    .a2a_create = cpu_a2a_create,
    .a2a_destroy = cpu_a2a_destroy,
    .dispatch_send = mc_cpu_dispatch_send,
    .dispatch_recv = mc_cpu_dispatch_recv,
    .dispatch_counts = mc_cpu_dispatch_counts,
    .combine_send = mc_cpu_combine_send,
    .combine_recv = mc_cpu_combine_recv,
    .barrier = cpu_barrier,
    .expert_load = cpu_expert_load,
    .mask = mc_cpu_mask,
};
