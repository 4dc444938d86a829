#!/usr/bin/env bash
# gpu-build.sh [TARGET...] - the device scripts' build: build-dev (Release,
# CUDA for sm_90), all targets or those named, the log in $OUT (or
# ./gpu-out)/build.log; prints the seconds it took, or the log's tail and
# "BUILD FAILED" with exit status 1. Run from anywhere.
set -uo pipefail
out=${OUT:-$PWD/gpu-out}
mkdir -p "$out"
cd "$(dirname "$0")/.."
t0=$(date +%s)
targets=(); for t in "$@"; do targets+=(--target "$t"); done
{ cmake -S . -B build-dev -DMC_CUDA=ON -DMC_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=Release &&
  cmake --build build-dev "${targets[@]}" -j"$(nproc)"; } > "$out/build.log" 2>&1 ||
  { tail -30 "$out/build.log"; echo "BUILD FAILED"; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
