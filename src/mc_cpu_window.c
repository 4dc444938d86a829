/* mc_cpu_window.c - the cpu transport's memory and primitives.
 *
 * Each rank maps one window (mc_window_bytes) in POSIX shared memory and
 * announces (pid, address, name) through the allgather. A peer in the same
 * process uses the address as is (one mapping: ThreadSanitizer then sees
 * every access to the same bytes); a peer in another process opens the
 * name and maps it. Once every rank has mapped every window (a barrier),
 * the owner unlinks the name, so a killed process leaves nothing behind
 * in /dev/shm and strangers cannot open it any more.
 *
 * Memory order: the writer copies with plain stores, then updates the
 * signal with a release RMW/store; the reader loads the signal with
 * acquire before touching the data ("flags after data"). Signals are
 * 8-byte aligned uint64 in shared memory; lock-free C11 atomics on them
 * are valid across processes. */
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "mc_cpu.h"

typedef struct window_id {
  int64_t pid;
  uint64_t nonce; /* with pid: "the same process" even across PID namespaces */
  uint64_t addr;
  char name[48];
} window_id_t;

/* A random number drawn once per process: two processes in different PID
 * namespaces can share a pid, never (pid, nonce). */
static uint64_t process_nonce(void) {
  static _Atomic uint64_t nonce;
  uint64_t v = atomic_load(&nonce);
  if (v) return v;
  uint64_t r = 0;
  int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    if (read(fd, &r, sizeof r) != (ssize_t)sizeof r) r = 0;
    close(fd);
  }
  r ^= (uint64_t)getpid() << 32 ^ (uint64_t)(uintptr_t)&nonce ^ (uint64_t)time(NULL);
  if (!r) r = 1;
  uint64_t expected = 0;
  atomic_compare_exchange_strong(&nonce, &expected, r); /* the first thread's draw wins */
  return atomic_load(&nonce);
}

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

mc_result_t mc_cpu_wait_ge(mc_a2a_t *a2a, const char *phase, int slot, int peer, uint64_t target,
                           uint64_t *seen) {
  _Atomic uint64_t *sig = sig_at(mc_cpu_mine(a2a), &a2a->shape, slot, peer);
  uint64_t v = atomic_load_explicit(sig, memory_order_acquire);
  if (v >= target) goto done;
  /* Spin briefly (the peer is usually a few microseconds away), then yield:
   * ranks often outnumber cores, and a spinning rank would starve the one it
   * waits for. The clock is read every 64 polls to keep polling cheap. */
  uint64_t deadline = now_ns() + (uint64_t)a2a->comm->timeout_ms * 1000000ull;
  for (unsigned it = 1;; it++) {
    v = atomic_load_explicit(sig, memory_order_acquire);
    if (v >= target) goto done;
    if (it > 32) sched_yield();
    if (it % 64 == 0 && now_ns() > deadline) {
      static const char *what[] = {"dispatch meta", "dispatch records", "combine rows",
                                   "combine entry (round barrier)"};
      return mc_fail(a2a->err, MC_ERR_TIMEOUT,
                     "%s: rank %d timed out after %d ms waiting for rank %d (%s: expected %llu, saw %llu)",
                     phase, a2a->comm->rank, a2a->comm->timeout_ms, peer, what[slot],
                     (unsigned long long)target, (unsigned long long)v);
    }
  }
done:
  if (seen) *seen = v;
  return MC_SUCCESS;
}

static void unmap_all(mc_a2a_t *a2a) {
  mc_cpu_t *c = mc_cpu(a2a);
  for (int r = 0; c->peer && r < a2a->comm->world_size; r++) {
    if (!c->peer[r] || !(c->mapped[r] || r == a2a->comm->rank)) continue;
    /* After a timeout a slow peer may still write into our window: keep it
     * mapped (a leak on a failure path) rather than let that write land in
     * unmapped or reused memory. */
    if (r == a2a->comm->rank && a2a->aborted) continue;
    munmap(c->peer[r], c->window_bytes);
  }
  free(c->peer);
  free(c->mapped);
  free(c->ws);
  free(c);
  a2a->impl = NULL;
}

static mc_result_t map_peer(mc_a2a_t *a2a, const window_id_t *id, int r) {
  mc_cpu_t *c = mc_cpu(a2a);
  if (id->pid == (int64_t)getpid() && id->nonce == process_nonce()) {
    c->peer[r] = (unsigned char *)(uintptr_t)id->addr;
    return MC_SUCCESS;
  }
  int fd = shm_open(id->name, O_RDWR, 0600);
  if (fd < 0)
    return mc_fail(a2a->err, MC_ERR_SYSTEM, "rank %d: cannot open rank %d's window %s: %s",
                   a2a->comm->rank, r, id->name, strerror(errno));
  void *p = mmap(NULL, c->window_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED)
    return mc_fail(a2a->err, MC_ERR_SYSTEM, "rank %d: cannot map rank %d's window (%llu bytes): %s",
                   a2a->comm->rank, r, (unsigned long long)c->window_bytes, strerror(errno));
  c->peer[r] = p;
  c->mapped[r] = 1;
  return MC_SUCCESS;
}

