/* mc_oob.h - what the rest of the library may ask of the built-in
 * bootstrap helpers (moecomm.h's mc_oob_threads_* and mc_oob_socket_*). */
#ifndef MC_OOB_H
#define MC_OOB_H

#include "moecomm.h"

/* Whether fn is the allgather of the threads helper, or of the socket
 * helper. When either fails it has just put in mc_last_error() what it
 * saw (the rank at fault, where it can tell); a caller's own allgather
 * promises nothing of the kind. */
int mc_oob_threads_is(mc_allgather_fn fn);
int mc_oob_socket_is(mc_allgather_fn fn);

#endif
