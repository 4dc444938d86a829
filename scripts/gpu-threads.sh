#!/usr/bin/env bash
# gpu-threads.sh - EP8 on one H200 with the ranks as threads of one process
# (mc-bench --threads, p2p; no MPS: the library splits the GPU's SMs between
# the threads) beside the same points with the ranks as processes under MPS
# (mc-launch.sh's share), alternating in one call: copying and registered,
# 1 and 128 tokens. Needs build-dev (gpu-run.sh builds it). JSON to $OUT (or
# ./gpu-out); a table last.
set -uo pipefail
out=${OUT:-$PWD/gpu-out}
mkdir -p "$out"
cd "$(dirname "$0")/.."
[ -x build-dev/mc-bench ] || { echo "build-dev/mc-bench missing: run scripts/gpu-run.sh first"; exit 1; }
for rep in 1 2; do
  for t in 128 1; do
    for z in "" --zero-copy; do
      v=copy; [ -n "$z" ] && v=zc
      MC_VERBOSE=1 timeout 120 scripts/mc-launch.sh 1 -- build-dev/mc-bench --transport p2p --threads --json -t $t \
        -r 200 -w 20 $z > "$out/th-threads-$v-t$t-$rep.json" 2> "$out/th-threads-$v-t$t-$rep.err"
      timeout 120 scripts/mc-launch.sh 8 -- build-dev/mc-bench --transport p2p --json -t $t -r 200 -w 20 --no-dense $z \
        > "$out/th-procs-$v-t$t-$rep.json" 2> "$out/th-procs-$v-t$t-$rep.err"
    done
  done
done
grep -h "blocks per kernel" "$out"/th-threads-copy-t128-1.err
python3 scripts/bench_table.py "$out" th- "== EP8 one H200, p2p: ranks as threads (no MPS) against processes (MPS) (median / p99 us)"
(cd "$out" && tar czf threads.tgz --remove-files th-*.json th-*.err 2>/dev/null || true)
