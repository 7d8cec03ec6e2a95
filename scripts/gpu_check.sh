#!/usr/bin/env bash
# The all-reduce device check (crates/ferrocomm/examples/gpu_check.rs) with correctness and
# timing, on the GPUs of this machine, through `ferrocomm launch`.
#
#   scripts/gpu_check.sh BUILD_DIR OUT_DIR [gpu_check flags...]
#
# BUILD_DIR is what scripts/gpu_prepare.sh made (bin/ferrocomm, bin/gpu_check, the kernel cache
# kc/); the log goes to OUT_DIR/gpu_check.log. Ranks: RANKS, default one per GPU and at least 2.
# Flags go to gpu_check: --quick, --no-timing, --share-gpus (more ranks than GPUs; NCCL left out,
# as NCCL refuses two ranks on one GPU). On one GPU: RANKS=2 ... --share-gpus.
set -uo pipefail
. "$(dirname "$0")/gpu_args.sh"
gpu_dirs out "usage: scripts/gpu_check.sh BUILD_DIR OUT_DIR [gpu_check flags...]" "$@" || exit 2
shift 2
bin="$build/bin"
gpu_need_bins gpu_check.sh "scripts/gpu_prepare.sh BUILD_DIR" ferrocomm gpu_check || exit 2
gpu_env
export FERROCOMM_TIMEOUT_S="${FERROCOMM_TIMEOUT_S:-20}"
gpu_machine gpu_check
[ "$ngpu" -ge 2 ] || ngpu=2
"$bin/ferrocomm" launch -n "${RANKS:-$ngpu}" --timeout 560 -- "$bin/gpu_check" "$@" 2>&1 | tee "$out/gpu_check.log"
