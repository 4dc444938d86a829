/* mc_ref_run.h - runs a case on the library with every rank as a thread
 * (or a forked process), round after round, and checks each rank's outputs
 * against the reference model. Tests and mc-bench both drive it. */
#ifndef MC_REF_RUN_H
#define MC_REF_RUN_H

#include "mc_ref.h"

enum { MC_PH_DISPATCH_SEND, MC_PH_DISPATCH_RECV, MC_PH_COMBINE_SEND, MC_PH_COMBINE_RECV, MC_PH_COUNT };

typedef struct mc_run_opts {
  int rounds;        /* rounds checked and timed (default 1) */
  int warmup;        /* extra rounds before, not timed */
  int processes;     /* 0: ranks are threads; 1: forked processes, socket bootstrap */
  int split;         /* 1: send and recv halves as separate calls, other work between */
  int handles;       /* a2a handles alive at once; rounds rotate through them (default 1) */
  int timeout_ms;    /* the communicator's timeout (default 10000) */
  int check;         /* 1: compare with the reference every round */
  int barrier;       /* 1: an out-of-band barrier before each round, then mc_a2a_barrier on a GPU (timing) */
  int stall_rank;    /* -1: none; else this rank stops before dispatch of stall_round */
  int stall_round;   /*   (thread: goes silent; process: dies with SIGKILL) */
  mc_transport_t transport;
  int inject_bad;    /* 1: before each round, make bad calls that must fail and change nothing */
  int check_first;   /* > 0: check only the first N rounds and one extra round after the timed
                        ones (0: every round) */
  int graph;         /* GPU: capture dispatch -> identity experts -> combine once, replay every round
                        (needs case.expert_identity and fixed_m) */
  int whole;         /* 1: each phase as one call (MC_SEND_RECV; GPU timing: no marks between a send
                        and its recv, the send sample holds the whole phase, the recv sample 0);
                        2: one call every other round, the halves in the others (tests) */
  int split_hosts;   /* processes: odd ranks claim another host (mc_testing_set_host), as on two nodes */
  int graph_timed;   /* GPU timing: warm-up rounds eager (and checked), then the timed rounds as replays
                        of one captured round: mc_a2a_barrier, the four halves, a mark around each */
  size_t dense_bytes; /* > 0: after the rounds, time the transport's dense all-to-all of this many
                         bytes per peer, `rounds` samples (the baseline) */
  /* optional second dense baseline with the same bytes (mc-bench: NCCL), run
   * in every rank after the first; 0 on success */
  int (*extra_baseline)(const mc_oob_t *oob, size_t bytes_per_peer, int warmup, int iters, float *times_us);
  int auto_transport; /* 1: the communicator asks for MC_TRANSPORT_AUTO; buffers are placed as for
                         `transport` (say which kind auto should pick); ranks[r].transport says what it did */
  int floor;          /* GPU timing: after the rounds, `rounds` more of the launch floor: each phase's empty
                         sending and receiving kernels (mc_a2a_bench_floor) in place of its calls, timed as
                         the rounds are (eager or graph, whole or halves; floor_us) */
  int ids64;          /* 1: the handles take int64 top-k ids (MC_INDEX_INT64), the inputs widened */
  int quant_apart;    /* quantising cases: a step of its own (mc_dev_quantise) quantises the rows before
                         a dispatch of e4m3 bytes, timed with it: the way quantising in dispatch saves */
  int mask_stalled;   /* the round the stalled rank breaks (a timeout on the others) ends there: the others
                         mask it (mc_a2a_mask_ranks) and go on, checked against the reference without it */
  int stall_in_combine; /* 1: the stalled rank stops after dispatch of stall_round, before its combine */
  int differ_round;   /* > 0: in this round the last rank of each group passes one weight changed
                         (its group's inputs differ: every rank must fail the round, naming them) */
  int graph_refused;  /* graph mode: before each round's replay, a replay the device refuses (*bound_m past m),
                         not looked at before the good one, which must run as usual; the check after it
                         must report the refusal, and a second check nothing */
} mc_run_opts_t;

#define MC_RUN_OPTS_DEFAULT {1, 0, 0, 0, 1, 10000, 1, 0, -1, 0, MC_TRANSPORT_CPU, 0, 0, 0, 0, 0, 0, 0, NULL, 0, 0, 0, 0, 0, 0, 0, 0}

typedef struct mc_run_rank {
  int failed;             /* a check or a call failed */
  int api_rc;             /* mc_result_t of the failing call, 0 if a check failed */
  char msg[768];          /* the first failure */
  mc_a2a_stats_t stats;   /* of the first handle, at the end */
  uint64_t expected_records; /* one per (token, destination rank), from the reference */
  uint64_t masked_after;     /* mask_stalled: the round after which this rank masked the stalled one (0: never) */
  double max_err;         /* max |out - ideal| / (sum |w y| + 1e-6) seen */
  double wall_s;          /* the whole run on this rank */
  int rc_after_timeout;   /* what the next call returned after a timeout */
  int transport;          /* mc_comm_transport() of this rank's communicator (-1: none made) */
  uint64_t touched_bytes; /* host pages of expert_x, expert_scale and expert_y in memory at the end */
  int signal;             /* processes: the signal that ended this rank's process (0: none) */
  int64_t recv_rows_max;  /* packed layouts: the most rows one round brought this rank */
  int64_t recv_capacity_max; /* packed layouts: the most rows a recv half's buffers were given for */
  uint64_t dropped;       /* packed layouts: rounds that exceeded a declared capacity (MC_ERR_CAPACITY, as
                             the reference said they would) */
} mc_run_rank_t;

typedef struct mc_run_result {
  int world_size, rounds;
  mc_run_rank_t *ranks;   /* [world_size] */
  double *samples_us;     /* [world_size][MC_PH_COUNT][rounds] */
  float *dense_us;        /* [world_size][rounds] when opts.dense_bytes > 0 */
  int dense_rc;           /* mc_result_t of the dense baseline on rank 0 */
  float *extra_us;        /* [world_size][rounds] when opts.extra_baseline is set */
  int extra_rc;           /* what extra_baseline returned on rank 0 */
  double *floor_us;       /* [world_size][MC_PH_COUNT][rounds] when opts.floor is set: as samples_us */
} mc_run_result_t;

/* Returns the number of ranks that failed (0: all good), or -1 if the run
 * could not start. The result must be freed with mc_run_free. */
int mc_run(const mc_case_t *c, const mc_run_opts_t *o, mc_run_result_t *res);
void mc_run_free(mc_run_result_t *res);
/* The first failure's text, or "": of a rank a signal killed where there
 * is one (the root cause the others' failures follow from), else of the
 * lowest failed rank. */
const char *mc_run_first_failure(const mc_run_result_t *res);

/* The GPU memory a rank of mc_run takes on a GPU transport: its buffers
 * (expert_x, expert_scale and expert_y at the API's sizes, out, the inputs)
 * and the library's (window and workspace of each handle, *library): what
 * is known before anything is made. */
uint64_t mc_run_gpu_bytes(const mc_case_t *c, const mc_run_opts_t *o, uint64_t *library);

/* The combine tolerance relative to sum |w y|, from the dtypes' precision. */
double mc_ref_tolerance(const mc_case_t *c);

#endif
