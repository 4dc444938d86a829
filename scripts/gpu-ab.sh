#!/usr/bin/env bash
# gpu-ab.sh OLD_TREE [RANKS] - the same benchmark points for an older source
# tree and this one, interleaved in one device call, so a change is measured
# against its baseline on the same machine and in the same minutes (runs on
# different machines differ by a few us). OLD_TREE: a plain copy of the old
# commit inside the repo, e.g. `git archive REV | tar -x -C ab-old`.
# AB_POINTS: tokens per rank (default "1 32 128"); AB_VARIANTS: extra
# environments for this tree, each timed too (e.g. "MC_TEST_STAGED=1"). A table last.
set -uo pipefail
old=$(cd "$1" && pwd) || exit 2; n=${2:-2}
out=${OUT:-$PWD/gpu-ab-out}
mkdir -p "$out"
cd "$(dirname "$0")/.."
b() { cmake -S "$1" -B "$2" -DMC_CUDA=ON -DMC_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=Release > /dev/null &&
      cmake --build "$2" --target mc-bench -j"$(( $(nproc) / 2 ))" > /dev/null; }
b "$old" "$old/build-ab" > "$out/build-old.log" 2>&1 & b . build-ab > "$out/build-new.log" 2>&1 & wait
[ -x "$old/build-ab/mc-bench" ] && [ -x build-ab/mc-bench ] || { tail -20 "$out"/build-*.log; echo "BUILD FAILED"; exit 1; }
one() { # label bench env...
  local label=$1 bin=$2 t=$3; shift 3
  env "$@" timeout 60 scripts/mc-launch.sh "$n" -- "$bin" --transport p2p -n "$n" -t "$t" -r 200 -w 20 --json \
    > "$out/ab-$label-t$t.json" 2>> "$out/ab.err"
}
for t in ${AB_POINTS:-1 32 128}; do
  for rep in 1 2; do
    one "old$rep" "$old/build-ab/mc-bench" "$t"
    for v in ${AB_VARIANTS:-}; do one "$(echo "$v" | tr 'A-Z=' 'a-z-')$rep" build-ab/mc-bench "$t" "$v"; done
    one "new$rep" build-ab/mc-bench "$t"
  done
done
python3 - "$out" <<'PY'
import glob, json, os, sys
for f in sorted(glob.glob(os.path.join(sys.argv[1], "ab-*.json"))):
    try:
        l = json.load(open(f))["latency_us"]
    except Exception:
        print(os.path.basename(f), "unreadable"); continue
    h = " ".join(f'{l[k]["median"]:6.1f}' for k in ("dispatch send", "dispatch recv", "combine send", "combine recv"))
    print(f'{os.path.basename(f)[3:-5]:28s} disp {l["dispatch"]["median"]:7.1f} comb {l["combine"]["median"]:7.1f}  halves {h}')
PY
