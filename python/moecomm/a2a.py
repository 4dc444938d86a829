"""AllToAll: mc_a2a_t, dispatch and combine over numpy arrays / torch CPU
tensors (cpu transport) or torch CUDA tensors (GPU transports)."""
import ctypes as C

import numpy as np

from . import _capi
from ._arrays import empty_aligned, itemsize, need_align, need_lead, need_row_bytes, need_tag, view
from .errors import check, invalid
from .packed import LAYOUTS, PackedBuffers, PackedRecv, as_int, dispatch_counted, dispatch_declared

lib = _capi.lib

DTYPES = {"fp32": _capi.DTYPE_FP32, "bf16": _capi.DTYPE_BF16, "fp16": _capi.DTYPE_FP16}
_ALIASES = {"float32": "fp32", "float": "fp32", "bfloat16": "bf16", "float16": "fp16", "half": "fp16",
            "torch.float32": "fp32", "torch.bfloat16": "bf16", "torch.float16": "fp16"}
# numpy storage of each dtype (bf16: raw bits in uint16)
NP_STORAGE = {"fp32": np.float32, "bf16": np.uint16, "fp16": np.float16}
INDEX_DTYPES = {"int32": _capi.INDEX_INT32, "int64": _capi.INDEX_INT64}
DISPATCH_INPUTS = {"bytes": _capi.INPUT_BYTES, "bf16_to_e4m3": _capi.INPUT_BF16_TO_E4M3}
SCALE_FORMATS = {"fp32": _capi.SCALE_FP32, "ue8m0": _capi.SCALE_UE8M0}


def index_dtype_name(d):
    """"int32" / "int64" from a name, a numpy dtype or a torch dtype."""
    s = d if isinstance(d, str) else (str(d) if type(d).__module__.startswith("torch") else np.dtype(d).name)
    s = s[len("torch."):] if s.startswith("torch.") else s
    if s not in INDEX_DTYPES:
        raise invalid(f"index_dtype={d!r}: expected int32 or int64")
    return s


def dtype_name(d, name):
    """"fp32" / "bf16" / "fp16" from a name, a numpy dtype or a torch dtype."""
    s = d if isinstance(d, str) else (str(d) if type(d).__module__.startswith("torch") else np.dtype(d).name)
    s = _ALIASES.get(s, s)
    if s not in DTYPES:
        raise invalid(f"{name}={d!r}: expected one of fp32, bf16, fp16")
    return s


_TORCH_OF = {}  # numpy dtype name -> torch dtype, filled on first GPU use


def _fill_torch_of():
    import torch
    _TORCH_OF.update({"uint8": torch.uint8, "int32": torch.int32, "int64": torch.int64, "float32": torch.float32,
                      "float16": torch.float16, "uint16": torch.bfloat16, "int8": torch.int8})


def _flags(do_send, do_recv):
    flags = (_capi.SEND if do_send else 0) | (_capi.RECV if do_recv else 0)
    if not flags:
        raise invalid("do_send and do_recv are both False: nothing to do")
    return flags


