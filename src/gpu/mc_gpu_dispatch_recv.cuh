/* mc_gpu_dispatch_recv.cuh - dispatch-recv on the GPU: wait for every
 * source's meta and records, compute the slot bases, copy each record's
 * pieces into expert_x and write the route entries combine reads. Built on
 * mc_gpu_kernels.cuh (which says what a transport provides, and why a round
 * cannot overwrite what a peer still reads); its entry points are rows of
 * mc_gpu_table.cuh. */
#ifndef MC_GPU_DISPATCH_RECV_CUH
#define MC_GPU_DISPATCH_RECV_CUH

#include "mc_gpu_kernels.cuh"

/* Dynamic shared memory: seen[W] (uint64: each source's record pieces
 * before this round), then base[W][L], prefix[W + 1]. */
static inline size_t mc_drecv_smem_bytes(const mc_shape_t *s) {
  return sizeof(uint64_t) * (size_t)s->world_size +
         sizeof(uint32_t) * ((size_t)s->world_size * mc_num_local_experts(s) + (size_t)s->world_size + 1);
}

/* What dispatch-recv waits for from rank src, written once (combine-recv's:
 * mc_gpu_combine.cuh). Each returns 1 on a failure (recorded), and the
 * meta's 2 where *quit is set (mc_dev_wait). Word w of src's meta, *v its
 * value: a meta stored directly carries the round in every word, polled
 * there; one put is signalled (after its data), and its words are read
 * once the signal has come. */
MC_DEV bool mc_meta_put(const mc_kargs_t &a, int src) { return a.staged && !mc_t_peer_window(&a, src); }
MC_DEV int mc_wait_meta_word(const mc_kargs_t &a, int src, int w, uint64_t round, uint32_t *v,
                             const volatile int *quit) {
  const uint64_t *p = (const uint64_t *)(a.win + mc_disp_meta_off(&a.s, src)) + w;
  uint64_t got;
  int r;
  if (mc_meta_put(a, src) && (r = mc_dev_wait(&a, mc_sig_local(&a, MC_SIG_DISP_META, src), round, 0, MC_PHASE_DRECV,
                                              src, MC_SIG_DISP_META, round, &got, quit, false)))
    return r;
  if ((r = mc_dev_wait(&a, p, round, 1, MC_PHASE_DRECV, src, MC_SIG_DISP_META, round, &got, quit, false))) return r;
  *v = (uint32_t)got;
  return 0;
}
/* after src's meta: every piece of the records it announced there, from
 * what this block holds already (the running total before this round, the
 * records from the prefix over the metas): the wait is the one memory
 * round trip between the slot bases and the copy */
MC_DEV int mc_wait_records(const mc_kargs_t &a, int src, uint64_t round, const uint64_t *seen, const uint32_t *prefix) {
  return mc_dev_wait_ge(&a, mc_sig_local(&a, MC_SIG_DISP_RECS, src),
                        seen[src] + (uint64_t)(prefix[src + 1] - prefix[src]) * mc_record_pieces(&a.s),
                        MC_PHASE_DRECV, src, MC_SIG_DISP_RECS, round);
}

/* What every receiving kernel of dispatch loads first, before it knows
 * the round or the call's outcome, so that these loads are in flight with
 * those: thread tid's running total of source tid (read at the start: it
 * moves on only once every block has read it) and
 * the first meta word it polls (checked against the round once known). */
typedef struct mc_drecv_pre {
  uint64_t seen, word;
} mc_drecv_pre_t;
MC_DEV mc_drecv_pre_t mc_drecv_prefetch(const mc_kargs_t &a) {
  const mc_shape_t *s = &a.s;
  const int W = s->world_size, MW = mc_meta_words(s), tid = threadIdx.x;
  mc_drecv_pre_t p = {0, 0};
  if (tid < W * MW)
    p.word = mc_word_load(&a, (const uint64_t *)(a.win + mc_disp_meta_off(s, tid / MW)) + tid % MW);
  if (tid < W) p.seen = ((const uint64_t *)(a.ws + mc_ws_seen_off(s)) + MC_SIG_DISP_RECS * W)[tid];
  return p;
}

/* The slot bases, once every source's meta words are in base[src][l]
 * (src's records to local expert l) and prefix[src + 1] (src's records):
 * base[src][l] becomes where src's records to l start among that expert's,
 * prefix[src] where src's records start among all, then a barrier. Each
 * local expert's records: into expert_count and the load statistics
 * (block 0), or with packed into ecount[] for the caller. */
