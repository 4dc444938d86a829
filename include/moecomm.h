/*
 * moecomm.h - Mixture-of-Experts token dispatch and combine under expert
 * parallelism. The one public header of libmoecomm.
 *
 * Model of use (every rank of the job, every MoE layer):
 *
 *   router -> indices[m][k] (int32 or int64 global expert ids), weights[m][k] (fp32)
 *   mc_dispatch(a2a, tokens, scales, indices, weights, m, ...)
 *       -> expert_x[local_expert][slot][token_bytes], expert_count[local_expert]
 *   the caller's grouped GEMM: expert_x -> expert_y[local_expert][slot][hidden]
 *   mc_combine(a2a, expert_y, out, ...)
 *       -> out[token][hidden] = sum over the token's experts of weight * y
 *
 * Conventions that hold for every call:
 * - Every call returns an mc_result_t; MC_SUCCESS is 0. mc_result_string()
 *   names a code; mc_comm_last_error() / mc_a2a_last_error() give the details
 *   of the last failure on that handle (which argument, which value, which
 *   rank); mc_last_error() gives them for calls that failed before a handle
 *   existed (the *_create functions), per thread.
 * - A call that fails with MC_ERR_INVALID_ARG or MC_ERR_INVALID_USAGE changed
 *   nothing: no byte was sent, the handle is usable as before.
 * - The library never calls exit() or abort() and never lets a C++ exception
 *   out. Every wait is bounded by the communicator's timeout.
 * - Handles are not thread-safe: one thread at a time per handle. Different
 *   handles may be used from different threads at once.
 * - Pointers passed in are borrowed for the duration of the call only, unless
 *   a comment says otherwise.
 */
#ifndef MOECOMM_H
#define MOECOMM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define MC_API
#else
#define MC_API __attribute__((visibility("default")))
#endif

/* ---- version ----------------------------------------------------------- */

#define MC_VERSION_MAJOR 0
#define MC_VERSION_MINOR 5
#define MC_VERSION_PATCH 0
/* One integer that compares in release order: 0.1.0 -> 100. */
#define MC_VERSION_CODE(major, minor, patch) ((major) * 10000 + (minor) * 100 + (patch))
#define MC_VERSION MC_VERSION_CODE(MC_VERSION_MAJOR, MC_VERSION_MINOR, MC_VERSION_PATCH)

/* The version of the library actually loaded (MC_VERSION of its build).
 * A program built against a newer header than the library it runs with can
 * compare the two. */
MC_API int mc_version(void);

/* ---- results ----------------------------------------------------------- */

typedef enum mc_result {
  MC_SUCCESS = 0,
  MC_ERR_INVALID_ARG = 1,   /* an argument broke a documented rule; nothing changed */
  MC_ERR_INVALID_USAGE = 2, /* calls out of order (combine before dispatch, recv before send), a
                               handle used after destroy, ranks of a group that disagree */
  MC_ERR_TIMEOUT = 3,       /* a peer did not arrive in time, or (cpu transport) its process is
                               gone; the text names phase and rank */
  MC_ERR_UNSUPPORTED = 4,   /* a transport or option this build or machine does not have */
  MC_ERR_SYSTEM = 5,        /* the OS refused (memory, shared memory, sockets); errno in the text */
  MC_ERR_BOOTSTRAP = 6,     /* the out-of-band exchange failed or was refused */
  MC_ERR_CUDA = 7,          /* a CUDA runtime call failed */
  MC_ERR_NVSHMEM = 8,       /* an NVSHMEM call failed */
  MC_ERR_ABORTED = 9,       /* the handle failed earlier (a timeout, a CUDA/NVSHMEM/system
                               failure, or group inputs that differ); destroy it; the text quotes
                               the first failure */
  MC_ERR_INTERNAL = 10,     /* a bug in moecomm; please report the text */
  MC_ERR_CAPACITY = 11      /* packed layouts: a rank received more rows than the capacity it declared;
                               every rank's recv half (or count step) fails the round, naming the rank,
                               its rows and its capacity; nothing was written, the handle stays usable
                               and the next step is a new dispatch */
} mc_result_t;

