/* mc_layout.h - the one description of moecomm's buffers: record format,
 * sizes, offsets and signal slots. Host C, CUDA kernels and the CPU
 * transport all carve their memory with these functions and nothing else
 * computes a size or an offset (pplx-kernels and DeepEP computed them twice
 * and drifted).
 *
 * Every rank owns one "window" that peers write into (shared memory for
 * cpu, symmetric heap for nvshmem, IPC-mapped memory for p2p), and one
 * private "workspace" only it touches. Window, in this order:
 *
 *   signals      MC_SIG_COUNT x world_size uint64 slots (see MC_SIG_*)
 *   disp_meta    [world_size][meta_bytes]   per source rank: n records + per-local-expert counts,
 *                                           each word tagged with the round
 *   disp_recv    [world_size][src_cap][record_bytes]  records from each source rank
 *   comb_recv    [world_size][max_tokens][row_bytes]  one row per (expert rank, token of my group)
 *   disp_send    [src_cap][record_bytes]    staging: records packed once, put to every destination
 *   meta_send    [world_size][meta_bytes]   staging: the meta for each destination
 *   comb_send    [world_size * src_cap][row_bytes]    staging: pre-reduced rows, put to the group
 *
 * Staging lives in the window because NVSHMEM over a network needs the
 * source of a put registered, and a non-blocking put needs its source kept
 * intact until the round ends; the cpu transport uses the same staging so
 * that it runs the same steps.
 *
 * src_cap = ceil(max_tokens / group_size): the most tokens one rank of a
 * group sends (a group splits its tokens in contiguous chunks). So memory
 * grows with num_groups x max_tokens x record and world_size x max_tokens x
 * hidden, never with num_experts x max_tokens x hidden.
 *
 * A dispatch record: header | payload (token_bytes) | scales (scale_bytes),
 * padded to 16 bytes. The header says which token of the source group this
 * is and, for each of its top-k experts in ascending global id, the expert,
 * the record's position among the records this source sends to that expert,
 * and the router weight. The header is the same for every destination, so a
 * record is packed once and put to each destination rank unchanged; a
 * receiver uses the targets it holds (expert / num_local_experts == rank).
 */
#ifndef MC_LAYOUT_H
#define MC_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

#if defined(__CUDACC__)
#define MC_HD static inline __host__ __device__
#else
#define MC_HD static inline
#endif

#define MC_ALIGN 16u /* every region and record starts on 16 bytes: 16-byte vector copies */

/* Signal slots, each an array of world_size uint64 indexed by the peer. */
enum {
  MC_SIG_DISP_META = 0, /* SET to the round number once peer's meta landed by a put (a meta
                           stored directly carries the round in its words: mc_meta_pack) */
  MC_SIG_DISP_RECS = 1, /* ADD per record from peer (cpu: 1 a record; GPU: 1 a record piece,
                           mc_record_pieces); never reset (running total) */
  MC_SIG_COMB_ROWS = 2, /* ADD per combine row from peer (cpu: 1 a row; GPU: 1 a row segment); never reset */
  MC_SIG_COMB_BAR = 3,  /* SET to the round number when peer entered combine-send */
  MC_SIG_BARRIER = 4,   /* SET to the count of mc_a2a_barrier calls (cpu: made with that peer) */
  MC_SIG_WAITING = 5,   /* cpu: entry [owner] of the owner's own window: 1 + the rank it waits
                           for, 0 when not waiting; read by a peer that timed out, to name the
                           rank at the root of a chain of waits */
  MC_SIG_RESYNC = 6,    /* SET to 4 x the pair's mask attempt + the step of mc_a2a_mask_ranks peer reached */
  MC_SIG_RESYNC_ROUND = 7, /* SET to peer's last round, before its first MC_SIG_RESYNC step */
  MC_SIG_COUNT = 8
};

