"""Checking caller arrays (numpy, torch CPU tensors, or torch CUDA tensors on
a GPU transport) before C sees them.

Every failure raises MoecommInvalid naming the argument. bf16 has no numpy
dtype: a uint16 array is taken as raw bf16 bits (ml_dtypes' bfloat16 and
torch.bfloat16 are accepted too).
"""
from collections import namedtuple
from math import prod

import numpy as np

from .errors import invalid

View = namedtuple("View", "ptr shape itemsize tag")

_NP_TAGS = {"float32": "fp32", "float16": "fp16", "uint16": "bf16", "bfloat16": "bf16", "int32": "int32",
            "int64": "int64"}
_TORCH_TAGS = {"torch.float32": "fp32", "torch.float16": "fp16", "torch.bfloat16": "bf16", "torch.int32": "int32",
               "torch.int64": "int64"}


def _is_torch(a):
    return type(a).__module__.startswith("torch")


def view(a, name, writeable=False, device=None):
    """A View of a C-contiguous array; raises MoecommInvalid otherwise.
    device None: host memory (numpy, CPU tensor); an int: a torch CUDA tensor
    on that device (what a GPU transport reads and writes)."""
    if device is not None:
        if not _is_torch(a) or a.device.type != "cuda" or a.device.index != device:
            where = f"device {a.device}" if _is_torch(a) else type(a).__name__
            raise invalid(f"{name}: must be a torch tensor on cuda:{device}, the communicator's GPU (got {where})")
        if not a.is_contiguous():
            raise invalid(f"{name}: must be contiguous")
        dt = str(a.dtype)
        return View(a.data_ptr(), tuple(a.shape), a.element_size(), _TORCH_TAGS.get(dt, dt))
    if isinstance(a, np.ndarray):
        if not a.flags.c_contiguous:
            raise invalid(f"{name}: must be C-contiguous")
        if writeable and not a.flags.writeable:
            raise invalid(f"{name}: must be writeable")
        return View(a.ctypes.data, a.shape, a.itemsize, _NP_TAGS.get(a.dtype.name, a.dtype.name))
    if _is_torch(a):
        if a.device.type != "cpu":
            raise invalid(f"{name}: must be a CPU tensor (got device {a.device})")
        if not a.is_contiguous():
            raise invalid(f"{name}: must be contiguous")
        dt = str(a.dtype)
        return View(a.data_ptr(), tuple(a.shape), a.element_size(), _TORCH_TAGS.get(dt, dt))
    raise invalid(f"{name}: expected a numpy array or torch CPU tensor, got {type(a).__name__}")


def need_tag(v, name, tag):
    if v.tag != tag:
        hint = " (bf16 in numpy: pass uint16 raw bits)" if tag == "bf16" else ""
        raise invalid(f"{name}: dtype must be {tag}{hint}, got {v.tag}")


def need_align(v, name, align):
    if v.ptr % align:
        raise invalid(f"{name}: data pointer 0x{v.ptr:x} is not {align}-byte aligned "
                      "(allocate with moecomm.empty_aligned)")


def need_lead(v, name, lead):
    """The leading dimensions must equal `lead` (a tuple)."""
    if tuple(v.shape[: len(lead)]) != tuple(lead) or len(v.shape) < len(lead):
        raise invalid(f"{name}: leading shape must be {tuple(lead)}, got {tuple(v.shape)}")


def need_row_bytes(v, name, nlead, nbytes, what):
    """Bytes per row after the first `nlead` dimensions must be `nbytes`."""
    got = prod(v.shape[nlead:]) * v.itemsize
    if got != nbytes:
        raise invalid(f"{name}: {got} bytes per row after dims {tuple(v.shape[:nlead])}, "
                      f"expected {what}={nbytes}")


def itemsize(dtype):
    """Bytes of one element of a numpy or torch dtype."""
    return dtype.itemsize if hasattr(dtype, "is_floating_point") else np.dtype(dtype).itemsize


def empty_aligned(shape, dtype, align=64):
    """An uninitialised C-contiguous numpy array whose data is `align`-byte aligned."""
    dtype = np.dtype(dtype)
    n = prod(shape) * dtype.itemsize
    raw = np.empty(n + align, dtype=np.uint8)
    off = (-raw.ctypes.data) % align
    return raw[off: off + n].view(dtype).reshape(shape)
