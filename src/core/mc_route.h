/* mc_route.h - routing arithmetic every transport and the checks share:
 * which ranks a token goes to, and whether a token's top-k is valid.
 * Host and device (MC_HD). */
#ifndef MC_ROUTE_H
#define MC_ROUTE_H

#include "mc_layout.h"

enum { MC_ROUTE_OK = 0, MC_ROUTE_OUT_OF_RANGE = 1, MC_ROUTE_DUPLICATE = 2 };

/* The distinct ranks holding a valid token's experts, ascending, into
 * dests[<= topk]; returns how many. */
MC_HD int mc_route_dests(const int32_t *idx, int topk, int num_local, uint16_t *dests) {
  int n = 0;
  for (int k = 0; k < topk; k++) {
    uint16_t r = (uint16_t)(idx[k] / num_local);
    int at = n;
    for (int j = 0; j < n; j++)
      if (dests[j] >= r) {
        at = j;
        break;
      }
    if (at < n && dests[at] == r) continue;
    for (int j = n; j > at; j--) dests[j] = dests[j - 1];
    dests[at] = r;
    n++;
  }
  return n;
}

/* Bytes of one id of mc_dispatch's indices: ids64 says int64 (else int32). */
MC_HD size_t mc_index_size(int ids64) { return ids64 ? 8 : 4; }

/* Token t's top-k ids, read at their full width, checked and narrowed into
 * idx: MC_ROUTE_OK, or the first problem, *bad_k its position and *bad_value
 * the id as given. The range is checked before narrowing, so an int64 id of
 * 2^32 + 5 is refused, never taken for expert 5. */
MC_HD int mc_route_load(const void *indices, int ids64, int64_t t, int topk, int num_experts, int32_t *idx,
                        int *bad_k, int64_t *bad_value) {
  for (int k = 0; k < topk; k++) {
    const int64_t i = t * topk + k;
    const int64_t v = ids64 ? ((const int64_t *)indices)[i] : (int64_t)((const int32_t *)indices)[i];
    if (v < 0 || v >= num_experts) {
      *bad_k = k;
      *bad_value = v;
      return MC_ROUTE_OUT_OF_RANGE;
    }
    idx[k] = (int32_t)v;
    for (int j = 0; j < k; j++)
      if (idx[j] == idx[k]) {
        *bad_k = k;
        *bad_value = v;
        return MC_ROUTE_DUPLICATE;
      }
  }
  return MC_ROUTE_OK;
}

/* The order of a token's top-k by ascending expert id (combine sums a rank's
 * experts in this order, so results do not depend on the router's order). */
MC_HD void mc_route_sorted(const int32_t *idx, int topk, int *order) {
  for (int k = 0; k < topk; k++) {
    int at = k;
    while (at > 0 && idx[order[at - 1]] > idx[k]) {
      order[at] = order[at - 1];
      at--;
    }
    order[at] = k;
  }
}

#endif
