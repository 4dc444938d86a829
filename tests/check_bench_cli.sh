#!/bin/sh
# mc-bench's exit statuses as a user meets them: 2 and one line on stderr
# naming the rule for an argument that breaks one (mc-bench's own rules, the
# library's, MC_TIMEOUT_MS), nothing on stdout; 1 and the cause on stderr,
# and no table, for a run that never got through a round; 0 and the table
# for a run that passes.
bench="$1"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
small="-n 2 -t 4 -e 16 -k 4 --hidden 256 -r 1 -w 1"
# expect STATUS TEXT ARGS...: that status, one line on stderr holding TEXT, stdout empty
expect() {
  want=$1 text=$2
  shift 2
  "$bench" "$@" > "$tmp/out" 2> "$tmp/err"
  got=$?
  if [ "$got" != "$want" ] || [ -s "$tmp/out" ] || [ "$(wc -l < "$tmp/err")" != 1 ] || ! grep -qF -- "$text" "$tmp/err"; then
    echo "mc-bench $*: status $got (want $want), $(wc -c < "$tmp/out") bytes on stdout, stderr:"
    cat "$tmp/err"
    exit 1
  fi
  echo "ok: mc-bench $* -> $got: $(cat "$tmp/err")"
}
expect 2 "mc-bench: --tokens 'abc': not a whole number" -t abc
expect 2 "mc-bench: --ranks 6: num_experts 256 is not a multiple of 6" -n 6
expect 2 "config->token_bytes=100 must be a multiple of 16" $small --token-bytes 100
export MC_TIMEOUT_MS=soon
expect 2 "MC_TIMEOUT_MS 'soon': not a whole number" $small
unset MC_TIMEOUT_MS
# 4096 tokens on 2 ranks: 7.5 GB of expert_x a rank, in 1 GB of address space
(ulimit -v 1000000 && expect 1 "never got through a round: rank 0: out of memory for the test buffers" -n 2 -t 4096) ||
  exit 1
"$bench" $small --timeout 5000 --json > "$tmp/out" 2> "$tmp/err" || { cat "$tmp/out" "$tmp/err"; exit 1; }
grep -q '"timeout_ms": 5000' "$tmp/out" && grep -q '"verdict": "PASS"' "$tmp/out" || { cat "$tmp/out"; exit 1; }
echo "ok: mc-bench $small --timeout 5000 --json -> 0, PASS"
