#!/usr/bin/env python3
"""bench_table.py DIR PREFIX [TITLE]: one line per DIR/PREFIX*.json written by
mc-bench --json (the device scripts' A/B runs): median and p99 of dispatch
and combine in us, the dense baseline where there is one, how the ranks ran,
the verdict. A file that is not a result (a run that failed) says so."""
import glob
import json
import os
import sys

d, prefix = sys.argv[1], sys.argv[2]
if len(sys.argv) > 3:
    print(sys.argv[3])
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