/* A slot's name, for the texts of timeouts. */
static inline const char *mc_sig_name(int slot) {
  static const char *const names[MC_SIG_COUNT] = {
      "dispatch meta", "dispatch records", "combine rows", "combine entry (round barrier)",
      "barrier",       "waiting",          "mask step",    "mask round"};
  return slot >= 0 && slot < MC_SIG_COUNT ? names[slot] : "?";
}

/* Whether a peer's MC_SIG_RESYNC value v ends step k (1 or 2) of a mask
 * call made under the pair's attempt n: the peer is on n at step k or
 * later, or, in step 2, on n + 1 and not given up (step 0): it saw this
 * step, left the call and made its next one. The rules and why:
 * docs/protocol.md; both transports decide by this. */
MC_HD int mc_resync_done(uint64_t v, uint64_t n, int k) {
  return (v / 4 == n && v % 4 >= (uint64_t)k) || (k == 2 && v / 4 == n + 1 && v % 4 != 0);
}

/* How a put or signal updates the receiver's signal word. */
enum { MC_SIG_SET = 0, MC_SIG_ADD = 1 };

typedef struct mc_target {
  int32_t expert; /* global id in a record; local id in a route entry */
  int32_t pos;    /* record: index among this source's records for that expert;
                     route entry: the slot in expert_x */
  float weight;   /* router weight, for combine's pre-reduction */
} mc_target_t;

typedef struct mc_record_header {
  int32_t token;     /* row index in the source group's batch */
  int32_t n_targets; /* topk */
  mc_target_t targets[1]; /* really topk of them, ascending expert id */
} mc_record_header_t;

/* n / d for n < 2^31 and a divisor d >= 1 fixed for a handle, as a
 * multiply-high, an add and a shift (round-up method, the magic made once
 * by mc_fdiv_make): a GPU kernel's division by a runtime value is a dozen
 * dependent instructions, on the path of the loads that wait for it. */
typedef struct mc_fdiv {
  uint32_t mul, shift;
} mc_fdiv_t;
MC_HD mc_fdiv_t mc_fdiv_make(uint32_t d) {
  uint32_t l = 0;
  if (d == 0) d = 1; /* never in a shape mc_a2a_create accepts; a tool's shape divides by 1 */
  while ((1ull << l) < d) l++; /* ceil(log2 d) */
  const mc_fdiv_t f = {(uint32_t)(((1ull << 32) * ((1ull << l) - d)) / d + 1), l};
  return f;
}
MC_HD int mc_fdiv(int n, mc_fdiv_t f) {
  const uint32_t t = (uint32_t)(((uint64_t)(uint32_t)n * f.mul) >> 32);
  return (int)((t + (uint32_t)n) >> f.shift); /* t <= n < 2^31: no overflow */
}

/* Everything sizes derive from. Filled once from the a2a config. */
typedef struct mc_shape {
  int world_size, group_size, num_experts, topk, max_tokens, hidden;
  uint64_t token_bytes, scale_bytes, in_elem_bytes;
  /* derived once by mc_shape_make: the divisions by runtime values that
   * every layout offset below needs (a GPU kernel would inline each
   * division at every use: a large share of a kernel's instructions) */
  int num_local_experts, num_groups, src_cap;
  int layout, expert_align; /* the receive layout (MC_LAYOUT_*) and the sorted layout's alignment */
  int prep_warps;           /* the GPU prep's scanning warps per chunk (mc_prep_warps_of) */
  /* the GPU kernels' divisors: group size, local experts, a token's
   * payload pieces (mc_token_segs), a row's segments (mc_row_segs) */
  mc_fdiv_t div_group, div_local, div_tsegs, div_rsegs;
} mc_shape_t;

/* The GPU prep (src/gpu/mc_gpu_prep.cuh) keeps a lane mask per scanning
 * warp for each of the E + W columns in shared memory under MC_PREP_SMEM,
 * in blocks of MC_PREP_THREADS: as many warps as fit, 1 to 8; a chunk is 32
 * tokens a warp. Made once here: every block of a dispatch kernel carves
 * its shared memory by it, and the division would be made in each. */
