"""The numpy reference of the packed receive layouts (moecomm.h,
mc_dispatch_packed), the tests' experts on them, and the checks."""
import numpy as np

import moecomm
from mc_ref import expert_fn, from_storage, to_storage

NAN_BITS = {"fp32": np.float32(np.nan), "fp16": np.float16(np.nan), "bf16": np.uint16(0x7FC0)}
STORAGE = {"fp32": np.float32, "fp16": np.float16, "bf16": np.uint16}


def ref_rows(groups, rank, group_size, L, k, layout, align):
    """What rank `rank` must receive, written from the header's rules: each
    row's source (group, token) or None for padding, its experts and weights
    (padded with -1 and 0), expert_count, expert_offset, src_count, rows."""
    world = len(groups) * group_size
    pairs = [[] for _ in range(L)]  # per local expert: (group, token, weight)
    packed = []                     # (group, token, experts, weights)
    src_count = [0] * world
    for g, inp in enumerate(groups):
        n = inp["valid"]
        chunk = -(-n // group_size)  # a group's members send contiguous chunks of its tokens
        for t in range(n):
            mine = sorted((int(e) - rank * L, inp["w"][t][j]) for j, e in enumerate(inp["idx"][t]) if e // L == rank)
            for le, w in mine:
                pairs[le].append((g, t, w))
            if mine:
                packed.append((g, t, [le for le, _ in mine], [w for _, w in mine]))
                src_count[g * group_size + t // chunk] += len(mine) if layout == "expert_sorted" else 1
    count = [len(p) for p in pairs]
    src, experts, weights = [], [], []
    if layout == "packed":
        offset = list(np.cumsum([0] + count))
        for g, t, es, ws in packed:
            src.append((g, t))
            experts.append(es + [-1] * (k - len(es)))
            weights.append(ws + [np.float32(0)] * (k - len(ws)))
    else:
        offset = [0]
        for le in range(L):
            for g, t, w in pairs[le]:
                src.append((g, t))
                experts.append(le)
                weights.append(w)
            pad = -(-count[le] // align) * align - count[le]
            src += [None] * pad
            experts += [-1] * pad
            weights += [np.float32(0)] * pad
            offset.append(len(src))
    return {"src": src, "row_expert": np.array(experts, np.int32).reshape((len(src), k) if layout == "packed"
                                                                          else (len(src),)),
            "row_weight": np.array(weights, np.float32).reshape((len(src), k) if layout == "packed" else (len(src),)),
            "expert_count": count, "expert_offset": [int(o) for o in offset], "src_count": src_count,
            "rows": len(src)}


def copy_recv(recv):
    """The PackedRecv's arrays copied (the declared way's are the handle's, reused)."""
    out = {name: (None if getattr(recv, name) is None else np.array(getattr(recv, name)))
           for name in ("x", "x_scale", "row_expert", "row_weight", "expert_count", "expert_offset", "src_count")}
    out["rows"] = recv.rows
    return out


def check_recv(got, want, groups, rank):
    """Every field exactly; x and x_scale row by row against the sender's."""
    rows = want["rows"]
    assert got["rows"] == rows, f"rank {rank}: rows {got['rows']}, expected {rows}"
    assert got["x"].shape[0] == rows and got["row_expert"].shape == want["row_expert"].shape, f"rank {rank}: shapes"
    np.testing.assert_array_equal(got["row_expert"], want["row_expert"], err_msg=f"rank {rank}: row_expert")
    np.testing.assert_array_equal(got["row_weight"], want["row_weight"], err_msg=f"rank {rank}: row_weight")
    for name in ("expert_count", "expert_offset", "src_count"):
        assert list(got[name]) == want[name], f"rank {rank}: {name} {list(got[name])}, expected {want[name]}"
    for i, s in enumerate(want["src"]):
        if s is None:  # padding: only its expert and weight are defined
            continue
        g, t = s
        np.testing.assert_array_equal(got["x"][i], groups[g]["x"][t], err_msg=f"rank {rank}: x row {i}")
        if got["x_scale"] is not None:
            np.testing.assert_array_equal(got["x_scale"][i], groups[g]["s"][t], err_msg=f"rank {rank}: scale row {i}")
    assert (got["x_scale"] is None) == (groups[0]["s"] is None)


def engine_rows(got, rank, L, hidden, in_dt, extra):
    """The rows combine takes, computed as an engine would: expert_sorted,
    the row's expert output; packed, the fp32 sum over the row's experts in
    ascending order of weight x output, rounded once to in_dt. Padding rows
    and `extra` rows past them hold NaN: combine must not read them."""
    y = moecomm.empty_aligned((got["rows"] + extra, hidden), STORAGE[in_dt])
    y[:] = NAN_BITS[in_dt]
    for i in range(got["rows"]):
        x = got["x"][i]
        if got["row_expert"].ndim == 1:
            if got["row_expert"][i] >= 0:
                y[i] = expert_fn(x, rank * L + int(got["row_expert"][i]), in_dt)
            continue
        acc = np.zeros(hidden, np.float32)
        for e, w in zip(got["row_expert"][i], got["row_weight"][i]):
            if e < 0:
                break
            acc += np.float32(w) * from_storage(expert_fn(x, rank * L + int(e), in_dt), in_dt)
        y[i] = to_storage(acc, in_dt)
    return y
