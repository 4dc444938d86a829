"""dispatch_packed and combine in the packed layouts, on thread ranks,
against the reference rows and against the batched layout's combine."""
import numpy as np
import pytest

import moecomm
from mc_packed_ref import check_recv, copy_recv, engine_rows, ref_rows
from mc_ref import make_group_inputs
from mc_run import check_out, one_round, run_threads

HIDDEN, MAX_TOKENS, K = 16, 6, 3

CASES = [  # layout, expert_align, sizing, world_size, group_size, combine_in, combine_out, scale floats, bound_m
    ("packed", 1, "counted", 1, 1, "fp32", "fp32", 0, False),
    ("packed", 1, "declared", 1, 1, "bf16", "bf16", 2, True),
    ("packed", 1, "counted", 2, 1, "bf16", "bf16", 2, True),
    ("packed", 1, "declared", 2, 1, "fp32", "fp32", 0, False),
    ("packed", 1, "declared", 4, 2, "fp16", "fp32", 4, True),
    ("packed", 1, "counted", 4, 2, "fp32", "bf16", 0, False),
    ("expert_sorted", 1, "counted", 1, 1, "fp32", "fp32", 0, False),
    ("expert_sorted", 4, "declared", 1, 1, "bf16", "fp32", 2, True),
    ("expert_sorted", 3, "counted", 2, 1, "bf16", "bf16", 2, False),
    ("expert_sorted", 1, "declared", 2, 1, "fp16", "fp16", 0, True),
    ("expert_sorted", 8, "declared", 4, 2, "fp32", "fp32", 0, True),
    ("expert_sorted", 2, "counted", 4, 1, "bf16", "fp32", 4, False),
]


def handle(comm, E, k, sf, in_dt, out_dt, **kw):
    return moecomm.AllToAll(comm, max_tokens=MAX_TOKENS, num_experts=E, experts_per_token=k, hidden=HIDDEN,
                            token_bytes=HIDDEN * 4, scale_bytes=sf * 4, combine_in_dtype=in_dt,
                            combine_out_dtype=out_dt, **kw)


