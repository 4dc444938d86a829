"""Errors: the right exception, the C message, nothing changed; timeouts."""
import threading

import numpy as np
import pytest

import moecomm
from moecomm import capi
from mc_ref import make_group_inputs
from mc_run import check_rank, one_round, run_threads

H, MT, E, K = 16, 4, 4, 2


@pytest.fixture
def a2a():
    group = moecomm.ThreadsGroup(1, 2000)
    comm = moecomm.Communicator.from_threads(group, 0, timeout_ms=2000)
    h = moecomm.AllToAll(comm, max_tokens=MT, num_experts=E, experts_per_token=K, hidden=H,
                         token_bytes=H * 4, combine_in_dtype="fp32", combine_out_dtype="fp32")
    yield h
    h.destroy()
    comm.destroy()


def _bufs(h):
    return h.alloc_expert_num_tokens(), h.alloc_expert_x(np.float32), h.alloc_expert_y(), h.alloc_out_tokens()


def _inputs(m):
    x = moecomm.empty_aligned((m, H), np.float32)
    x[:] = 1
    idx = np.tile(np.arange(K, dtype=np.int32), (m, 1))
    return x, idx


def _still_works(h, rng):
    inp = make_group_inputs(rng, MT, E, K, H, 0, False)
    cnt, ex, ey, out = _bufs(h)
    got = one_round(h, 0, inp, (cnt, ex, None, ey, out))
    check_rank([inp], 0, 1, h.num_local_experts, got, "fp32", "fp32")


def test_expert_out_of_range_raises_c_message(a2a, rng):
    cnt, ex, _, _ = _bufs(a2a)
    x, idx = _inputs(2)
    idx[1, 1] = E
    with pytest.raises(moecomm.MoecommInvalid) as ei:
        a2a.dispatch(cnt, ex, None, x, None, idx)
    assert ei.value.code == capi.ERR_INVALID_ARG
    assert ei.value.message == a2a.last_error() and str(E) in ei.value.message
    _still_works(a2a, rng)


def test_m_above_max_tokens_raises_c_message(a2a, rng):
    cnt, ex, _, _ = _bufs(a2a)
    x, idx = _inputs(MT + 1)
    with pytest.raises(moecomm.MoecommInvalid, match="max_tokens") as ei:
        a2a.dispatch(cnt, ex, None, x, None, idx)
    assert ei.value.message == a2a.last_error()
    _still_works(a2a, rng)


@pytest.mark.parametrize("what,arg", [
    ("indices dtype", "indices"), ("indices shape", "indices"), ("weights dtype", "weights"),
    ("dp_x rows", "dp_x"), ("dp_x bytes", "dp_x"), ("dp_x non-contiguous", "dp_x"),
    ("dp_x misaligned", "dp_x"), ("expert_x shape", "out_expert_x"), ("count dtype", "out_expert_num_tokens"),
    ("scale given", "dp_x_scale"), ("not an array", "dp_x"), ("bound_m dtype", "bound_m"),
])
def test_bad_dispatch_args_caught_in_python(a2a, what, arg):
    cnt, ex, _, _ = _bufs(a2a)
    x, idx = _inputs(2)
    kw = dict(out_expert_num_tokens=cnt, out_expert_x=ex, out_expert_x_scale=None, dp_x=x, dp_x_scale=None,
              indices=idx)
    misaligned = moecomm.empty_aligned((H * 8 + 16,), np.uint8)[4:4 + H * 8].view(np.float32).reshape(2, H)
    kw.update({
        "indices dtype": {"indices": idx.astype(np.int64)}, "indices shape": {"indices": idx[:, :1].copy()},
        "weights dtype": {"weights": np.ones((2, K), np.float64)}, "dp_x rows": {"dp_x": x[:1].copy()},
        "dp_x bytes": {"dp_x": np.zeros((2, H), np.float16)}, "dp_x non-contiguous": {"dp_x": np.zeros((2, 2 * H), np.float32)[:, ::2]},
        "dp_x misaligned": {"dp_x": misaligned}, "expert_x shape": {"out_expert_x": ex[:, :1]},
        "count dtype": {"out_expert_num_tokens": cnt.astype(np.int64)}, "scale given": {"dp_x_scale": x},
        "not an array": {"dp_x": [[0.0] * H] * 2}, "bound_m dtype": {"bound_m": np.array([1], np.int64)},
    }[what])
    with pytest.raises(moecomm.MoecommInvalid, match=arg):
        a2a.dispatch(**kw)
    assert a2a.last_error() == ""  # C never saw the call


def test_bad_combine_args_caught_in_python(a2a):
    cnt, ex, ey, out = _bufs(a2a)
    with pytest.raises(moecomm.MoecommInvalid, match="expert_y"):
        a2a.combine(out, np.zeros_like(ey, dtype=np.float16))
    with pytest.raises(moecomm.MoecommInvalid, match="out_tokens"):
        a2a.combine(out[:, :8].copy(), ey)


def test_bf16_wants_uint16_bits():
    group = moecomm.ThreadsGroup(1, 2000)
    with moecomm.Communicator.from_threads(group, 0) as comm:
        with moecomm.AllToAll(comm, max_tokens=MT, num_experts=E, experts_per_token=K, hidden=H) as h:
            assert h.alloc_expert_y().dtype == np.uint16
            with pytest.raises(moecomm.MoecommInvalid, match="bf16 in numpy: pass uint16"):
                h.combine(h.alloc_out_tokens(), h.alloc_expert_y().astype(np.float32))


def test_call_order_errors(a2a, rng):
    cnt, ex, ey, out = _bufs(a2a)
    x, idx = _inputs(2)
    with pytest.raises(moecomm.MoecommInvalid) as ei:
        a2a.combine(out, ey)
    assert ei.value.code == capi.ERR_INVALID_USAGE and "dispatch" in ei.value.message
    with pytest.raises(moecomm.MoecommInvalid) as ei:
        a2a.dispatch(cnt, ex, None, x, None, idx, do_send=False)
    assert ei.value.code == capi.ERR_INVALID_USAGE
    _still_works(a2a, rng)


def test_stalled_rank_times_out(rng):
    """Rank 1 never dispatches: rank 0 raises MoecommTimeout naming the phase."""
    timed_out = threading.Event()
    inp = make_group_inputs(rng, MT, E, K, H, 0, False)

    def rank_fn(rank, comm):
        h = moecomm.AllToAll(comm, max_tokens=MT, num_experts=E, experts_per_token=K, hidden=H,
                             token_bytes=H * 4, combine_in_dtype="fp32", combine_out_dtype="fp32")
        try:
            if rank == 0:
                cnt, ex, _, _ = _bufs(h)
                with pytest.raises(moecomm.MoecommTimeout) as ei:
                    h.dispatch(cnt, ex, None, inp["x"], None, inp["idx"])
                assert ei.value.code == capi.ERR_TIMEOUT and "rank 1" in ei.value.message.lower()
                with pytest.raises(moecomm.MoecommError) as later:
                    h.dispatch(cnt, ex, None, inp["x"], None, inp["idx"])
                assert later.value.code == capi.ERR_ABORTED
                timed_out.set()
            else:
                assert timed_out.wait(30)  # keep this rank's window alive until the peer gave up
            return ei.value.message if rank == 0 else None
        finally:
            h.destroy()

    msgs = run_threads(2, rank_fn, timeout_ms=300)
    print(msgs[0])
