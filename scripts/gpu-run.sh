#!/usr/bin/env bash
# gpu-run.sh [MODE [ARG...]] - everything the GPU machine is for, a MODE a run.
#   quick|full|tests|pplx|probe|trace|ledger|torch|p2p|sanitize|auto (default
#       full): build, the GPU tests (ranks under MPS through mc-launch.sh),
#       compute-sanitizer on a small EP2 case, the benchmark with its dense
#       baseline; each mode below says what it runs. Logs and JSON go to $OUT
#       (or ./gpu-out); a short table is printed last.
#   ab TREE...   other copies of the source timed against this one (below);
#       builds its own trees, not build-dev/.
#   multi        the several-GPU run (below).
set -uo pipefail
mode=${1:-full}
build_dev() { # LOG N: build-dev/, every target; where that fails, LOG's last N lines and exit 1
  { cmake -S . -B build-dev -DMC_CUDA=ON -DMC_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=Release &&
    cmake --build build-dev -j"$(nproc)"; } > "$1" 2>&1 && return 0
  tail -"$2" "$1"; echo "BUILD FAILED"; exit 1
}
if [ "$mode" = ab ]; then
  # gpu-run.sh ab TREE... - the same benchmark points for other copies of the
  # source and this one, interleaved, so a change is measured against its
  # baseline on the same machine and in the same minutes (runs on different
  # machines, or minutes apart, differ by a few us). Each TREE is a plain copy
  # of a source tree, best under a folder git ignores, e.g.
  #   mkdir -p build-trees/old && git archive REV | tar -x -C build-trees/old
  # labelled by its folder's name; this tree is "new". Builds each (mc-bench)
  # in parallel as the default build is made (with NVSHMEM where it is
  # found, as users build it: how a tree compiles its kernels changes their
  # times), then runs every point for every tree in turn,
  # AB_REPS times (default 3). AB_RANKS: ranks (default 2: one per GPU on a
  # machine of two; more share GPUs under MPS; 1: a rank alone on its GPU).
  # AB_ENV: environment for every run (e.g. MC_TEST_SYS_SCOPE=1, the signals
  # of ranks on different GPUs, for a rank alone). AB_POINTS: what to time
  # (default "g1 e1 g128 e128"); each point is timed whole (MC_SEND_RECV)
  # unless it says halves, with the launch floor beside it (mc-bench --floor):
  #   g1, e1     1 token of a handle of max_tokens 128, through bound_m, as a
  #              CUDA graph replay (g) or eagerly (e)
  #   g1m256     the same with max_tokens 256
  #   g1t1, e1t1, h1t1  1 token of a handle of 1 (no bound_m: copies of the
  #              source from before --max-tokens), graph, eager, halves apart
  #   g128, e128 128 tokens (max_tokens 128), graph or eager
  #   h1, h128   the same as e1, e128 with the halves timed apart
  #   sg128, se128  64 experts, top-6, hidden 2048, 128 tokens, graph or eager
  #   t4096      4096 tokens, eager, 50 rounds
  #   q128, u128 128 tokens quantised in dispatch (fp32 or UE8M0 scales), eager;
  #   qa128, ua128 the same quantised apart first (mc-bench --quantise-apart)
  # The JSON of every run goes to $OUT (default ./gpu-ab-out); a table last:
  # every run, then per point and tree the median of the runs' medians with
  # their range, the median p99, and the floor of the same runs. A run's
  # median moves between runs of the same code more than within one: decide
  # on AB_REPS=3 or more.
  shift
  [ $# -ge 1 ] || { echo "usage: $0 ab TREE... (copies of the source to time against this one)"; exit 2; }
  out=${OUT:-$PWD/gpu-ab-out}
  mkdir -p "$out"
  trees=()
  for t in "$@"; do d=$(cd "$t" && pwd) || exit 2; trees+=("$d"); done
  cd "$(dirname "$0")/.." || exit 2
  n=${AB_RANKS:-2}
  cfg="-DMC_CUDA=ON -DMC_BUILD_TESTS=OFF -DMC_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=Release"
  jobs=$(( $(nproc) / (${#trees[@]} + 1) )); [ "$jobs" -ge 1 ] || jobs=1
  b() { cmake -S "$1" -B "$2" $cfg > /dev/null && cmake --build "$2" --target mc-bench -j"$jobs" > /dev/null; }
  b . build-ab > "$out/build-new.log" 2>&1 &
  for t in "${trees[@]}"; do b "$t" "$t/build-ab" > "$out/build-$(basename "$t").log" 2>&1 & done
  wait
  labels=(new) bins=(build-ab/mc-bench)
  for t in "${trees[@]}"; do labels+=("$(basename "$t")"); bins+=("$t/build-ab/mc-bench"); done
  for bin in "${bins[@]}"; do [ -x "$bin" ] || { tail -20 "$out"/build-*.log; echo "BUILD FAILED: $bin"; exit 1; }; done
  run() { # label bench point rep
    local a b="--whole --floor" one="-t 1 --max-tokens 128 --bound-m"
    case $3 in
    g1) a="$one --graph" ;; e1) a="$one" ;; g1m256) a="-t 1 --max-tokens 256 --bound-m --graph" ;;
    g1t1) a="-t 1 --graph" ;; e1t1) a="-t 1" ;; h1t1) a="-t 1" b=--floor ;;
    g128) a="-t 128 --graph" ;; e128) a="-t 128" ;;
    h1) a="$one" b=--floor ;; h128) a="-t 128" b=--floor ;;
    sg128) a="-t 128 -e 64 -k 6 --hidden 2048 --graph" ;; se128) a="-t 128 -e 64 -k 6 --hidden 2048" ;;
    t4096) a="-t 4096 -r 50 -w 5" ;;
    q128) a="-t 128 --quantise fp32" ;; u128) a="-t 128 --quantise ue8m0" ;;
    qa128) a="-t 128 --quantise fp32 --quantise-apart" ;; ua128) a="-t 128 --quantise ue8m0 --quantise-apart" ;;
    *) echo "unknown point $3"; return ;;
    esac
    env ${AB_ENV:-} timeout 120 scripts/mc-launch.sh "$n" -- "$2" --transport p2p -n "$n" -r 300 -w 20 --no-dense --json \
      $b $a > "$out/ab-$1-$3-$4.json" 2>> "$out/ab.err"
  }
  for rep in $(seq "${AB_REPS:-3}"); do
    for p in ${AB_POINTS:-g1 e1 g128 e128}; do
      for i in "${!bins[@]}"; do run "${labels[$i]}" "${bins[$i]}" "$p" "$rep"; done
    done
  done
  python3 - "$out" <<'PY'
