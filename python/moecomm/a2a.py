"""AllToAll: mc_a2a_t, dispatch and combine over numpy arrays / torch CPU tensors."""
import ctypes as C

import numpy as np

from . import _capi
from ._arrays import empty_aligned, need_align, need_lead, need_row_bytes, need_tag, view
from .errors import check, invalid

lib = _capi.lib

DTYPES = {"fp32": _capi.DTYPE_FP32, "bf16": _capi.DTYPE_BF16, "fp16": _capi.DTYPE_FP16}
_ALIASES = {"float32": "fp32", "float": "fp32", "bfloat16": "bf16", "float16": "fp16", "half": "fp16",
            "torch.float32": "fp32", "torch.bfloat16": "bf16", "torch.float16": "fp16"}
# numpy storage of each dtype (bf16: raw bits in uint16)
NP_STORAGE = {"fp32": np.float32, "bf16": np.uint16, "fp16": np.float16}


def dtype_name(d, name):
    """"fp32" / "bf16" / "fp16" from a name, a numpy dtype or a torch dtype."""
    s = d if isinstance(d, str) else (str(d) if type(d).__module__.startswith("torch") else np.dtype(d).name)
    s = _ALIASES.get(s, s)
    if s not in DTYPES:
        raise invalid(f"{name}={d!r}: expected one of fp32, bf16, fp16")
    return s


def _flags(do_send, do_recv):
    flags = (_capi.SEND if do_send else 0) | (_capi.RECV if do_recv else 0)
    if not flags:
        raise invalid("do_send and do_recv are both False: nothing to do")
    return flags


