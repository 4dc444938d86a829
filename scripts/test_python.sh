#!/usr/bin/env bash
# Run the Python package's tests (python/tests) against build/libmoecomm.so.
# Builds nothing: run `make build` first. Exits non-zero on any failure.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
lib="$root/build/libmoecomm.so"
if [[ ! -f "$lib" ]]; then
  echo "test_python.sh: $lib not found; run 'make build' first" >&2
  exit 1
fi
if ! python3 -c 'import numpy, pytest' 2>/dev/null; then
  python3 -m pip install -q numpy pytest
fi
export MOECOMM_LIB="$lib"
export PYTHONPATH="$root/python${PYTHONPATH:+:$PYTHONPATH}"
cd "$root"
exec timeout 110 python3 -m pytest -q -p no:cacheprovider python/tests "$@"
