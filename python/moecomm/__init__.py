"""moecomm: Mixture-of-Experts dispatch and combine (ctypes bindings of libmoecomm)."""
from . import _capi as capi
from ._arrays import empty_aligned
from .a2a import AllToAll
from .bootstrap import PyAllgather, SocketGroup, ThreadsGroup, torch_allgather, unique_id
from .comm import Communicator
from .errors import MoecommCapacity, MoecommError, MoecommInvalid, MoecommTimeout, last_error, result_string
from .layer import MoELayer
from .packed import PackedRecv

SEND, RECV, SEND_RECV = capi.SEND, capi.RECV, capi.SEND_RECV
__version__ = "0.5.0"


def version():
    """The loaded library's version as (major, minor, patch)."""
    v = capi.lib.mc_version()
    return (v // 10000, v // 100 % 100, v % 100)


def dtype_size(dtype):
    """mc_dtype_size for "fp32" / "bf16" / "fp16"."""
    from .a2a import DTYPES, dtype_name
    return capi.lib.mc_dtype_size(DTYPES[dtype_name(dtype, "dtype")])


__all__ = ["AllToAll", "PackedRecv", "MoELayer", "Communicator", "ThreadsGroup", "SocketGroup", "PyAllgather",
           "unique_id", "torch_allgather", "MoecommError", "MoecommInvalid", "MoecommTimeout", "MoecommCapacity",
           "result_string", "last_error", "empty_aligned", "version", "dtype_size", "capi", "SEND", "RECV", "SEND_RECV"]
