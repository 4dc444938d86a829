/* mc_a2a.c - the all-to-all handle: checks every argument and the call
 * order once, for every transport, then hands the half to the transport.
 * A check that fails returns before the transport sees anything, which is
 * what makes "a bad call changes nothing" true. */
#include <stdlib.h>
#include <string.h>

#include "mc_handles.h"
#include "moecomm_bench.h"
#include "mc_internal.h"
#include "mc_quant.h"
#include "mc_route.h"

/* Every call on a handle first: NULL, or a handle this process does not
 * hold (destroyed already), is refused with the reason in this thread's
 * text, since the handle's own text is gone with it. */
#define NEED_LIVE_A2A(a2a, call)                                                                                       \
  do {                                                                                                                 \
    if (!(a2a)) return mc_fail_tls(MC_ERR_INVALID_ARG, "%s: a2a is NULL", call);                                       \
    if (!mc_handle_live(a2a))                                                                                          \
      return mc_fail_tls(MC_ERR_INVALID_USAGE, "%s: a2a=%p is not a live handle (destroyed already?)", call,         \
                         (const void *)(a2a));                                                                         \
  } while (0)

static int misaligned(const void *p, size_t a) { return ((uintptr_t)p % a) != 0; }

static int dtype_ok(mc_dtype_t d) { return mc_dtype_size(d) != 0; }

