#!/bin/sh
# `make run`: the main job. mc-bench on the DeepSeek-V3 layer at 8 ranks with
# the best transport here: nvshmem when this build has it and a GPU is
# visible (8 ranks as processes through mc-launch.sh: one per GPU, or all on
# one GPU under MPS), else the cpu transport (ranks as threads).
# Extra arguments go to mc-bench (make run ARGS="--json").
build=${1:-build}
shift
dir=$(dirname "$0")
if grep -q "MC_HAVE_NVSHMEM:INTERNAL=ON\|MC_HAVE_NVSHMEM:BOOL=ON" "$build/CMakeCache.txt" 2>/dev/null ||
   grep -q "MC_HAVE_NVSHMEM=1" "$build/CMakeFiles/moecomm.dir/flags.make" 2>/dev/null; then
  if nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
    exec "$dir/mc-launch.sh" 8 -- "$build/mc-bench" --transport nvshmem "$@"
  fi
  echo "run: no GPU visible; the cpu transport" >&2
fi
exec "$build/mc-bench" "$@"
