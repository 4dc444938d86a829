#!/usr/bin/env bash
# gpu-zcgrid.sh - the registered combine-recv's grid where ranks share a GPU
# (perf-notes 38): 10 blocks ("cr10", MC_GPU_ZC_CRECV_BLOCKS=10) against 12
# ("cr12", the other kernels' grid), in halves and --whole, at 1 and 128
# tokens, alternating, twice; one run with --floor. When run 6 ran it, 10 was
# the default (the "cr10" runs set nothing); since perf-notes 39 the default
# is 12 again, so "cr10" now sets it. Expects build-dev built
# (scripts/gpu-run.sh builds it). JSON to $OUT (or ./gpu-out); a table last.
set -uo pipefail
out=${OUT:-$PWD/gpu-out}
mkdir -p "$out"
cd "$(dirname "$0")/.."
L="scripts/mc-launch.sh 8 --"
b() { # name env-or-- args...
  local name=$1 e=$2; shift 2
  [ "$e" = - ] && e=MC_NONE=1
  env "$e" timeout 120 $L build-dev/mc-bench --transport p2p --zero-copy --json -r 200 -w 20 --no-dense "$@" \
    > "$out/zg-$name.json" 2> "$out/zg-$name.err" || echo "{\"failed\": \"$name\"}" > "$out/zg-$name.json"
}
for rep in 1 2; do
  for tk in 1 128; do
    b "t$tk-cr10-$rep" MC_GPU_ZC_CRECV_BLOCKS=10 -t $tk
    b "t$tk-cr12-$rep" MC_GPU_ZC_CRECV_BLOCKS=12 -t $tk
    b "t$tk-cr10-whole-$rep" MC_GPU_ZC_CRECV_BLOCKS=10 -t $tk --whole
    b "t$tk-cr12-whole-$rep" MC_GPU_ZC_CRECV_BLOCKS=12 -t $tk --whole
  done
done
b t128-cr10-floor MC_GPU_ZC_CRECV_BLOCKS=10 -t 128 --floor
python3 -c "import json,sys; print('floor:', json.load(open(sys.argv[1])).get('floor_barrier'))" "$out/zg-t128-cr10-floor.json"
python3 scripts/bench_table.py "$out" zg- "== registered round, EP8 one H200 (median / p99 us); cr10 / cr12: MC_GPU_ZC_CRECV_BLOCKS"
(cd "$out" && tar czf zcgrid.tgz --remove-files zg-*.json zg-*.err 2>/dev/null || true)
