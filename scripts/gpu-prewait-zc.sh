#!/usr/bin/env bash
# gpu-prewait-zc.sh - prewait for the registered round, now that dispatch is
# fused (perf-notes 36, 39): 128 tokens, EP8 on one H200, in halves and
# --whole, alternating, twice, the variants of PZ_VARIANTS (name=ENV pairs;
# "-" for none). Run 8 had "default=- prewait=MC_GPU_PREWAIT=1" (both
# receivers; the default then had none). PZ_TESTS=1 runs the registered GPU
# tests first; PZ_TOKENS tokens a rank (128), PZ_REPS samples (2). Builds build-dev first. JSON to $OUT (or ./gpu-out); a table last.
BUILD_TARGETS="mc-bench ${PZ_TESTS:+mc_tests}" . "$(dirname "$0")/gpu-prelude.sh"
b() { # name env-or-- args...
  local name=$1 e=$2; shift 2
  [ "$e" = - ] && e=MC_NONE=1
  env "$e" timeout 120 $L build-dev/mc-bench --transport p2p --zero-copy --json -r 200 -w 20 --no-dense -t "${PZ_TOKENS:-128}" "$@" \
    > "$out/pz-$name.json" 2> "$out/pz-$name.err" || echo "{\"failed\": \"$name\"}" > "$out/pz-$name.json"
}
if [ -n "${PZ_TESTS:-}" ]; then
  for x in gpu_zero_copy gpu_ep_sizes gpu_stall gpu_graph; do
    if MC_TEST_TRANSPORT=p2p MC_TEST_ZC=1 timeout 150 $L build-dev/mc_tests $x > "$out/test-$x.log" 2>&1
    then echo "PASS $x (registered)"; else echo "FAIL $x (registered)"; tail -6 "$out/test-$x.log"; fi
  done
fi
for rep in $(seq 1 "${PZ_REPS:-2}"); do
  for v in ${PZ_VARIANTS:-default=- prewait=MC_GPU_PREWAIT=1}; do
    b "${v%%=*}-$rep" "${v#*=}"
    b "${v%%=*}-whole-$rep" "${v#*=}" --whole
  done
done
python3 scripts/bench_table.py "$out" pz- "== registered round, 128 tokens, EP8 one H200 (median / p99 us)"
(cd "$out" && tar czf prewait-zc.tgz --remove-files pz-*.json pz-*.err test-*.log build.log 2>/dev/null || true)
