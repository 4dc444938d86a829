#!/usr/bin/env bash
# gpu-floor.sh - what is left at EP8 on one H200 once dispatch is fused
# (perf-notes 36-37), in one call: build; the floor (mc-bench --floor:
# mc_a2a_barrier alone, timed as a half is) beside p2p copying and nvshmem at
# 1 and 128 tokens; the registered round at 128 tokens with prep and send
# fused or not (MC_GPU_FUSE), and with its combine-recv grid at 10 blocks
# (MC_GPU_ZC_CRECV_BLOCKS=10) against the default 12, alternating, three
# times; the whole calls (--whole) at 1 and 128 tokens. JSON and logs to $OUT
# (or ./gpu-out); a table last.
. "$(dirname "$0")/gpu-prelude.sh"
for x in gpu_zero_copy gpu_ep_sizes; do
  if MC_TEST_TRANSPORT=p2p MC_GPU_ZC_CRECV_BLOCKS=10 timeout 150 $L build-dev/mc_tests $x > "$out/test-$x.log" 2>&1
  then echo "PASS $x (MC_GPU_ZC_CRECV_BLOCKS=10)"; else echo "FAIL $x"; tail -6 "$out/test-$x.log"; fi
done
b() { # name transport env-assignment-or-- args...
  local name=$1 tp=$2 e=$3; shift 3
  [ "$e" = - ] && e=MC_NONE=1
  env "$e" timeout 120 $L build-dev/mc-bench --transport "$tp" --json -r 200 -w 20 --no-dense "$@" \
    > "$out/fl-$name.json" 2> "$out/fl-$name.err" || echo "{\"failed\": \"$name\"}" > "$out/fl-$name.json"
}
for tk in 1 128; do
  b "t$tk-copy-floor" p2p - -t $tk --floor
  b "t$tk-nvshmem-floor" nvshmem - -t $tk --floor
  b "t$tk-copy-whole" p2p - -t $tk --whole
  b "t$tk-zc-whole" p2p - -t $tk --whole --zero-copy
done
for rep in 1 2 3; do
  b "t128-zc-f0-$rep" p2p MC_GPU_FUSE=0 -t 128 --zero-copy
  b "t128-zc-f1-$rep" p2p - -t 128 --zero-copy
  b "t128-zc-f1-cr10-$rep" p2p MC_GPU_ZC_CRECV_BLOCKS=10 -t 128 --zero-copy
done
echo "bench: $(( $(date +%s) - t0 )) s"
echo "== floor (mc_a2a_barrier alone, median / p99 us)"
for f in "$out"/fl-*floor.json; do
  python3 -c "import json,sys; j=json.load(open(sys.argv[1])); print(sys.argv[1].split('fl-')[1][:-5], j.get('floor_barrier'))" "$f"
done
python3 scripts/bench_table.py "$out" fl- "== EP8 one H200, 16 SMs a rank (median / p99 us; f0: prep and send as two kernels; cr10: registered combine-recv at 10 blocks)"
(cd "$out" && tar czf floor.tgz --remove-files fl-*.json fl-*.err test-*.log build.log 2>/dev/null || true)
echo "total: $(( $(date +%s) - t0 )) s"
