#!/usr/bin/env bash
# gpu-ab.sh TREE... - the same benchmark points for other copies of the
# source and this one, interleaved, so a change is measured against its
# baseline on the same machine and in the same minutes (runs on different
# machines, or minutes apart, differ by a few us). Each TREE is a plain copy
# of a source tree, best under a folder git ignores, e.g.
#   mkdir -p build-trees/old && git archive REV | tar -x -C build-trees/old
# labelled by its folder's name; this tree is "new". Builds each (mc-bench,
# p2p only) in parallel, then runs every point for every tree in turn,
# AB_REPS times (default 3). AB_RANKS: ranks (default 2: one per GPU on a
# machine of two; more share GPUs under MPS; 1: a rank alone on its GPU).
# AB_ENV: environment for every run (e.g. MC_TEST_SYS_SCOPE=1, the signals
# of ranks on different GPUs, for a rank alone). AB_POINTS: what to time
# (default "g1 e1 g128 e128"); each point is timed whole (MC_SEND_RECV)
# unless it says halves, with the launch floor beside it (mc-bench --floor):
#   g1, e1     1 token of a handle of max_tokens 128, through bound_m, as a
#              CUDA graph replay (g) or eagerly (e)
#   g1m256     the same with max_tokens 256
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
set -uo pipefail
[ $# -ge 1 ] || { echo "usage: $0 TREE... (copies of the source to time against this one)"; exit 2; }
out=${OUT:-$PWD/gpu-ab-out}
mkdir -p "$out"
trees=()
for t in "$@"; do d=$(cd "$t" && pwd) || exit 2; trees+=("$d"); done
cd "$(dirname "$0")/.." || exit 2
n=${AB_RANKS:-2}
cfg="-DMC_CUDA=ON -DMC_NVSHMEM=OFF -DMC_BUILD_TESTS=OFF -DMC_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=Release"
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
