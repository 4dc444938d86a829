#!/usr/bin/env bash
# gpu-multi.sh - the several-GPU run of issue 6, in one call, on a machine
# with N >= 2 GPUs: the GPU tests with one rank per GPU (EP = N), then the
# benchmark for each GPU transport this build has, beside the NVSHMEM and
# NCCL dense baselines of the same run, latency at 1..512 tokens per rank
# and throughput at 4096; raw JSON in $OUT/multi (or ./gpu-multi-out).
# NVLink multicast stays off (mc-launch.sh sets NVSHMEM_DISABLE_NVLS=1 and
# NCCL_NVLS_ENABLE=0): on shared hosts it can take the GPUs down.
# Both GPU transports: every GPU test over nvshmem and over p2p, then each
# transport's benchmark (p2p's baselines are the nvshmem runs' of the same
# call). Status: written and checked for syntax on 2026-11-29; not yet run (no
# machine of several GPUs was lent in those sessions).
set -uo pipefail
out=${OUT:-$PWD/gpu-multi-out}/multi
mkdir -p "$out"
cd "$(dirname "$0")/.."
n=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
if [ "$n" -lt 2 ]; then echo "gpu-multi: needs at least 2 GPUs, found $n" >&2; exit 1; fi
{ date -u; nvidia-smi -L; nvidia-smi topo -m; } > "$out/machine.txt" 2>&1
if ! { cmake -S . -B build-dev -DMC_CUDA=ON -DMC_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=Release &&
       cmake --build build-dev -j"$(nproc)"; } > "$out/build.log" 2>&1; then
  tail -30 "$out/build.log"; echo "BUILD FAILED"; exit 1
fi
L="scripts/mc-launch.sh $n --"
results=()
for tp in nvshmem p2p; do
  for t in gpu_ep_sizes gpu_bound_m gpu_split gpu_bad_input gpu_stall gpu_graph gpu_deepseek_shape gpu_prep_passes \
           gpu_many_rounds; do
    if MC_TEST_TRANSPORT=$tp timeout 300 $L build-dev/mc_tests "$t" > "$out/test-$tp-$t.log" 2>&1; then r=PASS
    else r="FAIL($?)"; fi
    results+=("$tp $t $r")
  done
done
for tr in nvshmem p2p; do
  if ! build-dev/mc-bench --help | grep -q "$tr"; then continue; fi
  for t in 1 8 32 128 512; do
    timeout 300 $L build-dev/mc-bench --transport "$tr" -n "$n" -t "$t" -r 200 -w 20 --nccl --json \
      > "$out/bench-$tr-ep$n-t$t.json" 2> "$out/bench-$tr-ep$n-t$t.err"
  done
  # throughput: 4096 tokens per rank; the padded dense payload is 32x the
  # 128-token one, so the symmetric heap must hold it
  NVSHMEM_SYMMETRIC_SIZE=40G timeout 600 $L build-dev/mc-bench --transport "$tr" -n "$n" -t 4096 -r 50 -w 5 \
    --check-first 1 --nccl --json > "$out/bench-$tr-ep$n-t4096.json" 2> "$out/bench-$tr-ep$n-t4096.err"
done
(cd "$out" && tar czf logs.tgz --remove-files $(ls *.log *.err 2>/dev/null) 2>/dev/null || true)
echo "== tests (EP$n, one rank per GPU) =="
printf '%s\n' "${results[@]}" | tee "$out/summary.txt"
echo "== bench =="
python3 - "$out" <<'PY' | tee -a "$out/summary.txt"
import glob, json, os, sys
for f in sorted(glob.glob(os.path.join(sys.argv[1], "bench-*.json"))):
    try:
        j = json.load(open(f))
    except Exception:
        print(os.path.basename(f), "unreadable"); continue
    l, g = j["latency_us"], j.get("GBps_per_rank", {})
    d, nc = j.get("dense_alltoall", {}), j.get("nccl_alltoall", {})
    print(f'{os.path.basename(f)[6:-5]:24s} disp {l["dispatch"]["median"]:9.1f} comb {l["combine"]["median"]:9.1f} us  '
          f'GB/s {g.get("dispatch", 0):6.1f}/{g.get("combine", 0):6.1f}  nvshmem-dense {d.get("median_us", 0):9.1f}  '
          f'nccl {nc.get("median_us", 0):9.1f}  {j["verdict"]}')
PY
