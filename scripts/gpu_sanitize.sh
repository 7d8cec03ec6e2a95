#!/usr/bin/env bash
# compute-sanitizer over the ferrocomm kernels on a 2-GPU machine: memcheck, then racecheck, each
# over the short `--sanitize` mode of the three device checks, every rank under the tool:
#   gpu_check       a few sizes of every all-reduce algorithm, in and out of place, aligned and not;
#   gpu_check_coll  every direct-access collective kernel (LL and staged, in and out of place,
#                   both roots, all-to-all-v with host and with device counts);
#   gpu_check_lowp  the codec and one call of each low-precision collective.
# Each run logs to OUT_DIR/sanitize-<tool>-<program>.log; one line per run gives its exit code, and
# the script exits non-zero when any run fails (the tool reports an error, a result is wrong, the
# program is missing or the run times out).
# API-error records are off: libnccl's initialisation probes kernels with cudaFuncGetAttributes
# and gets cudaErrorNoKernelImageForDevice for images of other architectures (4 records per rank
# on H200, all inside libnccl.so), which the tool would count as errors; memory-access and race
# reports are what this script is for.
#
#   scripts/gpu_sanitize.sh BUILD_DIR OUT_DIR
# BUILD_DIR is what scripts/gpu_prepare.sh made: release `ferrocomm` and the check programs in
# BUILD_DIR/bin, the kernel cache in BUILD_DIR/kc.
# SANITIZE_RUN_TIMEOUT_S bounds each run (default 280 s). SANITIZE_WORLD sets the ranks (default
# 2); more ranks than GPUs need SANITIZE_FLAGS=--share-gpus (the check programs' flag).
set -uo pipefail
. "$(dirname "$0")/gpu_args.sh"
[ $# -eq 2 ] || { echo "usage: scripts/gpu_sanitize.sh BUILD_DIR OUT_DIR" >&2; exit 2; }
gpu_dirs out "usage: scripts/gpu_sanitize.sh BUILD_DIR OUT_DIR" "$@" || exit 2
bin="$build/bin"
limit="${SANITIZE_RUN_TIMEOUT_S:-280}"
gpu_env
# Checked kernels run far slower: give the device-side spin limit room.
export FERROCOMM_TIMEOUT_S="${FERROCOMM_TIMEOUT_S:-120}"

# SANITIZE_PROGRAMS picks some of them (default: all three).
# shellcheck disable=SC2206  # a list of names
programs=(${SANITIZE_PROGRAMS:-gpu_check gpu_check_coll gpu_check_lowp})
# Every program takes both flags (gpu_check_coll has no timing and accepts --no-timing as is).
# shellcheck disable=SC2206  # extra flags, split on spaces
flags=(--sanitize --no-timing ${SANITIZE_FLAGS:-})

status=0
summary=()
for tool in memcheck racecheck; do
  for prog in "${programs[@]}"; do
    path="$bin/$prog"
    log="$out/sanitize-$tool-$prog.log"
    if [ -x "$path" ]; then
      "$bin/ferrocomm" launch -n "${SANITIZE_WORLD:-2}" --timeout "$limit" -- \
        compute-sanitizer --tool "$tool" --report-api-errors no --error-exitcode 99 \
        --print-limit 20 "$path" "${flags[@]}" 2>&1 | tee "$log"
      rc=${PIPESTATUS[0]}
    else
      echo "$prog: not found in $bin" | tee "$log"
      rc=127
    fi
    line="compute-sanitizer $tool $prog: exit $rc"
    echo "$line"
    summary+=("$line")
    [ "$rc" -eq 0 ] || status=1
  done
done
echo
printf '%s\n' "${summary[@]}"
exit $status
