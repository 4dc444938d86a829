/* mc_ref_bufs.c - a rank's memory in the harness: host buffers for the
 * checks, and (GPU transports) device mirrors the library reads and writes,
 * with the uploads and downloads between them.
 *
 * expert_x, expert_scale and expert_y are as large as the API sizes them
 * (local experts x num_groups x max_tokens slots: 22.5 GB a rank at the
 * DeepSeek-V3 shape, 8 ranks, 4096 tokens), but a round fills only each
 * expert's count of slots. The harness touches those and a band of
 * POISON_BAND past them, nothing else: pages of a host allocation that are
 * never written take no memory, and a GPU transport's transfers are per
 * expert. */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "mc_dtype.h"
#include "mc_layout.h"
#include "mc_ref_dev.h"
#include "mc_ref_rank.h"

void mc_rr_free_bufs(bufs_t *b, int groups) {
  free(b->x), free(b->xs), free(b->y), free(b->out), free(b->count), free(b->ref_count);
  free(b->src_g), free(b->src_t), free(b->ref_out), free(b->ideal), free(b->absum);
  for (int g = 0; b->ins && g < groups; g++)
    mc_ref_input_free(&b->ins[g]);
  free(b->ins);
  mc_rr_packed_free(b);
}

static void *xmalloc(size_t n) { return malloc(n ? n : 1); }

/* The whole pages inside [p, p + n) (outward: round_out) into [*a, *e). */
static void page_span(const void *p, size_t n, int round_out, uintptr_t *a, uintptr_t *e) {
  const uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE), in = round_out ? 0 : pg - 1, out = round_out ? pg - 1 : 0;
  *a = ((uintptr_t)p + in) & ~(pg - 1);
  *e = ((uintptr_t)p + n + out) & ~(pg - 1);
}

/* A buffer of slots (expert_x, expert_scale, expert_y, out): aligned as the
 * API asks, and kept out of transparent huge pages, so that what a round
 * leaves untouched stays out of memory page by page (a huge page would
 * bring in 2 MB around a few rows written). */
static uint8_t *slots_alloc(size_t n) {
  uint8_t *p = aligned_alloc(64, mc_align_up(n, 64) + 64);
  uintptr_t a, e;
  page_span(p, n, 0, &a, &e);
  if (p && e > a) (void)madvise((void *)a, e - a, MADV_NOHUGEPAGE); /* advice: refused where THP is not built */
  return p;
}

int mc_rr_alloc_bufs(const mc_case_t *c, bufs_t *b) {
  size_t L = (size_t)mc_ref_local_experts(c), cap = (size_t)mc_ref_capacity(c), M = (size_t)c->max_tokens;
  size_t in_sz = mc_dtype_size(c->in_dtype), out_sz = mc_dtype_size(c->out_dtype), H = (size_t)c->hidden;
  memset(b, 0, sizeof *b);
  b->x = slots_alloc(L * cap * c->token_bytes);
  b->xs = c->scale_bytes ? slots_alloc(L * cap * c->scale_bytes) : NULL;
  b->y = slots_alloc(L * cap * H * in_sz);
  b->out = slots_alloc(M * H * out_sz);
  b->count = xmalloc(L * sizeof(int32_t));
  b->ref_count = xmalloc(L * sizeof(int32_t));
  b->src_g = xmalloc(L * cap * sizeof(int32_t));
  b->src_t = xmalloc(L * cap * sizeof(int32_t));
  b->ref_out = xmalloc(CHECK_ROWS * H * out_sz);
  b->ideal = xmalloc(CHECK_ROWS * H * sizeof(double));
  b->absum = xmalloc(CHECK_ROWS * H * sizeof(double));
  b->ins = calloc((size_t)mc_ref_num_groups(c), sizeof(mc_input_t));
  if (c->layout != MC_LAYOUT_BATCHED && mc_rr_packed_alloc(c, b) != 0) return -1;
  return b->x && (b->xs || !c->scale_bytes) && b->y && b->out && b->count && b->ref_count && b->src_g && b->src_t &&
                 b->ref_out && b->ideal && b->absum && b->ins
             ? 0
             : -1;
}

/* Slots of an expert a round may touch: its count, clamped to the
 * capacity, and the poisoned band past it. */
static size_t band_end(int count, int cap) {
  const int n = count < 0 ? 0 : count > cap ? cap : count;
  return (size_t)(n + POISON_BAND < cap ? n + POISON_BAND : cap);
}