#define MC_PREP_THREADS 256
#define MC_PREP_SMEM (40u << 10)
MC_HD int mc_prep_warps_of(int num_experts, int world_size) {
  const uint32_t cols = (uint32_t)num_experts + (uint32_t)world_size;
  if (cols >= MC_PREP_SMEM / 4u) return 1;
  const uint32_t fixed = 4u * (cols + (uint32_t)world_size); /* running counts, expected rows */
  uint32_t w = fixed < MC_PREP_SMEM ? (MC_PREP_SMEM - fixed) / (4u * cols) : 1;
  if (w > MC_PREP_THREADS / 32) w = MC_PREP_THREADS / 32;
  return w < 1 ? 1 : (int)w;
}

/* GPU kernels walk a row in segments of MC_SEG_BYTES (32 lanes x 4 x 16 B). */
#define MC_SEG_BYTES 2048u
MC_HD uint64_t mc_row_bytes(const mc_shape_t *s) { return (uint64_t)s->hidden * s->in_elem_bytes; }
MC_HD int mc_row_segs(const mc_shape_t *s) { return (int)((mc_row_bytes(s) + MC_SEG_BYTES - 1) / MC_SEG_BYTES); }
/* ... and a token's payload: a GPU record crosses as this many payload
 * pieces (the last also carries the scales) and one header piece, each
 * stored by its own warp and counted in MC_SIG_DISP_RECS */
MC_HD int mc_token_segs(const mc_shape_t *s) { return (int)((s->token_bytes + MC_SEG_BYTES - 1) / MC_SEG_BYTES); }
/* ... and dispatch-recv's items a record: a warp copies `pieces` of its payload pieces an item */
MC_HD int mc_record_items(const mc_shape_t *s, int pieces) { return (mc_token_segs(s) + pieces - 1) / pieces; }

/* A shape with its derived fields: the only way to make one. */
MC_HD mc_shape_t mc_shape_make(int world_size, int group_size, int num_experts, int topk, int max_tokens, int hidden,
                               uint64_t token_bytes, uint64_t scale_bytes, uint64_t in_elem_bytes, int layout,
                               int expert_align) {
  mc_shape_t s = {world_size, group_size, num_experts, topk, max_tokens, hidden, token_bytes, scale_bytes,
                  in_elem_bytes, num_experts / world_size, world_size / group_size,
                  (max_tokens + group_size - 1) / group_size, layout, expert_align,
                  mc_prep_warps_of(num_experts, world_size), {0, 0}, {0, 0}, {0, 0}, {0, 0}};
  s.div_group = mc_fdiv_make((uint32_t)group_size);
  s.div_local = mc_fdiv_make((uint32_t)s.num_local_experts);
  s.div_tsegs = mc_fdiv_make((uint32_t)mc_token_segs(&s));
  s.div_rsegs = mc_fdiv_make((uint32_t)mc_row_segs(&s));
  return s;
}

MC_HD uint64_t mc_align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

MC_HD int mc_num_groups(const mc_shape_t *s) { return s->num_groups; }
MC_HD int mc_num_local_experts(const mc_shape_t *s) { return s->num_local_experts; }
MC_HD int mc_src_cap(const mc_shape_t *s) { return s->src_cap; }
/* Slots one local expert can need: every token of every group. */
MC_HD int mc_expert_capacity(const mc_shape_t *s) { return mc_num_groups(s) * s->max_tokens; }

/* The contiguous chunk of a group's m tokens that group member `member` sends. */
MC_HD void mc_send_chunk(const mc_shape_t *s, int m, int member, int *begin, int *end) {
  int chunk = mc_fdiv(m + s->group_size - 1, s->div_group);
  int b = member * chunk, e = b + chunk;
  *begin = b < m ? b : m;
  *end = e < m ? e : m;
}
/* A rank's place in its group. */
MC_HD int mc_group_member(const mc_shape_t *s, int rank) { return rank - mc_fdiv(rank, s->div_group) * s->group_size; }

