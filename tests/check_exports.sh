#!/bin/sh
# Fails if libmoecomm exports a symbol that does not start with mc_.
lib="$1"
bad=$(nm -D --defined-only "$lib" | awk '$2 ~ /[TDBR]/ {print $3}' | grep -v '^mc_' | grep -v '^_')
if [ -n "$bad" ]; then echo "exported symbols without the mc_ prefix:"; echo "$bad"; exit 1; fi
n=$(nm -D --defined-only "$lib" | awk '$2 ~ /[TDBR]/ {print $3}' | grep -c '^mc_')
echo "ok: $n exported symbols, all mc_*"
[ "$n" -gt 10 ]
