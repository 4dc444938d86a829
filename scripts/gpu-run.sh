#!/usr/bin/env bash
# gpu-run.sh [quick|full|tests|probe] - everything the GPU machine is for, in one call:
# build, the GPU tests (ranks under MPS through mc-launch.sh), compute-sanitizer
# on a small EP2 case, the benchmark with its dense baseline. Logs and JSON go
# to $OUT (or ./gpu-out); a short table is printed last.
set -uo pipefail
mode=${1:-full}
out=${OUT:-$PWD/gpu-out}
mkdir -p "$out"
cd "$(dirname "$0")/.."
log() { echo "$*" | tee -a "$out/summary.txt"; }
{ date -u; nvidia-smi -L; nvcc --version | tail -1; } > "$out/machine.txt" 2>&1
jobs=$(nproc)
t0=$(date +%s)
if ! { cmake -S . -B build-dev -DMC_CUDA=ON -DMC_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=Release &&
       cmake --build build-dev -j"$jobs"; } > "$out/build.log" 2>&1; then
  tail -40 "$out/build.log"; echo "BUILD FAILED"; exit 1
fi
log "build: $(( $(date +%s) - t0 )) s"
L="scripts/mc-launch.sh 8 --"
results=()
if [ "$mode" = probe ]; then
  # where the time goes: per-kernel durations of one rank alone (ncu does not
  # run under MPS), then EP8 under MPS with other grid sizes
  B="build-dev/mc-bench --transport nvshmem --no-dense --check-first 1 -r 50 -w 10"
  MC_NO_MPS=1 timeout 240 scripts/mc-launch.sh 1 -- ncu --clock-control none --target-processes all \
    -k regex:mc_k_ --launch-skip 40 --launch-count 10 \
    --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__throughput.avg.pct_of_peak_sustained_elapsed,launch__grid_size \
    $B -n 1 -t 128 > "$out/ncu-ep1.log" 2>&1
  grep -E "mc_k_|gpu__time" "$out/ncu-ep1.log" | paste - - | awk '{print $1, $NF}' | sort | uniq
  MC_GPU_STAGED=1 MC_NO_MPS=1 timeout 240 scripts/mc-launch.sh 1 -- ncu --clock-control none --target-processes all \
    -k regex:mc_k_ --launch-skip 40 --launch-count 12 --metrics gpu__time_duration.sum \
    $B -n 1 -t 128 > "$out/ncu-ep1-staged.log" 2>&1
  echo "staged:"; grep -E "mc_k_|gpu__time" "$out/ncu-ep1-staged.log" | paste - - | awk '{print $1, $NF}' | sort | uniq
  MC_GPU_STAGED=1 timeout 120 $L $B -n 8 -t 128 > "$out/probe-ep8-staged.txt" 2>&1
  echo "EP8 staged:"; grep -E "dispatch|combine|verdict" "$out/probe-ep8-staged.txt" | head -9
  for n in 1 2 8; do
    timeout 120 scripts/mc-launch.sh $n -- $B -n $n -t 128 > "$out/probe-ep$n.txt" 2>&1
    echo "EP$n:"; grep -E "dispatch|combine|verdict" "$out/probe-ep$n.txt" | head -9
  done
  for g in 32; do
    MC_GPU_BLOCKS=$g timeout 120 $L $B -n 8 -t 128 > "$out/probe-ep8-g$g.txt" 2>&1
    echo "EP8 blocks=$g:"; grep -E "dispatch|combine|verdict" "$out/probe-ep8-g$g.txt" | head -9
  done
  MC_GPU_STAGED=1 MC_GPU_BLOCKS=32 timeout 120 $L $B -n 8 -t 128 > "$out/probe-ep8-staged-g32.txt" 2>&1
  echo "EP8 staged blocks=32:"; grep -E "dispatch|combine|verdict" "$out/probe-ep8-staged-g32.txt" | head -9
  exit 0
