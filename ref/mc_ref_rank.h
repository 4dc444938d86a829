/* mc_ref_rank.h - what the parts of the multi-rank harness share (private to
 * ref/): a rank's host buffers, its device mirrors, the checks against
 * the reference model, the bad-call injection, the CUDA-graph mode. */
#ifndef MC_REF_RANK_H
#define MC_REF_RANK_H

#include <stdint.h>

#include "mc_ref_run.h"
#include "moecomm_bench.h"

#define POISON_X 0xA5
#define POISON_OUT 0xFF /* all-ones: a NaN in every dtype */
/* Slots past each expert's count that a checked round poisons and checks:
 * a write past the end lands there first. The rest of a buffer is never
 * touched, so the caller's buffers cost only the pages a round writes. */
#define POISON_BAND 4
/* Rows of out the combine check computes the reference for at a time */
#define CHECK_ROWS 64

typedef struct bufs {
  uint8_t *x, *xs, *y, *out; /* the caller's buffers, at the API's sizes */
  int32_t *count, *ref_count, *src_g, *src_t; /* ref_*, src_*: the reference dispatch of the round */
  uint8_t *ref_out;          /* [CHECK_ROWS] rows: the reference combine of a block of rows */
  double *ideal, *absum;     /* [CHECK_ROWS][hidden] */
  mc_input_t *ins;
  /* the packed layouts (mc_ref_packed.c): the recv half's buffers, rows of
   * them (prow_max: every round fits), and the rows given to combine */
  int64_t prow_max, prows;
  uint8_t *px, *pxs, *py;
  int32_t *pre, *pcnt, *poff, *psrc;
  float *prw;
  /* the reference's verdict and counts of the round, drawn before the
   * round starts (mc_rr_packed_expect): the lowest declaring rank over its
   * capacity (-1: none) and its rows; this rank's rows and each local
   * expert's rows (its pairs rounded up to expert_align) */
  int pover;
  int64_t pover_rows, pwant;
  int32_t *pwant_cnt;
} bufs_t;

/* A rank's buffers as the library sees them: host memory for the cpu
 * transport (then they are the check buffers themselves), device memory
 * for a GPU transport. */
typedef struct dbufs {
  int gpu;
  int ids64;     /* the handle takes int64 ids: wide holds this round's as int64 (host) */
  int64_t *wide; /* [max_tokens][topk] */
  void *tokens, *scales, *indices, *weights, *bound, *x, *xs, *count, *y, *out, *scratch;
  void *qx, *qxs; /* quantising cases: the e4m3 rows and scales of a quantisation apart from dispatch */
  /* the packed layouts: what the library writes and reads in place of x, xs, count and y (bufs_t's
   * px ... prows where the transport is the cpu one) */
  void *px, *pxs, *py, *pre, *prw, *pcnt, *poff, *psrc, *prows;
} dbufs_t;

/* Put this round's inputs where the library reads them; returns the
 * pointers to pass (host inputs themselves on the cpu transport). */
typedef struct call_in {
  const void *tokens, *scales;
  const void *indices; /* int32, or int64 where the handle takes them */
  const float *weights;
  const int32_t *bound;
} call_in_t;

