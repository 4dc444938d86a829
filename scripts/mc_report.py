#!/usr/bin/env python3
"""mc_report.py - reports from what mc-bench writes: its JSON and its traces.

  mc_report.py table DIR PREFIX [TITLE]
      one line per DIR/PREFIX*.json written by mc-bench --json: median and
      p99 of dispatch and combine in us, the dense baseline where there is
      one, how the ranks ran, the verdict. A file that is not a result (a run
      that failed) says so.
  mc_report.py plot sizes SIZES_JSON OUT.png
      receive-buffer bytes per rank against world size, from
      `mc-bench --sizes` (the layout header's own arithmetic), beside what a
      layout with a buffer per (expert, token) would take for the same shape:
      num_experts x max_tokens x (record + one row of combine input).
  mc_report.py plot latency DIR OUT.png [LABEL]
      median dispatch and combine (band: to p99) against tokens per rank,
      from DIR/*.json written by `mc-bench --json` of one shape, one world
      size and one timing mode.
  mc_report.py vs-pplx DIR
      moecomm beside pplx-kernels, one table, from what
      `scripts/gpu-run.sh pplx` left in DIR.
  mc_report.py trace PREFIX [--skip N] [--own-clock]
      the kernel timeline of a run traced with MC_GPU_TRACE=PREFIX.

plot needs matplotlib; the others the standard library alone.
"""
import glob
import json
import os
import re
import statistics
import sys


def table(args):
    """table DIR PREFIX [TITLE]: mc-bench --json results, a line each."""
    d, prefix = args[0], args[1]
    if len(args) > 2:
        print(args[2])
    for f in sorted(glob.glob(os.path.join(d, prefix + "*.json"))):
        name = os.path.basename(f)[len(prefix):-5]
        try:
            j = json.load(open(f))
            l = j["latency_us"]
        except (ValueError, KeyError):
            print(f"{name:24s} unreadable or failed")
            continue
        dense = j.get("dense_alltoall", {}).get("median_us", 0)
        print(f'{name:24s} disp {l["dispatch"]["median"]:7.1f} p99 {l["dispatch"]["p99"]:7.1f}  '
              f'comb {l["combine"]["median"]:7.1f} p99 {l["combine"]["p99"]:7.1f}  dense {dense:7.1f}  '
              f'{j["ranks_as"]} {j["verdict"]}')


