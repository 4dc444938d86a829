#!/usr/bin/env bash
# gpu-prewait-zc.sh - MC_GPU_PREWAIT=1 again, now that dispatch is fused
# (perf-notes 36, 40): the registered round at 128 tokens, EP8 on one H200,
# default against prewait, in halves and --whole, alternating, twice. Builds
# build-dev first. JSON to $OUT (or ./gpu-out); a table last.
set -uo pipefail
out=${OUT:-$PWD/gpu-out}
mkdir -p "$out"
cd "$(dirname "$0")/.."
{ cmake -S . -B build-dev -DMC_CUDA=ON -DMC_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=Release &&
  cmake --build build-dev --target mc-bench -j"$(nproc)"; } > "$out/build.log" 2>&1 || { tail -30 "$out/build.log"; echo "BUILD FAILED"; exit 1; }
L="scripts/mc-launch.sh 8 --"
b() { # name env-or-- args...
  local name=$1 e=$2; shift 2
  [ "$e" = - ] && e=MC_NONE=1
  env "$e" timeout 120 $L build-dev/mc-bench --transport p2p --zero-copy --json -r 200 -w 20 --no-dense -t 128 "$@" \
    > "$out/pz-$name.json" 2> "$out/pz-$name.err" || echo "{\"failed\": \"$name\"}" > "$out/pz-$name.json"
}
for rep in 1 2; do
  b "default-$rep" -
  b "prewait-$rep" MC_GPU_PREWAIT=1
  b "default-whole-$rep" - --whole
  b "prewait-whole-$rep" MC_GPU_PREWAIT=1 --whole
done
python3 scripts/bench_table.py "$out" pz- "== registered round, 128 tokens, EP8 one H200 (median / p99 us)"
(cd "$out" && tar czf prewait-zc.tgz --remove-files pz-*.json pz-*.err build.log 2>/dev/null || true)