static mc_result_t check_config(char *err, const mc_comm_t *comm, const mc_a2a_config_t *c) {
  if (c->size < sizeof(mc_a2a_config_t) || c->version / 100 != MC_VERSION / 100)
    return mc_fail(err, MC_ERR_INVALID_ARG,
                   "config->size=%zu / version=%u do not match this library (%zu / %d): "
                   "start from MC_A2A_CONFIG_INITIALIZER",
                   c->size, c->version, sizeof(mc_a2a_config_t), MC_VERSION);
  if (c->dispatch_input != MC_INPUT_BYTES && c->dispatch_input != MC_INPUT_BF16_TO_E4M3)
    return mc_fail(err, MC_ERR_INVALID_ARG,
                   "config->dispatch_input=%d is not an mc_dispatch_input_t (bytes 0, bf16 to e4m3 1)",
                   (int)c->dispatch_input);
  if (c->scale_format != MC_SCALE_FP32 && c->scale_format != MC_SCALE_UE8M0)
    return mc_fail(err, MC_ERR_INVALID_ARG, "config->scale_format=%d is not an mc_scale_format_t (fp32 0, ue8m0 1)",
                   (int)c->scale_format);
  if (c->dispatch_input == MC_INPUT_BF16_TO_E4M3) {
    /* expert_x holds one e4m3 byte a value, expert_scale one scale a block
     * of 128 (4 bytes, or 1 for UE8M0: rows of whole 4-byte words) */
    const int ue = c->scale_format == MC_SCALE_UE8M0, unit = ue ? 4 * MC_QBLOCK : MC_QBLOCK;
    if (c->hidden < unit || c->hidden % unit != 0)
      return mc_fail(err, MC_ERR_INVALID_ARG,
                     "config->hidden=%d must be a multiple of %d to quantise in blocks of 128 with %s scales",
                     c->hidden, unit, ue ? "UE8M0" : "fp32");
    const size_t tb = (size_t)c->hidden, sb = mc_quant_scale_bytes(c->hidden, ue);
    if (c->token_bytes != tb || c->scale_bytes != sb)
      return mc_fail(err, MC_ERR_INVALID_ARG,
                     "config->token_bytes=%zu / scale_bytes=%zu: quantising hidden=%d values to e4m3 they are %zu / "
                     "%zu (a byte a value; hidden / 128 %s scales)",
                     c->token_bytes, c->scale_bytes, c->hidden, tb, sb, ue ? "one-byte UE8M0" : "fp32");
  }
  if (c->max_tokens < 1 || c->max_tokens > (1 << 20))
    return mc_fail(err, MC_ERR_INVALID_ARG, "config->max_tokens=%d is not in 1..%d", c->max_tokens, 1 << 20);
  if (c->num_experts < 1 || c->num_experts % comm->world_size != 0)
    return mc_fail(err, MC_ERR_INVALID_ARG,
                   "config->num_experts=%d is not a positive multiple of world_size=%d",
                   c->num_experts, comm->world_size);
  if (c->experts_per_token < 1 || c->experts_per_token > MC_MAX_TOPK ||
      c->experts_per_token > c->num_experts)
    return mc_fail(err, MC_ERR_INVALID_ARG,
                   "config->experts_per_token=%d is not in 1..min(%d, num_experts=%d)",
                   c->experts_per_token, MC_MAX_TOPK, c->num_experts);
  if (c->token_bytes == 0 || c->token_bytes % 16 != 0 || c->token_bytes > (1u << 24))
    return mc_fail(err, MC_ERR_INVALID_ARG,
                   "config->token_bytes=%zu must be a multiple of 16 in 16..%u", c->token_bytes, 1u << 24);
  if (c->scale_bytes % 4 != 0 || c->scale_bytes > (1u << 20))
    return mc_fail(err, MC_ERR_INVALID_ARG,
                   "config->scale_bytes=%zu must be a multiple of 4 in 0..%u", c->scale_bytes, 1u << 20);
  if (c->hidden < 8 || c->hidden % 8 != 0 || c->hidden > (1 << 22))
    return mc_fail(err, MC_ERR_INVALID_ARG, "config->hidden=%d must be a multiple of 8 in 8..%d",
                   c->hidden, 1 << 22);
  /* slot and record indices are int: keep every count of them well inside */
  uint64_t groups = (uint64_t)comm->world_size / (uint64_t)comm->group_size;
  if (groups * (uint64_t)c->max_tokens > (1u << 30) ||
      (uint64_t)comm->world_size * (((uint64_t)c->max_tokens + comm->group_size - 1) / comm->group_size) > (1u << 30))
    return mc_fail(err, MC_ERR_INVALID_ARG,
                   "config->max_tokens=%d with %llu groups of %d ranks exceeds 2^30 slots per expert or records per rank",
                   c->max_tokens, (unsigned long long)groups, comm->group_size);
  if (!dtype_ok(c->combine_in_dtype))
    return mc_fail(err, MC_ERR_INVALID_ARG, "config->combine_in_dtype=%d is not an mc_dtype_t",
                   (int)c->combine_in_dtype);
  if (!dtype_ok(c->combine_out_dtype))
    return mc_fail(err, MC_ERR_INVALID_ARG, "config->combine_out_dtype=%d is not an mc_dtype_t",
                   (int)c->combine_out_dtype);
  if (c->index_dtype != MC_INDEX_INT32 && c->index_dtype != MC_INDEX_INT64)
    return mc_fail(err, MC_ERR_INVALID_ARG, "config->index_dtype=%d is not an mc_index_dtype_t (int32 0, int64 1)",
                   (int)c->index_dtype);
  if (c->recv_layout != MC_LAYOUT_BATCHED && c->recv_layout != MC_LAYOUT_PACKED &&
      c->recv_layout != MC_LAYOUT_EXPERT_SORTED)
    return mc_fail(err, MC_ERR_INVALID_ARG,
                   "config->recv_layout=%d is not an mc_recv_layout_t (batched 0, packed 1, expert-sorted 2)",
                   (int)c->recv_layout);
  if (c->recv_layout == MC_LAYOUT_EXPERT_SORTED ? c->expert_align < 1 || c->expert_align > 1024 : c->expert_align != 1)
    return mc_fail(err, MC_ERR_INVALID_ARG, "config->expert_align=%d must be %s", c->expert_align,
                   c->recv_layout == MC_LAYOUT_EXPERT_SORTED ? "in 1..1024" : "1 outside the expert-sorted layout");
  if (c->recv_layout == MC_LAYOUT_EXPERT_SORTED) { /* its row indices are int32, padding included */
    const uint64_t L = (uint64_t)c->num_experts / (uint64_t)comm->world_size, K = (uint64_t)c->experts_per_token;
    const uint64_t rows = groups * (uint64_t)c->max_tokens * (K < L ? K : L) + L * (uint64_t)(c->expert_align - 1);
    if (rows > INT32_MAX)
      return mc_fail(err, MC_ERR_INVALID_ARG,
                     "config: the expert-sorted layout could need %llu rows a rank (pairs and padding), above 2^31 - 1",
                     (unsigned long long)rows);
  }
  return MC_SUCCESS;
}

/* The first field in which rank r's config differs from this rank's, with both values. */
static mc_result_t config_mismatch(mc_comm_t *comm, int r, const mc_a2a_config_t *theirs, const mc_a2a_config_t *mine) {
#define DIFF(field, fmt, cast)                                                                                         \
  if (theirs->field != mine->field)                                                                                    \
    return mc_fail(comm->err, MC_ERR_INVALID_ARG, "mc_a2a_create: rank %d passed config->" #field "=" fmt               \
                   ", rank %d passed " fmt ": every rank must pass the same config", r, (cast)theirs->field,           \
                   comm->rank, (cast)mine->field);
  DIFF(max_tokens, "%d", int)
  DIFF(num_experts, "%d", int)
  DIFF(experts_per_token, "%d", int)
  DIFF(token_bytes, "%zu", size_t)
  DIFF(scale_bytes, "%zu", size_t)
  DIFF(hidden, "%d", int)
  DIFF(combine_in_dtype, "%d", int)
  DIFF(combine_out_dtype, "%d", int)
  DIFF(index_dtype, "%d", int)
  DIFF(dispatch_input, "%d", int)
  DIFF(scale_format, "%d", int)
  DIFF(recv_layout, "%d", int)
  DIFF(expert_align, "%d", int)
  DIFF(version, "%u", unsigned)
#undef DIFF
  return mc_fail(comm->err, MC_ERR_INVALID_ARG, "mc_a2a_create: rank %d passed a different config than rank %d", r,
                 comm->rank);
}

