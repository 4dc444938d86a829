"""The packed receive layouts (recv_layout "packed" / "expert_sorted"):
the buffers one recv half of mc_dispatch_packed writes, the two ways of
sizing them, and PackedRecv, what AllToAll.dispatch_packed returns."""
import ctypes as C
import operator

import numpy as np

from . import _capi
from ._arrays import itemsize
from .errors import check, invalid

lib = _capi.lib

LAYOUTS = {"batched": _capi.LAYOUT_BATCHED, "packed": _capi.LAYOUT_PACKED,
           "expert_sorted": _capi.LAYOUT_EXPERT_SORTED}


def as_int(value, name):
    """`value` as an int; MoecommInvalid for anything else (a float is
    refused rather than truncated)."""
    try:
        if not isinstance(value, bool):
            return operator.index(value)
    except TypeError:
        pass
    raise invalid(f"{name}={value!r}: expected an int")


def _ptr(a):
    return a.ctypes.data if isinstance(a, np.ndarray) else a.data_ptr()


class PackedRecv:
    """What the recv half of dispatch_packed wrote, each array a view of
    exactly `rows` rows (numpy on the cpu transport, torch CUDA tensors on a
    GPU one):

    x             [rows][token_bytes / itemsize] of the dispatch's x_dtype
    x_scale       [rows][scale_bytes / itemsize], or None without scales
    row_expert    int32; packed: [rows][k], the row's local experts in
                  ascending order, then -1; expert_sorted: [rows], the
                  row's local expert, -1 on padding rows
    row_weight    float32, the shape of row_expert: router weights, 0 at -1
    expert_count  int32 [L]: (token, expert) pairs per local expert
    expert_offset int32 [L + 1]: expert_sorted, where each expert's rows
                  start (multiples of expert_align), then rows; packed, the
                  prefix sums of expert_count
    src_count     int32 [world_size]: rows (expert_sorted: pairs) from each
                  source rank
    rows          int: the rows written, padding included
    layout        "packed" or "expert_sorted"
    """
    __slots__ = ("x", "x_scale", "row_expert", "row_weight", "expert_count", "expert_offset", "src_count",
                 "rows", "layout")

    def __init__(self, bufs, rows, layout):
        self.rows, self.layout = int(rows), layout
        self.x, self.row_expert, self.row_weight = bufs.x[:rows], bufs.row_expert[:rows], bufs.row_weight[:rows]
        self.x_scale = None if bufs.x_scale is None else bufs.x_scale[:rows]
        self.expert_count, self.expert_offset, self.src_count = bufs.expert_count, bufs.expert_offset, bufs.src_count

    def __repr__(self):
        return f"PackedRecv(layout={self.layout!r}, rows={self.rows}, x={tuple(self.x.shape)})"


class PackedBuffers:
    """The arrays of one recv half, `capacity` rows each, allocated by the
    handle (its device), and the mc_packed_recv_t pointing at them. x_dtype
    is the caller's, checked to divide token_bytes."""

    def __init__(self, a2a, capacity, x_dtype):
        cfg = a2a.config
        self.capacity, self.x_dtype = int(capacity), x_dtype
        n = max(self.capacity, 1)  # C refuses a NULL row buffer even when no row comes
        self.x = a2a._empty((n, cfg.token_bytes // itemsize(x_dtype)), x_dtype)
        self.x_scale = None
        if cfg.scale_bytes:
            sd = np.uint8 if cfg.scale_format == _capi.SCALE_UE8M0 else np.float32
            self.x_scale = a2a._empty((n, cfg.scale_bytes // np.dtype(sd).itemsize), sd)
        per_row = (n,) if cfg.recv_layout == _capi.LAYOUT_EXPERT_SORTED else (n, cfg.experts_per_token)
        self.row_expert = a2a._empty(per_row, np.int32)
        self.row_weight = a2a._empty(per_row, np.float32)
        self.expert_count = a2a._empty((a2a.num_local_experts,), np.int32, zero=True)
        self.expert_offset = a2a._empty((a2a.num_local_experts + 1,), np.int32, zero=True)
        self.src_count = a2a._empty((a2a.comm.world_size,), np.int32, zero=True)
        self.rows = a2a._empty((1,), np.int64, zero=True)
        r = self.struct = _capi.packed_recv()
        r.capacity = self.capacity
        r.x, r.x_scale = _ptr(self.x), None if self.x_scale is None else _ptr(self.x_scale)
        r.row_expert, r.row_weight = _ptr(self.row_expert), _ptr(self.row_weight)
        r.expert_count, r.expert_offset = _ptr(self.expert_count), _ptr(self.expert_offset)
        r.src_count, r.rows = _ptr(self.src_count), _ptr(self.rows)

    def written_rows(self, device):
        """The rows the recv half wrote (on a GPU: after waiting for the device)."""
        if device is None:
            return int(self.rows[0])
        import torch
        torch.cuda.synchronize(device)  # the call may have gone on a stream other than the current one
        return int(self.rows.item())


def dispatch_counted(a2a, send, x_dtype, stream):
    """The send half declaring no capacity, mc_dispatch_counts, buffers of
    exactly the counted rows, the recv half."""
    h, err = a2a.handle, a2a.last_error
    m, tok, sc, idx, w, bp = send
    check(lib.mc_dispatch_packed(h, tok, sc, idx, w, m, bp, None, _capi.SEND, stream), err)
    rows = C.c_int64(0)
    check(lib.mc_dispatch_counts(h, C.byref(rows), None, stream), err)
    bufs = PackedBuffers(a2a, rows.value, x_dtype)
    check(lib.mc_dispatch_packed(h, None, None, None, None, 0, None, C.byref(bufs.struct), _capi.RECV, stream),
          err)
    return bufs, rows.value


def dispatch_declared(a2a, send, bufs, stream):
    """One call of both halves into `bufs`, whose capacity the send half
    declares to every rank."""
    m, tok, sc, idx, w, bp = send
    check(lib.mc_dispatch_packed(a2a.handle, tok, sc, idx, w, m, bp, C.byref(bufs.struct), _capi.SEND_RECV,
                                 stream), a2a.last_error)
    return bufs.written_rows(a2a._dev)