/* ---- records ---- */
MC_HD uint64_t mc_header_bytes(const mc_shape_t *s) {
  return mc_align_up(2 * sizeof(int32_t) + (uint64_t)s->topk * sizeof(mc_target_t), MC_ALIGN);
}
MC_HD uint64_t mc_record_payload_off(const mc_shape_t *s) { return mc_header_bytes(s); }
MC_HD uint64_t mc_record_scale_off(const mc_shape_t *s) { return mc_header_bytes(s) + s->token_bytes; }
MC_HD uint64_t mc_record_bytes(const mc_shape_t *s) {
  return mc_align_up(mc_header_bytes(s) + s->token_bytes + s->scale_bytes, MC_ALIGN);
}
/* Meta from one source: 64-bit words, each a uint32 value in its low half
 * and the round in its high half (mc_meta_pack). A word is written by one
 * 8-byte store and seen whole, so a receiver that the sender stores into
 * directly polls the words themselves until they carry its round: no
 * signal, and no release after the sender's stores (a receiver reached by
 * puts waits for the meta signal first, as for the records). Every sender
 * writes every word of mc_meta_words, the unused ones as zero. Words: the
 * records to this receiver, a count per local expert, then a 64-bit digest
 * of the round's inputs of the source's group (m, indices, weights; its low
 * and high halves from word mc_meta_digest_word): the ranks of a group must
 * pass the same, and a receiver compares the members' digests (a group of
 * one rank has nothing to compare). */
MC_HD uint64_t mc_meta_pack(uint64_t round, uint32_t v) { return (uint64_t)(uint32_t)round << 32 | v; }
MC_HD int mc_meta_digest_word(const mc_shape_t *s) { return 1 + mc_num_local_experts(s); }
/* The packed layouts (mc_dispatch_packed) add the sender's declared row
 * capacity (two words from mc_meta_limit_word, low half first, 0: none)
 * and its records to every rank (world_size words from
 * mc_meta_torank_word); the expert-sorted layout, whose rows are per
 * expert, also its records to every expert (num_experts words from
 * mc_meta_toexpert_word). The same words in every meta a sender sends, so
 * that from the metas it receives every rank knows every rank's rows and
 * capacity, and all reach one verdict. */
MC_HD int mc_packed_layout(const mc_shape_t *s) { return s->layout != 0; }
MC_HD int mc_meta_limit_word(const mc_shape_t *s) { return 3 + mc_num_local_experts(s); }
MC_HD int mc_meta_torank_word(const mc_shape_t *s) { return 5 + mc_num_local_experts(s); }
MC_HD int mc_meta_toexpert_word(const mc_shape_t *s) { return 5 + mc_num_local_experts(s) + s->world_size; }
MC_HD int mc_meta_words(const mc_shape_t *s) {
  return s->layout == 2   ? mc_meta_toexpert_word(s) + s->num_experts
         : s->layout == 1 ? mc_meta_toexpert_word(s)
                          : 3 + mc_num_local_experts(s);
}
/* Word w of the meta to rank dst: from the sender's records to every rank
 * (to_rank[W]) and to every expert (to_expert[E], dst's local experts
 * contiguous), its group's digest and its declared capacity. */
MC_HD uint32_t mc_meta_value(const mc_shape_t *s, const uint32_t *to_rank, const uint32_t *to_expert, int dst, int w,
                             uint64_t digest, uint64_t limit) {
  const int L = mc_num_local_experts(s);
  if (w == 0) return to_rank[dst];
  if (w <= L) return to_expert[dst * L + w - 1];
  if (w < mc_meta_limit_word(s)) return (uint32_t)(digest >> (32 * (w - mc_meta_digest_word(s))));
  if (w < mc_meta_torank_word(s)) return (uint32_t)(limit >> (32 * (w - mc_meta_limit_word(s))));
  if (w < mc_meta_toexpert_word(s)) return to_rank[w - mc_meta_torank_word(s)];
  return to_expert[w - mc_meta_toexpert_word(s)];
}
MC_HD uint64_t mc_meta_bytes(const mc_shape_t *s) {
  return mc_align_up((uint64_t)mc_meta_words(s) * sizeof(uint64_t), MC_ALIGN);
}
/* The value of word w of source src's meta in a window's disp_meta region
 * (meta0: its start), once it has arrived. A volatile load: on a GPU it
 * reads the word where the sender's store landed, never a copy an SM
 * cached before. */