static mc_result_t a2a_create(mc_comm_t *comm, const mc_a2a_config_t *config, mc_a2a_t **out);

/* Any failure's text on the communicator and, for mc_last_error(), in this
 * thread's text too. */
mc_result_t mc_a2a_create(mc_comm_t *comm, const mc_a2a_config_t *config, mc_a2a_t **out) {
  mc_clear_tls_error();
  if (!out) return mc_fail_tls(MC_ERR_INVALID_ARG, "mc_a2a_create: out is NULL");
  *out = NULL;
  if (!comm) return mc_fail_tls(MC_ERR_INVALID_ARG, "mc_a2a_create: comm is NULL");
  if (!mc_handle_live(comm))
    return mc_fail_tls(MC_ERR_INVALID_USAGE, "mc_a2a_create: comm=%p is not a live communicator (destroyed already?)",
                       (void *)comm);
  mc_result_t rc = a2a_create(comm, config, out);
  if (rc != MC_SUCCESS) mc_set_tls_error(comm->err);
  return rc;
}

/* A config that fails this rank's checks: the exchange of configs gets one
 * of size 0 (mc_comm_join_refused; a rank that returned early would leave
 * its peers waiting, or pair its retry with their first call). */
static mc_result_t join_refused(mc_comm_t *comm, mc_result_t rc) {
  mc_a2a_config_t none;
  memset(&none, 0, sizeof none);
  mc_comm_join_refused(comm, &none, sizeof none);
  return rc;
}

static mc_result_t a2a_create(mc_comm_t *comm, const mc_a2a_config_t *config, mc_a2a_t **out) {
  if (!config)
    return join_refused(comm, mc_fail(comm->err, MC_ERR_INVALID_ARG, "config is NULL (use MC_A2A_CONFIG_INITIALIZER)"));
  mc_result_t rc = check_config(comm->err, comm, config);
  if (rc != MC_SUCCESS) return join_refused(comm, rc);
  const mc_transport_ops_t *ops = mc_transport_ops(comm->transport);
  if (!ops)
    return join_refused(comm, mc_fail(comm->err, MC_ERR_UNSUPPORTED, "no transport '%s' in this build",
                                      mc_transport_name(comm->transport)));
  if (config->recv_layout != MC_LAYOUT_BATCHED && !ops->dispatch_counts)
    return join_refused(comm, mc_fail(comm->err, MC_ERR_UNSUPPORTED,
                                      "config->recv_layout=%d: the %s transport has the batched layout only; the "
                                      "packed layouts run on the cpu transport",
                                      (int)config->recv_layout, ops->name));

  /* The same config on every rank, or buffers would be carved differently.
   * Copied field by field into a zeroed struct: padding bytes must not make
   * equal configs compare unequal. */
  mc_a2a_config_t mine, *all = malloc(sizeof mine * (size_t)comm->world_size);
  memset(&mine, 0, sizeof mine);
  mine.size = sizeof mine;
  mine.version = MC_VERSION;
  mine.max_tokens = config->max_tokens;
  mine.num_experts = config->num_experts;
  mine.experts_per_token = config->experts_per_token;
  mine.token_bytes = config->token_bytes;
  mine.scale_bytes = config->scale_bytes;
  mine.hidden = config->hidden;
  mine.combine_in_dtype = config->combine_in_dtype;
  mine.combine_out_dtype = config->combine_out_dtype;
  mine.index_dtype = config->index_dtype;
  mine.dispatch_input = config->dispatch_input;
  mine.scale_format = config->scale_format;
  mine.recv_layout = config->recv_layout;
  mine.expert_align = config->expert_align;
  if (!all) return mc_fail(comm->err, MC_ERR_SYSTEM, "out of host memory");
  rc = mc_comm_allgather(comm, &mine, all, sizeof mine);
  for (int r = 0; rc == MC_SUCCESS && r < comm->world_size; r++)
    if (all[r].size == 0)
      rc = mc_fail(comm->err, MC_ERR_INVALID_ARG,
                   "rank %d refused its own all-to-all config (its mc_last_error() says why)", r);
    else if (memcmp(&all[r], &mine, sizeof mine) != 0)
      rc = config_mismatch(comm, r, &all[r], &mine);
  free(all);
  if (rc != MC_SUCCESS) return rc;

  mc_a2a_t *a2a = calloc(1, sizeof *a2a);
  if (!a2a) return mc_fail(comm->err, MC_ERR_SYSTEM, "out of host memory");
  a2a->comm = comm;
  a2a->cfg = mine;
  a2a->ops = ops;
  a2a->shape = mc_shape_make(comm->world_size, comm->group_size, config->num_experts, config->experts_per_token,
                             config->max_tokens, config->hidden, config->token_bytes, config->scale_bytes,
                             mc_dtype_size(config->combine_in_dtype), (int)config->recv_layout, config->expert_align);
  a2a->stats.size = sizeof a2a->stats;
  a2a->masked = calloc((size_t)comm->world_size, 1);
  a2a->mask_calls = calloc((size_t)comm->world_size, sizeof *a2a->mask_calls);
  if (!a2a->masked || !a2a->mask_calls) {
    free(a2a->masked);
    free(a2a->mask_calls);
    free(a2a);
    return mc_fail(comm->err, MC_ERR_SYSTEM, "out of host memory");
  }
  rc = ops->a2a_create(a2a);
  if (rc == MC_SUCCESS && mc_handle_add(a2a) != 0) {
    ops->a2a_destroy(a2a);
    rc = mc_fail(a2a->err, MC_ERR_SYSTEM, "out of host memory");
  }
  if (rc != MC_SUCCESS) {
    memcpy(comm->err, a2a->err, sizeof comm->err);
    free(a2a->masked);
    free(a2a->mask_calls);
    free(a2a);
    return rc;
  }
  comm->live_a2a++;
  *out = a2a;
  return MC_SUCCESS;
}