import glob, json, os, statistics, sys
runs = {}
for f in sorted(glob.glob(os.path.join(sys.argv[1], "ab-*.json"))):
    try:
        j = json.load(open(f))
        l = j["latency_us"]
    except Exception:
        print(os.path.basename(f), "unreadable"); continue
    fl = j.get("floor_us", {})
    h = " ".join(f'{l[k]["median"]:6.1f}' if k in l else "     -"
                 for k in ("dispatch send", "dispatch recv", "combine send", "combine recv"))
    fs = " ".join(f'{fl[k]["median"]:5.1f}' if k in fl else "    -" for k in ("dispatch", "combine"))
    print(f'{os.path.basename(f)[3:-5]:28s} disp {l["dispatch"]["median"]:7.1f} comb {l["combine"]["median"]:7.1f}  '
          f'halves {h}  floor {fs}  {j.get("verdict", "?")}')
    label, point, _ = os.path.basename(f)[3:-5].rsplit("-", 2)
    runs.setdefault((point, label), []).append(j)
print("per point and tree: median of the runs' medians [range], median p99; floor: the same of the empty kernels")
for (point, label), js in sorted(runs.items()):
    cols = []
    for ph in ("dispatch", "combine"):
        m = [j["latency_us"][ph]["median"] for j in js]
        p = statistics.median(j["latency_us"][ph]["p99"] for j in js)
        f = [j["floor_us"][ph]["median"] for j in js if "floor_us" in j]
        fl = f' floor {statistics.median(f):5.1f} (+{statistics.median(m) - statistics.median(f):5.1f})' if f else ""
        cols.append(f'{ph[:4]} {statistics.median(m):6.1f} [{min(m):5.1f}-{max(m):5.1f}] p99 {p:6.1f}{fl}')
    bad = sum(j.get("verdict") != "PASS" for j in js)
    print(f'{point:6s} {label:10s} n={len(js)}  ' + "  ".join(cols) + (f"  {bad} NOT PASS" if bad else ""))
