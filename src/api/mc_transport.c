/* mc_transport.c - the transports this build has, in the order
 * MC_TRANSPORT_AUTO prefers them, and the choice among them: the one place
 * that knows which were built. */
#include <stdio.h>
#include <string.h>

#include "mc_internal.h"

extern const mc_transport_ops_t mc_cpu_ops;
#ifdef MC_HAVE_CUDA
extern const mc_transport_ops_t mc_p2p_ops;
#endif
#ifdef MC_HAVE_NVSHMEM
extern const mc_transport_ops_t mc_nvshmem_ops;
#endif

/* p2p first (one node, no NVSHMEM needed), then nvshmem (any peers), cpu last */
static const mc_transport_ops_t *const built[] = {
#ifdef MC_HAVE_CUDA
    &mc_p2p_ops,
#endif
#ifdef MC_HAVE_NVSHMEM
    &mc_nvshmem_ops,
#endif
    &mc_cpu_ops,
};
#define N_BUILT (sizeof built / sizeof built[0])

const mc_transport_ops_t *mc_transport_ops(mc_transport_t t) {
  for (size_t i = 0; i < N_BUILT; i++)
    if (built[i]->id == t) return built[i];
  return NULL;
}

mc_result_t mc_transport_pick(mc_transport_t want, mc_transport_t *got) {
  if (want == MC_TRANSPORT_AUTO) { /* a GPU transport where one is usable, else cpu */
    *got = MC_TRANSPORT_CPU;
    for (size_t i = 0; i < N_BUILT; i++)
      if (built[i]->id != MC_TRANSPORT_CPU && built[i]->usable()) *got = MC_TRANSPORT_AUTO;
    return MC_SUCCESS;
  }
  if (!mc_transport_name(want))
    return mc_fail_tls(MC_ERR_INVALID_ARG, "config->transport=%d is not an mc_transport_t", (int)want);
  const mc_transport_ops_t *ops = mc_transport_ops(want);
  if (!ops)
    return mc_fail_tls(MC_ERR_UNSUPPORTED, "transport '%s' is not built into this libmoecomm", mc_transport_name(want));
  if (!ops->usable())
    return mc_fail_tls(MC_ERR_UNSUPPORTED, "transport '%s' needs a CUDA device and this process sees none",
                       mc_transport_name(want));
  *got = want;
  return MC_SUCCESS;
}

mc_result_t mc_transport_settle(mc_comm_t *comm, mc_transport_t *got, char *why, size_t why_n) {
  const mc_transport_ops_t *fallback = NULL;
  size_t off = 0;
  why[0] = '\0';
  for (size_t i = 0; i < N_BUILT; i++) {
    const mc_transport_ops_t *ops = built[i];
    if (ops->id == MC_TRANSPORT_CPU || !ops->usable()) continue;
    int reach = 1;
    char said[200] = "";
    if (ops->probe) {
      mc_result_t rc = ops->probe(comm, &reach, said, sizeof said);
      if (rc != MC_SUCCESS) return rc;
    }
    if (reach) {
      *got = ops->id;
      return MC_SUCCESS;
    }
    if (!fallback) fallback = ops;
    if (off < why_n) off += (size_t)snprintf(why + off, why_n - off, "%s%s: %s", off ? "; " : "", ops->name, said);
  }
  *got = fallback ? fallback->id : MC_TRANSPORT_CPU;
  return MC_SUCCESS;
}