mc_result_t mc_a2a_destroy(mc_a2a_t *a2a) {
  if (!a2a) return MC_SUCCESS;
  NEED_LIVE_A2A(a2a, "mc_a2a_destroy");
  mc_handle_remove(a2a);
  a2a->ops->a2a_destroy(a2a);
  a2a->comm->live_a2a--;
  free(a2a->masked);
  free(a2a->mask_calls);
  free(a2a);
  return MC_SUCCESS;
}

int mc_a2a_expert_capacity(const mc_a2a_t *a2a) {
  return a2a && mc_handle_live(a2a) ? mc_expert_capacity(&a2a->shape) : -1;
}
int mc_a2a_num_local_experts(const mc_a2a_t *a2a) {
  return a2a && mc_handle_live(a2a) ? mc_num_local_experts(&a2a->shape) : -1;
}
const char *mc_a2a_last_error(const mc_a2a_t *a2a) {
  return !a2a ? "a2a is NULL" : mc_handle_live(a2a) ? a2a->err : "a2a is not a live handle (destroyed already?)";
}

mc_result_t mc_a2a_get_stats(const mc_a2a_t *a2a, mc_a2a_stats_t *stats) {
  NEED_LIVE_A2A(a2a, "mc_a2a_get_stats");
  mc_a2a_t *h = (mc_a2a_t *)a2a; /* the error text is the only thing written */
  if (!stats) return mc_fail(h->err, MC_ERR_INVALID_ARG, "mc_a2a_get_stats: stats is NULL");
  if (stats->size < sizeof *stats)
    return mc_fail(h->err, MC_ERR_INVALID_ARG, "mc_a2a_get_stats: stats->size=%zu < %zu: set it to sizeof(mc_a2a_stats_t)",
                   stats->size, sizeof *stats);
  if (a2a->ops->refresh_stats) a2a->ops->refresh_stats((mc_a2a_t *)a2a); /* counters live on the device */
  *stats = a2a->stats;
  return MC_SUCCESS;
}

mc_result_t mc_a2a_get_expert_load(mc_a2a_t *a2a, int64_t *counts, int reset) {
  NEED_LIVE_A2A(a2a, "mc_a2a_get_expert_load");
  if (!counts) return mc_fail(a2a->err, MC_ERR_INVALID_ARG, "mc_a2a_get_expert_load: counts is NULL");
  return a2a->ops->expert_load(a2a, counts, reset);
}

/* A pointer rule: required (unless allowed NULL) and aligned. */
static mc_result_t check_ptr(mc_a2a_t *a2a, const char *call, const char *name, const void *p,
                             int required, size_t align) {
  if (!p && required)
    return mc_fail(a2a->err, MC_ERR_INVALID_ARG, "%s: %s is NULL", call, name);
  if (p && misaligned(p, align))
    return mc_fail(a2a->err, MC_ERR_INVALID_ARG, "%s: %s=%p is not %zu-byte aligned", call, name, p, align);
  return MC_SUCCESS;
}

/* A handle that failed for good: the first failure's text stays, quoted in
 * every later refusal. */