MC_HD uint32_t mc_meta_get(const mc_shape_t *s, const unsigned char *meta0, int src, int w) {
  return (uint32_t)((const volatile uint64_t *)(meta0 + (uint64_t)src * mc_meta_bytes(s)))[w];
}
/* Packed layouts: the capacity rank q declared (0: none), from its meta. */
MC_HD int64_t mc_packed_limit(const mc_shape_t *s, const unsigned char *meta0, int q) {
  const int w = mc_meta_limit_word(s);
  return (int64_t)((uint64_t)mc_meta_get(s, meta0, q, w) | (uint64_t)mc_meta_get(s, meta0, q, w + 1) << 32);
}
/* Packed layouts: the rows rank q receives this round, from every source's
 * meta (skip[src] set: a masked source, which sent none): packed, one per
 * record; expert-sorted, each of q's local experts' pairs rounded up to
 * expert_align. Every rank computes it for every rank alike. */
MC_HD int64_t mc_packed_rows(const mc_shape_t *s, const unsigned char *meta0, const uint8_t *skip, int q) {
  const int W = s->world_size, L = mc_num_local_experts(s);
  int64_t rows = 0;
  if (s->layout == 1) { /* MC_LAYOUT_PACKED (2: MC_LAYOUT_EXPERT_SORTED) */
    for (int src = 0; src < W; src++)
      if (!skip || !skip[src]) rows += mc_meta_get(s, meta0, src, mc_meta_torank_word(s) + q);
    return rows;
  }
  for (int l = 0; l < L; l++) {
    int64_t n = 0;
    for (int src = 0; src < W; src++)
      if (!skip || !skip[src]) n += mc_meta_get(s, meta0, src, mc_meta_toexpert_word(s) + q * L + l);
    rows += (int64_t)mc_align_up((uint64_t)n, (uint64_t)s->expert_align);
  }
  return rows;
}

/* The bytes of a token's segment j (the last one may be short). */
MC_HD uint32_t mc_token_seg_bytes(const mc_shape_t *s, int j) {
  const uint64_t left = s->token_bytes - (uint64_t)j * MC_SEG_BYTES;
  return (uint32_t)(left < MC_SEG_BYTES ? left : MC_SEG_BYTES);
}
MC_HD uint64_t mc_record_pieces(const mc_shape_t *s) { return (uint64_t)mc_token_segs(s) + 1; }
/* Slots in the caller's expert_x / expert_scale / expert_y: local experts x capacity. */
MC_HD uint64_t mc_expert_slots(const mc_shape_t *s) {
  return (uint64_t)mc_num_local_experts(s) * (uint64_t)mc_expert_capacity(s);
}

