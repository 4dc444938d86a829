/* mc_comm.c - the communicator: who am I, how many of us, which transport,
 * and the out-of-band collectives everything else bootstraps with. */
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mc_handles.h"
#include "mc_internal.h"
#include "mc_oob.h"
#include "mc_params.h"
#include "mc_testing.h"
#include "moecomm_bench.h"

/* A failed allgather's text: a built-in helper's own account (which rank
 * it saw at fault), or, for the caller's callback, only that it failed: the
 * library cannot know which rank was to blame there. */
mc_result_t mc_comm_allgather(mc_comm_t *comm, const void *send, void *recv, size_t bytes) {
  int rc = comm->oob.allgather(send, recv, bytes, comm->oob.user);
  if (rc == 0) return MC_SUCCESS;
  if (mc_oob_threads_is(comm->oob.allgather) || mc_oob_socket_is(comm->oob.allgather))
    return mc_fail(comm->err, MC_ERR_BOOTSTRAP, "rank %d: the out-of-band allgather of %zu bytes failed: %s",
                   comm->rank, bytes, mc_last_error());
  return mc_fail(comm->err, MC_ERR_BOOTSTRAP,
                 "rank %d: the out-of-band allgather of %zu bytes failed: the caller's allgather callback "
                 "returned %d (it says nothing of which rank failed; its own logs may)",
                 comm->rank, bytes, rc);
}

void mc_comm_join_refused(mc_comm_t *comm, const void *mine, size_t bytes) {
  void *all = malloc(bytes * (size_t)comm->world_size);
  char keep[sizeof comm->err];
  memcpy(keep, comm->err, sizeof keep);
  if (all) (void)mc_comm_allgather(comm, mine, all, bytes);
  free(all);
  memcpy(comm->err, keep, sizeof keep); /* this rank's own reason, not the exchange's */
}

mc_result_t mc_comm_barrier(mc_comm_t *comm) {
  int one = 1;
  int *all = malloc(sizeof(int) * (size_t)comm->world_size);
  if (!all) return mc_fail(comm->err, MC_ERR_SYSTEM, "out of host memory");
  mc_result_t rc = mc_comm_allgather(comm, &one, all, sizeof one);
  free(all);
  return rc;
}

/* What every rank must agree on, compared after one allgather. */
typedef struct {
  int world_size, group_size, transport, version;
  int refused; /* this rank's own checks failed: it joins the exchange only so that its peers fail too */
} comm_agreement_t;

int mc_verbose(void) {
  const mc_params_t *p = mc_params(NULL);
  return p && p->verbose;
}

int mc_pid_gone(int64_t pid) {
  if (pid <= 0 || pid == (int64_t)getpid()) return 0;
  if (kill((pid_t)pid, 0) != 0) return errno == ESRCH;
  char path[64], buf[256];
  snprintf(path, sizeof path, "/proc/%lld/stat", (long long)pid);
  FILE *f = fopen(path, "re");
  if (f) {
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *state = strrchr(buf, ')'); /* "pid (comm) S ...": comm may hold spaces and parentheses */
    if (state && state[1] == ' ' && state[2]) return state[2] == 'Z' || state[2] == 'X';
  }
  /* No state read: the zombie was reaped between the two looks (a parent's
   * waitpid; its stat file then fails to open or reads empty), or there is
   * no /proc. A second kill tells. */
  return kill((pid_t)pid, 0) != 0 && errno == ESRCH;
}

void mc_describe_wait_root(int world_size, int me, int peer, const mc_wait_view_t *view, char *out, size_t n) {
  size_t off = 0;
  out[0] = '\0';
  for (int hop = 0, cur = peer; hop < world_size && off < n; hop++) {
    const char *sep = hop ? "," : ";";
    int64_t pid = 0, next_pid = 0;
    uint64_t w = 0;
    const int readable = view->waiting(view->ctx, cur, &w), next = (int)w - 1;
    const int waits = readable && w != 0 && w <= (uint64_t)world_size && next != me && next != cur;
    if (view->gone(view->ctx, cur, &pid)) {
      /* a rank that gave up on (or died waiting for) a rank that died too:
       * that one is the cause (a rank's word stays after a failed wait) */
      if (waits && view->gone(view->ctx, next, &next_pid)) {
        off += (size_t)snprintf(out + off, n - off, "%s rank %d's process (pid %lld) is gone, as it waited for rank %d",
                                sep, cur, (long long)pid, next);
        cur = next;
        continue;
      }
      snprintf(out + off, n - off, "%s rank %d's process (pid %lld) is gone: rank %d is the one missing", sep, cur,
               (long long)pid, cur);
      return;
    }
    if (!readable) return; /* this rank's word cannot be read from here */
    if (!waits) {
      if (hop) snprintf(out + off, n - off, ", which waits for nobody: rank %d is the one missing", cur);
      return;
    }
    off += (size_t)snprintf(out + off, n - off, "%s rank %d waits for rank %d", sep, cur, next);
    cur = next;
  }
}

