#!/usr/bin/env python3
"""Turn mc-bench JSON files into the PNG plots docs/benchmarks.md shows.

usage: plot_bench.py RESULTS_DIR OUT_DIR [LABEL]   (LABEL: the machine, e.g. "H200, 8 ranks under MPS")

- latency.png: median dispatch and combine latency (and p99 as a band) against
  tokens per rank, beside the dense all-to-all baseline of the same run and the
  pplx-kernels figures DESIGN.md quotes for the same testbed (128 tokens).
- buffers.png: receive-buffer bytes per rank against tokens per rank, from the
  same runs, and (when RESULTS_DIR has sizes.json, from `mc-bench --sizes`)
  against world size at 128 tokens, beside the target (64 MiB) and
  pplx-kernels' ~2.2 GB.
Only files named bench-dsv3-t*.json are read (the DeepSeek-V3 shape).
"""
import glob
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def load(results):
    runs = []
    for f in glob.glob(os.path.join(results, "bench-dsv3-t*.json")):
        with open(f) as fh:
            j = json.load(fh)
        if j.get("verdict") not in ("PASS", "UNCHECKED"):
            continue
        if j["config"].get("whole") or j["config"].get("graph"):
            continue  # the other timing modes: tables only
        runs.append(j)
    runs.sort(key=lambda j: j["config"]["tokens"])
    return runs


def main():
    if len(sys.argv) not in (3, 4):
        print(__doc__)
        return 2
    runs = load(sys.argv[1])
    if not runs:
        print("no bench-dsv3-t*.json with a PASS verdict in", sys.argv[1])
        return 1
    os.makedirs(sys.argv[2], exist_ok=True)
    t = [j["config"]["tokens"] for j in runs]
    lat = lambda key, stat: [j["latency_us"][key][stat] for j in runs]  # noqa: E731
    dense = [j.get("dense_alltoall", {}).get("median_us", float("nan")) for j in runs]
    label = sys.argv[3] if len(sys.argv) == 4 else runs[0]["host"]
    title = "%s, EP%d, %s transport, %s" % (label, runs[0]["config"]["world_size"], runs[0]["transport"],
                                           runs[0]["date"][:10])

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for key, color in (("dispatch", "tab:blue"), ("combine", "tab:orange")):
        ax.plot(t, lat(key, "median"), "o-", color=color, label="moecomm %s (median)" % key)
        ax.fill_between(t, lat(key, "median"), lat(key, "p99"), color=color, alpha=0.15)
    ax.plot(t, dense, "s--", color="tab:gray", label="dense NVSHMEM all-to-all (same run)")
    ax.plot([128], [188], "v", color="tab:blue", mfc="none", label="pplx-kernels NVSHMEM dispatch (DESIGN.md)")
    ax.plot([128], [442], "v", color="tab:orange", mfc="none", label="pplx-kernels NVSHMEM combine (DESIGN.md)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("tokens per rank")
    ax.set_ylabel("latency, us (band: median to p99)")
    ax.set_title("DeepSeek-V3 layer: " + title, fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(sys.argv[2], "latency.png"), dpi=110)

    sizes_path = os.path.join(sys.argv[1], "sizes.json")
    sizes = json.load(open(sizes_path)) if os.path.exists(sizes_path) else None
    fig, axes = plt.subplots(1, 2 if sizes else 1, figsize=(11 if sizes else 7, 4), squeeze=False)
    ax = axes[0][0]
    buf = [j["buffer_bytes_per_rank"] / 2**20 for j in runs]
    ax.plot(t, buf, "o-", label="moecomm, measured (mc_a2a_get_stats), EP%d" % runs[0]["config"]["world_size"])
    ax.set_xlabel("tokens per rank (max_tokens)")
    if sizes:
        ax2 = axes[0][1]
        ax2.plot(sizes["world_size"], [b / 2**20 for b in sizes["buffer_bytes"]], "o-",
                 label="moecomm, from mc_layout.h (mc-bench --sizes), %d tokens" % sizes["tokens"])
        ax2.set_xlabel("world size (ranks)")
    for a in [x for row in axes for x in row]:
        a.axhline(64, color="tab:green", ls="--", label="target: 64 MiB at 128 tokens, EP8")
        a.axhline(2.2 * 1024, color="tab:red", ls=":", label="pplx-kernels, about 2.2 GB at 128 tokens, EP8")
        a.set_xscale("log", base=2)
        a.set_yscale("log")
        a.set_ylabel("receive buffers, MiB per rank")
        a.grid(True, which="both", alpha=0.3)
        a.legend(fontsize=7)
    fig.suptitle("Buffer memory, DeepSeek-V3 layer (" + title + ")", fontsize=9)
    fig.tight_layout()
    fig.savefig(os.path.join(sys.argv[2], "buffers.png"), dpi=110)
    print("wrote", os.path.join(sys.argv[2], "latency.png"), "and buffers.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
