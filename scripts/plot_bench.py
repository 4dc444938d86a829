#!/usr/bin/env python3
"""plot_bench.py - the plots docs/benchmarks.md shows, from mc-bench's JSON.

  plot_bench.py sizes SIZES_JSON OUT.png
      receive-buffer bytes per rank against world size, from
      `mc-bench --sizes` (the layout header's own arithmetic), beside what a
      layout with a buffer per (expert, token) would take for the same shape:
      num_experts x max_tokens x (record + one row of combine input).
  plot_bench.py latency DIR OUT.png [LABEL]
      median dispatch and combine (band: to p99) against tokens per rank,
      from DIR/*.json written by `mc-bench --json` of one shape, one world
      size and one timing mode.
"""
import glob
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def sizes(src, out):
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


def latency(src_dir, out, label):
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


if __name__ == "__main__":
    if len(sys.argv) >= 4 and sys.argv[1] == "sizes":
        sizes(sys.argv[2], sys.argv[3])
    elif len(sys.argv) >= 4 and sys.argv[1] == "latency":
        latency(sys.argv[2], sys.argv[3], sys.argv[4] if len(sys.argv) > 4 else "")
    else:
        raise SystemExit(__doc__)
