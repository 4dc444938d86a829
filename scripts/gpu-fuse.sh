#!/usr/bin/env bash
# gpu-fuse.sh - dispatch's prep and send in one launch (mc_gpu_fused.cuh,
# perf-notes 36) against the two kernels (MC_GPU_FUSE=0), in one call: build;
# the GPU tests that touch dispatch-send (fused, the default) over both
# transports and as threads; EP8 on one H200 at 1 and 128 tokens, p2p
# copying and registered and nvshmem, the two settings alternating, twice;
# then a kernel timeline of each at 1 token. JSON, logs and timelines to
# $OUT (or ./gpu-out); a table last.
. "$(dirname "$0")/gpu-prelude.sh"
fails=0
t() { # label launcher-ranks env... -- test
  local label=$1 n=$2; shift 2
  local envs=(); while [ "$1" != -- ]; do envs+=("$1"); shift; done; shift
  if env "${envs[@]}" timeout 150 scripts/mc-launch.sh "$n" -- build-dev/mc_tests "$1" > "$out/test-$label.log" 2>&1
  then echo "PASS $label"; else echo "FAIL $label"; tail -6 "$out/test-$label.log"; fails=$((fails + 1)); fi
}
for x in gpu_ep_sizes gpu_bad_input gpu_stall gpu_graph gpu_split gpu_bound_m gpu_deepseek_shape gpu_prep_passes \
         gpu_many_rounds gpu_zero_copy; do
  t "p2p-$x" 8 MC_TEST_TRANSPORT=p2p -- $x
done
t p2p-gpu_zero_copy-direct 8 MC_TEST_TRANSPORT=p2p MC_ZC_DISPATCH=direct -- gpu_zero_copy
t p2p-threads 1 MC_TEST_TRANSPORT=p2p -- gpu_p2p_threads
for x in gpu_ep_sizes gpu_bad_input gpu_graph gpu_stall; do t "nvshmem-$x" 8 MC_TEST_TRANSPORT=nvshmem -- $x; done
echo "tests: $fails failed, $(( $(date +%s) - t0 )) s"
b() { # name fuse transport args...
  local name=$1 fuse=$2 tp=$3; shift 3
  MC_GPU_FUSE=$fuse timeout 120 $L build-dev/mc-bench --transport "$tp" --json -r 200 -w 20 --no-dense "$@" \
    > "$out/fu-$name.json" 2> "$out/fu-$name.err" || echo "{\"failed\": \"$name\"}" > "$out/fu-$name.json"
}
for rep in 1 2; do
  for tk in 1 128; do
    for f in 0 1; do
      b "t$tk-copy-f$f-$rep" $f p2p -t $tk
      b "t$tk-zc-f$f-$rep" $f p2p -t $tk --zero-copy
      b "t$tk-nvshmem-f$f-$rep" $f nvshmem -t $tk
    done
  done
done
echo "bench: $(( $(date +%s) - t0 )) s"
for f in 0 1; do
  MC_GPU_FUSE=$f MC_GPU_TRACE="$out/trace-f$f" timeout 120 $L build-dev/mc-bench --transport p2p --no-dense \
    --check-first 1 -r 100 -w 10 -t 1 > "$out/trace-f$f.txt" 2>&1
  python3 scripts/trace_summary.py "$out/trace-f$f" > "$out/timeline-f$f-t1.txt" 2>&1; rm -f "$out"/trace-f$f.*
  echo "== timeline, 1 token, MC_GPU_FUSE=$f"; grep -E "^event|prep\.(start|end)|dsend\.(start|end)|drecv\.(start|c0)" "$out/timeline-f$f-t1.txt"
done
python3 scripts/bench_table.py "$out" fu- "== EP8 one H200, 16 SMs a rank (median / p99 us); f0: two kernels, f1: fused"
(cd "$out" && tar czf fuse.tgz --remove-files fu-*.json fu-*.err test-*.log trace-f*.txt build.log 2>/dev/null || true)
echo "total: $(( $(date +%s) - t0 )) s, tests failed: $fails"