static mc_result_t refuse_aborted(mc_a2a_t *a2a, const char *call) {
  if (!a2a->first_err[0]) memcpy(a2a->first_err, a2a->err, sizeof a2a->first_err);
  return mc_fail(a2a->err, MC_ERR_ABORTED, "%s: this handle failed earlier, destroy it; the failure: %s", call,
                 a2a->first_err);
}

static const char *next_name(mc_phase_t p) {
  static const char *what[] = {"dispatch send", "dispatch recv", "combine send", "combine recv"};
  return what[p];
}

static mc_result_t check_flags_and_state(mc_a2a_t *a2a, const char *call, unsigned flags,
                                         mc_phase_t send_phase) {
  if (a2a->aborted) return refuse_aborted(a2a, call);
  if (flags == 0 || (flags & ~(unsigned)MC_SEND_RECV))
    return mc_fail(a2a->err, MC_ERR_INVALID_ARG, "%s: flags=0x%x must be MC_SEND, MC_RECV or both",
                   call, flags);
  mc_phase_t want = (flags & MC_SEND) ? send_phase : (mc_phase_t)(send_phase + 1);
  if (a2a->next != want)
    return mc_fail(a2a->err, MC_ERR_INVALID_USAGE, "%s: called for the %s, but the next step is the %s",
                   call, next_name(want), next_name(a2a->next));
  return MC_SUCCESS;
}

/* After a transport failed: a timeout leaves peers out of step for good; a
 * round the device refused (bad input found there) is over, and the next
 * step is a new dispatch-send. */
static mc_result_t after(mc_a2a_t *a2a, mc_result_t rc) {
  if (rc == MC_ERR_TIMEOUT || rc == MC_ERR_CUDA || rc == MC_ERR_NVSHMEM || rc == MC_ERR_INTERNAL ||
      rc == MC_ERR_SYSTEM)
    a2a->aborted = 1;
  if (a2a->aborted && !a2a->first_err[0]) memcpy(a2a->first_err, a2a->err, sizeof a2a->first_err);
  if (a2a->refused || rc == MC_ERR_CAPACITY) { /* the round is over on every rank */
    a2a->refused = 0;
    a2a->next = MC_NEXT_DISPATCH_SEND;
  }
  return rc;
}

mc_result_t mc_a2a_check(mc_a2a_t *a2a) {
  NEED_LIVE_A2A(a2a, "mc_a2a_check");
  if (a2a->aborted) return refuse_aborted(a2a, "mc_a2a_check");
  return a2a->ops->check ? after(a2a, a2a->ops->check(a2a)) : MC_SUCCESS;
}

mc_result_t mc_a2a_barrier(mc_a2a_t *a2a, void *stream) {
  NEED_LIVE_A2A(a2a, "mc_a2a_barrier");
  if (a2a->aborted) return refuse_aborted(a2a, "mc_a2a_barrier");
  if (a2a->ops->barrier) return after(a2a, a2a->ops->barrier(a2a, stream));
  mc_result_t rc = mc_comm_barrier(a2a->comm);
  if (rc != MC_SUCCESS) memcpy(a2a->err, a2a->comm->err, sizeof a2a->err); /* the comm's words, on the handle */
  return after(a2a, rc);
}

/* The send half's arguments (every layout). */
static mc_result_t check_send(mc_a2a_t *a2a, const char *call, const mc_dispatch_args_t *d) {
  const mc_a2a_config_t *c = &a2a->cfg;
  const int has_scales = c->scale_bytes > 0, quant = c->dispatch_input == MC_INPUT_BF16_TO_E4M3;
  mc_result_t rc;
  if (d->m < 0 || d->m > c->max_tokens)
    return mc_fail(a2a->err, MC_ERR_INVALID_ARG, "%s: m=%d is not in 0..max_tokens=%d", call, d->m, c->max_tokens);
  const int rows = d->m > 0;
  if ((rc = check_ptr(a2a, call, "tokens", d->tokens, rows, 16)) ||
      (rc = check_ptr(a2a, call, "scales", d->scales, rows && has_scales && !quant, 4)) ||
      (rc = check_ptr(a2a, call, "indices", d->indices, rows, mc_index_size(c->index_dtype == MC_INDEX_INT64))) ||
      (rc = check_ptr(a2a, call, "weights", d->weights, 0, 4)) ||
      (rc = check_ptr(a2a, call, "bound_m", d->bound_m, 0, 4)))
    return rc;
  if (d->scales && !has_scales)
    return mc_fail(a2a->err, MC_ERR_INVALID_ARG, "%s: scales=%p given but config->scale_bytes is 0", call,
                   d->scales);
  if (d->scales && quant)
    return mc_fail(a2a->err, MC_ERR_INVALID_ARG,
                   "%s: scales=%p given, but with MC_INPUT_BF16_TO_E4M3 the send half makes the scales: pass NULL",
                   call, d->scales);
  return MC_SUCCESS;
}