static mc_result_t cpu_a2a_create(mc_a2a_t *a2a) {
  const mc_shape_t *s = &a2a->shape;
  int me = a2a->comm->rank, W = a2a->comm->world_size;
  mc_cpu_t *c = calloc(1, sizeof *c);
  if (!c) return mc_fail(a2a->err, MC_ERR_SYSTEM, "out of host memory");
  a2a->impl = c;
  c->window_bytes = mc_window_bytes(s);
  c->peer = calloc((size_t)W, sizeof *c->peer);
  c->mapped = calloc((size_t)W, 1);
  c->ws = calloc(1, mc_workspace_bytes(s));
  window_id_t mine = {(int64_t)getpid(), process_nonce(), 0, {0}}, *all = calloc((size_t)W, sizeof mine);
  mc_result_t rc = MC_SUCCESS;
  if (!c->peer || !c->mapped || !c->ws || !all) {
    /* without a place to receive, we cannot take part in the exchange; the
     * peers' allgather fails on its own timeout */
    free(all);
    unmap_all(a2a);
    return mc_fail(a2a->err, MC_ERR_SYSTEM, "out of host memory");
  }

  /* A fresh name per window: pid, rank, and random bits against collisions. */
  unsigned rnd = (unsigned)now_ns() ^ (unsigned)(uintptr_t)c;
  snprintf(mine.name, sizeof mine.name, "/moecomm-%d-%d-%08x", (int)getpid(), me, rnd);
  int fd = -1, fd_made = 0;
  if (rc == MC_SUCCESS) {
    fd = shm_open(mine.name, O_RDWR | O_CREAT | O_EXCL, 0600);
    fd_made = fd >= 0;
    if (fd < 0 || ftruncate(fd, (off_t)c->window_bytes) != 0)
      rc = mc_fail(a2a->err, MC_ERR_SYSTEM, "rank %d: cannot create a %llu-byte shared window %s: %s",
                   me, (unsigned long long)c->window_bytes, mine.name, strerror(errno));
  }
  if (rc == MC_SUCCESS) {
    void *p = mmap(NULL, c->window_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED)
      rc = mc_fail(a2a->err, MC_ERR_SYSTEM, "rank %d: cannot map its window: %s", me, strerror(errno));
    else c->peer[me] = p, mine.addr = (uint64_t)(uintptr_t)p;
  }
  if (fd >= 0) close(fd);
  /* Allgather even after a local failure (with addr 0) so peers learn of it
   * instead of waiting for us until their timeout. */
  mc_result_t grc = mc_comm_allgather(a2a->comm, &mine, all, sizeof mine);
  if (rc == MC_SUCCESS && grc != MC_SUCCESS)
    rc = mc_fail(a2a->err, grc, "%s", a2a->comm->err);
  for (int r = 0; rc == MC_SUCCESS && r < W; r++) {
    if (all[r].addr == 0)
      rc = mc_fail(a2a->err, MC_ERR_SYSTEM, "rank %d could not create its window", r);
    else if (r != me)
      rc = map_peer(a2a, &all[r], r);
  }
  /* Everyone has mapped (or failed): the names are no longer needed. */
  int ok = rc == MC_SUCCESS, *oks = (int *)all; /* reuse: W window ids are larger than W ints */
  grc = mc_comm_allgather(a2a->comm, &ok, oks, sizeof ok);
  if (fd_made) shm_unlink(mine.name);
  for (int r = 0; rc == MC_SUCCESS && r < W; r++)
    if (grc != MC_SUCCESS || !oks[r]) rc = mc_fail(a2a->err, MC_ERR_BOOTSTRAP, "rank %d failed to map the windows", r);
  free(all);
  if (rc != MC_SUCCESS) {
    unmap_all(a2a);
    return rc;
  }
  a2a->stats.buffer_bytes = c->window_bytes + mc_workspace_bytes(s);
  return MC_SUCCESS;
}

static void cpu_a2a_destroy(mc_a2a_t *a2a) { unmap_all(a2a); }

/* barrier: mc_a2a_barrier's host barrier is the cpu transport's */
const mc_transport_ops_t mc_cpu_ops = {
    .name = "cpu",
    .a2a_create = cpu_a2a_create,
    .a2a_destroy = cpu_a2a_destroy,
    .dispatch_send = mc_cpu_dispatch_send,
    .dispatch_recv = mc_cpu_dispatch_recv,
    .combine_send = mc_cpu_combine_send,
    .combine_recv = mc_cpu_combine_recv,
};
