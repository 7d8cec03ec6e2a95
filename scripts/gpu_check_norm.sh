#!/usr/bin/env bash
# Device check of the fused all-reduce + residual add + RMSNorm (gpu_check_norm) at 2 and 3
# ranks. With fewer GPUs than ranks the ranks share them (--share-gpus: NCCL off, direct access
# between processes of one GPU).
#
#   bash scripts/gpu_check_norm.sh BIN_DIR KERNEL_CACHE OUT_DIR [gpu_check_norm flags]
#
# BIN_DIR holds `ferrocomm` and `gpu_check_norm` (scripts/gpu_prepare.sh: .carry/bin),
# KERNEL_CACHE the precompiled kernels (.carry/kc; any writable folder works, kernels are then
# compiled on the device), OUT_DIR receives gpu_check_norm-<ranks>.log. Exits non-zero when a
# run fails.
set -uo pipefail
[ $# -ge 3 ] || { sed -n 2,11p "$0" >&2; exit 2; }
bin="$(cd "$1" && pwd)"
kc="$2"
out="$3"
shift 3
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0
export FERROCOMM_TIMEOUT_S="${FERROCOMM_TIMEOUT_S:-30}"
export FERROCOMM_KERNEL_CACHE="$kc"
ngpu="$(nvidia-smi -L 2>/dev/null | wc -l)"
status=0
for n in 2 3; do
  share=()
  [ "$ngpu" -ge "$n" ] || share=(--share-gpus)
  echo "== gpu_check_norm: $n ranks ${share[*]:-}" | tee "$out/gpu_check_norm-$n.log"
  "$bin/ferrocomm" launch -n "$n" --timeout 560 -- "$bin/gpu_check_norm" "${share[@]}" "$@" \
    2>&1 | tee -a "$out/gpu_check_norm-$n.log" || status=1
done
exit $status
