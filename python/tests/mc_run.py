"""Running ranks as threads, and one checked MoE round per rank."""
import threading

import numpy as np

import moecomm
from mc_ref import expert_fn, from_storage, ref_combine, ref_dispatch


# The timeout of the threads group (its allgathers: creates, barriers) and,
# unless a test asks for a timeout of its own, of the communicators: they
# wait only for live threads, which a loaded machine can hold back for long.
GROUP_TIMEOUT_MS = 30000


def run_threads(world_size, fn, *, group_size=1, timeout_ms=GROUP_TIMEOUT_MS, join_s=60):
    """fn(rank, comm) on world_size threads; returns results, re-raises the first error."""
    group = moecomm.ThreadsGroup(world_size, GROUP_TIMEOUT_MS)
    results, errors = [None] * world_size, [None] * world_size

    def body(r):
        try:
            comm = moecomm.Communicator.from_threads(group, r, group_size=group_size, timeout_ms=timeout_ms)
            try:
                results[r] = fn(r, comm)
            finally:
                comm.destroy()
        except BaseException as e:  # noqa: BLE001
            errors[r] = e

    threads = [threading.Thread(target=body, args=(r,)) for r in range(world_size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(join_s)
        assert not t.is_alive(), "a rank thread hung"
    group.close()
    for e in errors:
        if e is not None:
            raise e
    return results


def run_expert(a2a, rank, counts, ex, ey):
    L = a2a.num_local_experts
    counts, ex, ey = np.asarray(counts), np.asarray(ex), np.asarray(ey)  # torch CPU tensors share memory
    for le in range(L):
        n = int(counts[le])
        ey[le, :n] = expert_fn(ex[le, :n], rank * L + le, a2a.in_dtype)


def one_round(a2a, rank, inp, bufs, split=False):
    """dispatch, expert, combine on this rank; returns copies of what it received."""
    cnt, ex, exs, ey, out = bufs
    bound = None if inp["bm"] is None else np.array([inp["bm"]], np.int32)
    halves = [(True, False), (False, True)] if split else [(True, True)]
    for s, r in halves:
        a2a.dispatch(cnt, ex, exs, inp["x"], inp["s"], inp["idx"], bound, s, r, weights=inp["w"])
    run_expert(a2a, rank, cnt, ex, ey)
    for s, r in halves:
        a2a.combine(out, ey, s, r)
    v = inp["valid"]
    return _copy(cnt), _copy(ex), None if exs is None else _copy(exs), _copy(out[:v])


def _copy(a):
    """A numpy copy of a numpy array or a torch CPU tensor."""
    return a.numpy().copy() if not isinstance(a, np.ndarray) and hasattr(a, "numpy") else np.array(a)


def check_rank(groups, rank, group_size, L, got, in_dt, out_dt, masked=()):
    """Dispatch slots exactly; combine output against the reference (the
    ranks in masked left out)."""
    cnt, ex, exs, out = got
    slots = ref_dispatch(groups, rank, L, masked)
    assert list(cnt) == [len(s) for s in slots], f"rank {rank}: counts"
    for le, sl in enumerate(slots):
        for j, (g, t) in enumerate(sl):
            np.testing.assert_array_equal(ex[le, j], groups[g]["x"][t], err_msg=f"rank {rank} expert {le} slot {j}")
            if exs is not None:
                np.testing.assert_array_equal(exs[le, j], groups[g]["s"][t])
    check_out(groups[rank // group_size], L, out, in_dt, out_dt, rank, masked)


def check_out(inp, L, out, in_dt, out_dt, rank, masked=()):
    want, mag = ref_combine(inp, L, in_dt, out_dt, masked)
    if out_dt == "fp32":
        np.testing.assert_array_equal(out, want, err_msg=f"rank {rank}: combine out")
    else:
        err = np.abs(from_storage(out, out_dt) - from_storage(want, out_dt))
        assert np.all(err <= 2e-2 * mag + 1e-6), f"rank {rank}: combine out, max err {err.max()}"
