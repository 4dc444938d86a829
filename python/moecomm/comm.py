"""Communicator: mc_comm_t, built over an out-of-band allgather."""
import ctypes as C

from . import _capi
from .bootstrap import PyAllgather, SocketGroup, torch_allgather
from .errors import MoecommError, check, invalid, last_error

lib = _capi.lib

TRANSPORTS = {"auto": _capi.TRANSPORT_AUTO, "cpu": _capi.TRANSPORT_CPU,
              "nvshmem": _capi.TRANSPORT_NVSHMEM, "p2p": _capi.TRANSPORT_P2P}


def _config(group_size, transport, timeout_ms, device):
    if transport not in TRANSPORTS:
        raise invalid(f"transport={transport!r}: expected one of {sorted(TRANSPORTS)}")
    cfg = _capi.comm_config()
    cfg.group_size, cfg.transport = int(group_size), TRANSPORTS[transport]
    cfg.timeout_ms, cfg.device = int(timeout_ms), int(device)
    return cfg


class Communicator:
    """A communicator over an allgather. Collective: every rank creates it
    with the same group_size and transport. The transport defaults to "cpu"
    (numpy arrays, CPU tensors); "nvshmem" takes torch CUDA tensors on
    `device` (default: torch's current device).

    `Communicator(allgather, rank, world_size)` takes a Python callable
    `allgather(data: bytes) -> bytes` (world_size * len(data) bytes, rank
    order); the classmethods build one from the built-in helpers or torch."""

    def __init__(self, allgather, rank, world_size, *, group_size=1, transport="cpu",
                 timeout_ms=0, device=-1):
        py = PyAllgather(allgather, rank, world_size)
        self._create(py.oob, py, group_size, transport, timeout_ms, device)

    @classmethod
    def from_oob(cls, oob, keepalive=None, owned=None, **config):
        """From an mc_oob_t (`Oob`); `keepalive` is held until destroy,
        `owned` (with close()) is closed after destroy."""
        self = cls.__new__(cls)
        self._create(oob, keepalive, owned=owned, **config)
        return self

    @classmethod
    def from_threads(cls, group, rank, **config):
        """Rank `rank` of a ThreadsGroup (call from that rank's thread)."""
        return cls.from_oob(group.oob(rank), keepalive=group, **config)

    @classmethod
    def from_unique_id(cls, uid, rank, world_size, *, bootstrap_timeout_ms=10000, **config):
        """Processes on one host: `uid` from moecomm.unique_id() on rank 0."""
        sock = SocketGroup(uid, rank, world_size, bootstrap_timeout_ms)
        try:
            return cls.from_oob(sock.oob(), keepalive=sock, owned=sock, **config)
        except BaseException:
            sock.close()
            raise

    @classmethod
    def from_torch(cls, process_group=None, **config):
        """Over torch.distributed.all_gather on a CPU (gloo) process group
        (default: the world group). torch is imported lazily."""
        import torch.distributed as dist
        rank, ws = dist.get_rank(process_group), dist.get_world_size(process_group)
        return cls(torch_allgather(process_group), rank, ws, **config)

    def _create(self, oob, keepalive, group_size=1, transport="cpu", timeout_ms=0, device=-1, owned=None):
        self._h, self._oob, self._keep, self._owned = None, oob, keepalive, owned
        if transport in ("nvshmem", "p2p") and device < 0:  # the GPU torch is on: tensors live there
            import torch
            device = torch.cuda.current_device()
        self.device = int(device)  # -1: none (cpu transport)
        cfg = _config(group_size, transport, timeout_ms, device)
        h = C.c_void_p()
        rc = lib.mc_comm_create(C.byref(oob), C.byref(cfg), C.byref(h))
        if rc != _capi.SUCCESS:
            msg = last_error()
            err = getattr(keepalive, "error", None)
            if err is not None:
                msg += f" (Python allgather raised {err!r})"
            check(rc, lambda: msg)
        self._h = h

    # ---- accessors ----
    @property
    def handle(self):
        """The raw mc_comm_t* (c_void_p); None once destroyed."""
        return self._h

    @property
    def rank(self):
        return lib.mc_comm_rank(self._h)

    @property
    def world_size(self):
        return lib.mc_comm_world_size(self._h)

    @property
    def group_size(self):
        return lib.mc_comm_group_size(self._h)

    @property
    def transport(self):
        """The transport actually chosen, by name ("cpu", "nvshmem", ...)."""
        return _capi.text(lib.mc_transport_name(lib.mc_comm_transport(self._h)))

    def last_error(self):
        return _capi.text(lib.mc_comm_last_error(self._h))

    # ---- collectives over the oob ----
    def allgather(self, data):
        """The bootstrap allgather: bytes in, world_size * len(data) bytes out."""
        data = bytes(data)
        recv = C.create_string_buffer(max(1, len(data) * self.world_size))
        rc = self._oob.allgather(data, recv, len(data), self._oob.user)
        if rc != 0:
            raise MoecommError(_capi.ERR_BOOTSTRAP, f"allgather of {len(data)} bytes failed on rank {self.rank}")
        return recv.raw[: len(data) * self.world_size]

    def barrier(self):
        """Every rank waits for every other (a one-byte allgather)."""
        self.allgather(b"\0")

    # ---- lifetime ----
    def destroy(self):
        """mc_comm_destroy; every AllToAll made from it must be destroyed first."""
        if self._h is None:
            return
        check(lib.mc_comm_destroy(self._h), self.last_error)
        self._h, self._keep = None, None
        if self._owned is not None:
            self._owned.close()
            self._owned = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.destroy()

    def __del__(self):
        try:
            self.destroy()
        except Exception:
            pass