uint64_t mc_host_id(void) {
  char name[256] = {0};
  const mc_params_t *p = mc_params(NULL); /* MC_HOST_ID: containers on several nodes can share a host name */
  if (mc_testing_host()[0]) snprintf(name, sizeof name, "%s", mc_testing_host());
  else if (p && p->host_id[0]) snprintf(name, sizeof name, "%s", p->host_id);
  else gethostname(name, sizeof name - 1);
  uint64_t h = 1469598103934665603ull;
  for (const char *c = name; *c; c++) h = (h ^ (unsigned char)*c) * 1099511628211ull;
  return h;
}

/* NULL, or a communicator this process does not hold (destroyed already)? */
static mc_result_t not_live(const mc_comm_t *comm, const char *call) {
  if (!comm) return mc_fail_tls(MC_ERR_INVALID_ARG, "%s: comm is NULL", call);
  if (!mc_handle_live(comm))
    return mc_fail_tls(MC_ERR_INVALID_USAGE, "%s: comm=%p is not a live communicator (destroyed already?)", call,
                       (const void *)comm);
  return MC_SUCCESS;
}

mc_result_t mc_comm_bench_dense_alltoall(mc_comm_t *comm, size_t bytes_per_peer, int warmup, int iters,
                                         float *times_us) {
  mc_result_t live = not_live(comm, "mc_comm_bench_dense_alltoall");
  if (live != MC_SUCCESS) return live;
  if (!times_us || iters < 1 || warmup < 0 || bytes_per_peer == 0)
    return mc_fail(comm->err, MC_ERR_INVALID_ARG, "times_us, iters=%d >= 1, warmup=%d >= 0, bytes_per_peer=%zu > 0",
                   iters, warmup, bytes_per_peer);
  const mc_transport_ops_t *ops = mc_transport_ops(comm->transport);
  if (ops && ops->dense_alltoall) return ops->dense_alltoall(comm, bytes_per_peer, iters, warmup, times_us);
  return mc_fail(comm->err, MC_ERR_UNSUPPORTED, "no dense all-to-all baseline on the '%s' transport",
                 mc_transport_name(comm->transport));
}