/* A static string naming a result code ("MC_ERR_TIMEOUT: ..."). Never NULL. */
MC_API const char *mc_result_string(mc_result_t result);

/* Details of the last failure of a *_create call made by this thread, or
 * of a call refused because its handle is not alive (thread-local; "" when
 * there was none). Valid until this thread's next moecomm call. */
MC_API const char *mc_last_error(void);

/* ---- enumerations ------------------------------------------------------ */

typedef enum mc_transport {
  MC_TRANSPORT_AUTO = 0,    /* p2p if every peer is mappable, else nvshmem; cpu without a GPU */
  MC_TRANSPORT_CPU = 1,     /* host threads or processes over shared memory */
  MC_TRANSPORT_NVSHMEM = 2, /* GPU kernels over NVSHMEM (NVLink, IB, EFA) */
  MC_TRANSPORT_P2P = 3      /* GPU kernels over peer-mapped memory (one NVLink domain) */
} mc_transport_t;

/* A static name: "auto", "cpu", "nvshmem", "p2p" (NULL for an unknown value). */
MC_API const char *mc_transport_name(mc_transport_t transport);

typedef enum mc_dtype {
  MC_DTYPE_FP32 = 0,
  MC_DTYPE_BF16 = 1,
  MC_DTYPE_FP16 = 2
} mc_dtype_t;

/* The integer type of mc_dispatch's indices. int64 is what torch.topk
 * returns (and what vLLM, SGLang and DeepEP pass): taken as it is, no copy.
 * Every id is range-checked at its full width before it is narrowed. */
typedef enum mc_index_dtype {
  MC_INDEX_INT32 = 0,
  MC_INDEX_INT64 = 1
} mc_index_dtype_t;

/* What mc_dispatch's tokens are. MC_INPUT_BYTES: opaque payload, sent as
 * it is (token_bytes a token, with scale_bytes of scales beside it).
 * MC_INPUT_BF16_TO_E4M3: bf16 activations, hidden values a token, which the
 * send half quantises to fp8 e4m3 in blocks of 128 values with one scale a
 * block (config->scale_format), so that no separate quantisation kernel runs;
 * expert_x then holds the e4m3 bytes and expert_scale the scales. The rules
 * (rounding, saturation at 448, NaN) are in docs/api.md; every transport
 * makes the same bytes. */
typedef enum mc_dispatch_input {
  MC_INPUT_BYTES = 0,
  MC_INPUT_BF16_TO_E4M3 = 1
} mc_dispatch_input_t;

/* The per-block scale of MC_INPUT_BF16_TO_E4M3: an fp32 (4 bytes), or a
 * power of two stored as its biased exponent byte ("UE8M0", 1 byte: what
 * block-scaled fp8 matrix multiplies on Blackwell read). */
typedef enum mc_scale_format {
  MC_SCALE_FP32 = 0,
  MC_SCALE_UE8M0 = 1
} mc_scale_format_t;

/* How the recv half of dispatch lays out what arrives (config->recv_layout).
 * MC_LAYOUT_BATCHED: mc_dispatch's expert_x, [local expert][capacity]: every
 *   expert sized for the worst case (each could receive every token of
 *   every group); fixed shapes, what decode and CUDA graphs need.
 * MC_LAYOUT_PACKED: mc_dispatch_packed, one row per (token, rank) that
 *   arrived, with the row's local experts and weights; the caller's experts
 *   return one row per received row, already weighted and summed over the
 *   rank's experts (combine sends it as it is). Sized by what arrives: for
 *   large batches (prefill).
 * MC_LAYOUT_EXPERT_SORTED: mc_dispatch_packed, one row per (token, local
 *   expert), expert after expert, each expert's rows from a multiple of
 *   config->expert_align: what grouped GEMMs over contiguous segments take;
 *   combine weights and sums the rows as in the batched layout. */
