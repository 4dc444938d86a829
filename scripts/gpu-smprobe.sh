#!/usr/bin/env bash
# gpu-smprobe.sh - which SMs do ranks sharing one GPU under MPS run on
# (perf-notes 37)? N processes of mc-membench at once through mc-launch.sh
# (the launcher's share, or MC_MPS_PERCENT), each listing the SMs (%smid)
# its blocks ran on during the timed launches; then one process alone.
# MB_BLOCKS: blocks per process (default: the library's grid). JSON lines to
# $OUT (or ./gpu-out)/smprobe-N.jsonl; a table last.
BUILD_TARGETS="mc-membench" . "$(dirname "$0")/gpu-prelude.sh"
probe() { # procs
  local dir; dir=$(mktemp -d)
  for r in $(seq 0 $(($1 - 1))); do
    build-dev/mc-membench --procs "$1" --rank "$r" --dir "$dir" --iters "${MB_ITERS:-3000}" ${MB_BLOCKS:+--blocks $MB_BLOCKS} &
  done
  wait; rm -rf "$dir"
}
export -f probe
export MB_ITERS MB_BLOCKS
for n in ${SP_PROCS:-8 1}; do
  timeout 200 scripts/mc-launch.sh "$n" -- bash -c "probe $n" > "$out/smprobe-$n.jsonl" 2>> "$out/smprobe.err"
done
python3 - "$out" <<'PY'
import glob, json, os, sys
for f in sorted(glob.glob(os.path.join(sys.argv[1], "smprobe-*.jsonl"))):
    js = [json.loads(l) for l in open(f) if l.startswith("{")]
    print(f"== {os.path.basename(f)}: {len(js)} processes")
    for j in sorted(js, key=lambda j: j["rank"]):
        print(f'rank {j["rank"]} blocks {j["blocks"]:3d} {j["gbps"]:7.1f} GB/s  {j["sms_used"]:3d} SMs: {j["sm_ids"]}')
    seen = {}
    for j in js:
        for part in j["sm_ids"].split(","):
            a, b = map(int, part.split("-"))
            for s in range(a, b + 1):
                seen.setdefault(s, set()).add(j["rank"])
    print(f"distinct SMs over all processes: {len(seen)}; SMs used by more than one: {sum(len(v) > 1 for v in seen.values())}")
PY