/* The halves asked for, in order; the state moves on after each. */
static mc_result_t run_dispatch(mc_a2a_t *a2a, const mc_dispatch_args_t *args, unsigned int flags) {
  mc_result_t rc;
  if (flags & MC_SEND) {
    if ((rc = after(a2a, a2a->ops->dispatch_send(a2a, args))) != MC_SUCCESS) return rc;
    a2a->next = MC_NEXT_DISPATCH_RECV;
    a2a->round_m = args->m;
    a2a->declared = args->recv ? args->recv->capacity : 0;
    a2a->counted = -1;
  }
  if (flags & MC_RECV) {
    if ((rc = after(a2a, a2a->ops->dispatch_recv(a2a, args))) != MC_SUCCESS) return rc;
    a2a->next = MC_NEXT_COMBINE_SEND;
  }
  return MC_SUCCESS;
}

mc_result_t mc_dispatch(mc_a2a_t *a2a, const void *tokens, const void *scales, const void *indices,
                        const float *weights, int m, const int32_t *bound_m, void *expert_x,
                        void *expert_scale, int32_t *expert_count, unsigned int flags, void *stream) {
  NEED_LIVE_A2A(a2a, "mc_dispatch");
  const char *call = "mc_dispatch";
  mc_result_t rc = check_flags_and_state(a2a, call, flags, MC_NEXT_DISPATCH_SEND);
  if (rc != MC_SUCCESS) return rc;
  if (a2a->cfg.recv_layout != MC_LAYOUT_BATCHED)
    return mc_fail(a2a->err, MC_ERR_INVALID_USAGE,
                   "%s: the handle's config->recv_layout is %d, a packed layout: call mc_dispatch_packed", call,
                   (int)a2a->cfg.recv_layout);
  const int has_scales = a2a->cfg.scale_bytes > 0;
  mc_dispatch_args_t args = {tokens,  scales,   indices,      weights,      m,   bound_m,
                             expert_x, expert_scale, expert_count, NULL, stream};
  if ((flags & MC_SEND) && (rc = check_send(a2a, call, &args)) != MC_SUCCESS) return rc;
  if (flags & MC_RECV) {
    if ((rc = check_ptr(a2a, call, "expert_x", expert_x, 1, 16)) ||
        (rc = check_ptr(a2a, call, "expert_scale", expert_scale, has_scales, 4)) ||
        (rc = check_ptr(a2a, call, "expert_count", expert_count, 1, 4)))
      return rc;
    if (expert_scale && !has_scales)
      return mc_fail(a2a->err, MC_ERR_INVALID_ARG,
                     "%s: expert_scale=%p given but config->scale_bytes is 0", call, expert_scale);
  }
  return run_dispatch(a2a, &args, flags);
}

/* The recv half's buffers of a packed layout, against the capacity the
 * send half declared or the rows mc_dispatch_counts found. */
static mc_result_t check_packed_recv(mc_a2a_t *a2a, const char *call, const mc_packed_recv_t *r, int send_too) {
  const mc_a2a_config_t *c = &a2a->cfg;
  const int has_scales = c->scale_bytes > 0;
  mc_result_t rc;
  if (!r) return mc_fail(a2a->err, MC_ERR_INVALID_ARG, "%s: recv is NULL (the recv half writes into it)", call);
  const int any = r->capacity > 0; /* a recv half given no rows needs no row buffers */
  if ((rc = check_ptr(a2a, call, "recv->x", r->x, any, 16)) ||
      (rc = check_ptr(a2a, call, "recv->x_scale", r->x_scale, any && has_scales, 4)) ||
      (rc = check_ptr(a2a, call, "recv->row_expert", r->row_expert, any, 4)) ||
      (rc = check_ptr(a2a, call, "recv->row_weight", r->row_weight, 0, 4)) ||
      (rc = check_ptr(a2a, call, "recv->expert_count", r->expert_count, 0, 4)) ||
      (rc = check_ptr(a2a, call, "recv->expert_offset", r->expert_offset, 0, 4)) ||
      (rc = check_ptr(a2a, call, "recv->src_count", r->src_count, 0, 4)) ||
      (rc = check_ptr(a2a, call, "recv->rows", r->rows, 0, 8)))
    return rc;
  if (r->x_scale && !has_scales)
    return mc_fail(a2a->err, MC_ERR_INVALID_ARG, "%s: recv->x_scale=%p given but config->scale_bytes is 0", call,
                   r->x_scale);
  const int64_t declared = send_too ? r->capacity : a2a->declared;
  if (declared > 0) {
    if (r->capacity < declared)
      return mc_fail(a2a->err, MC_ERR_INVALID_ARG,
                     "%s: recv->capacity=%lld is less than the %lld rows the send half declared", call,
                     (long long)r->capacity, (long long)declared);
    return MC_SUCCESS;
  }
  if (send_too || a2a->counted < 0)
    return mc_fail(a2a->err, MC_ERR_INVALID_USAGE,
                   "%s: the send half declared no capacity (recv NULL or recv->capacity 0): call mc_dispatch_counts "
                   "between the halves and size the buffers from it, or declare a capacity in the send half",
                   call);
  if (r->capacity < a2a->counted)
    return mc_fail(a2a->err, MC_ERR_INVALID_ARG,
                   "%s: recv->capacity=%lld rows cannot hold the %lld rows mc_dispatch_counts found", call,
                   (long long)r->capacity, (long long)a2a->counted);
  return MC_SUCCESS;
}

