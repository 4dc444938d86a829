/* mc_testing.h - for the test suite only: paths that the defaults of one
 * machine never take, forced on for this process. Exported with the
 * library's prefix (the tests link the shared library) but in no public
 * header; the environment plays no part. */
#ifndef MC_TESTING_H
#define MC_TESTING_H

#include "moecomm.h"

enum {
  MC_TESTING_STAGED = 1,   /* GPU transports: stage and put even to reachable peers (a network's path) */
  MC_TESTING_SYS_SCOPE = 2 /* GPU transports: system-scope signals even where every rank shares a GPU */
};
/* Force `what` on or off for the handles this process creates from now on. */
MC_API void mc_testing_force(int what, int on);
int mc_testing_forced(int what);
/* This process claims host `name` (NULL: its own), as MC_HOST_ID would for
 * a process that had not read its settings yet: fork()ed test ranks inherit
 * their parent's settings, read once, so setting MC_HOST_ID there is too late. */
MC_API void mc_testing_set_host(const char *name);
const char *mc_testing_host(void);

#endif