mc_result_t mc_comm_create(const mc_oob_t *oob, const mc_comm_config_t *config, mc_comm_t **out) {
  mc_clear_tls_error();
  if (!out) return mc_fail_tls(MC_ERR_INVALID_ARG, "out is NULL");
  *out = NULL;
  if (!oob || !oob->allgather) return mc_fail_tls(MC_ERR_INVALID_ARG, "oob or oob->allgather is NULL");
  if (oob->world_size < 1 || oob->world_size > 65535)
    return mc_fail_tls(MC_ERR_INVALID_ARG, "oob->world_size=%d is not in 1..65535", oob->world_size);
  if (oob->rank < 0 || oob->rank >= oob->world_size)
    return mc_fail_tls(MC_ERR_INVALID_ARG, "oob->rank=%d is not in 0..%d", oob->rank, oob->world_size - 1);
  /* From here on a rank whose own checks fail still joins the exchange
   * below, marked as refused: its peers then fail at once, naming it, and
   * every rank's next create meets its peers' next create (a rank that
   * returned early would leave them waiting, or pair its retry with their
   * first call). */
  mc_comm_t *comm = calloc(1, sizeof *comm);
  if (!comm) return mc_fail_tls(MC_ERR_SYSTEM, "out of host memory");
  comm->rank = oob->rank;
  comm->world_size = oob->world_size;
  comm->oob = *oob;
  mc_result_t rc = MC_SUCCESS;
  const char *bad_param = NULL;
  const mc_params_t *params = NULL;
  mc_transport_t transport = MC_TRANSPORT_CPU;
  if (!config)
    rc = mc_fail(comm->err, MC_ERR_INVALID_ARG, "config is NULL (use MC_COMM_CONFIG_INITIALIZER)");
  else if (config->size < sizeof(mc_comm_config_t) || config->version / 100 != MC_VERSION / 100)
    rc = mc_fail(comm->err, MC_ERR_INVALID_ARG,
                 "config->size=%zu / version=%u do not match this library (%zu / %d): "
                 "start from MC_COMM_CONFIG_INITIALIZER",
                 config->size, config->version, sizeof(mc_comm_config_t), MC_VERSION);
  else if (config->group_size < 1 || oob->world_size % config->group_size != 0)
    rc = mc_fail(comm->err, MC_ERR_INVALID_ARG, "config->group_size=%d does not divide world_size=%d",
                 config->group_size, oob->world_size);
  else if (config->timeout_ms < 0 || config->timeout_ms > MC_TIMEOUT_MS_MAX)
    rc = mc_fail(comm->err, MC_ERR_INVALID_ARG, "config->timeout_ms=%d is not in 0..%d (0: MC_TIMEOUT_MS)",
                 config->timeout_ms, MC_TIMEOUT_MS_MAX);
  else if (!(params = mc_params(&bad_param)))
    rc = mc_fail(comm->err, MC_ERR_INVALID_ARG, "mc_comm_create: %s", bad_param);
  else if ((rc = mc_transport_pick(config->transport, &transport)) != MC_SUCCESS)
    snprintf(comm->err, sizeof comm->err, "%s", mc_last_error());
  const int refused = rc != MC_SUCCESS;
  if (!refused) {
    comm->group_size = config->group_size;
    comm->timeout_ms = config->timeout_ms ? config->timeout_ms : params->timeout_ms;
    comm->device = config->device;
  }
  comm->transport = transport;

  /* Every rank must agree, or the first dispatch would corrupt memory. */
  comm_agreement_t mine;
  memset(&mine, 0, sizeof mine);
  mine.world_size = comm->world_size, mine.group_size = comm->group_size, mine.transport = (int)transport;
  mine.version = MC_VERSION;
  mine.refused = refused;
  comm_agreement_t *all = NULL;
  if (refused) mc_comm_join_refused(comm, &mine, sizeof mine);
  else if (!(all = malloc(sizeof mine * (size_t)comm->world_size)))
    rc = mc_fail(comm->err, MC_ERR_SYSTEM, "out of host memory");
  else
    rc = mc_comm_allgather(comm, &mine, all, sizeof mine);
  for (int r = 0; rc == MC_SUCCESS && r < comm->world_size; r++)
    if (all[r].refused)
      rc = mc_fail(comm->err, MC_ERR_INVALID_ARG,
                   "rank %d refused its own communicator config (its mc_last_error() says why)", r);
    else if (memcmp(&all[r], &mine, sizeof mine) != 0)
      rc = mc_fail(comm->err, MC_ERR_INVALID_ARG,
                   "rank %d disagrees with rank %d: world_size %d/%d, group_size %d/%d, "
                   "transport %d/%d, version %d/%d",
                   r, comm->rank, all[r].world_size, mine.world_size, all[r].group_size,
                   mine.group_size, all[r].transport, mine.transport, all[r].version, mine.version);
  free(all);
  /* auto with a GPU (every rank agreed on it just above): the first GPU
   * transport that reaches every peer (p2p: every rank on this host can map
   * every peer's memory, by a probe; nvshmem: any peers, but one rank per
   * process), else the first usable one, whose create then names the peer
   * it cannot reach. mc_comm_transport() reports the choice; MC_VERBOSE=1
   * prints it, with what the ones passed over said. */
  if (rc == MC_SUCCESS && transport == MC_TRANSPORT_AUTO) {
    char why[400];
    rc = mc_transport_settle(comm, &transport, why, sizeof why);
    if (rc == MC_SUCCESS && comm->rank == 0 && mc_verbose())
      fprintf(stderr, "moecomm: transport auto -> %s%s%s%s\n", mc_transport_name(transport), why[0] ? " (" : "", why,
              why[0] ? ")" : "");
  }
  comm->transport = transport;
  if (rc == MC_SUCCESS && comm->rank == 0 && params->verbose) mc_params_print(stderr);
  const mc_transport_ops_t *ops = mc_transport_ops(transport);
  if (rc == MC_SUCCESS && ops->comm_init) rc = ops->comm_init(comm);
  if (rc == MC_SUCCESS && mc_handle_add(comm) != 0) {
    if (ops->comm_fini) ops->comm_fini(comm);
    rc = mc_fail(comm->err, MC_ERR_SYSTEM, "out of host memory");
  }
  if (rc != MC_SUCCESS) {
    mc_set_tls_error(comm->err);
    free(comm);
    return rc;
  }
  *out = comm;
  return MC_SUCCESS;
}

mc_result_t mc_comm_destroy(mc_comm_t *comm) {
  if (!comm) return MC_SUCCESS;
  mc_result_t live = not_live(comm, "mc_comm_destroy");
  if (live != MC_SUCCESS) return live;
  if (comm->live_a2a > 0)
    return mc_fail(comm->err, MC_ERR_INVALID_USAGE,
                   "%d all-to-all handle(s) made from this communicator are not destroyed yet",
                   comm->live_a2a);
  mc_handle_remove(comm);
  const mc_transport_ops_t *ops = mc_transport_ops(comm->transport);
  if (ops && ops->comm_fini) ops->comm_fini(comm);
  free(comm);
  return MC_SUCCESS;
}

static int is_live(const mc_comm_t *comm) { return comm && mc_handle_live(comm); }
int mc_comm_rank(const mc_comm_t *comm) { return is_live(comm) ? comm->rank : -1; }
int mc_comm_world_size(const mc_comm_t *comm) { return is_live(comm) ? comm->world_size : -1; }
int mc_comm_group_size(const mc_comm_t *comm) { return is_live(comm) ? comm->group_size : -1; }
mc_transport_t mc_comm_transport(const mc_comm_t *comm) { return is_live(comm) ? comm->transport : MC_TRANSPORT_AUTO; }
const char *mc_comm_last_error(const mc_comm_t *comm) {
  return !comm ? "comm is NULL" : mc_handle_live(comm) ? comm->err : "comm is not a live communicator (destroyed already?)";
}