mc_result_t mc_dispatch_packed(mc_a2a_t *a2a, const void *tokens, const void *scales, const void *indices,
                               const float *weights, int m, const int32_t *bound_m, const mc_packed_recv_t *recv,
                               unsigned int flags, void *stream) {
  NEED_LIVE_A2A(a2a, "mc_dispatch_packed");
  const char *call = "mc_dispatch_packed";
  mc_result_t rc = check_flags_and_state(a2a, call, flags, MC_NEXT_DISPATCH_SEND);
  if (rc != MC_SUCCESS) return rc;
  if (a2a->cfg.recv_layout == MC_LAYOUT_BATCHED)
    return mc_fail(a2a->err, MC_ERR_INVALID_USAGE,
                   "%s: the handle's config->recv_layout is MC_LAYOUT_BATCHED: call mc_dispatch", call);
  if (recv && recv->size < sizeof *recv)
    return mc_fail(a2a->err, MC_ERR_INVALID_ARG, "%s: recv->size=%zu < %zu: set it to sizeof(mc_packed_recv_t)",
                   call, recv->size, sizeof *recv);
  if (recv && recv->capacity < 0)
    return mc_fail(a2a->err, MC_ERR_INVALID_ARG, "%s: recv->capacity=%lld is negative", call,
                   (long long)recv->capacity);
  mc_dispatch_args_t args = {tokens, scales, indices, weights, m, bound_m, NULL, NULL, NULL, recv, stream};
  if ((flags & MC_SEND) && (rc = check_send(a2a, call, &args)) != MC_SUCCESS) return rc;
  if ((flags & MC_RECV) && (rc = check_packed_recv(a2a, call, recv, (flags & MC_SEND) != 0)) != MC_SUCCESS)
    return rc;
  return run_dispatch(a2a, &args, flags);
}

mc_result_t mc_dispatch_counts(mc_a2a_t *a2a, int64_t *rows, int32_t *expert_count, void *stream) {
  NEED_LIVE_A2A(a2a, "mc_dispatch_counts");
  const char *call = "mc_dispatch_counts";
  if (a2a->aborted) return refuse_aborted(a2a, call);
  if (a2a->cfg.recv_layout == MC_LAYOUT_BATCHED)
    return mc_fail(a2a->err, MC_ERR_INVALID_USAGE,
                   "%s: the handle's config->recv_layout is MC_LAYOUT_BATCHED, whose buffers are fixed "
                   "(mc_a2a_expert_capacity)",
                   call);
  if (a2a->next != MC_NEXT_DISPATCH_RECV)
    return mc_fail(a2a->err, MC_ERR_INVALID_USAGE,
                   "%s: called where the next step is the %s: call it between the send and recv halves of a "
                   "dispatch",
                   call, next_name(a2a->next));
  if (!rows) return mc_fail(a2a->err, MC_ERR_INVALID_ARG, "%s: rows is NULL", call);
  mc_result_t rc = after(a2a, a2a->ops->dispatch_counts(a2a, rows, expert_count, stream));
  if (rc == MC_SUCCESS) a2a->counted = *rows;
  return rc;
}

mc_result_t mc_combine(mc_a2a_t *a2a, const void *expert_y, void *out, unsigned int flags, void *stream) {
  NEED_LIVE_A2A(a2a, "mc_combine");
  const char *call = "mc_combine";
  mc_result_t rc = check_flags_and_state(a2a, call, flags, MC_NEXT_COMBINE_SEND);
  if (rc != MC_SUCCESS) return rc;
  if ((flags & MC_SEND) && (rc = check_ptr(a2a, call, "expert_y", expert_y, 1, 16))) return rc;
  if ((flags & MC_RECV) && (rc = check_ptr(a2a, call, "out", out, a2a->round_m > 0, 16))) return rc;
  mc_combine_args_t args = {expert_y, out, stream};
  if (flags & MC_SEND) {
    if ((rc = after(a2a, a2a->ops->combine_send(a2a, &args))) != MC_SUCCESS) return rc;
    a2a->next = MC_NEXT_COMBINE_RECV;
  }
  if (flags & MC_RECV) {
    if ((rc = after(a2a, a2a->ops->combine_recv(a2a, &args))) != MC_SUCCESS) return rc;
    a2a->next = MC_NEXT_DISPATCH_SEND;
    a2a->stats.rounds++;
  }
  return MC_SUCCESS;
}

