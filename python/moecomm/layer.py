"""MoELayer: one MoE layer's token exchange around the caller's experts, in
torch: router top-k in, combined output out.

    layer = moecomm.MoELayer(comm, max_tokens=128, num_experts=256, experts_per_token=8, hidden=7168)
    out = layer(x, topk_ids, topk_weights, experts)   # out[m][hidden]

`experts(expert_x, expert_count, expert_x_scale)` is the caller's grouped
computation on the batched layout: expert_x [L][capacity][hidden] (slots
past expert_count[l] hold stale data and may be computed on or not),
expert_count int32 [L]; it returns expert_y [L][capacity][hidden] in the
layer's y_dtype. Every buffer is allocated once, at construction, on the
communicator's device (CPU tensors on the cpu transport), and a call does
no host synchronisation: a call can be captured in a CUDA graph and
replayed (pass a one-element int32 `bound_m` tensor for a batch that varies
between replays). topk_ids are taken as torch.topk returns them (int64) with
no conversion; index_dtype=torch.int32 takes int32 instead.

Prefill: with prefill_tokens > max_tokens the layer holds a second handle,
of the expert-sorted layout, and a call of more than max_tokens tokens (up
to prefill_tokens) goes through it: its receive buffers are sized by the
rows that arrive (the count step synchronises the host: not for CUDA
graphs), where the batched layout's would hold every expert's worst case.
`grouped_experts(rows)` then gets a namespace of tensors: x [rows][hidden]
(one row per (token, local expert), each expert's rows from
expert_offset[l], a multiple of expert_align; padding rows after each
expert's, their x not written), x_scale, row_expert [rows] (the row's local
expert, -1 on padding), row_weight, expert_count [L], expert_offset [L + 1],
rows; it returns y [rows][hidden] in y_dtype, what an m-grouped GEMM over
contiguous rows gives. Calls of up to max_tokens tokens keep the
batched layout.
"""
from types import SimpleNamespace

from .a2a import AllToAll
from .errors import invalid

_FLOAT_NAMES = {"torch.float32": "fp32", "torch.bfloat16": "bf16", "torch.float16": "fp16"}


