"""Out-of-band bootstrap: the allgather a communicator is built over.

Three sources, each producing an `mc_oob_t` (`Oob`):
- ThreadsGroup: ranks as threads of one process (the C helper).
- SocketGroup + unique_id(): processes on one host over TCP (the C helper).
- PyAllgather: any Python callable, e.g. torch.distributed.
"""
import ctypes as C

from . import _capi
from .errors import check, invalid, last_error

lib = _capi.lib


class ThreadsGroup:
    """One per job of thread ranks (mc_oob_threads_*). Close it after every
    communicator built from it has been destroyed (or let it be collected)."""

    def __init__(self, world_size, timeout_ms=10000):
        self._h = C.c_void_p()
        check(lib.mc_oob_threads_create(int(world_size), int(timeout_ms), C.byref(self._h)), last_error)
        self.world_size = int(world_size)

    def oob(self, rank):
        """The mc_oob_t of one rank."""
        if self._h is None:
            raise invalid("ThreadsGroup is closed")
        out = _capi.Oob()
        check(lib.mc_oob_threads_get(self._h, int(rank), C.byref(out)), last_error)
        return out

    def close(self):
        if self._h is not None:
            lib.mc_oob_threads_destroy(self._h)
            self._h = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


def unique_id():
    """Rank 0 only: open the listening socket and return the id (128 bytes)
    to hand to every process, rank 0 included, for SocketGroup."""
    uid = _capi.UniqueIdT()
    check(lib.mc_unique_id_create(C.byref(uid)), last_error)
    return bytes(C.string_at(C.addressof(uid), _capi.UNIQUE_ID_BYTES))


class SocketGroup:
    """One rank's end of the processes-on-one-host bootstrap (mc_oob_socket_*)."""

    def __init__(self, uid, rank, world_size, timeout_ms=10000):
        if not isinstance(uid, (bytes, bytearray)) or len(uid) != _capi.UNIQUE_ID_BYTES:
            raise invalid(f"uid: expected {_capi.UNIQUE_ID_BYTES} bytes from moecomm.unique_id()")
        cid = _capi.UniqueIdT()
        C.memmove(C.addressof(cid), bytes(uid), _capi.UNIQUE_ID_BYTES)
        self._h = C.c_void_p()
        check(lib.mc_oob_socket_create(C.byref(cid), int(rank), int(world_size), int(timeout_ms),
                                       C.byref(self._h)), last_error)

    def oob(self):
        out = _capi.Oob()
        check(lib.mc_oob_socket_get(self._h, C.byref(out)), last_error)
        return out

    def close(self):
        if self._h is not None:
            lib.mc_oob_socket_destroy(self._h)
            self._h = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


class PyAllgather:
    """An mc_oob_t whose allgather is a Python callable
    `fn(data: bytes) -> bytes` returning world_size * len(data) bytes in rank
    order. C calls it through a ctypes callback; an exception inside it is
    kept in `self.error` and reported to C as failure (non-zero), never
    propagated through C. Keep this object alive as long as the oob is used
    (Communicator does)."""

    def __init__(self, fn, rank, world_size):
        self.fn, self.world_size, self.error = fn, int(world_size), None
        self._cb = _capi.ALLGATHER_FN(self._call)  # must outlive every C use
        self.oob = _capi.Oob(self._cb, None, int(rank), int(world_size))

    def _call(self, send, recv, nbytes, _user):
        try:
            data = C.string_at(send, nbytes) if nbytes else b""
            got = bytes(self.fn(data))
            if len(got) != nbytes * self.world_size:
                raise ValueError(f"allgather returned {len(got)} bytes, expected {nbytes * self.world_size}")
            if got:
                C.memmove(recv, got, len(got))
            return 0
        except BaseException as e:  # noqa: BLE001 - nothing may cross the C frame
            self.error = e
            return 1


def torch_allgather(group=None):
    """A `fn(bytes) -> bytes` over torch.distributed.all_gather on a CPU
    (gloo) process group; torch is imported here, not before."""
    import torch
    import torch.distributed as dist

    def fn(data):
        n = dist.get_world_size(group)
        mine = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)
        outs = [torch.empty(len(data), dtype=torch.uint8) for _ in range(n)]
        dist.all_gather(outs, mine, group=group)
        return b"".join(o.numpy().tobytes() for o in outs)

    return fn
