#!/usr/bin/env python3
"""ep_model.py - a MODEL, not a measurement, of moecomm's dispatch and
combine latency across nodes (EP16 to EP128, 8 GPUs a node), beside the
per-expert design (one copy per (token, expert), as pplx-kernels sends) and
the figures other projects published. No figure it prints was measured
across nodes; docs/multi-node.md says how far to trust it.

  python3 scripts/ep_model.py                 the tables
  python3 scripts/ep_model.py --sizes         window bytes per rank, EP8..EP256
  python3 scripts/ep_model.py --check [--mc-bench PATH]
        CI: the byte counts against figures mc-bench measured (below), basic
        sanity, the tables print; with PATH, the layout arithmetic against
        that build's `mc-bench --sizes`.

Inputs, all named below:
- bytes and messages per rank per round, from the layout (src/core/mc_layout.h,
  copied here function for function) and the expected number of distinct
  destination ranks per token under uniform random top-k routing, computed
  exactly: W * (1 - C(E - E/W, k) / C(E, k));
- where they go: peers on the same node over NVLink (direct stores), others
  through the NIC, one put-with-signal per record or row (the staged path);
- link figures (LINK), and the local cost of a phase (LOCAL_US), which is
  measured, but on one node.
Standard library only, so that CI needs nothing installed.
"""
import argparse
import json
import math
import subprocess
import sys

# ---- the shape: DeepSeek-V3's MoE layer, one rank per group ----
SHAPE = dict(experts=256, topk=8, hidden=7168, token_bytes=7168, scale_bytes=56 * 4, in_elem=2, group=1)
GPUS_PER_NODE = 8

# ---- link figures (named parameters; change them to model another fabric) ----
LINK = dict(
    nic_GBps=50.0,  # a 400 Gb/s NIC per GPU (InfiniBand NDR, ConnectX-7)
    rtt_us=17.0,  # a GPU-initiated RDMA round trip; a phase pays one crossing, half of it
    msg_us=0.10,  # per put-with-signal (or signal) leaving through the NIC; see msg_note
    nvlink_GBps=450.0,  # NVLink per direction among the GPUs of a node (H100/H200 class)
    staged_extra_us=2.0,  # dispatch only: the pack kernel that stages tokens for puts
)
# Why 0.1 us a message: DeepEP-class libraries publish about 110-124 us for an
# EP16 dispatch of 128 tokens, about 1024 (token, expert) messages per GPU, so
# whatever a message costs them is at most about 0.11 us; GPU-initiated puts
# (IBGDA) are the case they measured. A CPU proxy (IBRC, libfabric/EFA) costs
# more: the sensitivity lines print 0.5 and 2 us.

# Local cost of a phase: everything but the network, taken from moecomm's
# measured EP2 whole phase on two H200s over NVLink (mc-bench --transport p2p
# --whole -r 300, medians, 2026-11-30 22:31 UTC, the kernels of 79a57a7;
# docs/multi-node.md says where the raw data is): launches and events (a
# half's 7.5 us with no bytes, mc_a2a_barrier alone, is inside), the prep, the copies. Assumed not to grow with the world size (it
# does, a little: more records to copy in).
LOCAL_US = {"dispatch": {1: 24.3, 128: 30.6}, "combine": {1: 17.6, 128: 24.4}}

# Figures other projects published, not measured here (EP16, 128 tokens, us).
PUBLISHED = {
    16: {
        "dispatch": "pplx-kernels IBGDA 622; DeepEP-class 110-124 (ConnectX-7)",
        "combine": "pplx-kernels IBGDA 668; DeepEP-class 186-203 (ConnectX-7)",
    }
}

