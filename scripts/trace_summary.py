#!/usr/bin/env python3
"""trace_summary.py PREFIX [--skip N] [--own-clock] - the kernel timeline of a traced run.

Reads PREFIX.<rank> files written with MC_GPU_TRACE=PREFIX (src/gpu/mc_gpu_host.c):
one line per round, MC_TK_N kernels x 8 globaltimer stamps (ns). For each
round, times are taken from the earliest prep-kernel start over all ranks
(one GPU: one clock). Prints, per event, the median over rounds of each
rank's time in us, and of the latest rank's. --own-clock: each rank's times from its
own first prep start (ranks on different GPUs: their clocks are not one)."""
import glob, statistics, sys

KERNELS = ["prep", "pack", "dsend", "drecv", "csend", "crecv"]
SLOTS = ["start", "last-start", "c0", "c1", "c2", "c3", "c4", "end"]
NOTES = {("prep", "c0"): "checked, routed, placed (a block barrier)", ("prep", "c1"): "shared memory zeroed",
         ("prep", "c2"): "ids checked, ranks found (thread 0)", ("prep", "c3"): "places found",
         ("dsend", "c0"): "pieces stored (signals next)", ("dsend", "c1"): "counts moved on (last block out)",
         ("drecv", "c0"): "metas arrived", ("drecv", "c1"): "slot bases computed", ("drecv", "c2"): "records copied",
         ("drecv", "c3"): "arrived at the count (every block)", ("drecv", "c4"): "counts moved on (last block out)",
         ("crecv", "c0"): "rows arrived", ("crecv", "c1"): "sums stored (thread 0)",
         ("crecv", "c2"): "arrived at the count (every block)", ("crecv", "c3"): "counts moved on (last block out)",
         }


def main():
    prefix = sys.argv[1]
    skip = int(sys.argv[sys.argv.index("--skip") + 1]) if "--skip" in sys.argv else None
    own = "--own-clock" in sys.argv
    files = sorted((f for f in glob.glob(prefix + ".*") if f.rsplit(".", 1)[1].isdigit()),
                   key=lambda f: int(f.rsplit(".", 1)[1]))
    ranks = [[list(map(int, l.split()))[1:] for l in open(f) if l.strip()] for f in files]
    if not ranks or not ranks[0]:
        print("no trace lines under", prefix)
        return
    n = min(len(r) for r in ranks)
    if skip is None:
        skip = n // 5  # warm-up rounds
    rows = {}
    for i in range(skip, n):
        starts = [r[i][0] for r in ranks if r[i][0]]
        if not starts:
            continue
        t0 = min(starts)
        for k, kn in enumerate(KERNELS):
            for s, sn in enumerate(SLOTS):
                vals = [r[i][k * 8 + s] for r in ranks]
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
        print(f"{kn + '.' + sn:22s}" + "".join(f"{c:8.1f}" for c in cols) + f"{latest:9.1f}  {NOTES.get((kn, sn), '')}")


if __name__ == "__main__":
    main()
