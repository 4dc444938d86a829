#!/bin/sh
# Fails (exit 1) where the user-facing docs break the repository's rules:
# README.md over 150 lines, docs/performance.md over 250, more than 20 files
# under docs/bench, a time of day ("04:59 UTC") or a commit hash in
# README.md, docs/*.md or python/README.md, or a measured time in a code
# comment (src/, include/, tools/). One line per breach, naming the file and
# line. Usage: check_docs.sh SOURCE_DIR
src="${1:?usage: check_docs.sh SOURCE_DIR}"
cd "$src" || exit 1
fail=0

# at_most FILE N: FILE has at most N lines
at_most() {
  n=$(wc -l < "$1") || { fail=1; return; }
  if [ "$n" -gt "$2" ]; then
    echo "$1:$n: $n lines, more than $2"
    fail=1
  fi
}
at_most README.md 150
at_most docs/performance.md 250

if [ -d docs/bench ]; then
  n=$(find docs/bench -type f | wc -l)
  if [ "$n" -gt 20 ]; then
    echo "docs/bench: $n files, more than 20"
    fail=1
  fi
fi

docs=$(ls README.md python/README.md docs/*.md)
[ -n "$docs" ] || { echo "no docs left to check"; exit 1; }

# a time of day: H:MM or HH:MM, an optional space, UTC
hits=$(grep -nHoE '(^|[^0-9])[0-9]{1,2}:[0-9]{2} ?UTC' $docs | sed 's/^\([^:]*:[0-9]*\):[^0-9]*\(.*\)$/\1: a time of day (\2)/')
[ -n "$hits" ] && { echo "$hits"; fail=1; }

# a commit hash: a whole word of 7 to 40 lowercase hex digits holding at
# least one digit and one letter ("facade", "added" and numbers pass)
hits=$(grep -nHowE '[0-9a-f]{7,40}' $docs | grep -E ':[0-9a-f]*[0-9][0-9a-f]*$' |
  grep -E ':[0-9a-f]*[a-f][0-9a-f]*$' | sed 's/^\([^:]*:[0-9]*\):\(.*\)$/\1: a commit hash (\2)/')
[ -n "$hits" ] && { echo "$hits"; fail=1; }

# a measured time in a comment of the code (*.c *.h *.cu *.cuh under src/,
# include/ and tools/): comments say why, the figures live in the docs. A
# number followed by "us" ("3.5 us", "12us"); for ms and ns only a decimal
# or a range ("0.29 ns", "100-600 ms"), since a whole number of ms or ns
# in a comment is as often a setting the code makes ("naps up to 128 ns",
# "a wait that has lasted 1 ms"). Only the comments' text is read (block
# and line comments; string literals skipped), so format strings and names
# such as timeout_ms pass.
code=$(find src include tools -type f \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) | sort)
[ -n "$code" ] || { echo "no code left to check"; exit 1; }
hits=$(awk '
  FNR == 1 { blk = 0 }
  {
    c = ""; str = 0; n = length($0)
    for (i = 1; i <= n; i++) {
      ch = substr($0, i, 1); two = substr($0, i, 2)
      if (blk) {
        if (two == "*/") { blk = 0; i++; c = c " " } else c = c ch
      } else if (str) {
        if (ch == "\\") i++
        else if (ch == q) str = 0
      } else if (two == "/*") { blk = 1; i++; c = c " " }
      else if (two == "//") { c = c " " substr($0, i + 2); break }
      else if (ch == "\"" || ch == "\047") { str = 1; q = ch }
    }
    c = " " c " "
    if (match(c, /[^A-Za-z0-9_][0-9]+(\.[0-9]+)? ?us[^A-Za-z0-9_]/) ||
        match(c, /[^A-Za-z0-9_][0-9]+\.[0-9]+ ?[mn]s[^A-Za-z0-9_]/) ||
        match(c, /[^A-Za-z0-9_.][0-9]+(\.[0-9]+)?-[0-9]+(\.[0-9]+)? ?[mn]s[^A-Za-z0-9_]/))
      printf "%s:%d: a measured time in a comment (%s)\n", FILENAME, FNR, substr(c, RSTART + 1, RLENGTH - 2)
  }' $code)
[ -n "$hits" ] && { echo "$hits"; fail=1; }

[ "$fail" -eq 0 ] && echo "ok: README.md, docs/performance.md and docs/bench within their limits; no time of day or commit hash; no measured time in a code comment"
exit "$fail"