typedef enum mc_recv_layout {
  MC_LAYOUT_BATCHED = 0,
  MC_LAYOUT_PACKED = 1,
  MC_LAYOUT_EXPERT_SORTED = 2
} mc_recv_layout_t;

/* Size in bytes of one element (4, 2, 2); 0 for an unknown value. */
MC_API size_t mc_dtype_size(mc_dtype_t dtype);

/* Flags of mc_dispatch / mc_combine: which half to run. */
#define MC_SEND 1u
#define MC_RECV 2u
#define MC_SEND_RECV (MC_SEND | MC_RECV)

/* ---- out-of-band bootstrap --------------------------------------------- */

/* Gather `bytes` bytes from every rank into `recv` (world_size * bytes,
 * rank order), collectively across the job. Return 0 on success, non-zero on
 * failure. It must itself be bounded in time. torch.distributed's
 * all_gather_into_tensor over a CPU group, MPI_Allgather, or the helpers
 * below can serve. */
typedef int (*mc_allgather_fn)(const void *send, void *recv, size_t bytes, void *user);

typedef struct mc_oob {
  mc_allgather_fn allgather;
  void *user; /* passed back to allgather untouched */
  int rank;
  int world_size;
} mc_oob_t;

/* -- helper 1: ranks as threads of one process. --
 * Create one object for the whole job, give each thread its rank's oob with
 * mc_oob_threads_get, destroy it after every communicator built from it has
 * been destroyed. A thread that does not arrive within timeout_ms makes the
 * others' allgather fail instead of hanging, naming the ranks that did not
 * come. */
typedef struct mc_oob_threads mc_oob_threads_t;
MC_API mc_result_t mc_oob_threads_create(int world_size, int timeout_ms, mc_oob_threads_t **out);
MC_API mc_result_t mc_oob_threads_get(mc_oob_threads_t *group, int rank, mc_oob_t *out);
MC_API void mc_oob_threads_destroy(mc_oob_threads_t *group);

/* -- helper 2: processes on one host, through a unique id. --
 * Rank 0 calls mc_unique_id_create(), which opens a listening TCP socket
 * (loopback unless MC_BOOTSTRAP_ADDR names another IPv4 address) and draws a
 * random 128-bit secret; the id carries both. Rank 0 hands the id to the
 * other processes by any means (file, pipe, its own launcher); every process,
 * rank 0 included, then calls mc_oob_socket_create with it. The secret never
 * goes over the socket: rank 0 and each joining rank prove to each other that
 * they hold it (HMAC-SHA256 challenge-response), so a joining rank fails,
 * revealing nothing, if another process holds rank 0's port (rank 0 exited).
 * On loopback both ends must also belong to one user. Connections that fail
 * the proof, name a bad rank, or announce messages larger than the agreed
 * size are refused; idle ones cannot keep the group from forming. Every wait
 * is bounded by timeout_ms. A failed allgather names on every rank the rank
 * at fault (whose connection closed, that left, was late, or sent something
 * else), as rank 0 saw it; destroy tells the others that this rank left.
 * Across hosts (MC_BOOTSTRAP_ADDR) the allgather
 * traffic after the handshake is neither encrypted nor authenticated: use a
 * trusted network, or your own mc_oob_t. */
#define MC_UNIQUE_ID_BYTES 128
typedef struct mc_unique_id {
  char internal[MC_UNIQUE_ID_BYTES];
} mc_unique_id_t;

MC_API mc_result_t mc_unique_id_create(mc_unique_id_t *out);
typedef struct mc_oob_socket mc_oob_socket_t;
MC_API mc_result_t mc_oob_socket_create(const mc_unique_id_t *id, int rank, int world_size,
                                        int timeout_ms, mc_oob_socket_t **out);
MC_API mc_result_t mc_oob_socket_get(mc_oob_socket_t *sock, mc_oob_t *out);
MC_API void mc_oob_socket_destroy(mc_oob_socket_t *sock);

