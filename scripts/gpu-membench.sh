#!/usr/bin/env bash
# gpu-membench.sh - the memory rate under the kernels (perf-notes 25): N
# processes on one GPU under MPS (mc-launch.sh) each copy rows the way
# moecomm's copying kernels do (tools/mc_membench.cu), contiguous or spread
# over 32 or 256 regions a full expert capacity apart, scattering
# (dispatch-recv into expert_x) or gathering (combine reading expert_y);
# then one process alone on the whole GPU. Raw JSON lines to $OUT (or
# ./gpu-out)/membench.jsonl; a table last: the rate of all processes together
# (bytes read + written over the span from the first start to the last end).
# MB_ROWS, MB_ROW_BYTES, MB_ITERS, MB_PROCS, MB_BLOCKS override the defaults
# (blocks: the library's grid by default); MB_SKIP_ONE=1 skips the lone process;
# MB_PEERS=1 spreads the rows over every process's regions through CUDA IPC
# (what direct dispatch and the registered combine do; perf-notes 21).
set -uo pipefail
out=${OUT:-$PWD/gpu-out}
mkdir -p "$out"
cd "$(dirname "$0")/.."
bin=${MB_BIN:-build-dev/mc-membench}
if [ ! -x "$bin" ]; then
  { cmake -S . -B build-dev -DMC_CUDA=ON -DMC_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=Release &&
    cmake --build build-dev --target mc-membench -j"$(nproc)"; } > "$out/membench-build.log" 2>&1 ||
    { tail -20 "$out/membench-build.log"; echo "BUILD FAILED"; exit 1; }
fi
rows=${MB_ROWS:-1024} rb=${MB_ROW_BYTES:-7168} iters=${MB_ITERS:-1000} n=${MB_PROCS:-8}
res="$out/membench.jsonl"
: > "$res"
# all the cases of one process count in one MPS session (the script is the launched command)
cases() { # procs
  local p=$1 dir
  for regions in 1 32 256; do
    for g in "" --gather; do
      dir=$(mktemp -d)
      for r in $(seq 0 $((p - 1))); do
        "$bin" --procs "$p" --rank "$r" --dir "$dir" --rows "$rows" --row-bytes "$rb" --regions "$regions" \
          --iters "$iters" ${MB_BLOCKS:+--blocks $MB_BLOCKS} ${MB_PEERS:+--peers} $g >> "$res.$p.$r" 2>> "$out/membench.err" &
      done
      wait
      rm -rf "$dir"
    done
  done
}
export -f cases
export bin rows rb iters res out MB_BLOCKS MB_PEERS
timeout 300 scripts/mc-launch.sh "$n" -- bash -c "cases $n" 2>> "$out/membench.err"
[ -n "${MB_SKIP_ONE:-}" ] || timeout 120 scripts/mc-launch.sh 1 -- bash -c "cases 1" 2>> "$out/membench.err"
cat "$res".* >> "$res" 2>/dev/null; rm -f "$res".*
python3 - "$res" <<'PY'
import collections, json, sys
runs = collections.defaultdict(list)
for line in open(sys.argv[1]):
    try:
        j = json.loads(line)
    except ValueError:
        continue
    runs[(j["procs"], j.get("peers", 0), j["regions"], j["gather"])].append(j)
print("== membench: rows copied by N processes at once (GB/s: read + written) ==")
print(f'{"procs":>5} {"peers":>5} {"regions":>7} {"pattern":>8} {"blocks":>6} {"us/iter (median proc)":>22} {"all together":>12}')
for (p, peers, r, g), js in sorted(runs.items()):
    if len(js) != p:
        print(f"{p:5d} {peers:5d} {r:7d} {'gather' if g else 'scatter':>8}  only {len(js)} of {p} processes reported"); continue
    span_s = (max(j["t1_ns"] for j in js) - min(j["t0_ns"] for j in js)) / 1e9
    total = sum(2.0 * j["rows"] * j["row_bytes"] * j["iters"] for j in js)
    us = sorted(j["us_per_iter"] for j in js)[len(js) // 2]
    print(f'{p:5d} {peers:5d} {r:7d} {"gather" if g else "scatter":>8} {js[0]["blocks"]:6d} {us:22.1f} {total / span_s / 1e9:12.0f}')
PY
