/* mc_handles.c - the set of live handles: a short array under a mutex (a
 * process holds a few communicators and handles; every API call on a
 * handle looks it up, at the cost of a lock and a scan of a few entries). */
#include "mc_handles.h"

#include <pthread.h>
#include <stdlib.h>

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static const void **live;
static size_t n_live, cap_live;

int mc_handle_add(const void *h) {
  int rc = 0;
  pthread_mutex_lock(&mu);
  if (n_live == cap_live) {
    size_t cap = cap_live ? 2 * cap_live : 16;
    const void **grown = realloc(live, cap * sizeof *grown);
    if (grown) live = grown, cap_live = cap;
    else rc = -1;
  }
  if (rc == 0) live[n_live++] = h;
  pthread_mutex_unlock(&mu);
  return rc;
}

void mc_handle_remove(const void *h) {
  pthread_mutex_lock(&mu);
  for (size_t i = 0; i < n_live; i++)
    if (live[i] == h) {
      live[i] = live[--n_live];
      break;
    }
  pthread_mutex_unlock(&mu);
}

int mc_handle_live(const void *h) {
  int found = 0;
  pthread_mutex_lock(&mu);
  for (size_t i = n_live; i-- > 0 && !found;) found = live[i] == h;
  pthread_mutex_unlock(&mu);
  return found;
}