/* Before a checked round: the reference dispatch of the round's inputs
 * (every group's, drawn already) into ref_count, src_g and src_t, and poison
 * where the round writes and where it must not: per expert the slots it
 * will fill and the band past them in expert_x and expert_scale (a slot left
 * unwritten keeps the poison and fails the check), the band alone in
 * expert_y (the experts fill the rest; a combine that reads past the count
 * reads NaN), every row of out, the counts. 0, or -1 where a fill failed. */
int mc_rr_poison_outputs(const mc_case_t *c, bufs_t *b, dbufs_t *d, int rank) {
  const int L = mc_ref_local_experts(c), cap = mc_ref_capacity(c);
  const size_t yrow = (size_t)c->hidden * mc_dtype_size(c->in_dtype);
  mc_ref_dispatch(c, b->ins, rank, b->ref_count, b->src_g, b->src_t);
  int bad = 0;
  /* the packed layouts: their rows, poisoned (and uploaded); the batched
   * slots they are unpacked into for the checks are the harness's own */
  const int packed = c->layout != MC_LAYOUT_BATCHED, sg = packed ? 0 : d->gpu;
  if (packed) bad |= mc_rr_packed_poison(c, b, d);
  uint8_t *x = packed ? b->x : d->x, *xs = packed ? b->xs : d->xs;
  for (int l = 0; l < L; l++) {
    const size_t at = (size_t)l * cap, n = (size_t)b->ref_count[l], end = band_end(b->ref_count[l], cap);
    bad |= mc_dev_fill(sg, x + at * c->token_bytes, POISON_X, end * c->token_bytes);
    if (xs) bad |= mc_dev_fill(sg, xs + at * c->scale_bytes, POISON_X, end * c->scale_bytes);
    if (!packed) bad |= mc_dev_fill(sg, (uint8_t *)d->y + (at + n) * yrow, POISON_OUT, (end - n) * yrow);
  }
  bad |= mc_dev_fill(d->gpu, d->out, POISON_OUT, (size_t)c->max_tokens * c->hidden * mc_dtype_size(c->out_dtype));
  bad |= mc_dev_fill(sg, packed ? (void *)b->count : d->count, 0xF9, (size_t)L * 4); /* -7ish */
  return bad ? -1 : 0;
}

/* After dispatch on a GPU transport: the counts, then per expert the slots
 * the count says were filled and the band past them (what the check reads),
 * into the host buffers. 0, or -1 where a copy failed. */
int mc_rr_get_dispatch_outputs(const mc_case_t *c, bufs_t *b, const dbufs_t *d) {
  const int L = mc_ref_local_experts(c), cap = mc_ref_capacity(c);
  if (!d->gpu) return 0; /* the library wrote the host buffers themselves */
  if (c->layout != MC_LAYOUT_BATCHED) return mc_rr_packed_get(c, b, d);
  if (mc_dev_get(1, b->count, d->count, (size_t)L * 4)) return -1;
  int bad = 0;
  for (int l = 0; l < L; l++) {
    const size_t at = (size_t)l * cap, end = band_end(b->count[l], cap);
    bad |= mc_dev_get(1, b->x + at * c->token_bytes, (const uint8_t *)d->x + at * c->token_bytes, end * c->token_bytes);
    if (d->xs)
      bad |= mc_dev_get(1, b->xs + at * c->scale_bytes, (const uint8_t *)d->xs + at * c->scale_bytes,
                        end * c->scale_bytes);
  }
  return bad ? -1 : 0;
}

/* Bytes of [p, p + n) in memory now (whole pages, by mincore). */
static uint64_t resident(const void *p, size_t n) {
  const uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
  uintptr_t a, e;
  if (!p || n == 0) return 0;
  page_span(p, n, 1, &a, &e);
  unsigned char *v = malloc((e - a) / pg);
  uint64_t in = 0;
  if (v && mincore((void *)a, e - a, v) == 0)
    for (size_t i = 0; i < (e - a) / pg; i++) in += v[i] & 1;
  free(v);
  return in * pg;
}

/* The host pages of expert_x, expert_scale and expert_y in memory: what the
 * library and the harness touched of them (a test bounds it). */
uint64_t mc_rr_resident_bytes(const mc_case_t *c, const bufs_t *b) {
  const size_t slots = (size_t)mc_ref_local_experts(c) * mc_ref_capacity(c);
  return resident(b->x, slots * c->token_bytes) + resident(b->xs, slots * c->scale_bytes) +
         resident(b->y, slots * c->hidden * mc_dtype_size(c->in_dtype));
}