/* ---- communicator ------------------------------------------------------ */

typedef struct mc_comm mc_comm_t;

/* Versioned configuration: always start from MC_COMM_CONFIG_INITIALIZER so
 * fields added later get their defaults and `size` tells the library which
 * version of the struct the caller was built with. */
typedef struct mc_comm_config {
  size_t size;              /* sizeof(mc_comm_config_t), set by the initializer */
  unsigned int version;     /* MC_VERSION, set by the initializer */
  int group_size;           /* ranks that hold the same tokens; divides world_size. Default 1 */
  mc_transport_t transport; /* default MC_TRANSPORT_AUTO */
  int timeout_ms;           /* bound of every wait, ms, at most 86400000 (a day); 0: MC_TIMEOUT_MS from the
                               environment, else 10000 */
  int device;               /* CUDA device of this rank for GPU transports; -1: current */
} mc_comm_config_t;

#define MC_COMM_CONFIG_INITIALIZER \
  { sizeof(mc_comm_config_t), MC_VERSION, 1, MC_TRANSPORT_AUTO, 0, -1 }

/* Collective over the oob: every rank calls it with the same group_size and
 * transport. Picks the transport (AUTO: the best this build and machine
 * offer: with a GPU, p2p when every rank can map every peer's memory (one
 * host), else nvshmem; without, cpu; mc_comm_transport() says which). The
 * comm keeps a copy of *oob and uses its allgather here and in
 * mc_a2a_create; the oob must stay alive until mc_comm_destroy returns. A
 * rank whose config breaks a rule still takes part in the exchange (given
 * a usable oob), so its peers fail at once naming it, and every rank's
 * retry meets the others' retry. On failure *out is NULL and
 * mc_last_error() has the details: where the allgather failed, what the
 * built-in helper saw (the rank at fault), or that your allgather returned
 * non-zero (the library cannot know which rank failed there). */
MC_API mc_result_t mc_comm_create(const mc_oob_t *oob, const mc_comm_config_t *config,
                                  mc_comm_t **out);

/* Releases the communicator. Every a2a handle made from it must have been
 * destroyed first (MC_ERR_INVALID_USAGE otherwise, and nothing is freed).
 * NULL is accepted. Local only: it does not wait for peers. Destroying it
 * twice, or any call on it afterwards, returns MC_ERR_INVALID_USAGE (the
 * getters -1) rather than touching freed memory; that holds as long as no
 * later communicator happens to get the same address, which stays
 * undefined. */
MC_API mc_result_t mc_comm_destroy(mc_comm_t *comm);

/* What the communicator was built with (-1, or MC_TRANSPORT_AUTO, for NULL);
 * mc_comm_transport() is the transport actually chosen. */
MC_API int mc_comm_rank(const mc_comm_t *comm);
MC_API int mc_comm_world_size(const mc_comm_t *comm);
MC_API int mc_comm_group_size(const mc_comm_t *comm);
MC_API mc_transport_t mc_comm_transport(const mc_comm_t *comm);
/* Details of the last failure on this communicator ("" if none). */
MC_API const char *mc_comm_last_error(const mc_comm_t *comm);

/* ---- all-to-all handle ------------------------------------------------- */

typedef struct mc_a2a mc_a2a_t;

