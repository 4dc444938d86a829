/* mc_gpu_table.cuh - every kernel of a GPU transport, one row each, and
 * what is made from the rows: the entry points, the list loaded at create
 * (mc_gpu_launch.cuh) and the launch choice among a half's variants. Each
 * transport's .cu includes it after the kernels' bodies (mc_gpu_kernels.cuh,
 * mc_gpu_dispatch_recv.cuh, mc_gpu_packed.cuh, mc_gpu_combine.cuh).
 *
 * A variant is a kernel of its own, not a branch inside one: a kernel's
 * code costs its every launch, so the quantising send (thousands of
 * instructions), the masked paths (the only ones that drop a rank), the
 * per-top-k one-launch sends (with K a constant the prep's per-k loops
 * shrink to K instead of the generic 16 x 16) and the combine kernels per
 * dtype cost the others nothing. Each SM fetches a kernel's code at its
 * launch, and a jump to code not yet fetched waits for it (mc-probe's
 * jump rows): with a branch per dtype inside one kernel, the common
 * dtype's body sat tens of KB past the kernel's start, and ncu found most
 * of combine's warps waiting for instructions.
 *
 * X(name, bounds, role, masked, quant, K, cin, cout, body): the kernel
 * runs body with its argument block a; role (mc_kernel_role_t) and the
 * selectors are what the launch choice matches: masked 0 or 1, quant 0, 1
 * or -1 (either), K the top-k it is specialised for or 0 (any), cin and
 * cout combine's wire and output dtypes or -1 (any). Rows of a role come
 * specialised first. */
#ifndef MC_GPU_TABLE_CUH
#define MC_GPU_TABLE_CUH

#include "mc_gpu_combine.cuh"
#include "mc_gpu_dispatch_recv.cuh"
#include "mc_gpu_host.h"
#include "mc_gpu_kernels.cuh"
#include "mc_gpu_packed.cuh"

#define MC_LB_WIDE __launch_bounds__(MC_THREADS)
/* one block an SM, said outright: left to itself ptxas holds dispatch-recv
 * to 64 registers (two blocks an SM, which its grid never uses) and spills
 * in the copy loop */
#define MC_LB_DRECV __launch_bounds__(MC_THREADS, 1)
#define MC_LB_PREP __launch_bounds__(MC_PREP_THREADS)
#define MC_LB_CSEND __launch_bounds__(MC_CSEND_THREADS, 2)
#define MC_LB_NONE

/* combine's rows, plain and masked, for one wire dtype dt (cin: dt, or -1
 * where the row takes every other dtype too) or one (in, out) pair */
