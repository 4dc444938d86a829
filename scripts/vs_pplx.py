#!/usr/bin/env python3
"""vs_pplx.py DIR - moecomm beside pplx-kernels, one table.

Reads what `scripts/gpu-run.sh pplx` left in DIR:
  mc-ep<N>-<shape>-<timing>-<rep>.json  mc-bench --json (timing: whole or halves)
  pplx-ep<N>-<rep>.txt                  pplx-kernels' own benchmark (run-pplx.sh)
and prints, per world size and shape, the medians over the repetitions of
each: dispatch and combine timed whole (one span from send to recv), and the
send and recv halves timed apart, moecomm beside pplx-kernels' IPC kernels
("Intra-Node") and its NVSHMEM kernels ("Inter-Node"), and the ratio
moecomm / pplx IPC. pplx prints means over 100 samples; moecomm medians over
its rounds (both are given as printed)."""
import glob
import json
import os
import re
import statistics
import sys

SHAPES = {"dsv3-1": (1, 256, 8, 7168), "dsv3-128": (128, 256, 8, 7168), "small-128": (128, 64, 6, 2048)}


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


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def fmt(x):
    return f"{x:7.1f}" if x is not None else "      -"


def main():
    d = sys.argv[1]
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
        for name, shape in SHAPES.items():
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
                w, iw = med(mc.get((ph, "whole"), [])), med([t[0] for t in ipc])
                ratio = f"{w / iw:6.2f}" if w and iw else "     -"
                print(f"{name:10s} {ph:8s} | {fmt(w)}  {fmt(iw)} {ratio} {fmt(med([t[0] for t in nvs]))}  |"
                      f" {fmt(med(mc.get((ph, 'send'), [])))} {fmt(med(mc.get((ph, 'recv'), [])))}"
                      f"  {fmt(med([t[1] for t in ipc]))}  {fmt(med([t[2] for t in ipc]))}")
            if mc.get("fail"):
                print(f"{name:10s} moecomm FAILED its check: {', '.join(os.path.basename(x) for x in mc['fail'])}")
        if not pp:
            print(f"(pplx-kernels: nothing parsed; its output is in {d}/pplx-ep{ep}-*.txt)")


if __name__ == "__main__":
    main()