/* The fake experts: y = f(expert, x) on every filled slot. */
void mc_rr_run_experts(const mc_case_t *c, bufs_t *b, int rank) {
  int L = mc_ref_local_experts(c), cap = mc_ref_capacity(c);
  size_t yrow = (size_t)c->hidden * mc_dtype_size(c->in_dtype);
  for (int l = 0; l < L; l++)
    for (int s = 0; s < b->count[l] && s < cap; s++)
      mc_ref_expert(c, rank * L + l, b->x + ((size_t)l * cap + s) * c->token_bytes,
                    b->y + ((size_t)l * cap + s) * yrow);
}

void mc_rr_free_dbufs(dbufs_t *d, const bufs_t *b) {
  free(d->wide);
  d->wide = NULL;
  mc_dev_free(d->gpu, d->qx);
  mc_dev_free(d->gpu, d->qxs);
  d->qx = d->qxs = NULL;
  if (!d->gpu) return; /* the rest: aliases of the host buffers */
  void *all[] = {d->tokens, d->scales, d->indices, d->weights, d->bound, d->x,   d->xs,   d->count,
                 d->y,      d->out,    d->scratch, d->px,      d->pxs,   d->py,  d->pre,  d->prw,
                 d->pcnt,   d->poff,   d->psrc,    d->prows};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
    mc_dev_free(1, all[i]);
  (void)b;
}

/* A rank's device buffers and their bytes: one list for the allocation and
 * for what a GPU must hold (mc_run_gpu_bytes). own: a buffer of its own on
 * the cpu transport too (there the rest are the host buffers). */
typedef struct dbuf {
  void **p;
  size_t n;
  int own;
} dbuf_t;
enum { DBUF_MAX = 18 };

static int dbuf_list(const mc_case_t *c, int ids64, dbufs_t *d, dbuf_t *l) {
  const size_t L = (size_t)mc_ref_local_experts(c), cap = (size_t)mc_ref_capacity(c), M = (size_t)c->max_tokens;
  const size_t H = (size_t)c->hidden, K = (size_t)c->topk;
  int n = 0;
  if (c->quant) { /* the e4m3 rows and scales of a quantisation apart from dispatch */
    l[n++] = (dbuf_t){&d->qx, M * c->token_bytes, 1};
    l[n++] = (dbuf_t){&d->qxs, M * c->scale_bytes, 1};
  }
  l[n++] = (dbuf_t){&d->tokens, M * mc_ref_in_row_bytes(c), 0};
  if (c->scale_bytes && !c->quant) l[n++] = (dbuf_t){&d->scales, M * c->scale_bytes, 0}; /* quantising: dispatch's */
  l[n++] = (dbuf_t){&d->indices, M * K * (ids64 ? 8 : 4), 0};
  l[n++] = (dbuf_t){&d->weights, M * K * 4, 0};
  l[n++] = (dbuf_t){&d->bound, 4, 0};
  if (c->layout != MC_LAYOUT_BATCHED) { /* the rows (as many as mc_rr_packed_alloc's), not the slots */
    const size_t rows = (size_t)(mc_rr_packed_max_rows(c) + POISON_BAND), cols = mc_rr_packed_cols(c);
    l[n++] = (dbuf_t){&d->px, rows * c->token_bytes, 0};
    if (c->scale_bytes) l[n++] = (dbuf_t){&d->pxs, rows * c->scale_bytes, 0};
    l[n++] = (dbuf_t){&d->py, rows * H * mc_dtype_size(c->in_dtype), 0};
    l[n++] = (dbuf_t){&d->pre, rows * cols * 4, 0};
    l[n++] = (dbuf_t){&d->prw, rows * cols * 4, 0};
    l[n++] = (dbuf_t){&d->pcnt, L * 4, 0};
    l[n++] = (dbuf_t){&d->poff, (L + 1) * 4, 0};
    l[n++] = (dbuf_t){&d->psrc, (size_t)c->world_size * 4, 0};
    l[n++] = (dbuf_t){&d->prows, 8, 0};
  } else {
    l[n++] = (dbuf_t){&d->x, L * cap * c->token_bytes, 0};
    if (c->scale_bytes) l[n++] = (dbuf_t){&d->xs, L * cap * c->scale_bytes, 0};
    l[n++] = (dbuf_t){&d->count, L * 4, 0};
    l[n++] = (dbuf_t){&d->y, L * cap * H * mc_dtype_size(c->in_dtype), 0};
  }
  l[n++] = (dbuf_t){&d->out, M * H * mc_dtype_size(c->out_dtype), 0};
  l[n++] = (dbuf_t){&d->scratch, 16u << 20, 0};
  return n;
}