/* ---- window offsets ---- */
MC_HD uint64_t mc_sig_off(const mc_shape_t *s, int slot, int peer) {
  return ((uint64_t)slot * s->world_size + peer) * sizeof(uint64_t);
}
MC_HD uint64_t mc_sig_bytes(const mc_shape_t *s) {
  return mc_align_up((uint64_t)MC_SIG_COUNT * s->world_size * sizeof(uint64_t), MC_ALIGN);
}
MC_HD uint64_t mc_disp_meta_off(const mc_shape_t *s, int src) {
  return mc_sig_bytes(s) + (uint64_t)src * mc_meta_bytes(s);
}
MC_HD uint64_t mc_disp_recv_base(const mc_shape_t *s) {
  return mc_sig_bytes(s) + (uint64_t)s->world_size * mc_meta_bytes(s);
}
MC_HD uint64_t mc_disp_recv_off(const mc_shape_t *s, int src, int idx) {
  return mc_disp_recv_base(s) + ((uint64_t)src * mc_src_cap(s) + idx) * mc_record_bytes(s);
}
MC_HD uint64_t mc_comb_recv_base(const mc_shape_t *s) {
  return mc_disp_recv_base(s) + (uint64_t)s->world_size * mc_src_cap(s) * mc_record_bytes(s);
}
MC_HD uint64_t mc_comb_recv_off(const mc_shape_t *s, int src, int token) {
  return mc_comb_recv_base(s) + ((uint64_t)src * s->max_tokens + token) * mc_row_bytes(s);
}
MC_HD uint64_t mc_disp_send_base(const mc_shape_t *s) {
  return mc_comb_recv_base(s) + (uint64_t)s->world_size * s->max_tokens * mc_row_bytes(s);
}
MC_HD uint64_t mc_disp_send_off(const mc_shape_t *s, int idx) {
  return mc_disp_send_base(s) + (uint64_t)idx * mc_record_bytes(s);
}
MC_HD uint64_t mc_meta_send_off(const mc_shape_t *s, int dst) {
  return mc_disp_send_base(s) + (uint64_t)mc_src_cap(s) * mc_record_bytes(s) +
         (uint64_t)dst * mc_meta_bytes(s);
}
MC_HD uint64_t mc_comb_send_base(const mc_shape_t *s) {
  return mc_meta_send_off(s, s->world_size);
}
/* Staging row for the i-th received record (i < world_size * src_cap). */
MC_HD uint64_t mc_comb_send_off(const mc_shape_t *s, int i) {
  return mc_comb_send_base(s) + (uint64_t)i * mc_row_bytes(s);
}
MC_HD uint64_t mc_window_bytes(const mc_shape_t *s) {
  return mc_align_up(mc_comb_send_off(s, s->world_size * mc_src_cap(s)), MC_ALIGN);
}

/* ---- private workspace (never written by peers) ----
 * The fixed-size regions every GPU kernel reads first come first, so that
 * their offsets are constants or one product, not a chain of sums over the
 * shape (each kernel's first loads wait for that arithmetic):
 *   scalars   MC_WS_NSCALARS uint32 (MC_WS_*): state the GPU kernels hand
 *             each other through device memory, so a captured graph replays
 *   stats     MC_WS_NSTATS uint64: what was sent, counted on the device
 *   round     uint64: the GPU kernels' round number
 *   seen      [MC_SIG_COUNT][world_size] uint64 running totals already consumed
 *   expect    [world_size] uint32 combine rows expected from each rank this round
 *   route     [world_size * src_cap] entries: what dispatch-recv learnt of each
 *             received record, for combine-send (source, token, slots, weights)
 *   dests     [max_tokens][topk] uint16 destination ranks of each token of my
 *             group, ascending, and n_dests [max_tokens] uint16
 *   base      [world_size][num_local_experts] uint32: first slot of each
 *             (source, local expert) in expert_x this round
 *   sendcnt   [world_size + num_experts] uint32: dispatch-send's records per
 *             destination rank, then records per global expert
 *   acc       [hidden] float: one fp32 row being summed (cpu transport)
 *   ridx      [src_cap][topk] uint32: for each token this rank sends, its
 *             record index at each destination (GPU: prep -> send kernel)
 *   rowdone   [world_size * src_cap] uint32: segments of each combine row
 *             written so far (GPU: the last segment's warp signals the row)
 *   pcount    [ceil(max_tokens / MC_PREP_MIN_CHUNK)][num_experts + 2 * world_size]
 *             uint32 (GPU): the prep kernel's counts per chunk of tokens (one
 *             block each), per expert, per destination rank and per rank
 *             rows are expected back from; the last block turns them into
 *             each chunk's bases
 *   load, mask, mask_calls: below
 */
