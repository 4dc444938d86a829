/* mc_error.c - the table of result strings, the thread-local detail text,
 * and the version and name queries that need no handle. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "mc_error.h"

static _Thread_local char tls_text[MC_ERRTEXT_LEN];

const char *mc_result_string(mc_result_t result) {
  switch (result) {
  case MC_SUCCESS: return "MC_SUCCESS: no error";
  case MC_ERR_INVALID_ARG: return "MC_ERR_INVALID_ARG: an argument broke a documented rule; nothing changed";
  case MC_ERR_INVALID_USAGE: return "MC_ERR_INVALID_USAGE: calls out of order or on a handle in use";
  case MC_ERR_TIMEOUT: return "MC_ERR_TIMEOUT: a peer did not arrive in time";
  case MC_ERR_UNSUPPORTED: return "MC_ERR_UNSUPPORTED: not available in this build or on this machine";
  case MC_ERR_SYSTEM: return "MC_ERR_SYSTEM: the operating system refused a request";
  case MC_ERR_BOOTSTRAP: return "MC_ERR_BOOTSTRAP: the out-of-band exchange failed or was refused";
  case MC_ERR_CUDA: return "MC_ERR_CUDA: a CUDA call failed";
  case MC_ERR_NVSHMEM: return "MC_ERR_NVSHMEM: an NVSHMEM call failed";
  case MC_ERR_ABORTED: return "MC_ERR_ABORTED: the handle failed earlier; destroy it";
  case MC_ERR_INTERNAL: return "MC_ERR_INTERNAL: a bug in moecomm";
  case MC_ERR_CAPACITY: return "MC_ERR_CAPACITY: a rank received more rows than its declared capacity; the round is dropped";
  }
  return "MC_ERR_UNKNOWN: not a moecomm result code";
}

static void vformat(char *text, const char *fmt, va_list ap) {
  vsnprintf(text, MC_ERRTEXT_LEN, fmt, ap);
}

mc_result_t mc_fail(char *text, mc_result_t code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vformat(text, fmt, ap);
  va_end(ap);
  return code;
}

mc_result_t mc_fail_tls(mc_result_t code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vformat(tls_text, fmt, ap);
  va_end(ap);
  return code;
}

void mc_set_tls_error(const char *text) { snprintf(tls_text, sizeof tls_text, "%s", text); }
void mc_clear_tls_error(void) { tls_text[0] = '\0'; }
const char *mc_last_error(void) { return tls_text; }

int mc_version(void) { return MC_VERSION; }

const char *mc_transport_name(mc_transport_t transport) {
  switch (transport) {
  case MC_TRANSPORT_AUTO: return "auto";
  case MC_TRANSPORT_CPU: return "cpu";
  case MC_TRANSPORT_NVSHMEM: return "nvshmem";
  case MC_TRANSPORT_P2P: return "p2p";
  }
  return NULL;
}

size_t mc_dtype_size(mc_dtype_t dtype) {
  switch (dtype) {
  case MC_DTYPE_FP32: return 4;
  case MC_DTYPE_BF16: return 2;
  case MC_DTYPE_FP16: return 2;
  }
  return 0;
}