/* Record the first failure of a rank (later ones are dropped). */
void mc_rr_fail(mc_run_rank_t *me, int api_rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* mc_ref_bufs.c: a rank's memory */
int mc_rr_alloc_bufs(const mc_case_t *c, bufs_t *b);
void mc_rr_free_bufs(bufs_t *b, int groups);
int mc_rr_alloc_dbufs(const mc_case_t *c, int gpu, int ids64, bufs_t *b, dbufs_t *d);
void mc_rr_free_dbufs(dbufs_t *d, const bufs_t *b);
int mc_rr_upload_inputs(const mc_case_t *c, const mc_input_t *in, dbufs_t *d, call_in_t *ci);
void mc_rr_run_experts(const mc_case_t *c, bufs_t *b, int rank);
int mc_rr_experts_roundtrip(const mc_case_t *c, bufs_t *b, dbufs_t *d, int rank);
int mc_rr_poison_outputs(const mc_case_t *c, bufs_t *b, dbufs_t *d, int rank);
int mc_rr_get_dispatch_outputs(const mc_case_t *c, bufs_t *b, const dbufs_t *d);
uint64_t mc_rr_resident_bytes(const mc_case_t *c, const bufs_t *b);

/* mc_ref_packed.c: the packed layouts' buffers, poisoned before a round;
 * after a checked one, checked and turned into the batched layout's slots
 * (b->x, b->xs, b->count) for the batched checks; then the fake experts'
 * outputs of the received rows as the rows combine takes (b->py). 0, or -1
 * (recorded in me) */
int mc_rr_packed_alloc(const mc_case_t *c, bufs_t *b);
void mc_rr_packed_free(bufs_t *b);
int64_t mc_rr_packed_max_rows(const mc_case_t *c); /* the most rows a round can bring */
int mc_rr_packed_cols(const mc_case_t *c);         /* row_expert and row_weight entries per row */
int mc_rr_packed_poison(const mc_case_t *c, bufs_t *b, dbufs_t *d); /* 0, or -1: an upload failed */
int mc_rr_packed_get(const mc_case_t *c, bufs_t *b, const dbufs_t *d);       /* 0, or -1: a download failed */
int mc_rr_packed_unpack(const mc_case_t *c, bufs_t *b, int rank, uint64_t round, mc_run_rank_t *me);
int mc_rr_packed_rows_y(const mc_case_t *c, bufs_t *b, int rank); /* returns 0 */
/* mc_ref_packed.c: what the round's dispatch must give, from this round's
 * inputs of every group; computed before the round, so that no rank spends
 * a timed round on the reference */
void mc_rr_packed_expect(const mc_case_t *c, bufs_t *b, int rank);
/* mc_ref_packed.c: the round's dispatch in a packed layout, between marks
 * 0-3: 0 done, 1 dropped on every rank as the reference said (a declared
 * capacity exceeded), -1 failed (recorded in me) */
int mc_rr_packed_dispatch(const mc_case_t *c, mc_a2a_t *a2a, bufs_t *b, const dbufs_t *d, const call_in_t *ci, int m,
                          int one_call, int rank, uint64_t round, mc_run_rank_t *me);

/* mc_ref_check.c: outputs against the reference (dispatch: after
 * mc_rr_poison_outputs drew its reference), bad calls that must be refused */
void mc_rr_check_dispatch(const mc_case_t *c, const bufs_t *b, int rank, uint64_t round, mc_run_rank_t *me);
void mc_rr_check_combine(const mc_case_t *c, bufs_t *b, int rank, uint64_t round, mc_run_rank_t *me);
int mc_rr_inject_bad_calls(const mc_case_t *c, mc_a2a_t *a2a, const mc_input_t *in, const call_in_t *ci, bufs_t *b,
                           dbufs_t *d, int rank, uint64_t round, mc_run_rank_t *me);

/* mc_ref_run.c: every rank through the out-of-band allgather; 0 on success */
int mc_rr_oob_barrier(const mc_oob_t *oob);

/* A run (the harness's state shared by its ranks) and one rank's state in it (mc_ref_run.c's round loop). */
typedef struct run_ctx {
  const mc_case_t *c;
  const mc_run_opts_t *o;
  mc_run_result_t *res;
  int rank;
  mc_oob_t oob;
} run_ctx_t;

typedef struct rank_st {
  run_ctx_t *ctx;
  const mc_case_t *c;
  const mc_run_opts_t *o;
  mc_run_rank_t *me;
  int rank, gpu, nh;
  double *samples; /* [MC_PH_COUNT][rounds] of this rank */
  mc_comm_t *comm;
  mc_a2a_t *hs[64], *a2a; /* a2a: the handle of the current round */
  bufs_t b;
  dbufs_t d;
  uint64_t round;
  size_t obytes;
  int64_t *load; /* [2][L]: mc_a2a_get_expert_load before and after a checked round */
  mc_case_t masked_case; /* mask_stalled: the case with the stalled rank masked (c points here then) */
} rank_st_t;

/* A library call that must succeed: on failure record it and return -1
 * from the calling step. */
#define API(st, call)                                                                                                  \
  do {                                                                                                                 \
    mc_result_t rc_ = (call);                                                                                          \
    if (rc_ != MC_SUCCESS) {                                                                                           \
      mc_rr_fail((st)->me, rc_, "round %llu rank %d: %s -> %s: %s", (unsigned long long)(st)->round, (st)->rank,       \
                 #call, mc_result_string(rc_),                                                                         \
                 (st)->a2a    ? mc_a2a_last_error((st)->a2a)                                                           \
                 : (st)->comm ? mc_comm_last_error((st)->comm)                                                         \
                              : mc_last_error());                                                                      \
      return -1;                                                                                                       \
    }                                                                                                                  \
  } while (0)

/* mc_ref_run.c: the host barrier, then (GPU) the ranks' streams lined up
 * with mc_a2a_barrier, as before every timed round. 0, or -1 (recorded). */
int mc_rr_round_barrier(rank_st_t *st);

/* mc_ref_bench.c: the four phase samples of round r from the marks (whole:
 * marks 0-3 and 4-7 only, the spans go to the send slots, 0 to the recv);
 * --floor, eager, the phases' empty kernels for calls of m tokens (0, or -1
 * recorded); the dense all-to-all baselines of the same payload. */
void mc_rr_store_samples(double *samples, int nsamples, int r, int gpu, int whole);
int mc_rr_floor(rank_st_t *st, int m);
void mc_rr_baselines(rank_st_t *st);

/* mc_ref_graph.c: the timed CUDA-graph mode: one round (mc_a2a_barrier, then
 * the four halves, each between two marks) captured once, replayed after a
 * host barrier `warmup` + nsamples times; samples as the eager loop's.
 * floor: the phases' empty kernels (mc_a2a_bench_floor) in place of the halves. */
void mc_rr_time_graph(const mc_run_opts_t *o, int rank, mc_a2a_t *a2a, dbufs_t *d, const call_in_t *ci, int m,
                      const mc_oob_t *oob, int floor, double *samples, int nsamples, mc_run_rank_t *me);

/* mc_ref_graph.c: a layer captured once as a CUDA graph, replayed every round */
void mc_rr_run_graph_rounds(const mc_case_t *c, const mc_run_opts_t *o, int rank, mc_a2a_t *a2a, bufs_t *b, dbufs_t *d,
                            mc_run_rank_t *me);

#endif