PY
  exit
fi
if [ "$mode" = multi ]; then
  # gpu-run.sh multi - the several-GPU run, in one go, on a machine
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
  out=${OUT:-$PWD/gpu-multi-out}/multi
  mkdir -p "$out"
  cd "$(dirname "$0")/.."
  deadline=$(( $(date +%s) + ${MC_MULTI_SECONDS:-420} ))
  time_for() { [ $(( deadline - $(date +%s) )) -ge "$1" ]; } # seconds a step may need
  n=$(scripts/mc-launch.sh --gpus) # the GPUs the ranks will see (CUDA_VISIBLE_DEVICES too)
  if [ "$n" -lt 2 ]; then echo "gpu-run.sh multi: needs at least 2 GPUs, found $n" >&2; exit 1; fi
  { date -u; nvidia-smi -L; nvidia-smi topo -m; } > "$out/machine.txt" 2>&1
  cat "$out/machine.txt"
  s=$(date +%s)
  build_dev "$out/build.log" 30
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
  tests="gpu_ep_sizes gpu_bound_m gpu_split gpu_bad_input gpu_few_tokens gpu_stall gpu_graph gpu_graph_refused gpu_deepseek_shape gpu_packed gpu_prep_passes gpu_many_rounds
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
  exit
fi
out=${OUT:-$PWD/gpu-out}
mkdir -p "$out"
cd "$(dirname "$0")/.."
log() { echo "$*" | tee -a "$out/summary.txt"; }
{ date -u; nvidia-smi -L; nvcc --version | tail -1; } > "$out/machine.txt" 2>&1
t0=$(date +%s)
build_dev "$out/build.log" 40
log "build: $(( $(date +%s) - t0 )) s"
L="scripts/mc-launch.sh 8 --"
results=()
if [ "$mode" = pplx ]; then
  # moecomm beside pplx-kernels' own benchmark (its prebuilt binary pplx_bench
  # and its launcher run-pplx.sh in $PPLX_DIR, default .baselines), interleaved
  # PPLX_REPS times (default 2): EP2 with one rank per GPU where there are two
  # GPUs, EP8 on one GPU under MPS (PPLX_EPS picks, default both / 8); the
  # DeepSeek-V3 layer at 1 and 128 tokens and 64 experts top-6 hidden 2048
  # at 128, moecomm timed whole and in halves; mc_report.py vs-pplx's table,
  # then moecomm alone at 4096 tokens beside NVSHMEM's dense all-to-all
  pp=${PPLX_DIR:-.baselines}
  [ -x "$pp/pplx_bench" ] || { echo "no $pp/pplx_bench: put pplx-kernels' benchmark and run-pplx.sh there"; exit 1; }
  eps=${PPLX_EPS:-8}; [ -z "${PPLX_EPS:-}" ] && [ "$(scripts/mc-launch.sh --gpus)" -ge 2 ] && eps="2 8"
  for ep in $eps; do
    one=; [ "$ep" -gt 2 ] && one=CUDA_VISIBLE_DEVICES=0 # EP8 on one GPU; pplx hangs at 8 ranks over two
    for rep in $(seq "${PPLX_REPS:-2}"); do
      env $one timeout 240 scripts/mc-launch.sh "$ep" -- bash "$pp/run-pplx.sh" "$ep" > "$out/pplx-ep$ep-$rep.txt" 2>&1 ||
        echo "pplx EP$ep rep $rep: exit $?" | tee -a "$out/summary.txt"
      for shape in dsv3-1 dsv3-128 small-128; do
        case $shape in
        dsv3-1) a="-t 1" ;; dsv3-128) a="-t 128" ;; small-128) a="-t 128 -e 64 -k 6 --hidden 2048" ;;
        esac
        for timing in whole halves; do
          w=; [ $timing = whole ] && w=--whole
          env $one timeout 120 scripts/mc-launch.sh "$ep" -- build-dev/mc-bench --transport p2p -n "$ep" $a $w \
            -r 300 -w 20 --json > "$out/mc-ep$ep-$shape-$timing-$rep.json" 2> "$out/mc-ep$ep-$shape-$timing-$rep.err" ||
            echo "mc-bench EP$ep $shape $timing: exit $?" | tee -a "$out/summary.txt"
        done
      done
    done
  done
  python3 scripts/mc_report.py vs-pplx "$out" | tee "$out/vs-pplx.txt"
  # and 4096 tokens, whole: p2p, then nvshmem with NVSHMEM's dense
  # all-to-all of the same padded payload beside it (what the link gives)
  for ep in $eps; do
    one=; [ "$ep" -gt 2 ] && one=CUDA_VISIBLE_DEVICES=0
    for tp in p2p nvshmem; do
      d=--no-dense; [ $tp = nvshmem ] && d=
      env $one timeout 120 scripts/mc-launch.sh "$ep" -- build-dev/mc-bench --transport $tp -n "$ep" -t 4096 --whole $d \
        -r 30 -w 3 --json > "$out/big-ep$ep-$tp.json" 2> "$out/big-ep$ep-$tp.err" ||
        echo "mc-bench EP$ep 4096 tokens $tp: exit $?" | tee -a "$out/summary.txt"
    done
  done
  python3 scripts/mc_report.py table "$out" big- "4096 tokens, whole (dense: NVSHMEM's all-to-all of the padded payload)" |
    tee "$out/big.txt"
  exit 0