class AllToAll:
    """Dispatch/combine handle with its receive buffers (mc_a2a_create).
    Collective: every rank passes the same arguments. Use as a context
    manager (on a clean exit it runs comm.barrier() and then destroy(), since
    peers may still write into this rank's buffers until they finish; with
    ranks masked, a barrier of the ranks still in instead), or call
    comm.barrier() and destroy() yourself.

    recv_layout "batched" (default) receives with dispatch() into
    [L][expert_capacity] buffers; "packed" and "expert_sorted" receive with
    dispatch_packed() into rows sized by what arrives (docs/api.md, "The
    packed layouts"); expert_align: expert_sorted's row alignment of each
    expert, 1..1024 (1 for the other layouts)."""

    def __init__(self, comm, *, max_tokens, num_experts, experts_per_token, hidden,
                 token_bytes=None, scale_bytes=0, combine_in_dtype="bf16", combine_out_dtype="bf16",
                 index_dtype="int32", dispatch_input="bytes", scale_format="fp32", recv_layout="batched",
                 expert_align=1):
        self.comm, self._h = comm, None
        self.in_dtype = dtype_name(combine_in_dtype, "combine_in_dtype")
        self.out_dtype = dtype_name(combine_out_dtype, "combine_out_dtype")
        # int64: torch.topk's ids, read in place (no conversion kernel per call)
        self.index_dtype = index_dtype_name(index_dtype)
        if dispatch_input not in DISPATCH_INPUTS:
            raise invalid(f"dispatch_input={dispatch_input!r}: expected one of {', '.join(DISPATCH_INPUTS)}")
        if scale_format not in SCALE_FORMATS:
            raise invalid(f"scale_format={scale_format!r}: expected one of {', '.join(SCALE_FORMATS)}")
        if recv_layout not in LAYOUTS:
            raise invalid(f"recv_layout={recv_layout!r}: expected one of {', '.join(LAYOUTS)}")
        self.recv_layout = recv_layout
        # bf16_to_e4m3: dp_x holds bf16 rows, dispatch quantises them (a byte a
        # value, a scale per 128 values); the sizes follow unless given
        self.quantises = dispatch_input == "bf16_to_e4m3"
        if self.quantises:
            token_bytes = int(hidden) if token_bytes is None else token_bytes
            scale_bytes = scale_bytes or int(hidden) // 128 * (1 if scale_format == "ue8m0" else 4)
        if token_bytes is None:
            token_bytes = int(hidden) * np.dtype(NP_STORAGE[self.in_dtype]).itemsize
        cfg = _capi.a2a_config()
        cfg.max_tokens, cfg.num_experts, cfg.experts_per_token = int(max_tokens), int(num_experts), int(experts_per_token)
        cfg.token_bytes, cfg.scale_bytes, cfg.hidden = int(token_bytes), int(scale_bytes), int(hidden)
        cfg.combine_in_dtype, cfg.combine_out_dtype = DTYPES[self.in_dtype], DTYPES[self.out_dtype]
        cfg.index_dtype = INDEX_DTYPES[self.index_dtype]
        cfg.dispatch_input, cfg.scale_format = DISPATCH_INPUTS[dispatch_input], SCALE_FORMATS[scale_format]
        # the range (and 1 outside expert_sorted) is the library's rule, checked at create
        cfg.recv_layout, cfg.expert_align = LAYOUTS[recv_layout], as_int(expert_align, "expert_align")
        self._create(cfg)

    def _create(self, cfg):
        # GPU transports: every array is a torch CUDA tensor on the comm's device
        self._dev = self.comm.device if self.comm.transport in ("nvshmem", "p2p") else None
        h = C.c_void_p()
        check(lib.mc_a2a_create(self.comm.handle, C.byref(cfg), C.byref(h)), self.comm.last_error)
        self._h, self.config = h, cfg
        self.num_local_experts = lib.mc_a2a_num_local_experts(h)
        self.expert_capacity = lib.mc_a2a_expert_capacity(h)
        self._bound = C.c_int32(0)  # where an int bound_m is put: no allocation per call
        self._m = None              # rows of the last dispatch send half, for combine's check
        self._rows = None           # rows the last dispatch_packed received, for combine's check
        self._kept = None           # dispatch_packed's buffers of a declared capacity, reused

    # ---- accessors ----
    @property
    def handle(self):
        return self._h

    def last_error(self):
        return _capi.text(lib.mc_a2a_last_error(self._h))

    def check(self):
        """mc_a2a_check: raise a failure a GPU transport recorded (cpu: never)."""
        check(lib.mc_a2a_check(self._h), self.last_error)

    def get_stats(self):
        """mc_a2a_get_stats as a dict (rounds, records/rows/bytes sent, buffer_bytes)."""
        st = _capi.a2a_stats()
        check(lib.mc_a2a_get_stats(self._h, C.byref(st)), self.last_error)
        return {name: getattr(st, name) for name, _ in _capi.A2AStats._fields_ if name != "size"}

    def get_expert_load(self, reset=False):
        """mc_a2a_get_expert_load: tokens received per local expert, summed
        over the dispatches since create or the last reset (int64, one per
        local expert; a CPU torch tensor on a GPU transport, numpy on the
        cpu one). Synchronise the dispatches' stream first."""
        counts = np.zeros(self.num_local_experts, np.int64)
        check(lib.mc_a2a_get_expert_load(self._h, counts.ctypes.data, 1 if reset else 0), self.last_error)
        if self._dev is None:
            return counts
        import torch
        return torch.from_numpy(counts)

    def mask_ranks(self, mask):
        """mc_a2a_mask_ranks: leave the ranks where mask is true out of every
        later round (nothing sent to them or awaited from them; their
        experts drop out of each token's sum). Every rank the mask keeps
        calls it with the same mask, at a round's end or after a failed call
        (a timeout that named a dead rank); it waits for them and leaves the
        handle working. An all-false mask clears it. Groups of one rank."""
        m = np.ascontiguousarray(np.asarray(mask, dtype=bool).astype(np.uint8))
        if m.shape != (self.comm.world_size,):
            raise invalid(f"mask: {self.comm.world_size} values (one per rank), got shape {tuple(m.shape)}")
        check(lib.mc_a2a_mask_ranks(self._h, m.ctypes.data), self.last_error)

    def get_mask(self):
        """mc_a2a_get_mask: a bool numpy array, true where a rank is left out."""
        m = np.zeros(self.comm.world_size, np.uint8)
        check(lib.mc_a2a_get_mask(self._h, m.ctypes.data), self.last_error)
        return m.astype(bool)

    # ---- output allocation (once, not per call): numpy on the cpu
    # transport, torch CUDA tensors on the comm's device on a GPU one ----
    def _empty(self, shape, dtype, zero=False):
        if self._dev is None:
            return np.zeros(shape, dtype) if zero else empty_aligned(shape, dtype)
        import torch
        if not _TORCH_OF:
            _fill_torch_of()
        td = dtype if isinstance(dtype, torch.dtype) else _TORCH_OF[np.dtype(dtype).name]
        f = torch.zeros if zero else torch.empty
        return f(shape, dtype=td, device=f"cuda:{self._dev}")

    def alloc_expert_num_tokens(self):
        return self._empty((self.num_local_experts,), np.int32, zero=True)

    def alloc_expert_x(self, dtype=np.uint8):
        """[num_local_experts][expert_capacity][token_bytes / itemsize] of `dtype`."""
        n = self.config.token_bytes // itemsize(dtype)
        return self._empty((self.num_local_experts, self.expert_capacity, n), dtype)

    def alloc_expert_x_scale(self, dtype=None):
        """[num_local_experts][expert_capacity][scale_bytes / itemsize], or None
        without scales; dtype float32 (default), or uint8 for UE8M0 scales."""
        if self.config.scale_bytes == 0:
            return None
        if dtype is None:
            dtype = np.uint8 if self.config.scale_format == _capi.SCALE_UE8M0 else np.float32
        n = self.config.scale_bytes // itemsize(dtype)
        return self._empty((self.num_local_experts, self.expert_capacity, n), dtype)

    def alloc_expert_y(self):
        """[num_local_experts][expert_capacity][hidden] in combine_in_dtype (numpy storage on
        the cpu transport: bf16 as uint16 bits; the torch dtype on a GPU)."""
        return self._empty((self.num_local_experts, self.expert_capacity, self.config.hidden),
                           self._storage(self.in_dtype))

    def alloc_out_tokens(self, m=None):
        """[m or max_tokens][hidden] in combine_out_dtype (as alloc_expert_y)."""
        rows = self.config.max_tokens if m is None else int(m)
        return self._empty((rows, self.config.hidden), self._storage(self.out_dtype))

    def _storage(self, d):
        if self._dev is None:
            return NP_STORAGE[d]
        import torch
        return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[d]

    def _stream(self, stream):
        """The cudaStream_t to pass: the caller's (a torch.cuda.Stream or a raw
        handle), else torch's current stream on the comm's device."""
        if self._dev is None:
            if stream is not None:
                raise invalid("stream: only GPU transports take a stream")
            return None
        if stream is None:
            import torch
            stream = torch.cuda.current_stream(self._dev)
        return getattr(stream, "cuda_stream", stream) or None

    # ---- argument marshalling ----
    def _bound_ptr(self, bound_m):
        if bound_m is None:
            return None
        if isinstance(bound_m, (int, np.integer)):
            if self._dev is not None:
                raise invalid("bound_m: on a GPU transport pass a one-element int32 CUDA tensor "
                              "(the kernels read it on the device)")
            self._bound.value = int(bound_m)
            return C.addressof(self._bound)
        v = view(bound_m, "bound_m", device=self._dev)
        need_tag(v, "bound_m", "int32")
        if int(np.prod(v.shape)) != 1:
            raise invalid(f"bound_m: expected one int32 element, got shape {tuple(v.shape)}")
        return v.ptr

    def _send_args(self, dp_x, dp_x_scale, indices, weights):
        cfg = self.config
        iv = view(indices, "indices", device=self._dev)
        need_tag(iv, "indices", self.index_dtype)
        need_align(iv, "indices", iv.itemsize)
        if len(iv.shape) != 2 or iv.shape[1] != cfg.experts_per_token:
            raise invalid(f"indices: shape must be (m, {cfg.experts_per_token}), got {tuple(iv.shape)}")
        m = iv.shape[0]
        xv = view(dp_x, "dp_x", device=self._dev)
        need_lead(xv, "dp_x", (m,))
        if self.quantises:  # bf16 rows of hidden values; the scales are dispatch's to make
            need_row_bytes(xv, "dp_x", 1, 2 * cfg.hidden, "2 x hidden (bf16 values to quantise)")
            if dp_x_scale is not None:
                raise invalid("dp_x_scale: must be None: dispatch makes the scales when it quantises")
        else:
            need_row_bytes(xv, "dp_x", 1, cfg.token_bytes, "token_bytes")
        need_align(xv, "dp_x", 16)
        sp = None if self.quantises else self._scale_ptr(dp_x_scale, "dp_x_scale", (m,))
        wp = None
        if weights is not None:
            wv = view(weights, "weights", device=self._dev)
            need_tag(wv, "weights", "fp32")
            if tuple(wv.shape) != tuple(iv.shape):
                raise invalid(f"weights: shape must equal indices' {tuple(iv.shape)}, got {tuple(wv.shape)}")
            wp = wv.ptr
        return m, xv.ptr, sp, iv.ptr, wp

    def _scale_ptr(self, arr, name, lead):
        if self.config.scale_bytes == 0:
            if arr is not None:
                raise invalid(f"{name}: must be None when scale_bytes is 0")
            return None
        if arr is None:
            raise invalid(f"{name}: required (scale_bytes={self.config.scale_bytes})")
        v = view(arr, name, writeable=name.startswith("out"), device=self._dev)
        need_lead(v, name, lead)
        need_row_bytes(v, name, len(lead), self.config.scale_bytes, "scale_bytes")
        need_align(v, name, 4)
        return v.ptr

    def _recv_args(self, out_expert_num_tokens, out_expert_x, out_expert_x_scale):
        L, cap = self.num_local_experts, self.expert_capacity
        cv = view(out_expert_num_tokens, "out_expert_num_tokens", writeable=True, device=self._dev)
        need_tag(cv, "out_expert_num_tokens", "int32")
        if tuple(cv.shape) != (L,):
            raise invalid(f"out_expert_num_tokens: shape must be ({L},), got {tuple(cv.shape)}")
        xv = view(out_expert_x, "out_expert_x", writeable=True, device=self._dev)
        need_lead(xv, "out_expert_x", (L, cap))
        need_row_bytes(xv, "out_expert_x", 2, self.config.token_bytes, "token_bytes")
        need_align(xv, "out_expert_x", 16)
        sp = self._scale_ptr(out_expert_x_scale, "out_expert_x_scale", (L, cap))
        return xv.ptr, sp, cv.ptr

    # ---- the two calls ----
    def dispatch(self, out_expert_num_tokens, out_expert_x, out_expert_x_scale, dp_x, dp_x_scale,
                 indices, bound_m=None, do_send=True, do_recv=True, *, weights=None, stream=None):
        """mc_dispatch. Send half reads dp_x [m][...token_bytes], dp_x_scale,
        indices [m][k] of the handle's index_dtype (int32, or int64 as
        torch.topk returns), weights fp32 [m][k] (None: all 1.0; they travel
        with the token and are used by combine), bound_m (None, an int, or a
        one-element int32 array). Recv half writes out_expert_x
        [L][capacity][...], out_expert_x_scale, out_expert_num_tokens int32 [L].
        For split halves pass the same arrays to both calls. On a GPU
        transport every array is a CUDA tensor on the comm's device and the
        call is queued on `stream` (default: torch's current stream)."""
        flags = _flags(do_send, do_recv)
        m, tok, sc, idx, w, bp = 0, None, None, None, None, None
        if do_send:
            m, tok, sc, idx, w = self._send_args(dp_x, dp_x_scale, indices, weights)
            bp = self._bound_ptr(bound_m)
        ex = exs = cnt = None
        if do_recv:
            ex, exs, cnt = self._recv_args(out_expert_num_tokens, out_expert_x, out_expert_x_scale)
        st = self._stream(stream)
        check(lib.mc_dispatch(self._h, tok, sc, idx, w, m, bp, ex, exs, cnt, flags, st), self.last_error)
        if do_send:
            self._m = m

    def dispatch_packed(self, dp_x, dp_x_scale, indices, *, weights=None, bound_m=None, capacity=None,
                        x_dtype=None, stream=None):
        """mc_dispatch_packed, on a handle of recv_layout "packed" or
        "expert_sorted"; both halves in one call. The send half reads what
        dispatch()'s does. Returns a PackedRecv (x, x_scale, row_expert,
        row_weight, expert_count, expert_offset, src_count, rows).

        capacity None, the counted way: the send half, mc_dispatch_counts,
        then the recv half into arrays allocated for exactly the rows
        counted; each call returns arrays of its own.
        capacity an int >= 1, the declared way: one call into arrays of
        `capacity` rows, kept by the handle and reused while the capacity
        and x_dtype stay the same, so the arrays returned are valid until
        the next dispatch_packed. A round where some rank receives more rows
        than it declared raises MoecommCapacity on every rank (the counted
        way too, from the count step); the round is dropped and the next
        step is a dispatch. An exception between the halves of the counted
        way (the recv arrays cannot be allocated) leaves the round open: the
        peers then time out; destroy the handle.

        x_dtype: the dtype of x (default: dp_x's, as a numpy array or a CUDA
        tensor; uint8 when dispatch quantises or dp_x is a CPU tensor)."""
        # every argument checked before the send half: a refusal between the halves would leave the round open
        m, tok, sc, idx, w = self._send_args(dp_x, dp_x_scale, indices, weights)
        send = (m, tok, sc, idx, w, self._bound_ptr(bound_m))
        xd = self._packed_x_dtype(dp_x, x_dtype)
        st = self._stream(stream)
        if capacity is not None:
            capacity = as_int(capacity, "capacity")
            if capacity < 1:
                raise invalid(f"capacity={capacity}: the rows this rank will hold, >= 1 (None: the counted way)")
        if capacity is None:
            bufs, rows = dispatch_counted(self, send, xd, st)
        else:
            kept = self._kept
            if kept is None or kept.capacity != capacity or kept.x_dtype != xd:
                kept = self._kept = PackedBuffers(self, capacity, xd)
            bufs, rows = kept, dispatch_declared(self, send, kept, st)
        self._m, self._rows = m, rows
        return PackedRecv(bufs, rows, self.recv_layout)

    def _packed_x_dtype(self, dp_x, x_dtype):
        if x_dtype is None:
            if self.quantises or (self._dev is None and not isinstance(dp_x, np.ndarray)):
                x_dtype = np.uint8
            else:
                x_dtype = dp_x.dtype
        size = itemsize(x_dtype)
        if self.config.token_bytes % size:
            raise invalid(f"x_dtype={x_dtype}: its size {size} does not divide token_bytes={self.config.token_bytes}")
        return x_dtype

    def combine(self, out_tokens, expert_y, do_send=True, do_recv=True, *, stream=None):
        """mc_combine. Send half reads expert_y [L][capacity][hidden] in
        combine_in_dtype; in the packed layouts [>= rows][hidden], a row per
        row dispatch_packed received ("packed": the row's experts already
        weighted and summed; padding rows are not read). Recv half writes
        out_tokens [>= m][hidden] in combine_out_dtype (rows up to the
        dispatch's bound_m). Indices and weights are not passed again:
        dispatch carried them."""
        flags = _flags(do_send, do_recv)
        yp = op = None
        if do_send:
            yp = self._y_ptr(expert_y)
        if do_recv:
            op = self._out_ptr(out_tokens)
        check(lib.mc_combine(self._h, yp, op, flags, self._stream(stream)), self.last_error)

    def _y_ptr(self, expert_y):
        yv = view(expert_y, "expert_y", device=self._dev)
        need_tag(yv, "expert_y", self.in_dtype)
        if self.recv_layout != "batched":
            if len(yv.shape) != 2 or yv.shape[1] != self.config.hidden:
                raise invalid(f"expert_y: shape must be (rows, {self.config.hidden}) in the {self.recv_layout} "
                              f"layout, got {tuple(yv.shape)}")
            if self._rows is not None and yv.shape[0] < self._rows:
                raise invalid(f"expert_y: {yv.shape[0]} rows, the dispatch received rows={self._rows}")
            need_align(yv, "expert_y", 16)
            return yv.ptr
        need_lead(yv, "expert_y", (self.num_local_experts, self.expert_capacity))
        if tuple(yv.shape[2:]) != (self.config.hidden,):
            raise invalid(f"expert_y: shape must be ({self.num_local_experts}, {self.expert_capacity}, "
                          f"{self.config.hidden}), got {tuple(yv.shape)}")
        need_align(yv, "expert_y", 16)
        return yv.ptr

    def _out_ptr(self, out_tokens):
        ov = view(out_tokens, "out_tokens", writeable=True, device=self._dev)
        need_tag(ov, "out_tokens", self.out_dtype)
        if len(ov.shape) != 2 or ov.shape[1] != self.config.hidden:
            raise invalid(f"out_tokens: shape must be (m, {self.config.hidden}), got {tuple(ov.shape)}")
        if self._m is not None and ov.shape[0] < self._m:
            raise invalid(f"out_tokens: {ov.shape[0]} rows, the dispatch had m={self._m}")
        need_align(ov, "out_tokens", 16)
        return ov.ptr

    # ---- lifetime ----
    def destroy(self):
        """mc_a2a_destroy (local on cpu: every rank must be past its last combine)."""
        if self._h is None:
            return
        check(lib.mc_a2a_destroy(self._h), self.last_error)
        self._h = None

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *_):
        # A failed handle (a timeout named a rank that may have left) is
        # destroyed without the barrier, which would wait its timeout for
        # that rank; destroy itself keeps the window mapped while peers use it.
        if exc_type is None and self._h and lib.mc_a2a_check(self._h) == 0:
            if self.get_mask().any():  # a dead rank would fail the communicator's barrier
                check(lib.mc_a2a_barrier(self._h, None), self.last_error)
            else:
                self.comm.barrier()
        self.destroy()

    def __del__(self):
        try:
            self.destroy()
        except Exception:
            pass
