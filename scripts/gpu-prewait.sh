#!/usr/bin/env bash
# gpu-prewait.sh - MC_GPU_PREWAIT=1 (src/gpu/mc_gpu_prewait.cuh, perf-notes
# 28): first the GPU tests with it over both transports (a failure stops
# the script: keep the device time), then EP8 on one GPU, 1 and 128 tokens,
# copying and registered, against the default in one call: the default grid
# (10 at EP8), and prewait with grids of 10, 14 and 28 blocks. Median and
# p99 per point last; JSON to $OUT (or ./gpu-out).
set -uo pipefail
out=${OUT:-$PWD/gpu-out}
mkdir -p "$out"
cd "$(dirname "$0")/.."
{ cmake -S . -B build-dev -DMC_CUDA=ON -DMC_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=Release &&
  cmake --build build-dev -j"$(nproc)"; } > "$out/build.log" 2>&1 || { tail -30 "$out/build.log"; echo "BUILD FAILED"; exit 1; }
L="scripts/mc-launch.sh 8 --"
for tp in nvshmem p2p; do
  for t in gpu_ep_sizes gpu_stall gpu_graph gpu_split gpu_deepseek_shape gpu_zero_copy; do
    [ $tp = nvshmem ] && [ $t = gpu_zero_copy ] && continue
    if MC_GPU_PREWAIT=1 MC_TEST_TRANSPORT=$tp timeout 120 $L build-dev/mc_tests $t > "$out/test-$tp-$t.log" 2>&1
    then echo "prewait $tp $t PASS"; else echo "prewait $tp $t FAIL"; tail -8 "$out/test-$tp-$t.log"; exit 1; fi
  done
done
for rep in 1 2; do
  for v in "default" "MC_GPU_PREWAIT=1 MC_GPU_BLOCKS=10" "MC_GPU_PREWAIT=1 MC_GPU_BLOCKS=14" "MC_GPU_PREWAIT=1 MC_GPU_BLOCKS=28"; do
    e=; tag=default
    [ "$v" != default ] && e=$v && tag=$(echo "$v" | sed 's/MC_GPU_PREWAIT=1/pw/; s/MC_GPU_BLOCKS=/b/; s/ /-/g')
    for c in "copy 128" "zc 128" "copy 1" "zc 1"; do
      set -- $c; z=; [ $1 = zc ] && z=--zero-copy
      env $e timeout 90 $L build-dev/mc-bench --transport p2p --json -t $2 -r 200 -w 20 --no-dense $z \
        > "$out/pw-$tag-$1-t$2-$rep.json" 2>> "$out/bench.err"
    done
  done
done
python3 scripts/bench_table.py "$out" pw-
(cd "$out" && tar czf prewait.tgz --remove-files pw-*.json *.log bench.err 2>/dev/null || true)