enum {
  MC_WS_M_EFF = 0,  /* valid tokens of this round (bound_m applied) */
  MC_WS_N_ROUTE,    /* records dispatch-recv took in */
  MC_WS_BAD,        /* 1: this round's input was refused on the device */
  MC_WS_DONE_DRECV, /* packed layouts: dispatch-recv's blocks finished (the last moves the round's state on) */
  MC_WS_BARRIERS,   /* mc_a2a_barrier calls so far (the value the next one signals, minus 1) */
  MC_WS_DONE_PREP,  /* prep blocks finished: the last one scans the chunks' counts */
  MC_WS_PREP_BAD,   /* 1: a prep block found a bad token this round (the last block publishes MC_WS_BAD) */
  MC_WS_DONE_DSEND, /* one-launch dispatch: blocks done sending (the last writes the round number) */
  MC_WS_DROP,       /* 1 from a round dropped over a declared capacity (packed layouts) until the first
                       dispatch-send launched after the host reported it: the ones before are refused */
  MC_WS_DIGEST = 10, /* and the next: chunked prep: the sum of the chunks' group digests (uint64, on 8 bytes) */
  /* uint64 from here (two each): dispatch-recv may start before dispatch-send has moved the
     round number on, so it keeps its own counts, and learns each call's outcome from OUTCOME */
  MC_WS_DRECV_ROUND = 12, /* the last round dispatch-recv took in */
  MC_WS_SEND_TRIES = 14,  /* dispatch-send calls so far, refused ones too (only accepted ones move the
                             round number: a rank may retry a refused round alone) */
  MC_WS_DRECV_TRIES = 16, /* the same count as dispatch-recv keeps it */
  MC_WS_OUTCOME = 18,     /* 2 x the call's number + 1 if refused: written by dispatch-send once it has
                             checked the call's input */
  MC_WS_ARRIVED_DRECV = 20, /* blocks of dispatch-recv (batched layout) that have read the round's state:
                               the grid's last warp moves the state on once all have, then sets this to 0 */
  MC_WS_ARRIVED_CRECV = 22, /* the same for combine-recv */
  MC_WS_NSCALARS = 24
};
enum { MC_STAT_DREC = 0, MC_STAT_DBYTES, MC_STAT_CROWS, MC_STAT_CBYTES, MC_WS_NSTATS = 4 };
typedef struct mc_route_entry {
  int32_t src_rank;
  int32_t token;
  int32_t n_targets;
  int32_t pad;
  mc_target_t targets[1]; /* really n_targets (<= topk): local expert, slot, weight */
} mc_route_entry_t;

MC_HD uint64_t mc_route_entry_bytes(const mc_shape_t *s) {
  return mc_align_up(4 * sizeof(int32_t) + (uint64_t)s->topk * sizeof(mc_target_t), MC_ALIGN);
}
MC_HD uint64_t mc_ws_scalars_off(const mc_shape_t *s) {
  (void)s;
  return 0;
}
MC_HD uint64_t mc_ws_stats_off(const mc_shape_t *s) {
  return mc_ws_scalars_off(s) + mc_align_up(MC_WS_NSCALARS * sizeof(uint32_t), MC_ALIGN);
}
/* The round number (uint64, never wraps), bumped on the device by
 * dispatch-send, so a captured CUDA graph replays correctly. */
