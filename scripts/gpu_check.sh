#!/bin/bash
# Device correctness + timing run of the cuda backend on a 2-GPU machine.
# Expects `ferrocomm` and `gpu_check` (release builds) beside this script; writes the log to
# $OUT/gpu_check.log when OUT is set. Extra arguments go to gpu_check (--quick, --no-timing).
set -o pipefail
here="$(cd "$(dirname "$0")" && pwd)"
export NCCL_NVLS_ENABLE=0
export FERROCOMM_TIMEOUT_S="${FERROCOMM_TIMEOUT_S:-20}"
export FERROCOMM_KERNEL_CACHE="${FERROCOMM_KERNEL_CACHE:-/tmp/ferrocomm-kernels}"
out="${OUT:-/tmp}"
nvidia-smi -L || true
ngpu="$(nvidia-smi -L 2>/dev/null | wc -l)"
[ "$ngpu" -ge 2 ] || ngpu=2
"$here/ferrocomm" launch -n "$ngpu" --timeout 560 -- "$here/gpu_check" "$@" 2>&1 | tee "$out/gpu_check.log"
