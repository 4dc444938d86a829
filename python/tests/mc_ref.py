"""The numpy reference model of dispatch and combine (semantics of moecomm.h)."""
import numpy as np


def to_storage(a, dt):
    """fp32 values -> numpy storage of dt (bf16: uint16 bits, round to nearest even)."""
    a = np.ascontiguousarray(a, dtype=np.float32)
    if dt == "fp32":
        return a
    if dt == "fp16":
        return a.astype(np.float16)
    u = a.view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def from_storage(a, dt):
    if dt == "bf16":
        return (a.astype(np.uint32) << 16).view(np.float32)
    return a.astype(np.float32)


def expert_fn(x, e, dt):
    """The tests' 'expert GEMM': y = x * (1 + e/8), stored in dt."""
    return to_storage(x * np.float32(1 + e / 8), dt)


def make_group_inputs(rng, max_tokens, num_experts, k, hidden, scale_floats, with_bound):
    m = int(rng.integers(1, max_tokens + 1))
    x = rng.standard_normal((m, hidden)).astype(np.float32)
    s = rng.standard_normal((m, scale_floats)).astype(np.float32) if scale_floats else None
    idx = np.argsort(rng.random((m, num_experts)), axis=1)[:, :k].astype(np.int32)
    w = rng.random((m, k)).astype(np.float32)
    bm = int(rng.integers(0, m + 1)) if with_bound else None
    return {"x": x, "s": s, "idx": idx, "w": w, "bm": bm, "valid": m if bm is None else bm}


def ref_dispatch(groups, rank, L, masked=()):
    """Per local expert of `rank`: the (group, token) of each slot, in slot
    order (groups of one rank: a masked rank's group sends nothing)."""
    slots = []
    for le in range(L):
        e = rank * L + le
        slots.append([(g, t) for g, inp in enumerate(groups) if g not in masked
                      for t in range(inp["valid"]) if e in inp["idx"][t]])
    return slots


def ref_combine(inp, L, in_dt, out_dt, masked=()):
    """(out storage [valid][hidden], sum |w y| in fp32) for one group's
    tokens; the experts of masked ranks drop out."""
    n, hidden = inp["valid"], inp["x"].shape[1]
    out = np.zeros((n, hidden), np.float32)
    mag = np.zeros((n, hidden), np.float32)
    for t in range(n):
        experts = sorted(int(e) for e in inp["idx"][t])
        weight = {int(e): inp["w"][t][j] for j, e in enumerate(inp["idx"][t])}
        total = np.zeros(hidden, np.float32)
        for r in sorted({e // L for e in experts} - set(masked)):
            acc = np.zeros(hidden, np.float32)
            for e in (e for e in experts if e // L == r):
                y = from_storage(expert_fn(inp["x"][t], e, in_dt), in_dt)
                acc += np.float32(weight[e]) * y
                mag[t] += np.abs(np.float32(weight[e]) * y)
            total += from_storage(to_storage(acc, in_dt), in_dt)
        out[t] = total
    return to_storage(out, out_dt), mag