typedef struct mc_a2a_config {
  size_t size;                /* sizeof(mc_a2a_config_t), set by the initializer */
  unsigned int version;       /* MC_VERSION, set by the initializer */
  int max_tokens;             /* most tokens one group feeds into one call (>= 1) */
  int num_experts;            /* global experts; divisible by world_size */
  int experts_per_token;      /* top-k, 1..MC_MAX_TOPK */
  size_t token_bytes;         /* payload bytes per token (in expert_x); multiple of 16;
                                 hidden when dispatch quantises */
  size_t scale_bytes;         /* scale bytes per token; multiple of 4; 0 = no scales;
                                 hidden / 128 x 4 (fp32) or x 1 (UE8M0) when quantising */
  int hidden;                 /* combine row length in elements; multiple of 8 */
  mc_dtype_t combine_in_dtype;  /* dtype of expert_y, and of rows on the wire */
  mc_dtype_t combine_out_dtype; /* dtype of out */
  mc_index_dtype_t index_dtype; /* dtype of mc_dispatch's indices (default int32) */
  mc_dispatch_input_t dispatch_input; /* what the tokens are (default opaque bytes) */
  mc_scale_format_t scale_format;     /* MC_INPUT_BF16_TO_E4M3's scales (default fp32) */
  mc_recv_layout_t recv_layout;       /* default MC_LAYOUT_BATCHED */
  int expert_align;           /* MC_LAYOUT_EXPERT_SORTED: each local expert's rows start at a multiple
                                 of it, 1..1024 (default 1); 1 for the other layouts */
} mc_a2a_config_t;

#define MC_MAX_TOPK 16

#define MC_A2A_CONFIG_INITIALIZER \
  { sizeof(mc_a2a_config_t), MC_VERSION, 0, 0, 0, 0, 0, 0, MC_DTYPE_BF16, MC_DTYPE_BF16, MC_INDEX_INT32, \
    MC_INPUT_BYTES, MC_SCALE_FP32, MC_LAYOUT_BATCHED, 1 }

/* Collective over the communicator: every rank passes the same config (a
 * rank that differs makes every rank fail, naming the field and both
 * values; a rank whose config breaks a rule still takes part, so its peers
 * fail at once naming it, and every rank's retry meets the others' retry).
 * Allocates the receive buffers (see mc_a2a_stats_t.buffer_bytes)
 * and exchanges their addresses; on the cpu transport every page of shared
 * memory is reserved here, so too little memory is MC_ERR_SYSTEM now, never
 * a crash later. On failure *out is NULL and mc_last_error() and
 * mc_comm_last_error() have the details. */
MC_API mc_result_t mc_a2a_create(mc_comm_t *comm, const mc_a2a_config_t *config, mc_a2a_t **out);

/* Releases the buffers. On the cpu transport it is local and may come at
 * any time: a window that a peer thread of this process may still write
 * into stays mapped until that peer destroys its handle too, and peers in
 * other processes hold their own mappings. On nvshmem it is collective
 * (NVSHMEM frees symmetric memory collectively); on p2p too (a window is
 * freed once every rank reached destroy, since peers store into it). After
 * a timeout nothing collective is attempted (a dead peer would make it wait
 * forever): p2p keeps this rank's window, nvshmem keeps its symmetric
 * window and then skips nvshmem_finalize in mc_comm_destroy; these are
 * leaks on a failure path, reclaimed at process exit. NULL is accepted;
 * destroying twice, or any call on the handle afterwards, returns
 * MC_ERR_INVALID_USAGE (as for communicators). */
MC_API mc_result_t mc_a2a_destroy(mc_a2a_t *a2a);

/* Slots per local expert that the caller must provide in expert_x,
 * expert_scale and expert_y: num_groups * max_tokens (a local expert can
 * receive every token of every group). mc_a2a_num_local_experts:
 * num_experts / world_size, the first dimension of those buffers; rank r
 * holds experts r * num_local_experts ... (r + 1) * num_local_experts - 1.
 * Both -1 for NULL. */
MC_API int mc_a2a_expert_capacity(const mc_a2a_t *a2a);
MC_API int mc_a2a_num_local_experts(const mc_a2a_t *a2a);

/* Details of the last failure on this handle ("" if none). */
MC_API const char *mc_a2a_last_error(const mc_a2a_t *a2a);

