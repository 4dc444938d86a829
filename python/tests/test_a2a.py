"""Dispatch + combine on thread ranks against the numpy reference."""
import numpy as np
import pytest

import moecomm
from mc_ref import make_group_inputs
from mc_run import GROUP_TIMEOUT_MS, check_rank, one_round, run_threads

HIDDEN, MAX_TOKENS, K = 16, 6, 3

CASES = [  # world_size, group_size, combine_in, combine_out, scale floats, bound_m, split
    (1, 1, "fp32", "fp32", 0, False, False),
    (2, 1, "bf16", "bf16", 2, False, False),
    (2, 2, "bf16", "fp16", 0, True, False),
    (4, 1, "fp16", "fp32", 4, True, False),
    (4, 2, "fp32", "fp32", 2, False, True),
    (4, 2, "fp32", "bf16", 0, True, True),
    (4, 4, "fp32", "fp32", 0, False, False),
]


def _bufs(a2a, scale_floats):
    exs = a2a.alloc_expert_x_scale() if scale_floats else None
    return (a2a.alloc_expert_num_tokens(), a2a.alloc_expert_x(np.float32), exs,
            a2a.alloc_expert_y(), a2a.alloc_out_tokens())


@pytest.mark.parametrize("ws,gs,in_dt,out_dt,sf,bound,split", CASES)
def test_rounds_match_reference(rng, ws, gs, in_dt, out_dt, sf, bound, split):
    E, rounds = 2 * ws, 3
    groups_per_round = [[make_group_inputs(rng, MAX_TOKENS, E, min(K, E), HIDDEN, sf, bound)
                         for _ in range(ws // gs)] for _ in range(rounds)]

    def rank_fn(rank, comm):
        with moecomm.AllToAll(comm, max_tokens=MAX_TOKENS, num_experts=E, experts_per_token=min(K, E),
                              hidden=HIDDEN, token_bytes=HIDDEN * 4, scale_bytes=sf * 4,
                              combine_in_dtype=in_dt, combine_out_dtype=out_dt) as a2a:
            bufs = _bufs(a2a, sf)
            got = [one_round(a2a, rank, groups[rank // gs], bufs, split) for groups in groups_per_round]
            stats = a2a.get_stats()
            load, after_reset = a2a.get_expert_load(reset=True), a2a.get_expert_load()
        return got, stats, a2a.num_local_experts, load, after_reset

    results = run_threads(ws, rank_fn, group_size=gs)
    for rank, (got, stats, L, load, after_reset) in enumerate(results):
        assert stats["rounds"] == rounds
        for groups, g in zip(groups_per_round, got):
            check_rank(groups, rank, gs, L, g, in_dt, out_dt)
        # per-expert load: the rounds' counts (checked above) summed, then zero after the reset
        assert load.dtype == np.int64 and list(load) == list(sum(g[0].astype(np.int64) for g in got))
        assert not after_reset.any()


def test_mask_a_rank_then_clear(rng):
    """Rank 2 of 3 is masked while alive: ranks 0 and 1 run a round without
    it (its experts drop out), then all three clear the mask and run a full
    round; both checked against the reference; the mask's refusals."""
    ws, E, rounds = 3, 6, 2
    groups = [[make_group_inputs(rng, MAX_TOKENS, E, K, HIDDEN, 0, False) for _ in range(ws)] for _ in range(rounds)]
    sync = __import__("threading").Barrier(ws, timeout=30)

    def rank_fn(rank, comm):
        with moecomm.AllToAll(comm, max_tokens=MAX_TOKENS, num_experts=E, experts_per_token=K, hidden=HIDDEN,
                              token_bytes=HIDDEN * 4, combine_in_dtype="fp32", combine_out_dtype="fp32") as a2a:
            bufs, got = _bufs(a2a, 0), []
            with pytest.raises(moecomm.MoecommInvalid):
                a2a.mask_ranks([False, False])  # one value per rank
            if rank < 2:
                a2a.mask_ranks([False, False, True])
                assert list(a2a.get_mask()) == [False, False, True]
                got.append(one_round(a2a, rank, groups[0][rank], bufs))
            else:
                with pytest.raises(moecomm.MoecommError):
                    a2a.mask_ranks([False, False, True])  # not by the rank it leaves out
            sync.wait()
            a2a.mask_ranks([False, False, False])  # every rank: rank 2 is back
            assert not a2a.get_mask().any()
            got.append(one_round(a2a, rank, groups[1][rank], bufs))
        return got, a2a.num_local_experts

    for rank, (got, L) in enumerate(run_threads(ws, rank_fn)):
        if rank < 2:
            check_rank(groups[0], rank, 1, L, got[0], "fp32", "fp32", masked=(2,))
        check_rank(groups[1], rank, 1, L, got[-1], "fp32", "fp32")


def test_exit_with_a_rank_masked(rng):
    """Leaving the context manager with a rank masked: the barrier is the
    ranks still in (the communicator's would wait for the masked one)."""
    ws, E = 3, 6
    inputs = [make_group_inputs(rng, MAX_TOKENS, E, K, HIDDEN, 0, False) for _ in range(ws)]
    done = __import__("threading").Barrier(ws, timeout=30)

    def rank_fn(rank, comm):
        a2a = moecomm.AllToAll(comm, max_tokens=MAX_TOKENS, num_experts=E, experts_per_token=K, hidden=HIDDEN,
                               token_bytes=HIDDEN * 4, combine_in_dtype="fp32", combine_out_dtype="fp32")
        got = None
        if rank < 2:
            with a2a:
                a2a.mask_ranks([False, False, True])
                got = one_round(a2a, rank, inputs[rank], _bufs(a2a, 0))
        done.wait()  # rank 2 stays out, and lets go of its handle after the others
        if rank == 2:
            a2a.destroy()
        return got, a2a.num_local_experts

    for rank, (got, L) in enumerate(run_threads(ws, rank_fn)):
        if rank < 2:
            check_rank(inputs, rank, 1, L, got, "fp32", "fp32", masked=(2,))


def test_python_allgather_callback(rng):
    """A Communicator over a pure-Python allgather (the ctypes callback path)."""
    import threading
    ws, box, barrier = 2, {}, threading.Barrier(2, timeout=GROUP_TIMEOUT_MS / 1000)

    def make_allgather(rank):
        def allgather(data):
            box[rank] = data
            barrier.wait()
            out = b"".join(box[r] for r in range(ws))
            barrier.wait()
            return out
        return allgather

    groups = [make_group_inputs(rng, MAX_TOKENS, 4, 2, HIDDEN, 0, False) for _ in range(ws)]
    results, errors = [None] * ws, []

    def body(rank):
        try:
            comm = moecomm.Communicator(make_allgather(rank), rank, ws, timeout_ms=GROUP_TIMEOUT_MS)
            with moecomm.AllToAll(comm, max_tokens=MAX_TOKENS, num_experts=4, experts_per_token=2, hidden=HIDDEN,
                                  token_bytes=HIDDEN * 4, combine_in_dtype="fp32", combine_out_dtype="fp32") as a2a:
                results[rank] = one_round(a2a, rank, groups[rank], _bufs(a2a, 0)), a2a.num_local_experts
            comm.destroy()
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    ts = [threading.Thread(target=body, args=(r,)) for r in range(ws)]
    [t.start() for t in ts]
    [t.join(2 * GROUP_TIMEOUT_MS / 1000) for t in ts]
    assert not errors, errors
    for rank, (got, L) in enumerate(results):
        check_rank(groups, rank, 1, L, got, "fp32", "fp32")


def test_rank_leaving_early_does_not_crash_its_peers():
    """A thread rank that raises inside `with AllToAll(...)` destroys its handle at once; its
    peer then dispatches into that rank's window (kept mapped while the peer uses it) and gets
    a timeout naming the rank, not a crash."""
    outcome = {}

    def rank_fn(rank, comm):
        with moecomm.AllToAll(comm, max_tokens=4, num_experts=4, experts_per_token=2, hidden=HIDDEN,
                              token_bytes=HIDDEN * 4, combine_in_dtype="fp32", combine_out_dtype="fp32") as a2a:
            if rank == 0:
                raise RuntimeError("rank 0 leaves")
            x = np.ones((4, HIDDEN), np.float32)
            idx = np.array([[0, 1], [1, 2], [2, 3], [3, 0]], np.int32)
            try:
                a2a.dispatch(a2a.alloc_expert_num_tokens(), a2a.alloc_expert_x(np.float32), None, x, None, idx)
            except moecomm.MoecommTimeout as e:
                outcome["text"] = str(e)
        return None

    with pytest.raises(RuntimeError, match="rank 0 leaves"):
        run_threads(2, rank_fn, timeout_ms=300)
    assert "waiting for rank 0" in outcome["text"]


@pytest.mark.parametrize("ws,gs", [(2, 1), (4, 2)])
def test_int64_indices_match_reference(rng, ws, gs):
    """index_dtype="int64": the ids as torch.topk returns them, read in place."""
    E, rounds = 2 * ws, 2
    groups_per_round = [[make_group_inputs(rng, MAX_TOKENS, E, K, HIDDEN, 2, True) for _ in range(ws // gs)]
                        for _ in range(rounds)]

    def rank_fn(rank, comm):
        with moecomm.AllToAll(comm, max_tokens=MAX_TOKENS, num_experts=E, experts_per_token=K, hidden=HIDDEN,
                              token_bytes=HIDDEN * 4, scale_bytes=8, combine_in_dtype="fp32",
                              combine_out_dtype="fp32", index_dtype="int64") as a2a:
            bufs = _bufs(a2a, 2)
            got = []
            for groups in groups_per_round:
                inp = dict(groups[rank // gs], idx=groups[rank // gs]["idx"].astype(np.int64))
                got.append(one_round(a2a, rank, inp, bufs))
        return got, a2a.num_local_experts

    for rank, (got, L) in enumerate(run_threads(ws, rank_fn, group_size=gs)):
        for groups, g in zip(groups_per_round, got):
            check_rank(groups, rank, gs, L, g, "fp32", "fp32")


def test_index_dtype_checked(rng):
    """A handle's ids must come in its dtype; an int64 id past 2^32 is refused,
    never narrowed into a valid one."""
    inp = make_group_inputs(rng, MAX_TOKENS, 4, 2, HIDDEN, 0, False)

    def rank_fn(rank, comm):
        with pytest.raises(moecomm.MoecommInvalid, match="index_dtype"):
            moecomm.AllToAll(comm, max_tokens=MAX_TOKENS, num_experts=4, experts_per_token=2, hidden=HIDDEN,
                             index_dtype="int16")
        msgs = []
        for dt in ("int32", "int64"):
            with moecomm.AllToAll(comm, max_tokens=MAX_TOKENS, num_experts=4, experts_per_token=2, hidden=HIDDEN,
                                  token_bytes=HIDDEN * 4, combine_in_dtype="fp32", combine_out_dtype="fp32",
                                  index_dtype=dt) as a2a:
                cnt, ex, _, _, _ = _bufs(a2a, 0)
                other = inp["idx"].astype(np.int64 if dt == "int32" else np.int32)
                with pytest.raises(moecomm.MoecommInvalid, match=f"indices: dtype must be {dt}"):
                    a2a.dispatch(cnt, ex, None, inp["x"], None, other)
                if dt == "int64":
                    wide = inp["idx"].astype(np.int64)
                    wide[0, 1] += 1 << 32
                    with pytest.raises(moecomm.MoecommInvalid) as e:
                        a2a.dispatch(cnt, ex, None, inp["x"], None, wide)
                    msgs.append((str(e.value), int(wide[0, 1])))
        return msgs

    (msg, value), = run_threads(1, rank_fn)[0]
    assert "is not an expert id" in msg and f"={value} " in msg, msg