MC_DEV void mc_drecv_bases(const mc_kargs_t &a, const int packed, uint32_t *base, uint32_t *prefix, uint32_t *ecount) {
  const mc_shape_t *s = &a.s;
  const int W = s->world_size, L = mc_num_local_experts(s), tid = threadIdx.x;
  uint64_t *load = (uint64_t *)(a.ws + mc_ws_load_off(s)); /* mc_a2a_get_expert_load's sums */
  for (int l = tid; l < L; l += blockDim.x) {
    uint32_t run = 0;
    for (int src = 0; src < W; src++) {
      const uint32_t n = base[src * L + l];
      base[src * L + l] = run;
      run += n;
    }
    if (packed) ecount[l] = run;
    else if (blockIdx.x == 0) { /* stores and a reduction: nothing here waits for memory */
      a.expert_count[l] = (int32_t)run;
      atomicAdd((unsigned long long *)&load[l], (unsigned long long)run);
    }
  }
  if (tid == 0) {
    prefix[0] = 0;
    for (int src = 0; src < W; src++) prefix[src + 1] += prefix[src];
  }
  __syncthreads();
}

/* Every block's first steps, in every layout: the call's outcome and
 * every word of every source's meta awaited together (thread 0 waits for
 * the outcome, which dispatch-send writes before its metas, then for its
 * words; the other threads poll theirs meanwhile, a word a thread, and
 * stop where the outcome says refused: this rank's own meta will not
 * come), the running totals kept, each word's value kept where the scans
 * read it (a poll is a memory latency: the first was issued at the
 * kernel's start, and all are in flight together), the group digests
 * compared, and the slot bases made in shared memory (mc_drecv_bases;
 * with packed the caller reads the other words it needs from the window:
 * every word has arrived by then). Nothing is written outside shared
 * memory before the outcome is known, apart from each block's arrival
 * where arrive is set (the batched layout's kernel: mc_recv_arrive).
 * Returns 0 where the round goes on, 1 where it cannot (the failure is
 * recorded), 2 where the call was refused (nothing comes; the caller
 * counts it), 3 where the outcome is a later call's (nothing to do). */
MC_DEV int mc_drecv_metas(const mc_kargs_t &a, const int masking, const uint64_t round, const uint64_t call,
                          const int packed, const int arrive, const mc_drecv_pre_t &pre, uint64_t *seen,
                          uint32_t *base, uint32_t *prefix, uint32_t *ecount) {
  const mc_shape_t *s = &a.s;
  const int W = s->world_size, L = mc_num_local_experts(s), MW = mc_meta_words(s), tid = threadIdx.x;
  const uint64_t *seen_g = (const uint64_t *)(a.ws + mc_ws_seen_off(s)) + MC_SIG_DISP_RECS * W;
  __shared__ int refused;
  if (tid == 0) refused = 0;
  for (int src = tid; src < W; src += blockDim.x) seen[src] = src == tid ? pre.seen : seen_g[src];
  __syncthreads(); /* refused is 0 before any poller reads it; the running totals are read */
  if (arrive) mc_recv_arrive(a, MC_WS_ARRIVED_DRECV);
  int fail = 0;
  if (tid == 0) {
    uint64_t got;
    if (mc_dev_wait(&a, mc_ws_scalar64(&a, MC_WS_OUTCOME), 2 * call, 0, MC_PHASE_DRECV, a.rank, MC_SIG_DISP_META, round,
                    &got, NULL, true))
      fail = 1;
    else if (got != 2 * call) /* refused (counted), or a call already over (a count behind: nothing to do) */
      refused = got == 2 * call + 1 ? 2 : 3;
    mc_trace_point(&a, MC_TK_DRECV, 5);
  }
  for (int i = tid; i < W * MW && !fail && !(tid == 0 && refused); i += blockDim.x) {
    const int src = i / MW, w = i % MW;
    uint32_t v = 0;
    if (!mc_masked(masking, &a, src)) {
      /* the word loaded at the start, where it carries the round and came
       * by a store (a put's words count only after its signal) */
      if (i == tid && (uint32_t)(pre.word >> 32) == (uint32_t)round && !mc_meta_put(a, src)) v = (uint32_t)pre.word;
      else {
        const int r = mc_wait_meta_word(a, src, w, round, &v, &refused);
        if (r == 1) fail = 1;
        if (r) break;
      }
    }
    if (w == 0) prefix[src + 1] = v;
    else if (w <= L) base[src * L + w - 1] = v;
  }
  /* refused first: a failure recorded elsewhere meanwhile may have ended
   * some pollers' waits, and a refused call is over whatever failed */
  fail = __syncthreads_or(fail);
  if (refused) return refused;
  if (fail) return 1;
  /* the ranks of a group passed the same m, indices and weights: their
   * digests agree (mc_gpu_prep.cuh), or the round cannot finish (groups of
   * one rank have no digest: nothing to compare, no barrier to pay) */
  if (s->group_size > 1) {
    const unsigned char *meta0 = a.win + mc_disp_meta_off(s, 0);
    const int dw = mc_meta_digest_word(s);
    for (int src = tid; src < W; src += blockDim.x) {
      const int first = src / s->group_size * s->group_size;
      if (src != first && (mc_meta_get(s, meta0, first, dw) != mc_meta_get(s, meta0, src, dw) ||
                           mc_meta_get(s, meta0, first, dw + 1) != mc_meta_get(s, meta0, src, dw + 1))) {
        fail = 1;
        if (blockIdx.x == 0)
          mc_dev_fail(a.err, MC_DEVERR_GROUP_DIFFERS, MC_PHASE_DRECV, a.rank, src, first, -1, -1,
                      src / s->group_size, 0, 0, round);
      }
    }
    if (__syncthreads_or(fail)) return 1;
  }
  mc_trace_point(&a, MC_TK_DRECV, 0);
  mc_drecv_bases(a, packed, base, prefix, ecount);
  mc_trace_point(&a, MC_TK_DRECV, 1);
  return 0;
}

