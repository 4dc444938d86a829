/* mc_params.c - the table of settings (mc_params.h). Each entry parses its
 * variable into the struct, or says why it cannot; none must agree across
 * ranks (what must, the communicator's and the handle's configs carry and
 * compare). */
#include "mc_params.h"
#include "mc_testing.h"

#include <arpa/inet.h>
#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

typedef struct param {
  const char *name, *def, *doc;
  /* parse v (never NULL) into p; 0, or -1 with what it must be in *must */
  int (*parse)(const char *v, mc_params_t *p, const char **must);
} param_t;

static int parse_timeout(const char *v, mc_params_t *p, const char **must) {
  char *end;
  long t = strtol(v, &end, 10);
  *must = "an integer number of milliseconds in 1..86400000 (MC_TIMEOUT_MS_MAX)";
  if (*v == '\0' || *end != '\0' || t < 1 || t > MC_TIMEOUT_MS_MAX) return -1;
  p->timeout_ms = (int)t;
  return 0;
}
static int parse_verbose(const char *v, mc_params_t *p, const char **must) {
  *must = "0 or 1";
  if (strcmp(v, "0") != 0 && strcmp(v, "1") != 0) return -1;
  p->verbose = v[0] == '1';
  return 0;
}
static int parse_string(const char *v, char *out, size_t n, const char **must) {
  *must = "shorter";
  if (strlen(v) >= n) return -1;
  strcpy(out, v);
  return 0;
}
static int parse_host(const char *v, mc_params_t *p, const char **must) {
  return parse_string(v, p->host_id, sizeof p->host_id, must);
}
static int parse_addr(const char *v, mc_params_t *p, const char **must) {
  struct in_addr a;
  *must = "an IPv4 address";
  if (inet_pton(AF_INET, v, &a) != 1) return -1;
  return parse_string(v, p->bootstrap_addr, sizeof p->bootstrap_addr, must);
}
static int parse_trace(const char *v, mc_params_t *p, const char **must) {
  return parse_string(v, p->gpu_trace, sizeof p->gpu_trace, must);
}

static const param_t table[] = {
    {"MC_TIMEOUT_MS", "10000", "the longest any wait for a peer lasts, where the config leaves timeout_ms 0",
     parse_timeout},
    {"MC_VERBOSE", "0", "1: rank 0 prints the transport, grid and launch choices, and these settings, at create",
     parse_verbose},
    {"MC_HOST_ID", "", "the host's name for grouping ranks by host (default: the host name); set it where "
                       "containers on several nodes share one",
     parse_host},
    {"MC_BOOTSTRAP_ADDR", "127.0.0.1", "the IPv4 address mc_unique_id_create listens on", parse_addr},
    {"MC_GPU_TRACE", "", "GPU transports: a file prefix; every kernel then stamps the GPU clock and "
                         "mc_a2a_check appends the stamps to <prefix>.<rank> (scripts/mc_report.py trace)",
     parse_trace},
};

static pthread_once_t once = PTHREAD_ONCE_INIT;
static mc_params_t params;
static char bad[320];

static void read_all(void) {
  for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
    const char *env = getenv(table[i].name), *must = "";
    (void)table[i].parse(table[i].def, &params, &must); /* the defaults parse (tests/test_api.c checks) */
    if (env && *env && table[i].parse(env, &params, &must) != 0 && !bad[0])
      snprintf(bad, sizeof bad, "%s='%.64s' is not %s", table[i].name, env, must);
  }
}

const mc_params_t *mc_params(const char **why) {
  pthread_once(&once, read_all);
  if (why) *why = bad;
  return bad[0] ? NULL : &params;
}

void mc_params_print(FILE *f) {
  const mc_params_t *p = mc_params(NULL);
  for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
    const char *env = getenv(table[i].name);
    fprintf(f, "moecomm: %s=%s%s: %s\n", table[i].name, env && *env ? env : table[i].def,
            env && *env ? "" : " (default)", table[i].doc);
  }
  (void)p;
}

/* ---- the test suite's forced paths (mc_testing.h) ---- */
static int forced; /* MC_TESTING_* bits; set before the handles they concern are made */

void mc_testing_force(int what, int on) {
  if (on) __atomic_or_fetch(&forced, what, __ATOMIC_RELAXED);
  else __atomic_and_fetch(&forced, ~what, __ATOMIC_RELAXED);
}
int mc_testing_forced(int what) { return (__atomic_load_n(&forced, __ATOMIC_RELAXED) & what) != 0; }

static char test_host[64]; /* set before the communicators it concerns, by one thread */
void mc_testing_set_host(const char *name) { snprintf(test_host, sizeof test_host, "%s", name ? name : ""); }
const char *mc_testing_host(void) { return test_host; }