/* Dispatch: send each token once to every rank that holds one of its top-k
 * experts; receive this rank's tokens into the batched layout.
 *
 * Send half (flags & MC_SEND) reads:
 *   tokens   [m][token_bytes]          16-byte aligned (MC_INPUT_BF16_TO_E4M3: [m][hidden]
 *                                      bf16, quantised on the way: see mc_dispatch_input_t)
 *   scales   [m][scale_bytes]          4-byte aligned; NULL iff scale_bytes == 0, and NULL
 *                                      when dispatch quantises (it makes the scales)
 *   indices  [m][experts_per_token]    global expert ids, distinct per token; int32
 *                                      or int64 (config->index_dtype), aligned to it
 *   weights  [m][experts_per_token]    fp32 router weights; NULL means all 1.0.
 *                                      They travel with the token so that combine
 *                                      can reduce a token's experts where they live.
 *   m        rows present, 0..max_tokens
 *   bound_m  optional: number of valid rows, *bound_m <= m, read at call time
 *            (device memory on GPU transports, host memory on cpu). Rows past it
 *            are ignored.
 * Every rank of a group passes the same tokens, indices, weights and m; each
 * sends a share of them. Every transport compares a digest of m, indices
 * and weights across a group's ranks and fails every rank's recv half with
 * MC_ERR_INVALID_USAGE when they differ (the handle is then aborted; on
 * GPUs the failure is reported by the next call, or mc_a2a_check).
 *
 * Recv half (flags & MC_RECV) writes:
 *   expert_x     [num_local_experts][capacity][token_bytes]  16-byte aligned
 *   expert_scale [num_local_experts][capacity][scale_bytes]  NULL iff scale_bytes == 0
 *   expert_count [num_local_experts] int32: valid slots per local expert.
 * Slots of an expert are ordered by (source group, token index): the result
 * is the same bytes for the same inputs, every time.
 * Slots past expert_count are not written.
 *
 * When both halves are separate calls, pass the same pointers to both (each
 * half checks only what it uses). The send half never waits for a peer; the
 * recv half waits only for the tokens it needs. stream: a cudaStream_t for
 * GPU transports, ignored by cpu.
 * Returns MC_ERR_INVALID_ARG (bad argument: nothing sent), MC_ERR_INVALID_USAGE
 * (out of order), MC_ERR_TIMEOUT (a peer's tokens did not arrive; the handle is
 * then aborted), MC_ERR_ABORTED (an earlier failure). */
MC_API mc_result_t mc_dispatch(mc_a2a_t *a2a, const void *tokens, const void *scales,
                               const void *indices, const float *weights, int m,
                               const int32_t *bound_m, void *expert_x, void *expert_scale,
                               int32_t *expert_count, unsigned int flags, void *stream);

/* Dispatch into a packed layout (config->recv_layout MC_LAYOUT_PACKED or
 * MC_LAYOUT_EXPERT_SORTED); the send half reads what mc_dispatch's does.
 * Rows arrive ordered by (source group, token index), as mc_dispatch's
 * slots; the same bytes for the same inputs, every time.
 *
 * The recv half writes into *recv (device memory on GPU transports, host
 * memory on cpu; "rows" is this rank's count of rows, see below):
 *   x            [rows][token_bytes]  16-byte aligned (not written on padding rows)
 *   x_scale      [rows][scale_bytes]  NULL iff scale_bytes == 0 (as x)
 *   row_expert   packed: [rows][topk] int32, the row's local experts
 *                (ascending), then -1; sorted: [rows], the row's local
 *                expert, -1 on padding rows
 *   row_weight   optional, beside row_expert: the router weights (0 where -1)
 *   expert_count optional, [num_local_experts]: (token, expert) pairs
 *   expert_offset optional, [num_local_experts + 1]: sorted: where each
 *                expert's rows start (multiples of expert_align), then the
 *                rows; packed: the prefix sums of expert_count
 *   src_count    optional, [world_size]: rows (expert-sorted: pairs) from each
 *                source rank
 *   rows         optional, [1] int64: the rows written
 * Rows, padding included: packed, one per (token, rank) received; sorted,
 * each local expert's pairs rounded up to expert_align. Nothing past them is
 * written. x, x_scale and row_expert may be NULL where recv->capacity is 0.
 *
 * Capacity: how the recv buffers are sized, one of two ways per call.
 * - Declared: the send half's recv->capacity > 0, the rows this rank's
 *   buffers will hold, travels with the metas, so that every rank knows every
 *   rank's rows and capacity. A round where any rank's rows exceed its
 *   capacity fails on every rank's recv half with MC_ERR_CAPACITY naming that
 *   rank (the round is dropped: its records are consumed unread, combine is
 *   not called, dispatch is next; on GPUs the failure is reported by a later
 *   call or mc_a2a_check, and a dispatch queued before that report is
 *   refused on the device too). The recv half's capacity must be at least
 *   the declared one.
 * - Counted: the send half's recv is NULL or its capacity 0; then call
 *   mc_dispatch_counts after the send half and before the recv half, and
 *   size the buffers from it.
 * A recv half given fewer rows than the send half declared, or than
 * mc_dispatch_counts counted, fails with MC_ERR_INVALID_ARG and changes
 * nothing: call it again with at least that many.
 * Returns as mc_dispatch, and MC_ERR_CAPACITY. */