/* The grid's last warp, once its block knows the call's outcome (r, as
 * mc_drecv_metas returns it) and it has copied its share: after every
 * block has read the round's state, it moves the state on: an accepted
 * call's running totals of record pieces by this round's counts, the
 * records taken in, the round and the call; a refused call's count
 * (nothing comes); for the others (a later call's outcome, a failure)
 * only the arrivals go back to 0. Stores only, no fence: later kernels
 * read them, and this kernel's blocks read theirs before arriving. It is
 * the warp last given a record's share (none at decode sizes), so that
 * nothing on the copy's path waits for it. */
MC_DEV void mc_drecv_move_on(const mc_kargs_t &a, const int r, const uint64_t round, const uint64_t call,
                             const uint64_t *seen, const uint32_t *prefix) {
  const mc_shape_t *s = &a.s;
  const int W = s->world_size, lane = threadIdx.x & 31;
  int fail = 0;
  if (lane == 0) fail = mc_recv_all_arrived(a, MC_WS_ARRIVED_DRECV, MC_PHASE_DRECV, round);
  if (__shfl_sync(0xffffffffu, fail, 0)) return;
  __syncwarp(); /* lane 0's acquire before every lane's stores */
  if (r == 0) {
    uint64_t *seen_w = (uint64_t *)(a.ws + mc_ws_seen_off(s)) + MC_SIG_DISP_RECS * W;
    for (int src = lane; src < W; src += 32)
      seen_w[src] = seen[src] + (uint64_t)(prefix[src + 1] - prefix[src]) * mc_record_pieces(s);
    if (lane == 0) {
      mc_ws_u32(&a, mc_ws_scalars_off(s))[MC_WS_N_ROUTE] = prefix[W];
      *mc_ws_scalar64(&a, MC_WS_DRECV_ROUND) = round;
    }
  }
  if (lane == 0 && (r == 0 || r == 2)) *mc_ws_scalar64(&a, MC_WS_DRECV_TRIES) = call;
  if (lane == 0) mc_trace_stamp(&a, MC_TK_DRECV, 4);
}

/* ---- dispatch-recv (whole grid), a warp per (record, a.recv_pieces
 * payload pieces, share of the slots) ----
 * Every block waits for all metas and computes the slot bases itself (a few
 * hundred integers: cheaper than a grid-wide barrier); warps then take
 * items in (source, index) order, dealt to blocks first, wait until that
 * source's pieces have all landed, read the record's targets (a lane per
 * k), and copy their pieces into the slots of this rank's experts: every
 * slot where the grid has no warps to spare, every G-th where it has (a
 * decode call); the warp of the first piece and first share writes the
 * record's route entry for combine. The grid's last warp moves the
 * round's state on (mc_drecv_move_on). */