class MoELayer:
    def __init__(self, comm, *, max_tokens, num_experts, experts_per_token, hidden, dtype=None, y_dtype=None,
                 out_dtype=None, scale_cols=0, index_dtype=None, prefill_tokens=0, expert_align=1):
        """dtype: the tokens' dtype (bf16 by default; a float8 dtype with
        scale_cols fp32 scales per token, e.g. hidden / 128, for block-scaled
        fp8). y_dtype: the experts' output dtype, also the dtype of rows on
        the wire back (bf16, fp16 or fp32; default: dtype when it is one of
        those, else bf16). out_dtype: the combined output's (default y_dtype).
        prefill_tokens (> max_tokens; 0: none): the most tokens a call past
        max_tokens may pass, through the expert-sorted layout, each local
        expert's rows aligned to expert_align (e.g. 128 for grouped GEMMs)."""
        import torch
        dtype = torch.bfloat16 if dtype is None else dtype
        if y_dtype is None:
            y_dtype = dtype if str(dtype) in _FLOAT_NAMES else torch.bfloat16
        out_dtype = y_dtype if out_dtype is None else out_dtype
        index_dtype = torch.int64 if index_dtype is None else index_dtype
        self.dtype, self.y_dtype, self.out_dtype, self.index_dtype = dtype, y_dtype, out_dtype, index_dtype
        self.hidden, self.max_tokens, self.scale_cols = int(hidden), int(max_tokens), int(scale_cols)
        elem = torch.empty((), dtype=dtype).element_size()
        gpu = comm.transport in ("nvshmem", "p2p")
        self.device = torch.device(f"cuda:{comm.device}") if gpu else torch.device("cpu")
        # The buffers first: a rank that cannot allocate them fails before the
        # collective create (its peers then time out there), never after it,
        # where undoing the create would be collective too (nvshmem frees
        # symmetric memory collectively) and could hang.
        L = int(num_experts) // max(1, comm.world_size)
        cap = comm.world_size // max(1, comm.group_size) * self.max_tokens
        self.expert_count = torch.zeros(L, dtype=torch.int32, device=self.device)
        self.expert_x = torch.empty(L, cap, self.hidden, dtype=dtype, device=self.device)
        self.expert_x_scale = (torch.empty(L, cap, self.scale_cols, dtype=torch.float32, device=self.device)
                               if self.scale_cols else None)
        self.prefill_tokens = int(prefill_tokens)
        if self.prefill_tokens and self.prefill_tokens <= self.max_tokens:
            raise invalid(f"prefill_tokens={prefill_tokens}: more than max_tokens={max_tokens}, or 0 for none")
        self.out = torch.empty(max(self.max_tokens, self.prefill_tokens), self.hidden, dtype=out_dtype,
                               device=self.device)
        kw = dict(num_experts=num_experts, experts_per_token=experts_per_token, hidden=hidden,
                  token_bytes=self.hidden * elem, scale_bytes=4 * self.scale_cols, combine_in_dtype=y_dtype,
                  combine_out_dtype=out_dtype, index_dtype=index_dtype)
        self.a2a = AllToAll(comm, max_tokens=max_tokens, **kw)
        self.prefill = None
        if self.prefill_tokens:  # collective, after the first: every rank creates both in the same order
            try:
                self.prefill = AllToAll(comm, max_tokens=self.prefill_tokens, recv_layout="expert_sorted",
                                        expert_align=expert_align, **kw)
            except BaseException:
                self.a2a.__exit__(None, None, None)
                raise
        # the same arithmetic on every rank: a difference is a bug here, seen alike by all
        assert (self.a2a.num_local_experts, self.a2a.expert_capacity) == (L, cap), "layout of mc_a2a_create"
        self.num_local_experts, self.expert_capacity = L, cap

    def __call__(self, x, topk_ids, topk_weights, experts, *, x_scale=None, bound_m=None, stream=None,
                 grouped_experts=None):
        """x [m][hidden] (m <= max_tokens, or <= prefill_tokens with
        grouped_experts), x_scale [m][scale_cols] fp32 where the layer has
        scales, topk_ids [m][k] (index_dtype), topk_weights [m][k] fp32.
        Returns out[:m] (rows past bound_m, if given, are not written): a
        view of the layer's output buffer, which the next call overwrites.
        A call of more than max_tokens tokens takes the expert-sorted layout
        and grouped_experts (see the module's text); `experts` is not called."""
        if x.shape[0] > self.max_tokens:
            return self._prefill(x, topk_ids, topk_weights, grouped_experts, x_scale, bound_m, stream)
        a = self.a2a
        a.dispatch(self.expert_count, self.expert_x, self.expert_x_scale, x, x_scale, topk_ids, bound_m,
                   weights=topk_weights, stream=stream)
        y = experts(self.expert_x, self.expert_count, self.expert_x_scale)
        a.combine(self.out, y, stream=stream)
        return self.out[: x.shape[0]]

    def _prefill(self, x, topk_ids, topk_weights, grouped_experts, x_scale, bound_m, stream):
        import torch
        m = x.shape[0]
        if self.prefill is None or m > self.prefill_tokens:
            raise invalid(f"x has {m} tokens, more than max_tokens={self.max_tokens}"
                          + (f" and prefill_tokens={self.prefill_tokens}" if self.prefill else
                             ": pass prefill_tokens to the layer for longer calls"))
        if grouped_experts is None:
            raise invalid(f"x has {m} tokens, more than max_tokens={self.max_tokens}: such a call takes the "
                          "expert-sorted layout, and grouped_experts(rows) computes the experts on it")
        p = self.prefill
        recv = p.dispatch_packed(x, x_scale, topk_ids, weights=topk_weights, bound_m=bound_m,
                                 x_dtype=x.dtype if x.is_cuda else None, stream=stream)

        def as_torch(a, dtype=None):  # the cpu transport's arrays are numpy: the same memory as torch tensors
            t = a if isinstance(a, torch.Tensor) else torch.from_numpy(a)
            return t if dtype is None else t.view(dtype)

        rows = SimpleNamespace(x=as_torch(recv.x, self.dtype), rows=recv.rows,
                               x_scale=None if recv.x_scale is None else as_torch(recv.x_scale),
                               row_expert=as_torch(recv.row_expert), row_weight=as_torch(recv.row_weight),
                               expert_count=as_torch(recv.expert_count), expert_offset=as_torch(recv.expert_offset))
        y = grouped_experts(rows)
        p.combine(self.out, y, stream=stream)
        return self.out[:m]

    def destroy(self):
        """Collective: every rank, after its last call (a barrier, then the
        handles' buffers go; see AllToAll)."""
        self.__exit__(None, None, None)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        try:
            if self.prefill is not None:
                self.prefill.__exit__(*exc)
        finally:
            self.a2a.__exit__(*exc)
