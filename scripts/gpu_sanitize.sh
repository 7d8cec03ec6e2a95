#!/usr/bin/env bash
# compute-sanitizer over the DDA kernels on a 2-GPU machine: memcheck, then racecheck, each rank
# of `gpu_check --sanitize` (a few sizes of every algorithm, in and out of place, aligned and
# not) under the tool. Exits non-zero when the tool reports an error or a result is wrong.
# API-error records are off: libnccl's initialisation probes kernels with cudaFuncGetAttributes
# and gets cudaErrorNoKernelImageForDevice for images of other architectures (4 records per rank
# on H200, all inside libnccl.so), which the tool would count as errors; memory-access and race
# reports are what this script is for.
#
#   scripts/gpu_sanitize.sh [BINDIR]     (BINDIR: release `ferrocomm` and `gpu_check`)
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
bin="${1:-$here/../target/release}"
gpu_check="$bin/gpu_check"
[ -x "$gpu_check" ] || gpu_check="$bin/examples/gpu_check"
out="${OUT:-/tmp}"
export NCCL_NVLS_ENABLE=0
# Checked kernels run far slower: give the device-side spin limit room.
export FERROCOMM_TIMEOUT_S="${FERROCOMM_TIMEOUT_S:-120}"
export FERROCOMM_KERNEL_CACHE="${FERROCOMM_KERNEL_CACHE:-/tmp/ferrocomm-kernels}"
status=0
for tool in memcheck racecheck; do
  "$bin/ferrocomm" launch -n 2 --timeout 280 -- \
    compute-sanitizer --tool "$tool" --report-api-errors no --error-exitcode 99 --print-limit 20 \
    "$gpu_check" --sanitize --no-timing 2>&1 | tee "$out/sanitize-$tool.log"
  rc=${PIPESTATUS[0]}
  echo "compute-sanitizer $tool: exit $rc"
  [ "$rc" -eq 0 ] || status=1
done
exit $status