MC_DEV void mc_dispatch_recv_body(const mc_kargs_t &a, const int masking, const uint64_t round, const uint64_t call,
                                   const mc_drecv_pre_t &pre) {
  const mc_shape_t *s = &a.s;
  const int W = s->world_size, K = s->topk, L = mc_num_local_experts(s), cap = mc_expert_capacity(s);
  const int S = mc_token_segs(s), tid = threadIdx.x, lane = tid & 31;
  const int P = a.recv_pieces, I = mc_record_items(s, P); /* pieces per item, items per record */
  extern __shared__ uint32_t smem[];
  uint64_t *seen = (uint64_t *)smem; /* [W] (dynamic shared memory is 16-byte aligned) */
  uint32_t *base = smem + 2 * W, *prefix = base + W * L; /* [W][L], [W+1] */
  const int r = mc_drecv_metas(a, masking, round, call, 0, 1, pre, seen, base, prefix, NULL);
  const bool mover = blockIdx.x == gridDim.x - 1 && tid >= (int)blockDim.x - 32;
  if (r) {
    if (mover) mc_drecv_move_on(a, r, round, call, seen, prefix);
    return;
  }
  const int total = (int)prefix[W];
  const int gw = (tid >> 5) * gridDim.x + blockIdx.x, nw = (gridDim.x * blockDim.x) >> 5;
  const uint64_t poff = mc_record_payload_off(s), soff = mc_record_scale_off(s);
  /* a record has at most min(top-k, local experts) slots here */
  const int items = total * I, spare = items > 0 ? nw / items : 1, most = K < L ? K : L;
  const int G = spare < 1 ? 1 : spare < most ? spare : most;
  int waited_src = -1;
  for (int it = gw; it < items * G; it += nw) {
    const int g = it % G, ii = it / G;
    const int i = mc_fdiv(ii, a.div_items), j0 = (ii - i * I) * P, j1 = j0 + P < S ? j0 + P : S;
    int src = 0, hi = W - 1; /* the last source whose records start at or before i */
    while (src < hi) {
      const int mid = (src + hi + 1) / 2;
      if (prefix[mid] <= (uint32_t)i) src = mid;
      else hi = mid - 1;
    }
    if (src != waited_src) {
      int fail = 0;
      if (lane == 0) fail = mc_wait_records(a, src, round, seen, prefix);
      if (__shfl_sync(0xffffffffu, fail, 0)) break; /* the failure is recorded; finish quietly */
      __syncwarp(); /* lane 0's acquire before every lane's loads of the records */
      if (lane == 0) mc_trace_stamp(&a, MC_TK_DRECV, 3);
      waited_src = src;
    }
    const unsigned char *rec = a.win + mc_disp_recv_off(s, src, i - (int)prefix[src]);
    const mc_record_header_t *h = (const mc_record_header_t *)rec;
    /* the first piece's loads go out before the header's: they do not
     * depend on it, and the copy is a chain of memory latencies */
    const uint64_t po0 = (uint64_t)j0 * MC_SEG_BYTES;
    const uint32_t bytes0 = mc_token_seg_bytes(s, j0);
    int4 v[4];
    mc_warp_piece_load(v, rec + poff + po0, bytes0, lane);
    int sv[4]; /* the item of the last piece: the scales' first pass, loaded with it */
    if (j1 == S && s->scale_bytes) mc_warp_scales_first(sv, rec + soff, s->scale_bytes, lane);
    /* lane k reads target k: this rank's experts among them, ascending id */
    mc_target_t tg = {0, 0, 0.0f};
    int here = 0, l = 0, slot = 0;
    if (lane < K) {
      tg = h->targets[lane];
      l = tg.expert - a.rank * L; /* a range check, not a division: the copy waits for it */
      here = (unsigned)l < (unsigned)L;
      if (here) slot = (int)base[src * L + l] + tg.pos;
    }
    const uint32_t km = __ballot_sync(0xffffffffu, here);
    if (lane == 0) mc_trace_after(&a, MC_TK_DRECV, 6, km);
    const int n = __popc(km);
    if (g > 0 && g >= n) continue; /* fewer slots here than shares (share 0 writes the route entry) */
    /* each piece into every slot here, a slot at a time (its expert and
     * position from the lane that read that target): no table of pointers,
     * which lived in local memory */
    for (int j = j0; j < j1; j++) {
      const uint64_t po = (uint64_t)j * MC_SEG_BYTES;
      const uint32_t bytes = mc_token_seg_bytes(s, j);
      if (j > j0) mc_warp_piece_load(v, rec + poff + po, bytes, lane);
      uint32_t rest = km;
      for (int q = 0, turn = g; q < n; q++) {
        const int from = __ffs(rest) - 1;
        rest &= rest - 1;
        if (turn-- != 0) continue; /* another warp's slot */
        turn = G - 1;
        const uint64_t at = (uint64_t)__shfl_sync(0xffffffffu, l, from) * cap + (uint64_t)__shfl_sync(0xffffffffu, slot, from);
        unsigned char *x = (unsigned char *)a.expert_x + at * s->token_bytes;
        mc_warp_piece_store(&x, 1, po, v, bytes, lane);
        if (j == S - 1 && s->scale_bytes) {
          unsigned char *sd = (unsigned char *)a.expert_scale + at * s->scale_bytes;
          mc_warp_piece4_to(&sd, 1, 0, rec + soff, s->scale_bytes, lane, sv);
        }
      }
    }
    if (lane == 0) mc_trace_after(&a, MC_TK_DRECV, 7, (uint32_t)v[0].x); /* the item's stores issued */
    if (j0 == 0 && g == 0) {
      mc_route_entry_t *r = (mc_route_entry_t *)(a.ws + mc_ws_route_off(s, i));
      if (here) r->targets[__popc(km & mc_lanemask_lt())] = mc_target_t{l, slot, tg.weight};
      if (lane == 0) {
        r->src_rank = src;
        r->token = h->token;
        r->n_targets = n;
      }
    }
  }
  if (mover) mc_drecv_move_on(a, 0, round, call, seen, prefix);
  mc_trace_point(&a, MC_TK_DRECV, 2);
  /* traced: the end stamp once this block's stores are performed, which
   * the kernel's end waits for */
  if (a.trace) __threadfence();
  mc_trace_end(&a, MC_TK_DRECV);
}
/* Dispatch-recv starts before dispatch-send has finished where it is
 * launched early (mc_gpu_launch.cuh; dispatch-send lets it start once
 * every block has prepped, or at the start of a decode call's one-warp
 * prep): it takes the round and the call's number from
 * its own counts, waits for the call's outcome (MC_WS_OUTCOME), which
 * dispatch-send writes once it has checked the input, beside the metas
 * (mc_drecv_metas), and waits for its sender to finish only at its end,
 * so that later work on the stream comes after both. A refused call is
 * over for it too: its call count moves on, its round count does not. */