class AllToAll:
    """Dispatch/combine handle with its receive buffers (mc_a2a_create).
    Collective: every rank passes the same arguments. Use as a context
    manager (on a clean exit it runs comm.barrier() and then destroy(), since
    peers may still write into this rank's buffers until they finish), or
    call comm.barrier() and destroy() yourself."""

    def __init__(self, comm, *, max_tokens, num_experts, experts_per_token, hidden,
                 token_bytes=None, scale_bytes=0, combine_in_dtype="bf16", combine_out_dtype="bf16"):
        self.comm, self._h = comm, None
        self.in_dtype = dtype_name(combine_in_dtype, "combine_in_dtype")
        self.out_dtype = dtype_name(combine_out_dtype, "combine_out_dtype")
        if token_bytes is None:
            token_bytes = int(hidden) * np.dtype(NP_STORAGE[self.in_dtype]).itemsize
        cfg = _capi.a2a_config()
        cfg.max_tokens, cfg.num_experts, cfg.experts_per_token = int(max_tokens), int(num_experts), int(experts_per_token)
        cfg.token_bytes, cfg.scale_bytes, cfg.hidden = int(token_bytes), int(scale_bytes), int(hidden)
        cfg.combine_in_dtype, cfg.combine_out_dtype = DTYPES[self.in_dtype], DTYPES[self.out_dtype]
        self._create(cfg)

    def _create(self, cfg):
        h = C.c_void_p()
        check(lib.mc_a2a_create(self.comm.handle, C.byref(cfg), C.byref(h)), self.comm.last_error)
        self._h, self.config = h, cfg
        self.num_local_experts = lib.mc_a2a_num_local_experts(h)
        self.expert_capacity = lib.mc_a2a_expert_capacity(h)
        self._bound = C.c_int32(0)  # where an int bound_m is put: no allocation per call
        self._m = None              # rows of the last dispatch send half, for combine's check

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

    # ---- output allocation (once, not per call) ----
    def alloc_expert_num_tokens(self):
        return np.zeros(self.num_local_experts, dtype=np.int32)

    def alloc_expert_x(self, dtype=np.uint8):
        """[num_local_experts][expert_capacity][token_bytes / itemsize] of `dtype`."""
        n = self.config.token_bytes // np.dtype(dtype).itemsize
        return empty_aligned((self.num_local_experts, self.expert_capacity, n), dtype)

    def alloc_expert_x_scale(self, dtype=np.float32):
        """[num_local_experts][expert_capacity][scale_bytes / itemsize], or None without scales."""
        if self.config.scale_bytes == 0:
            return None
        n = self.config.scale_bytes // np.dtype(dtype).itemsize
        return empty_aligned((self.num_local_experts, self.expert_capacity, n), dtype)

    def alloc_expert_y(self):
        """[num_local_experts][expert_capacity][hidden] in combine_in_dtype's numpy storage."""
        return empty_aligned((self.num_local_experts, self.expert_capacity, self.config.hidden),
                             NP_STORAGE[self.in_dtype])

    def alloc_out_tokens(self, m=None):
        """[m or max_tokens][hidden] in combine_out_dtype's numpy storage."""
        rows = self.config.max_tokens if m is None else int(m)
        return empty_aligned((rows, self.config.hidden), NP_STORAGE[self.out_dtype])

    # ---- argument marshalling ----
    def _bound_ptr(self, bound_m):
        if bound_m is None:
            return None
        if isinstance(bound_m, (int, np.integer)):
            self._bound.value = int(bound_m)
            return C.addressof(self._bound)
        v = view(bound_m, "bound_m")
        need_tag(v, "bound_m", "int32")
        if int(np.prod(v.shape)) != 1:
            raise invalid(f"bound_m: expected one int32 element, got shape {tuple(v.shape)}")
        return v.ptr

    def _send_args(self, dp_x, dp_x_scale, indices, weights):
        cfg = self.config
        iv = view(indices, "indices")
        need_tag(iv, "indices", "int32")
        if len(iv.shape) != 2 or iv.shape[1] != cfg.experts_per_token:
            raise invalid(f"indices: shape must be (m, {cfg.experts_per_token}), got {tuple(iv.shape)}")
        m = iv.shape[0]
        xv = view(dp_x, "dp_x")
        need_lead(xv, "dp_x", (m,))
        need_row_bytes(xv, "dp_x", 1, cfg.token_bytes, "token_bytes")
        need_align(xv, "dp_x", 16)
        sp = self._scale_ptr(dp_x_scale, "dp_x_scale", (m,))
        wp = None
        if weights is not None:
            wv = view(weights, "weights")
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
        v = view(arr, name, writeable=name.startswith("out"))
        need_lead(v, name, lead)
        need_row_bytes(v, name, len(lead), self.config.scale_bytes, "scale_bytes")
        need_align(v, name, 4)
        return v.ptr

    def _recv_args(self, out_expert_num_tokens, out_expert_x, out_expert_x_scale):
        L, cap = self.num_local_experts, self.expert_capacity
        cv = view(out_expert_num_tokens, "out_expert_num_tokens", writeable=True)
        need_tag(cv, "out_expert_num_tokens", "int32")
        if tuple(cv.shape) != (L,):
            raise invalid(f"out_expert_num_tokens: shape must be ({L},), got {tuple(cv.shape)}")
        xv = view(out_expert_x, "out_expert_x", writeable=True)
        need_lead(xv, "out_expert_x", (L, cap))
        need_row_bytes(xv, "out_expert_x", 2, self.config.token_bytes, "token_bytes")
        need_align(xv, "out_expert_x", 16)
        sp = self._scale_ptr(out_expert_x_scale, "out_expert_x_scale", (L, cap))
        return xv.ptr, sp, cv.ptr

    # ---- the two calls ----
    def dispatch(self, out_expert_num_tokens, out_expert_x, out_expert_x_scale, dp_x, dp_x_scale,
                 indices, bound_m=None, do_send=True, do_recv=True, *, weights=None):
        """mc_dispatch. Send half reads dp_x [m][...token_bytes], dp_x_scale,
        indices int32 [m][k], weights fp32 [m][k] (None: all 1.0; they travel
        with the token and are used by combine), bound_m (None, an int, or a
        one-element int32 array). Recv half writes out_expert_x
        [L][capacity][...], out_expert_x_scale, out_expert_num_tokens int32 [L].
        For split halves pass the same arrays to both calls."""
        flags = _flags(do_send, do_recv)
        m, tok, sc, idx, w, bp = 0, None, None, None, None, None
        if do_send:
            m, tok, sc, idx, w = self._send_args(dp_x, dp_x_scale, indices, weights)
            bp = self._bound_ptr(bound_m)
        ex = exs = cnt = None
        if do_recv:
            ex, exs, cnt = self._recv_args(out_expert_num_tokens, out_expert_x, out_expert_x_scale)
        check(lib.mc_dispatch(self._h, tok, sc, idx, w, m, bp, ex, exs, cnt, flags, None), self.last_error)
        if do_send:
            self._m = m

    def combine(self, out_tokens, expert_y, do_send=True, do_recv=True):
        """mc_combine. Send half reads expert_y [L][capacity][hidden] in
        combine_in_dtype; recv half writes out_tokens [>= m][hidden] in
        combine_out_dtype (rows up to the dispatch's bound_m). Indices and
        weights are not passed again: dispatch carried them."""
        flags = _flags(do_send, do_recv)
        yp = op = None
        if do_send:
            yv = view(expert_y, "expert_y")
            need_tag(yv, "expert_y", self.in_dtype)
            need_lead(yv, "expert_y", (self.num_local_experts, self.expert_capacity))
            if tuple(yv.shape[2:]) != (self.config.hidden,):
                raise invalid(f"expert_y: shape must be ({self.num_local_experts}, {self.expert_capacity}, "
                              f"{self.config.hidden}), got {tuple(yv.shape)}")
            need_align(yv, "expert_y", 16)
            yp = yv.ptr
        if do_recv:
            op = self._out_ptr(out_tokens)
        check(lib.mc_combine(self._h, yp, op, flags, None), self.last_error)

    def _out_ptr(self, out_tokens):
        ov = view(out_tokens, "out_tokens", writeable=True)
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
        if exc_type is None:
            self.comm.barrier()
        self.destroy()

    def __del__(self):
        try:
            self.destroy()
        except Exception:
            pass
