/* mc_error.h - how every failure is reported: a result code from the one
 * table in mc_error.c plus a formatted detail string kept on the handle
 * (or per thread before a handle exists). */
#ifndef MC_ERROR_H
#define MC_ERROR_H

#include "moecomm.h"

#define MC_ERRTEXT_LEN 512

#if defined(__GNUC__)
#define MC_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define MC_PRINTF(a, b)
#endif

/* Format "fmt" into text (MC_ERRTEXT_LEN bytes) and return code, so a failing
 * path reads: return mc_fail(h->err, MC_ERR_INVALID_ARG, "m=%d > max_tokens=%d", ...). */
mc_result_t mc_fail(char *text, mc_result_t code, const char *fmt, ...) MC_PRINTF(3, 4);

/* The same into this thread's buffer, read back by mc_last_error(). */
mc_result_t mc_fail_tls(mc_result_t code, const char *fmt, ...) MC_PRINTF(2, 3);

/* Copy a detail text into this thread's buffer (a create call that failed
 * on a handle it is about to free hands the handle's text over). */
void mc_set_tls_error(const char *text);
void mc_clear_tls_error(void);

#endif
