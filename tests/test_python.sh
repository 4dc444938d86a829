#!/usr/bin/env bash
# Test the Python package as users get it: build its wheel (pip wheel
# ./python compiles libmoecomm through the top-level CMake), install the wheel
# into a venv of its own, and run python/tests against that installed package.
# The python3 on PATH only creates the venv: nothing is installed into it.
# What this makes stays under build/: pyenv/ (the venv), wheels/, pywheel/
# (the wheel's CMake build tree, kept for incremental rebuilds); nothing in
# python/. Extra arguments go to pytest. Exits non-zero on any failure.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="$root/build"
venv="$build/pyenv"
wheels="$build/wheels"
py="$venv/bin/python"
export PYTHONDONTWRITEBYTECODE=1 PIP_DISABLE_PIP_VERSION_CHECK=1
unset MOECOMM_LIB PYTHONPATH  # the installed package and its own library, nothing else

mkdir -p "$build"
if ! "$py" -c 'import numpy, pytest' 2>/dev/null; then
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$py" -m pip install -q numpy pytest
fi

# The cpu transport only (MC_CUDA=OFF): on the 2-core CI machine a fresh
# wheel built in 3.4-4.7 s, against 58-107 s with the GPU transports (nvcc,
# sm_80 and sm_90; `time`, 2026-11-30), and these tests run on the cpu
# transport alone; `make test` compiles the GPU transports in build/ and
# build-p2p/ anyway.
rm -rf "$wheels"
"$py" -m pip wheel -q "$root/python" -w "$wheels" --no-deps \
  -C build-dir="$build/pywheel" -C cmake.define.MC_CUDA=OFF
"$py" -m pip install -q --force-reinstall --no-deps "$wheels"/moecomm-*.whl

# The pytest script, not `python -m pytest`, which would put the working
# directory on sys.path; test_package.py checks that the package and its
# library are the venv's.
cd "$root"
MOECOMM_TEST_PREFIX="$venv" exec timeout 110 "$venv/bin/pytest" -q -p no:cacheprovider python/tests "$@"