/* The round a call of dispatch-recv takes in if accepted, and the call's number. */
MC_DEV uint64_t mc_drecv_round(const mc_kargs_t &a) { return *(volatile uint64_t *)mc_ws_scalar64(&a, MC_WS_DRECV_ROUND) + 1; }
MC_DEV uint64_t mc_drecv_call(const mc_kargs_t &a) { return *(volatile uint64_t *)mc_ws_scalar64(&a, MC_WS_DRECV_TRIES) + 1; }
MC_DEV void mc_dispatch_recv_kernel(const mc_kargs_t &a, const int masking) {
  mc_trace_start(&a, MC_TK_DRECV); /* the kernel's start, before its first loads */
  const mc_drecv_pre_t pre = mc_drecv_prefetch(a);
  const uint64_t round = mc_drecv_round(a), call = mc_drecv_call(a);
  mc_dispatch_recv_body(a, masking, round, call, pre);
  mc_pdl_wait();
}

/* A refused call whose dispatch-recv never ran (the caller learnt of the
 * refusal first): dispatch-recv's call count moves past it, as that kernel
 * would have moved it (where the counts agree already, this changes
 * nothing: a CUDA graph that captured it replays safely). */
MC_DEV void mc_drecv_skip(const mc_kargs_t &a) {
  *mc_ws_scalar64(&a, MC_WS_DRECV_TRIES) = *mc_ws_scalar64(&a, MC_WS_SEND_TRIES);
}

#endif
