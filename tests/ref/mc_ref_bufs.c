/* mc_ref_bufs.c - a rank's memory in the harness: host buffers for the
 * checks, and (GPU transports) device mirrors the library reads and writes,
 * with the uploads and downloads between them. */
#include <stdlib.h>
#include <string.h>

#include "mc_dtype.h"
#include "mc_ref_dev.h"
#include "mc_ref_rank.h"

void mc_rr_free_bufs(bufs_t *b, int groups) {
  free(b->x), free(b->xs), free(b->y), free(b->out), free(b->count), free(b->ref_count);
  free(b->src_g), free(b->src_t), free(b->ref_out), free(b->ideal), free(b->absum);
  for (int g = 0; b->ins && g < groups; g++)
    mc_ref_input_free(&b->ins[g]);
  free(b->ins);
}

static void *xmalloc(size_t n) { return malloc(n ? n : 1); }

int mc_rr_alloc_bufs(const mc_case_t *c, bufs_t *b) {
  size_t L = (size_t)mc_ref_local_experts(c), cap = (size_t)mc_ref_capacity(c), M = (size_t)c->max_tokens;
  size_t in_sz = mc_dtype_size(c->in_dtype), out_sz = mc_dtype_size(c->out_dtype), H = (size_t)c->hidden;
  memset(b, 0, sizeof *b);
  /* aligned_alloc gives the 16-byte alignment the API asks for */
  b->x = aligned_alloc(64, mc_align_up(L * cap * c->token_bytes, 64) + 64);
  b->xs = c->scale_bytes ? aligned_alloc(64, mc_align_up(L * cap * c->scale_bytes, 64) + 64) : NULL;
  b->y = aligned_alloc(64, mc_align_up(L * cap * H * in_sz, 64) + 64);
  b->out = aligned_alloc(64, mc_align_up(M * H * out_sz, 64) + 64);
  b->count = xmalloc(L * sizeof(int32_t));
  b->ref_count = xmalloc(L * sizeof(int32_t));
  b->src_g = xmalloc(L * cap * sizeof(int32_t));
  b->src_t = xmalloc(L * cap * sizeof(int32_t));
  b->ref_out = xmalloc(M * H * out_sz);
  b->ideal = xmalloc(M * H * sizeof(double));
  b->absum = xmalloc(M * H * sizeof(double));
  b->ins = calloc((size_t)mc_ref_num_groups(c), sizeof(mc_input_t));
  return b->x && (b->xs || !c->scale_bytes) && b->y && b->out && b->count && b->ref_count && b->src_g && b->src_t &&
                 b->ref_out && b->ideal && b->absum && b->ins
             ? 0
             : -1;
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
  void *all[] = {d->tokens, d->scales, d->indices, d->weights, d->bound,  d->x,
                 d->xs,     d->count,  d->y,       d->out,     d->scratch};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
    mc_dev_free(1, all[i]);
  (void)b;
}

int mc_rr_alloc_dbufs(const mc_case_t *c, int gpu, int ids64, bufs_t *b, dbufs_t *d) {
  size_t L = (size_t)mc_ref_local_experts(c), cap = (size_t)mc_ref_capacity(c), M = (size_t)c->max_tokens;
  size_t H = (size_t)c->hidden, K = (size_t)c->topk;
  memset(d, 0, sizeof *d);
  d->gpu = gpu;
  d->ids64 = ids64;
  if (ids64 && !(d->wide = malloc(M * K * sizeof(int64_t)))) return -1;
  if (c->quant && (!(d->qx = mc_dev_alloc(gpu, M * c->token_bytes)) || !(d->qxs = mc_dev_alloc(gpu, M * c->scale_bytes))))
    return -1;
  if (!gpu) { /* the library reads and writes the host buffers directly */
    d->x = b->x, d->xs = b->xs, d->count = b->count, d->y = b->y, d->out = b->out;
    return 0;
  }
  d->tokens = mc_dev_alloc(1, M * mc_ref_in_row_bytes(c));
  d->scales = c->scale_bytes && !c->quant ? mc_dev_alloc(1, M * c->scale_bytes) : NULL; /* quantising: made by dispatch */
  d->indices = mc_dev_alloc(1, M * K * (ids64 ? 8 : 4));
  d->weights = mc_dev_alloc(1, M * K * 4);
  d->bound = mc_dev_alloc(1, 4);
  d->x = mc_dev_alloc(1, L * cap * c->token_bytes);
  d->xs = c->scale_bytes ? mc_dev_alloc(1, L * cap * c->scale_bytes) : NULL;
  d->count = mc_dev_alloc(1, L * 4);
  d->y = mc_dev_alloc(1, L * cap * H * mc_dtype_size(c->in_dtype));
  d->out = mc_dev_alloc(1, M * H * mc_dtype_size(c->out_dtype));
  d->scratch = mc_dev_alloc(1, 16u << 20);
  return d->tokens && (d->scales || !c->scale_bytes || c->quant) && d->indices && d->weights && d->bound && d->x &&
                 (d->xs || !c->scale_bytes) && d->count && d->y && d->out && d->scratch
             ? 0
             : -1;
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
