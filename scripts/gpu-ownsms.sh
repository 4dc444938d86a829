#!/usr/bin/env bash
# gpu-ownsms.sh - the EP8 testbed with each rank on SMs of its own
# (perf-notes 37). Under MPS at the launcher's 100/8 = 12.5% the 8 ranks'
# blocks all ran on the same 16 SMs (scripts/gpu-smprobe.sh); at 100% with a
# grid of 16 blocks a rank ("own") they may spread over the GPU. In one call:
# build; which SMs each rank's blocks use at 100% with 16 and 12 blocks a
# process; the GPU tests at "own"; then mc-bench at the standard share
# ("std") and at "own", alternating, twice: p2p copying at 1 and 128 tokens,
# registered and nvshmem at 128. JSON and logs to $OUT (or ./gpu-out); a
# table last.
. "$(dirname "$0")/gpu-prelude.sh"
for b in 16 12; do
  echo "== SMs at 100%, $b blocks a process"
  MC_MPS_PERCENT=100 MB_BLOCKS=$b SP_PROCS=8 OUT="$out/probe-b$b" bash scripts/gpu-smprobe.sh 2>&1 | tail -10
done
L="scripts/mc-launch.sh 8 --"
OWN=(MC_MPS_PERCENT=100 MC_GPU_BLOCKS=16)
for x in gpu_ep_sizes gpu_zero_copy gpu_stall; do
  if env "${OWN[@]}" MC_TEST_TRANSPORT=p2p timeout 150 $L build-dev/mc_tests $x > "$out/test-own-$x.log" 2>&1
  then echo "PASS own $x"; else echo "FAIL own $x"; tail -6 "$out/test-own-$x.log"; fi
done
b() { # name cfg transport args...
  local name=$1 cfg=$2 tp=$3; shift 3
  local e=(MC_VERBOSE=1); [ "$cfg" = own ] && e+=("${OWN[@]}")
  env "${e[@]}" timeout 120 $L build-dev/mc-bench --transport "$tp" --json -r 200 -w 20 --no-dense "$@" \
    > "$out/ow-$name.json" 2> "$out/ow-$name.err" || echo "{\"failed\": \"$name\"}" > "$out/ow-$name.json"
}
for rep in 1 2; do
  for cfg in std own; do
    b "$cfg-copy-t1-$rep" $cfg p2p -t 1
    b "$cfg-copy-t128-$rep" $cfg p2p -t 128
    b "$cfg-zc-t128-$rep" $cfg p2p -t 128 --zero-copy
    b "$cfg-nvshmem-t128-$rep" $cfg nvshmem -t 128
  done
done
b own-copy-t1-floor own p2p -t 1 --floor
echo "== grids"; grep -h "blocks per kernel" "$out"/ow-std-copy-t1-1.err "$out"/ow-own-copy-t1-1.err
python3 -c "import json,sys; print('floor at own:', json.load(open(sys.argv[1])).get('floor_barrier'))" "$out/ow-own-copy-t1-floor.json"
python3 scripts/bench_table.py "$out" ow- "== EP8 one H200 (median / p99 us); std: 12.5% each (all on 16 SMs), own: 100% and 16 blocks a rank"
(cd "$out" && tar czf ownsms.tgz --remove-files ow-*.json ow-*.err test-*.log build.log probe-b*/smprobe-*.jsonl 2>/dev/null || true)
echo "total: $(( $(date +%s) - t0 )) s"