fi
run_test() { # name ranks-hint
  local t=$1 s; s=$(date +%s)
  if timeout "${TEST_TIMEOUT:-300}" $L build-dev/mc_tests "$t" > "$out/test-$t.log" 2>&1; then r=PASS; else r="FAIL($?)"; fi
  results+=("$t $r $(( $(date +%s) - s ))s")
  [ "$r" = PASS ] || tail -15 "$out/test-$t.log"
}
tests="gpu_ep_sizes gpu_bound_m gpu_split gpu_bad_input gpu_stall gpu_graph gpu_deepseek_shape gpu_many_rounds"
[ "$mode" = quick ] && tests="gpu_ep_sizes gpu_stall" && TEST_TIMEOUT=120
# tests: every GPU test, nothing else (a check after a change that is not about speed)
for t in $tests; do run_test "$t"; done

if [ "$mode" = tests ]; then
  printf '%s\n' "${results[@]}" | tee -a "$out/summary.txt"
  exit 0
fi
if [ "$mode" = full ] && command -v compute-sanitizer >/dev/null; then
  for tool in memcheck racecheck; do
    s=$(date +%s)
    if MC_NO_MPS=1 timeout 300 $L compute-sanitizer --tool $tool --target-processes all --error-exitcode 9 \
         build-dev/mc-bench --transport nvshmem -n 2 -t 8 -e 16 -k 4 --hidden 256 -r 2 -w 1 --no-dense \
         > "$out/sanitizer-$tool.log" 2>&1; then r=PASS; else r="FAIL($?)"; fi
    results+=("sanitizer-$tool $r $(( $(date +%s) - s ))s")
    [ "$r" = PASS ] || grep -E "=========" "$out/sanitizer-$tool.log" | head -12
  done
fi

bench() { # name args...
  local name=$1; shift
  timeout 300 $L build-dev/mc-bench --transport nvshmem --json "$@" > "$out/bench-$name.json" 2> "$out/bench-$name.err" ||
    echo "{\"failed\": \"$name\"}" >> "$out/bench-$name.json"
}
tok_list="1 8 32 128 512"
[ "$mode" = quick ] && tok_list="1 128"
for t in $tok_list; do bench "dsv3-t$t" -t "$t" -r 200 -w 20; done
[ "$mode" = full ] && bench "small-t128" -e 128 -k 8 --hidden 2048 -t 128 -r 200 -w 20

# the files that come back are few: JSON and the summary stay, logs go in one archive
(cd "$out" && tar czf logs.tgz --remove-files $(cd "$out" && ls *.log *.err machine.txt 2>/dev/null) 2>/dev/null || true)
echo
echo "== tests =="
printf '%s\n' "${results[@]}" | tee -a "$out/summary.txt"
echo "== bench (median us: dispatch, combine; dense; verdict) =="
python3 - "$out" <<'PY' | tee -a "$out/summary.txt"
import glob, json, os, sys
for f in sorted(glob.glob(os.path.join(sys.argv[1], "bench-*.json"))):
    try:
        j = json.loads(open(f).read())
    except Exception as e:
        print(os.path.basename(f), "unreadable:", open(f).read()[:200]); continue
    if "failed" in j: print(os.path.basename(f), "FAILED"); continue
    l = j["latency_us"]; d = j.get("dense_alltoall", {})
    print(f'{os.path.basename(f)[6:-5]:12s} t={j["config"]["tokens"]:4d} disp {l["dispatch"]["median"]:8.1f} (s {l["dispatch send"]["median"]:6.1f} r {l["dispatch recv"]["median"]:7.1f}) '
          f'comb {l["combine"]["median"]:8.1f} (s {l["combine send"]["median"]:6.1f} r {l["combine recv"]["median"]:7.1f}) '
          f'dense {d.get("median_us", 0):8.1f}  buf {j["buffer_bytes_per_rank"]/2**20:6.1f}MiB {j["verdict"]}')
PY