fi
if [ "$mode" = ledger ]; then
  # the small-batch ledger in one run, a rank alone with the signals of ranks
  # on different GPUs (MC_TEST_SYS_SCOPE=1): the launch floor of this GPU
  # (launch-floor.cu in $PPLX_DIR, default .baselines/, where it is there),
  # 1 token of a handle of 128 through bound_m with each phase's floor beside
  # it (graph and eager), the kernels' timeline at 1 and 128 tokens (whole
  # as a graph, and halves apart), and
  # mc-probe's cost of each step they are made of
  pp=${PPLX_DIR:-.baselines}
  if [ -f "$pp/launch-floor.cu" ] && nvcc -O2 -arch=sm_90 -std=c++17 "$pp/launch-floor.cu" -o "$out/launch-floor" 2>> "$out/build.log"; then
    echo "== launch floor ($pp/launch-floor.cu)"; "$out/launch-floor"
  fi
  B="build-dev/mc-bench --transport p2p -n 1 --no-dense"
  one="-t 1 --max-tokens 128 --bound-m"
  for g in --graph ""; do
    echo "== mc-bench $one --whole --floor $g"
    MC_TEST_SYS_SCOPE=1 timeout 60 scripts/mc-launch.sh 1 -- $B $one --whole --floor $g -r 300 -w 20 2>&1 | grep -E "^ *(phase|dispatch|combine) "
  done
  # each phase whole as a graph replay, then its halves apart (eager, events
  # between them: each half runs alone, a receiver after its sender)
  for t in 1 128; do
    a="$one"; [ "$t" = 128 ] && a="-t 128"
    for w in "--whole --graph" ""; do
      MC_TEST_SYS_SCOPE=1 MC_GPU_TRACE="$out/trace-t$t${w:+w}" timeout 60 scripts/mc-launch.sh 1 -- $B $a $w -r 100 -w 10 > /dev/null 2>&1
      echo "== timeline $a ${w:-(halves apart, eager)}"; python3 scripts/mc_report.py trace "$out/trace-t$t${w:+w}" | grep -v " 0.0 *0.0 *$"
    done
  done
  echo "== mc-probe"; timeout 120 build-dev/mc-probe
  (cd "$out" && tar czf traces.tgz --remove-files trace-* 2>/dev/null || true)
  exit 0
