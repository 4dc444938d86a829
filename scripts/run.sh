#!/bin/sh
# `make run`: the main job. mc-bench on the DeepSeek-V3 layer at 8 ranks
# with the best transport this build has (the cpu transport: ranks as
# threads). Extra arguments go to mc-bench (make run ARGS="--json").
build=${1:-build}
shift
exec "$build/mc-bench" "$@"
