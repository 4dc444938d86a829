"""The packed layouts' refusals: a declared capacity that overflows
(MoecommCapacity on every rank, then the next round works), recv buffers
too small (refused, nothing written), the wrong call for the layout, bad
arguments."""
import ctypes as C

import numpy as np
import pytest

import moecomm
from moecomm import capi
from moecomm.errors import check, error_for
from mc_packed_ref import check_recv, copy_recv, engine_rows, ref_rows
from mc_ref import make_group_inputs
from mc_run import check_out, check_rank, one_round, run_threads

H, MT, K = 16, 5, 2
LAYOUTS = [("packed", 1), ("expert_sorted", 2)]


def handle(comm, E, **kw):
    return moecomm.AllToAll(comm, max_tokens=MT, num_experts=E, experts_per_token=K, hidden=H, token_bytes=H * 4,
                            combine_in_dtype="fp32", combine_out_dtype="fp32", **kw)


def routed_to(rng, inp, E, L, rank):
    """Every token of `inp` gets one expert on `rank` (the others stay random)."""
    for t in range(inp["idx"].shape[0]):
        if not any(e // L == rank for e in inp["idx"][t]):
            inp["idx"][t, int(rng.integers(K))] = rank * L + int(rng.integers(L))
    return inp


def packed_round(a2a, rank, groups, layout, align, capacity):
    """dispatch_packed, the engine's rows, combine; checked against the reference."""
    L, inp = a2a.num_local_experts, groups[rank]
    recv = a2a.dispatch_packed(inp["x"], None, inp["idx"], weights=inp["w"], capacity=capacity)
    got = copy_recv(recv)
    check_recv(got, ref_rows(groups, rank, 1, L, K, layout, align), groups, rank)
    out = a2a.alloc_out_tokens()
    a2a.combine(out, engine_rows(got, rank, L, H, "fp32", 1))
    check_out(inp, L, out[:inp["valid"]], "fp32", "fp32", rank)


def test_capacity_error_is_exported():
    assert moecomm.MoecommCapacity is moecomm.errors.MoecommCapacity
    assert issubclass(moecomm.MoecommCapacity, moecomm.MoecommError)
    assert not issubclass(moecomm.MoecommCapacity, moecomm.MoecommInvalid)
    e = error_for(capi.ERR_CAPACITY, "text")
    assert type(e) is moecomm.MoecommCapacity and e.code == capi.ERR_CAPACITY and "MC_ERR_CAPACITY" in str(e)


@pytest.mark.parametrize("layout,align", LAYOUTS)
@pytest.mark.parametrize("ws", [2, 3])
def test_declared_capacity_overflow_raises_on_every_rank(rng, layout, align, ws):
    """One rank declares one row fewer than it receives: every rank raises
    MoecommCapacity naming it; the next round, declared large enough, and a
    counted one after it, come out right."""
    E = 2 * ws
    L = E // ws
    victim = int(rng.integers(ws))
    over = [routed_to(rng, make_group_inputs(rng, MT, E, K, H, 0, False), E, L, victim) for _ in range(ws)]
    then = [[make_group_inputs(rng, MT, E, K, H, 0, False) for _ in range(ws)] for _ in range(2)]
    print(f"rank {victim} overflows")

    def rank_fn(rank, comm):
        need = ref_rows(over, rank, 1, L, K, layout, align)["rows"]
        with handle(comm, E, recv_layout=layout, expert_align=align) as a2a:
            inp = over[rank]
            with pytest.raises(moecomm.MoecommCapacity) as ei:
                a2a.dispatch_packed(inp["x"], None, inp["idx"], weights=inp["w"],
                                    capacity=need - 1 if rank == victim else max(need, 1))
            assert ei.value.code == capi.ERR_CAPACITY
            with pytest.raises(moecomm.MoecommInvalid) as late:  # the round was dropped: no combine
                a2a.combine(a2a.alloc_out_tokens(), moecomm.empty_aligned((need, H), np.float32))
            assert late.value.code == capi.ERR_INVALID_USAGE
            packed_round(a2a, rank, then[0], layout, align, capacity=MT * ws * L * align)
            packed_round(a2a, rank, then[1], layout, align, capacity=None)
        return ei.value.message

    for msg in run_threads(ws, rank_fn):
        assert f"rank {victim} receives" in msg, msg


def _recv_struct(a2a, rows, k_cols, sentinel):
    """A raw mc_packed_recv_t over numpy arrays of `rows` rows (at least one
    allocated), every byte set to `sentinel`."""
    n, L, ws = max(rows, 1), a2a.num_local_experts, a2a.comm.world_size
    arrs = {"x": moecomm.empty_aligned((n, H), np.float32), "row_expert": np.empty((n,) + k_cols, np.int32),
            "row_weight": np.empty((n,) + k_cols, np.float32), "expert_count": np.empty(L, np.int32),
            "expert_offset": np.empty(L + 1, np.int32), "src_count": np.empty(ws, np.int32),
            "rows": np.empty(1, np.int64)}
    for a in arrs.values():
        a.view(np.uint8)[...] = sentinel
    r = capi.packed_recv()
    r.capacity = rows
    for name, a in arrs.items():
        setattr(r, name, a.ctypes.data)
    return r, arrs


@pytest.mark.parametrize("layout,align", LAYOUTS)
@pytest.mark.parametrize("sizing", ["counted", "declared"])
def test_recv_buffers_too_small_change_nothing(rng, layout, align, sizing):
    """Through the ctypes layer, halves apart: a recv half whose buffers hold
    one row fewer than it would write raises MoecommInvalid and writes
    nothing; the same call with buffers large enough then succeeds, and
    combine completes the round."""
    ws, E = 2, 4
    L = E // ws
    groups = [make_group_inputs(rng, MT, E, K, H, 0, False) for _ in range(ws)]
    for g in groups:  # token 0 goes to both ranks: each receives a row or more
        g["idx"][0] = [int(rng.integers(L)), L + int(rng.integers(L))]
    cols = (K,) if layout == "packed" else ()

    def rank_fn(rank, comm):
        want = ref_rows(groups, rank, 1, L, K, layout, align)
        inp, lib = groups[rank], capi.lib
        with handle(comm, E, recv_layout=layout, expert_align=align) as a2a:
            err = a2a.last_error
            declared, _ = _recv_struct(a2a, want["rows"], cols, 0)
            check(lib.mc_dispatch_packed(a2a.handle, inp["x"].ctypes.data, None, inp["idx"].ctypes.data,
                                         inp["w"].ctypes.data, inp["x"].shape[0], None,
                                         C.byref(declared) if sizing == "declared" else None, capi.SEND, None), err)
            if sizing == "counted":
                rows = C.c_int64(-1)
                check(lib.mc_dispatch_counts(a2a.handle, C.byref(rows), None, None), err)
                assert rows.value == want["rows"]
            small, arrs = _recv_struct(a2a, want["rows"] - 1, cols, 0xA5)
            with pytest.raises(moecomm.MoecommInvalid) as ei:
                check(lib.mc_dispatch_packed(a2a.handle, None, None, None, None, 0, None, C.byref(small),
                                             capi.RECV, None), err)
            assert ei.value.code == capi.ERR_INVALID_ARG and "capacity" in ei.value.message
            for name, a in arrs.items():
                assert (a.view(np.uint8) == 0xA5).all(), f"rank {rank}: {name} written by a refused call"
            fits, arrs = _recv_struct(a2a, want["rows"], cols, 0xA5)
            check(lib.mc_dispatch_packed(a2a.handle, None, None, None, None, 0, None, C.byref(fits), capi.RECV,
                                         None), err)
            got = {name: arrs[name][:want["rows"]] for name in ("x", "row_expert", "row_weight")}
            got.update(expert_count=arrs["expert_count"], expert_offset=arrs["expert_offset"],
                       src_count=arrs["src_count"], x_scale=None, rows=int(arrs["rows"][0]))
            check_recv(got, want, groups, rank)
            out = a2a.alloc_out_tokens()
            a2a.combine(out, engine_rows(got, rank, L, H, "fp32", 0))
            check_out(inp, L, out[:inp["valid"]], "fp32", "fp32", rank)
        return True

    assert all(run_threads(ws, rank_fn))


def test_layout_arguments_and_wrong_calls(rng):
    """recv_layout and expert_align checked (Python: the names, types; the
    library: the ranges); each layout's dispatch refused on the other's
    handle with the library's message, nothing changed; capacity and
    expert_y checked before C sees them."""
    E, L = 4, 4
    inp = make_group_inputs(rng, MT, E, K, H, 0, False)

    def rank_fn(rank, comm):
        with pytest.raises(moecomm.MoecommInvalid, match="recv_layout"):
            handle(comm, E, recv_layout="sorted")
        for layout, align in (("expert_sorted", 0), ("expert_sorted", 1025), ("packed", 2), ("batched", 4)):
            with pytest.raises(moecomm.MoecommInvalid, match="expert_align") as ei:
                handle(comm, E, recv_layout=layout, expert_align=align)
            assert ei.value.code == capi.ERR_INVALID_ARG  # the library's check, at create
        with pytest.raises(moecomm.MoecommInvalid, match="expert_align"):
            handle(comm, E, recv_layout="expert_sorted", expert_align=2.0)

        with handle(comm, E, recv_layout="expert_sorted", expert_align=4) as a2a:
            assert (a2a.config.recv_layout, a2a.config.expert_align) == (capi.LAYOUT_EXPERT_SORTED, 4)
            with pytest.raises(moecomm.MoecommInvalid) as ei:
                a2a.dispatch(a2a.alloc_expert_num_tokens(), a2a.alloc_expert_x(np.float32), None, inp["x"], None,
                             inp["idx"], weights=inp["w"])
            assert ei.value.code == capi.ERR_INVALID_USAGE and "mc_dispatch_packed" in ei.value.message
            for bad in (0, -3, 2.0, True, "8"):
                with pytest.raises(moecomm.MoecommInvalid, match="capacity"):
                    a2a.dispatch_packed(inp["x"], None, inp["idx"], weights=inp["w"], capacity=bad)
            packed_round(a2a, 0, [inp], "expert_sorted", 4, capacity=None)  # the handle works as before

            recv = a2a.dispatch_packed(inp["x"], None, inp["idx"], weights=inp["w"])
            got = copy_recv(recv)
            y = engine_rows(got, 0, L, H, "fp32", 0)
            out = a2a.alloc_out_tokens()
            if recv.rows:
                with pytest.raises(moecomm.MoecommInvalid, match="expert_y"):
                    a2a.combine(out, y[:-1].copy())
            with pytest.raises(moecomm.MoecommInvalid, match="expert_y"):
                a2a.combine(out, a2a.alloc_expert_y().astype(np.float32))  # the batched shape
            with pytest.raises(moecomm.MoecommInvalid, match="expert_y"):
                a2a.combine(out, y.astype(np.float16))
            a2a.combine(out, y)
            check_out(inp, L, out[:inp["valid"]], "fp32", "fp32", 0)

        with handle(comm, E) as a2a:
            for capacity in (None, 2 * MT):
                with pytest.raises(moecomm.MoecommInvalid) as ei:
                    a2a.dispatch_packed(inp["x"], None, inp["idx"], weights=inp["w"], capacity=capacity)
                assert ei.value.code == capi.ERR_INVALID_USAGE and "call mc_dispatch" in ei.value.message
            bufs = (a2a.alloc_expert_num_tokens(), a2a.alloc_expert_x(np.float32), None, a2a.alloc_expert_y(),
                    a2a.alloc_out_tokens())
            check_rank([inp], 0, 1, L, one_round(a2a, 0, inp, bufs), "fp32", "fp32")
        return True

    assert run_threads(1, rank_fn)[0]