fi
if [ "$mode" = probe ]; then
  # where one kernel's time goes (ncu does not run under MPS: one rank alone;
  # PROBE_KERNELS: which, by name; PROBE_ARGS: more mc-bench arguments for the
  # ncu run, e.g. "--quantise fp32" for the quantising kernels), then
  # dispatch and combine timed whole (no events between the halves), eager
  # and as CUDA-graph replays
  B="build-dev/mc-bench --transport nvshmem --no-dense --check-first 1 -r 100 -w 10"
  for k in ${PROBE_KERNELS:-dispatch_prep}; do
    MC_NO_MPS=1 timeout 200 scripts/mc-launch.sh 1 -- ncu --clock-control none --target-processes all \
      -k regex:mc_k_$k --launch-skip 20 --launch-count 1 --section SpeedOfLight --section WarpStateStats \
      --section SourceCounters --section LaunchStats $B -r 30 -n 1 -t 128 ${PROBE_ARGS:-} > "$out/ncu-$k.log" 2>&1
    echo "== ncu $k"; grep -iE "duration|stall|warp cycles|registers|issued" "$out/ncu-$k.log" | cut -c1-160 | head -30
  done
  for t in 1 128; do
    for g in "" --graph; do
      timeout 120 $L $B -n 8 -t $t --whole $g > "$out/whole-t$t$g.txt" 2>&1
      echo "== EP8 t=$t whole $g: $(grep -E '^ *(dispatch|combine) ' "$out/whole-t$t$g.txt" | tr -s ' ' | tr '\n' ';')"
    done
  done
  exit 0
fi
if [ "$mode" = p2p ]; then
  # the p2p transport: every GPU test over it, then both transports' EP8
  # benchmark in one run (nvshmem with its dense baseline)
  for t in gpu_ep_sizes gpu_bound_m gpu_split gpu_bad_input gpu_few_tokens gpu_group_inputs_differ gpu_int64_ids gpu_stall gpu_mask_dead_rank gpu_graph gpu_deepseek_shape gpu_packed \
           gpu_prep_passes gpu_topk_kernels gpu_quant_dispatch gpu_many_rounds; do
    s=$(date +%s)
    if MC_TEST_TRANSPORT=p2p timeout 120 $L build-dev/mc_tests "$t" > "$out/test-p2p-$t.log" 2>&1; then r=PASS
    else r="FAIL($?)"; tail -8 "$out/test-p2p-$t.log"; fi
    echo "p2p $t $r $(( $(date +%s) - s ))s" | tee -a "$out/summary.txt"
  done
  timeout 60 $L build-dev/mc_tests gpu_ep_sizes > "$out/test-nvshmem-gpu_ep_sizes.log" 2>&1 && echo "nvshmem gpu_ep_sizes PASS" || echo "nvshmem gpu_ep_sizes FAIL"
  for tp in p2p nvshmem; do
    for t in 1 128; do
      timeout 120 $L build-dev/mc-bench --transport $tp --json -t $t -r 200 -w 20 > "$out/bench-$tp-t$t.json" 2>"$out/bench-$tp-t$t.err"
      python3 -c "import json,sys; j=json.load(open(sys.argv[1])); l=j['latency_us']; d=j.get('dense_alltoall',{}); print(sys.argv[2], j['config']['tokens'], 'disp', l['dispatch']['median'], {k: l[k]['median'] for k in ('dispatch send','dispatch recv','combine send','combine recv')}, 'comb', l['combine']['median'], 'dense', d.get('median_us'), j['verdict'])" "$out/bench-$tp-t$t.json" $tp 2>&1 | tail -1
    done
  done
  # and the README's PyTorch example, as written
  MOECOMM_LIB="$PWD/build-dev/libmoecomm.so" PYTHONPATH="$PWD/python" timeout 200 scripts/mc-launch.sh 4 -- \
    python3 -m pytest -q -p no:cacheprovider python/tests/test_readme.py 2>&1 | tail -3
  (cd "$out" && tar czf p2p-logs.tgz --remove-files *.log *.err *.json 2>/dev/null || true)
  exit 0