# What mc-bench counted on the cpu transport (bytes per rank per round, the
# library's own counters), a machine like the one CI uses (2 cores, no GPU),
# 2026-12-02, build: make build.
# Uniform random routing, seed 1, averaged over 26 rounds of every rank.
MEASURED = [
    dict(cmd="./build/mc-bench -n 8 -t 128 --json", world=8, tokens=128, dispatch=5088465, combine=9716844),
    dict(cmd="./build/mc-bench -n 16 -e 256 --json", world=16, tokens=128, dispatch=6274587, combine=11982380),
]
# Sampling noise of those figures is about 0.1% (26 x W x 128 tokens); the check allows 0.5%.
BYTE_TOLERANCE = 0.005
# `mc-bench --sizes` (-t 128, then -t 1), same build and date: window + workspace per rank, EP1..EP256.
MEASURED_SIZES = {
    128: [5653680, 10298256, 19588960, 38171168, 75335968, 149665776, 298325488, 595644960, 1190279840],
    1: [82176, 117632, 190112, 335888, 627824, 1211904, 2380160, 4716720, 9385776],
}


# ---- the layout, as src/core/mc_layout.h computes it ----
def align16(x):
    return (x + 15) // 16 * 16


def record_bytes(s):
    header = align16(8 + s["topk"] * 12)  # token, n_targets, then (expert, pos, weight) per k
    return align16(header + s["token_bytes"] + s["scale_bytes"])