typedef struct mc_packed_recv {
  size_t size;            /* sizeof(mc_packed_recv_t) */
  int64_t capacity;       /* rows that x, x_scale, row_expert and row_weight hold */
  void *x;
  void *x_scale;
  int32_t *row_expert;
  float *row_weight;
  int32_t *expert_count;
  int32_t *expert_offset;
  int32_t *src_count;
  int64_t *rows;
} mc_packed_recv_t;

MC_API mc_result_t mc_dispatch_packed(mc_a2a_t *a2a, const void *tokens, const void *scales,
                                      const void *indices, const float *weights, int m,
                                      const int32_t *bound_m, const mc_packed_recv_t *recv,
                                      unsigned int flags, void *stream);

/* The count step of the packed layouts: between the send half and the recv
 * half of a dispatch, wait for every rank's counts for this rank (sent by
 * their send halves) and write to host memory the rows the recv half will
 * write, and (optional, [num_local_experts]) each local expert's rows: its
 * (token, expert) pairs rounded up to expert_align (what its segment of the
 * expert-sorted layout holds; the pairs themselves for the other layouts,
 * whose expert_align is 1). Synchronises the stream; not for CUDA graphs. May be
 * called more than once. A round in which a rank exceeds the capacity it
 * declared is dropped here already: MC_ERR_CAPACITY, as from the recv
 * halves of the ranks that declared one; dispatch is next, the recv half
 * is not called. Returns as mc_dispatch, and MC_ERR_CAPACITY. */
MC_API mc_result_t mc_dispatch_counts(mc_a2a_t *a2a, int64_t *rows, int32_t *expert_count, void *stream);

/* Combine: send each expert's outputs back, summed with the router weights.
 *
 * Send half reads expert_y [num_local_experts][capacity][hidden] in
 * combine_in_dtype (16-byte aligned), only the slots that the matching
 * dispatch filled; in the packed layouts [rows][hidden], one row per row of
 * the matching dispatch (padding rows not read): MC_LAYOUT_PACKED sends
 * each row as it is (the caller weighted and summed the row's experts);
 * MC_LAYOUT_EXPERT_SORTED reduces them as below. For each (token, rank holding its experts) it sends one
 * row: the fp32 sum, over that rank's experts of the token in ascending
 * order, of weight * y, rounded to combine_in_dtype, to every rank of the
 * token's group.
 * Recv half writes out [m][hidden] in combine_out_dtype (16-byte aligned)
 * for the rows 0..bound_m-1 of the matching dispatch: the fp32 sum of the
 * received rows in ascending source-rank order, rounded once. Rows past
 * bound_m are not written. Every rank of a group gets every row.
 * The recv half also completes the round: when it returns, every rank has
 * finished reading this round's dispatch buffers, so the next dispatch may
 * start.
 * Returns as mc_dispatch. */
