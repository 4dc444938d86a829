# gpu-prelude.sh - sourced by the device scripts (gpu-fuse, gpu-floor,
# gpu-ownsms, gpu-prewait-zc, gpu-smprobe) before their work: strict mode;
# $out, the results folder ($OUT or ./gpu-out); the repository root as the
# working folder; $t0, the start; the machine's facts in $out/machine.txt;
# build-dev built (Release, CUDA for sm_90; all targets, or those in
# $BUILD_TARGETS), its log in $out/build.log, or the log's tail and
# "BUILD FAILED" and exit 1; $L, the EP8 launcher. Not run on its own.
set -uo pipefail
out=${OUT:-$PWD/gpu-out}
mkdir -p "$out"
cd "$(dirname "${BASH_SOURCE[0]}")/.."
t0=$(date +%s)
{ date -u; nvidia-smi -L; nvidia-cuda-mps-control -v | head -1; } > "$out/machine.txt" 2>&1
targets=(); for t in ${BUILD_TARGETS:-}; do targets+=(--target "$t"); done
{ cmake -S . -B build-dev -DMC_CUDA=ON -DMC_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=Release &&
  cmake --build build-dev "${targets[@]}" -j"$(nproc)"; } > "$out/build.log" 2>&1 ||
  { tail -30 "$out/build.log"; echo "BUILD FAILED"; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
L="scripts/mc-launch.sh 8 --"