fi
if [ "$mode" = auto ]; then
  # transport auto (the reachability probe at comm create): one host -> p2p,
  # two claimed hosts -> nvshmem; then p2p create and its refusal, which
  # share the mapping code with the probe
  for t in gpu_auto_transport gpu_p2p_other_host; do
    MC_VERBOSE=1 timeout 60 scripts/mc-launch.sh 2 -- build-dev/mc_tests "$t" > "$out/test-$t.log" 2>&1 && r=PASS || r="FAIL($?)"
    log "$t $r"; grep -E "moecomm: transport|ok:|FAIL|rank" "$out/test-$t.log" | head -6
  done
  MC_TEST_TRANSPORT=p2p timeout 60 $L build-dev/mc_tests gpu_ep_sizes > "$out/test-p2p-ep_sizes.log" 2>&1 && r=PASS || r="FAIL($?)"
  log "gpu_ep_sizes p2p $r"
  exit 0
fi
if [ "$mode" = sanitize ]; then
  # compute-sanitizer memcheck and racecheck over both transports (EP2 on one
  # GPU, time-sliced: the sanitizer does not run under MPS), and p2p's
  # create failure for a peer on another host
  for tp in nvshmem p2p; do
    for tool in memcheck racecheck; do
      s=$(date +%s)
      if MC_NO_MPS=1 timeout 200 $L compute-sanitizer --tool $tool --target-processes all --error-exitcode 9 \
           build-dev/mc-bench --transport $tp -n 2 -t 8 -e 16 -k 4 --hidden 256 -r 2 -w 1 --no-dense \
           > "$out/sanitizer-$tp-$tool.log" 2>&1; then r=PASS; else r="FAIL($?)"; grep -E "=========" "$out/sanitizer-$tp-$tool.log" | head -12; fi
      log "sanitizer $tp $tool $r $(( $(date +%s) - s ))s"
    done
  done
  timeout 60 $L build-dev/mc_tests gpu_p2p_other_host > "$out/test-gpu_p2p_other_host.log" 2>&1 && r=PASS || r="FAIL($?)"
  log "gpu_p2p_other_host $r"; grep "rank" "$out/test-gpu_p2p_other_host.log" | head -4
  (cd "$out" && tar czf sanitize-logs.tgz --remove-files sanitizer-*.log test-*.log 2>/dev/null || true)
  exit 0
fi
if [ "$mode" = torch ]; then
  # the Python package on the GPU: an MoE layer in PyTorch, EP1, EP2 and EP4
  # (rank r on GPU r % count), eager and CUDA graph, against a dense
  # reference (python/tests/test_torch_gpu.py), and the README's examples;
  # where there are several GPUs, EP4 again on one of them (4 ranks under MPS)
  py() { MOECOMM_LIB="$PWD/build-dev/libmoecomm.so" PYTHONPATH="$PWD/python" timeout 400 scripts/mc-launch.sh 4 -- \
           python3 -m pytest -q -s -p no:cacheprovider "$@" 2>&1; }
  py python/tests/test_torch_gpu.py python/tests/test_readme.py | tee "$out/torch.txt" | tail -25
  if [ "$(scripts/mc-launch.sh --gpus)" -gt 1 ]; then
    t=python/tests/test_torch_gpu.py::test_moe_layer_on_gpu
    CUDA_VISIBLE_DEVICES=0 py "$t[4-nvshmem]" "$t[4-p2p]" | tee "$out/torch-ep4-one-gpu.txt" | tail -8
  fi
  exit 0
