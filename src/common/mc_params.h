/* mc_params.h - every setting moecomm reads from the environment, in one
 * table (mc_params.c): name, default, parser, one line of documentation.
 * Read once per process, at first use; a malformed value fails the call
 * that needs the settings (a communicator's or an id's create) with a text
 * that names it. MC_VERBOSE=1 prints the table at create. */
#ifndef MC_PARAMS_H
#define MC_PARAMS_H

#include <stdio.h>

/* The longest wait for a peer anyone may ask for (a day, in ms): twice it
 * still fits an int, and a wait meant to be bounded stays so. */
#define MC_TIMEOUT_MS_MAX 86400000

typedef struct mc_params {
  int timeout_ms;          /* MC_TIMEOUT_MS */
  int verbose;             /* MC_VERBOSE */
  char host_id[256];       /* MC_HOST_ID: "" means the host name */
  char bootstrap_addr[64]; /* MC_BOOTSTRAP_ADDR */
  char gpu_trace[512];     /* MC_GPU_TRACE: "" means off */
} mc_params_t;

/* The settings, or NULL when one is malformed: *why then says which, the
 * value and what it must be. */
const mc_params_t *mc_params(const char **why);
/* One line per setting: name, value, what it does. */
void mc_params_print(FILE *f);

#endif
