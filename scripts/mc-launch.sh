#!/usr/bin/env bash
# mc-launch.sh N -- COMMAND...
# Run COMMAND, which starts N ranks as processes (mc-bench --processes,
# mc_tests gpu_*), with the environment they need on this machine:
# - one rank per GPU when there are at least N GPUs (rank r uses GPU r % count);
# - otherwise several ranks per GPU under MPS, each limited to 100/k percent
#   of its GPU's SMs (k ranks per GPU; 12.5% for 8); MPS is started here and always shut
#   down when this script exits, however it exits;
#   (MC_MPS_PERCENT overrides the share; MC_NO_MPS=1: time-slice instead, e.g. for compute-sanitizer, which does
#   not run under MPS); the share is also what keeps ranks sharing a GPU live: at MC_MPS_PERCENT=100, 8 ranks'
#   receive kernels spinning on every SM kept a sender's kernel from starting until the timeout;
# - NVSHMEM on one node without NVLink multicast (docs/gpus.md), its library
#   found in the nvidia-nvshmem-cu13 wheel of python3 unless NVSHMEM_HOME says.
# mc-launch.sh --gpus prints the count of GPUs the ranks would see, and exits.
set -euo pipefail
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
# nvidia-smi lists every GPU; CUDA_VISIBLE_DEVICES says which ones ranks see
# (e.g. the one-GPU testbed, CUDA_VISIBLE_DEVICES=0, on a machine of two)
# (set but empty: none; more entries than GPUs: the GPUs)
if [ "$gpus" -gt 0 ] && [ -n "${CUDA_VISIBLE_DEVICES+x}" ]; then
  v=$(echo "$CUDA_VISIBLE_DEVICES" | tr ',' '\n' | grep -c . || true)
  if [ "$v" -lt "$gpus" ]; then gpus=$v; fi
fi
if [ "${1:-}" = --gpus ]; then echo "$gpus"; exit 0; fi
if [ $# -lt 2 ]; then echo "usage: $0 N -- COMMAND... | $0 --gpus" >&2; exit 2; fi
n=$1; shift
[ "${1:-}" = "--" ] && shift
if [ "$gpus" -lt 1 ]; then echo "mc-launch: no GPU visible (nvidia-smi -L)" >&2; exit 1; fi

export NVSHMEM_DISABLE_NVLS=1 NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NCCL=1
export NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME=${NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME:-lo}
export NVSHMEM_REMOTE_TRANSPORT=${NVSHMEM_REMOTE_TRANSPORT:-none}
export NVSHMEM_SYMMETRIC_SIZE=${NVSHMEM_SYMMETRIC_SIZE:-1G}
home=${NVSHMEM_HOME:-$(python3 -c "import nvidia.nvshmem as m; print(list(m.__path__)[0])" 2>/dev/null || true)}
[ -n "$home" ] && export LD_LIBRARY_PATH="$home/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

if [ "$n" -gt "$gpus" ] && [ -z "${MC_NO_MPS:-}" ]; then
  per=$(( (n + gpus - 1) / gpus ))
  export CUDA_MPS_PIPE_DIRECTORY=${TMPDIR:-/tmp}/mc-mps-pipe-$$
  export CUDA_MPS_LOG_DIRECTORY=${TMPDIR:-/tmp}/mc-mps-log-$$
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  nvidia-cuda-mps-control -d
  trap 'echo quit | nvidia-cuda-mps-control >/dev/null 2>&1 || true; rm -rf "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"' EXIT
  # 100/k to two decimals (MPS takes fractions): MPS hands out whole TPCs
  # (2 SMs), rounding down, so 8 ranks at 12% got 14 of the H200's 132 SMs
  # each, at 12.5% 16 (the one-GPU EP8 testbed). Not 13%, which
  # also gives 16: shares past 100% put NVSHMEM in its "limited MPG" mode,
  # where its alltoall (the dense baseline) does not run
  export CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=${MC_MPS_PERCENT:-$(awk -v k="$per" 'BEGIN { printf "%g", int(10000 / k) / 100 }')}
  echo "mc-launch: $n ranks on $gpus GPU(s) under MPS, $per per GPU, ${CUDA_MPS_ACTIVE_THREAD_PERCENTAGE}% of the SMs each" >&2
elif [ "$n" -gt "$gpus" ]; then
  echo "mc-launch: $n ranks on $gpus GPU(s), time-sliced (MC_NO_MPS)" >&2
else
  echo "mc-launch: $n ranks, one per GPU" >&2
fi
"$@"
