#!/usr/bin/env bash
# gpu-multi.sh - the several-GPU run, in one go, on a machine
# with N >= 2 GPUs:
#  1. every GPU test over nvshmem and over p2p with one rank per GPU
#     (MC_TEST_MAX_WORLD=N caps the tests' ranks at N);
#  2. where N < 8, the EP8 tests again with 8/N ranks per GPU under MPS:
#     peers on the same GPU and on another one in one communicator;
#  3. the benchmark, EP = N, for each GPU transport, beside the NVSHMEM and
#     NCCL dense baselines of the same run: latency at 1..512 tokens per rank
#     and throughput at 4096.
# Raw JSON and logs in $OUT/multi (or ./gpu-multi-out/multi), a table last.
# NVLink multicast stays off (mc-launch.sh sets NVSHMEM_DISABLE_NVLS=1 and
# NCCL_NVLS_ENABLE=0): on shared hosts it can take the GPUs down.
# MC_MULTI_SECONDS (default 420) bounds the whole: a step that would start
# after it is skipped and says so, so one call of the device tool (600 s)
# always returns a table.
set -uo pipefail
out=${OUT:-$PWD/gpu-multi-out}/multi
mkdir -p "$out"
cd "$(dirname "$0")/.."
deadline=$(( $(date +%s) + ${MC_MULTI_SECONDS:-420} ))
time_for() { [ $(( deadline - $(date +%s) )) -ge "$1" ]; } # seconds a step may need
n=$(scripts/mc-launch.sh --gpus) # the GPUs the ranks will see (CUDA_VISIBLE_DEVICES too)
if [ "$n" -lt 2 ]; then echo "gpu-multi: needs at least 2 GPUs, found $n" >&2; exit 1; fi
{ date -u; nvidia-smi -L; nvidia-smi topo -m; } > "$out/machine.txt" 2>&1
cat "$out/machine.txt"
s=$(date +%s)
if ! { cmake -S . -B build-dev -DMC_CUDA=ON -DMC_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=Release &&
       cmake --build build-dev -j"$(nproc)"; } > "$out/build.log" 2>&1; then
  tail -30 "$out/build.log"; echo "BUILD FAILED"; exit 1
fi
echo "build: $(( $(date +%s) - s )) s"
results=()
run_test() { # tag ranks test [VAR=value ...]
  local tag=$1 ranks=$2 t=$3 s r; shift 3
  if ! time_for 30; then results+=("$tag $t SKIPPED (out of time)"); return; fi
  s=$(date +%s)
  if env "$@" timeout 90 scripts/mc-launch.sh "$ranks" -- build-dev/mc_tests "$t" > "$out/test-$tag-$t.log" 2>&1
  then r=PASS; else r="FAIL($?)"; tail -6 "$out/test-$tag-$t.log"; fi
  results+=("$tag $t $r $(( $(date +%s) - s ))s")
}
tests="gpu_ep_sizes gpu_bound_m gpu_split gpu_bad_input gpu_stall gpu_graph gpu_deepseek_shape gpu_prep_passes gpu_many_rounds
       gpu_auto_transport"
for tp in nvshmem p2p; do
  for t in $tests; do run_test "$tp-ep$n" "$n" "$t" MC_TEST_TRANSPORT=$tp MC_TEST_MAX_WORLD=$n; done
done
if [ "$n" -lt 8 ]; then
  for tp in nvshmem p2p; do
    for t in gpu_ep_sizes gpu_deepseek_shape gpu_prep_passes gpu_bad_input gpu_many_rounds; do run_test "$tp-ep8-mps" 8 "$t" MC_TEST_TRANSPORT=$tp; done
  done
fi
bench() { # transport tokens seconds args...
  local tr=$1 t=$2 secs=$3 f; shift 3
  f="$out/bench-$tr-ep$n-t$t"
  if ! time_for "$secs"; then echo "{\"skipped\": \"out of time\"}" > "$f.json"; return; fi
  timeout "$secs" scripts/mc-launch.sh "$n" -- build-dev/mc-bench --transport "$tr" -n "$n" -t "$t" --nccl --json "$@" \
    > "$f.json" 2> "$f.err" || echo "{\"failed\": $?}" >> "$f.json"
}
for tr in nvshmem p2p; do
  for t in 1 8 32 128 512; do bench "$tr" "$t" 60 -r 200 -w 20; done
done
# throughput: 4096 tokens per rank; the padded dense payload is 32x the
# 128-token one, so the symmetric heap must hold it
for tr in nvshmem p2p; do
  NVSHMEM_SYMMETRIC_SIZE=40G bench "$tr" 4096 120 -r 50 -w 5 --check-first 1
done
# at most 8 files come back: logs and JSON in one archive each
(cd "$out" && tar czf logs.tgz --remove-files $(ls *.log *.err 2>/dev/null) 2>/dev/null || true)
echo "== tests =="
printf '%s\n' "${results[@]}" | tee "$out/summary.txt"
echo "== bench (median us; GB/s per rank; dense baselines of the same run) =="
python3 - "$out" <<'PY' | tee -a "$out/summary.txt"
import glob, json, os, sys
for f in sorted(glob.glob(os.path.join(sys.argv[1], "bench-*.json"))):
    name = os.path.basename(f)[6:-5]
    try:
        j = json.loads(open(f).read())
    except Exception:
        print(f"{name:22s} unreadable: {open(f).read()[:160]!r}"); continue
    if "latency_us" not in j:
        print(f"{name:22s} {j}"); continue
    l, g = j["latency_us"], j.get("GBps_per_rank", {})
    d, nc = j.get("dense_alltoall", {}), j.get("nccl_alltoall", {})
    print(f'{name:22s} disp {l["dispatch"]["median"]:8.1f} comb {l["combine"]["median"]:8.1f}  '
          f'GB/s {g.get("dispatch", 0):6.1f}/{g.get("combine", 0):6.1f}  nvshmem-dense {d.get("median_us", 0):8.1f}  '
          f'nccl {nc.get("median_us", 0):8.1f}  {j["verdict"]}')
PY
(cd "$out" && tar czf bench-json.tgz --remove-files bench-*.json 2>/dev/null || true)
