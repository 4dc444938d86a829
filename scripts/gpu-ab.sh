#!/usr/bin/env bash
# gpu-ab.sh TREE... - the same benchmark points for other copies of the
# source and this one, interleaved, so a change is measured against its
# baseline on the same machine and in the same minutes (runs on different
# machines, or minutes apart, differ by a few us). Each TREE is a plain copy
# of a source tree, best under a folder git ignores, e.g.
#   mkdir -p build-trees/old && git archive REV | tar -x -C build-trees/old
# labelled by its folder's name; this tree is "new". Builds each (mc-bench,
# p2p only) in parallel, then runs every point for every tree in turn,
# AB_REPS times (default 2). AB_RANKS: ranks (default 2: one per GPU on a
# machine of two; more share GPUs under MPS). AB_POINTS: what to time, of
# t1, t128, small (64 experts, top-6, hidden 2048, 128 tokens), t4096,
# t128h (halves timed apart), q128 and u128 (128 tokens quantised in dispatch,
# fp32 or UE8M0 scales), qa128 and ua128 (the same quantised apart first:
# mc-bench --quantise-apart); default "t128 t1 small t128h"; the others are
# timed whole (MC_SEND_RECV). The JSON of every run goes to $OUT (default
# ./gpu-ab-out); a table last: every run, then per point and tree the median
# of the runs' medians with their range. One GPU's runs are noisy (a run's
# dispatch median can sit in one of two modes 2-3 us apart), so decide on
# AB_REPS=4 or more.
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
run() { # label bench point
  local a
  case $3 in
  t1) a="-t 1 --whole" ;; t128) a="-t 128 --whole" ;; t128h) a="-t 128" ;;
  small) a="-t 128 -e 64 -k 6 --hidden 2048 --whole" ;; t4096) a="-t 4096 -r 50 -w 5 --whole" ;;
  q128) a="-t 128 --whole --quantise fp32" ;; u128) a="-t 128 --whole --quantise ue8m0" ;;
  qa128) a="-t 128 --whole --quantise fp32 --quantise-apart" ;; ua128) a="-t 128 --whole --quantise ue8m0 --quantise-apart" ;;
  *) echo "unknown point $3"; return ;;
  esac
  timeout 120 scripts/mc-launch.sh "$n" -- "$2" --transport p2p -n "$n" -r 200 -w 20 --no-dense --json $a \
    > "$out/ab-$1-$3-$4.json" 2>> "$out/ab.err"
}
for rep in $(seq "${AB_REPS:-2}"); do
  for p in ${AB_POINTS:-t128 t1 small t128h}; do
    for i in "${!bins[@]}"; do run "${labels[$i]}" "${bins[$i]}" "$p" "$rep"; done
  done
done
python3 - "$out" <<'PY'
import glob, json, os, statistics, sys
runs = {}
for f in sorted(glob.glob(os.path.join(sys.argv[1], "ab-*.json"))):
    try:
        l = json.load(open(f))["latency_us"]
    except Exception:
        print(os.path.basename(f), "unreadable"); continue
    h = " ".join(f'{l[k]["median"]:6.1f}' if k in l else "     -"
                 for k in ("dispatch send", "dispatch recv", "combine send", "combine recv"))
    print(f'{os.path.basename(f)[3:-5]:28s} disp {l["dispatch"]["median"]:7.1f} comb {l["combine"]["median"]:7.1f}  halves {h}')
    label, point, _ = os.path.basename(f)[3:-5].rsplit("-", 2)
    runs.setdefault((point, label), []).append(l)
print("per point and tree: median of the runs' medians [range], median p99")
for (point, label), ls in sorted(runs.items()):
    cols = []
    for ph in ("dispatch", "combine"):
        m = [l[ph]["median"] for l in ls]
        cols.append(f'{ph[:4]} {statistics.median(m):6.1f} [{min(m):5.1f}-{max(m):5.1f}] p99 '
                    f'{statistics.median(l[ph]["p99"] for l in ls):6.1f}')
    print(f'{point:6s} {label:10s} n={len(ls)}  ' + "  ".join(cols))
PY