int mc_rr_alloc_dbufs(const mc_case_t *c, int gpu, int ids64, bufs_t *b, dbufs_t *d) {
  memset(d, 0, sizeof *d);
  d->gpu = gpu;
  d->ids64 = ids64;
  if (ids64 && !(d->wide = malloc((size_t)c->max_tokens * c->topk * sizeof(int64_t)))) return -1;
  dbuf_t l[DBUF_MAX];
  const int n = dbuf_list(c, ids64, d, l);
  for (int i = 0; i < n; i++)
    if ((gpu || l[i].own) && !(*l[i].p = mc_dev_alloc(gpu, l[i].n))) return -1;
  if (!gpu) { /* the library reads and writes the host buffers directly */
    d->x = b->x, d->xs = b->xs, d->count = b->count, d->y = b->y, d->out = b->out;
    d->px = b->px, d->pxs = b->pxs, d->py = b->py, d->pre = b->pre, d->prw = b->prw, d->pcnt = b->pcnt;
    d->poff = b->poff, d->psrc = b->psrc, d->prows = &b->prows;
  }
  return 0;
}

uint64_t mc_run_gpu_bytes(const mc_case_t *c, const mc_run_opts_t *o, uint64_t *library) {
  dbufs_t d;
  dbuf_t l[DBUF_MAX];
  const int n = dbuf_list(c, o->ids64, &d, l);
  uint64_t mine = 0;
  for (int i = 0; i < n; i++) mine += l[i].n;
  const mc_shape_t sh = mc_shape_make(c->world_size, c->group_size, c->num_experts, c->topk, c->max_tokens, c->hidden,
                                      c->token_bytes, c->scale_bytes, mc_dtype_size(c->in_dtype), c->layout,
                                      c->expert_align > 0 ? c->expert_align : 1);
  const int handles = o->handles > 0 ? (o->handles < 64 ? o->handles : 64) : 1; /* as mc_run makes them */
  *library = (mc_window_bytes(&sh) + mc_workspace_bytes(&sh)) * (uint64_t)handles;
  return mine + *library;
}

int mc_rr_upload_inputs(const mc_case_t *c, const mc_input_t *in, dbufs_t *d, call_in_t *ci) {
  size_t m = (size_t)in->m, K = (size_t)c->topk;
  /* int64 ids: the same values widened, as torch.topk hands them over */
  for (size_t i = 0; d->ids64 && i < m * K; i++) d->wide[i] = in->indices[i];
  const void *ids = d->ids64 ? (const void *)d->wide : (const void *)in->indices;
  if (!d->gpu) {
    *ci = (call_in_t){in->raw, c->quant ? NULL : in->scales, ids, in->weights, in->has_bound ? &in->bound_m : NULL};
    return 0;
  }
  int bad = mc_dev_put(1, d->tokens, in->raw, m * mc_ref_in_row_bytes(c));
  if (d->scales) bad |= mc_dev_put(1, d->scales, in->scales, m * c->scale_bytes);
  bad |= mc_dev_put(1, d->indices, ids, m * K * (d->ids64 ? 8 : 4));
  if (in->weights) bad |= mc_dev_put(1, d->weights, in->weights, m * K * 4);
  if (in->has_bound) bad |= mc_dev_put(1, d->bound, &in->bound_m, 4);
  *ci = (call_in_t){d->tokens, d->scales, d->indices, in->weights ? d->weights : NULL, in->has_bound ? d->bound : NULL};
  return bad;
}

/* Fake experts on the host over the downloaded slots; upload the rows. */
int mc_rr_experts_roundtrip(const mc_case_t *c, bufs_t *b, dbufs_t *d, int rank) {
  int L = mc_ref_local_experts(c), cap = mc_ref_capacity(c);
  size_t yrow = (size_t)c->hidden * mc_dtype_size(c->in_dtype);
  mc_rr_run_experts(c, b, rank);
  int bad = 0;
  for (int l = 0; l < L && d->gpu; l++)
    if (b->count[l] > 0)
      bad |= mc_dev_put(1, (char *)d->y + (size_t)l * cap * yrow, b->y + (size_t)l * cap * yrow,
                        (size_t)b->count[l] * yrow);
  return bad;
}