MC_HD uint64_t mc_ws_round_off(const mc_shape_t *s) { return mc_ws_stats_off(s) + MC_WS_NSTATS * sizeof(uint64_t); }
MC_HD uint64_t mc_ws_seen_off(const mc_shape_t *s) {
  return mc_align_up(mc_ws_round_off(s) + sizeof(uint64_t), MC_ALIGN);
}
MC_HD uint64_t mc_ws_expect_off(const mc_shape_t *s) {
  return mc_ws_seen_off(s) + mc_align_up((uint64_t)MC_SIG_COUNT * s->world_size * sizeof(uint64_t), MC_ALIGN);
}
MC_HD uint64_t mc_ws_route_off(const mc_shape_t *s, int i) {
  return mc_ws_expect_off(s) + mc_align_up((uint64_t)s->world_size * sizeof(uint32_t), MC_ALIGN) +
         (uint64_t)i * mc_route_entry_bytes(s);
}
MC_HD uint64_t mc_ws_dests_off(const mc_shape_t *s) { return mc_ws_route_off(s, s->world_size * mc_src_cap(s)); }
MC_HD uint64_t mc_ws_ndests_off(const mc_shape_t *s) {
  return mc_ws_dests_off(s) + mc_align_up((uint64_t)s->max_tokens * s->topk * sizeof(uint16_t), MC_ALIGN);
}
MC_HD uint64_t mc_ws_base_off(const mc_shape_t *s) {
  return mc_ws_ndests_off(s) + mc_align_up((uint64_t)s->max_tokens * sizeof(uint16_t), MC_ALIGN);
}
MC_HD uint64_t mc_ws_sendcnt_off(const mc_shape_t *s) {
  return mc_ws_base_off(s) +
         mc_align_up((uint64_t)s->world_size * mc_num_local_experts(s) * sizeof(uint32_t), MC_ALIGN);
}
MC_HD uint64_t mc_ws_acc_off(const mc_shape_t *s) {
  return mc_ws_sendcnt_off(s) +
         mc_align_up(((uint64_t)s->world_size + s->num_experts) * sizeof(uint32_t), MC_ALIGN);
}
MC_HD uint64_t mc_ws_ridx_off(const mc_shape_t *s) {
  return mc_ws_acc_off(s) + mc_align_up((uint64_t)s->hidden * sizeof(float), MC_ALIGN);
}
MC_HD uint64_t mc_ws_rowdone_off(const mc_shape_t *s) {
  return mc_ws_ridx_off(s) + mc_align_up((uint64_t)mc_src_cap(s) * s->topk * sizeof(uint32_t), MC_ALIGN);
}
/* The prep kernel's chunks hold at least this many tokens (one warp's). */
#define MC_PREP_MIN_CHUNK 32
MC_HD uint64_t mc_ws_pcount_off(const mc_shape_t *s) {
  return mc_ws_rowdone_off(s) + mc_align_up((uint64_t)s->world_size * mc_src_cap(s) * sizeof(uint32_t), MC_ALIGN);
}
/* uint64[L]: tokens received per local expert over every accepted dispatch
 * since create or the last reset (mc_a2a_get_expert_load) */
MC_HD uint64_t mc_ws_load_off(const mc_shape_t *s) {
  const uint64_t chunks = ((uint64_t)s->max_tokens + MC_PREP_MIN_CHUNK - 1) / MC_PREP_MIN_CHUNK;
  return mc_ws_pcount_off(s) +
         mc_align_up(chunks * ((uint64_t)s->num_experts + 2u * s->world_size) * sizeof(uint32_t), MC_ALIGN);
}
/* uint8[W]: the ranks masked (mc_a2a_mask_ranks; the GPU transports' copy) */
MC_HD uint64_t mc_ws_mask_off(const mc_shape_t *s) {
  return mc_ws_load_off(s) + mc_align_up((uint64_t)mc_num_local_experts(s) * sizeof(uint64_t), MC_ALIGN);
}
/* uint64[W]: the last mask attempt numbered together with each rank (the GPU transports') */
MC_HD uint64_t mc_ws_mask_calls_off(const mc_shape_t *s) {
  return mc_ws_mask_off(s) + mc_align_up((uint64_t)s->world_size, MC_ALIGN);
}
MC_HD uint64_t mc_workspace_bytes(const mc_shape_t *s) {
  return mc_ws_mask_calls_off(s) + mc_align_up((uint64_t)s->world_size * sizeof(uint64_t), MC_ALIGN);
}

#endif /* MC_LAYOUT_H */
