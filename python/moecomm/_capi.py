"""The C API of moecomm.h as ctypes: constants, structures, prototypes.

Structures mirror the C declarations field for field; `comm_config()`,
`a2a_config()`, `a2a_stats()` and `packed_recv()` fill `size` (and
`version`) the way the C initializers do.
"""
import ctypes as C

from ._lib import load

# ---- version, results, enumerations (moecomm.h) ----
VERSION_MAJOR, VERSION_MINOR, VERSION_PATCH = 0, 5, 0
VERSION = VERSION_MAJOR * 10000 + VERSION_MINOR * 100 + VERSION_PATCH

SUCCESS = 0
ERR_INVALID_ARG = 1
ERR_INVALID_USAGE = 2
ERR_TIMEOUT = 3
ERR_UNSUPPORTED = 4
ERR_SYSTEM = 5
ERR_BOOTSTRAP = 6
ERR_CUDA = 7
ERR_NVSHMEM = 8
ERR_ABORTED = 9
ERR_INTERNAL = 10
ERR_CAPACITY = 11

TRANSPORT_AUTO, TRANSPORT_CPU, TRANSPORT_NVSHMEM, TRANSPORT_P2P = 0, 1, 2, 3
DTYPE_FP32, DTYPE_BF16, DTYPE_FP16 = 0, 1, 2
INDEX_INT32, INDEX_INT64 = 0, 1
INPUT_BYTES, INPUT_BF16_TO_E4M3 = 0, 1
SCALE_FP32, SCALE_UE8M0 = 0, 1
LAYOUT_BATCHED, LAYOUT_PACKED, LAYOUT_EXPERT_SORTED = 0, 1, 2

SEND, RECV = 1, 2
SEND_RECV = SEND | RECV
MAX_TOPK = 16
UNIQUE_ID_BYTES = 128

# ---- structures ----
ALLGATHER_FN = C.CFUNCTYPE(C.c_int, C.c_void_p, C.c_void_p, C.c_size_t, C.c_void_p)


class Oob(C.Structure):
    _fields_ = [("allgather", ALLGATHER_FN), ("user", C.c_void_p),
                ("rank", C.c_int), ("world_size", C.c_int)]


class UniqueIdT(C.Structure):
    _fields_ = [("internal", C.c_char * UNIQUE_ID_BYTES)]


class CommConfig(C.Structure):
    _fields_ = [("size", C.c_size_t), ("version", C.c_uint), ("group_size", C.c_int),
                ("transport", C.c_int), ("timeout_ms", C.c_int), ("device", C.c_int)]


class A2AConfig(C.Structure):
    _fields_ = [("size", C.c_size_t), ("version", C.c_uint), ("max_tokens", C.c_int),
                ("num_experts", C.c_int), ("experts_per_token", C.c_int),
                ("token_bytes", C.c_size_t), ("scale_bytes", C.c_size_t), ("hidden", C.c_int),
                ("combine_in_dtype", C.c_int), ("combine_out_dtype", C.c_int), ("index_dtype", C.c_int),
                ("dispatch_input", C.c_int), ("scale_format", C.c_int), ("recv_layout", C.c_int),
                ("expert_align", C.c_int)]


class A2AStats(C.Structure):
    _fields_ = [("size", C.c_size_t), ("rounds", C.c_uint64),
                ("dispatch_records_sent", C.c_uint64), ("dispatch_bytes_sent", C.c_uint64),
                ("combine_rows_sent", C.c_uint64), ("combine_bytes_sent", C.c_uint64),
                ("buffer_bytes", C.c_uint64)]


class PackedRecvT(C.Structure):
    """mc_packed_recv_t: the recv half's buffers of mc_dispatch_packed (raw addresses)."""
    _fields_ = [("size", C.c_size_t), ("capacity", C.c_int64), ("x", C.c_void_p), ("x_scale", C.c_void_p),
                ("row_expert", C.c_void_p), ("row_weight", C.c_void_p), ("expert_count", C.c_void_p),
                ("expert_offset", C.c_void_p), ("src_count", C.c_void_p), ("rows", C.c_void_p)]


