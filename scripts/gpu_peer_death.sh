#!/usr/bin/env bash
# A rank killed with SIGKILL while its partner waits in each direct-access kernel family, on one
# GPU (two ranks share it, NCCL off): the time from the kill to the partner's error per family.
#
#   scripts/gpu_peer_death.sh BUILD_DIR OUT_DIR [FAMILY...]
#
# BUILD_DIR is scripts/gpu_prepare.sh's (bin/gpu_peer_death and the kernel cache kc/). Writes
# OUT_DIR/peer_death.txt: one line per family (family, plan, milliseconds from SIGKILL to the
# error, PASS when the error names the killed rank within a second) and the ranks' stderr in
# OUT_DIR/peer_death.log. Exit status 1 when a family fails.
set -uo pipefail
[ $# -ge 2 ] || { echo "usage: scripts/gpu_peer_death.sh BUILD_DIR OUT_DIR [FAMILY...]" >&2; exit 2; }
build="$(cd "$1" && pwd)"
mkdir -p "$2"
out="$(cd "$2" && pwd)"
shift 2
export FERROCOMM_KERNEL_CACHE="$build/kc"
# NVLink multicast is not to be used on these machines.
export NCCL_NVLS_ENABLE=0
nvidia-smi -L > "$out/peer_death-gpus.txt" 2>&1 || true
timeout 1800 "$build/bin/gpu_peer_death" "$@" > "$out/peer_death.txt" 2> "$out/peer_death.log"
rc=$?
cat "$out/peer_death.txt"
exit $rc