def meta_bytes(s, world):
    # n_records, a count per local expert, a digest (two words): 64-bit words, the round in each
    return align16((3 + s["experts"] // world) * 8)


def row_bytes(s):
    return s["hidden"] * s["in_elem"]


def window_bytes(s, world, tokens):
    """The symmetric allocation of one handle (nvshmem_malloc on the nvshmem transport)."""
    src_cap = -(-tokens // s["group"])
    w = align16(8 * world * 8)  # signals
    w += world * meta_bytes(s, world)  # disp_meta
    w += world * src_cap * record_bytes(s)  # disp_recv
    w += world * tokens * row_bytes(s)  # comb_recv
    w += src_cap * record_bytes(s) + world * meta_bytes(s, world)  # disp_send, meta_send
    w += world * src_cap * row_bytes(s)  # comb_send
    return align16(w)


def workspace_bytes(s, world, tokens):
    """The private workspace (cudaMalloc on GPU transports)."""
    E, k, L, src_cap = s["experts"], s["topk"], s["experts"] // world, -(-tokens // s["group"])
    o = align16(align16(24 * 4) + 4 * 8 + 8)  # scalars, stats, round
    o += 8 * world * 8 + align16(world * 4)  # seen, expect
    o += world * src_cap * align16(16 + k * 12)  # route entries
    o += align16(tokens * k * 2) + align16(tokens * 2)  # dests, n_dests
    o += align16(world * L * 4) + align16((world + E) * 4)  # base, sendcnt
    o += align16(s["hidden"] * 4) + align16(src_cap * k * 4)  # acc, ridx
    o += align16(world * src_cap * 4)  # rowdone
    o += align16(-(-tokens // 32) * (E + 2 * world) * 4)  # pcount
    return o + align16(L * 8) + align16(world) + align16(world * 8)  # expert load, mask, masks set together


# ---- routing ----
def p_rank(s, world):
    """Probability that a given rank holds at least one of a token's top-k
    experts, for k distinct experts drawn uniformly (exact)."""
    E, k = s["experts"], s["topk"]
    return 1.0 - math.comb(E - E // world, k) / math.comb(E, k)


def dests_per_token(s, world):
    return world * p_rank(s, world)


# ---- counts per rank per round ----
def library_bytes(s, world, tokens):
    """What the library's counters report (mc_a2a_get_stats, mc-bench):
    dispatch = records + a meta to every rank; combine = rows."""
    recs = tokens * dests_per_token(s, world)
    return recs * record_bytes(s) + world * meta_bytes(s, world), recs * row_bytes(s)


def per_expert_bytes(s, tokens):
    """mc-bench's figure for one copy per (token, expert): payload and scales, no header."""
    pairs = tokens * s["topk"]
    return pairs * (s["token_bytes"] + s["scale_bytes"]), pairs * row_bytes(s)


def wire(s, world, tokens, design):
    """Expected bytes and messages a rank sends per phase, split into NVLink
    (peers of its node, itself included) and NIC (every other peer). A
    message is one put-with-signal or one signal."""
    node = min(world, GPUS_PER_NODE)
    remote = world - node
    if design == "moecomm":
        p = p_rank(s, world)
        recs_local, recs_remote = node * p * tokens, remote * p * tokens
        # dispatch: a record per (token, destination rank), a meta to every rank;
        # combine: a pre-reduced row per received record (as many, by symmetry),
        # and the barrier signal to every rank
        d = dict(nvl=recs_local * record_bytes(s), nic=recs_remote * record_bytes(s) + remote * meta_bytes(s, world),
                 msgs=recs_remote + remote)
        c = dict(nvl=recs_local * row_bytes(s), nic=recs_remote * row_bytes(s), msgs=recs_remote + remote)
    else:
        # one put per (token, expert) each way; dispatch also signals a token
        # count per expert, combine a sync signal per rank (pplx-kernels does both)
        pairs, frac = tokens * s["topk"], remote / world
        tok = s["token_bytes"] + s["scale_bytes"]
        d = dict(nvl=pairs * (1 - frac) * tok, nic=pairs * frac * tok, msgs=pairs * frac + s["experts"] * frac)
        c = dict(nvl=pairs * (1 - frac) * row_bytes(s), nic=pairs * frac * row_bytes(s), msgs=pairs * frac + remote)
    return {"dispatch": d, "combine": c}


def latency(s, world, tokens, design, phase, link=LINK):
    """Modelled whole-phase time (us) and what bounds it: bytes through the
    NIC (B), messages through the NIC (M) or NVLink (N). The three go on in
    parallel; the local cost and one network crossing are paid on top."""
    w = wire(s, world, tokens, design)[phase]
    terms = {"B": w["nic"] / (link["nic_GBps"] * 1e3), "M": w["msgs"] * link["msg_us"],
             "N": w["nvl"] / (link["nvlink_GBps"] * 1e3)}
    bound = max(terms, key=terms.get)
    t = LOCAL_US[phase][tokens] + (link["staged_extra_us"] if phase == "dispatch" else 0.0)
    if world > GPUS_PER_NODE:
        t += link["rtt_us"] / 2
    return t + terms[bound], bound


# ---- output ----
WORLDS = (16, 32, 64, 128)
TOKENS = (1, 128)


def print_tables(out=sys.stdout):
    s = SHAPE
    p = lambda *a: print(*a, file=out)
    p("moecomm across nodes: a MODEL (no figure below was measured across nodes)")
    p(f"shape: {s['experts']} experts, top-{s['topk']}, hidden {s['hidden']}, fp8 tokens + {s['scale_bytes'] // 4} fp32 "
      f"scales, bf16 combine; {GPUS_PER_NODE} GPUs a node; uniform random routing (expected values, exact)")
    p(f"link: NIC {LINK['nic_GBps']:g} GB/s a GPU, one crossing {LINK['rtt_us'] / 2:g} us (half a {LINK['rtt_us']:g} us "
      f"RDMA round trip), {LINK['msg_us']:g} us a message, NVLink {LINK['nvlink_GBps']:g} GB/s")
    p(f"local: moecomm's measured EP2 whole phase on two H200s (NVLink, 2026-11-30): dispatch "
      f"{LOCAL_US['dispatch'][1]:g} / {LOCAL_US['dispatch'][128]:g} us, combine {LOCAL_US['combine'][1]:g} / "
      f"{LOCAL_US['combine'][128]:g} us at 1 / 128 tokens; dispatch + {LINK['staged_extra_us']:g} us for staging")
    p("")
    p("Sent through the NIC per rank per round (mc = moecomm, one copy per (token, rank); pe = per-expert design)")
    p(f"{'EP':>4} {'tokens':>6} {'dests/tok':>9} | {'dispatch KB mc':>14} {'pe':>7} {'msgs mc':>8} {'pe':>6} | "
      f"{'combine KB mc':>13} {'pe':>7} {'msgs mc':>8} {'pe':>6}")
    for t in TOKENS:
        for W in WORLDS:
            m, e = wire(s, W, t, "moecomm"), wire(s, W, t, "per_expert")
            p(f"{W:>4} {t:>6} {dests_per_token(s, W):>9.2f} | {m['dispatch']['nic'] / 1e3:>14.0f} "
              f"{e['dispatch']['nic'] / 1e3:>7.0f} {m['dispatch']['msgs']:>8.0f} {e['dispatch']['msgs']:>6.0f} | "
              f"{m['combine']['nic'] / 1e3:>13.0f} {e['combine']['nic'] / 1e3:>7.0f} {m['combine']['msgs']:>8.0f} "
              f"{e['combine']['msgs']:>6.0f}")
    p("")
    p("Modelled latency of a whole phase, us (bound: B = NIC bytes, M = NIC messages, N = NVLink)")
    p(f"{'EP':>4} {'tokens':>6} | {'dispatch mc':>11} {'pe':>9} | {'combine mc':>10} {'pe':>9} | published by others, not measured here")
    for t in TOKENS:
        for W in WORLDS:
            cells = []
            for ph in ("dispatch", "combine"):
                for d in ("moecomm", "per_expert"):
                    v, b = latency(s, W, t, d, ph)
                    cells.append(f"{v:.0f} {b}")
            pub = PUBLISHED.get(W) if t == 128 else None
            note = f"dispatch {pub['dispatch']}; combine {pub['combine']}" if pub else ""
            p(f"{W:>4} {t:>6} | {cells[0]:>11} {cells[1]:>9} | {cells[2]:>10} {cells[3]:>9} | {note}")
    p("")
    p("Sensitivity, moecomm, us (dispatch / combine) for other per-message costs:")
    for W, t in ((16, 128), (64, 128), (128, 1)):
        row = []
        for mu in (0.1, 0.5, 2.0):
            link = dict(LINK, msg_us=mu)
            d, c = latency(s, W, t, "moecomm", "dispatch", link)[0], latency(s, W, t, "moecomm", "combine", link)[0]
            row.append(f"{mu:g} us: {d:.0f} / {c:.0f}")
        p(f"  EP{W}, {t} token{'s' if t > 1 else ''}: " + ", ".join(row))


def symmetric_size(window):
    """A suggested NVSHMEM_SYMMETRIC_SIZE for one handle: a quarter more than
    the window, 128 MiB for NVSHMEM's own use of the heap, in steps of 256 MiB."""
    step = 256 << 20
    return -(-(int(window * 1.25) + (128 << 20)) // step) * step


def print_sizes(out=sys.stdout):
    s = SHAPE
    print("Per rank, one handle of the DeepSeek-V3 shape (bytes from the layout header's arithmetic)", file=out)
    print(f"{'EP':>4} {'tokens':>6} {'window MiB':>11} {'+ workspace MiB':>16} {'NVSHMEM_SYMMETRIC_SIZE':>23}", file=out)
    for t in (128, 1):
        for W in (8, 16, 32, 64, 128, 256):
            win, ws = window_bytes(s, W, t), workspace_bytes(s, W, t)
            print(f"{W:>4} {t:>6} {win / 2**20:>11.1f} {(win + ws) / 2**20:>16.1f} {symmetric_size(win) >> 20:>19} MiB",
                  file=out)


# ---- the CI check ----
def check(mc_bench=None):
    s, fails = SHAPE, []

    def expect(ok, what):
        if not ok:
            fails.append(what)

    for m in MEASURED:
        d, c = library_bytes(s, m["world"], m["tokens"])
        for name, model, got in (("dispatch", d, m["dispatch"]), ("combine", c, m["combine"])):
            rel = abs(model - got) / got
            print(f"bytes EP{m['world']} {name}: model {model:.0f}, measured {got} ({m['cmd']}): {rel * 100:.3f}%")
            expect(rel <= BYTE_TOLERANCE, f"EP{m['world']} {name} bytes off by {rel * 100:.2f}% (> {BYTE_TOLERANCE:.1%})")
    worlds = [1 << i for i in range(9)]
    for t, sizes in MEASURED_SIZES.items():
        mine = [window_bytes(s, W, t) + workspace_bytes(s, W, t) for W in worlds]
        expect(mine == sizes, f"layout arithmetic at {t} tokens: {mine} != recorded mc-bench --sizes {sizes}")
    if mc_bench:
        for t in MEASURED_SIZES:
            live = json.loads(subprocess.run([mc_bench, "--sizes", "-t", str(t)], check=True, capture_output=True,
                                             text=True).stdout)
            mine = [window_bytes(s, W, t) + workspace_bytes(s, W, t) for W in live["world_size"]]
            expect(mine == live["buffer_bytes"],
                   f"{mc_bench} --sizes -t {t} says {live['buffer_bytes']}, this model {mine}: "
                   "src/core/mc_layout.h changed; bring this script (and docs/multi-node.md) up to date")
    # sanity: more ranks -> more destinations a token, more bytes through the NIC,
    # less saved against the per-expert design, slower phases at 128 tokens
    dests = [dests_per_token(s, W) for W in WORLDS]
    expect(all(a < b for a, b in zip(dests, dests[1:])) and dests[-1] < s["topk"], f"dests per token {dests}")
    for ph in ("dispatch", "combine"):
        nic = [wire(s, W, 128, "moecomm")[ph]["nic"] for W in WORLDS]
        ratio = [wire(s, W, 128, "moecomm")[ph]["nic"] / wire(s, W, 128, "per_expert")[ph]["nic"] for W in WORLDS]
        lat = [latency(s, W, 128, "moecomm", ph)[0] for W in WORLDS]
        expect(all(a < b for a, b in zip(nic, nic[1:])), f"{ph} NIC bytes not growing with EP: {nic}")
        expect(all(a < b for a, b in zip(ratio, ratio[1:])) and ratio[0] < 1, f"{ph} mc/pe byte ratio {ratio}")
        expect(all(a < b for a, b in zip(lat, lat[1:])), f"{ph} latency not growing with EP: {lat}")
        for t in TOKENS:
            for W in WORLDS:
                v = latency(s, W, t, "moecomm", ph)[0]
                expect(LOCAL_US[ph][t] < v < 10000, f"{ph} EP{W} {t} tokens: {v} us")
    import io
    buf = io.StringIO()
    print_tables(buf)
    text = buf.getvalue()
    firsts = {str(W) for W in WORLDS}
    rows = [l for l in text.splitlines() if "|" in l and l.split()[0] in firsts]
    expect(len(rows) == 2 * len(WORLDS) * len(TOKENS), f"the tables have {len(rows)} rows")
    expect("MODEL" in text and "not measured here" in text, "the table's labels")
    sys.stdout.write(text)
    for f in fails:
        print("FAIL:", f)
    print("ep_model check:", "FAIL" if fails else "PASS")
    return 1 if fails else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="CI: cross-check and sanity, then the tables")
    ap.add_argument("--mc-bench", help="with --check: compare the layout arithmetic with this mc-bench --sizes")
    ap.add_argument("--sizes", action="store_true", help="window and workspace bytes per rank, EP8..EP256")
    a = ap.parse_args()
    if a.check:
        return check(a.mc_bench)
    if a.sizes:
        print_sizes()
    else:
        print_tables()
    return 0


if __name__ == "__main__":
    sys.exit(main())
