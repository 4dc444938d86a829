#!/usr/bin/env bash
# gpu-share.sh - the SM share of the EP8 testbed (perf-notes 28-29): the
# launcher's 100/8 = 12% gives each rank 14 SMs (MPS hands out whole TPCs),
# DESIGN.md's testbed 16. In one call: build; a check that the build passes
# the base GPU tests; EP8 p2p (copying and registered) and nvshmem at 128
# tokens under MC_MPS_PERCENT=12 and 13, alternating, twice; at 13, 1 token
# and the two --whole variants; then mc-membench with the rows spread over
# the peers' memory (MB_PEERS). The grid each run used is in its .err
# (MC_VERBOSE=1). JSON and logs to $OUT (or ./gpu-out); a table last.
set -uo pipefail
out=${OUT:-$PWD/gpu-out}
mkdir -p "$out"
cd "$(dirname "$0")/.."
t0=$(date +%s)
{ cmake -S . -B build-dev -DMC_CUDA=ON -DMC_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=Release &&
  cmake --build build-dev -j"$(nproc)"; } > "$out/build.log" 2>&1 || { tail -30 "$out/build.log"; echo "BUILD FAILED"; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
L="scripts/mc-launch.sh 8 --"
for c in "nvshmem gpu_ep_sizes" "p2p gpu_ep_sizes" "p2p gpu_zero_copy"; do
  set -- $c
  if MC_TEST_TRANSPORT=$1 timeout 120 $L build-dev/mc_tests $2 > "$out/test-$1-$2.log" 2>&1
  then echo "$1 $2 PASS"; else echo "$1 $2 FAIL"; tail -8 "$out/test-$1-$2.log"; exit 1; fi
done
b() { # name pct transport args...
  local name=$1 pct=$2 tp=$3; shift 3
  MC_VERBOSE=1 MC_MPS_PERCENT=$pct timeout 120 $L build-dev/mc-bench --transport "$tp" --json -r 200 -w 20 "$@" \
    > "$out/sh-$name.json" 2> "$out/sh-$name.err" || echo "{\"failed\": \"$name\"}" > "$out/sh-$name.json"
}
for rep in 1 2; do
  for pct in 12 13; do
    b "p$pct-copy-t128-$rep" $pct p2p -t 128 --no-dense
    b "p$pct-zc-t128-$rep" $pct p2p -t 128 --no-dense --zero-copy
    b "p$pct-nvshmem-t128-$rep" $pct nvshmem -t 128
  done
done
b p13-copy-t1 13 p2p -t 1 --no-dense
b p13-zc-t1 13 p2p -t 1 --no-dense --zero-copy
b p13-copywhole-t128 13 p2p -t 128 --no-dense --whole
b p13-zcwhole-t128 13 p2p -t 128 --no-dense --whole --zero-copy
echo "== grids"; grep -h "blocks per kernel" "$out"/sh-p12-copy-t128-1.err "$out"/sh-p13-copy-t128-1.err
python3 scripts/bench_table.py "$out" sh- "== EP8 one H200 (median / p99 us; dense = nvshmem's padded all-to-all)"
MB_PEERS=1 MB_BLOCKS=10 MB_SKIP_ONE=1 MB_PROCS=8 timeout 240 bash scripts/gpu-membench.sh 2>&1 | tail -9
(cd "$out" && tar czf share.tgz --remove-files sh-*.json sh-*.err *.log membench.* 2>/dev/null || true)
echo "total: $(( $(date +%s) - t0 )) s"
