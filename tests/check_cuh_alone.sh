#!/bin/sh
# check_cuh_alone.sh ROOT NVCC - every src/gpu/*.cuh includes what it uses:
# each compiled alone, in a unit of the host headers and a stub transport
# interface (what a transport .cu defines before the kernels) and nothing else.
root=${1:-.}; nvcc=${2:-nvcc}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
bad=0
for h in "$root"/src/gpu/*.cuh; do
  n=$(basename "$h")
  cat > "$tmp/u.cu" <<C
extern "C" {
#include "mc_internal.h"
#include "mc_gpu_host.h"
}
static __device__ __forceinline__ unsigned char *mc_t_peer_window(const mc_kargs_t *, int) { return 0; }
static __device__ __forceinline__ void mc_t_put_signal_warp(const mc_kargs_t *, uint64_t, const void *, uint64_t, int,
                                                            uint64_t, int, int) {}
static __device__ __forceinline__ void mc_t_signal(const mc_kargs_t *, int, uint64_t, int, int) {}
#include "$n"
C
  if ! $nvcc -arch=sm_90 -DMC_HAVE_CUDA=1 -I"$root/include" -I"$root/src/common" -I"$root/src/core" -I"$root/src/gpu" \
       -I"$root/src/api" -I"$root/src/bootstrap" -I"$root/src/cpu" -Werror all-warnings -diag-suppress 177 -ptx "$tmp/u.cu" -o "$tmp/u.ptx" > "$tmp/err" 2>&1; then
    echo "$n does not compile alone:"; head -5 "$tmp/err"; bad=1
  fi
done
[ $bad = 0 ] && echo "ok: every src/gpu/*.cuh compiles alone"
exit $bad