fi
if [ "$mode" = trace ]; then
  # the kernels' timeline (MC_GPU_TRACE stamps, scripts/mc_report.py trace):
  # where each rank's time goes, EP8 under MPS against one rank alone
  # TRACE_RANKS=N (N > 1): EP N, one rank per GPU on a machine of N GPUs,
  # at 1, 128 and 4096 tokens; TRACE_TRANSPORT picks the transport
  B="build-dev/mc-bench --transport ${TRACE_TRANSPORT:-nvshmem} --no-dense --check-first 1 -r 100 -w 10"
  tr() { # name ranks env... -- bench args
    local name=$1 n=$2; shift 2
    env MC_GPU_TRACE="$out/trace-$name" "$@" timeout 120 scripts/mc-launch.sh "$n" -- $B -n "$n" ${TARGS:-} \
      > "$out/trace-$name.txt" 2>&1
    echo "== $name: $(grep -E '^ *(dispatch|combine) ' "$out/trace-$name.txt" | awk '{printf "%s %s %s; ", $1, $2, $3}')"
    python3 scripts/mc_report.py trace "$out/trace-$name" ${TRACE_RANKS:+--own-clock} | tee "$out/trace-$name.sum"
  }
  if [ -n "${TRACE_RANKS:-}" ]; then
    for t in 1 128 4096; do TARGS="-t $t" tr "ep$TRACE_RANKS-t$t" "$TRACE_RANKS"; done
  else
    TARGS="-t 128" tr ep8-t128 8
    TARGS="-t 128 --graph" tr ep8-t128-graph 8
    TARGS="-t 1" tr ep8-t1 8
    TARGS="-t 1 --graph" tr ep8-t1-graph 8
    MC_NO_MPS=1 TARGS="-t 128" tr ep1-t128 1
  fi
  (cd "$out" && tar czf traces.tgz --remove-files trace-* *.log 2>/dev/null || true)
  exit 0
fi
run_test() { # name [VAR=value ...]: the test, under the environment given
  local t=$1 s tag launch=$L; shift; s=$(date +%s); tag=$t${1:+-${1%%=*}}
  # one process on the whole GPU: ranks as threads (under MPS it would get one
  # rank's share), the tests of one GPU's arithmetic, and the tests that fork
  # their own ranks (which then share the GPU by time slices)
  case $t in gpu_p2p_threads|gpu_quant_values|gpu_quant_division|gpu_barrier_after_rejoin|gpu_mask_retry) launch="scripts/mc-launch.sh 1 --" ;; esac
  if env "$@" timeout "${TEST_TIMEOUT:-300}" $launch build-dev/mc_tests "$t" > "$out/test-$tag.log" 2>&1; then r=PASS; else r="FAIL($?)"; fi
  results+=("$t${1:+ ($*)} $r $(( $(date +%s) - s ))s")
  echo "${results[-1]}" # as it ends: a run cut short by a time limit still says what passed
  [ "$r" = PASS ] || tail -15 "$out/test-$tag.log"
}
tests="gpu_ep_sizes gpu_bound_m gpu_split gpu_bad_input gpu_few_tokens gpu_group_inputs_differ gpu_int64_ids gpu_stall gpu_mask_dead_rank gpu_graph gpu_graph_refused gpu_bench_floor gpu_deepseek_shape gpu_packed gpu_prep_passes gpu_topk_kernels gpu_quant_dispatch gpu_nvshmem_attach gpu_p2p_other_host gpu_auto_transport gpu_many_rounds gpu_p2p_threads gpu_barrier_after_rejoin gpu_mask_retry gpu_quant_values gpu_quant_division"
[ "$mode" = quick ] && tests=${MC_TESTS:-gpu_ep_sizes gpu_stall} && TEST_TIMEOUT=120
# tests: every GPU test, nothing else (a check after a change that is not about speed)
for t in $tests; do run_test "$t"; done
# the paths the defaults on one GPU do not take: NVSHMEM puts from staging
# (what a NIC carries), system-scope signals (what several GPUs need)
run_test gpu_ep_sizes MC_TEST_STAGED=1
run_test gpu_ep_sizes MC_TEST_SYS_SCOPE=1
# the same kernels over the p2p transport (CUDA IPC, no NVSHMEM)
for t in $tests; do case $t in gpu_nvshmem_attach|gpu_p2p_other_host|gpu_auto_transport|gpu_p2p_threads|gpu_barrier_after_rejoin|gpu_mask_retry|gpu_quant_values|gpu_quant_division) ;; *) run_test "$t" MC_TEST_TRANSPORT=p2p ;; esac; done