MC_API mc_result_t mc_combine(mc_a2a_t *a2a, const void *expert_y, void *out, unsigned int flags,
                              void *stream);

/* Report a failure that a GPU transport's kernels recorded since the last
 * call (a peer that did not arrive: MC_ERR_TIMEOUT; input refused on the
 * device: MC_ERR_INVALID_ARG, and the round is over; of several refused
 * calls the first, while the calls queued behind it ran as usual), without
 * launching or waiting for anything. Kernels run asynchronously, so such a failure is
 * otherwise reported by the next call on the handle; call this after
 * synchronising the stream to learn it at once. MC_SUCCESS when nothing
 * failed (always, on the cpu transport, whose calls report synchronously). */
MC_API mc_result_t mc_a2a_check(mc_a2a_t *a2a);

/* What the handle moved and holds, counted by the library itself. */
typedef struct mc_a2a_stats {
  size_t size;                    /* sizeof(mc_a2a_stats_t): set it before the call */
  uint64_t rounds;                /* completed dispatch+combine rounds */
  uint64_t dispatch_records_sent; /* one per (token, destination rank), this rank, all rounds */
  uint64_t dispatch_bytes_sent;   /* bytes of those records incl. headers and meta */
  uint64_t combine_rows_sent;     /* one per (token, expert rank, rank of the group) */
  uint64_t combine_bytes_sent;
  uint64_t buffer_bytes;          /* receive buffers + signals this rank allocated */
} mc_a2a_stats_t;

/* Counters kept on a device are copied back first, as the halves that have
 * finished left them: synchronise the stream of the halves to be counted
 * first. Not for the hot path (it creates and synchronises a stream). */
MC_API mc_result_t mc_a2a_get_stats(const mc_a2a_t *a2a, mc_a2a_stats_t *stats);

/* Tokens this rank received per local expert, summed over every dispatch
 * since the handle was created or last reset: counts[l] for local expert l
 * (global id rank * L + l; L = mc_a2a_num_local_experts), the sums of
 * expert_count over those rounds. For expert-placement balancers. Kept
 * where dispatch runs (on the device for GPU transports, so rounds replayed
 * from a captured CUDA graph count too) and copied out here: synchronise the
 * stream of the dispatches to be counted first. reset != 0 starts the sums
 * again from zero after the copy. A refused round counts nothing. Not for
 * the hot path (on a GPU: a copy and a stream synchronisation). */
MC_API mc_result_t mc_a2a_get_expert_load(mc_a2a_t *a2a, int64_t *counts, int reset);

/* Masked ranks: going on without a rank that died. mask[r] != 0 leaves rank
 * r out of every later round: nothing is sent to it or awaited from it, and
 * tokens routed to its experts lose those experts (combine sums the rows of
 * the others; a token whose experts are all on masked ranks combines to
 * zeros). Every rank the new mask keeps calls it with the same mask, at a
 * round's end or after a failed call aborted the handle (the usual case: a
 * timeout named the rank); the call waits for those ranks (at most twice
 * the comm's timeout), settles with them which round comes next, and leaves
 * the handle working. An all-zero mask clears it: a rank that was masked
 * while alive takes part again once it calls too. A masked rank's process,
 * if it still runs, must not use the handle until it is unmasked.
 * Groups of one rank only (config group_size 1). Every transport; on a GPU
 * it synchronises the device first, and a CUDA graph captured before the
 * mask changed must be captured again. Not for the hot path. */
MC_API mc_result_t mc_a2a_mask_ranks(mc_a2a_t *a2a, const uint8_t *mask);
/* The mask in force: mask[r] = 1 where rank r is left out (world_size bytes). */
MC_API mc_result_t mc_a2a_get_mask(const mc_a2a_t *a2a, uint8_t *mask);

/* Benchmark support (dense baselines, lining ranks up, the launch floor):
 * moecomm_bench.h. */

#ifdef __cplusplus
}
#endif

#endif /* MOECOMM_H */