def _pyplot():
    # imported here: the other reports must run where matplotlib is missing
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_sizes(src, out):
    plt = _pyplot()
    s = json.load(open(src))
    record = s["token_bytes"] + s["scale_bytes"]
    per_expert = s["experts"] * s["tokens"] * (record + 2 * s["hidden"])  # bf16 combine input
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(s["world_size"], [b / 2**20 for b in s["buffer_bytes"]], "o-", label="moecomm (mc-bench --sizes)")
    ax.plot(s["world_size"], [per_expert / 2**20] * len(s["world_size"]), "--", color="tab:red",
            label="a buffer per (expert, token)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("world size (ranks)")
    ax.set_ylabel("receive buffers, MiB per rank")
    ax.set_title("%d experts, top-%d, hidden %d, %d-byte tokens + %d scale bytes, %d tokens per group"
                 % (s["experts"], s["topk"], s["hidden"], s["token_bytes"], s["scale_bytes"], s["tokens"]), fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def plot_latency(src_dir, out, label):
    plt = _pyplot()
    runs = sorted((json.load(open(f)) for f in glob.glob(src_dir + "/*.json")), key=lambda j: j["config"]["tokens"])
    runs = [j for j in runs if j.get("verdict") == "PASS"]
    if not runs:
        raise SystemExit("no PASS results in " + src_dir)
    t = [j["config"]["tokens"] for j in runs]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for key, color in (("dispatch", "tab:blue"), ("combine", "tab:orange")):
        med = [j["latency_us"][key]["median"] for j in runs]
        ax.plot(t, med, "o-", color=color, label="moecomm %s" % key)
        ax.fill_between(t, med, [j["latency_us"][key]["p99"] for j in runs], color=color, alpha=0.15)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("tokens per rank")
    ax.set_ylabel("us (band: median to p99)")
    c = runs[0]["config"]
    ax.set_title("%s: EP%d, %s, %s" % (label, c["world_size"], runs[0]["transport"], runs[0]["date"][:10]), fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def plot(args):
    """plot sizes SIZES_JSON OUT.png | plot latency DIR OUT.png [LABEL]: the plots docs/benchmarks.md shows."""
    if len(args) >= 3 and args[0] == "sizes":
        plot_sizes(args[1], args[2])
    elif len(args) >= 3 and args[0] == "latency":
        plot_latency(args[1], args[2], args[3] if len(args) > 3 else "")
    else:
        raise SystemExit(__doc__)


# vs-pplx: the shapes gpu-run.sh pplx runs, as pplx-kernels' benchmark names
# them (tokens, experts, topk, hidden)
PPLX_SHAPES = {"dsv3-1": (1, 256, 8, 7168), "dsv3-128": (128, 256, 8, 7168), "small-128": (128, 64, 6, 2048)}


def pplx_parse(text):
    """{(kernels, (tokens, experts, topk, hidden)): {"dispatch": (whole, send, recv), "combine": (...)}}.
    pplx-kernels' benchmark prints a section per kernel family ("Intra-Node": its IPC kernels,
    "Inter-Node": its NVSHMEM kernels), then a line per shape:
      T E K H | whole +- sd  send +- sd  recv +- sd  GB/s | (the same for combine)
    with every time in us (means over its samples)."""
    out, fam = {}, None
    for line in text.splitlines():
        if "Intra-Node" in line:
            fam = "ipc"
        elif "Inter-Node" in line:
            fam = "nvshmem"
        parts = line.split("|")
        if fam is None or len(parts) != 3:
            continue
        try:
            shape = tuple(int(x) for x in parts[0].split())
        except ValueError:
            continue
        for phase, part in zip(("dispatch", "combine"), parts[1:]):
            us = [float(x) for x in re.findall(r"([\d.]+)us", part)]
            if len(us) >= 6:
                out.setdefault((fam, shape), {})[phase] = (us[0], us[2], us[4])
    return out


def _med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def _fmt(x):
    return f"{x:7.1f}" if x is not None else "      -"


def vs_pplx(args):
    """vs-pplx DIR - moecomm beside pplx-kernels, one table.

    Reads what `scripts/gpu-run.sh pplx` left in DIR:
      mc-ep<N>-<shape>-<timing>-<rep>.json  mc-bench --json (timing: whole or halves)
      pplx-ep<N>-<rep>.txt                  pplx-kernels' own benchmark (run-pplx.sh)
    and prints, per world size and shape, the medians over the repetitions of
    each: dispatch and combine timed whole (one span from send to recv), and the
    send and recv halves timed apart, moecomm beside pplx-kernels' IPC kernels
    ("Intra-Node") and its NVSHMEM kernels ("Inter-Node"), and the ratio
    moecomm / pplx IPC. pplx prints means over 100 samples; moecomm medians over
    its rounds (both are given as printed)."""
    d = args[0]
    eps = sorted({int(re.search(r"-ep(\d+)-", f).group(1)) for f in glob.glob(os.path.join(d, "*-ep*-*"))})
    for ep in eps:
        pp = {}
        for f in sorted(glob.glob(os.path.join(d, f"pplx-ep{ep}-*.txt"))):
            for k, v in pplx_parse(open(f, errors="replace").read()).items():
                for ph, t in v.items():
                    pp.setdefault(k, {}).setdefault(ph, []).append(t)
        print(f"EP{ep}: median us (moecomm: median of rounds; pplx: mean of its samples), median over repetitions")
        print(f"{'shape':10s} {'phase':8s} | {'mc whole':>8s} {'pplx ipc':>8s} {'ratio':>6s} {'pplx nvs':>8s} |"
              f" {'mc send':>7s} {'mc recv':>7s} {'ipc send':>8s} {'ipc recv':>8s}")
        for name, shape in PPLX_SHAPES.items():
            mc = {}
            for timing in ("whole", "halves"):
                for f in glob.glob(os.path.join(d, f"mc-ep{ep}-{name}-{timing}-*.json")):
                    try:
                        j = json.load(open(f))
                        lat = j["latency_us"]
                    except (ValueError, KeyError):
                        continue
                    if j.get("verdict") == "FAIL":
                        mc.setdefault("fail", []).append(f)
                    for ph in ("dispatch", "combine"):
                        if timing == "whole":
                            mc.setdefault((ph, "whole"), []).append(lat[ph]["median"])
                        else:
                            mc.setdefault((ph, "send"), []).append(lat[ph + " send"]["median"])
                            mc.setdefault((ph, "recv"), []).append(lat[ph + " recv"]["median"])
            for ph in ("dispatch", "combine"):
                ipc = pp.get(("ipc", shape), {}).get(ph, [])
                nvs = pp.get(("nvshmem", shape), {}).get(ph, [])
                w, iw = _med(mc.get((ph, "whole"), [])), _med([t[0] for t in ipc])
                ratio = f"{w / iw:6.2f}" if w and iw else "     -"
                print(f"{name:10s} {ph:8s} | {_fmt(w)}  {_fmt(iw)} {ratio} {_fmt(_med([t[0] for t in nvs]))}  |"
                      f" {_fmt(_med(mc.get((ph, 'send'), [])))} {_fmt(_med(mc.get((ph, 'recv'), [])))}"
                      f"  {_fmt(_med([t[1] for t in ipc]))}  {_fmt(_med([t[2] for t in ipc]))}")
            if mc.get("fail"):
                print(f"{name:10s} moecomm FAILED its check: {', '.join(os.path.basename(x) for x in mc['fail'])}")
        if not pp:
            print(f"(pplx-kernels: nothing parsed; its output is in {d}/pplx-ep{ep}-*.txt)")


TRACE_KERNELS = ["prep", "pack", "dsend", "drecv", "csend", "crecv"]
def trace_slots(n):
    """The names of a kernel's n stamps: its first and last block's start, checkpoints, its end."""
    return ["start", "last-start"] + [f"c{i}" for i in range(n - 3)] + ["end"]
TRACE_NOTES = {
    ("prep", "c0"): "checked, routed, placed (a block barrier)", ("prep", "c1"): "shared memory zeroed",
    ("prep", "c2"): "ids checked, ranks found (thread 0)", ("prep", "c3"): "places found",
    ("prep", "c4"): "the call's outcome stored (the publishing block's thread 0)",
    ("prep", "c5"): "metas stored (the publishing block, a barrier)",
    ("prep", "c6"): "the ids in hand (the one-warp prep)",
    ("dsend", "c3"): "the header's targets in hand (piece 0's warp)",
    ("dsend", "c4"): "a piece's stores issued (the last sending warp)",
    ("drecv", "c3"): "records' signal seen (the last copying warp)",
    ("drecv", "c6"): "a record's targets in hand (the last copying warp)",
    ("drecv", "c7"): "an item's stores issued (the last copying warp)",
    ("csend", "c0"): "the route entry in hand (the block path's thread 0)",
    ("csend", "c3"): "the rows loaded and summed (the block path's thread 0)",
    ("crecv", "c2"): "the rows loaded and summed (the last summing warp)",
    ("dsend", "c2"): "the last sending block's start (block 0 apart)",
    ("drecv", "c5"): "the call's outcome seen (thread 0)",
    ("dsend", "c0"): "pieces stored (signals next)", ("dsend", "c1"): "counts moved on (last block out)",
    ("drecv", "c0"): "metas arrived", ("drecv", "c1"): "slot bases computed", ("drecv", "c2"): "records copied",
    ("drecv", "c4"): "counts moved on (the grid's last warp, every block arrived)",
    ("drecv", "end"): "the last block's stores performed (a fence, traced runs only)",
    ("csend", "c1"): "rows stored (thread 0's warp)",
    ("csend", "c2"): "rows: thread 0's release (after the block barrier)",
    ("crecv", "c0"): "rows arrived", ("crecv", "c1"): "sums stored (thread 0)",
    ("crecv", "c3"): "counts moved on (the grid's last warp, every block arrived)",
    ("crecv", "end"): "the last block's stores performed (a fence, traced runs only)",
}


def trace(args):
    """trace PREFIX [--skip N] [--own-clock] - the kernel timeline of a traced run.

    Reads PREFIX.<rank> files written with MC_GPU_TRACE=PREFIX (src/gpu/mc_gpu_host.c):
    one line per round, MC_TK_N kernels x MC_TRACE_SLOTS globaltimer stamps (ns). For each
    round, times are taken from the earliest prep-kernel start over all ranks
    (one GPU: one clock). Prints, per event, the median over rounds of each
    rank's time in us, and of the latest rank's. --own-clock: each rank's times from its
    own first prep start (ranks on different GPUs: their clocks are not one)."""
    prefix = args[0]
    skip = int(args[args.index("--skip") + 1]) if "--skip" in args else None
    own = "--own-clock" in args
    files = sorted((f for f in glob.glob(prefix + ".*") if f.rsplit(".", 1)[1].isdigit()),
                   key=lambda f: int(f.rsplit(".", 1)[1]))
    ranks = [[list(map(int, l.split()))[1:] for l in open(f) if l.strip()] for f in files]
    if not ranks or not ranks[0]:
        print("no trace lines under", prefix)
        return
    widths = {len(l) for r in ranks for l in r}
    if len(widths) != 1 or next(iter(widths)) % len(TRACE_KERNELS):
        print("trace lines of", sorted(widths), "stamps: not", len(TRACE_KERNELS), "kernels of the same number each")
        return
    slots = trace_slots(next(iter(widths)) // len(TRACE_KERNELS))
    n = min(len(r) for r in ranks)
    if skip is None:
        skip = n // 5  # warm-up rounds
    rows = {}
    for i in range(skip, n):
        starts = [r[i][0] for r in ranks if r[i][0]]
        if not starts:
            continue
        t0 = min(starts)
        for k, kn in enumerate(TRACE_KERNELS):
            for s, sn in enumerate(slots):
                vals = [r[i][k * len(slots) + s] for r in ranks]
                if not any(vals):
                    continue
                base = [r[i][0] if own else t0 for r in ranks]
                rel = [(v - b) / 1000.0 if v and b else float("nan") for v, b in zip(vals, base)]
                rows.setdefault((kn, sn), []).append(rel)
    W = len(ranks)
    print(f"kernel timeline, us from the first prep start, median of {n - skip} rounds, {W} ranks")
    print(f"{'event':22s}" + "".join(f"{'r' + str(r):>8s}" for r in range(W)) + f"{'latest':>9s}  note")
    for (kn, sn), per_round in rows.items():
        cols = [statistics.median([x[r] for x in per_round if x[r] == x[r]] or [float("nan")]) for r in range(W)]
        latest = statistics.median([max(v for v in x if v == v) for x in per_round])
        print(f"{kn + '.' + sn:22s}" + "".join(f"{c:8.1f}" for c in cols) + f"{latest:9.1f}  {TRACE_NOTES.get((kn, sn), '')}")


# subcommand: (function, the fewest arguments it takes)
COMMANDS = {"table": (table, 2), "plot": (plot, 0), "vs-pplx": (vs_pplx, 1), "trace": (trace, 1)}


def main():
    if len(sys.argv) < 2 or sys.argv[1] not in COMMANDS or len(sys.argv) - 2 < COMMANDS[sys.argv[1]][1]:
        sys.stderr.write(__doc__)
        sys.exit(2)
    COMMANDS[sys.argv[1]][0](sys.argv[2:])


if __name__ == "__main__":
    main()