@pytest.mark.parametrize("layout,align,sizing,ws,gs,in_dt,out_dt,sf,bound", CASES)
def test_packed_rounds_match_reference(rng, layout, align, sizing, ws, gs, in_dt, out_dt, sf, bound):
    E, k, rounds = 2 * ws, min(K, 2 * ws), 3
    inputs = [[make_group_inputs(rng, MAX_TOKENS, E, k, HIDDEN, sf, bound) for _ in range(ws // gs)]
              for _ in range(rounds)]
    slack = [int(s) for s in rng.integers(0, 3, ws)]  # declared capacities above the largest round's rows, or equal
    extra = [int(e) for e in rng.integers(0, 3, rounds)]  # rows of expert_y past the received ones

    def rank_fn(rank, comm):
        L = E // ws
        wants = [ref_rows(groups, rank, gs, L, k, layout, align) for groups in inputs]
        capacity = None if sizing == "counted" else max(1, max(w["rows"] for w in wants) + slack[rank])
        got = []
        with handle(comm, E, k, sf, in_dt, out_dt) as batched, \
                handle(comm, E, k, sf, in_dt, out_dt, recv_layout=layout, expert_align=align) as packed:
            bbufs = (batched.alloc_expert_num_tokens(), batched.alloc_expert_x(np.float32),
                     batched.alloc_expert_x_scale(), batched.alloc_expert_y(), batched.alloc_out_tokens())
            out = packed.alloc_out_tokens()
            for r, groups in enumerate(inputs):
                inp = groups[rank // gs]
                want_out = one_round(batched, rank, inp, bbufs)[3]
                recv = packed.dispatch_packed(inp["x"], inp["s"], inp["idx"], weights=inp["w"], bound_m=inp["bm"],
                                              capacity=capacity)
                assert recv.layout == layout and recv.x.dtype == np.float32
                rec = copy_recv(recv)
                rec["x_addr"] = recv.x.__array_interface__["data"][0]
                packed.combine(out, engine_rows(rec, rank, L, HIDDEN, in_dt, extra[r]))
                got.append((rec, want_out, out[:inp["valid"]].copy()))
        return got, wants

    for rank, (got, wants) in enumerate(run_threads(ws, rank_fn, group_size=gs)):
        for groups, want, (rec, batched_out, out) in zip(inputs, wants, got):
            check_recv(rec, want, groups, rank)
            # the same inputs give the batched layout's result, bit for bit
            np.testing.assert_array_equal(out.view(np.uint8), batched_out.view(np.uint8),
                                          err_msg=f"rank {rank}: combine differs from the batched layout's")
            check_out(groups[rank // gs], E // ws, out, in_dt, out_dt, rank)
        addrs = {rec["x_addr"] for rec, _, _ in got}
        if sizing == "declared":  # one capacity: the handle's buffers, reused
            assert len(addrs) == 1, f"rank {rank}: declared buffers reallocated"


def test_quantised_rows_are_the_batched_slots(rng):
    """bf16_to_e4m3 in a packed layout: x is the e4m3 bytes (uint8 by
    default) and x_scale the scales that the batched layout's slots hold for
    the same tokens."""
    ws, E, k, H = 2, 4, 2, 128
    groups = []
    for _ in range(ws):
        g = make_group_inputs(rng, MAX_TOKENS, E, k, H, 0, False)
        g["x"] = (g["x"].view(np.uint32) >> 16).astype(np.uint16)  # bf16 bits
        groups.append(g)
    kw = dict(max_tokens=MAX_TOKENS, num_experts=E, experts_per_token=k, hidden=H, dispatch_input="bf16_to_e4m3")

    def rank_fn(rank, comm):
        inp, L = groups[rank], E // ws
        with moecomm.AllToAll(comm, **kw) as b, moecomm.AllToAll(comm, recv_layout="packed", **kw) as p:
            cnt, ex, exs = b.alloc_expert_num_tokens(), b.alloc_expert_x(), b.alloc_expert_x_scale()
            b.dispatch(cnt, ex, exs, inp["x"], None, inp["idx"], weights=inp["w"])
            b.combine(b.alloc_out_tokens(), b.alloc_expert_y())
            recv = p.dispatch_packed(inp["x"], None, inp["idx"], weights=inp["w"], capacity=MAX_TOKENS * ws)
            assert recv.x.dtype == np.uint8 and recv.x.shape == (recv.rows, H)
            want = ref_rows(groups, rank, 1, L, k, "packed", 1)
            assert recv.rows == want["rows"]
            slots = [[(g, t) for g, gi in enumerate(groups) for t in range(gi["valid"]) if rank * L + le in gi["idx"][t]]
                     for le in range(L)]
            for i, (src, es) in enumerate(zip(want["src"], want["row_expert"])):
                j = slots[es[0]].index(src)
                np.testing.assert_array_equal(recv.x[i], ex[es[0], j], err_msg=f"rank {rank} row {i}")
                np.testing.assert_array_equal(recv.x_scale[i], exs[es[0], j])
            p.combine(p.alloc_out_tokens(), p.alloc_expert_y()[0, :recv.rows])
        return True

    assert all(run_threads(ws, rank_fn))


@pytest.mark.parametrize("layout", ["packed", "expert_sorted"])
def test_a_rank_receiving_nothing(rng, layout):
    """Every token goes to rank 0's experts: rank 1 receives no row, counted
    or declared, and its combine takes an expert_y of no rows."""
    ws, E, k = 2, 4, 2
    groups = [make_group_inputs(rng, MAX_TOKENS, E, k, HIDDEN, 0, False) for _ in range(ws)]
    for g in groups:
        g["idx"][:] = rng.permuted(np.tile(np.arange(k, dtype=np.int32), (g["idx"].shape[0], 1)), axis=1)

    def rank_fn(rank, comm):
        L, inp, got = E // ws, groups[rank], []
        want = ref_rows(groups, rank, 1, L, k, layout, 1)
        with handle(comm, E, k, 0, "fp32", "fp32", recv_layout=layout) as a2a:
            for capacity in (None, max(want["rows"], 1), None):
                recv = a2a.dispatch_packed(inp["x"], None, inp["idx"], weights=inp["w"], capacity=capacity)
                rec = copy_recv(recv)
                check_recv(rec, want, groups, rank)
                out = a2a.alloc_out_tokens()
                a2a.combine(out, engine_rows(rec, rank, L, HIDDEN, "fp32", 0))
                check_out(inp, L, out[:inp["valid"]], "fp32", "fp32", rank)
                got.append(rec["rows"])
        return got

    rows = run_threads(ws, rank_fn)
    assert rows[1] == [0, 0, 0] and min(rows[0]) > 0