if [ "$mode" = tests ]; then
  printf '%s\n' "${results[@]}" >> "$out/summary.txt"
  exit 0
fi
if [ "$mode" = full ] && command -v compute-sanitizer >/dev/null; then
  for tp in nvshmem p2p; do
    for tool in memcheck racecheck; do
      s=$(date +%s)
      if MC_NO_MPS=1 timeout 300 $L compute-sanitizer --tool $tool --target-processes all --error-exitcode 9 \
           build-dev/mc-bench --transport $tp -n 2 -t 8 -e 16 -k 4 --hidden 256 -r 2 -w 1 --no-dense \
           > "$out/sanitizer-$tp-$tool.log" 2>&1; then r=PASS; else r="FAIL($?)"; fi
      results+=("sanitizer-$tp-$tool $r $(( $(date +%s) - s ))s")
      [ "$r" = PASS ] || grep -E "=========" "$out/sanitizer-$tp-$tool.log" | head -12
    done
  done
fi

bench() { # name args... (BT: the transport, default nvshmem)
  local name=$1; shift
  env ${BENV:-} timeout 300 $L build-dev/mc-bench --transport "${BT:-nvshmem}" --json "$@" > "$out/bench-$name.json" 2> "$out/bench-$name.err" ||
    echo "{\"failed\": \"$name\"}" >> "$out/bench-$name.json"
}
tok_list="1 8 32 128 512"
[ "$mode" = quick ] && tok_list=${MC_TOKENS:-1 128}
for t in $tok_list; do bench "dsv3-t$t" -t "$t" -r 200 -w 20; done
# p2p in the same run: the same points (its dense baseline is nvshmem's above)
for t in $tok_list; do BT=p2p bench "p2p-dsv3-t$t" -t "$t" -r 200 -w 20; done
[ "$mode" = full ] && bench "small-t128" -e 128 -k 8 --hidden 2048 -t 128 -r 200 -w 20
if [ "$mode" = full ]; then
  # the same calls with no CUDA event between a send and its recv (under
  # MPS each event costs the GPU several us), eager and as graph replays
  for t in 1 128; do
    bench "dsv3-t$t-whole" -t "$t" -r 200 -w 20 --whole
    bench "dsv3-t$t-whole-graph" -t "$t" -r 200 -w 20 --whole --graph
  done
  # and the kernels' timeline at 128 tokens (globaltimer stamps)
  MC_GPU_TRACE="$out/trace-t128" timeout 120 $L build-dev/mc-bench --transport nvshmem --no-dense --check-first 1 \
    -r 100 -w 10 -t 128 > /dev/null 2>&1
  python3 scripts/mc_report.py trace "$out/trace-t128" > "$out/timeline-t128.txt"
  (cd "$out" && tar czf traces.tgz --remove-files trace-t128.* 2>/dev/null || true)
fi

# at most 8 files come back: logs in one archive, raw JSON in another
(cd "$out" && tar czf logs.tgz --remove-files $(cd "$out" && ls *.log *.err machine.txt 2>/dev/null) 2>/dev/null || true)
trap '(cd "$out" && tar czf bench-json.tgz --remove-files bench-*.json 2>/dev/null || true)' EXIT
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
    for h in ("dispatch send", "dispatch recv", "combine send", "combine recv"): l.setdefault(h, {"median": 0.0})
    print(f'{os.path.basename(f)[6:-5]:14s} t={j["config"]["tokens"]:4d} disp {l["dispatch"]["median"]:8.1f} (s {l["dispatch send"]["median"]:6.1f} r {l["dispatch recv"]["median"]:7.1f}) '
          f'comb {l["combine"]["median"]:8.1f} (s {l["combine send"]["median"]:6.1f} r {l["combine recv"]["median"]:7.1f}) '
          f'dense {d.get("median_us", 0):8.1f}  buf {j["buffer_bytes_per_rank"]/2**20:6.1f}MiB {j["verdict"]}')
PY