#define MC_CSEND_KERNELS(X, tag, dt, cin)                                                                              \
  X(mc_k_combine_send_##tag, MC_LB_CSEND, MC_KR_CSEND, 0, -1, 0, cin, -1, mc_combine_send_kernel(a, 0, dt))            \
  X(mc_k_combine_send_##tag##_masked, MC_LB_CSEND, MC_KR_CSEND, 1, -1, 0, cin, -1, mc_combine_send_kernel(a, 1, dt))
#define MC_CRECV_KERNELS(X, tag, in, out)                                                                              \
  X(mc_k_combine_recv_##tag, MC_LB_WIDE, MC_KR_CRECV, 0, -1, 0, in, out, mc_combine_recv_kernel(a, 0, in, out))        \
  X(mc_k_combine_recv_##tag##_masked, MC_LB_WIDE, MC_KR_CRECV, 1, -1, 0, in, out, mc_combine_recv_kernel(a, 1, in, out))

#define MC_GPU_KERNELS(X)                                                                                              \
  /* chunked dispatch-send: a prep block per chunk, each chunk's bases added, payloads staged, pieces sent */          \
  X(mc_k_dispatch_prep, MC_LB_PREP, MC_KR_PREP, 0, -1, 0, -1, -1,                                                      \
    mc_dispatch_prep(a, 0, MC_PREP_CHUNKS, *mc_ws_round(&a) + 1))                                                      \
  X(mc_k_dispatch_prep_masked, MC_LB_PREP, MC_KR_PREP, 1, -1, 0, -1, -1,                                               \
    mc_dispatch_prep(a, 1, MC_PREP_CHUNKS, *mc_ws_round(&a) + 1))                                                      \
  X(mc_k_dispatch_prep_fix, MC_LB_PREP, MC_KR_ONLY, 0, -1, 0, -1, -1, mc_dispatch_prep_fix(a))                         \
  X(mc_k_dispatch_pack, MC_LB_WIDE, MC_KR_ONLY, 0, -1, 0, -1, -1, mc_dispatch_pack(a))                                 \
  X(mc_k_dispatch_send, MC_LB_WIDE, MC_KR_SEND, 0, 0, 0, -1, -1, mc_dispatch_send_body(a, 0, 0))                       \
  X(mc_k_dispatch_send_q, MC_LB_WIDE, MC_KR_SEND, 0, 1, 0, -1, -1, mc_dispatch_send_body(a, 0, 1))                     \
  X(mc_k_dispatch_send_masked, MC_LB_WIDE, MC_KR_SEND, 1, 0, 0, -1, -1, mc_dispatch_send_body(a, 1, 0))                \
  X(mc_k_dispatch_send_q_masked, MC_LB_WIDE, MC_KR_SEND, 1, 1, 0, -1, -1, mc_dispatch_send_body(a, 1, 1))              \
  /* dispatch-send in one launch (no rank masked), per top-k */                                                        \
  X(mc_k_dispatch_send_one_k8, MC_LB_WIDE, MC_KR_SEND_ONE, 0, 0, 8, -1, -1, mc_dispatch_send_one_body(a, 8, 0))        \
  X(mc_k_dispatch_send_one_k6, MC_LB_WIDE, MC_KR_SEND_ONE, 0, 0, 6, -1, -1, mc_dispatch_send_one_body(a, 6, 0))        \
  X(mc_k_dispatch_send_one_k4, MC_LB_WIDE, MC_KR_SEND_ONE, 0, 0, 4, -1, -1, mc_dispatch_send_one_body(a, 4, 0))        \
  X(mc_k_dispatch_send_one_k2, MC_LB_WIDE, MC_KR_SEND_ONE, 0, 0, 2, -1, -1, mc_dispatch_send_one_body(a, 2, 0))        \
  X(mc_k_dispatch_send_one_kn, MC_LB_WIDE, MC_KR_SEND_ONE, 0, 0, 0, -1, -1, mc_dispatch_send_one_body(a, a.s.topk, 0)) \
  X(mc_k_dispatch_send_one_q8, MC_LB_WIDE, MC_KR_SEND_ONE, 0, 1, 8, -1, -1, mc_dispatch_send_one_body(a, 8, 1))        \
  X(mc_k_dispatch_send_one_qn, MC_LB_WIDE, MC_KR_SEND_ONE, 0, 1, 0, -1, -1, mc_dispatch_send_one_body(a, a.s.topk, 1)) \
  /* dispatch-recv: batched, packed layouts; a refused call's skipped one; a reported drop's mark cleared */           \
  X(mc_k_dispatch_recv, MC_LB_DRECV, MC_KR_DRECV, 0, -1, 0, -1, -1, mc_dispatch_recv_kernel(a, 0))                     \
  X(mc_k_dispatch_recv_masked, MC_LB_DRECV, MC_KR_DRECV, 1, -1, 0, -1, -1, mc_dispatch_recv_kernel(a, 1))              \
  X(mc_k_dispatch_recv_packed, MC_LB_WIDE, MC_KR_DRECV_PACKED, 0, -1, 0, -1, -1, mc_dispatch_recv_packed_kernel(a, 0)) \
  X(mc_k_dispatch_recv_packed_masked, MC_LB_WIDE, MC_KR_DRECV_PACKED, 1, -1, 0, -1, -1,                                \
    mc_dispatch_recv_packed_kernel(a, 1))                                                                              \
  X(mc_k_dispatch_counts, MC_LB_WIDE, MC_KR_ONLY, 0, -1, 0, -1, -1, mc_counts_kernel(a))                               \
  X(mc_k_drecv_skip, MC_LB_NONE, MC_KR_ONLY, 0, -1, 0, -1, -1, mc_drecv_skip(a))                                       \
  X(mc_k_drop_ack, MC_LB_NONE, MC_KR_ONLY, 0, -1, 0, -1, -1, mc_drop_ack(a))                                           \
  /* combine: a kernel per wire dtype, and per (wire, output) pair for the common ones */                              \
  MC_CSEND_KERNELS(X, bf16, MC_DTYPE_BF16, MC_DTYPE_BF16)                                                              \
  MC_CSEND_KERNELS(X, fp16, MC_DTYPE_FP16, MC_DTYPE_FP16)                                                              \
  MC_CSEND_KERNELS(X, fp32, MC_DTYPE_FP32, -1)                                                                         \
  MC_CRECV_KERNELS(X, bf16_bf16, MC_DTYPE_BF16, MC_DTYPE_BF16)                                                         \
  MC_CRECV_KERNELS(X, bf16_fp32, MC_DTYPE_BF16, MC_DTYPE_FP32)                                                         \
  MC_CRECV_KERNELS(X, fp16_fp16, MC_DTYPE_FP16, MC_DTYPE_FP16)                                                         \
  MC_CRECV_KERNELS(X, fp16_fp32, MC_DTYPE_FP16, MC_DTYPE_FP32)                                                         \
  MC_CRECV_KERNELS(X, fp32_fp32, MC_DTYPE_FP32, MC_DTYPE_FP32)                                                         \
  X(mc_k_combine_recv_any, MC_LB_WIDE, MC_KR_CRECV, 0, -1, 0, -1, -1,                                                  \
    mc_combine_recv_kernel(a, 0, a.in_dtype, a.out_dtype))                                                             \
  X(mc_k_combine_recv_any_masked, MC_LB_WIDE, MC_KR_CRECV, 1, -1, 0, -1, -1,                                           \
    mc_combine_recv_kernel(a, 1, a.in_dtype, a.out_dtype))                                                             \
  /* the launch floor's empty pair (mc_a2a_bench_floor), the barrier, the mask's agreement */                          \
  X(mc_k_floor_send, MC_LB_NONE, MC_KR_ONLY, 0, -1, 0, -1, -1, mc_pdl_launch_dependents())                             \
  X(mc_k_floor_recv, MC_LB_NONE, MC_KR_ONLY, 0, -1, 0, -1, -1, mc_pdl_wait())                                          \
  X(mc_k_barrier, MC_LB_WIDE, MC_KR_ONLY, 0, -1, 0, -1, -1, mc_barrier_kernel(a))                                      \
  X(mc_k_mask, MC_LB_NONE, MC_KR_ONLY, 0, -1, 0, -1, -1, mc_mask_kernel(a))

/* the entry points */
#define MC_GPU_ENTRY(name, bounds, role, masked, quant, K, cin, cout, body)                                            \
  static __global__ void bounds name(mc_kargs_t a) { body; }
MC_GPU_KERNELS(MC_GPU_ENTRY)
#undef MC_GPU_ENTRY

/* the rows as the host sees them */
typedef struct mc_kernel_row {
  const void *fn;
  int role, masked, quant, K, cin, cout;
} mc_kernel_row_t;
#define MC_GPU_ROW(name, bounds, role, masked, quant, K, cin, cout, body)                                              \
  {(const void *)name, role, masked, quant, K, cin, cout},
static const mc_kernel_row_t mc_kernel_rows[] = {MC_GPU_KERNELS(MC_GPU_ROW)};
#undef MC_GPU_ROW
static const int mc_kernel_nrows = (int)(sizeof mc_kernel_rows / sizeof mc_kernel_rows[0]);

/* The launch choice: the first row of role for these selectors (NULL: the
 * role has no such variant, e.g. a masked one-launch send). */
static const void *mc_kernel_pick(int role, int masked, int quant, int topk, int cin, int cout) {
  for (int i = 0; i < mc_kernel_nrows; i++) {
    const mc_kernel_row_t *r = &mc_kernel_rows[i];
    if (r->role == role && r->masked == masked && (r->quant < 0 || r->quant == quant) && (r->K == 0 || r->K == topk) &&
        (r->cin < 0 || r->cin == cin) && (r->cout < 0 || r->cout == cout))
      return r->fn;
  }
  return NULL;
}

#endif