mc_result_t mc_a2a_mask_ranks(mc_a2a_t *a2a, const uint8_t *mask) {
  NEED_LIVE_A2A(a2a, "mc_a2a_mask_ranks");
  const char *call = "mc_a2a_mask_ranks";
  const int W = a2a->comm->world_size, me = a2a->comm->rank;
  if (!mask) return mc_fail(a2a->err, MC_ERR_INVALID_ARG, "%s: mask is NULL", call);
  if (mask[me])
    return mc_fail(a2a->err, MC_ERR_INVALID_ARG,
                   "%s: mask[%d] is set on rank %d itself: the ranks a mask keeps are the ones that call it", call,
                   me, me);
  int any = 0;
  for (int r = 0; r < W; r++) any |= mask[r] != 0;
  if (any && a2a->shape.group_size != 1)
    return mc_fail(a2a->err, MC_ERR_UNSUPPORTED,
                   "%s: ranks can be masked in groups of one rank only (group_size is %d: a masked rank's share "
                   "of its group's tokens would be lost)",
                   call, a2a->shape.group_size);
  if (!a2a->ops->mask)
    return mc_fail(a2a->err, MC_ERR_UNSUPPORTED, "%s: the %s transport cannot mask ranks yet", call,
                   a2a->ops->name);
  if (!a2a->aborted && a2a->next != MC_NEXT_DISPATCH_SEND)
    return mc_fail(a2a->err, MC_ERR_INVALID_USAGE,
                   "%s: called in the middle of a round (the next step is the %s): call it at a round's end, or "
                   "after a failed call",
                   call, next_name(a2a->next));
  uint8_t *m = malloc((size_t)W);
  if (!m) return mc_fail(a2a->err, MC_ERR_SYSTEM, "out of host memory");
  for (int r = 0; r < W; r++) m[r] = mask[r] != 0;
  mc_result_t rc = a2a->ops->mask(a2a, m);
  if (rc != MC_SUCCESS) { /* a kept rank did not come: aborted, as after any timeout; all may call again */
    free(m);
    return after(a2a, rc);
  }
  memcpy(a2a->masked, m, (size_t)W);
  a2a->any_masked = any;
  free(m);
  a2a->aborted = 0;
  a2a->refused = 0;
  a2a->first_err[0] = '\0';
  a2a->next = MC_NEXT_DISPATCH_SEND;
  return MC_SUCCESS;
}

mc_result_t mc_a2a_get_mask(const mc_a2a_t *a2a, uint8_t *mask) {
  NEED_LIVE_A2A(a2a, "mc_a2a_get_mask");
  if (!mask) return mc_fail(((mc_a2a_t *)a2a)->err, MC_ERR_INVALID_ARG, "mc_a2a_get_mask: mask is NULL");
  memcpy(mask, a2a->masked, (size_t)a2a->comm->world_size);
  return MC_SUCCESS;
}

mc_result_t mc_a2a_bench_floor(mc_a2a_t *a2a, int phase, int m, unsigned int flags, void *stream) {
  NEED_LIVE_A2A(a2a, "mc_a2a_bench_floor");
  const char *call = "mc_a2a_bench_floor";
  if (phase != MC_BENCH_DISPATCH && phase != MC_BENCH_COMBINE)
    return mc_fail(a2a->err, MC_ERR_INVALID_ARG, "%s: phase=%d is not MC_BENCH_DISPATCH (0) or MC_BENCH_COMBINE (1)",
                   call, phase);
  if (flags == 0 || (flags & ~(unsigned)MC_SEND_RECV))
    return mc_fail(a2a->err, MC_ERR_INVALID_ARG, "%s: flags=0x%x must be MC_SEND, MC_RECV or both", call, flags);
  if (m < 0 || m > a2a->cfg.max_tokens)
    return mc_fail(a2a->err, MC_ERR_INVALID_ARG, "%s: m=%d is not in 0..max_tokens=%d", call, m, a2a->cfg.max_tokens);
  if (!a2a->ops->bench_floor)
    return mc_fail(a2a->err, MC_ERR_UNSUPPORTED, "%s: the %s transport launches no kernels", call, a2a->ops->name);
  return a2a->ops->bench_floor(a2a, phase == MC_BENCH_COMBINE, m, flags, stream);
}