def comm_config():
    """MC_COMM_CONFIG_INITIALIZER."""
    return CommConfig(C.sizeof(CommConfig), VERSION, 1, TRANSPORT_AUTO, 0, -1)


def a2a_config():
    """MC_A2A_CONFIG_INITIALIZER."""
    return A2AConfig(C.sizeof(A2AConfig), VERSION, 0, 0, 0, 0, 0, 0, DTYPE_BF16, DTYPE_BF16, INDEX_INT32,
                     INPUT_BYTES, SCALE_FP32, LAYOUT_BATCHED, 1)


def a2a_stats():
    """An mc_a2a_stats_t with `size` set, ready for mc_a2a_get_stats."""
    return A2AStats(size=C.sizeof(A2AStats))


def packed_recv():
    """An mc_packed_recv_t with `size` set and every pointer NULL."""
    return PackedRecvT(size=C.sizeof(PackedRecvT))


# ---- prototypes ----
_vp, _i, _r, _s = C.c_void_p, C.c_int, C.c_int, C.c_char_p
_PROTOS = {
    "mc_version": (_i, []),
    "mc_result_string": (_s, [_i]),
    "mc_last_error": (_s, []),
    "mc_transport_name": (_s, [_i]),
    "mc_dtype_size": (C.c_size_t, [_i]),
    "mc_oob_threads_create": (_r, [_i, _i, C.POINTER(_vp)]),
    "mc_oob_threads_get": (_r, [_vp, _i, C.POINTER(Oob)]),
    "mc_oob_threads_destroy": (None, [_vp]),
    "mc_unique_id_create": (_r, [C.POINTER(UniqueIdT)]),
    "mc_oob_socket_create": (_r, [C.POINTER(UniqueIdT), _i, _i, _i, C.POINTER(_vp)]),
    "mc_oob_socket_get": (_r, [_vp, C.POINTER(Oob)]),
    "mc_oob_socket_destroy": (None, [_vp]),
    "mc_comm_create": (_r, [C.POINTER(Oob), C.POINTER(CommConfig), C.POINTER(_vp)]),
    "mc_comm_destroy": (_r, [_vp]),
    "mc_comm_rank": (_i, [_vp]),
    "mc_comm_world_size": (_i, [_vp]),
    "mc_comm_group_size": (_i, [_vp]),
    "mc_comm_transport": (_i, [_vp]),
    "mc_comm_last_error": (_s, [_vp]),
    "mc_a2a_create": (_r, [_vp, C.POINTER(A2AConfig), C.POINTER(_vp)]),
    "mc_a2a_destroy": (_r, [_vp]),
    "mc_a2a_expert_capacity": (_i, [_vp]),
    "mc_a2a_num_local_experts": (_i, [_vp]),
    "mc_a2a_last_error": (_s, [_vp]),
    "mc_dispatch": (_r, [_vp, _vp, _vp, _vp, _vp, _i, _vp, _vp, _vp, _vp, C.c_uint, _vp]),
    "mc_dispatch_packed": (_r, [_vp, _vp, _vp, _vp, _vp, _i, _vp, C.POINTER(PackedRecvT), C.c_uint, _vp]),
    "mc_dispatch_counts": (_r, [_vp, C.POINTER(C.c_int64), _vp, _vp]),
    "mc_combine": (_r, [_vp, _vp, _vp, C.c_uint, _vp]),
    "mc_a2a_check": (_r, [_vp]),
    "mc_a2a_get_stats": (_r, [_vp, C.POINTER(A2AStats)]),
    "mc_a2a_get_expert_load": (_r, [_vp, _vp, _i]),
    "mc_a2a_mask_ranks": (_r, [_vp, _vp]),
    "mc_a2a_get_mask": (_r, [_vp, _vp]),
    "mc_a2a_barrier": (_r, [_vp, _vp]),
    "mc_comm_bench_dense_alltoall": (_r, [_vp, C.c_size_t, _i, _i, C.POINTER(C.c_float)]),
}


def _bind():
    lib = load()
    for name, (res, args) in _PROTOS.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args
    return lib


lib = _bind()


def text(b):
    """A C string result as str ("" for NULL)."""
    return b.decode("utf-8", "replace") if b else ""
